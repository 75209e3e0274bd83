"""``pcie.sockets`` lists every PCIe switch index once: a switch under two sockets (or none) is refused naming
``pcie.sockets``, since the tree would otherwise silently hang it under the first socket that lists it."""
from __future__ import annotations

import pytest

from sp_plan.planner.errors import PlanError
from sp_plan.profiles.spec import node_spec

NODE = {"devices_per_node": 8, "device": {"model": "x", "kind": "gpu", "memory_bytes": 48e9, "peak_flops": {"bf16": 1e14}},
        "intra": {"kind": "pcie"}}
SWITCHES = [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.parametrize("sockets", [[[0, 1], [1, 2, 3]], [[0, 1, 2, 3], [3]], [[0, 1], [2]]])
def test_a_switch_listed_twice_or_never_is_refused(sockets):
    with pytest.raises(PlanError) as e:
        node_spec({**NODE, "pcie": {"capacity": 32e9, "switches": SWITCHES, "sockets": sockets}})
    assert e.value.field == "pcie.sockets"


def test_each_switch_once_is_kept():
    spec = node_spec({**NODE, "pcie": {"capacity": 32e9, "switches": SWITCHES, "sockets": [[0, 1], [2, 3]]}})
    assert spec["pcie"]["sockets"] == [[0, 1], [2, 3]]
