"""``usp.masked_rounds`` on ``masks.round_arrays``: the same floats as the rounds' tuples of ``ring_round_pairs``
averaged over the layers' windows one Python float at a time."""

import numpy as np
import pytest

from sp_plan.planner import masks
from sp_plan.profiles.documents import load_documents
from sp_plan.planner.model import Workload
from sp_plan.planner.usp import masked_rounds, round_runs


def _scalar_rounds(work, token_layout, ring, layers):
    """(busiest, mean, sends, pooled) per round from ``ring_round_pairs``' tuples, a scalar loop over rounds."""
    mix = masks.layer_windows(work, layers)
    total = sum(n for _, n in mix)
    busiest, mean, sends = [0.0] * ring, [0.0] * ring, [0.0] * ring
    for w, n in mix:
        rr = masks.ring_round_pairs(work, token_layout, ring, w)
        filled = [i for i, e in enumerate(rr.empty) if e < 1.0]
        last = filled[-1] if filled else 0
        for i in range(ring):
            busiest[i] += n * rr.busiest[i] / total
            mean[i] += n * rr.mean[i] / total
            sends[i] += n / total if i < last else 0.0
    pooled = sum(mean) / sum(busiest) if sum(busiest) else 1.0
    return tuple(busiest), tuple(mean), tuple(sends), pooled


@pytest.mark.parametrize("token_layout", ["contiguous", "zigzag", "striped", "balanced"])
@pytest.mark.parametrize("window", [None, {"size": 700}, {"size": 700, "pattern": "5:1"}])
def test_masked_rounds_match_the_scalar_average_of_the_round_tuples(token_layout, window):
    docs = load_documents("magi-long")
    for ring in (1, 4, 64):
        work = Workload(seq_len=32768, documents=docs, window=window)
        masked_rounds.cache_clear()
        mr = masked_rounds(work, token_layout, ring, 12)
        busiest, mean, sends, pooled = _scalar_rounds(work, token_layout, ring, 12)
        assert (mr.busiest, mr.mean, mr.sends, mr.pooled) == (busiest, mean, sends, pooled)
        assert all(type(v) is float for v in mr.busiest + mr.mean + mr.sends)
        assert mr.runs == round_runs(np.array(busiest), np.array(sends))


def test_round_arrays_are_the_round_tuples_and_read_only():
    work = Workload(seq_len=32768, documents=load_documents("magi-short"), window={"size": 1000})
    arrays = masks.round_arrays(work, "zigzag", 16, 1000)
    rr = masks.ring_round_pairs(work, "zigzag", 16, 1000)
    assert tuple(tuple(x.tolist()) for x in arrays) == (rr.busiest, rr.mean, rr.empty)
    assert not any(x.flags.writeable for x in arrays)
    assert masks.round_arrays(work, "zigzag", 16, 1000)[0].sum() > 0  # a windowed ring still has work
