"""A preset-style node whose intra-node fabric is NVSwitch, NVLink, HCCS or shared memory must give that fabric's
capacity: without it no link of the fabric can be priced, so the file is refused naming ``intra.capacity``."""
from __future__ import annotations

import pytest

from sp_plan.planner.errors import PlanError
from sp_plan.profiles.spec import node_spec

DEVICE = {"model": "H100-SXM5-80GB", "kind": "gpu", "memory_bytes": 80e9, "peak_flops": {"bf16": 989e12}}


@pytest.mark.parametrize("kind", ["nvswitch", "nvlink", "hccs", "shm"])
def test_a_fabric_without_a_capacity_is_refused(kind):
    with pytest.raises(PlanError) as e:
        node_spec({"devices_per_node": 2, "device": DEVICE, "intra": {"kind": kind}})
    assert e.value.field == "intra.capacity" and kind in e.value.problem


def test_the_same_fabric_with_a_capacity_is_kept():
    spec = node_spec({"devices_per_node": 2, "device": DEVICE, "intra": {"kind": "nvlink", "capacity": 450e9}})
    assert spec["intra"]["capacity"] == 450e9
