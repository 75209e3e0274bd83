"""A prediction's breakdown accounts for its whole step: the phases' exposed seconds add up to the step time.

Compute rows are exposed whole; an overlapped step's communication only for what outlasts its compute (under
partial overlap too); the fixed per-layer and TP overheads once per layer and micro-batch; the pipeline bubble as
1F1B or interleaved 1F1B leaves it; the gradient sync for what its layer passes do not hide. Checked over data,
sequence, tensor and pipeline parallel layouts, even and uneven stages (interleaved too), ZeRO 0-3 and checkpointing, with the bare
engine and with calibrated terms.
"""
from __future__ import annotations

import pytest

from sp_plan.planner import Candidate, Estimator, Workload
from sp_plan.planner.params import Params
from sp_plan.profiles import load_cluster, load_model

CALIBRATED = Params(hbm_bandwidth=2e12, round_overhead_s=5e-5, layer_overhead_s=1e-3, tp_overhead_s=1e-4,
                    overlap=0.8)
LAYOUTS = [
    Candidate("usp", dp=2, ulysses=4, ring=2, order=("ulysses", "ring", "dp"), micro_batch_size=2),
    Candidate("usp", pp=2, tp=2, ulysses=2, ring=2, order=("tp", "ulysses", "ring", "pp"), zero_stage=1,
              checkpointing="full", virtual_stages=2),
    Candidate("ring", pp=2, ring=8, order=("ring", "pp"), token_layout="zigzag", zero_stage=3, stage_layers=(17, 15)),
    Candidate("ring", pp=2, ring=8, order=("ring", "pp"), token_layout="zigzag", zero_stage=2, stage_layers=(14, 18)),
    Candidate("ring", pp=2, ring=8, order=("ring", "pp"), token_layout="zigzag", stage_layers=(18, 14), virtual_stages=2),
    # the last stage, a layer short of the largest middle one, is the busiest with the LM head
    Candidate("ring", pp=4, ring=4, order=("ring", "pp"), token_layout="zigzag", stage_layers=(8, 9, 7, 8)),
]


@pytest.fixture(scope="module")
def inputs():
    return load_cluster("dgx-h100", 2), load_model("llama3-8b"), Workload(seq_len=32768, batch=8)


@pytest.mark.parametrize("params", [Params(), CALIBRATED], ids=["bare", "calibrated"])
@pytest.mark.parametrize("cand", LAYOUTS, ids=lambda c: f"{c.algorithm}-pp{c.pp}-zero{c.zero_stage}")
def test_exposed_seconds_add_up_to_the_step(inputs, cand, params):
    cluster, model, work = inputs
    p = Estimator(cluster, model, work, params=params).predict(cand)
    assert sum(r.exposed_seconds for r in p.breakdown) == pytest.approx(p.step_time_s, rel=1e-9)
    assert all(0 <= r.exposed_seconds <= r.seconds * (1 + 1e-12) for r in p.breakdown)
