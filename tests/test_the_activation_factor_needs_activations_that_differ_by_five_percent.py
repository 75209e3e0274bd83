"""The activation factor is fitted only from peaks whose activations differ by more than 5 %: with two candidates
whose activations are 2 % apart the factor cannot be told from the overhead (small noise on the peaks would throw it
anywhere in its bounds), so it keeps the base's value, the overhead alone is fitted, and a note says why."""
from types import SimpleNamespace

import numpy as np
import pytest

from sp_plan.planner.calibration import _fit_memory
from sp_plan.planner.params import Params

GIB = 2.0 ** 30


class _Parts:
    """A pricer whose candidates hold ``rest`` bytes besides ``act`` bytes of activations."""

    def __init__(self, rest, act):
        self.parts = (np.array(rest, dtype=float), np.array(act, dtype=float))

    def memory_parts(self, base, cases):
        return self.parts


def test_activations_two_percent_apart_fit_the_overhead_only():
    rest, act = [4 * GIB, 4 * GIB], [10 * GIB, 10.2 * GIB]
    peaks = [4 * GIB + 10 * GIB + GIB, 1.01 * (4 * GIB + 10.2 * GIB + GIB)]  # 1 % noise on the second peak
    p, words, notes = _fit_memory(_Parts(rest, act), Params(), [SimpleNamespace(memory=m) for m in peaks])
    assert p.activation_factor == 1.0
    assert words == [f"memory overhead {p.memory_overhead_bytes / GIB:.2f} GiB (from 2 candidates)"]
    assert notes and notes[0].startswith("activation factor not fitted")
    assert p.memory_overhead_bytes == pytest.approx(1.07 * GIB, rel=0.05)
