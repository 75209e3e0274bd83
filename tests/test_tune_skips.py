"""What a tune leaves out for its time budget is said once, however many rounds ask for it again."""
from __future__ import annotations

from types import SimpleNamespace

from sp_plan.profiles.tune.steps import TuneRun


def test_a_confirm_asked_again_in_a_later_round_is_said_once():
    run = TuneRun(cluster=None, model=None, work=None, store=None, opts=SimpleNamespace(max_minutes=9),
                  tick=None, budget=SimpleNamespace(left=lambda: 30.0), rank=0)
    recorded = []
    run.record = lambda key, status, value: recorded.append(key)
    for _ in range(3):  # three confirm rounds
        run.skip("confirm:ring:1", "confirm of ring", 120.0)
    run.skip("confirm:usp:1", "confirm of usp", 90.0)
    assert [w.split(" skipped")[0] for w in run.skipped] == ["confirm of ring", "confirm of usp"]
    assert recorded.count("skip:confirm:ring:1") == 3  # the store still keeps every decision


def test_a_resume_says_what_the_earlier_run_spent_on_the_kernels_it_reuses():
    """A run stopped before its first candidate still reuses its kernel timings: the resume says what they cost;
    a run that timed its kernels itself says nothing of an earlier run."""
    from sp_plan.profiles.tune.steps import resumed_candidates

    cal = SimpleNamespace(by_name={}, pool=[])
    for reused, notes in ((["links", "kernels"], ["the earlier run spent 0:09 on what is reused; --max-minutes counts "
                                                  "from the resume"]), ([], [])):
        r = SimpleNamespace(steps={"kernels": ("ok", {"seconds": 9.0})}, measured={}, reused=list(reused), notes=[])
        resumed_candidates(r, cal)
        assert r.notes == notes and r.reused == reused
