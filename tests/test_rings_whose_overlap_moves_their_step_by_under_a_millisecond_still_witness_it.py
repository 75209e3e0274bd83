"""A fitted time parameter that several timed candidates move is identified by a fit without any one of them, so each
keeps its leave-one-out time. Whether a candidate moves a parameter is judged relative to its own step: two short
rings on cpu-local (512 tokens, steps of about 0.1 s) both move with the overlap, one by 2.8 ms and one by only 0.8 ms,
and neither is taken for the overlap's only witness."""
from sp_plan.planner import Candidate, Estimator, ModelSpec, Workload
from sp_plan.planner.calibration import fit
from sp_plan.planner.params import Params
from sp_plan.planner.profile import MeasuredCandidate
from sp_plan.profiles import load_cluster


def test_two_short_rings_both_keep_their_leave_one_out_times():
    cl = load_cluster("cpu-local", 1)
    m = ModelSpec(name="t", layers=2, hidden=256, heads=4, ffn_hidden=1024, vocab=1024, dtype="fp32")
    w = Workload(seq_len=512, batch=2)
    cands = [Candidate("ring", ring=4, order=("ring",), token_layout="zigzag"),
             Candidate("ring", ring=2, dp=2, order=("ring", "dp"), token_layout="zigzag")]
    est = Estimator(cl, m, w, params=Params(overlap=0.6))
    moved = [Estimator(cl, m, w, params=Params(overlap=0.0)).evaluate(c).step_time_s -
             Estimator(cl, m, w, params=Params(overlap=1.0)).evaluate(c).step_time_s for c in cands]
    assert all(d > 0 for d in moved) and min(moved) < 1e-3  # both move; one by under a millisecond
    meas = []
    for c in cands:
        p = c.to_plan(model=m, workload=w)
        meas.append(MeasuredCandidate(summary=p.summary(), plan=p.model_dump(mode="json"),
                                      measured_s=est.evaluate(c).step_time_s))
    r = fit(cl, Params(), meas)
    assert all(t is not None and t > 0 for t in r.loo_times)
