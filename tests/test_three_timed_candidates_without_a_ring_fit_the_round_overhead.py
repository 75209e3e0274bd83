"""From three timed candidates (MIN_FOR_COMPUTE) the fit tells the round overhead apart from the compute efficiency
even where no candidate runs a ring: both are fitted and named, and no note says the round overhead was left to the
compute efficiency for want of a ring."""
import pytest

from sp_plan.planner import Candidate, Estimator, Workload
from sp_plan.planner.calibration import MIN_FOR_COMPUTE, fit
from sp_plan.planner.params import Params
from sp_plan.planner.profile import MeasuredCandidate
from sp_plan.profiles import load_cluster, load_model

CANDS = [Candidate("ulysses", ulysses=8, order=("ulysses",)),
         Candidate("ulysses", ulysses=8, order=("ulysses",), checkpointing="full"),
         Candidate("ulysses", ulysses=4, dp=2, order=("ulysses", "dp"))]


def test_round_overhead_is_fitted_from_three_candidates_without_a_ring():
    assert len(CANDS) == MIN_FOR_COMPUTE
    cl, m, w = load_cluster("dgx-h100", 1), load_model("gpt-3b"), Workload(seq_len=32768, batch=2)
    truth = Params(round_overhead_s=2e-3, compute_efficiency=0.8)
    est = Estimator(cl, m, w, params=truth)
    meas = []
    for c in CANDS:
        p = c.to_plan(model=m, workload=w)
        meas.append(MeasuredCandidate(summary=p.summary(), plan=p.model_dump(mode="json"),
                                      measured_s=est.evaluate(c).step_time_s))
    r = fit(cl, Params(), meas)
    assert any(f.startswith("round overhead") for f in r.fitted)
    assert any(f.startswith("compute efficiency") for f in r.fitted)
    assert not any(n.startswith("round overhead not fitted") for n in r.notes)
    for mc, (t, _) in zip(meas, r.predicted_after):
        assert t == pytest.approx(mc.measured_s, rel=1e-3)
