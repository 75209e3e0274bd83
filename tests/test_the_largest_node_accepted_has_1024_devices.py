"""A preset-style node may have up to MAX_DEVICES_PER_NODE (1024) devices; one more is a typo, refused before any
link is built."""
from __future__ import annotations

import pytest

from sp_plan.planner.errors import PlanError
from sp_plan.profiles.spec import MAX_DEVICES_PER_NODE, node_spec

NODE = {"device": {"model": "x", "kind": "gpu", "memory_bytes": 80e9, "peak_flops": {"bf16": 1e15}},
        "intra": {"kind": "nvswitch", "capacity": 450e9}}


def test_the_limit_itself_is_accepted():
    assert MAX_DEVICES_PER_NODE == 1024
    assert node_spec({**NODE, "devices_per_node": MAX_DEVICES_PER_NODE})["devices_per_node"] == 1024


def test_one_past_the_limit_is_refused():
    with pytest.raises(PlanError) as e:
        node_spec({**NODE, "devices_per_node": MAX_DEVICES_PER_NODE + 1})
    assert "devices_per_node" in e.value.field
