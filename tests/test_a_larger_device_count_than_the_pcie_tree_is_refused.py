"""A preset node asked for more devices than its PCIe tree describes (``preset_cluster("dgx-h100", 1, 12)``) is
refused naming ``devices_per_node``: the extra devices would sit under no switch, with no PCIe link or NIC to price.
Fewer devices, and more on a node without a PCIe tree, build."""
from __future__ import annotations

import pytest

from sp_plan.planner.errors import PlanError
from sp_plan.profiles import preset_cluster, preset_spec


def test_more_devices_than_the_switches_hold_are_refused():
    assert preset_spec("dgx-h100").get("pcie")
    with pytest.raises(PlanError) as e:
        preset_cluster("dgx-h100", 1, 12)
    assert e.value.field == "devices_per_node" and "12 devices" in e.value.problem and "at most 8" in e.value.fix


def test_fewer_devices_and_a_node_without_a_pcie_tree_build():
    assert preset_cluster("dgx-h100", 1, 4).world_size == 4
    assert not preset_spec("cpu-local").get("pcie")
    assert preset_cluster("cpu-local", 1, 8).world_size == 8
