"""Ranks capped at a share of one core (benchmarks/harness/cpu_share.py and benchmarks/capped.py): the quota each
cgroup gets, where the cgroups go in each cgroup version, the refusals, and a capped world's ranks in their own
groups where this host lets one be made."""
import importlib.util
import os
import string
import sys
from pathlib import Path

import pytest

from harness import cpu_share
from harness.cpu_share import CpuShareError, RankCaps, cpu_controller, make_caps, quota_us, remove_caps

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def capped():
    spec = importlib.util.spec_from_file_location("capped", ROOT / "benchmarks" / "capped.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _v1(tmp_path) -> Path:
    """A cgroup v1 CPU hierarchy's root as the kernel shows it (the quota file is what marks it)."""
    root = tmp_path / "cpu"
    root.mkdir()
    (root / "cpu.cfs_quota_us").write_text("-1")
    return root


def _v2(tmp_path, controllers: str = "cpuset cpu io memory pids") -> Path:
    root = tmp_path / "unified"
    root.mkdir()
    (root / "cgroup.subtree_control").write_text(controllers)
    return root


def test_the_quota_is_the_share_of_the_period():
    assert quota_us(0.24, 5000) == 1200
    assert quota_us(1.0, 100_000) == 100_000


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5])
def test_a_share_outside_one_core_is_refused_by_name(share):
    with pytest.raises(ValueError, match="--rank-cpu: a share of one core"):
        quota_us(share, 5000)


def test_a_quota_under_the_kernels_millisecond_is_refused():
    with pytest.raises(ValueError, match="under the kernel's 1 ms quota per 5000 us period; give at least 0.2"):
        quota_us(0.1, 5000)  # 500 us


def test_v1_is_taken_where_its_cpu_hierarchy_is_mounted(tmp_path):
    v1 = _v1(tmp_path)
    assert cpu_controller(v1, _v2(tmp_path)) == (v1, 1)


def test_v2_is_taken_where_the_unified_root_enables_cpu(tmp_path):
    v2 = _v2(tmp_path)
    assert cpu_controller(tmp_path / "absent", v2) == (v2, 2)


def test_no_controller_is_refused_by_name(tmp_path):
    with pytest.raises(CpuShareError, match="--rank-cpu: no CPU cgroup controller"):
        cpu_controller(tmp_path / "absent", _v2(tmp_path, "cpuset io memory"))  # "cpuset" is not "cpu"


def test_v1_groups_get_a_period_and_a_quota_each(tmp_path):
    caps = make_caps(3, 0.24, 5000, v1=_v1(tmp_path), v2=tmp_path / "absent")
    assert caps.version == 1 and caps.root.name == f"sp_plan_world_{os.getpid()}"
    for rank in range(3):
        d = caps.rank_dir(rank)
        assert (d / "cpu.cfs_period_us").read_text() == "5000"
        assert (d / "cpu.cfs_quota_us").read_text() == "1200"
    assert not caps.rank_dir(3).exists()


def test_v2_groups_get_cpu_max_under_a_root_that_enables_cpu(tmp_path):
    caps = make_caps(2, 0.5, 4000, v1=tmp_path / "absent", v2=_v2(tmp_path))
    assert caps.version == 2
    assert (caps.root / "cgroup.subtree_control").read_text() == "+cpu"
    assert [(caps.rank_dir(r) / "cpu.max").read_text() for r in range(2)] == ["2000 4000", "2000 4000"]


def test_a_group_that_cannot_be_made_is_refused_with_the_fix(tmp_path):
    v1 = _v1(tmp_path)
    (v1 / f"sp_plan_world_{os.getpid()}").write_text("")  # a file where the world's folder goes
    with pytest.raises(CpuShareError, match="cannot make a CPU cgroup under .*run as root, or leave --rank-cpu out"):
        make_caps(2, 0.25, v1=v1, v2=tmp_path / "absent")


def test_join_writes_the_callers_pid_into_its_ranks_group(tmp_path):
    caps = RankCaps(tmp_path, 1, 2)
    (tmp_path / "rank1").mkdir()
    caps.join(1)
    assert (tmp_path / "rank1" / "cgroup.procs").read_text() == str(os.getpid())


def test_remove_takes_empty_groups_and_names_the_rest(tmp_path):
    caps = RankCaps(tmp_path / "world", 1, 2)
    for rank in range(2):
        caps.rank_dir(rank).mkdir(parents=True)
    (caps.rank_dir(1) / "cgroup.procs").write_text("123")  # still holds a member
    assert remove_caps(caps) == [str(caps.rank_dir(1)), str(caps.root)]
    assert not caps.rank_dir(0).exists()


def test_the_rank_shell_survives_torchruns_argument_templates(capped):
    """torchrun substitutes ``${local_rank}`` in a --no-python command's arguments with string.Template, where
    "$$" is an escaped "$": the join line must come through unchanged."""
    argv = capped.torchrun_argv(Path("/cg/world"), 4, ["-m", "sp_plan.cli.app", "tune"])
    i = argv.index("--no-python")
    assert argv[i + 1:i + 5] == ["sh", "-c", capped.JOIN, "/cg/world"]
    assert argv[-4:] == [sys.executable, "-m", "sp_plan.cli.app", "tune"]
    assert argv[argv.index("--nproc-per-node") + 1] == "4"
    assert string.Template(capped.JOIN).safe_substitute(local_rank="0") == capped.JOIN
    assert "rank$LOCAL_RANK/cgroup.procs" in capped.JOIN and "exec \"$@\"" in capped.JOIN


def test_the_launcher_refuses_a_bad_share_with_one_line(capped, capsys):
    with pytest.raises(SystemExit) as e:
        capped.main(["--rank-cpu", "0", "--nproc-per-node", "2", "--", "-c", "pass"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.count("\n") == 1 and err.startswith("error: --rank-cpu: a share of one core")


def _cpu_group(rank, world):
    return next(line.strip().split(":", 2)[2] for line in open("/proc/self/cgroup")
                if line.split(":")[1] in ("cpu", "cpu,cpuacct", "cpuacct,cpu", ""))


def test_a_capped_worlds_ranks_run_in_their_own_groups():
    """Where this host lets a CPU cgroup be made (root on cgroup v1, or a v2 root with cpu enabled)."""
    from harness.worlds import run_world

    try:
        remove_caps(make_caps(1, 0.5))
    except CpuShareError as e:
        pytest.skip(f"this host cannot make CPU cgroups: {e}")
    groups = run_world(_cpu_group, 2, rank_cpu=0.5, timeout=60)
    assert [g.rsplit("/", 1)[1] for g in groups] == ["rank0", "rank1"]
    assert groups[0].rsplit("/", 2)[1] == f"sp_plan_world_{os.getpid()}"
    assert not any(p.name == f"sp_plan_world_{os.getpid()}" for p in cpu_share.V1_ROOT.parent.glob("*/sp_plan_*"))
