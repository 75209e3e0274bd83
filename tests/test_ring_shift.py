"""Ring.shift: the ranks a ring round sends to and receives from, in the ring's order of global ranks (a wrong
neighbour otherwise shows only as a world that hangs)."""
import pytest
import torch

from sp_plan.runtime.variants import ring as ring_mod
from sp_plan.runtime.variants.ring import Ring


@pytest.fixture
def posted(monkeypatch):
    """The (sends, recvs) that Ring.shift posts, instead of posting them."""
    calls = []
    monkeypatch.setattr(ring_mod, "p2p", lambda group, sends, recvs: calls.append((sends, recvs)) or [])
    return calls


@pytest.mark.parametrize("position, hops, dst, src", [
    (0, 1, 1, 0), (1, 1, 2, 3), (3, 1, 3, 2), (1, 2, 0, 0), (2, 3, 1, 0), (0, 4, 3, 3)])
def test_shift_sends_hops_on_and_receives_from_as_far_back(posted, position, hops, dst, src):
    ring = Ring(ranks=(3, 1, 2, 0), position=position, group=None)
    send, recv = [torch.zeros(1), torch.ones(1)], [torch.empty(1), torch.empty(1)]
    ring.shift(send, recv, tag=10, hops=hops)
    (sends, recvs), = posted
    assert [(d, tag) for _, d, tag in sends] == [(dst, 10), (dst, 11)]
    assert [(s, tag) for _, s, tag in recvs] == [(src, 10), (src, 11)]
    assert all(a is b for (a, _, _), b in zip(sends, send)) and all(a is b for (a, _, _), b in zip(recvs, recv))
