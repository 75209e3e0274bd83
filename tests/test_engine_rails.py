"""Inter-node collectives are priced as NCCL runs them: over every NIC the node's members have (one channel per
rotation of the node's ring, each leaving through a different NIC), and a ring round's point-to-point flow through
its own GPU's NIC. Expected values are worked by hand from the presets' link rates."""
from __future__ import annotations

import pytest

from sp_plan.planner.engine import GroupShape, LinkEngine
from sp_plan.profiles import load_cluster

NDR = 50e9  # one ConnectX-7 400 Gb/s NIC, bytes/s each way (dgx-h100 preset)
HDR = 25e9  # one ConnectX-6 200 Gb/s NIC (dgx-a100 preset)
ETH = 12.5e9  # the one 100 Gb/s NIC of an a100-16-eth100 node
NVSWITCH_H100 = 450e9  # an H100's NVLink port, each way


def engine(preset: str, nodes: int) -> LinkEngine:
    return LinkEngine(load_cluster(preset, nodes))


def per_volume(eng: LinkEngine, pattern: str, shape: GroupShape) -> float:
    """Seconds per byte of the whole per-rank volume, one step (a collective's step moves 1/n of it)."""
    c = eng.cost(pattern, shape)
    return c.sec_per_byte * (shape.size if pattern != "shift" else 1)


@pytest.mark.parametrize("pattern, steps", [("all_gather", 15), ("reduce_scatter", 15), ("all_reduce", 30)])
def test_eight_nic_node_prices_a_collective_over_eight_rails(pattern, steps):
    """16 ranks on two DGX H100 nodes: node 0's ring share leaves through its 8 NICs, 1/8 each, so a step of 1/16
    of the volume costs 1/16 x 1/8 / 50 GB/s (the NVLink ports carry 7/8 of a share at 450 GB/s: less loaded)."""
    eng = engine("dgx-h100", 2)
    shape = GroupShape(((16, 1),), 16)
    c = eng.cost(pattern, shape)
    assert c.steps == steps
    assert c.sec_per_byte == pytest.approx(1 / 16 * (1 / 8) / NDR, rel=1e-12)
    assert c.link_class == "inter" and "(ib)" in c.bottleneck
    assert (7 / 8) / NVSWITCH_H100 < (1 / 8) / NDR  # why the NIC stays the bottleneck
    # 1 GB all-gathered: 15 steps of 1/16 GB at 8 x 50 GB/s, plus the path latency per step
    assert eng.time("all_gather", shape, 1e9) == pytest.approx(15 * (1e9 / 16 / (8 * NDR) + c.latency), rel=1e-12)


def test_the_whole_node_carries_eight_times_one_nic():
    """The same all-gather through one NIC (the ring's shift) would cost 8x: what the rails buy."""
    eng = engine("dgx-h100", 2)
    shape = GroupShape(((16, 1),), 16)
    assert per_volume(eng, "shift", shape) == pytest.approx(1 / NDR, rel=1e-12)
    assert per_volume(eng, "all_gather", shape) == pytest.approx(per_volume(eng, "shift", shape) / 8, rel=1e-12)


def test_eight_nics_of_a_dgx_a100():
    eng = engine("dgx-a100", 4)
    shape = GroupShape(((32, 1),), 32)
    assert per_volume(eng, "all_gather", shape) == pytest.approx(1 / (8 * HDR), rel=1e-12)


def test_one_nic_node_prices_a_collective_over_its_one_nic():
    """a100-16-eth100: 16 GPUs behind one 100 Gb/s NIC; the ring's crossing share goes through that NIC whole."""
    eng = engine("a100-16-eth100", 2)
    shape = GroupShape(((32, 1),), 32)
    c = eng.cost("all_gather", shape)
    assert c.steps == 31
    assert c.sec_per_byte * 32 == pytest.approx(1 / ETH, rel=1e-12)
    assert per_volume(eng, "all_gather", shape) == pytest.approx(per_volume(eng, "shift", shape), rel=1e-12)


def test_collective_uses_the_nics_of_the_groups_own_members():
    """Four members per node (ranks 0-3, 8-11): their four NICs carry 1/4 of a share each; the other four
    concurrent groups (ranks 4-7, 12-15) use the other four NICs, so none is shared."""
    eng = engine("dgx-h100", 2)
    shape = GroupShape(((4, 1), (2, 8)), 16)
    assert per_volume(eng, "all_gather", shape) == pytest.approx((1 / 4) / NDR, rel=1e-12)


def test_ring_order_is_nccls_not_the_ranks():
    """A group whose index order alternates between nodes (0, 8, 1, 9, ...) is run in node order as NCCL orders
    its rings, so it costs what the same members cost in rank order; its point-to-point shift (a ring attention
    round, in group order) crosses nodes at every hop."""
    eng = engine("dgx-h100", 2)
    alternating, blocked = GroupShape(((2, 8), (4, 1)), 16), GroupShape(((4, 1), (2, 8)), 16)
    assert per_volume(eng, "all_gather", alternating) == pytest.approx(per_volume(eng, "all_gather", blocked),
                                                                       rel=1e-12)
    assert per_volume(eng, "shift", alternating) == pytest.approx(1 / NDR, rel=1e-12)


def test_ring_round_to_its_own_peer_goes_through_its_own_nic():
    """Rings of 2 across two nodes, GPU i with GPU i of the other node (stride 8): eight concurrent rounds, each
    over its own GPU's NIC on DGX H100 (1 / 50 GB/s); on the one-NIC node all sixteen share it (16 / 12.5 GB/s)."""
    dgx = engine("dgx-h100", 2)
    c = dgx.cost("shift", GroupShape(((2, 8),), 16))
    assert c.sec_per_byte == pytest.approx(1 / NDR, rel=1e-12) and c.bottleneck == "nic0->net (ib)"
    eth = engine("a100-16-eth100", 2)
    assert eth.cost("shift", GroupShape(((2, 16),), 32)).sec_per_byte == pytest.approx(16 / ETH, rel=1e-12)


def test_a_collective_inside_a_node_is_unchanged():
    """Inside one node there is no NIC to spread over: a step is the shift's load over n."""
    eng = engine("dgx-h100", 2)
    shape = GroupShape(((8, 1),), 16)
    assert per_volume(eng, "all_gather", shape) == pytest.approx(per_volume(eng, "shift", shape), rel=1e-12)
    assert per_volume(eng, "all_gather", shape) == pytest.approx(1 / NVSWITCH_H100, rel=1e-12)


def test_one_member_per_node_is_one_flow_each_way():
    """A collective of 4 ranks, one per node (stride 8): node 0's member sends its share out and receives one
    in, through its own NIC, as the shift; eight such groups use the eight NICs."""
    eng = engine("dgx-h100", 4)
    shape = GroupShape(((4, 8),), 32)
    assert per_volume(eng, "all_gather", shape) == pytest.approx(1 / NDR, rel=1e-12)
