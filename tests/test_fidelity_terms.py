"""The default model's physical terms, each against a hand-computed case, and the presets' defaults."""
import math

import numpy as np
import pytest

from sp_plan.planner import Estimator, ModelSpec, Workload
from sp_plan.planner.calibration import resolve_params
from sp_plan.planner.engine import GroupShape, LinkEngine
from sp_plan.planner.merges import MERGES
from sp_plan.planner.params import Curve, Params
from sp_plan.planner.schedules import Comm, Compute, Shape, Step, a2a_packing, attention_steps, merge_bytes
from sp_plan.planner.usp import ring_steps, usp_steps
from sp_plan.profiles import load_cluster
from sp_plan.profiles.kernels import attention_curves, comm_defaults, default_params, device_key, h100_curves

MODEL = ModelSpec(name="t", layers=1, hidden=512, heads=8, head_dim=64, vocab=0)


def estimator(params: Params, cluster: str = "dgx-h100") -> Estimator:
    return Estimator(load_cluster(cluster), MODEL, Workload(seq_len=4096, causal=False, training=False), params=params)


def test_memory_pass_costs_bytes_over_hbm_bandwidth_and_nothing_uncalibrated():
    p = Compute("ring merge fwd", 0.0, "memory", nbytes=3e9)
    assert estimator(Params(hbm_bandwidth=1.5e12)).compute_time(p) == pytest.approx(2e-3)
    assert estimator(Params()).compute_time(p) == 0.0


def test_part_filled_block_reads_the_curve_at_the_square_block_of_as_many_pairs():
    """fill 1/4 of a 4000-token block = a 2000-token square: log-linear halfway between (1000, .2), (4000, .4)."""
    curve = Curve(points=((1000, 0.2), (4000, 0.4)))
    est = estimator(Params(attention_fwd=curve))
    flops = 1e12
    t = est.compute_time(Compute("attention fwd", flops, "attention", 4000, fill=0.25))
    assert t == pytest.approx(flops / (989e12 * 0.3))
    assert est.compute_time(Compute("attention fwd", flops, "attention", 4000)) == pytest.approx(flops / (989e12 * 0.4))


def test_merge_bytes_per_round_by_hand():
    """b 1, 4096 tokens over ring 4 (1024 per block), 8 heads x 64, bf16: forward reads the block's out (2 B)
    and makes three eager fp32 passes over the accumulator (mul_: 4 + 4, block x weight: + 4, add_: 4 + 4 + 4),
    plus 86 B per fp32 LSE; backward accumulates dQ, dK, dV into fp32 (2 + 4 + 4 B)."""
    c = Shape(MODEL, Workload(seq_len=4096), dp=1, ulysses=1, ring=4, token_layout="contiguous")
    elems = 1024 * 8 * 64
    assert merge_bytes(c, False) == elems * (2 + 24) + 1024 * 8 * 86
    assert merge_bytes(c, True) == 3 * elems * 10
    merges = [p for st in ring_steps(c, False) for p in st.phases if isinstance(p, Compute) and p.kind == "memory"]
    assert merges and all(p.nbytes == merge_bytes(c, False) for p in merges)
    one = Shape(MODEL, Workload(seq_len=4096), dp=1, ulysses=1, ring=1, token_layout="contiguous")
    assert not [p for st in ring_steps(one, False) for p in st.phases if isinstance(p, Compute) and p.kind == "memory"]


def test_transformer_engine_merge_by_hand_is_one_pass_in_the_input_dtype():
    """The same shape under TransformerEngine's fused correction: read the step's out and the accumulator, write
    it, all bf16 (3 x 2 B), 28 B per LSE; backward dq.add_ / dkv.add_ in bf16 (3 x 2 B)."""
    te = Shape(MODEL, Workload(seq_len=4096), dp=1, ulysses=1, ring=4, token_layout="contiguous",
               merge=MERGES["transformer-engine"])
    elems = 1024 * 8 * 64
    assert merge_bytes(te, False) == elems * 6 + 1024 * 8 * 28
    assert merge_bytes(te, True) == 3 * elems * 6


def test_ring_merge_reaches_the_schedules_through_params():
    """Params.ring_merge picks the merge the estimator's shapes price: every round of the same ring (8 rounds)
    carries the runtime's merge bytes, and the ring costs less under TransformerEngine's fused merge than under
    sp-plan's eager one, by at most the merges' bytes over the HBM bandwidth."""
    from sp_plan.planner import Plan
    from sp_plan.planner.candidate import Candidate

    plan = Plan(algorithm="ring", degrees={"ring": 8}, order=["ring"])
    hbm = 1e12
    times, shapes = {}, {}
    for name in ("sp-plan", "transformer-engine"):
        est = estimator(Params(hbm_bandwidth=hbm, ring_merge=name))
        times[name] = est.attention_time(plan)[0]
        shapes[name] = est.shape(Candidate.from_plan(plan))
        assert shapes[name].merge == MERGES[name]
        merges = [p.nbytes for st in attention_steps(shapes[name], False) for p in st.phases
                  if isinstance(p, Compute) and p.kind == "memory"]
        assert merges and set(merges) == {merge_bytes(shapes[name], False)}
    saved = 8 * (merge_bytes(shapes["sp-plan"], False) - merge_bytes(shapes["transformer-engine"], False)) / hbm
    # the rounds overlap their compute with the K, V transfer, which hides part of the merge's cost
    assert 0 < times["sp-plan"] - times["transformer-engine"] <= saved * (1 + 1e-9)
    with pytest.raises(ValueError, match="ring_merge"):
        Params(ring_merge="flash")


def test_all_to_all_packing_is_two_read_write_passes_beside_each_all_to_all():
    c = Shape(MODEL, Workload(seq_len=4096), dp=1, ulysses=4, ring=1, token_layout="contiguous")
    a2a_steps = [st for st in usp_steps(c, False) if any(isinstance(p, Comm) for p in st.phases)]
    assert len(a2a_steps) == 2
    for st in a2a_steps:
        comm = next(p for p in st.phases if isinstance(p, Comm))
        pack = next(p for p in st.phases if isinstance(p, Compute))
        assert pack.kind == "memory" and pack.nbytes == 4 * comm.nbytes == a2a_packing(comm).nbytes
        assert not st.overlap  # packing, then the all-to-all: they add up


def test_partial_overlap_exposes_the_hidden_share_of_the_shorter_side():
    """compute 1 ms beside 0.5 ms of communication at overlap 0.9: 1 + 0.1 x 0.5 = 1.05 ms."""
    est = estimator(Params(overlap=0.9, hbm_bandwidth=1e12))
    orders = est.orders({"ring": 8}, [("ring",)])
    comm = Comm("ring p2p fwd", "shift", ("ring",), 1.0)
    spb_lat = orders.coefficients(comm)
    nbytes = (0.5e-3 / spb_lat[0][0] - spb_lat[2][0]) / spb_lat[1][0]  # bytes whose shift takes 0.5 ms
    step = Step((Compute("merge", 0.0, "memory", nbytes=1e9), Comm("ring p2p fwd", "shift", ("ring",), nbytes)),
                overlap=True)
    assert float(est.price([step], orders).seconds[0]) == pytest.approx(1.05e-3)


def test_h100_curves_come_from_the_measured_table():
    """16k tokens: forward 356 TFLOP/s; backward 2.5 F over (3.5 F / 321 - F / 356) = 308.85 TFLOP/s (of 989)."""
    fwd, bwd = h100_curves()
    assert fwd.at(16384) == pytest.approx(356 / 989)
    assert bwd.at(16384) == pytest.approx(2.5 / (3.5 / 321 - 1 / 356) / 989)
    assert fwd.at(512) == pytest.approx(108 / 989)


def test_other_devices_take_the_h100_shape_at_their_plateau_and_speed():
    """L20 (119.5 TFLOP/s, no published figure: the preset's plateau, 0.6): sizes shrink by
    sqrt(989 x 0.36 / (119.5 x 0.6)) = 2.223 for forward."""
    fwd, bwd = attention_curves("L20-48GB", 0.6, 119.5e12)
    k = math.sqrt(356e12 / (119.5e12 * 0.6))
    assert k == pytest.approx(2.2283, abs=1e-4)
    assert fwd.at(16384 / k) == pytest.approx(0.6)
    kb = math.sqrt(989e12 * h100_curves()[1].at(16384) / (119.5e12 * 0.6))
    assert bwd.at(16384 / kb) == pytest.approx(0.6)
    assert fwd.at(512 / k) == pytest.approx(0.6 * 108 / 356)


def test_a100_class_plateaus_are_flashattention2s_published_ones():
    """FlashAttention-2 on A100: up to 73 % of peak forward, 63 % backward (at 16k, head dim 128); the preset's
    attn_efficiency (0.65) is not what A100 or A800 are priced by; forward sizes shrink by sqrt(356 / (312 x 0.73))."""
    from sp_plan.profiles.kernels import attention_plateaus

    for model in ("A100-SXM4-80GB", "A100-SXM4-40GB", "A800-SXM4-80GB"):
        assert attention_plateaus(model, 0.65) == (0.73, 0.63)
        fwd, bwd = attention_curves(model, 0.65, 312e12)
        k = math.sqrt(356e12 / (312e12 * 0.73))  # the H100's 16k point lands at 16k / k
        assert fwd.at(16384 / k) == pytest.approx(0.73) and fwd.at(512 / k) == pytest.approx(0.73 * 108 / 356)
        h_bwd = h100_curves()[1].at(16384)
        kb = math.sqrt(989e12 * h_bwd / (312e12 * 0.63))
        assert bwd.at(16384 / kb) == pytest.approx(0.63)
    assert attention_plateaus("A10-24GB", 0.6) == (0.6, 0.6)  # not the A100's figures
    assert attention_plateaus("L20-48GB", 0.6) == (0.6, 0.6)


def test_device_models_match_their_data_at_a_word_boundary():
    keys = ("H100", "A10", "A100-SXM4-80GB", "L20")
    assert device_key("H100-SXM5-80GB", keys) == device_key("NVIDIA H100 80GB HBM3", keys) == "H100"
    assert device_key("A10-24GB", keys) == device_key("NVIDIA A10", keys) == "A10"
    assert device_key("NVIDIA A100 80GB PCIe", keys) is None  # not the A10's data
    assert device_key("A100-SXM4-80GB", keys) == "A100-SXM4-80GB"


def test_collective_efficiencies_per_fabric():
    h100 = comm_defaults(load_cluster("dgx-h100", 2))
    assert h100["p2p/inter"].efficiency == 0.96 and h100["all_to_all/inter"].efficiency == 0.96
    assert not [k for k in h100 if k.endswith("/intra")]  # NVSwitch: no per-kind figure, the presets' rates
    l20 = comm_defaults(load_cluster("l20-8-pcie"))
    assert set(l20) == {f"{p}/intra" for p in ("p2p", "p2p_bidir", "all_gather", "reduce_scatter", "all_reduce",
                                                "all_to_all")} | {"all_to_all/host"}  # through the CPU: test_fidelity_host
    assert all(f.efficiency == 0.89 for k, f in l20.items() if k.endswith("/intra"))
    assert not [k for k in comm_defaults(load_cluster("a100-16-eth100", 2)) if k.endswith("/inter")]  # TCP: none
    # a shift on PCIe: bytes over 0.89 x 32 GB/s + the path latency
    eng, shape = LinkEngine(load_cluster("l20-8-pcie")), GroupShape(((2, 1),), 8)
    base = eng.time("shift", shape, 1e9)
    fitted = eng.time("shift", shape, 1e9, Params(comm=l20))
    lat = eng.cost("shift", shape).latency
    assert fitted - lat == pytest.approx((base - lat) / 0.89)


def test_default_params_of_the_presets():
    p = default_params(load_cluster("dgx-h100"))
    assert p.round_overhead_s == pytest.approx(7 * 5e-6 + 10e-6)
    assert p.overlap == pytest.approx(1 - 4 / 132) and p.hbm_bandwidth == pytest.approx(3.35e12 * 0.85)
    assert default_params(load_cluster("cpu-local")) == Params()
    assert default_params(load_cluster("l20-8-pcie")).hbm_bandwidth == pytest.approx(0.864e12 * 0.85)


def test_no_profile_prices_with_the_presets_defaults():
    cl = load_cluster("dgx-a100")
    params, line, prof = resolve_params(cl, False)
    assert prof is None and params == default_params(cl) and "not using" in line


def test_pruning_stays_exact_under_the_default_params():
    """The new terms keep every lower bound below its candidates: the pruned grid equals exhaustive pricing."""
    from sp_plan.planner.search import best_per_variant, grid_search, variant_key
    from sp_plan.profiles import load_model

    for preset, nodes, seq in (("l20-8-pcie", 1, "32k"), ("dgx-h100", 2, "64k")):
        cluster = load_cluster(preset, nodes)
        params = default_params(cluster)
        model, work = load_model("llama3-8b"), Workload(seq_len=seq, batch=2)
        full = grid_search(cluster, model, work, keep=None, params=params)
        pruned = grid_search(cluster, model, work, keep=5, params=params)
        assert [(round(t, 12), c) for t, c in pruned.ranked[:5]] == [(round(t, 12), c) for t, c in full.ranked[:5]]
        # every variant's best time (a tie between token layouts may be broken either way: WallFacer's causal team
        # block priced as C^2 ring blocks costs the same zigzag or striped)
        assert [(t, variant_key(c)) for t, c in best_per_variant(pruned.ranked)] == \
            [(t, variant_key(c)) for t, c in best_per_variant(full.ranked)]
        assert np.isfinite(full.ranked[0][0])


def count_bytes(fn, big_numel: int) -> tuple[int, int]:
    """Bytes that ``fn``'s aten ops (views aside) read and write, every tensor argument read and every result
    written: (those of tensors of ``big_numel`` elements, those of the others)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    big, small = [0], [0]

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            res = func(*args, **(kwargs or {}))
            if not func.is_view:
                ts = [t for t in torch.utils._pytree.tree_leaves((args, kwargs, res)) if isinstance(t, torch.Tensor)]
                for t in ts:
                    (big if t.numel() == big_numel else small)[0] += t.numel() * t.element_size()
            return res

    with Count():
        fn()
    return big[0], small[0]


def test_merge_bytes_are_what_the_runtimes_merge_moves():
    """Every aten op of runtime/kernels.merge (views aside) reads its tensor arguments and writes its outputs:
    summed, the out-sized ones are MERGES["sp-plan"].forward(e) per out element (a fused merge would fail here,
    and must lower the entry), the LSE-sized ones about its ``lse`` per LSE element."""
    import torch

    from sp_plan.runtime.kernels import merge

    b, n, h, d = 1, 256, 4, 64
    out, lse = torch.randn(b, n, h, d), torch.randn(b, h, n)
    block_out, block_lse = torch.randn(b, n, h, d, dtype=torch.bfloat16), torch.randn(b, h, n)
    big, small = count_bytes(lambda: merge(out, lse, block_out, block_lse), out.numel())
    mb = MERGES["sp-plan"]
    assert big == out.numel() * mb.forward(block_out.element_size())
    assert small == pytest.approx(lse.numel() * mb.lse, rel=0.05)


def test_yunchang_merge_bytes_are_what_its_log_form_update_moves():
    """The merge yunchang ran in May 2024 (USP Tables 3-4; ring-flash-attention's log-form update), op by op as
    torch.jit.script runs it: block out to fp32; new_lse = lse + log(1 + exp(blse - lse)); out = exp(lse - new_lse)
    out + exp(blse - new_lse) block_out. Counted like sp-plan's: MERGES["yunchang"] exactly."""
    import torch

    b, n, h, d = 1, 256, 4, 64
    out, lse = torch.randn(b, n, h, d), torch.randn(b, n, h, 1)  # its LSE accumulator: (b, s, h, 1)
    block_out, block_lse = torch.randn(b, n, h, d, dtype=torch.bfloat16), torch.randn(b, h, n)

    def update():
        bo = block_out.to(torch.float32)
        bl = block_lse.transpose(-2, -1).unsqueeze(dim=-1)
        new_lse = lse + torch.log(1 + torch.exp(bl - lse))
        return torch.exp(lse - new_lse) * out + torch.exp(bl - new_lse) * bo

    big, small = count_bytes(update, out.numel())
    mb = MERGES["yunchang"]
    assert big == out.numel() * mb.forward(block_out.element_size())
    assert small == lse.numel() * mb.lse


def test_a_device_with_a_measured_table_uses_it():
    """The H200's curve is the runtime's measured block kernel (profiles/kernels.yaml), not the H100's shape moved
    to a plateau: its 16k-token forward efficiency is the table's 677 of 989 TFLOP/s."""
    fwd, bwd = attention_curves("H200-SXM-141GB", 0.55, 989e12)
    assert fwd.at(16384) == pytest.approx(677 / 989)
    assert bwd.at(16384) == pytest.approx(2.5 / (3.5 / 616 - 1 / 677) / 989)
    assert attention_curves("H100-SXM5-80GB", 0.55, 989e12)[0].at(16384) == pytest.approx(h100_curves()[0].at(16384))
