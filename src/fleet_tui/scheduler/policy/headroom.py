"""Machine headroom readings for the admission gate: cores, load, memory, disk, agent memory.

The gate (``gate.py``) decides whether one more agent fits on this machine. It needs honest
numbers, and the obvious ones lie inside containers: ``/proc/meminfo`` shows the host's memory
while the cgroup may allow a tenth of it. So memory is the LOWER of MemAvailable and what the
process's own cgroup (v2 or v1, and every ancestor with a limit) still allows, counting
reclaimable page cache (``inactive_file``) as free, as the kernel does before it OOM-kills.

A reading that fails is ``None``, never a guessed number; the gate treats ``None`` as "not
enough" and says so. Everything here is synchronous and does file I/O or walks process trees:
the engine calls it through ``anyio.to_thread``. The roots are parameters so tests feed fake
``/proc`` and cgroup trees.

``trees_memory`` measures the running agents' process trees (one scan of /proc for all of
them) and ``MemoryModel`` learns, per coder, how much one agent needs (median of recent
measurements, an assumed figure until the first one).
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fleet_tui.scheduler.procs import proctree

GIB = 1024**3
MIB = 1024**2

# A cgroup limit at or above this is "no limit": v1 reports PAGE_COUNTER_MAX * page size
# (9223372036854771712 on x86-64) and some runtimes write other huge values.
_UNLIMITED = 1 << 60

_DEFAULT_PROC = Path("/proc")


@dataclass(frozen=True)
class Headroom:
    """One reading of this machine's spare capacity. ``None`` means the reading failed.

    ``cores``: online logical CPUs (0 if unknown); ``load_per_core``: 1-minute load average
    divided by ``cores`` (both system-wide, so the ratio is meaningful); ``mem_available``:
    bytes, the lower of MemAvailable and the cgroup allowance; ``disk_free``: bytes available to
    unprivileged users on the filesystem holding the given path; ``taken_at``: epoch seconds.
    ``mem_limited_by`` says which source was binding ("meminfo", "cgroup v2 /a/b",
    "cgroup v1 /a"); ``errors`` says why a reading is ``None``.
    """

    cores: int
    load_per_core: float | None
    mem_available: int | None
    disk_free: int | None
    taken_at: float
    mem_limited_by: str | None = None
    errors: tuple[str, ...] = ()


class _ReadingFailed(Exception):
    """A file that should be there and parse could not be read; the reading becomes None."""


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as e:
        raise _ReadingFailed(f"cannot read {path}: {e.strerror or e}") from e


def _read_int(path: Path) -> int:
    text = _read_text(path).strip()
    try:
        return int(text)
    except ValueError as e:
        raise _ReadingFailed(f"{path}: not a number: {text[:40]!r}") from e


def _stat_field(path: Path, *names: str) -> int:
    """The first of ``names`` found in a ``key value`` file such as memory.stat."""
    fields: dict[str, str] = {}
    for line in _read_text(path).splitlines():
        parts = line.split()
        if len(parts) == 2:
            fields[parts[0]] = parts[1]
    for name in names:
        if name in fields:
            try:
                return int(fields[name])
            except ValueError as e:
                raise _ReadingFailed(f"{path}: {name} is not a number") from e
    raise _ReadingFailed(f"{path}: no {' or '.join(names)}")


# --------------------------------------------------------------------------- cores and load


def _read_cores(proc_root: Path) -> int:
    try:
        text = (proc_root / "stat").read_text()
    except OSError:
        text = ""
    n = sum(1 for line in text.splitlines() if line.startswith("cpu") and line[3:4].isdigit())
    if n:
        return n
    if proc_root == _DEFAULT_PROC:
        return os.cpu_count() or 0
    return 0


def _read_load1(proc_root: Path) -> float:
    path = proc_root / "loadavg"
    if proc_root == _DEFAULT_PROC and not path.exists() and hasattr(os, "getloadavg"):
        return os.getloadavg()[0]  # not Linux: the platform's own call
    text = _read_text(path)
    try:
        return float(text.split()[0])
    except (IndexError, ValueError) as e:
        raise _ReadingFailed(f"{path}: unexpected content {text[:40]!r}") from e


# --------------------------------------------------------------------------- memory


def _read_meminfo_available(proc_root: Path) -> int:
    path = proc_root / "meminfo"
    if proc_root == _DEFAULT_PROC and not path.exists() and sys.platform != "linux":
        import psutil  # off Linux only: its import costs every engine's start ~13 ms here

        return int(psutil.virtual_memory().available)  # not Linux: psutil's own figure
    for line in _read_text(path).splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            try:
                value = int(parts[1])
            except (IndexError, ValueError) as e:
                raise _ReadingFailed(f"{path}: bad MemAvailable line {line!r}") from e
            unit = parts[2].lower() if len(parts) > 2 else "b"
            return value * 1024 if unit == "kb" else value
    raise _ReadingFailed(f"{path}: no MemAvailable (kernel older than 3.14?)")


def _own_cgroup_paths(proc_root: Path) -> tuple[str | None, str | None]:
    """(v2 path, v1 memory-controller path) of this process, from /proc/self/cgroup."""
    text = _read_text(proc_root / "self" / "cgroup")
    v2: str | None = None
    v1_memory: str | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier_id, controllers, path = parts
        if hier_id == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1_memory = path
    return v2, v1_memory


def _levels(base: Path, rel: str) -> list[Path]:
    """The cgroup directory of ``rel`` under ``base`` and each ancestor up to ``base``.

    Inside a container the path in /proc/self/cgroup is often the host's view while the mount
    shows the container's own cgroup as its root; when the full path is missing, ``base`` is
    that cgroup.
    """
    rel = rel.strip("/")
    start = base / rel if rel else base
    if not start.is_dir():
        start = base
    out = [start]
    cur = start
    while cur != base and base in cur.parents:
        cur = cur.parent
        out.append(cur)
    return out


def _level_name(base: Path, level: Path) -> str:
    rel = level.relative_to(base).as_posix()
    return "/" if rel == "." else "/" + rel


def _cgroup_v2_available(base: Path, rel: str) -> tuple[int, str] | None:
    best: tuple[int, str] | None = None
    for level in _levels(base, rel):
        max_path = level / "memory.max"
        if not max_path.exists():
            continue  # the root cgroup has no memory.max
        raw = _read_text(max_path).strip()
        if raw == "max":
            continue
        try:
            limit = int(raw)
        except ValueError as e:
            raise _ReadingFailed(f"{max_path}: not a number: {raw[:40]!r}") from e
        if limit >= _UNLIMITED:
            continue
        usage = _read_int(level / "memory.current")
        inactive = _stat_field(level / "memory.stat", "inactive_file")
        avail = max(0, limit - max(0, usage - inactive))
        if best is None or avail < best[0]:
            best = (avail, f"cgroup v2 {_level_name(base, level)}")
    return best


def _cgroup_v1_available(base: Path, rel: str) -> tuple[int, str] | None:
    best: tuple[int, str] | None = None
    for level in _levels(base, rel):
        limit_path = level / "memory.limit_in_bytes"
        if not limit_path.exists():
            continue
        limit = _read_int(limit_path)
        if limit >= _UNLIMITED or limit < 0:
            continue
        usage = _read_int(level / "memory.usage_in_bytes")
        inactive = _stat_field(level / "memory.stat", "total_inactive_file", "inactive_file")
        avail = max(0, limit - max(0, usage - inactive))
        if best is None or avail < best[0]:
            best = (avail, f"cgroup v1 {_level_name(base, level)}")
    return best


def _cgroup_available(proc_root: Path, cgroup_root: Path) -> tuple[int, str] | None:
    """What this process's cgroups still allow (bytes, which one), or None for "no limit"."""
    if not cgroup_root.is_dir():
        return None  # no cgroup filesystem (not Linux, or not mounted): nothing limits us there
    v2_path, v1_path = _own_cgroup_paths(proc_root)
    controllers = cgroup_root / "cgroup.controllers"
    if v2_path is not None and controllers.exists() and "memory" in _read_text(controllers).split():
        return _cgroup_v2_available(cgroup_root, v2_path)
    v1_base = cgroup_root / "memory"
    if v1_path is not None and v1_base.is_dir():
        return _cgroup_v1_available(v1_base, v1_path)
    return None  # no memory controller for this process


def read_mem_available(
    proc_root: Path = _DEFAULT_PROC, cgroup_root: Path = Path("/sys/fs/cgroup")
) -> tuple[int | None, str | None, str | None]:
    """(bytes available, binding source, error). Bytes is None exactly when error is set."""
    try:
        host = _read_meminfo_available(proc_root)
        cg = _cgroup_available(proc_root, cgroup_root)
    except _ReadingFailed as e:
        return None, None, f"memory: {e}"
    if cg is not None and cg[0] < host:
        return cg[0], cg[1], None
    return host, "meminfo", None


# --------------------------------------------------------------------------- disk


def read_disk_free(path: Path) -> int:
    """Bytes free for unprivileged users on the filesystem that holds (or would hold) ``path``."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent  # the directory may not exist yet; its filesystem does
    try:
        return int(shutil.disk_usage(probe).free)
    except OSError as e:
        raise _ReadingFailed(f"cannot stat {probe}: {e.strerror or e}") from e


# --------------------------------------------------------------------------- the reading


def read_headroom(
    path_for_disk: Path,
    proc_root: Path = _DEFAULT_PROC,
    cgroup_root: Path = Path("/sys/fs/cgroup"),
) -> Headroom:
    """Read cores, load per core, available memory and free disk now. Blocking: run in a thread."""
    errors: list[str] = []
    cores = _read_cores(proc_root)
    load_per_core: float | None = None
    try:
        load1 = _read_load1(proc_root)
        if cores > 0:
            load_per_core = load1 / cores
        else:
            errors.append("load: number of cores unknown")
    except _ReadingFailed as e:
        errors.append(f"load: {e}")
    mem, mem_by, mem_err = read_mem_available(proc_root, cgroup_root)
    if mem_err:
        errors.append(mem_err)
    disk: int | None = None
    try:
        disk = read_disk_free(path_for_disk)
    except _ReadingFailed as e:
        errors.append(f"disk: {e}")
    return Headroom(
        cores=cores,
        load_per_core=load_per_core,
        mem_available=mem,
        disk_free=disk,
        taken_at=time.time(),
        mem_limited_by=mem_by,
        errors=tuple(errors),
    )


# --------------------------------------------------------------------------- agent memory


_PAGE = os.sysconf("SC_PAGE_SIZE")  # /proc/PID/statm counts pages


def trees_memory(pids: Iterable[int]) -> list[int | None]:
    """The resident memory (RSS) of each of ``pids`` and all its descendants, in bytes, from one
    scan of /proc. RSS counts shared pages (libraries, the node binary) once per process, so a
    tree is over-counted a little, which errs on the safe side for admission.

    Why: the engine measures every running agent's tree on the same tick, and psutil's
    ``children`` scans the whole of /proc for each: 32 agents on a machine of 500 processes
    made 16,000 file reads a tick (5 % of a loud fleet's engine). Here the processes' parents
    are read once, then each tree's resident pages (``/proc/PID/statm``, as psutil reads them).
    None for a pid that is gone or a zombie, or whose tree cannot be read whole (another
    user's process: a partial sum would understate)."""
    pids = list(pids)
    if not pids:
        return []
    kids = proctree.children_map()
    return [_tree_rss(pid, kids) for pid in pids]


def _tree_rss(root: int, kids: Mapping[int, list[int]]) -> int | None:
    if proctree.proc_state(root) in (None, "Z", "X"):
        return None  # gone, or exited and not yet reaped: its memory is gone
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/statm", "rb") as fh:
                total += int(fh.read().split()[1]) * _PAGE
        except (FileNotFoundError, ProcessLookupError):
            if pid == root:
                return None
            continue  # a child exited between the scan and the read
        except (OSError, ValueError, IndexError):
            return None
        stack.extend(kids.get(pid, ()))
    return total


Source = Literal["measured", "assumed"]

# One agent's memory until we have measured one. The vendor CLIs are node programs (Codex's
# launcher starts a native binary, OpenCode a bun one) that grow to 1-2 GiB with their tools;
# the simulated agent and a shell command are small.
DEFAULT_AGENT_MEMORY: Mapping[str, int] = {
    "claude": int(1.5 * GIB),
    "codex": int(1.5 * GIB),
    "opencode": int(1.5 * GIB),
    "gemini": int(1.5 * GIB),
    "sim": 100 * MIB,
    "shell": 100 * MIB,
}
UNKNOWN_CODER_MEMORY = int(1.5 * GIB)  # a third-party coder: assume a heavy CLI


class MemoryModel:
    """Learns how much memory one agent of each coder takes.

    ``record`` keeps the last ``keep`` measurements per coder (the engine records each
    attempt's peak tree memory); ``estimate`` is their median, or an assumed figure while there
    is none. Thread-safe: measurements come from worker threads.
    """

    def __init__(
        self,
        keep: int = 20,
        defaults: Mapping[str, int] | None = None,
        unknown_default: int = UNKNOWN_CODER_MEMORY,
    ) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self._keep = keep
        self._defaults = dict(DEFAULT_AGENT_MEMORY if defaults is None else defaults)
        self._unknown_default = unknown_default
        self._samples: dict[str, deque[int]] = {}
        self._lock = threading.Lock()

    def record(self, coder: str, nbytes: int) -> None:
        """Add one measurement (bytes). Non-positive values are not measurements and are ignored."""
        if nbytes <= 0:
            return
        with self._lock:
            self._samples.setdefault(coder, deque(maxlen=self._keep)).append(int(nbytes))

    def samples(self, coder: str) -> tuple[int, ...]:
        with self._lock:
            return tuple(self._samples.get(coder, ()))

    def source(self, coder: str) -> Source:
        with self._lock:
            return "measured" if self._samples.get(coder) else "assumed"

    def estimate(self, coder: str) -> int:
        """Bytes one more ``coder`` agent is expected to take."""
        return self.estimate_with_source(coder)[0]

    def estimate_with_source(self, coder: str) -> tuple[int, Source]:
        with self._lock:
            got = self._samples.get(coder)
            if got:
                return int(_median(got)), "measured"
        return self._defaults.get(coder, self._unknown_default), "assumed"

    def explain(self, coder: str) -> str:
        """E.g. "1.5 GiB per claude agent (assumed)" or "0.9 GiB per codex agent (median of 7)"."""
        est, src = self.estimate_with_source(coder)
        if src == "assumed":
            return f"{format_gib(est)} per {coder} agent (assumed)"
        return f"{format_gib(est)} per {coder} agent (median of {len(self.samples(coder))})"


def format_gib(nbytes: int | float) -> str:
    """Bytes as GiB with one decimal: ``format_gib(1181116006) == "1.1 GiB"``."""
    return f"{nbytes / GIB:.1f} GiB"


def _median(values: Iterable[int]) -> float:
    """``statistics.median`` (the mean of the middle two of an even count), without importing
    ``statistics`` (4 ms of every engine's start for this one call)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
