"""Serve and query: start `sp-plan serve` (uvicorn) on a free loopback port, ask it for plans with sp_plan.client,
and stop it.

    python examples/serve_and_query.py [WORKDIR]     # WORKDIR: the service's store and plan.yaml (default: temporary)

What it runs is what you would run on a planner host:

    sp-plan serve --host 127.0.0.1 --port PORT --store sqlite:///WORKDIR/store.db

Takes a few seconds; no GPU is needed.
"""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from sp_plan.client import Client


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(store: str) -> tuple[subprocess.Popen, str]:
    """`sp-plan serve` in a process of its own; returns it and its URL once /healthz answers."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "sp_plan.cli.app", "serve", "--host", "127.0.0.1",
                             "--port", str(port), "--store", store])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"sp-plan serve exited {proc.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.terminate()
    sys.exit("sp-plan serve did not answer /healthz within 60 s")


def query(url: str, workdir: Path) -> None:
    """Plan, fetch the plan again by its id, price another layout, and save the winner as a plan file."""
    with Client(url) as client:
        res = client.plan(cluster="dgx-h100", nodes=2, model="llama3-8b", workload={"seq_len": "128k"}, top=3)
        print(f"{res.cluster.name}, {res.model.name}, {res.workload.seq_len:,} tokens: "
              f"{res.search.space:,} candidates, {res.search.evaluated} priced; {res.profile_line}")
        for i, plan in enumerate(res.plans, 1):  # the top 3, each followed by layouts that cost the same
            print(f"  {i}. {plan.summary():<52} {plan.predicted.step_time_s:.3f} s")
        again = client.get_plan(res.id)  # the service keeps what it answered: GET /v1/plans/{id}
        assert again.winner.summary() == res.winner.summary()
        other = res.plans[-1]
        est = client.estimate(plan=other, cluster="dgx-h100", nodes=2)  # POST /v1/estimate: one layout priced
        print(f"estimate of {other.summary()}: {est.plan.predicted.step_time_s:.3f} s")
        res.winner.save(workdir / "plan.yaml")
        print(f"wrote {workdir / 'plan.yaml'}; OpenAPI document at {url}/docs")


def main() -> None:
    workdir = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="sp_plan_serve_"))
    workdir.mkdir(parents=True, exist_ok=True)
    proc, url = start_service(f"sqlite:///{workdir.resolve() / 'store.db'}")
    try:
        query(url, workdir)
    finally:
        proc.send_signal(signal.SIGINT)  # as Ctrl-C would: uvicorn finishes what is in flight and exits
        proc.wait(30)


if __name__ == "__main__":
    main()
