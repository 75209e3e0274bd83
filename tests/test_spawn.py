import os
import time

import pytest
import torch
import torch.distributed as dist

from harness.worlds import WorldError, run_world


def _sum(rank, world):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return t.item()


def test_world_returns_results_in_rank_order():
    assert run_world(_sum, 4, timeout=30) == [6.0] * 4


def _raise_on_2(rank, world):
    if rank == 2:
        raise ValueError("boom")
    dist.barrier()


def test_failing_rank_is_reported_fast():
    t0 = time.monotonic()
    with pytest.raises(WorldError, match="rank 2: ValueError: boom"):
        run_world(_raise_on_2, 4, timeout=60)
    assert time.monotonic() - t0 < 60  # reported on the failure, not at the world's timeout


def _hang(rank, world):
    if rank == 0:
        time.sleep(60)
    dist.barrier()


def test_hung_peer_ends_in_timeout():
    t0 = time.monotonic()
    with pytest.raises(WorldError):
        run_world(_hang, 2, timeout=3)
    assert time.monotonic() - t0 < 60  # ended by the timeout, not by the hung rank's 60 s


def _late_peer(rank, world):
    if rank == 1:  # still talking to rank 0 after rank 0's function returned (as gloo's group connects do)
        time.sleep(0.5)
        dist.barrier()
    return rank


def test_a_finished_rank_stays_until_its_peers_are_done():
    assert run_world(_late_peer, 2, timeout=20) == [0, 1]


def _records(rank, world):
    from sp_plan.runtime.spawn import flight_recorder_on

    dist.all_reduce(torch.ones(1))
    return flight_recorder_on()


def test_world_ranks_do_not_record_collectives_so_they_can_fork_child_worlds():
    # a rank forks a child world per tune candidate; a recorder mutex held at the fork would hang the child
    assert run_world(_records, 2, timeout=20) == [False, False]


def test_candidates_fork_only_where_no_recorder_or_cuda(monkeypatch):
    from sp_plan.profiles.tune import isolate

    monkeypatch.setattr(isolate, "flight_recorder_on", lambda: False)
    assert isolate.default_start_method(None) == "fork" and isolate.default_start_method(0) == "spawn"
    monkeypatch.setattr(isolate, "flight_recorder_on", lambda: True)
    assert isolate.default_start_method(None) == "spawn"


def test_candidates_spawn_where_the_process_computes_on_several_threads(monkeypatch):
    # GNU OpenMP's pool does not survive a fork: a child forked after parallel regions hangs in its first one
    from sp_plan.profiles.tune import isolate

    monkeypatch.setattr(isolate, "flight_recorder_on", lambda: False)
    monkeypatch.setattr(isolate.torch, "get_num_threads", lambda: 2)
    assert isolate.default_start_method(None) == "spawn"
    monkeypatch.setattr(isolate.mp, "current_process", lambda: type("P", (), {"daemon": True})())
    assert isolate.default_start_method(None) == "fork"  # a daemon cannot spawn: its child computes on one thread


_FORK_AFTER_THREADS = """
import os, torch
torch.set_num_threads(2)
e = torch.nn.Embedding(20000, 128)
x = torch.randint(20000, (1, 2048))
e(x).sum().backward()  # parallel regions in the parent
from sp_plan.profiles.tune.isolate import Forked
def child(conn):
    torch.set_num_threads(1)  # as isolate._child does in a forked child
    e(x).sum().backward()
    conn.send("ok")
    conn.close()
    os._exit(0)
proc = Forked(child, ())
assert proc.poll(20) and proc.recv() == "ok"
"""


def test_a_forked_child_on_one_thread_survives_the_parents_thread_pool():
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    res = subprocess.run([sys.executable, "-c", _FORK_AFTER_THREADS], env=env, timeout=60, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr[-2000:]
