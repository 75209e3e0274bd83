"""A plan's global batch must split into whole micro-batches on every data-parallel replica.

Each of the dp replicas takes batch / dp sequences and runs them as micro-batches of ``micro_batch_size``; the
estimator refuses a plan where dp x micro_batch_size does not divide the global batch (naming ``degrees.dp``),
even when dp alone does, and accepts one where it does.
"""
from __future__ import annotations

import pytest

from sp_plan.planner import Candidate, Estimator, PlanError, Workload
from sp_plan.profiles import load_cluster, load_model


def estimator(batch):
    return Estimator(load_cluster("dgx-h100", 1), load_model("llama3-8b"), Workload(seq_len=8192, batch=batch))


def candidate(dp, mbs):
    return Candidate("usp", dp=dp, ulysses=8 // dp, micro_batch_size=mbs, order=("ulysses", "dp"))


@pytest.mark.parametrize("batch, dp, mbs", [(8, 2, 3), (12, 4, 2), (6, 1, 4)])
def test_dp_divides_the_batch_but_not_into_whole_micro_batches(batch, dp, mbs):
    assert batch % dp == 0 and batch % (dp * mbs) != 0
    with pytest.raises(PlanError, match=f"degrees.dp: dp {dp} x micro_batch_size {mbs} does not divide the global "
                                        f"batch {batch}"):
        estimator(batch).check(candidate(dp, mbs))


@pytest.mark.parametrize("batch, dp, mbs", [(8, 2, 2), (12, 4, 3), (6, 1, 6)])
def test_whole_micro_batches_on_every_replica_are_accepted(batch, dp, mbs):
    estimator(batch).check(candidate(dp, mbs))
