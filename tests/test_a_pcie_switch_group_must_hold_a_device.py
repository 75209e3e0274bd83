"""Each PCIe switch a node file lists holds at least one device: an empty group (``[]``) is refused naming
``pcie.switches`` rather than building a switch with nothing under it."""
from __future__ import annotations

import pytest

from sp_plan.planner.errors import PlanError
from sp_plan.profiles.spec import node_spec

NODE = {"devices_per_node": 4, "device": {"model": "x", "kind": "gpu", "memory_bytes": 24e9, "peak_flops": {"bf16": 1e14}},
        "intra": {"kind": "pcie"}}


def test_an_empty_group_is_refused():
    with pytest.raises(PlanError) as e:
        node_spec({**NODE, "pcie": {"capacity": 32e9, "switches": [[0, 1], [], [2, 3]]}})
    assert e.value.field == "pcie.switches" and "empty" in e.value.problem


def test_groups_that_each_hold_devices_are_kept():
    assert node_spec({**NODE, "pcie": {"capacity": 32e9, "switches": [[0, 1], [2, 3]]}})["pcie"]["switches"] == [[0, 1], [2, 3]]
