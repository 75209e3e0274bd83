"""The compute seconds the search's lower bounds read (``Estimator.busy``) are the priced schedule's compute.

For a micro-batch of several sequences ``busy`` scales the one-sequence schedule's phases instead of building the
larger schedule; it must come to the same seconds as the schedule built for that micro-batch, with a GEMM
efficiency curve read at the scaled rows and the memory-bound passes' scaled bytes over the HBM bandwidth. A higher
figure would be a bound above the layout's true cost, and the search could prune the layout that wins.
"""
from __future__ import annotations

import pytest

from sp_plan.planner import Candidate, Estimator, Workload
from sp_plan.planner.params import Curve, Params
from sp_plan.planner.schedules import Compute
from sp_plan.profiles import load_cluster, load_model

PARAMS = Params(matmul=Curve(points=((1024, 0.3), (65536, 0.8))), hbm_bandwidth=2e12)
LAYOUTS = [Candidate("usp", ulysses=4, ring=2, order=("ulysses", "ring"), micro_batch_size=4),
           Candidate("ulysses", ulysses=8, order=("ulysses",), micro_batch_size=2)]


def _built(est: Estimator, part: str, c) -> float:
    return sum(est.compute_time(p) * st.repeat for st in est.schedule(part, c) for p in st.phases
               if isinstance(p, Compute))


@pytest.mark.parametrize("part", ["fwd-linear", "bwd-linear", "fwd", "bwd", "head"])
@pytest.mark.parametrize("cand", LAYOUTS, ids=lambda c: c.algorithm)
def test_busy_is_the_built_schedules_compute(cand, part):
    est = Estimator(load_cluster("dgx-h100", 1), load_model("llama3-8b"), Workload(seq_len=16384, batch=4),
                    params=PARAMS)
    c = est.shape(cand)
    assert c.mbs > 1
    assert est.busy(part, c) == pytest.approx(_built(est, part, c), rel=1e-9)
