"""A sensitivity report halves and doubles every link class the cluster has, then lowers compute to 80 %.

``scenarios`` lists, for each link kind of the cluster (``link_classes``), one change with that kind's links at
half their capacity and one at twice it, named "<kind> x0.5" / "<kind> x2" and described as halved / doubled,
and last the compute change. Only the named kind's links change; the others keep their capacity.
"""
from __future__ import annotations

import pytest

from sp_plan.planner.params import Params
from sp_plan.planner.sensitivity import link_classes, scenarios
from sp_plan.profiles import load_cluster


@pytest.fixture(scope="module")
def cluster():
    return load_cluster("a10-4-pcie", 2)


def capacities(cluster, kind):
    return [l.capacity for nt in cluster.node_types.values() for l in nt.links if l.kind == kind]


def test_every_link_kind_is_halved_and_doubled_then_compute_lowered(cluster):
    kinds = list(link_classes(cluster))
    assert len(kinds) >= 2  # the PCIe inside a node and the network between the two
    names = [name for name, *_ in scenarios(cluster, Params())]
    want = [f"{k} x{f}" for k in kinds for f in ("0.5", "2")] + ["compute x0.8"]
    assert names == want


def test_each_link_change_scales_only_its_own_kind(cluster):
    for name, what, changed, _ in scenarios(cluster, Params())[:-1]:
        kind, factor = name.split(" x")
        assert what.startswith(f"{kind} bandwidth {'halved' if factor == '0.5' else 'doubled'}")
        for other in link_classes(cluster):
            k = float(factor) if other == kind else 1.0
            assert capacities(changed, other) == [c * k for c in capacities(cluster, other)]
