"""Run a candidate in a child world, so that a hang or a dead collective cannot poison the caller's.

Every rank starts one child process (os.fork on CPU, multiprocessing spawn with CUDA); the children join a fresh
process group on their own TCPStore (rank 0's child hosts it on MASTER_ADDR at a port rank 0
picks and broadcasts over the parent world) and run the candidate. Each parent waits up to
``timeout_s`` for its child's report (agreeing with the others every second whether all have one, so
that no parent blocks in one collective for longer; ``grace_s`` once a peer's child has failed), kills it
after that, and the parents agree through the parent world: a timeout anywhere -> "timeout" (the ranks whose
child never reported); else the earliest failure ("error"/"oom", with its rank and reason; a peer's
"connection closed" comes after the failure that caused it); else the children's common result. The
children wait ``JOIN_S`` for each other to join and their collectives time out after
``collective_timeout_s`` (default timeout_s / 2), so peers blocked on a hung rank report an error while the
hung rank itself times out. A child killed by SIGKILL (the OS OOM killer, most often) is "oom"; by another
signal "error".
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import pickle
import select
import signal
import time
from typing import Callable

import torch
import torch.distributed as dist

from sp_plan.planner.model import ModelSpec, Workload
from sp_plan.planner.plan import Plan
from sp_plan.planner.profile import MeasuredCandidate
from sp_plan.runtime.spawn import flight_recorder_on, free_port


def forget_parent_world() -> None:
    """In a forked child: start from an empty c10d world, keeping the inherited process groups alive.

    Releasing them would run their destructors, which join worker threads that do not exist after a
    fork (a hang), so the old world object stays referenced and new group names start past the old.
    """
    from torch.distributed import distributed_c10d as c10d

    old = c10d._world
    fresh = c10d._World()
    fresh.inherited = old  # never released: see above
    c10d._world = fresh
    fresh.group_count = old.group_count + 1_000_000


def _child(plan, model, work, rank, world, addr, port, coll_timeout, cuda_index, forked, kw, conn):
    """The child rank: join the fresh world, measure, report (status, payload, time), exit at once."""
    from .candidate import classify, measure, stall

    try:
        os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        if forked:
            forget_parent_world()
            torch.set_num_threads(1)  # the parent's OpenMP pool is gone (default_start_method)
        if cuda_index is not None:
            torch.cuda.set_device(cuda_index)
        backend = "cpu:gloo,cuda:nccl" if cuda_index is not None else "gloo"
        coll = datetime.timedelta(seconds=coll_timeout)
        store = dist.TCPStore(addr, port, world, rank == 0, timeout=datetime.timedelta(seconds=min(JOIN_S, coll_timeout)))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=coll)
        store.set_timeout(coll)  # joined: the candidate's own groups rendezvous on the collective timeout
        res = measure(plan, model, work, **kw)
        stall(kw.get("fault"), rank)
        if kw.get("backends") is not None:  # the decisions it made too, for the next candidate's child
            res = {**res, "backends": kw["backends"]}
        conn.send(("ok", res, time.time()))
    except BaseException as e:  # noqa: BLE001 - report anything to the parent
        try:
            conn.send((classify(e), f"{type(e).__name__}: {e}", time.time()))
        except Exception:  # noqa: BLE001
            pass
    finally:
        conn.close()
        os._exit(0)  # no destroy: peers may be gone; closing our sockets tells them at once


class _PipeWriter:
    """The child's end of an os.pipe with Connection's send/close."""

    def __init__(self, fd: int):
        self.fd = fd

    def send(self, obj) -> None:
        data = pickle.dumps(obj)
        while data:
            data = data[os.write(self.fd, data):]

    def close(self) -> None:
        os.close(self.fd)


class Forked:
    """A child made with os.fork (allowed inside daemonic processes, unlike multiprocessing's), with
    the poll/recv/is_alive/kill/join/exitcode that ``_wait`` uses of a multiprocessing Process + Pipe."""

    def __init__(self, target, args):
        r, w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # child: never returns (target ends with os._exit)
            os.close(r)
            try:
                target(*args, _PipeWriter(w))
            finally:
                os._exit(1)
        os.close(w)
        self.fd, self.exitcode = r, None

    def poll(self, timeout: float) -> bool:
        return bool(select.select([self.fd], [], [], timeout)[0])

    def recv(self):
        chunks = []
        while chunk := os.read(self.fd, 1 << 16):
            chunks.append(chunk)
        if not chunks:
            raise EOFError
        return pickle.loads(b"".join(chunks))

    def _reap(self, flags: int) -> None:
        if self.exitcode is None:
            pid, status = os.waitpid(self.pid, flags)
            if pid:
                self.exitcode = os.waitstatus_to_exitcode(status)

    def is_alive(self) -> bool:
        self._reap(os.WNOHANG)
        return self.exitcode is None

    def kill(self) -> None:
        if self.is_alive():
            os.kill(self.pid, signal.SIGKILL)

    def join(self, timeout: float | None = None) -> None:
        end = time.monotonic() + (timeout or 0)
        while self.is_alive() and time.monotonic() < end:
            time.sleep(0.01)

    def close(self) -> None:
        os.close(self.fd)


#: seconds between the parents' agreements while their children run (``_wait_together``)
BEAT_S = 1.0
#: seconds the children wait for each other to join their world (a child starts in well under a second)
JOIN_S = 60.0
#: seconds a parent waits for its child's report once a peer's child has failed (``_wait_together``)
GRACE_S = 60.0


def _wait_together(proc, conn, rank: int, timeout_s: float, beat_s: float = BEAT_S,
                   grace_s: float = GRACE_S, beat: Callable[[float], None] | None = None) -> tuple[str, object, float]:
    """This rank's ``_wait``, while the parents agree every ``beat_s`` how many children have reported and
    whether one failed (one all-reduce of two counts per beat over the parent world). A child that hangs while
    its peers are done keeps them waiting in beats, never in one collective that the parent world's own timeout
    (the tune's 120 s) would end first: on two hosts shaped by tc one rank's child never joined its child world,
    its peers gave up on it at the children's collective timeout and waited for its parent in one gather, and the
    tune's world timed out. Once a peer's child has failed, a child that has not reported within ``grace_s`` is
    killed (a "timeout" of its rank): a world with a failed member cannot finish, and its members would
    otherwise be waited for until ``timeout_s``. ``beat`` (seconds since the wait began) is called every beat: a
    long candidate's progress."""
    began = time.monotonic()
    deadline = began + timeout_s
    outcome, give_up = None, None
    while True:
        if outcome is None and give_up is not None and time.monotonic() >= give_up:
            outcome = ("timeout", f"rank {rank}: no result {grace_s:.0f} s after a peer's child failed (child killed)",
                       time.time())
        if outcome is None:
            outcome = _wait(proc, conn, rank, timeout_s, deadline, time.monotonic() + beat_s)
        counts = torch.tensor([0 if outcome is None else 1, 0 if outcome is None or outcome[0] == "ok" else 1])
        dist.all_reduce(counts)
        if counts[0].item() == dist.get_world_size():
            return outcome
        if counts[1].item() and give_up is None:
            give_up = time.monotonic() + grace_s
        if beat is not None:
            beat(time.monotonic() - began)


def _wait(proc, conn, rank: int, timeout_s: float, deadline: float, until: float) -> tuple[str, object, float] | None:
    """The child's report, or why there is none (timeout at ``deadline``, death by a signal); None while the child
    runs at ``until``."""
    while time.monotonic() < min(deadline, until):
        if conn.poll(0.05):
            try:
                return conn.recv()
            except EOFError:
                break
        if not proc.is_alive() and not conn.poll(0):
            break
    else:
        if time.monotonic() < deadline:
            return None
        return "timeout", f"rank {rank}: no result within {timeout_s:.0f} s (child killed)", time.time()
    proc.join(5)
    code = proc.exitcode
    if code is not None and code < 0:
        sig = signal.Signals(-code).name
        if -code == signal.SIGKILL:
            return "oom", f"rank {rank}: child killed by {sig} (most likely the OS out-of-memory killer)", time.time()
        return "error", f"rank {rank}: child killed by {sig}", time.time()
    return "error", f"rank {rank}: child exited (code {code}) without a result", time.time()


def combine(outcomes: list[tuple]) -> tuple[str, int | None, object]:
    """(status, rank, payload or reason) from every parent's (rank, status, payload, time) (module docstring)."""
    late = [o for o in outcomes if o[1] == "timeout"]
    if late:
        ranks = [o[0] for o in late]
        others = [f"rank {o[0]}: {o[2]}" for o in outcomes if o[1] not in ("ok", "timeout")]
        why = (f"rank(s) {ranks} did not finish ({'; '.join(str(o[2]) for o in late)})"
               + ("; " + "; ".join(others) if others else ""))
        return "timeout", ranks[0], why
    failed = [o for o in outcomes if o[1] != "ok"]
    if failed:
        r, status, reason, _ = min(failed, key=lambda o: (o[3], o[0]))
        return status, r, reason
    return "ok", None, outcomes[0][2]


def default_start_method(cuda_index: int | None) -> str:
    """fork (a child world in well under a second) unless the process holds CUDA, which cannot be forked, its
    c10d flight recorder records, whose mutex a child can inherit locked (``runtime.spawn.fork_safe_c10d``), or
    it computes on several threads: GNU OpenMP's thread pool does not survive a fork, and a forked child's first
    parallel region waits for it forever. A daemonic process cannot spawn: it forks, and the child computes on one
    thread (``_child``)."""
    if cuda_index is None and not flight_recorder_on() and torch.get_num_threads() == 1:
        return "fork"
    return "fork" if mp.current_process().daemon and cuda_index is None else "spawn"


def preload_for_children() -> None:
    """Import here, once, what a child's measurement imports on first use: DDP's constructor loads torch._dynamo
    (with FSDP and DTensor, about 4 s a rank on shared CPU cores), which a forked child would otherwise import again
    for every candidate."""
    import torch._dynamo  # noqa: F401, PLC0415 - heavy and lazy in torch itself: only a tune's parent needs it


def run_candidate_isolated(plan: Plan, model: ModelSpec, work: Workload, *, timeout_s: float,
                           collective_timeout_s: float | None = None, start_method: str | None = None,
                           grace_s: float = GRACE_S, beat: Callable[[float], None] | None = None,
                           backends: dict | None = None, **kw) -> MeasuredCandidate:
    """``run_candidate`` in a fresh child world with a deadline (module docstring); collective over the parent world.

    ``kw`` are run_candidate's keywords (layers, warmup, iters, device, dtype, memory_limit_bytes,
    fault). ``grace_s``: how long a child may go on once a peer's child has failed (``_wait_together``); ``beat``:
    called with the seconds since the children started, about every second while they run; ``backends``: this
    rank's block-kernel decisions (``candidate.measure``), handed to its child and updated with the child's. The
    same MeasuredCandidate comes back on every rank; the parent world stays usable.
    """
    from sp_plan.runtime.context import require_world

    from .candidate import _candidate, agree

    require_world()  # collective over the parent world: torch's own error would not say how to make one
    rank, world = dist.get_rank(), dist.get_world_size()
    limit = kw.pop("memory_limit_bytes", None)
    device = torch.device(kw.get("device", "cpu"))
    cuda_index = (device.index if device.index is not None else torch.cuda.current_device()) \
        if device.type == "cuda" else None
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    box = [free_port(addr) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    method = start_method or default_start_method(cuda_index)
    coll = collective_timeout_s or max(timeout_s / 2, 1.0)
    if backends is not None:
        kw = {**kw, "backends": dict(backends)}
    args = (plan, model, work, rank, world, addr, box[0], coll, cuda_index, method == "fork", kw)
    if method == "fork":
        preload_for_children()
        proc = recv = Forked(_child, args)
    else:  # CUDA cannot be forked: a fresh interpreter (not allowed inside a daemonic process)
        ctx = mp.get_context(method)
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(*args, send))
        proc.start()
        send.close()
    try:
        status, payload, t = _wait_together(proc, recv, rank, timeout_s, grace_s=grace_s, beat=beat)
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        recv.close()
    if status == "ok" and isinstance(payload, dict) and "backends" in payload:
        made = payload.pop("backends")
        if backends is not None:
            backends.update(made)
    outcomes: list = [None] * world
    dist.all_gather_object(outcomes, (rank, status, payload, t))
    status, bad, payload = combine(outcomes)
    isolation = {"isolation": f"child world ({method}), timeout {timeout_s:.0f} s, collectives {coll:.0f} s"}
    if status != "ok":
        return _candidate(plan, model, work, status=status, reason=str(payload), rank=bad, detail=isolation)
    res = agree(plan, model, work, [(r, "ok", payload) for r in range(world)], limit)
    res.detail.update(isolation)
    return res
