"""The ring's double-buffered transfer schedule: its rounds, and the order and buffer reuse the executors follow."""
import pytest
import torch
import torch.nn.functional as F

from sp_plan.runtime.overlap import DoubleBuffer, Round
from sp_plan.runtime.variants.ring import make_ring, ring_backward, ring_forward, round_masks
from harness.worlds import run_world


def test_rounds_of_a_ring_of_four():
    assert DoubleBuffer(4).rounds == (Round(0, 0, 1), Round(1, 1, 2), Round(2, 2, 1), Round(3, 1, None))
    assert DoubleBuffer(1).rounds == (Round(0, 0, None),) and DoubleBuffer(1).slots == 1
    assert DoubleBuffer(2).slots == 2 and DoubleBuffer(8).slots == 3


@pytest.mark.parametrize("size", range(1, 10))
def test_schedule_never_writes_a_buffer_in_use(size):
    DoubleBuffer(size).check()


def test_check_catches_a_schedule_that_receives_into_the_computed_slot(monkeypatch):
    bad = (Round(0, 0, 1), Round(1, 1, 1), Round(2, 1, None))
    monkeypatch.setattr(DoubleBuffer, "rounds", property(lambda self: bad))
    with pytest.raises(AssertionError):
        DoubleBuffer(3).check()


def _traced(rank, world, q, k, v, dout):
    ring = make_ring(None)
    s = q.shape[1] // world
    mine = [x[:, rank * s:(rank + 1) * s].contiguous() for x in (q, k, v, dout)]
    before = [t.clone() for t in mine[1:3]]
    masks = round_masks("contiguous", world, q.shape[1], ring.position, True)
    fwd, bwd = [], []
    out, lse = ring_forward(mine[0], mine[1], mine[2], ring, masks, None, trace=fwd)
    grads = ring_backward(mine[3], mine[0], mine[1], mine[2], out, lse, ring, masks, None, trace=bwd)
    untouched = all(torch.equal(a, b) for a, b in zip(before, mine[1:3]))
    return fwd, bwd, mine[1].data_ptr(), untouched, out, grads


def _check_trace(trace, size, k_ptr):
    """post(i) -> compute(i) -> wait(i) -> post(i+1): round i's compute runs while round i+1's block is in flight."""
    want = []
    for rd in DoubleBuffer(size).rounds:
        if rd.recv is not None:
            want.append(("post", rd.index, rd.compute, rd.recv))
        want.append(("compute", rd.index, rd.compute))
        if rd.recv is not None:
            want.append(("wait", rd.index))
    assert [e[:4] if e[0] == "post" else e[:3] for e in trace] == want
    ptr = {}
    for e in trace:
        if e[0] == "compute":
            assert ptr.setdefault(e[2], e[3]) == e[3]  # a slot is one buffer, reused
    assert ptr[0] == k_ptr and len(set(ptr.values())) == min(3, size)  # the caller's K plus two received buffers


def test_ring_follows_the_schedule_and_stays_exact():
    world = 4
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, 32, 2, 8, generator=g, dtype=torch.float64) for _ in range(4))
    res = run_world(_traced, world, q, k, v, dout, timeout=120)
    leaves = [x.transpose(1, 2).clone().requires_grad_() for x in (q, k, v)]
    ref = F.scaled_dot_product_attention(*leaves, is_causal=True)
    ref.backward(dout.transpose(1, 2))
    s = q.shape[1] // world
    for rank, (fwd, bwd, k_ptr, untouched, out, grads) in enumerate(res):
        _check_trace(fwd, world, k_ptr)
        _check_trace(bwd, world, k_ptr)
        assert untouched  # the caller's K, V are sent, never written
        rows = slice(rank * s, (rank + 1) * s)
        assert (out - ref.transpose(1, 2)[:, rows]).abs().max() < 1e-12
        for got, leaf in zip(grads, leaves):
            assert (got - leaf.grad.transpose(1, 2)[:, rows]).abs().max() < 1e-12


class _Counting:
    """A fake transfer: the received block is the sent one plus 1, so round i must see the first block + i."""

    def __init__(self):
        self.in_flight = []

    def post(self, send, recv):
        self.in_flight.append(recv)
        for s, r in zip(send, recv):
            r.copy_(s + 1)
        return len(self.in_flight) - 1

    def wait(self, handle):
        assert handle == len(self.in_flight) - 1  # waits in posting order, one at a time
        self.in_flight.pop()


@pytest.mark.parametrize("size", [1, 2, 5])
def test_run_rounds_follows_the_schedule_and_delivers_each_block(size):
    from sp_plan.runtime.overlap import LocalTransfer, run_rounds

    first = (torch.zeros(4, 3), torch.ones(2))
    seen, trace = [], []
    run_rounds(DoubleBuffer(size), first, lambda i, blk: seen.append([t.clone() for t in blk]), _Counting(), trace)
    for i, blk in enumerate(seen):
        assert torch.equal(blk[0], torch.full((4, 3), float(i))) and torch.equal(blk[1], torch.full((2,), 1.0 + i))
    _check_trace(trace, size, first[0].data_ptr())
    assert torch.equal(first[0], torch.zeros(4, 3))  # slot 0 is read, never written
    # the stand-in transfer of the GPU benchmark, on CPU: a copy, so every round sees the first block
    got = []
    run_rounds(DoubleBuffer(size), first, lambda i, blk: got.append(blk[0].clone()), LocalTransfer("cpu"))
    assert all(torch.equal(g, first[0]) for g in got) and len(got) == size
