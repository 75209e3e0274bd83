"""Closed forms of the papers fall out of the schedules and the link-load engine."""
import pytest

from sp_plan.planner import Estimator, ModelSpec, Plan, Workload
from sp_plan.planner.engine import GroupShape, LinkEngine
from sp_plan.planner.schedules import Comm, Shape, attention_steps, grad_sync
from sp_plan.planner.usp import ring_steps
from sp_plan.profiles import load_cluster, load_model

GiB = 2**30


def comms(steps):
    return [(p, st.repeat) for st in steps for p in st.phases if isinstance(p, Comm)]


def test_wallfacer_eq2_ring_volume_model_M():
    """WallFacer eq. 2 for model M (B=1, N=65536, H=6656, P=64, bf16): P rounds of 2BNH/P = 1.625 GiB."""
    m = load_model("llama-30b")
    assert (m.hidden, m.layers) == (6656, 64)
    c = Shape(m, Workload(seq_len=65536, batch=1, causal=False), dp=1, ulysses=1, ring=64, token_layout="contiguous")
    sends = comms(ring_steps(c, backward=False))
    per_round = sends[0][0].nbytes
    assert per_round == 2 * 1 * 65536 * 6656 * 2 / 64  # 2BNH/P elements, 2 bytes each
    assert 64 * per_round / GiB == pytest.approx(1.625)
    # the schedule sends P-1 times: the last block needs no forwarding
    assert sum(k for _, k in sends) == 63


def test_wallfacer_eq2_time_is_rounds_times_volume_over_bandwidth_plus_latency():
    """p (2BNH/(PW) + L): one round's send on a ring inside an NVSwitch node costs bytes/W + L."""
    cl = load_cluster("dgx-h100")
    eng = LinkEngine(cl)
    shape = GroupShape(((8, 1),), 8)
    cost = eng.cost("shift", shape)
    W, L = 450e9, 2 * 2e-6  # GPU -> NVSwitch -> GPU
    nbytes = 2 * 65536 * 6656 * 2 / 8
    assert eng.time("shift", shape, nbytes) == pytest.approx(nbytes / W + L)
    assert cost.steps == 1


def test_usp_table2_sp_ulysses_eight_all_to_alls_of_bLd():
    """USP Table 2, SP-Ulysses: 8 all-to-alls (4 forward, 4 backward) moving 8 O(bs L d) per layer."""
    m = ModelSpec(layers=1, hidden=1024, heads=16, vocab=0)
    b, L, U = 2, 8192, 8
    c = Shape(m, Workload(seq_len=L, batch=b), dp=1, ulysses=U, ring=1, token_layout="contiguous", mbs=b)
    fwd = comms(attention_steps(c, backward=False))
    bwd = comms(attention_steps(c, backward=True))
    assert all(p.pattern == "all_to_all" and p.dim == ("ulysses",) for p, _ in fwd + bwd)
    tensors = sum(p.nbytes * k for p, k in fwd + bwd) / (b * (L / U) * m.hidden * 2)
    assert tensors == 8  # q, k, v, out forward; dout, dq, dk, dv backward
    # each all-to-all moves (U-1)/U of the local tensor off-rank: total over ranks ~ 8 bs L d elements
    total_elems = sum(p.nbytes * k for p, k in fwd + bwd) / 2 * U
    assert total_elems == 8 * b * L * m.hidden


def test_usp_table2_sp_ring_is_p2p_only_and_overlapped():
    """USP Table 2, SP-Ring: activation communication is P2P, overlapped with the attention rounds."""
    m = ModelSpec(layers=1, hidden=1024, heads=16, vocab=0)
    c = Shape(m, Workload(seq_len=8192), dp=1, ulysses=1, ring=4, token_layout="zigzag")
    steps = attention_steps(c, backward=False)
    assert all(p.pattern == "shift" for p, _ in comms(steps))
    assert all(st.overlap for st in steps if any(isinstance(p, Comm) for p in st.phases))


def test_usp_table2_param_communication_per_zero_stage():
    """USP Table 2: allreduce for SP/DP, allgather+reducescatter for ZeRO-1/2, 2 allgather + reducescatter for ZeRO-3."""
    m = ModelSpec(layers=1, hidden=1024, heads=16, vocab=0)
    c = Shape(m, Workload(seq_len=1024), dp=2, ulysses=2, ring=2, token_layout="contiguous")
    pats = {z: sorted(p.pattern for p in grad_sync(c, z, 100)) for z in range(4)}
    assert pats[0] == ["all_reduce"]
    assert pats[1] == pats[2] == ["all_gather", "reduce_scatter"]
    assert pats[3] == ["all_gather", "all_gather", "reduce_scatter"]
    assert all(p.dim == ("ulysses", "ring", "dp") for p in grad_sync(c, 3, 100))


def test_concurrent_ring_groups_share_the_one_nic():
    """design.md: 16 GPUs behind one 100 Gb/s NIC (WallFacer's A100 nodes): 16 concurrent rings crossing
    the node boundary share it, so a cross-node ring hop costs 16x more than on rail-optimized nodes."""
    eth = LinkEngine(load_cluster("a100-16-eth100", 2))
    # ring of 2 across nodes, stride 16: 16 concurrent groups, each with one flow out of node 0
    across = GroupShape(((2, 16),), 32)
    t_eth = eth.time("shift", across, 1e9)
    assert t_eth == pytest.approx(16 * 1e9 / 12.5e9, rel=1e-3)
    dgx = LinkEngine(load_cluster("dgx-h100", 2))
    t_dgx = dgx.time("shift", GroupShape(((2, 8),), 16), 1e9)
    assert t_dgx == pytest.approx(1e9 / 50e9, rel=1e-3)  # each GPU has its own 400 Gb/s NIC


def test_full_mesh_vs_nvswitch_vs_pcie_all_to_all():
    """All-to-all on a full mesh loads every pair link with 1/n; on NVSwitch the GPU port with (n-1)/n."""
    n = 8
    mesh = LinkEngine(load_cluster("ascend-910b-8")).time("all_to_all", GroupShape(((n, 1),), n), 8e9)
    assert mesh == pytest.approx(1e9 / 28e9, rel=1e-3)
    nvs = LinkEngine(load_cluster("dgx-h100")).time("all_to_all", GroupShape(((n, 1),), n), 8e9)
    assert nvs == pytest.approx(7e9 / 450e9, rel=1e-2)
    pcie = LinkEngine(load_cluster("l20-8-pcie")).time("all_to_all", GroupShape(((n, 1),), n), 8e9)
    assert pcie > nvs * 10  # 4 GPUs behind one switch uplink and the socket link


def test_contiguous_causal_ring_is_slower_than_zigzag():
    cl = load_cluster("dgx-h100")
    m = load_model("llama3-8b")
    est = Estimator(cl, m, Workload(seq_len="64k", causal=True))
    t = {tl: est(Plan(algorithm="ring", degrees={"ring": 8}, order=["ring"], token_layout=tl)).step_time_s
         for tl in ("contiguous", "zigzag", "striped")}
    assert t["zigzag"] < t["contiguous"] and t["striped"] < t["contiguous"]


def test_inter_node_ring_pays_for_the_slow_hop():
    """Ring inner within a node (ring8 x dp2) beats a ring spread across nodes (stride 2) on Ethernet."""
    cl = load_cluster("a100-16-eth100", 2)
    m = load_model("gpt-7b")
    est = Estimator(cl, m, Workload(seq_len="32k", batch=2))
    inner = est(Plan(algorithm="ring", degrees={"ring": 16, "dp": 2}, order=["ring", "dp"], token_layout="zigzag"))
    outer = est(Plan(algorithm="ring", degrees={"ring": 16, "dp": 2}, order=["dp", "ring"], token_layout="zigzag"))
    assert inner.step_time_s < outer.step_time_s
