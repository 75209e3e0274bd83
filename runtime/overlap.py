"""The double-buffered transfer schedule of a ring: which buffer is computed on while which is in flight.

A ring of P rounds passes blocks (K, V in the forward and backward) to the next rank. Round i
computes on the block it holds while the block of round i + 1 is already being received (Ring
Attention, Liu et al. 2023, Sec. 3: communication overlapped with blockwise compute). Three
slots suffice: slot 0 is the caller's block (read and sent, never written), slots 1 and 2
alternate. Round i's receive goes into the slot computed on in round i - 1, whose send was waited
for at the end of round i - 1, so no buffer is written while it is read or in flight. The ring
executors (``ring.ring_forward`` / ``ring_backward``) follow this object on every device; with
NCCL, the transfer runs on NCCL's stream and the wait at the end of a round makes the compute
stream wait for it without a host synchronization.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Round:
    """One round: the slot computed on (and sent), and the slot the next block arrives in (None: last round)."""

    index: int
    compute: int
    recv: int | None


@dataclass(frozen=True)
class DoubleBuffer:
    """The rounds of a ring of ``size`` ranks over three slots (0 = the caller's block, read only)."""

    size: int

    @property
    def rounds(self) -> tuple[Round, ...]:
        slot = lambda i: 0 if i == 0 else 1 + (i - 1) % 2  # noqa: E731 - round i computes on this slot
        return tuple(Round(i, slot(i), slot(i + 1) if i + 1 < self.size else None) for i in range(self.size))

    @property
    def slots(self) -> int:
        """Buffers the schedule uses: the caller's plus at most two received ones."""
        return 1 + min(2, self.size - 1)

    def check(self) -> None:
        """The schedule's safety: every round computes on what the previous one received, never receives into
        the slot it computes on or into slot 0, and reuses only a slot whose send was waited for a round ago."""
        rs = self.rounds
        for prev, cur in zip(rs, rs[1:]):
            assert cur.compute == prev.recv, (prev, cur)
        for r in rs:
            assert r.recv is None or (r.recv != r.compute and r.recv != 0), r
            if r.recv is not None and r.index >= 2:
                assert r.recv == rs[r.index - 1].compute, r


def run_rounds(schedule: DoubleBuffer, first: tuple, compute, transfer, trace: list | None = None) -> None:
    """Run ``schedule``: post round i's transfer, ``compute(i, block)`` on the held block, wait, move on.

    ``first`` is slot 0's block (tensors); ``transfer.post(send, recv)`` starts moving ``send`` into
    ``recv`` and returns a handle, ``transfer.wait(handle)`` makes the compute side wait for it.
    """
    bufs: list = [tuple(first), None, None]
    for rd in schedule.rounds:
        handle = None
        if rd.recv is not None:
            if bufs[rd.recv] is None:
                bufs[rd.recv] = tuple(t.new_empty(t.shape) for t in first)
            handle = transfer.post(list(bufs[rd.compute]), list(bufs[rd.recv]))
            if trace is not None:
                trace.append(("post", rd.index, rd.compute, rd.recv))
        if trace is not None:
            trace.append(("compute", rd.index, rd.compute, bufs[rd.compute][0].data_ptr()))
        compute(rd.index, bufs[rd.compute])
        if handle is not None:
            transfer.wait(handle)
            if trace is not None:
                trace.append(("wait", rd.index))


#: CUDA stream priority meaning "the highest there is" (CUDA clamps it into its range). A transfer beside a kernel
#: that fills every SM gets SMs only as that kernel's blocks retire; a high-priority stream is first in line for
#: them (what Megatron gives its communication). On an H200 it moved a stand-in round by 2 % (bench_overlap).
HIGH_PRIORITY = -100


class LocalTransfer:
    """A stand-in for a ring transfer on one device: a copy of the same size, on its own CUDA stream on CUDA.

    The side stream first waits for the compute stream (the sent block is ready), copies, and records
    an event; ``wait`` makes the compute stream wait for that event (no host synchronization). On
    CPU the copy runs at once. ``serial`` waits right after posting: the non-overlapped baseline.
    ``priority``: the side stream's CUDA priority (0, the default, is the default stream's; ``HIGH_PRIORITY``).
    """

    def __init__(self, device, serial: bool = False, priority: int = 0):
        import torch

        self.torch, self.serial = torch, serial
        self.stream = (torch.cuda.Stream(device, priority=priority) if torch.device(device).type == "cuda"
                       else None)

    def post(self, send: list, recv: list):
        if self.stream is None:
            for s, r in zip(send, recv):
                r.copy_(s)
            return None
        torch = self.torch
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            for s, r in zip(send, recv):
                r.copy_(s, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        if self.serial:
            torch.cuda.current_stream().wait_event(done)
        return done

    def wait(self, handle) -> None:
        if handle is not None:
            self.torch.cuda.current_stream().wait_event(handle)
