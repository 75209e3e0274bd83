"""How the link engine routes and loads a node's links: one-way links carry traffic one way only, so a flow against
a one-way ring goes the long way round, and a shift both ways loads each link with both; routes follow bandwidth,
not hops, and among routes of equal bandwidth the quicker is taken; a ring collective across nodes spreads its
crossing share over every NIC the node's members have; a step's latency is that of its slowest flow's path, counted
on both sides of the fabric. Expected values are worked by hand from the links' capacities and latencies."""
from __future__ import annotations

import pytest

from sp_plan.planner.cluster import NET, Cluster, Device, Link, NodeType, Switch
from sp_plan.planner.engine import GroupShape, LinkEngine

RING = 100e9  # bytes/s of each one-way ring link
FAST = 1000e9  # each GPU's port on the switch
PCIE = 100e9  # a GPU's link to its NIC
NIC = 10e9  # a NIC's link to the fabric
LAT_SWITCH, LAT_PCIE, LAT_NIC = 1e-6, 3e-6, 7e-6


def _devices(n: int, nics: list[str | None]) -> list[Device]:
    return [Device(name=f"g{i}", memory_bytes=1e10, peak_flops={"bf16": 1e14}, nic=nics[i]) for i in range(n)]


def one_way_ring(n: int = 3) -> LinkEngine:
    """n GPUs joined only by one-way links g0 -> g1 -> ... -> g0."""
    links = [Link(src=f"g{i}", dst=f"g{(i + 1) % n}", kind="nvlink", capacity=RING, bidirectional=False)
             for i in range(n)]
    node = NodeType(devices=_devices(n, [None] * n), links=links)
    return LinkEngine(Cluster(node_types={"n": node}, nodes=["n"]))


def switched_nodes(nics: list[str], nodes: int = 2) -> LinkEngine:
    """Four GPUs on a fast switch, each linked to its own ``nics[i]`` (PCIe), each NIC to the fabric."""
    names = sorted(set(nics))
    links = [Link(src=f"g{i}", dst="sw", kind="nvswitch", capacity=FAST, latency=LAT_SWITCH) for i in range(4)]
    links += [Link(src=f"g{i}", dst=nics[i], kind="pcie", capacity=PCIE, latency=LAT_PCIE) for i in range(4)]
    links += [Link(src=x, dst=NET, kind="ib", capacity=NIC, latency=LAT_NIC) for x in names]
    switches = [Switch(name="sw", kind="nvswitch")] + [Switch(name=x, kind="nic", rate=NIC) for x in names]
    node = NodeType(devices=_devices(4, nics), switches=switches, links=links)
    return LinkEngine(Cluster(node_types={"n": node}, nodes=["n"] * nodes, network="ib"))


def test_a_shift_along_a_one_way_ring_takes_one_link():
    c = one_way_ring().cost("shift", GroupShape(((3, 1),), 3))
    assert c.steps == 1 and c.sec_per_byte == pytest.approx(1 / RING, rel=1e-12)


def test_a_shift_against_a_one_way_ring_goes_the_long_way_round():
    """g1 -> g0 has no link: it runs g1 -> g2 -> g0, so each of the three links carries two of the three flows."""
    c = one_way_ring().cost("shift_back", GroupShape(((3, 1),), 3))
    assert c.steps == 1 and c.sec_per_byte == pytest.approx(2 / RING, rel=1e-12)


def test_a_shift_both_ways_loads_each_link_with_both_directions():
    """Forward flows one hop each (1 per link), backward flows two hops each (2 per link): 3 volumes per link."""
    c = one_way_ring().cost("shift_bi", GroupShape(((3, 1),), 3))
    assert c.steps == 1 and c.sec_per_byte == pytest.approx(3 / RING, rel=1e-12)


def test_a_route_through_a_fast_switch_beats_a_slow_direct_link():
    """Two GPUs with a direct link at a tenth of the switch's rate: the two switch hops carry the round."""
    links = [Link(src="g0", dst="g1", kind="pcie", capacity=PCIE / 10)]
    links += [Link(src=f"g{i}", dst="sw", kind="nvswitch", capacity=PCIE) for i in range(2)]
    node = NodeType(devices=_devices(2, [None, None]), switches=[Switch(name="sw", kind="nvswitch")], links=links)
    c = LinkEngine(Cluster(node_types={"n": node}, nodes=["n"])).cost("shift", GroupShape(((2, 1),), 2))
    assert c.sec_per_byte == pytest.approx(1 / PCIE, rel=1e-12) and c.bottleneck == "g0->sw (nvswitch)"


def test_among_routes_of_equal_bandwidth_the_quicker_one_is_taken():
    """Two GPUs joined through two switches of equal bandwidth, the one declared first slower to answer (10 us a
    link against 1 us): bandwidth ties, so latency parts them, and a round pays two of the quick links."""
    devs = _devices(2, [None, None])
    switches = [Switch(name="slow", kind="pcie_switch"), Switch(name="quick", kind="pcie_switch")]
    links = [Link(src=f"g{i}", dst="slow", kind="pcie", capacity=PCIE, latency=10e-6) for i in range(2)]
    links += [Link(src=f"g{i}", dst="quick", kind="pcie", capacity=PCIE, latency=1e-6) for i in range(2)]
    node = NodeType(devices=devs, switches=switches, links=links)
    assert node.link_graph().shortest_path("g0", "g1") == ["g0", "quick", "g1"]
    c = LinkEngine(Cluster(node_types={"n": node}, nodes=["n"])).cost("shift", GroupShape(((2, 1),), 2))
    assert c.latency == pytest.approx(2e-6, rel=1e-12)


def test_a_collective_across_nodes_spreads_over_both_nics_of_the_node():
    """Eight ranks on two nodes whose four GPUs share two NICs (two GPUs each): NCCL's four channels each put 1/4
    of a step on the NIC of the member they leave from (two channels per NIC) and 1/4 on the NIC of the one they
    enter: half a step each way on each NIC. One NIC for all four carries the whole step."""
    shape = GroupShape(((8, 1),), 8)
    two = switched_nodes(["nic0", "nic0", "nic1", "nic1"]).cost("all_gather", shape)
    one = switched_nodes(["nic0"] * 4).cost("all_gather", shape)
    assert two.steps == one.steps == 7
    assert two.sec_per_byte * 8 == pytest.approx(0.5 / NIC, rel=1e-12)
    assert one.sec_per_byte * 8 == pytest.approx(1 / NIC, rel=1e-12)
    assert two.link_class == one.link_class == "inter"


def test_a_step_costs_the_latency_of_its_slowest_path_on_both_sides_of_the_fabric():
    """A ring round across nodes crosses GPU -> NIC -> fabric on its node and the mirror path on the other: twice
    (PCIe + NIC) latency; inside a node, GPU -> switch -> GPU."""
    eng = switched_nodes(["nic0", "nic0", "nic1", "nic1"])
    across = eng.cost("shift", GroupShape(((2, 4),), 8))
    assert across.latency == pytest.approx(2 * (LAT_PCIE + LAT_NIC), rel=1e-12)
    inside = eng.cost("shift", GroupShape(((4, 1),), 8))
    assert inside.latency == pytest.approx(2 * LAT_SWITCH, rel=1e-12)
    mixed = eng.cost("all_to_all", GroupShape(((8, 1),), 8))  # inside flows and crossing ones: the slowest counts
    assert mixed.latency == pytest.approx(2 * (LAT_PCIE + LAT_NIC), rel=1e-12)
