"""One BackendChoice keeps a separate decision per dtype: after choosing for float32 blocks, float64 blocks of the
same shape still get a backend that runs float64 (math), not the float32 decision."""
import torch

from sp_plan.runtime import choice as C


def test_float64_after_float32_gets_its_own_decision(monkeypatch):
    monkeypatch.setattr(C, "time_backend", lambda name, *a, **kw: {"cpu_flash": 1.0, "math": 2.0}[name])
    choice = C.BackendChoice()
    q = torch.randn(1, 32, 2, 8)
    assert choice.choose(q, q, True) == "cpu_flash"
    assert choice.choose(q.double(), q.double(), True) == "math"
    assert len(choice.decisions) == 2
