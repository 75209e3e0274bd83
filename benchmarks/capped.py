"""Run a command under torchrun on this host with each rank capped at a share of one core (a script).

    python benchmarks/capped.py --rank-cpu 0.24 --nproc-per-node 8 -- -m sp_plan.cli.app tune --cluster cluster.yaml ...

Each rank joins its own CPU cgroup (``harness.cpu_share``) before it starts Python, so eight ranks on a two-core host
run side by side like eight slow dedicated devices: what ``bench_masks.py --rank-cpu`` times, here for `sp-plan
discover` and `sp-plan tune`. The arguments after ``--`` are Python's, as torchrun takes them. Needs root (or a
delegated cgroup); exits 2 with one line where no cgroup can be made.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.cpu_share import caps_or_exit, remove_caps  # noqa: E402

#: a rank's first step: move this shell into its rank's cgroup ($0 is the world's cgroup folder; a 0 written names
#: the writer), then become Python. No "$$": torchrun reads its arguments as templates, where "$$" is "$".
JOIN = 'echo 0 > "$0/rank$LOCAL_RANK/cgroup.procs" && exec "$@"'


def torchrun_argv(root: Path, nproc: int, python_argv: list[str]) -> list[str]:
    """torchrun on this host, each rank a shell that joins its cgroup and then runs ``python python_argv``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "--no-python", "sh", "-c", JOIN, str(root), sys.executable, *python_argv]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank-cpu", type=float, required=True, metavar="SHARE", help="share of one core per rank")
    ap.add_argument("--nproc-per-node", type=int, required=True)
    ap.add_argument("python_argv", nargs=argparse.REMAINDER, help="-- then Python's arguments")
    args = ap.parse_args(argv)
    rest = args.python_argv[1:] if args.python_argv[:1] == ["--"] else args.python_argv
    if not rest:
        ap.error("python_argv: give the command after --, e.g. -- -m sp_plan.cli.app tune ...")
    caps = caps_or_exit(args.nproc_per_node, args.rank_cpu)
    try:
        return subprocess.run(torchrun_argv(caps.root, args.nproc_per_node, rest)).returncode
    finally:
        left = remove_caps(caps)
        if left:
            print(f"warning: cgroups left behind: {', '.join(left)}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
