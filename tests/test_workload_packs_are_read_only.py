"""A workload's packs are drawn once and shared by every layout a search prices, so they come back read-only: a
caller that writes into one gets an error instead of silently changing the packs every later search reads."""
import numpy as np
import pytest

from sp_plan.planner.documents import workload_packs
from sp_plan.planner.model import Workload


@pytest.mark.parametrize("fields", [{}, {"documents": [100, 300, 50], "seed": 3}])
def test_the_packs_cannot_be_written_and_stay_as_drawn(fields):
    w = Workload(seq_len=1024, batch=2, **fields)
    packs = workload_packs(w, 2)
    before = [p.copy() for p in packs]
    for p in packs:
        assert not p.flags.writeable
        with pytest.raises(ValueError):
            p[-1] = 7
    assert all(np.array_equal(a, b) for a, b in zip(workload_packs(w, 2), before))
