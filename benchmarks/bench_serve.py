"""The planner service under load, on loopback with a bounded number of requests.

    python benchmarks/bench_serve.py [--processes N] [--cached 640] [--rounds 4] [--mix 200]

Starts `sp-plan serve` (a subprocess, a fresh SQLite store in a temp directory) on 127.0.0.1 and drives it with
aiohttp (`pip install 'sp-plan[bench]'`; its C HTTP parser costs the load generator a fraction of httpx's CPU per
request, so the figures are the server's). Bodies are encoded before the clock, answers read but not parsed (status
and length; a sample is validated once, afterwards). Prints p50 / p99 / max latency and the errors of each workload:

- cached: one 1,024-GPU plan already answered, asked again by 32 concurrent clients on open keep-alive connections
  (one untimed request each first) (goal p99 <= 50 ms);
- uncached: 1,024-GPU plans not asked before, 8 concurrent clients, each round all 8 ask the same new plan
  (coalesced: computed once) -- goal p99 <= 1.5 x the single-request time of the same plans, measured first on
  this machine through the server, one at a time (with top 5; the rounds ask for top 4, so nothing is cached); and the same with 8 *different* new plans at once, which the process pool
  (as many processes as cores) can only run cores at a time;
- mix: 16 concurrent clients, 70 % cached plans, 20 % new 16-GPU llama3-8b plans, 10 % profile uploads (token).

Workload: dgx-h100 preset, llama3-70b, causal training; 1,024 GPUs = 128 nodes; 1M-token sequences for the
cached plan, 512k + 64k x i tokens for the new ones. The figures are wall-clock latencies on whatever else the
machine runs: report them with the machine's load.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).parent))
from harness.stamp import commit  # noqa: E402

from sp_plan.cli.serve import server_parts  # noqa: E402
from sp_plan.planner.profile import Profile  # noqa: E402
from sp_plan.pipeline import PlanResponse  # noqa: E402
from sp_plan.runtime.spawn import free_port  # noqa: E402

TOKEN = "bench-token"
FIXTURE = Path(__file__).parent.parent / "tests" / "fixtures" / "profile-dgx-h100.yaml"


def body(nodes: int, seq_k: int, model: str = "llama3-70b") -> dict:
    return {"cluster": "dgx-h100", "nodes": nodes, "model": model, "workload": {"seq_len": f"{seq_k}k"}}


def start(tmp: Path, processes: int | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    (tmp / "tokens").write_text(TOKEN + "\n")
    args = [sys.executable, "-m", "sp_plan.cli.app", "serve", "--port", str(port), "--store", f"sqlite:///{tmp}/store.db",
            "--token-file", str(tmp / "tokens")] + (["--processes", str(processes)] if processes else [])
    proc = subprocess.Popen(args, stdout=open(tmp / "server.log", "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the server did not start:\n{(tmp / 'server.log').read_text()}")


async def drive(url: str, jobs: list[tuple[str, str, dict]], clients: int, warm: bool = False,
                bodies: list[bytes] | None = None, started=None) -> tuple[list[float], int]:
    """Run ``jobs`` (method, path, json) with ``clients`` concurrent workers on ``clients`` keep-alive connections;
    (latencies, errors). Bodies are encoded before the clock starts and answers are read, not parsed (status and
    length checked); ``bodies`` collects a few for a check afterwards. ``warm``: first one untimed request per
    connection, so the figures are of open connections, not of 32 TCP handshakes at once; ``started(seconds)``
    is called when the timed requests begin, with the time the untimed round took."""
    encoded = {}
    for _, _, payload in jobs:
        encoded.setdefault(id(payload), json.dumps(payload).encode())
    queue = deque(jobs)
    lat: list[float] = []
    errors = 0
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=clients), headers=headers,
                                     timeout=timeout) as http:
        async def one(method: str, path: str, payload: dict) -> bool:
            try:
                async with http.request(method, path, data=encoded[id(payload)]) as r:
                    body = await r.read()
                    ok = r.status < 300 and len(body) == (r.content_length or len(body)) and len(body) > 0
            except aiohttp.ClientError:
                return False
            if bodies is not None and len(bodies) < 8:
                bodies.append(body)
            return ok

        if warm:
            t0 = time.perf_counter()
            await asyncio.gather(*(one(*jobs[0]) for _ in range(clients)))
            warm_s = time.perf_counter() - t0
        if started:
            started(warm_s if warm else None)

        async def worker():
            nonlocal errors
            while queue:
                method, path, payload = queue.popleft()
                t0 = time.perf_counter()
                ok = await one(method, path, payload)
                lat.append(time.perf_counter() - t0)
                errors += not ok

        await asyncio.gather(*(worker() for _ in range(clients)))
    return lat, errors


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc), children not included."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * len(s) + 0.5) - 1))]


def row(name: str, clients: int, lat: list[float], errors: int, goal: str) -> str:
    ms = lambda x: f"{x * 1e3:9.1f}"  # noqa: E731
    return (f"{name:<28} {clients:>7} {len(lat):>8} {ms(pct(lat, 0.5))} {ms(pct(lat, 0.99))} {ms(max(lat))} "
            f"{errors:>6}  {goal}")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=None, help="search processes (default: the cores)")
    ap.add_argument("--cached", type=int, default=640, help="requests in the cached workload")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of 8 in the uncached workloads")
    ap.add_argument("--mix", type=int, default=200, help="requests in the mixed workload")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as d:
        proc, url = start(Path(d), a.processes)
        gc.collect()
        gc.freeze()  # this process's imports out of the collector's reach: no full-heap pause inside a measurement
        try:
            print(f"commit {commit()}, Python {platform.python_version()}, {os.cpu_count()} cores (load average "
                  f"{os.getloadavg()[0]:.1f}), server search processes {a.processes or os.cpu_count()} "
                  f"({server_parts()}), aiohttp {aiohttp.__version__} clients, loopback {url}")
            t1 = await single_uncached(url, a.rounds)
            print(f"{'workload':<28} {'clients':>7} {'requests':>8} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9} "
                  f"{'errors':>6}  goal")
            await cached_row(url, proc, a.cached)
            await uncached_rows(url, a.rounds, t1)
            await mix_row(url, a.mix)
        finally:
            proc.terminate()
            proc.wait(30)


async def single_uncached(url: str, rounds: int) -> float:
    """The median single-request search time of an uncached 1,024-GPU plan, through the server, one at a time."""
    single = []
    for r in range(rounds):  # the plans the 8 clients ask for below (there with top 4: not cached)
        lat, err = await drive(url, [("POST", "/v1/plan", body(128, 512 + 64 * r))], 1)
        assert not err, "single request failed"
        single += lat
    t1 = statistics.median(single)
    print(f"single uncached 1,024-GPU plan (median of {rounds}, one at a time): {t1 * 1e3:.1f} ms")
    return t1


async def cached_row(url: str, proc, requests: int) -> None:
    """32 clients asking for one cached plan: latency, and CPU per answer on each side."""
    await drive(url, [("POST", "/v1/plan", body(128, 1024))], 1)  # the cached plan
    t0, bodies, connect = [], [], []
    clock = lambda: [cpu_seconds(proc.pid), time.process_time(), time.perf_counter()]  # noqa: E731
    lat, err = await drive(url, [("POST", "/v1/plan", body(128, 1024))] * requests, 32, warm=True,
                           bodies=bodies, started=lambda w: (connect.append(w), t0.extend(clock())))
    cpu, mine, wall = (x - y for x, y in zip(clock(), t0))
    answer = PlanResponse.model_validate_json(bodies[0])  # a sample answer, checked once, after the clock
    # the winner is a plan file's mesh (no groups): every group derives from it
    assert answer.winner.with_groups().groups and all(b == bodies[0] for b in bodies), "the cached answers differ"
    print(row("cached 1,024-GPU plan", 32, lat, err, "p99 <= 50 ms"))
    print(f"{'':<28} CPU per cached answer: server {cpu / len(lat) * 1e3:.2f} ms, this load generator "
          f"{mine / len(lat) * 1e3:.2f} ms; {len(lat) / wall:.0f} answers/s, "
          f"{len(bodies[0]) / 1e3:.0f} kB each; the untimed first round (32 connections opened at once) "
          f"took {connect[0] * 1e3:.0f} ms")


async def uncached_rows(url: str, rounds: int, t1: float) -> None:
    """8 clients asking for one new plan a round, then for 8 different new plans a round."""
    lat, err = [], 0
    for r in range(rounds):
        l, e = await drive(url, [("POST", "/v1/plan", {**body(128, 512 + 64 * r), "top": 4})] * 8, 8)
        lat, err = lat + l, err + e
    print(row("uncached, same plan x 8", 8, lat, err, f"p99 <= 1.5 x {t1 * 1e3:.0f} ms = {1.5 * t1 * 1e3:.0f} ms"))
    lat, err = [], 0
    for r in range(rounds):
        l, e = await drive(url, [("POST", "/v1/plan", body(128, 512 + 64 * (rounds + 8 * r + i)))
                                 for i in range(8)], 8)
        lat, err = lat + l, err + e
    print(row("uncached, 8 different plans", 8, lat, err, "(no goal: 8 searches on the pool's processes)"))


async def mix_row(url: str, requests: int) -> None:
    """16 clients: 70 % the cached plan, 20 % new small plans, 10 % profile uploads."""
    prof = Profile.load(FIXTURE).model_dump(mode="json")
    jobs = []
    for i in range(requests):
        k = i % 10
        if k < 7:
            jobs.append(("POST", "/v1/plan", body(128, 1024)))
        elif k < 9:
            jobs.append(("POST", "/v1/plan", body(2, 32 + 2 * i, "llama3-8b")))
        else:
            jobs.append(("POST", "/v1/profiles", {**prof, "fitted": [f"bench upload {i}"]}))
    lat, err = await drive(url, jobs, 16)
    print(row("mix: 70% cached, 20% new,", 16, lat, err, "zero errors"))
    print(f"{'  10% uploads':<28}")


if __name__ == "__main__":
    asyncio.run(main())
