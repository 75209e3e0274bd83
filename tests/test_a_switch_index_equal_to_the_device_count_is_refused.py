"""Device indices in ``pcie.switches`` run 0..devices_per_node-1: an index equal to devices_per_node is past the
node's devices and is refused naming ``pcie.switches``, never dropped without a word."""
from __future__ import annotations

import pytest

from sp_plan.planner.errors import PlanError
from sp_plan.profiles.spec import check_switch_groups, node_spec

NODE = {"devices_per_node": 4, "device": {"model": "x", "kind": "gpu", "memory_bytes": 24e9, "peak_flops": {"bf16": 1e14}},
        "intra": {"kind": "pcie"}}


def test_the_index_one_past_the_last_device_is_refused():
    with pytest.raises(PlanError) as e:
        node_spec({**NODE, "pcie": {"capacity": 32e9, "switches": [[0, 1], [2, 3], [4]]}})
    assert e.value.field == "pcie.switches" and "[4]" in e.value.problem and "past" in e.value.problem
    with pytest.raises(PlanError):
        check_switch_groups([[0, 1], [2, 3, 4]], 4)


def test_the_last_device_index_is_kept():
    check_switch_groups([[0, 1], [2, 3]], 4)
