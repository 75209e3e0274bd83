"""All-gather K/V context parallelism in the planner (planner/allgather.py): its schedule in the project's phases,
its volume against the closed form, GQA's effect, its buffers, and its attention work from the mask."""
import numpy as np
import pytest

from sp_plan.planner import Estimator, PlanError, Workload
from sp_plan.planner.algorithms import ALGORITHMS
from sp_plan.planner.candidate import Candidate
from sp_plan.planner.engine import pattern_steps
from sp_plan.planner.masks import busiest_rank_pairs, causal_pairs, layout_pairs
from sp_plan.planner.model import ModelSpec
from sp_plan.planner.schedules import Comm, Compute, Shape, attention_blocks
from sp_plan.planner.tokenring import tokenring_steps
from sp_plan.planner.usp import ring_steps
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.documents import load_documents


@pytest.fixture
def allgather():
    """The module, registered for the test (and the registry left as it was found)."""
    had = "allgather" in ALGORITHMS  # before the import: importing the module registers it
    from sp_plan.planner import allgather as module
    ALGORITHMS.setdefault("allgather", module.ALLGATHER)
    yield module
    if not had:
        ALGORITHMS.pop("allgather", None)


def shape(model, ring=8, layout="zigzag", ulysses=1, seq_len=32768, algorithm="allgather", **work):
    return Shape(model, Workload(seq_len=seq_len, **work), dp=1, ulysses=ulysses, ring=ring, token_layout=layout,
                 algorithm=algorithm)


def gqa(kv_heads=8):
    return ModelSpec(layers=4, hidden=4096, heads=32, kv_heads=kv_heads, vocab=0)  # llama3-8b's attention


def comms(steps):
    return [(p, st.repeat) for st in steps for p in st.phases if isinstance(p, Comm)]


def received(steps) -> float:
    """Bytes each rank receives over a schedule: a ring collective's n - 1 steps of 1/n, a shift's whole volume."""
    out = 0.0
    for p, k in comms(steps):
        n = {"ring": 8}.get(p.dim[0], 8)
        out += k * (pattern_steps(p.pattern, n) * p.nbytes / n if p.pattern in ("all_gather", "reduce_scatter")
                    else p.nbytes)
    return out


# ---------------------------------------------------------------- the schedule

def test_forward_gathers_k_v_then_attends_and_backward_reduce_scatters_dk_dv(allgather):
    c = shape(gqa())
    fwd, bwd = allgather.allgather_steps(c, False), allgather.allgather_steps(c, True)
    assert [(p.pattern, p.dim) for p, _ in comms(fwd)] == [("all_gather", ("ring",))]
    assert [(p.pattern, p.dim) for p, _ in comms(bwd)] == [("all_gather", ("ring",)), ("reduce_scatter", ("ring",))]
    assert [type(st.phases[0]).__name__ for st in fwd] == ["Comm", "Compute"]
    assert [type(st.phases[0]).__name__ for st in bwd] == ["Comm", "Compute", "Comm"]
    assert not any(st.overlap for st in fwd + bwd)  # the gather is exposed: nothing to hide it behind
    assert all(st.repeat == 1 for st in fwd + bwd)


def test_the_gather_moves_p_minus_1_over_p_of_the_sequences_k_v(allgather):
    m, S, P = gqa(), 32768, 8
    c = shape(m, ring=P, seq_len=S)
    kv = 2 * S * m.kv_heads * m.head_dim * m.dtype_bytes  # K and V of the sequence, unrepeated GQA heads
    assert allgather.gathered_kv_bytes(c) == kv
    assert allgather.received_bytes(c) == pytest.approx((P - 1) / P * kv)
    assert received(allgather.allgather_steps(c, False)) == pytest.approx((P - 1) / P * kv)
    grads = 2 * S * m.kv_heads * m.head_dim * 4  # the full-length dK, dV, in the runtime's fp32 accumulators
    assert received(allgather.allgather_steps(c, True)) == pytest.approx((P - 1) / P * (kv + grads))
    assert allgather.received_bytes(c, backward=True) == pytest.approx((P - 1) / P * (kv + grads))


def test_under_gqa_8_to_1_it_moves_less_than_rings_k_v_circulation_and_under_half_of_tokenrings(allgather):
    """Per layer, forward and backward: ring circulates the same K, V (and the fp32 dK, dV accumulators) plus the
    accumulators' last hop home; TokenRing moves Q, out and their gradients, at all 32 query heads where K, V
    have 8."""
    def per_layer(steps_of, m, algorithm):
        return sum(received(steps_of(shape(m, algorithm=algorithm), b)) for b in (False, True))

    m = gqa(8)
    ag = per_layer(allgather.allgather_steps, m, "allgather")
    ring = per_layer(ring_steps, m, "ring")
    tokenring = per_layer(tokenring_steps, m, "tokenring")
    kv_block = 32768 / 8 * 8 * 128 * 4  # one rank's dK (or dV) accumulator bytes
    assert ring - ag == pytest.approx(2 * kv_block)  # the ring's last hop of dK, dV home
    assert 2 * ag < tokenring
    mha = per_layer(allgather.allgather_steps, gqa(32), "allgather")
    assert mha == pytest.approx(4 * ag) and mha > tokenring / 2  # without GQA the gather is no longer small


def test_one_rank_gathers_nothing(allgather):
    c = Shape(gqa(), Workload(seq_len=4096), dp=1, ulysses=4, ring=1, token_layout="contiguous",
              algorithm="allgather")
    assert [p.pattern for p, _ in comms(allgather.allgather_steps(c, True))] == ["all_to_all", "all_to_all"]


def test_ulysses_inside_wraps_the_gather_in_its_all_to_alls_and_gathers_head_shards(allgather):
    m = gqa(8)
    c = shape(m, ring=4, ulysses=2)
    fwd = comms(allgather.allgather_steps(c, False))
    assert [p.pattern for p, _ in fwd] == ["all_to_all", "all_gather", "all_to_all"]
    assert allgather.gathered_kv_bytes(c) == 2 * 32768 * (8 / 2) * 128 * 2  # 4 of the 8 KV heads


# ---------------------------------------------------------------- its work and buffers

def test_its_attention_is_the_busiest_ranks_pairs_under_the_layout(allgather):
    m, S, P = gqa(), 8192, 8
    for layout in ("contiguous", "zigzag", "striped"):
        c = shape(m, ring=P, layout=layout, seq_len=S)
        fwd = next(p for st in allgather.allgather_steps(c, False) for p in st.phases if isinstance(p, Compute))
        busiest = layout_pairs(layout, P, [0, S]).max()
        assert fwd.flops == pytest.approx(4 * busiest * m.heads * m.head_dim)
        assert fwd.block in attention_blocks(c) and fwd.fill == pytest.approx(busiest / S ** 2)
        bwd = next(p for st in allgather.allgather_steps(c, True) for p in st.phases if isinstance(p, Compute))
        assert bwd.flops == pytest.approx(2.5 * fwd.flops)
        # causal: the masked kernel's curve; ranks sharing cores work through the mean rank's pairs, not the busiest's
        mean = layout_pairs(layout, P, [0, S]).mean()
        assert fwd.masked and fwd.balance == ((pytest.approx(mean / busiest),) if mean < busiest else ())
    assert not next(p for st in allgather.allgather_steps(shape(m, ring=P, causal=False), False)
                    for p in st.phases if isinstance(p, Compute)).masked
    c = S // P  # contiguous: the last rank's queries see every earlier key
    assert allgather.busiest_pairs(shape(m, ring=P, layout="contiguous", seq_len=S)) == c * (S - c) + causal_pairs(c)


def test_documents_and_windows_cut_its_work_and_a_pattern_averages_the_layers(allgather):
    m = gqa()
    full = allgather.busiest_pairs(shape(m))
    packed = allgather.busiest_pairs(shape(m, documents=load_documents("magi-short")))
    windowed = allgather.busiest_pairs(shape(m, window=4096))
    assert packed < full / 2 and windowed < full / 4
    mixed = allgather.busiest_pairs(shape(m, window={"size": 4096, "pattern": "3:1"}))  # 4 layers: 3 local, 1 global
    assert mixed == pytest.approx((3 * windowed + full) / 4)


def test_its_buffers_are_the_gathered_k_v_and_in_backward_the_full_length_dk_dv(allgather):
    c = shape(gqa())
    kv = allgather.gathered_kv_bytes(c)
    assert allgather.allgather_buffer_bytes(c, training=False) == kv
    assert allgather.allgather_buffer_bytes(c, training=True) == kv + 2 * kv  # bf16 K, V; fp32 dK, dV


# ---------------------------------------------------------------- in the registry and the engine

def test_its_variants_and_checks(allgather):
    class D:
        ring, ulysses = 8, 1
    assert [v.algorithm for v in allgather.allgather_variants(D, None, None)] == ["allgather"]
    D.ring = 1
    assert allgather.allgather_variants(D, None, None) == []
    with pytest.raises(PlanError, match="ring") as e:
        allgather.check_allgather(Candidate("allgather", ulysses=8, ring=1), None, None)
    assert e.value.field == "degrees.ring"


def test_the_estimator_prices_it_with_its_gather_exposed_and_small_under_gqa(allgather):
    cluster, model = load_cluster("dgx-h100"), load_model("llama3-8b")
    est = Estimator(cluster, model, Workload(seq_len="128k"))
    cand = Candidate("allgather", ring=8, order=("ring",), token_layout="zigzag")
    est.check(cand)
    ev = est.evaluate(cand, detail=True)
    rows = {name: (nbytes, seconds, exposed) for name, kind, group, nbytes, seconds, exposed in ev.rows}
    c = Shape(model, est.work, dp=1, ulysses=1, ring=8, token_layout="zigzag", algorithm="allgather")
    for name, per_element in (("allgather k,v fwd", 2), ("allgather k,v bwd", 2),
                              ("allgather reduce-scatter dk,dv", 4)):  # bf16 K, V; the runtime's fp32 dK, dV
        nbytes, seconds, exposed = rows[name]
        assert nbytes == pytest.approx(model.layers * allgather.gathered_kv_bytes(c) * per_element / 2)
        assert exposed == seconds > 0  # not overlapped
    gather = sum(rows[n][2] for n in rows if n.startswith("allgather"))
    assert gather < 0.05 * ev.step_time_s  # 8 KV heads of 128k tokens on NVSwitch: a few percent of the step
    ring = est.evaluate(Candidate("ring", ring=8, order=("ring",), token_layout="zigzag"))
    assert abs(ev.step_time_s / ring.step_time_s - 1) < 0.05


def test_the_balanced_floor_follows_the_mask(allgather):
    """The search's floor under every schedule's attention (schedules.balanced_attention) counts the mask's pairs."""
    from sp_plan.planner.schedules import balanced_attention
    m = gqa()
    plain = balanced_attention(shape(m), False, 4096.0).flops
    packed = balanced_attention(shape(m, documents=load_documents("magi-short")), False, 4096.0).flops
    assert plain == pytest.approx(4 * 32768 * 32768 * 32 * 128 * (32769 / 65536) / 8)
    assert packed < plain / 2
    for layout in ("zigzag", "contiguous"):  # still a floor: the busiest rank of the all-gather is above it
        c = shape(m, layout=layout, documents=load_documents("magi-short"))
        assert allgather.attention_phase(c, False).flops >= balanced_attention(c, False, 4096.0).flops
    np.testing.assert_allclose(busiest_rank_pairs(Workload(seq_len=64), "zigzag", 1).pairs, causal_pairs(64))
