"""Who works in a worktree: an on-disk marker every engine honours, whatever store it uses.

Several engines may share one fleet home while each uses its own store (the default SQLite file
and a PostgreSQL URL, say). A worktree's task is then known to only one of them, and another
engine's start-up sweep would take the worktree for an orphan and remove it under a live agent.
So each attempt that runs in a worktree records, in ``<home>/worktree-owners/<name>.json``, its
store, task and attempt folder, and the engine that marked it; the attempt's lease file (renewed
by its engine while the agent lives, see runner.write_lease) says whether it is still live. The
mark is written before the worktree is made: until the agent's first lease, while the worktree
is created and its setup command runs, the attempt is live as long as the engine that marked it
lives. A sweep keeps every worktree with a live attempt, whichever store knows it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from fleet_tui.scheduler.procs import proctree
from fleet_tui.scheduler.procs.attemptdir import read_json, read_lease


def _path(home: Path, name: str) -> Path:
    return Path(home) / "worktree-owners" / f"{name}.json"


def mark(home: Path, name: str, store_url: str, task_id: str, attempt_dir: Path) -> None:
    """Record the attempt about to run in worktree ``name`` (atomically replaced), by this process."""
    p = _path(home, name)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    pid = os.getpid()
    data = {
        "store": store_url,
        "task_id": task_id,
        "attempt_dir": str(attempt_dir),
        "at": time.time(),
        "pid": pid,
        "ticks": proctree.proc_start_ticks(pid),
    }
    tmp.write_text(json.dumps(data))
    os.replace(tmp, p)


def live_attempt(home: Path, name: str, now: float | None = None) -> str | None:
    """The store of a live attempt in worktree ``name`` (its lease not yet expired; before its
    first lease, its engine still running), else None."""
    data = read_json(_path(home, name))
    if not data or not data.get("attempt_dir"):
        return None
    deadline = read_lease(Path(data["attempt_dir"]))
    if deadline is None:  # being prepared: live while the engine that marked it runs
        pid, ticks = data.get("pid"), data.get("ticks")
        if not isinstance(pid, int) or not proctree.alive(pid, ticks if isinstance(ticks, int) else None):
            return None
    elif deadline <= (time.time() if now is None else now):
        return None
    return str(data.get("store") or "?")


def forget(home: Path, name: str) -> None:
    _path(home, name).unlink(missing_ok=True)
