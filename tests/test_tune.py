"""`sp-plan tune` end to end on 4 CPU ranks: the command as a user runs it, faults, a SIGKILL and resume, bad input.

Every world here is a real one: torchrun's variables on 4 processes (benchmarks/harness/netns.py ``start``), or
the shared gloo helper (benchmarks/harness/worlds.py) for the in-process fault test. A world's time limit (900 s)
only catches a hang: a 2-core host shared with other work runs these tunes several times slower than a quiet one.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time


from sp_plan.planner.model import Workload
from sp_plan.planner.plan import Plan
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.store import Store
from sp_plan.profiles.tune.readings import fits_of, kept
from harness import netns
from harness.worlds import run_world

TUNE = ["-m", "sp_plan.cli.app", "tune", "--cluster", "cpu-local", "--model", "tiny-llama", "--seq-len", "256",
        "--link-sizes", "16K,64K", "--iters", "2", "--candidate-timeout", "120", "--confirm", "0", "--reread", "0"]


def _cli(*args, cwd=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sp_plan.cli.app", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout)


def _ok(res) -> str:
    for rank, (code, out) in enumerate(res):
        assert code == 0, f"rank {rank} exited {code}:\n{out[-4000:]}"
    return res[0][1]


def test_tune_then_plan_uses_the_profile(tmp_path):
    store = f"sqlite:///{tmp_path / 'store.db'}"
    out = _ok(netns.launch([*TUNE, "--budget", "2", "--store", store, "-o", "plan.yaml"], 4, 4, tmp_path, timeout=900))
    assert "measured candidates" in out and "leave-one-out step-time error" in out and "stored profile" in out
    # into a file (not a terminal): plain progress lines, each step's start and end at least
    for step in ("links", "kernels", "rounds", "candidates"):
        assert f"[tune] {step} 0/" in out and re.search(rf"^\[tune\] {step} (\d+)/\1 elapsed ", out, re.M), step
    assert "[tune] candidates 2/2 elapsed " in out and "spent " in out and "of --max-minutes 30" in out
    # two candidates: what the fit left at its base value is said, and why
    assert "\ncompute efficiency and layer overhead not fitted: needs 3 candidates" in out
    # the round overhead is the probe's (measured, held), not fitted; the kernels timed together on CPU ranks
    flat = " ".join(out.split())
    assert "per attention call, measured (Ring over every rank" in flat and "round overhead not fitted" not in flat
    assert "kernels timed by every rank at once" in flat
    (prof,) = Store(store).list_profiles()
    # the stored overhead is the one the probe gave (0 where the links and kernels alone price the probe at or above
    # the measurement: it depends on this machine's noise), held through the fit
    ro = prof.params.round_overhead_s
    assert prof.measurements["rounds_s"] > 0 and ro >= 0
    assert f"round overhead {ro * 1e3:.2f} ms per attention call, measured" in flat
    assert (ro == 0) == ("alone price the probe at or above that" in flat)
    assert len(prof.candidates) == 2 and all(c.status == "ok" for c in prof.candidates)
    for c in prof.candidates:  # the table's columns: predicted before and after, measured; time and memory
        assert c.measured_s > 0 and c.measured_memory > 0 and c.predicted_before_s > 0 and c.predicted_after_s > 0
    assert prof.params.attention_fwd is not None and prof.params.matmul is not None and prof.params.comm
    assert prof.id in out and prof.loo_error_after is not None
    best = Plan.load(tmp_path / "plan.yaml")
    assert best.measured.step_time_s == min(c.measured_s for c in prof.candidates)
    assert best.measured.profile == prof.id == best.profile and best.predicted.step_time_s > 0

    # a fresh `sp-plan plan` on the same cluster says it uses the profile; --no-profile does not
    args = ["plan", "--cluster", "cpu-local", "--model", "tiny-llama", "--seq-len", "256", "--store", store]
    used = _cli(*args)
    assert used.returncode == 0, used.stderr
    assert f"using profile {prof.id}" in used.stdout
    plain = _cli(*args, "--no-profile")
    assert plain.returncode == 0 and "using profile" not in plain.stdout and "--no-profile" in plain.stdout

    # the exported profile, carried to a laptop with its own (empty) store, plans there as on the cluster
    exp = _cli("profile", "export", prof.id, "-o", str(tmp_path / "p.yaml"), "--store", store)
    assert exp.returncode == 0, exp.stderr
    laptop = _cli("plan", *args[1:-1], f"sqlite:///{tmp_path / 'laptop.db'}", "--profile", str(tmp_path / "p.yaml"))
    assert laptop.returncode == 0, laptop.stderr
    assert laptop.stdout.splitlines()[2:] == used.stdout.splitlines()[2:] and prof.id in laptop.stdout


def _tune_rank(rank, world, url, faults, budget, timeout, surprise=None, readings=None, **more):
    from sp_plan.profiles.tune import measure, readings as chosen
    from sp_plan.profiles.tune.run import TuneOptions, tune

    if surprise is not None:  # the reread step's choice, fixed: the surprise-th candidate measured
        chosen.surprises = lambda result, measured, most, settings=None: [measured[surprise].summary]
    if readings is not None:  # each reading's step seconds, scripted: (i-th layout measured, its k-th reading)
        real, order, seen = measure.run_candidate, [], {}

        def scripted(plan, *a, **k):
            name = plan.summary()
            order.append(name) if name not in order else None
            seen[name] = seen.get(name, 0) + 1
            mc = real(plan, *a, **k)
            fit = {**mc.detail["fit"], "fwd_bwd_s": {**mc.detail["fit"]["fwd_bwd_s"], "clamped": False, "per_layer": 1.0}}
            return mc.model_copy(update={"measured_s": readings(order.index(name), seen[name]),
                                         "detail": {**mc.detail, "fit": fit}})  # every reading's stacks sound
        measure.run_candidate = scripted

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      GROUP_RANK="0")  # what torchrun would set: the link step reads it
    cluster, model = load_cluster("cpu-local"), load_model("tiny-llama")
    work = Workload(seq_len=256, batch=1)
    opts = TuneOptions(budget=budget, candidate_timeout=timeout, iters=2, faults=faults, **{"link_sizes": [16384], **more})
    rep = tune(cluster, model, work, Store(url) if rank == 0 else None, opts)
    return [(c.summary, c.status, c.reason, c.rank) for c in rep.profile.candidates], rep.profile.id


def test_contenders_for_the_best_are_read_again_and_kept_at_their_fastest_reading(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    out = run_world(_tune_rank, 4, url, {}, 2, 120.0, confirm=2, confirm_within=1e9, reread=0, timeout=900)
    cands, pid = out[0]
    assert all(o == out[0] for o in out) and [s for _, s, _, _ in cands] == ["ok", "ok"]
    prof = Store(url).get_profile(pid)
    steps = _steps(url)
    for c in prof.candidates:  # both contend (any runner-up is "within" 1e9): two readings more each
        first = steps[f"candidate:{c.summary}"][1]["measured_s"]
        again = [steps[f"confirm:{c.summary}:{k}"] for k in range(2)]
        assert all(a[0] == "ok" for a in again)
        assert c.detail["readings_s"] == [first] + [a[1]["measured_s"] for a in again]
        assert c.measured_s == min(kept(c.detail["readings_s"], fits_of(c)))  # the sound ones' fastest
    # read in rounds: both contenders' second readings before either's third
    confirms = [k.split(":")[-1] for k in steps if k.startswith("confirm:")]
    assert confirms == ["0", "0", "1", "1"], list(steps)
    assert min(c.measured_s for c in prof.candidates) > 0


def _surprise_readings(i: int, k: int) -> float:
    """The second layout measured reads 3 s (a slow spell), then 1.2 s; every other reading 1 s + 0.1 s a layout."""
    return {(1, 1): 3.0, (1, 2): 1.2}.get((i, k), 1.0 + 0.1 * i)


def test_a_surprise_is_read_again_checkpointed_and_kept_at_its_faster_reading(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    # the second candidate is the surprise (which candidates are: tests/test_tune_surprises.py,
    # tests/test_calibration.py); its readings are scripted, so nothing here depends on the host's speed
    out = run_world(_tune_rank, 4, url, {}, 3, 120.0, 1, _surprise_readings, confirm=0,
                    link_sizes=[16384, 1 << 20], timeout=900)
    cands, pid = out[0]
    assert all(o == out[0] for o in out) and [s for _, s, _, _ in cands] == ["ok"] * 3
    prof, steps = Store(url).get_profile(pid), _steps(url)
    slow = prof.candidates[1]
    assert steps[f"candidate:{slow.summary}"][1]["measured_s"] == 3.0
    status, again = steps[f"reread:{slow.summary}"]
    assert status == "ok" and again["measured_s"] == 1.2
    assert slow.detail["readings_s"] == [3.0, 1.2] and slow.measured_s == min(kept([3.0, 1.2], fits_of(slow)))
    reread = {k.split(":", 1)[1] for k in steps if k.startswith("reread:")}
    assert reread == {slow.summary}
    for c in prof.candidates:  # each kept at its faster reading; the others as read once
        first = steps[f"candidate:{c.summary}"][1]["measured_s"]
        readings = [first, steps[f"reread:{c.summary}"][1]["measured_s"]] if c.summary in reread else None
        assert c.detail.get("readings_s") == readings and c.measured_s == min(kept(readings or [first], fits_of(c)))


def test_failing_candidates_are_recorded_and_the_tune_goes_on(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    # the raise and the out-of-memory on every rank at once (which rank a one-rank fault is pinned on, and that its
    # peers wait for it, is tests/test_tune_measure.py's): no peer waits out a collective timeout for them
    faults = {"#0": "raise@all", "#1": "oom@all", "#2": "hang@3"}
    # the hung candidate's timeout: long enough that a loaded host's child worlds start and report within it (at a
    # load of 25 every candidate of this tune timed out at 15 s; a child no longer imports torch._dynamo itself),
    # short enough that the hang costs well under a minute
    out = run_world(_tune_rank, 4, url, faults, 4, 40.0, confirm=0, reread=0, timeout=900)
    cands, pid = out[0]
    assert all(o == out[0] for o in out), "every rank returns the same profile"
    statuses = [(s, r) for _, s, _, r in cands]
    assert [s for s, _ in statuses[:2]] == ["error", "oom"] and None not in [r for _, r in statuses[:2]], cands
    assert statuses[2][0] == "timeout" and statuses[2][1] is not None, cands  # every rank waits on the hung one
    assert "injected" in cands[0][2] and cands[3][1] == "ok"
    prof = Store(url).get_profile(pid)
    assert [c.status for c in prof.candidates] == ["error", "oom", "timeout", "ok"]


def _steps(url: str) -> dict:
    st = Store(url)
    runs = st.runs()
    return st.steps(runs[0]["id"]) if runs else {}


def test_a_killed_tune_resumes_and_loses_at_most_the_candidate_in_flight(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    procs = netns.start([*TUNE, "--budget", "2", "--store", url], 4, 4, tmp_path)
    done: dict = {}
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not done:
            time.sleep(0.5)
            done = {k: v for k, v in _steps(url).items() if k.startswith("candidate:") and v[0] == "ok"}
            assert all(p.poll() is None for p in procs), "the tune ended before it could be killed"
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert done, "no candidate was measured in time"
    out = _ok(netns.launch([*TUNE, "--budget", "2", "--store", url], 4, 4, tmp_path, timeout=900))
    assert "resumed run" in out and "candidate(s)" in out.split("resumed run")[1].splitlines()[0]
    (prof,) = Store(url).list_profiles()
    assert len(prof.candidates) == 2
    kept = {c.summary: c for c in prof.candidates}
    for _, (_, payload) in done.items():  # measured before the kill: kept, not measured again (its first reading)
        c = kept[payload["summary"]]
        assert c.detail.get("readings_s", [c.measured_s])[0] == payload["measured_s"]


def test_world_that_does_not_match_the_cluster_exits_2(tmp_path):
    res = netns.launch([*TUNE, "--budget", "1", "--store", f"sqlite:///{tmp_path / 's.db'}"], 2, 2, tmp_path,
                       timeout=120)
    assert all(code == 2 for code, _ in res), res
    lines = [l for l in res[0][1].splitlines() if l.strip()]
    assert len(lines) == 1 and "--cluster" in lines[0] and "4 devices" in lines[0] and "Traceback" not in res[0][1]
    assert not (tmp_path / "s.db").exists(), "a refused tune created its store"


def test_bad_store_exits_2(tmp_path):
    """Every rank of a matching world exits 2 with one line naming --store (an unreachable server's own wording:
    tests/test_store.py)."""
    res = netns.launch([*TUNE, "--budget", "1", "--store", "nosuch://x"], 4, 4, tmp_path, timeout=120)
    assert all(code == 2 for code, _ in res), res
    lines = [l for l in res[0][1].splitlines() if l.strip()]
    assert len(lines) == 1 and "--store" in lines[0] and "Traceback" not in res[0][1], res[0][1]


def test_bad_budget_exits_2(tmp_path):
    """Flags out of their declared ranges or choices: exit 2 with one line naming the flag and what it takes,
    answered before torch loads."""
    tune = ["tune", "--cluster", "cpu-local", "--model", "tiny-llama", "--seq-len", "512"]
    for extra, flag, says in ((["--budget", "0"], "--budget", ("1",)), (["--confirm", "-1"], "--confirm", ("0",)),
                              (["--reread", "-2"], "--reread", ("0",)),
                              (["--kernel-timing", "both"], "--kernel-timing", ("auto", "each", "shared"))):
        p = _cli(*tune, *extra, cwd=tmp_path)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
        assert lines[0].startswith("error: ") and f"'{flag}'" in lines[0] and all(w in lines[0] for w in says), lines
    line = "import sys; from sp_plan.cli.app import run_line; c = run_line(sys.argv[1:]); print(sorted(" \
           "{'torch', 'numpy'} & set(sys.modules))); sys.exit(c)"
    p = subprocess.run([sys.executable, "-c", line, *tune, "--budget", "0"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    assert p.returncode == 2 and p.stdout.strip() == "[]", (p.stdout, p.stderr)


def test_corrupted_profile_file_exits_2(tmp_path):
    bad = tmp_path / "profile.yaml"
    bad.write_text("cluster_fingerprint: [unclosed\n  params: 3")
    p = _cli("plan", "--cluster", "cpu-local", "--model", "tiny-llama", "--seq-len", "512", "--profile", str(bad))
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def _flags_per_rank(rank, world, lengths):
    import torch.distributed as dist

    from sp_plan.cli.tune import check_same_flags
    from sp_plan.planner.errors import PlanError
    from sp_plan.profiles.tune.run import TuneOptions

    c, m = load_cluster("cpu-local"), load_model("tiny-gpt")
    try:
        check_same_flags(c, m, Workload(seq_len=lengths[rank]), TuneOptions(budget=1), dist)
    except PlanError as e:
        return e.field, e.problem
    return None


def test_ranks_started_with_different_flags_are_refused_before_measuring():
    """One all_gather of the flags: ranks of one tune agree, and a rank given another --seq-len is named at once
    (each would time its own shapes into one store, then fail at a collective)."""
    assert run_world(_flags_per_rank, 2, [1024, 1024], timeout=60) == [None, None]
    res = run_world(_flags_per_rank, 2, [1024, 2048], timeout=60)
    assert res[0] == res[1] == ("--seq-len", "rank 1 was started with another --seq-len than rank 0"), res
