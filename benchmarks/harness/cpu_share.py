"""Cap each rank of a local world at a share of one core with a CPU cgroup (CFS bandwidth control).

Eight ranks on a two-core host take turns on the cores: a rank that waits gives its core to a busy one, so a
step's wall time measures the work of all ranks, not the busiest one. Capped at a quarter of a core each, the
ranks run side by side like eight slow dedicated devices: a rank that waits leaves its share idle, and a step takes
as long as its busiest rank, as on a GPU cluster. The cap is the kernel's CFS quota (cgroup v1 ``cpu.cfs_quota_us``
over ``cpu.cfs_period_us``, cgroup v2 ``cpu.max``), which throttles a group that used its quota in a period.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

#: where the CPU controller is mounted: cgroup v1's own hierarchy, else the unified (v2) one
V1_ROOT, V2_ROOT = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
#: the kernel refuses a quota under 1 ms
MIN_QUOTA_US = 1000


class CpuShareError(RuntimeError):
    """No CPU cgroup can be made here (no controller mounted, or no permission)."""


@dataclass(frozen=True)
class RankCaps:
    """One cgroup per rank of a ``world`` under ``root``, of cgroup ``version`` 1 or 2."""

    root: Path
    version: int
    world: int

    def rank_dir(self, rank: int) -> Path:
        return self.root / f"rank{rank}"

    def join(self, rank: int) -> None:
        """Move the calling process, all its threads, into its rank's cgroup (``cgroup.procs`` moves the thread
        group in both versions)."""
        (self.rank_dir(rank) / "cgroup.procs").write_text(str(os.getpid()))


def cpu_controller(v1: Path = V1_ROOT, v2: Path = V2_ROOT) -> tuple[Path, int]:
    """The folder new CPU cgroups go under and its cgroup version; CpuShareError if neither has the controller."""
    if (v1 / "cpu.cfs_quota_us").exists():
        return v1, 1
    controllers = v2 / "cgroup.subtree_control"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return v2, 2
    raise CpuShareError(f"--rank-cpu: no CPU cgroup controller at {v1} (v1) or enabled in {controllers} (v2); "
                        "mount one, or leave --rank-cpu out")


def quota_us(share: float, period_us: int) -> int:
    """The CFS quota that holds a group to ``share`` of one core per ``period_us``."""
    if not 0 < share <= 1:
        raise ValueError(f"--rank-cpu: a share of one core in (0, 1], not {share}")
    quota = round(share * period_us)
    if quota < MIN_QUOTA_US:
        raise ValueError(f"--rank-cpu: {share} of a core is under the kernel's 1 ms quota per {period_us} us "
                         f"period; give at least {MIN_QUOTA_US / period_us:g}")
    return quota


def _limit(folder: Path, version: int, quota: int, period_us: int) -> None:
    """Write the group's quota and period."""
    if version == 1:
        (folder / "cpu.cfs_period_us").write_text(str(period_us))
        (folder / "cpu.cfs_quota_us").write_text(str(quota))
    else:
        (folder / "cpu.max").write_text(f"{quota} {period_us}")


def make_caps(world: int, share: float, period_us: int = 5000, *, v1: Path = V1_ROOT,
              v2: Path = V2_ROOT) -> RankCaps:
    """A cgroup per rank of a ``world``, each capped at ``share`` of one core (CpuShareError if none can be made)."""
    quota = quota_us(share, period_us)
    base, version = cpu_controller(v1, v2)
    root = base / f"sp_plan_world_{os.getpid()}"
    try:
        root.mkdir(exist_ok=True)
        if version == 2:
            (root / "cgroup.subtree_control").write_text("+cpu")
        for rank in range(world):
            (root / f"rank{rank}").mkdir(exist_ok=True)
            _limit(root / f"rank{rank}", version, quota, period_us)
    except OSError as e:
        raise CpuShareError(f"--rank-cpu: cannot make a CPU cgroup under {base} ({e.strerror}); run as root, or "
                            "leave --rank-cpu out") from e
    return RankCaps(root, version, world)


def caps_or_exit(world: int, share: float) -> RankCaps:
    """``make_caps``, or exit 2 with its one-line error (a script's bad ``--rank-cpu`` or a host without cgroups)."""
    try:
        return make_caps(world, share)
    except (CpuShareError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def remove_caps(caps: RankCaps) -> list[str]:
    """Remove the ranks' cgroups once their processes have exited; the ones that could not be removed."""
    left = []
    for path in [caps.rank_dir(r) for r in range(caps.world)] + [caps.root]:
        try:
            path.rmdir()
        except OSError:
            left.append(str(path))
    return left
