"""``preset_cluster(name, nodes, devices_per_node)`` (and ``node_spec(spec, devices_per_node)``) builds the node with
the count given, not the preset's own."""
from __future__ import annotations

from sp_plan.profiles import preset_cluster, preset_spec
from sp_plan.profiles.spec import node_spec


def test_the_given_count_wins_over_the_presets():
    assert preset_spec("a100-16-eth100")["devices_per_node"] == 16
    assert node_spec(preset_spec("a100-16-eth100"), 8)["devices_per_node"] == 8
    assert preset_cluster("cpu-local", 1, 3).devices_per_node == 3
