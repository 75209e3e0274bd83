"""Candidates are timed on a block of the key's bucket length (the next power of two, at least 16), capped at
max_block (default 1024 tokens on CPU)."""
import torch

from sp_plan.runtime import choice as C


def _timed_lengths(monkeypatch, n, **kw):
    lengths = []

    def fake(name, device, dtype, head_dim, heads, kv_heads, causal, n, repeats):
        lengths.append(n)
        return {"cpu_flash": 1.0, "math": 2.0}[name]
    monkeypatch.setattr(C, "time_backend", fake)
    C.BackendChoice(**kw).choose(torch.randn(1, n, 1, 8), torch.randn(1, n, 1, 8), False)
    return set(lengths)


def test_bucket_is_the_next_power_of_two_at_least_16():
    assert [C.bucket(n) for n in (1, 9, 16, 17, 100, 1024, 1025)] == [16, 16, 16, 32, 128, 1024, 2048]


def test_timed_length_is_the_bucket(monkeypatch):
    assert _timed_lengths(monkeypatch, 100) == {128}


def test_timed_length_is_capped_on_cpu(monkeypatch):
    assert _timed_lengths(monkeypatch, 1500) == {1024}
    assert _timed_lengths(monkeypatch, 100, max_block=64) == {64}
