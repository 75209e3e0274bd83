"""Two simulated nodes: two network namespaces joined by a veth pair shaped with `tc tbf`, two ranks in each.

`sp-plan discover` must find two nodes, and `sp-plan profile links` must measure the inter-node link
slower than the intra-node one, its fitted bandwidth within 30 % of the shaped rate. Needs root, `ip`
and `tc` (iproute2) and network namespaces; skipped, with the reason, where any is missing.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid

import pytest

from sp_plan.planner.cluster import Cluster

RATE_MBIT = 200  # tbf rate each way; 25e6 bytes/s
RATE = RATE_MBIT * 1e6 / 8
SIZES = "16K,64K,256K,1M"
ADDR = ("10.77.0.1", "10.77.0.2")


def _sh(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)


def _unavailable() -> str | None:
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


@pytest.fixture
def shaped_pair():
    """Namespaces A and B, a veth between them, tbf at RATE_MBIT on both ends; removed afterwards."""
    why = _unavailable()
    if why:
        print(f"skipping the two-namespace test: {why}")
        pytest.skip(why)
    tag = uuid.uuid4().hex[:6]
    ns, dev = (f"spA{tag}", f"spB{tag}"), (f"va{tag}", f"vb{tag}")
    steps = [("ip", "netns", "add", ns[0]), ("ip", "netns", "add", ns[1]),
             ("ip", "link", "add", dev[0], "type", "veth", "peer", "name", dev[1])]
    for n, d, a in zip(ns, dev, ADDR):
        steps += [("ip", "link", "set", d, "netns", n), ("ip", "-n", n, "addr", "add", f"{a}/24", "dev", d),
                  ("ip", "-n", n, "link", "set", d, "up"), ("ip", "-n", n, "link", "set", "lo", "up"),
                  ("ip", "netns", "exec", n, "tc", "qdisc", "add", "dev", d, "root", "tbf", "rate", f"{RATE_MBIT}mbit",
                   "burst", "32kb", "latency", "50ms")]
    try:
        for s in steps:
            p = _sh(*s)
            if p.returncode != 0:
                why = f"`{' '.join(s)}` failed: {p.stderr.strip()}"
                print(f"skipping the two-namespace test: {why}")
                pytest.skip(why)
        yield ns, dev
    finally:
        for n in ns:
            _sh("ip", "netns", "del", n)  # takes its end of the veth pair with it


def _run_world(ns, dev, args: list[str], cwd, timeout: float = 150) -> list[str]:
    """Four ranks, two per namespace, with torchrun's variables; returns each rank's output."""
    port = str(29500 + int(uuid.uuid4().hex[:3], 16) % 2000)
    procs = []
    for rank in range(4):
        node = rank // 2
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="4", LOCAL_RANK=str(rank % 2), LOCAL_WORLD_SIZE="2",
                   GROUP_RANK=str(node), MASTER_ADDR=ADDR[0], MASTER_PORT=port, GLOO_SOCKET_IFNAME=dev[node],
                   OMP_NUM_THREADS="1")
        cmd = ["ip", "netns", "exec", ns[node], sys.executable, "-m", "sp_plan.cli.app", *args]
        procs.append(subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, (p, o) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {rank} exited {p.returncode}:\n{o}"
    return outs


def test_two_nodes_in_namespaces(shaped_pair, tmp_path):
    ns, dev = shaped_pair
    outs = _run_world(ns, dev, ["discover", "-o", "c.yaml"], tmp_path)
    c = Cluster.load(tmp_path / "c.yaml")
    assert c.num_nodes == 2 and c.world_size == 4 and c.network == "ethernet", outs[0]
    assert f"nic0={dev[0]}" in c.source and "2 node(s)" in outs[0]

    outs = _run_world(ns, dev, ["profile", "links", "--cluster", "c.yaml", "-o", "cal.yaml", "--sizes", SIZES], tmp_path)
    cal = Cluster.load(tmp_path / "cal.yaml")
    fits = cal.calibration["links"]["classes"]
    inter, intra = fits["inter:ethernet"]["ops"]["p2p"]["busbw"], fits["intra:shm"]["ops"]["p2p"]["busbw"]
    print(f"\nshaped {RATE / 1e6:.1f} MB/s; fitted inter-node {inter / 1e6:.1f} MB/s "
          f"(both ways {fits['inter:ethernet']['ops']['p2p_bidir']['busbw'] / 1e6:.1f} MB/s each), "
          f"intra-node {intra / 1e6:.0f} MB/s\n{outs[0]}")
    assert inter < intra
    assert abs(inter - RATE) <= 0.3 * RATE, f"inter-node fit {inter / 1e6:.1f} MB/s vs shaped {RATE / 1e6:.1f} MB/s"
    eth = [l for l in cal.node_type(0).links if l.kind == "ethernet"]
    assert eth and eth[0].capacity == pytest.approx(inter)
    assert not cal.calibration["links"]["failed"]
