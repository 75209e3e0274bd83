"""Two simulated hosts on one machine: network namespaces joined by a veth pair shaped with `tc tbf`.

Used by the two-node tests and `benchmarks/bench_tune.py`. ``shaped_pair(rate_mbit)`` makes
namespaces A and B, a veth between them (10.77.0.1 in A, 10.77.0.2 in B) and a token-bucket
filter at ``rate_mbit`` on both ends, and removes them afterwards; ``launch`` starts a world of
ranks in them with torchrun's variables. Needs root, iproute2 and namespaces; ``unavailable()``
says why not.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass

from sp_plan.runtime.spawn import free_port

ADDR = ("10.77.0.1", "10.77.0.2")


def _sh(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)


def unavailable() -> str | None:
    """Why two shaped namespaces cannot be made here, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found (install iproute2)"
    name = f"spprobe{uuid.uuid4().hex[:6]}"
    p = _sh("ip", "netns", "add", name)
    if p.returncode != 0:
        return f"`ip netns add` failed: {p.stderr.strip() or p.returncode}"
    _sh("ip", "netns", "del", name)
    return None


@dataclass(frozen=True)
class Pair:
    namespaces: tuple[str, str]
    devices: tuple[str, str]
    rate_mbit: float


@contextlib.contextmanager
def shaped_pair(rate_mbit: float):
    """Namespaces A and B joined by a veth, tbf at ``rate_mbit`` each way; removed on exit (RuntimeError if not made)."""
    tag = uuid.uuid4().hex[:6]
    ns, dev = (f"spA{tag}", f"spB{tag}"), (f"va{tag}", f"vb{tag}")
    steps = [("ip", "netns", "add", ns[0]), ("ip", "netns", "add", ns[1]),
             ("ip", "link", "add", dev[0], "type", "veth", "peer", "name", dev[1])]
    for n, d, a in zip(ns, dev, ADDR):
        steps += [("ip", "link", "set", d, "netns", n), ("ip", "-n", n, "addr", "add", f"{a}/24", "dev", d),
                  ("ip", "-n", n, "link", "set", d, "up"), ("ip", "-n", n, "link", "set", "lo", "up"),
                  ("ip", "netns", "exec", n, "tc", "qdisc", "add", "dev", d, "root", "tbf", "rate", f"{rate_mbit}mbit",
                   "burst", "32kb", "latency", "50ms")]
    try:
        for s in steps:
            p = _sh(*s)
            if p.returncode != 0:
                raise RuntimeError(f"`{' '.join(s)}` failed: {p.stderr.strip()}")
        yield Pair(ns, dev, rate_mbit)
    finally:
        for n in ns:
            _sh("ip", "netns", "del", n)  # takes its end of the veth pair with it


def start(argv: list[str], world: int, per_node: int, cwd, pair: Pair | None = None,
          env: dict | None = None) -> list[subprocess.Popen]:
    """Start ``python *argv`` (e.g. ``["-m", "sp_plan.cli.app", "discover"]``) on ``world`` ranks (``per_node`` per
    host, in ``pair``'s namespaces when given, else on this host) with torchrun's variables; each rank in its own
    process session (``os.killpg`` ends it with its children)."""
    # on this host a free port, as two test workers may launch at once; in a pair's namespaces any port is free
    port = str(29500 + int(uuid.uuid4().hex[:3], 16) % 2000 if pair else free_port())
    procs = []
    for rank in range(world):
        node = rank // per_node
        e = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % per_node),
                 LOCAL_WORLD_SIZE=str(per_node), GROUP_RANK=str(node), MASTER_PORT=port, OMP_NUM_THREADS="1",
                 MASTER_ADDR=ADDR[0] if pair else "127.0.0.1", **(env or {}))
        cmd = [sys.executable, *argv]
        if pair:
            e["GLOO_SOCKET_IFNAME"] = pair.devices[node]
            cmd = ["ip", "netns", "exec", pair.namespaces[node], *cmd]
        procs.append(subprocess.Popen(cmd, env=e, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    return procs


def launch(argv: list[str], world: int, per_node: int, cwd, pair: Pair | None = None, timeout: float = 600,
           env: dict | None = None) -> list[tuple[int, str]]:
    """``start`` the ranks and wait for them: (exit code, output) of each rank."""
    procs = start(argv, world, per_node, cwd, pair, env)
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    return [(p.returncode, o) for p, o in zip(procs, outs)]
