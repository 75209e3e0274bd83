"""A node's NICs on the host are counted from one: ``nics.count: 0`` would leave the devices no NIC to reach the
network through, so the file is refused naming ``count`` rather than accepted."""
from __future__ import annotations

import pytest

from sp_plan.planner.errors import PlanError
from sp_plan.profiles.spec import node_spec

NODE = {"devices_per_node": 2, "device": {"model": "x", "kind": "cpu", "memory_bytes": 64e9, "peak_flops": {"fp32": 1e12}},
        "intra": {"kind": "shm", "capacity": 5e9}}


def test_zero_nics_are_refused():
    with pytest.raises(PlanError) as e:
        node_spec({**NODE, "nics": {"attach": "host", "count": 0, "rate": 1.25e9, "network": "ethernet"}})
    assert "count" in f"{e.value.field} {e.value.problem}"


def test_one_nic_is_kept():
    spec = node_spec({**NODE, "nics": {"attach": "host", "count": 1, "rate": 1.25e9, "network": "ethernet"}})
    assert spec["nics"]["count"] == 1
