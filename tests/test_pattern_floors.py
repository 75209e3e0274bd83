"""The order-free floor the search prunes with (``LinkEngine.pattern_floor``) is never above what the link engine
charges a pattern on any mesh shape of that group size, member spacing and world: on NVSwitch, PCIe, a full mesh
(HCCS), per-switch NICs, one shared NIC, and a node whose GPUs reach the fabric with unequal latencies. A floor above
a cost would prune the layout that has it before it is priced."""
from __future__ import annotations

import pytest

from sp_plan.planner.cluster import NET, Cluster, Device, Link, NodeType, Switch
from sp_plan.planner.engine import GroupShape, LinkEngine
from sp_plan.profiles import load_cluster

PATTERNS = ("shift", "shift_back", "shift_bi", "all_gather", "reduce_scatter", "all_reduce", "all_to_all")
PRESETS = [("ascend-910b-8", 1), ("ascend-910b-8", 2), ("dgx-h100", 4), ("a800-8-nvlink", 2), ("a10-4-pcie", 4),
           ("a100-16-eth100", 2), ("l20-8-pcie", 2)]


def mesh_shapes(world: int) -> list[tuple[tuple[int, int], ...]]:
    """Groups of one or two mesh dimensions that tile the world: each part's stride a multiple of the span below it."""
    sizes = [s for s in (2, 4, 8, 16) if s <= world]
    strides = [s for s in (1, 2, 4, 8, 16, 32) if s < world]
    single = [(a, sa) for a in sizes for sa in strides if world % (a * sa) == 0]
    pairs = [(p, q) for p in single for q in single
             if (lambda lo, hi: hi[1] % (lo[0] * lo[1]) == 0)(*sorted([p, q], key=lambda x: x[1]))]
    return [(p,) for p in single] + [(p, q) for p, q in pairs if p[0] * q[0] <= world]


def assert_floors_below_costs(eng: LinkEngine, world: int) -> int:
    checked = 0
    for parts in mesh_shapes(world):
        shape = GroupShape(parts, world)
        spread = min(stride for _, stride in parts)
        for pattern in PATTERNS:
            c = eng.cost(pattern, shape)
            steps, spb, lat = eng.pattern_floor(pattern, shape.size, world, spread)
            for volume in (0.0, 1e3, 1e9):
                floor, cost = steps * (volume * spb + lat), c.steps * (volume * c.sec_per_byte + c.latency)
                assert floor <= cost * (1 + 1e-12), (parts, pattern, volume, floor, cost)
                checked += 1
    return checked


@pytest.mark.parametrize("preset, nodes", PRESETS, ids=[f"{p}x{n}" for p, n in PRESETS])
def test_the_floor_is_below_the_cost_on_every_mesh_shape(preset, nodes):
    cluster = load_cluster(preset, nodes)
    assert assert_floors_below_costs(LinkEngine(cluster), cluster.world_size) > 100


def test_the_floor_is_below_the_cost_where_one_gpu_reaches_the_fabric_slower():
    """Four GPUs on a switch; g1's NIC answers in 50 us, the others' in 1 us. A ring across two nodes leaves and
    enters a node through its end members only, so its latency need not be the slowest NIC's."""
    devices = [Device(name=f"g{i}", memory_bytes=1e10, peak_flops={"bf16": 1e14}, nic="slow" if i == 1 else "quick")
               for i in range(4)]
    switches = [Switch(name="sw", kind="nvswitch"), Switch(name="quick", kind="nic"), Switch(name="slow", kind="nic")]
    links = [Link(src=f"g{i}", dst="sw", kind="nvswitch", capacity=1000e9) for i in range(4)]
    links += [Link(src=f"g{i}", dst="slow" if i == 1 else "quick", kind="pcie", capacity=100e9) for i in range(4)]
    links += [Link(src="quick", dst=NET, kind="ib", capacity=10e9, latency=1e-6),
              Link(src="slow", dst=NET, kind="ib", capacity=10e9, latency=50e-6)]
    node = NodeType(devices=devices, switches=switches, links=links)
    eng = LinkEngine(Cluster(node_types={"n": node}, nodes=["n"] * 4, network="ib"))
    assert assert_floors_below_costs(eng, 16) > 100
