"""A preset cluster's name: its node type's alone for one node, with ``xN`` for N > 1 nodes, as plan files and
profiles record it."""
from __future__ import annotations

from sp_plan.planner.cluster import preset_name, preset_nodes
from sp_plan.profiles import load_cluster


def test_one_node_is_named_as_its_node_type():
    assert preset_name("dgx-h100", 1) == "dgx-h100"
    assert load_cluster("dgx-h100").name == "dgx-h100"


def test_several_nodes_carry_their_count():
    assert load_cluster("dgx-h100", 2).name == "dgx-h100x2"
    assert preset_nodes("dgx-h100x2") == ("dgx-h100", 2)
