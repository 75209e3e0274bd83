"""Under documents or a window the ring's rounds follow the mask, and the diagonal round (the first, each rank's own
K, V) is the one that runs under the causal mask; zigzag's later rounds are dense blocks, striped's every round a
shifted diagonal. A calibrated masked-kernel curve is read for exactly those blocks."""
from __future__ import annotations

import pytest

from sp_plan.planner import Estimator, Plan, Workload
from sp_plan.planner.candidate import Candidate
from sp_plan.planner.schedules import attention_steps
from sp_plan.profiles import load_cluster, load_model


def _masked_flags(layout: str, **mask) -> list[bool]:
    est = Estimator(load_cluster("dgx-h100"), load_model("llama3-8b"),
                    Workload(seq_len=65536, causal=True, training=False, **mask))
    c = est.shape(Candidate.from_plan(Plan(algorithm="ring", degrees={"ring": 8}, token_layout=layout)))
    return [p.masked for st in attention_steps(c, False) for p in st.phases if getattr(p, "kind", "") == "attention"
            for _ in range(st.repeat)]


@pytest.mark.parametrize("mask", [{"window": 8192}, {"window": 30000}])
def test_only_the_diagonal_round_is_masked_for_zigzag(mask):
    flags = _masked_flags("zigzag", **mask)
    assert flags[0] and not any(flags[1:])


@pytest.mark.parametrize("mask", [{"window": 8192}, {"window": 30000}])
def test_every_striped_round_is_a_shifted_diagonal(mask):
    assert all(_masked_flags("striped", **mask))
