"""The attempt-directory contract, typed: what the shim leaves in an attempt's folder and how the
engine reads it back.

Why it exists: the supervisor, adoption, reaping, the CLI and reviews all read the files a shim
writes. They go through here instead of building paths from literals and reading raw dict keys:
``read_shim`` / ``read_exit`` give frozen ``ShimInfo`` / ``ExitInfo`` values (None for a missing
or garbled file, which is what a shim killed mid-write or a full disk leaves), and
``ExitReason`` is the vocabulary of why an agent ended, with the values stored on disk.

The file names and the writers live in ``attemptfiles`` (the part the shim itself imports, which
must stay cheap); they are re-exported here so one import is enough. Standard library only, no
fleet-tui imports: importable as ``fleet_tui.scheduler.procs.attemptdir`` or bare from this folder.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

try:
    from . import attemptfiles as files
except ImportError:  # run as a bare module from this folder (no package)
    import attemptfiles as files  # type: ignore[no-redef]

SHIM_JSON = files.SHIM_JSON
EXIT_JSON = files.EXIT_JSON
EXIT_RESERVED = files.EXIT_RESERVED
STDOUT = files.STDOUT
STDERR = files.STDERR
STDIN = files.STDIN
SHIM_LOG = files.SHIM_LOG
LEASE = files.LEASE
PROMPT = files.PROMPT


class ExitReason(StrEnum):
    """Why an agent ended (``exit.json``'s ``reason``; ``CRASHED`` when there is no exit.json)."""

    EXITED = files.EXITED
    STOPPED = files.STOPPED
    LEASE_EXPIRED = files.LEASE_EXPIRED
    SPAWN_FAILED = files.SPAWN_FAILED
    CRASHED = files.CRASHED


@dataclass(frozen=True)
class ShimInfo:
    """``shim.json``: the shim, and its agent once started (pid + start ticks name a process)."""

    pid: int
    start_ticks: int | None = None
    started_at: float | None = None
    agent_pid: int | None = None
    agent_start_ticks: int | None = None


@dataclass(frozen=True)
class ExitInfo:
    """``exit.json``: how the agent ended."""

    exit_code: int | None
    reason: ExitReason = ExitReason.EXITED
    signal: int | None = None
    killed_descendants: int | None = None
    ended_at: float | None = None
    error: str | None = None  # why it could not start (spawn_failed)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``; None when the file is missing, unreadable or not an object."""
    try:
        return json_object(Path(path).read_bytes())
    except OSError:
        return None


def json_object(text: str | bytes) -> dict[str, Any] | None:
    """``text`` as a JSON object; None when it is empty, not JSON or not an object."""
    try:
        data = json.loads(text) if text else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _int(v: object) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            return None
    return None


def _float(v: object) -> float | None:
    if isinstance(v, int | float) and not isinstance(v, bool):
        return float(v)
    return None


def read_shim(d: Path) -> ShimInfo | None:
    """The attempt's ``shim.json``; None when missing, garbled or without a shim pid."""
    data = read_json(Path(d) / SHIM_JSON)
    pid = _int(data.get("pid")) if data else None
    if data is None or not pid:
        return None
    return ShimInfo(
        pid=pid,
        start_ticks=_int(data.get("start_ticks")),
        started_at=_float(data.get("started_at")),
        agent_pid=_int(data.get("agent_pid")) or None,
        agent_start_ticks=_int(data.get("agent_start_ticks")),
    )


def write_shim(d: Path, info: ShimInfo) -> None:
    """Write ``shim.json`` atomically."""
    rec = files.shim_record(
        info.pid, info.start_ticks, info.started_at or 0.0, info.agent_pid, info.agent_start_ticks
    )
    files.write_json(os.path.join(d, SHIM_JSON), rec)


def read_exit(d: Path) -> ExitInfo | None:
    """The attempt's ``exit.json``; None when missing or garbled (the shim never finished)."""
    return exit_info(read_json(Path(d) / EXIT_JSON))


def exit_info(data: dict[str, Any] | None) -> ExitInfo | None:
    """An exit record's content (``exit.json``'s, or what a pooled shim's done pipe carried) as
    an ``ExitInfo``; None for none."""
    if data is None:
        return None
    try:
        reason = ExitReason(str(data.get("reason") or ExitReason.EXITED))
    except ValueError:
        reason = ExitReason.EXITED  # a reason from a newer shim: it did end
    error = data.get("error")
    return ExitInfo(
        exit_code=_int(data.get("exit_code")),
        reason=reason,
        signal=_int(data.get("signal")),
        killed_descendants=_int(data.get("killed_descendants")),
        ended_at=_float(data.get("ended_at")),
        error=str(error) if error is not None else None,
    )


def has_exit(d: Path) -> bool:
    """True when the shim wrote its exit record (whatever it holds)."""
    return (Path(d) / EXIT_JSON).exists()


def write_exit(d: Path, info: ExitInfo) -> None:
    """Write ``exit.json`` durably (into the reserved space when there is one)."""
    rec = files.exit_record(
        info.exit_code,
        info.signal,
        str(info.reason),
        info.ended_at or 0.0,
        info.killed_descendants,
        info.error,
    )
    files.write_exit(str(d), rec)


def read_lease(d: Path) -> float | None:
    """The lease deadline (unix time) of an attempt; None when missing, empty or unreadable."""
    deadline = files.read_deadline(os.path.join(d, LEASE))
    return None if deadline is None or math.isnan(deadline) else deadline


def write_lease(d: Path, deadline: float) -> None:
    """Renew an attempt's lease file (atomically); on a full disk, in place (no new blocks)."""
    files.write_deadline(str(d), deadline)
