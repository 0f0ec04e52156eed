"""Is this process part of an agent's attempt? Used to refuse ``fleet-tui answer`` from agents.

Why: an agent runs as the same user as the person supervising it, so it can run ``fleet-tui
answer`` too, and its answer would be recorded as a person's (it could answer its own question,
or another task's). Only a person answers: the command refuses to run inside an attempt's
process tree. That tree is recognised from outside the agent's control:

- an ancestor is a fleet-tui shim (the per-attempt host process; a child subreaper, so even a
  process that double-forked or called ``setsid`` stays its descendant), recognised by its
  command line;
- or an ancestor (or this process) was started with ``FLEET_TASK_ID`` and ``FLEET_ATTEMPT`` in
  its environment, which the engine sets for every agent; ``/proc/<pid>/environ`` keeps the
  environment a process was started with, so unsetting the variables later does not hide it.

Not covered, and documented as such: an agent that starts a process outside its tree by other
means (``ssh localhost``, ``systemd-run``, ``at``) or that writes the store directly.
"""

from __future__ import annotations

import os
from pathlib import Path

#: text in a shim's command line (invoke.SHIM_BOOT and the module name)
SHIM_MARKERS = (b"import shim; sys.exit(shim.main())", b"fleet_tui.scheduler.procs.shim")
ATTEMPT_VARS = (b"FLEET_TASK_ID=", b"FLEET_ATTEMPT=")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _ppid(pid: int, proc: Path) -> int | None:
    stat = _read(proc / str(pid) / "stat")
    if not stat:
        return None
    try:  # the command name may contain spaces and parentheses: split after the last ')'
        return int(stat[stat.rindex(b")") + 2 :].split()[1])
    except (ValueError, IndexError):
        return None


def inside_attempt(pid: int | None = None, proc: Path = Path("/proc")) -> str | None:
    """Why ``pid`` (this process) belongs to an agent's attempt, or None when it does not."""
    cur: int | None = os.getpid() if pid is None else pid
    seen: set[int] = set()
    while cur is not None and cur > 1 and cur not in seen:
        seen.add(cur)
        cmdline = _read(proc / str(cur) / "cmdline")
        if any(m in cmdline for m in SHIM_MARKERS):
            return f"it runs under a fleet-tui agent shim (pid {cur})"
        env = _read(proc / str(cur) / "environ").split(b"\0")
        if all(any(v.startswith(var) and len(v) > len(var) for v in env) for var in ATTEMPT_VARS):
            task = next(v for v in env if v.startswith(b"FLEET_TASK_ID=")).split(b"=", 1)[1]
            return f"it runs inside task {task.decode(errors='replace')}'s agent (pid {cur})"
        cur = _ppid(cur, proc)
    return None
