"""The grid search in forked workers (``sp_plan.workers``, ``planner.partition``): the same rows, the same best of
each variant and the same plan file as one process, whatever becomes of a worker."""
import multiprocessing
import os
import subprocess
import sys
import time

import pytest

from sp_plan import workers
from sp_plan.pipeline import PlanRequest, resolve, search
from sp_plan.planner import Workload
from sp_plan.planner.partition import shares
from sp_plan.planner.search import Space
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.documents import load_documents

SP = [sys.executable, "-m", "sp_plan.cli.app"]
PLAN = ["plan", "--cluster", "dgx-h100", "--nodes", "4", "--model", "tiny-llama", "--seq-len", "32k", "--batch", "4",
        "--no-profile"]


def request(**workload) -> PlanRequest:
    """A plan request of 32 GPUs whose space holds 79 degrees choices (shares of 16 or more for up to 4 jobs)."""
    return PlanRequest(cluster="dgx-h100", nodes=4, model="tiny-llama", use_profile=False, families=True,
                       workload=Workload(seq_len="32k", batch=4, **workload))


def answer(req: PlanRequest, jobs: int) -> dict:
    """The response's rows and variant bests, as a client reads them (the priced count left out: shares price
    more, each pruned against its own K-th time)."""
    res = search(req, resolve(req, max_world=None), jobs=jobs)
    return res.model_dump(mode="json", exclude={"search": {"evaluated"}})


@pytest.mark.parametrize("workload", [
    {}, {"causal": False}, {"training": False}, {"window": 2048},
    {"documents": load_documents("megatron-dcp"), "seed": 3},
], ids=["causal", "full", "inference", "window", "documents"])
def test_forked_search_answers_as_one_process(workload):
    """Two and three shares give the same top rows, equivalents, best of each variant and winner as one process."""
    req = request(**workload)
    one = answer(req, 1)
    assert one["plans"] and one["families"]
    for jobs in (2, 3):
        assert answer(req, jobs) == one, jobs


def test_shares_hold_each_degrees_choice_once_and_whole_ring_degrees():
    """The shares cover the space's degrees choices, each in one share; a ring degree's choices are all in one share
    (they share its schedules), dealt so that the shares hold about as many choices each."""
    m, c = load_model("tiny-llama"), load_cluster("dgx-h100", 4)
    space = Space(c.world_size, m, Workload(seq_len="32k", batch=4))
    every = list(space.degrees())
    parts = [list(s.degrees()) for s in shares(space, 3)]
    assert sorted(map(repr, sum(parts, []))) == sorted(map(repr, every))
    rings = [{d.ring for d in p} for p in parts]
    assert all(not (a & b) for i, a in enumerate(rings) for b in rings[i + 1:])
    biggest = max(sum(1 for d in every if d.ring == r) for r in {d.ring for d in every})
    assert max(map(len, parts)) - min(map(len, parts)) <= biggest
    assert len(shares(space, 64)) == len({d.ring for d in every})


def test_jobs_shrink_to_shares_worth_a_fork():
    """A share holds at least MIN_SHARE degrees choices; one job, or a small space, searches in this process."""
    m = load_model("tiny-llama")
    big = Space(32, m, Workload(seq_len="32k", batch=4))
    n = sum(1 for _ in big.degrees())
    assert workers.grid_jobs(big, 1) == 1
    assert workers.grid_jobs(big, 64) == min(n // workers.MIN_SHARE, len({d.ring for d in big.degrees()}))
    assert workers.grid_jobs(Space(2, m, Workload(seq_len="32k")), 8) == 1
    assert 1 <= workers.auto_jobs() <= workers.MAX_JOBS


def _jobs_in_a_daemon(queue):
    queue.put(workers.grid_jobs(Space(32, load_model("tiny-llama"), Workload(seq_len="32k", batch=4)), 4))


def test_a_daemonic_process_searches_in_itself():
    """In a daemonic process (a pool's worker, say), which may not start children, the search stays in-process."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    p = ctx.Process(target=_jobs_in_a_daemon, args=(queue,), daemon=True)
    p.start()
    assert queue.get(timeout=60) == 1
    p.join(timeout=60)


def _dies(writer, fn, portable, chunk):
    os._exit(3)


def _hangs(writer, fn, portable, chunk):
    time.sleep(60)


@pytest.mark.parametrize("fate", [_dies, _hangs], ids=["dies", "hangs"])
def test_a_lost_worker_costs_time_not_the_result(monkeypatch, fate):
    """A worker that dies, or is not done in time, has its share searched in the parent: the same answer."""
    req = request()
    one = answer(req, 1)
    monkeypatch.setattr(workers, "_work", fate)
    monkeypatch.setattr(workers, "WAIT_FACTOR", 0.0)
    monkeypatch.setattr(workers, "WAIT_EXTRA_S", 0.5)
    assert answer(req, 2) == one


def test_cli_jobs_write_the_same_plan_file(tmp_path):
    """`sp-plan plan --jobs 3` writes the plan `--jobs 1` writes, byte for byte; `--jobs 0` is one line, exit 2."""
    outs = []
    for jobs in ("1", "3"):
        out = tmp_path / f"plan{jobs}.yaml"
        r = subprocess.run([*SP, *PLAN, "--jobs", jobs, "-o", str(out)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    r = subprocess.run([*SP, *PLAN, "--jobs", "0"], capture_output=True, text=True, timeout=120)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "--jobs" in lines[0], r.stderr


def test_forked_map_keeps_the_items_order_and_this_process_results_whole():
    """Items dealt in turn to this process and the workers come back in their order; this process's own results are
    not passed through ``portable`` (the grid keeps its share's estimator), the workers' are."""
    got = workers.forked_map(lambda x: (x * x, os.getpid()), list(range(7)), 3, portable=lambda r: (r[0], "sent"))
    assert [sq for sq, _ in got] == [x * x for x in range(7)]
    assert [who == os.getpid() for _, who in got] == [k % 3 == 0 for k in range(7)]


def test_forked_sensitivity_is_the_sensitivity():
    """`plan --sensitivity`'s re-rankings in three processes: the same scenarios, winners and losses."""
    from sp_plan.planner.search import finish, grid_search
    from sp_plan.planner.sensitivity import sensitivity

    c, m, w = load_cluster("dgx-h100", 4), load_model("tiny-llama"), Workload(seq_len="32k", batch=4)
    win = finish(grid_search(c, m, w, keep=1), c, m, w, 1)[0]
    one = sensitivity(c, m, w, win)
    assert len(one.scenarios) >= 3
    assert sensitivity(c, m, w, win, each=workers.rerankings(3)) == one


def test_shares_read_the_variants_their_space_listed(monkeypatch):
    """A share reads the variants its space made for a tensor and sequence split (the partition's variant keys list
    them all before the fork) and makes none again; the variants of two degrees choices that differ in dp and pp alone
    are made once; each caller gets its own list, equal to ``algorithms.variants``'s."""
    from sp_plan.planner import algorithms, search as search_module

    m = load_model("tiny-llama")
    space = Space(32, m, Workload(seq_len="32k", batch=4))
    made = []
    monkeypatch.setattr(search_module, "variants", lambda d, *a: made.append(d) or algorithms.variants(d, *a))
    split = (1, 1, 16)  # wallfacer's and tokenring's teams
    d, twin = [e for e in space.degrees() if (e.tp, e.ulysses, e.ring) == split][:2]
    first = space.variants(d)
    assert first == algorithms.variants(d, m, space.work) and len(made) == 1
    first.clear()
    share = next(s for s in shares(space, 2) if d.ring in s.rings)
    assert share.variants(d) == share.variants(twin) == algorithms.variants(twin, m, space.work) and len(made) == 1


def test_shared_floats_carry_a_forked_workers_writes():
    """A share's published times reach the parent: what a forked process writes into ``shared_floats`` the parent
    reads, and the values start as given."""
    buf = workers.shared_floats([float("inf"), 1.5, 2.0])
    assert list(buf) == [float("inf"), 1.5, 2.0]
    pid = os.fork()
    if pid == 0:
        buf[0] = 3.25
        os._exit(0)
    os.waitpid(pid, 0)
    assert list(buf) == [3.25, 1.5, 2.0]


def test_shares_predict_the_layouts_the_finishing_asks_for():
    """With ``ahead``, the merged result carries a prediction of every variant's best and of the top rows' layouts,
    made in the share that ranked it and equal to the merged estimator's own; finishing uses each once."""
    from sp_plan.planner.search import best_per_variant, by_policy, finish_each

    req = request()
    inputs = resolve(req, max_world=None)
    c, m, w = inputs.cluster, inputs.model, inputs.workload
    res = workers.forked_grid_search(c, m, w, None, 2, keep=5, params=inputs.params, distinct=True, ahead=True)
    bests = [cand for _, cand in best_per_variant(res.ranked, by_policy(w))]
    assert len(bests) > 1 and set(bests) <= set(res.predicted)
    assert {cand for _, cand in res.ranked[:5]} <= set(res.predicted)
    assert all(res.predicted[cand] == res.estimator.predict(cand) for cand in bests)
    plans = finish_each(res, c, m, w)
    assert [p.predicted for p in plans] == [res.estimator.predict(cand) for cand in bests]
    assert not set(bests) & set(res.predicted)  # each used once
    plain = workers.forked_grid_search(c, m, w, None, 2, keep=5, params=inputs.params, distinct=True)
    assert plain.predicted == {}


def test_a_share_predicts_no_variant_another_share_beat():
    """``predict_ahead`` skips a variant whose best another share already beat (the exchange holds a faster time of
    it), and keeps one whose time ties after the merged ranking's rounding."""
    from sp_plan.planner.exchange import Exchange
    from sp_plan.planner.partition import variant_key_list
    from sp_plan.planner.search import Space, best_per_variant, by_policy, grid_search, predict_ahead, variant_key

    req = request()
    inputs = resolve(req, max_world=None)
    c, m, w = inputs.cluster, inputs.model, inputs.workload
    res = grid_search(c, m, w, keep=5, params=inputs.params, distinct=True)
    bests = best_per_variant(res.ranked, by_policy(w))
    keys = variant_key_list(Space(c.world_size, m, w))
    values = [float("inf")] * (len(keys) + 1)
    ex = Exchange(keys, values)
    (t0, first), (t1, second) = bests[0], bests[1]
    values[ex.slots[variant_key(first)]] = t0 * (1 + 1e-14)  # a tie to 12 digits: kept
    values[ex.slots[variant_key(second)]] = t1 * 0.5  # beaten
    got = predict_ahead(res, w, None, ex)
    assert first in got and second not in got
    assert set(got) == {cand for _, cand in bests} - {second}
