"""NICs attached ``per_switch`` hang off the node's PCIe switches: a node file without a ``pcie`` section has none,
so it is refused naming ``nics.attach``."""
from __future__ import annotations

import pytest

from sp_plan.planner.errors import PlanError
from sp_plan.profiles.spec import node_spec

NODE = {"devices_per_node": 8, "device": {"model": "x", "kind": "gpu", "memory_bytes": 80e9, "peak_flops": {"bf16": 1e15}},
        "intra": {"kind": "nvswitch", "capacity": 450e9}}
NICS = {"attach": "per_switch", "rate": 50e9, "network": "ib"}


def test_per_switch_without_pcie_is_refused():
    with pytest.raises(PlanError) as e:
        node_spec({**NODE, "nics": NICS})
    assert e.value.field == "nics.attach" and "pcie" in e.value.problem


def test_per_switch_with_pcie_is_kept():
    spec = node_spec({**NODE, "nics": NICS, "pcie": {"capacity": 64e9, "switches": [[0, 1], [2, 3], [4, 5], [6, 7]]}})
    assert spec["nics"]["attach"] == "per_switch"
