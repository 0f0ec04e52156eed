"""Headroom readings: fake /proc and cgroup v1/v2 trees, real readings, agent tree memory."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from fleet_tui.scheduler.policy import headroom
from fleet_tui.scheduler.policy.headroom import (
    GIB,
    MIB,
    Headroom,
    MemoryModel,
    format_gib,
    read_headroom,
    read_mem_available,
    trees_memory,
)

pytestmark = pytest.mark.timeout(60)

V1_UNLIMITED = 9223372036854771712


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_proc(
    root: Path,
    *,
    mem_available: int | None = 10 * GIB,
    load1: str | None = "3.00",
    cpus: int = 4,
    cgroup: str = "0::/\n",
) -> Path:
    proc = root / "proc"
    if mem_available is not None:
        write(
            proc / "meminfo",
            f"MemTotal:       {32 * GIB // 1024} kB\nMemFree:  1 kB\n"
            f"MemAvailable:   {mem_available // 1024} kB\n",
        )
    if load1 is not None:
        write(proc / "loadavg", f"{load1} 0.50 0.25 1/150 7914\n")
    lines = ["cpu  1 2 3 4"] + [f"cpu{i} 1 2 3 4" for i in range(cpus)] + ["intr 1", "ctxt 2"]
    write(proc / "stat", "\n".join(lines) + "\n")
    write(proc / "self" / "cgroup", cgroup)
    return proc


def v2_level(d: Path, *, max_: str | None, current: int = 0, inactive: int = 0) -> None:
    d.mkdir(parents=True, exist_ok=True)
    if max_ is not None:
        write(d / "memory.max", max_ + "\n")
    write(d / "memory.current", f"{current}\n")
    write(d / "memory.stat", f"anon 1\nfile 2\ninactive_file {inactive}\nactive_file 3\n")


def v1_level(d: Path, *, limit: int, usage: int = 0, inactive: int = 0, own_inactive: int = 0) -> None:
    d.mkdir(parents=True, exist_ok=True)
    write(d / "memory.limit_in_bytes", f"{limit}\n")
    write(d / "memory.usage_in_bytes", f"{usage}\n")
    write(
        d / "memory.stat",
        f"cache 1\ninactive_file {own_inactive}\nhierarchical_memory_limit {limit}\n"
        f"total_inactive_file {inactive}\n",
    )


def v2_root(tmp_path: Path) -> Path:
    cg = tmp_path / "cgroup"
    write(cg / "cgroup.controllers", "cpuset cpu io memory pids\n")
    return cg


# --------------------------------------------------------------------------- cores, load, disk


def test_load_per_core_from_fake_proc(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, load1="3.00", cpus=4)
    hr = read_headroom(tmp_path, proc_root=proc, cgroup_root=tmp_path / "none")
    assert isinstance(hr, Headroom)
    assert hr.cores == 4
    assert hr.load_per_core == pytest.approx(0.75)
    assert hr.mem_available == 10 * GIB
    assert hr.mem_limited_by == "meminfo"
    assert hr.disk_free is not None and hr.disk_free > 0
    assert hr.errors == ()


@pytest.mark.parametrize("load1", [None, "garbage"])
def test_unreadable_load_is_none(tmp_path: Path, load1: str | None) -> None:
    proc = fake_proc(tmp_path, load1=load1)
    hr = read_headroom(tmp_path, proc_root=proc, cgroup_root=tmp_path / "none")
    assert hr.load_per_core is None
    assert any(e.startswith("load:") for e in hr.errors)
    assert hr.mem_available == 10 * GIB  # other readings are unaffected


def test_unknown_cores_gives_unknown_load(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, cpus=0)
    hr = read_headroom(tmp_path, proc_root=proc, cgroup_root=tmp_path / "none")
    assert hr.cores == 0
    assert hr.load_per_core is None


def test_missing_meminfo_is_none_not_a_guess(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, mem_available=None)
    hr = read_headroom(tmp_path, proc_root=proc, cgroup_root=tmp_path / "none")
    assert hr.mem_available is None
    assert hr.mem_limited_by is None
    assert any("meminfo" in e for e in hr.errors)


def test_disk_free_of_a_path_not_yet_created(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path)
    hr = read_headroom(tmp_path / "not" / "yet", proc_root=proc, cgroup_root=tmp_path / "none")
    assert hr.disk_free is not None and hr.disk_free > 0


# --------------------------------------------------------------------------- cgroup v2


def test_v2_limit_counts_inactive_file_as_free(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, cgroup="0::/a/b\n")
    cg = v2_root(tmp_path)
    v2_level(cg / "a", max_="max")
    v2_level(cg / "a" / "b", max_=str(4 * GIB), current=3 * GIB, inactive=1 * GIB)
    mem, by, err = read_mem_available(proc, cg)
    assert (mem, by, err) == (2 * GIB, "cgroup v2 /a/b", None)


def test_v2_max_means_no_limit(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, cgroup="0::/a\n")
    cg = v2_root(tmp_path)
    v2_level(cg / "a", max_="max", current=30 * GIB)
    assert read_mem_available(proc, cg) == (10 * GIB, "meminfo", None)


def test_v2_huge_limit_means_no_limit(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, cgroup="0::/a\n")
    cg = v2_root(tmp_path)
    v2_level(cg / "a", max_=str(V1_UNLIMITED), current=30 * GIB)
    assert read_mem_available(proc, cg) == (10 * GIB, "meminfo", None)


def test_v2_tighter_ancestor_wins(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, cgroup="0::/a/b\n")
    cg = v2_root(tmp_path)
    v2_level(cg / "a", max_=str(3 * GIB), current=2 * GIB + GIB // 2)
    v2_level(cg / "a" / "b", max_=str(4 * GIB), current=1 * GIB)
    mem, by, _ = read_mem_available(proc, cg)
    assert mem == GIB // 2
    assert by == "cgroup v2 /a"


def test_meminfo_lower_than_cgroup_wins(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, mem_available=1 * GIB, cgroup="0::/a\n")
    cg = v2_root(tmp_path)
    v2_level(cg / "a", max_=str(8 * GIB), current=1 * GIB)
    assert read_mem_available(proc, cg) == (1 * GIB, "meminfo", None)


def test_v2_over_limit_is_zero_not_negative(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, cgroup="0::/a\n")
    cg = v2_root(tmp_path)
    v2_level(cg / "a", max_=str(1 * GIB), current=2 * GIB, inactive=0)
    assert read_mem_available(proc, cg)[0] == 0


def test_v2_container_view_uses_mount_root(tmp_path: Path) -> None:
    """/proc/self/cgroup names the host's path; the mount shows our own cgroup as its root."""
    proc = fake_proc(tmp_path, cgroup="0::/system.slice/docker-abc.scope\n")
    cg = v2_root(tmp_path)
    v2_level(cg, max_=str(4 * GIB), current=1 * GIB, inactive=0)
    assert read_mem_available(proc, cg) == (3 * GIB, "cgroup v2 /", None)


def test_v2_unreadable_usage_with_a_limit_is_none(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, cgroup="0::/a\n")
    cg = v2_root(tmp_path)
    v2_level(cg / "a", max_=str(4 * GIB), current=1 * GIB)
    (cg / "a" / "memory.current").unlink()
    mem, by, err = read_mem_available(proc, cg)
    assert mem is None and by is None
    assert err is not None and "memory.current" in err
    hr = read_headroom(tmp_path, proc_root=proc, cgroup_root=cg)
    assert hr.mem_available is None
    assert any("memory.current" in e for e in hr.errors)


def test_v2_stat_without_inactive_file_is_none(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, cgroup="0::/a\n")
    cg = v2_root(tmp_path)
    v2_level(cg / "a", max_=str(4 * GIB), current=1 * GIB)
    write(cg / "a" / "memory.stat", "anon 5\n")
    assert read_mem_available(proc, cg)[0] is None


def test_garbage_limit_is_none(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, cgroup="0::/a\n")
    cg = v2_root(tmp_path)
    v2_level(cg / "a", max_="lots", current=1 * GIB)
    mem, _, err = read_mem_available(proc, cg)
    assert mem is None and err is not None


def test_unreadable_self_cgroup_is_none(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path)
    (proc / "self" / "cgroup").unlink()
    cg = v2_root(tmp_path)
    assert read_mem_available(proc, cg)[0] is None


# --------------------------------------------------------------------------- cgroup v1


HYBRID = "4:memory:/x/y\n3:cpu,cpuacct:/\n0::/\n"


def v1_root(tmp_path: Path) -> Path:
    cg = tmp_path / "cgroup"
    (cg / "unified").mkdir(parents=True)
    write(cg / "unified" / "cgroup.controllers", "")  # hybrid: v2 without the memory controller
    return cg


def test_v1_limit_uses_total_inactive_file(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, cgroup=HYBRID)
    cg = v1_root(tmp_path)
    mem_root = cg / "memory"
    v1_level(mem_root, limit=V1_UNLIMITED, usage=20 * GIB)
    v1_level(mem_root / "x", limit=V1_UNLIMITED)
    v1_level(mem_root / "x" / "y", limit=6 * GIB, usage=5 * GIB, inactive=2 * GIB, own_inactive=1 * GIB)
    assert read_mem_available(proc, cg) == (3 * GIB, "cgroup v1 /x/y", None)


def test_v1_unlimited_everywhere_is_meminfo(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, cgroup=HYBRID)
    cg = v1_root(tmp_path)
    v1_level(cg / "memory", limit=V1_UNLIMITED, usage=20 * GIB)
    v1_level(cg / "memory" / "x" / "y", limit=V1_UNLIMITED, usage=1 * GIB)
    assert read_mem_available(proc, cg) == (10 * GIB, "meminfo", None)


def test_v1_parent_limit_applies(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, cgroup=HYBRID)
    cg = v1_root(tmp_path)
    v1_level(cg / "memory" / "x", limit=2 * GIB, usage=1 * GIB + GIB // 2, inactive=GIB // 2)
    v1_level(cg / "memory" / "x" / "y", limit=V1_UNLIMITED, usage=1 * GIB)
    assert read_mem_available(proc, cg) == (1 * GIB, "cgroup v1 /x", None)


def test_v1_unreadable_usage_is_none(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, cgroup=HYBRID)
    cg = v1_root(tmp_path)
    v1_level(cg / "memory" / "x" / "y", limit=4 * GIB, usage=1 * GIB)
    (cg / "memory" / "x" / "y" / "memory.usage_in_bytes").unlink()
    hr = read_headroom(tmp_path, proc_root=proc, cgroup_root=cg)
    assert hr.mem_available is None
    assert any("memory.usage_in_bytes" in e for e in hr.errors)


def test_no_memory_controller_is_meminfo(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, cgroup="3:cpu:/\n0::/\n")
    cg = v1_root(tmp_path)
    assert read_mem_available(proc, cg) == (10 * GIB, "meminfo", None)


# --------------------------------------------------------------------------- this machine


def test_real_readings_are_sane(tmp_path: Path) -> None:
    hr = read_headroom(tmp_path)
    assert hr.errors == ()
    assert hr.cores >= 1
    assert hr.load_per_core is not None and 0 <= hr.load_per_core < 1000
    assert hr.mem_available is not None
    assert 0 < hr.mem_available <= psutil.virtual_memory().total
    assert hr.disk_free is not None and hr.disk_free > 0
    assert hr.mem_limited_by is not None
    assert hr.taken_at > 0


# --------------------------------------------------------------------------- trees_memory

PARENT = """
import subprocess, sys
child = subprocess.Popen(
    [sys.executable, "-c", "import sys, time; print('up', flush=True); time.sleep(60)"],
    stdout=subprocess.PIPE, text=True,
)
assert child.stdout is not None and child.stdout.readline().strip() == "up"
print(child.pid, flush=True)
sys.stdin.read()  # until the test closes stdin
child.kill()
child.wait()
"""


def test_every_agents_tree_is_measured_from_one_scan_of_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    """``trees_memory``: a tree's RSS with its descendants, for several trees at once from one
    scan of /proc; None for a pid that is gone."""
    scans: list[int] = []
    scan = headroom.proctree.children_map

    def counted() -> dict[int, list[int]]:
        scans.append(1)
        return scan()

    monkeypatch.setattr(headroom.proctree, "children_map", counted)
    proc = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        child_pid = int(proc.stdout.readline())
        parent, child = psutil.Process(proc.pid), psutil.Process(child_pid)
        low = parent.memory_info().rss + child.memory_info().rss
        whole, gone, lone = trees_memory([proc.pid, dead.pid, child_pid])
        high = parent.memory_info().rss + child.memory_info().rss
        assert scans == [1]
        assert whole is not None and 0.9 * low <= whole <= 1.1 * high  # both processes, once each
        assert gone is None
        assert lone is not None and lone < whole
        assert trees_memory([]) == [] and scans == [1]
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=30)
    assert trees_memory([proc.pid]) == [None]  # reaped: gone


def test_tree_memory_of_missing_pid_is_none() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    assert trees_memory([dead.pid]) == [None]


def test_tree_memory_of_an_unreaped_zombie_is_none() -> None:
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        proc = psutil.Process(zombie.pid)
        while proc.status() != psutil.STATUS_ZOMBIE:  # exited; Popen has not reaped it yet
            time.sleep(0.01)
        assert trees_memory([zombie.pid]) == [None]
    finally:
        zombie.wait(timeout=30)


def test_tree_memory_of_self() -> None:
    (got,) = trees_memory([os.getpid()])
    assert got is not None and got >= psutil.Process().memory_info().rss // 2


# --------------------------------------------------------------------------- MemoryModel


def test_memory_model_assumed_defaults() -> None:
    m = MemoryModel()
    assert m.estimate("claude") == int(1.5 * GIB)
    assert m.estimate("codex") == int(1.5 * GIB)
    assert m.estimate("sim") == 100 * MIB
    assert m.estimate("shell") == 100 * MIB
    assert m.estimate("some-plugin") == int(1.5 * GIB)  # unknown coder: assume heavy
    assert m.source("claude") == "assumed"
    assert m.explain("claude") == "1.5 GiB per claude agent (assumed)"


def test_memory_model_median_of_measured() -> None:
    m = MemoryModel()
    for v in (1 * GIB, 3 * GIB, 2 * GIB):
        m.record("claude", v)
    assert m.estimate("claude") == 2 * GIB
    assert m.estimate_with_source("claude") == (2 * GIB, "measured")
    assert m.explain("claude") == "2.0 GiB per claude agent (median of 3)"
    assert m.source("codex") == "assumed"  # per coder


def test_memory_model_even_count_and_window() -> None:
    m = MemoryModel(keep=3)
    for v in (100, 200, 300, 400):
        m.record("sim", v)
    assert m.samples("sim") == (200, 300, 400)  # only the last 3 are kept
    assert m.estimate("sim") == 300
    m.record("sim", 500)
    assert m.estimate("sim") == 400
    m2 = MemoryModel()
    m2.record("x", 100)
    m2.record("x", 201)
    assert m2.estimate("x") == 150  # median of an even count, as an int


def test_memory_model_ignores_non_measurements() -> None:
    m = MemoryModel(defaults={"sim": 7})
    m.record("sim", 0)
    m.record("sim", -5)
    assert m.estimate_with_source("sim") == (7, "assumed")
    with pytest.raises(ValueError):
        MemoryModel(keep=0)


def test_format_gib() -> None:
    assert format_gib(int(1.1 * GIB)) == "1.1 GiB"
    assert format_gib(2 * GIB) == "2.0 GiB"
    assert format_gib(0) == "0.0 GiB"
