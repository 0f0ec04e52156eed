"""Process trees through /proc: who a process's descendants are, whether a pid is still the same
process, and how to stop a whole tree without hitting a reused pid.

Why it exists: the shim (an agent's host), the keeper (a helper command's host) and ``owned``
(reaping what a killed keeper or shim left behind) all walk and kill process trees. They do it
here, one way: every victim is a (pid, start ticks) pair and is signalled only while that pid
still has that start time.

Standard library only and cheap to import (no ``signal`` module, which imports ``enum``; no
fleet-tui imports): the shim imports it as a bare module from this folder (``import proctree``),
everything else as ``fleet_tui.scheduler.procs.proctree``.
"""

from __future__ import annotations

import os
import time

try:  # the C module: `signal` itself imports enum, which costs more than the interpreter's startup
    import _signal as signal
except ImportError:  # pragma: no cover - not CPython
    import signal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

#: a process as (pid, start ticks): the pair names one process even after its pid is reused
Proc = tuple[int, "int | None"]

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


#: the process's start time (clock ticks since boot) among ``_stat_fields``: field 22 of the stat
_START = 19


def read_proc(path: str) -> bytes:
    """The first 4 KiB of a /proc file, read with the bare system calls (a process's ``stat``
    fits, and /proc answers it in one read). ``open()`` makes a buffered file object and asks
    four more questions (two ``fstat``, an ``ioctl``, an ``lseek``) before reading, then reads
    again for the end: 15 of a shim's 90 system calls went to its three reads of /proc."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _stat_fields(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (state is field 0, ppid 1, pgrp 2)."""
    try:
        data = read_proc(f"/proc/{pid}/stat")
    except OSError:
        return None
    # the command name may contain spaces and parentheses: split after the last ')'
    return data[data.rfind(b")") + 2 :].split()


def proc_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    rest = _stat_fields(pid)
    try:
        return int(rest[_START]) if rest is not None else None
    except (IndexError, ValueError):
        return None


def proc_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` (R, S, Z, ...), None when there is no such process."""
    rest = _stat_fields(pid)
    return rest[0].decode() if rest else None


def alive(pid: int, ticks: int | None) -> bool:
    """True when ``pid`` runs and is the same process (same start time), not a zombie (one read
    of its stat: a runner asks for every batch of its agent's output)."""
    rest = _stat_fields(pid)
    if rest is None or len(rest) <= _START or rest[0] in (b"Z", b"X"):
        return False
    return ticks is None or rest[_START] == b"%d" % ticks  # a plain decimal


def _all_stats() -> list[tuple[int, list[bytes]]]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            rest = _stat_fields(name)
            if rest is not None:
                out.append((int(name), rest))
    return out


def children_map() -> dict[int, list[int]]:
    """Every process's children, from one scan of /proc."""
    kids: dict[int, list[int]] = {}
    for pid, rest in _all_stats():
        try:
            kids.setdefault(int(rest[1]), []).append(pid)
        except (IndexError, ValueError):
            continue
    return kids


def descendants(root: int, *more: int) -> list[Proc]:
    """Every descendant of ``root`` (and of the ``more`` roots) as (pid, start ticks)."""
    kids = children_map()
    out: list[Proc] = []
    stack = [k for r in (root, *more) if r > 1 for k in kids.get(r, [])]
    while stack:
        pid = stack.pop()
        out.append((pid, proc_start_ticks(pid)))
        stack.extend(kids.get(pid, []))
    return out


def group_members(pgid: int, since_ticks: int | None = None) -> list[Proc]:
    """The processes of process group ``pgid`` (started at or after ``since_ticks`` when given:
    members older than the group's leader belong to an earlier group that reused the id)."""
    out: list[Proc] = []
    for pid, rest in _all_stats():
        try:
            pgrp, start = int(rest[2]), int(rest[_START])
        except (IndexError, ValueError):
            continue
        if pgrp == pgid and (since_ticks is None or start >= since_ticks):
            out.append((pid, start))
    return out


def reap_children(seen: Callable[[int, int], None] | None = None) -> None:
    """Collect every child of this process that has exited (never blocks); ``seen(pid, status)``
    hears of each."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if seen is not None:
            seen(pid, status)


def nice_at_least(nice: int) -> None:
    """Run at niceness ``nice`` or above it (never lower: that takes a privilege). A target, not
    a step: a process started from the cockpit's engine thread, which runs niced itself
    (app/hosted.py), starts above 0, and a step would nice it twice."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if current < nice:
        os.nice(nice - current)


def set_autogroup_nice(pid: int, nice: int) -> bool:
    """Give the session of ``pid`` (any process in it) the niceness ``nice`` as a scheduling group.

    Why: where the kernel groups processes by session (autogroup: on by default in most
    distributions' kernels), the CPU is first shared fairly between sessions, and a process's
    own niceness only weighs against the processes of its session. The agents run outside the
    cockpit's session (a fleet's in the shims' fork server's, one session for all of them), so
    their niceness alone did nothing against the cockpit (32 agents in sessions of their own took
    32 shares to the cockpit's one); their session's group niceness does. Any user may raise it
    for their own processes. False where there are no such groups (no file) or it cannot be
    set."""
    try:
        fd = os.open(f"/proc/{pid}/autogroup", os.O_WRONLY)
    except OSError:
        return False
    try:
        os.write(fd, str(nice).encode())
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def has_children(pid: int) -> bool:
    """Cheap check through /proc/PID/task/*/children; falls back to a full scan."""
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            if read_proc(f"/proc/{pid}/task/{tid}/children").strip():  # any child at all
                return True
        return False
    except OSError:
        return bool(descendants(pid))


def tree(root: int, *, group: int | None = None, since_ticks: int | None = None) -> list[Proc]:
    """The live processes of ``root``'s tree: its descendants, plus the members of process group
    ``group`` (see :func:`group_members`, the leader included) when given; never this process."""
    found = dict(descendants(root)) if root > 1 else {}  # never all of init's (or pid 0's)
    if group is not None:
        found.update(group_members(group, since_ticks))
    found.pop(os.getpid(), None)
    return [(p, t) for p, t in found.items() if alive(p, t)]


def signal_all(procs: list[Proc], sig: int) -> int:
    """Send ``sig`` to each process that is still the one named; returns how many got it."""
    sent = 0
    for pid, ticks in procs:
        if alive(pid, ticks):
            try:
                os.kill(pid, sig)
                sent += 1
            except OSError:
                pass
    return sent


def _killpg(pgid: int | None, sig: int) -> None:
    if pgid is not None:
        try:
            os.killpg(pgid, sig)
        except OSError:
            pass


def kill_tree(
    find: Callable[[], list[Proc]],
    grace_s: float,
    *,
    pgid: int | None = None,
    reap: Callable[[], object] = lambda: None,
) -> int:
    """Stop a tree: SIGTERM process group ``pgid`` and every process ``find()`` names, wait up to
    ``grace_s`` for them to go, then SIGKILL the group and sweep ``find()`` until nothing is left
    (a tree may fork while it is being killed). With ``grace_s <= 0`` only SIGKILL is sent.
    ``reap`` collects zombies of our own children (their pids stay taken until then). Returns how
    many processes got a SIGKILL."""
    if grace_s > 0:
        _killpg(pgid, signal.SIGTERM)
        signal_all(find(), signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            reap()
            if not find():
                break
            time.sleep(0.05)
    _killpg(pgid, signal.SIGKILL)
    killed = 0
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        reap()
        found = find()
        if not found:
            break
        killed += signal_all(found, signal.SIGKILL)
        time.sleep(0.02)  # a SIGKILL is delivered asynchronously: look again once it landed
    reap()
    return killed


#: libc's prctl, once looked up (``preload_prctl``); None: looked up on first use
_PRCTL: Any = None


def preload_prctl() -> None:
    """Import ctypes and find prctl now: a fork server calls this once, so the shims it forks
    inherit it instead of each paying ~2 ms of CPU for the import."""
    global _PRCTL
    if _PRCTL is None:
        import ctypes

        try:
            _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            _PRCTL = False


def _prctl(option: int, value: int) -> None:
    # ctypes only when needed: the hosts need it, readers of /proc do not pay for it
    preload_prctl()
    if _PRCTL:
        _PRCTL(option, value, 0, 0, 0)


def become_subreaper() -> None:
    """Make this process a child subreaper: descendants that escape with ``setsid`` or a double
    fork are re-parented to it instead of init, so :func:`descendants` still finds them."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel for ``sig`` when the thread that started this process dies."""
    _prctl(PR_SET_PDEATHSIG, int(sig))
