"""TP-sp, PP, ZeRO and checkpointing in the schedules and the memory model; grid and Bayesian search over them."""
import numpy as np
import pytest

from sp_plan.planner import Estimator, ModelSpec, Workload
from sp_plan.planner.bayes import PENALTY, bayes_search, trials_to_reach
from sp_plan.planner.candidate import Candidate
from sp_plan.planner.memory import layer_activation_bytes_per_token, weight_bytes
from sp_plan.planner.schedules import Comm, Shape, linear_steps, shard_params
from sp_plan.planner.search import Space, grid_search, pareto_policies
from sp_plan.profiles import load_cluster, load_model


def test_usp_table2_memory_rows_by_zero_stage():
    """USP Table 2: P/G and OS columns. DP and SP: P + G and 6P; ZeRO-1: 6P/N; ZeRO-2: G/N; ZeRO-3: (P+G)/N.
    P and G are the bf16 weights and the (fp32, Megatron) gradients; OS = fp32 master, m, v = 6 P."""
    n_params, N = 1000.0, 8
    P, G, OS = 2 * n_params, 4 * n_params, 6 * 2 * n_params
    dp = weight_bytes(n_params, 0, N, True)
    assert (dp["weights"], dp["gradients"], dp["optimizer"]) == (P, G, OS)
    z1 = weight_bytes(n_params, 1, N, True)
    assert (z1["weights"], z1["gradients"], z1["optimizer"]) == (P, G, OS / N)
    z2 = weight_bytes(n_params, 2, N, True)
    assert (z2["weights"], z2["gradients"], z2["optimizer"]) == (P, G / N, OS / N)
    z3 = weight_bytes(n_params, 3, N, True)
    assert (z3["weights"], z3["gradients"], z3["optimizer"]) == (P / N, G / N, OS / N)
    # Megatron: 18 B/param, or 6 + 12/DP with the distributed optimizer (= ZeRO-1)
    assert sum(dp.values()) == 18 * n_params
    assert sum(z1.values()) == pytest.approx((6 + 12 / N) * n_params)


def test_usp_table2_tp_and_tp_sp_rows():
    """TP-sp: 4 all-gathers + 4 reduce-scatters of bs L d per layer (forward and backward), the same
    8 O(bs L d) as TP's 4 all-reduces; weights, gradients and optimizer states divided by N."""
    m = ModelSpec(layers=2, hidden=1024, heads=16, vocab=0)
    b, L, tp = 2, 4096, 4
    c = Shape(m, Workload(seq_len=L, batch=b), dp=1, ulysses=1, ring=1, token_layout="contiguous", tp=tp, mbs=b)
    comms = [(p, st.repeat) for bwd in (False, True) for st in linear_steps(c, bwd) for p in st.phases
             if isinstance(p, Comm)]
    ag = sum(k for p, k in comms if p.pattern == "all_gather")
    rs = sum(k for p, k in comms if p.pattern == "reduce_scatter")
    assert (ag, rs) == (4, 4)
    assert all(p.nbytes == b * L * m.hidden * 2 and p.dim == ("tp",) for p, _ in comms)
    assert shard_params(m, tp, 1) == pytest.approx(m.params() / tp)


def test_pipeline_bubble_is_p_minus_1_over_m_plus_p_minus_1():
    cl, m = load_cluster("dgx-h100", 1), load_model("llama2-7b")
    for pp, batch in ((2, 8), (4, 8), (8, 16)):
        est = Estimator(cl, m, Workload(seq_len="8k", batch=batch))
        cand = Candidate("ring", pp=pp, ring=8 // pp, order=("ring", "pp") if pp < 8 else ("pp",), token_layout="zigzag",
                         zero_stage=1)
        ev = est.evaluate(cand, detail=True)
        bubble = next(r for r in ev.rows if r[0] == "pipeline bubble")[4]
        stage_total = ev.step_time_s - sum(r[5] for r in ev.rows if r[0].startswith(("grad", "param")))
        assert bubble / stage_total == pytest.approx((pp - 1) / (batch + pp - 1), rel=1e-9)


def test_activation_memory_agrees_with_megatron_for_llama2_7b():
    """Megatron's theoretical_memory_usage (Korthikanti et al. Table 2, selective recompute + SP):
    s b h (18 + 4 ffn/h) bytes per layer. Ours, per token from the saved tensors, is within 3 %."""
    m = load_model("llama2-7b")
    c = Shape(m, Workload(seq_len=4096), dp=1, ulysses=1, ring=1, token_layout="contiguous")
    megatron = m.hidden * (18 + 4 * m.ffn_hidden / m.hidden)
    ours = layer_activation_bytes_per_token(c)
    assert ours == pytest.approx(megatron, rel=0.03)


def test_checkpointing_keeps_each_layers_input_and_one_layer_and_zero_shards_what_its_stage_says():
    """Full recomputation holds every layer's input (hidden x e per token) and one layer's saved tensors; none holds
    every layer's; ZeRO-1 shards the optimizer states, ZeRO-2 the gradients too, ZeRO-3 the weights too; the plan
    uses 90 % of the device's memory."""
    from sp_plan.planner.estimate import MEMORY_HEADROOM
    from sp_plan.planner.memory import activation_bytes

    m = load_model("llama3-8b")
    c = Shape(m, Workload(seq_len=8192), dp=1, ulysses=1, ring=1, token_layout="contiguous")
    layer = layer_activation_bytes_per_token(c) * 8192
    full = activation_bytes(c, "full", True)["activations"]
    assert full == pytest.approx(m.layers * 8192 * m.hidden * c.e + layer, rel=1e-12)
    assert activation_bytes(c, "none", True)["activations"] == pytest.approx(m.layers * layer, rel=1e-12)
    p = 1e9
    w = [weight_bytes(p, z, 8, True) for z in range(4)]
    assert [x["optimizer"] for x in w] == [12 * p, 12 * p / 8, 12 * p / 8, 12 * p / 8]
    assert [x["gradients"] for x in w] == [4 * p, 4 * p, 4 * p / 8, 4 * p / 8]
    assert [x["weights"] for x in w] == [2 * p, 2 * p, 2 * p, 2 * p / 8]
    cl = load_cluster("dgx-h100")
    pred = Estimator(cl, m, Workload(seq_len=8192)).predict(Candidate("ulysses", ulysses=8, order=("ulysses",)))
    assert MEMORY_HEADROOM == 0.9 and pred.memory_capacity_bytes == pytest.approx(0.9 * cl.device(0).memory_bytes)


def test_pareto_policies_keep_only_undominated():
    pols = [(z, ck, 1) for ck in ("none", "attention_boundary", "full") for z in (0, 1, 2, 3)]
    kept = pareto_policies(pols)
    assert kept == [(0, "none", 1), (1, "none", 1)]  # ZeRO-0 and 1: neither exposes less sync in every case
    kept = pareto_policies([p for p in pols if p[0] == 3 or p[1] == "full"])
    assert kept == [(3, "none", 1), (0, "full", 1), (1, "full", 1)]


@pytest.mark.parametrize("case", [("a100-16-eth100", 2, "tiny-llama", "16k", 8), ("dgx-h100", 2, "gpt-3b", "32k", 4)],
                         ids=["tiny-llama: DDP buckets coarser than a layer", "gpt-3b"])
def test_the_policies_pareto_drops_are_never_faster_on_any_mesh_order(case):
    """Every fitting policy priced against the Pareto survivors of its micro-batch: on every mesh order the
    survivors' best is the best of all (ZeRO-0's coarser buckets and ZeRO-1's forward-hidden all-gather each win
    somewhere, so neither may drop the other)."""
    from sp_plan.planner.estimate import Estimator
    from sp_plan.planner.search import Candidate, Space

    preset, nodes, model, seq, batch = case
    cl, m = load_cluster(preset, nodes), load_model(model)
    w = Workload(seq_len=seq, batch=batch)
    est, space = Estimator(cl, m, w), Space(cl.world_size, m, w)
    compared = wins = 0
    for d in space.degrees():
        orders = space.orders(d)
        base = Candidate("usp" if d.ring > 1 and d.ulysses > 1 else "ring" if d.ring > 1 else "ulysses", d.dp, d.pp,
                         d.tp, d.ulysses, d.ring, orders[0], "zigzag" if d.ring > 1 else "contiguous")
        fits = est.fitting(base, space.policies(d))
        if len(fits) < 2:
            continue
        kept = pareto_policies(fits)
        times = est.evaluate_orders(base, est.orders(base.degrees, orders, base.placement), fits)[0]
        keep = [j for j, p in enumerate(fits) if p in kept]
        assert np.all(times[:, keep].min(axis=1) <= times.min(axis=1) * (1 + 1e-12)), (d, kept)
        compared += 1
        best = times.argmin(axis=1)
        wins += int(any(fits[j][0] == 1 for j in best)) + int(any(fits[j][0] == 0 for j in best))
    assert compared > 5 and wins > 0


def test_grid_pruning_keeps_the_exact_top_k():
    cl, m = load_cluster("dgx-h100", 4), load_model("llama3-8b")
    w = Workload(seq_len="256k", batch=4)
    pruned = grid_search(cl, m, w, keep=5)
    full = grid_search(cl, m, w, keep=None)
    assert [t for t, _ in pruned.ranked[:5]] == pytest.approx([t for t, _ in full.ranked[:5]])
    assert [c for _, c in pruned.ranked[:5]] == [c for _, c in full.ranked[:5]]
    assert pruned.evaluated < full.evaluated


def test_space_respects_constraints():
    m, w = load_model("llama3-70b"), Workload(seq_len="64k", batch=4)
    sp = Space(64, m, w)
    for d in sp.degrees():
        assert d.dp * d.pp * d.tp * d.ulysses * d.ring == 64
        assert m.heads % (d.tp * d.ulysses) == 0 and d.pp <= m.layers and w.batch % d.dp == 0


def test_bayes_reaches_the_grid_optimum_and_is_seeded(tmp_path):
    cl, m = load_cluster("dgx-h100", 8), load_model("llama3-8b")
    w = Workload(seq_len="512k", batch=4)
    grid = grid_search(cl, m, w)
    opt = grid.ranked[0][0]
    r1 = bayes_search(cl, m, w, trials=60, seed=3)
    r2 = bayes_search(cl, m, w, trials=60, seed=3)
    assert r1.space == grid.space > r1.evaluated  # the whole space, as the grid counts it, not the trials' share
    assert [t.params for t in r1.study.trials] == [t.params for t in r2.study.trials]
    assert trials_to_reach(r1, opt) is not None
    assert r1.ranked[0][0] == pytest.approx(opt, rel=0.01)
    assert all(t < PENALTY for t, _ in r1.ranked)  # penalised trials never become plans
    # a study in SQLite storage resumes where it stopped
    url = f"sqlite:///{tmp_path / 'study.db'}"
    a = bayes_search(cl, m, w, trials=10, seed=1, storage=url, study_name="s")
    b = bayes_search(cl, m, w, trials=10, seed=1, storage=url, study_name="s")
    assert a.trials == 10 and b.trials == 20


def test_tp_must_split_kv_heads_and_ffn_in_the_search_the_estimate_and_the_runtime_alike():
    from sp_plan.planner import Candidate, Estimator, PlanError, Workload
    from sp_plan.planner.search import Space
    from sp_plan.profiles import load_cluster, load_model

    m, w = load_model("tiny-llama"), Workload(seq_len=4096, batch=1)  # 8 heads, 4 KV heads
    assert m.tp_problem(4) is None and "kv heads 4" in m.tp_problem(8)
    assert {d.tp for d in Space(8, m, w).degrees()} == {1, 2, 4}  # tp 8 divides the heads, not the KV heads
    with pytest.raises(PlanError, match="kv heads 4") as e:
        Estimator(load_cluster("cpu-local", 2), m, w).check(Candidate("ring", tp=8, order=("tp",)))
    assert e.value.field == "degrees.tp"


@pytest.mark.parametrize("training", [True, False])
def test_the_counted_size_of_each_degrees_choice_is_its_listed_candidates(training):
    """``degree_size`` counts a plain Space's candidates without listing them; a subclass that lists its mesh orders
    is counted from the lists. Both agree on every degrees choice, pipelines with interleaving included (the
    "N candidates" that `plan` prints)."""
    from sp_plan.planner.search import degree_size

    class Listed(Space):
        def orders(self, d):
            return super().orders(d)

    work = Workload(seq_len="32k", batch=16, training=training)
    model = load_model("llama3-8b")
    counted, listed = Space(64, model, work), Listed(64, model, work)
    sizes = [(degree_size(counted, d), degree_size(listed, d), d) for d in counted.degrees()]
    assert all(a == b for a, b, _ in sizes), [s for s in sizes if s[0] != s[1]][:3]
    assert any(len(d.dims()) >= 3 for _, _, d in sizes) and any(d.pp > 1 for _, _, d in sizes)


def test_each_replica_runs_the_batch_over_dp_in_micro_batches_of_their_size():
    from sp_plan.planner.model import micro_batches

    assert micro_batches(16, 2, 2) == 4 and micro_batches(16, 8, 1) == 2 and micro_batches(4, 8, 1) == 1
    shape = Shape(load_model("llama3-8b"), Workload(seq_len=4096, batch=16), dp=2, ulysses=1, ring=1,
                  token_layout="contiguous", mbs=2)
    assert shape.micro_batches == 4
