"""A CPU host's memory as discovery reads it: /proc/meminfo, lowered by a cgroup limit only where the limit is below
it (cgroup v1 writes a huge number for "no limit")."""
from __future__ import annotations

from sp_plan.profiles.discover.sysfs import read_cpu

MEM_KB = 16000000


def _root(tmp_path, v1_limit: str):
    """A root with /proc/meminfo and a cgroup v1 memory limit file."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text(f"MemTotal:       {MEM_KB} kB\n")
    p = tmp_path / "sys/fs/cgroup/memory/memory.limit_in_bytes"
    p.parent.mkdir(parents=True)
    p.write_text(v1_limit + "\n")
    return tmp_path


def test_an_unlimited_cgroup_v1_leaves_the_hosts_ram(tmp_path):
    """cgroup v1 without a limit reads 9223372036854771712 (2^63 rounded down to a page): the memory is MemTotal."""
    cpu = read_cpu(_root(tmp_path, "9223372036854771712"))
    assert cpu.memory_bytes == MEM_KB * 1024 and not cpu.notes

