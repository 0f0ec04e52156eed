"""The attempt directory on disk, at the level the shim writes it: file names, record keys, the
exit-reason values and the atomic writers.

Why a module of its own: the shim must start in a few milliseconds, so it imports nothing that
costs more than the interpreter's own startup (``json``, ``re``, ``enum``, ``dataclasses`` all
do). This module is that cheap part of the attempt-directory contract; ``attemptdir`` adds the
typed side (``ShimInfo``, ``ExitInfo``, ``ExitReason``, readers) on top of it for everyone else.

Standard library only, no fleet-tui imports: the shim imports it as a bare module from this
folder (``import attemptfiles``), the engine as ``fleet_tui.scheduler.procs.attemptfiles``.
"""

from __future__ import annotations

import os
import time

# -- the files of an attempt directory (tasks/<id>/attempts/<n>/, reviews/<n>/) --------------------
#: the shim's pid and start time, then its agent's: what adoption and reaping go by
SHIM_JSON = "shim.json"
#: the agent's exit status and why it ended, written once when it ended (atomically)
EXIT_JSON = "exit.json"
#: blank space set aside for exit.json as the agent starts (a full disk cannot take it)
EXIT_RESERVED = "exit.json.reserved"
#: the agent's raw stdout, as the vendor wrote it
STDOUT = "stdout.jsonl"
#: the agent's raw stderr
STDERR = "stderr.log"
#: what the agent reads on stdin (absent: /dev/null)
STDIN = "stdin.txt"
#: the shim's own output (a shim that cannot start says why here)
SHIM_LOG = "shim.log"
#: the deadline (unix time) until which a supervisor vouches for the agent; the shim's fence
LEASE = "lease"
#: the prompt the agent was given
PROMPT = "prompt.txt"

# -- why an agent ended (exit.json "reason"; ``crashed`` is what a missing exit.json means) -----
EXITED = "exited"  # on its own
STOPPED = "stopped"  # the shim was asked to stop it (SIGTERM)
LEASE_EXPIRED = "lease_expired"  # no supervisor renewed the lease: the shim fenced itself
SPAWN_FAILED = "spawn_failed"  # it never started (exit code 127, "error" says why)
CRASHED = "crashed"  # the shim died without an exit record

EXIT_RESERVE = 4096  # bytes set aside for exit.json while the disk still has room


def shim_record(
    pid: int,
    start_ticks: int | None,
    started_at: float,
    agent_pid: int | None = None,
    agent_start_ticks: int | None = None,
) -> dict[str, object]:
    """The content of ``shim.json`` (the agent's fields only once it started)."""
    rec: dict[str, object] = {"pid": pid, "start_ticks": start_ticks, "started_at": started_at}
    if agent_pid is not None:
        rec.update(agent_pid=agent_pid, agent_start_ticks=agent_start_ticks)
    return rec


def exit_record(
    exit_code: int | None,
    signal: int | None,
    reason: str,
    ended_at: float,
    killed_descendants: int | None = None,
    error: str | None = None,
) -> dict[str, object]:
    """The content of ``exit.json``."""
    rec: dict[str, object] = {"exit_code": exit_code, "signal": signal, "reason": reason}
    if error is not None:
        rec["error"] = error
    if killed_descendants is not None:
        rec["killed_descendants"] = killed_descendants
    rec["ended_at"] = ended_at
    return rec


def _json_value(v: object) -> str:
    if v is None:
        return "null"
    if v is True or v is False:
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    out = ['"']
    for ch in str(v):
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def dump_json(data: dict[str, object]) -> str:
    """JSON for a flat dict of scalars (the json module is too slow to import here)."""
    return "{" + ", ".join(f"{_json_value(k)}: {_json_value(v)}" for k, v in data.items()) + "}"


def write_into(path: str, data: bytes) -> None:
    """``path`` made (or rewritten) to hold ``data``, with the bare system calls. An attempt's
    files already exist, empty (a spare folder comes with them: spares.py): they are written
    into, and cut short only when they held more. ``open()`` asks a new file four questions
    before the write, and ``O_TRUNC`` on an existing file cost ext4 here 20-25 us even when it
    was empty (prompt.txt: 60-80 us with ``Path.write_text``, 11-12 us so)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        held = os.fstat(fd).st_size
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if held > len(data):
            os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def write_json(path: str, data: dict[str, object]) -> None:
    """Replace ``path`` with ``data`` atomically (a reader sees the old or the new, never half)."""
    tmp = f"{path}.tmp"
    write_into(tmp, dump_json(data).encode())
    os.replace(tmp, path)


def reserve_exit(dir: str) -> None:
    """Set aside the space of ``exit.json`` (``exit.json.reserved``) as the agent starts: an
    agent that fills the disk cannot make its own exit status unwritable. A space set aside
    already (a spare attempt folder comes with it: spares.py) is kept as it is."""
    path = os.path.join(dir, EXIT_RESERVED)
    try:
        if os.stat(path).st_size >= EXIT_RESERVE:
            return
    except OSError:
        pass
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            try:  # the blocks allocated at once, without waiting for the disk (no fsync)
                os.posix_fallocate(fd, 0, EXIT_RESERVE)
            except OSError:  # a file system without it: written out, which allocates them
                os.write(fd, b" " * EXIT_RESERVE)
                os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        try:
            os.unlink(path)
        except OSError:
            pass


def write_exit(dir: str, data: dict[str, object]) -> bytes:
    """Write ``exit.json``: into the reserved space when there is one (no new blocks needed),
    else as a new file; on a full disk the record is kept in memory and written as soon as there
    is room — the shim stays until then, so the runner waits for it instead of calling the
    attempt a crash.

    Not flushed to the disk (no fsync): its reader is a supervisor on this machine, which reads
    it from the page cache, and a power loss before it was read ends as any lost attempt does
    (the task is run again). An fsync here sat between every agent's end and its supervisor
    noticing it: 2-3 ms on a quiet disk, far more on a throttled one.

    Returns the record as written (``Shim.record_exit`` sends the same bytes down its pipe)."""
    text = dump_json(data).encode()
    path = os.path.join(dir, EXIT_JSON)
    reserved = os.path.join(dir, EXIT_RESERVED)
    delay = 0.2
    while True:
        try:
            if len(text) <= EXIT_RESERVE and os.path.exists(reserved):
                fd = os.open(reserved, os.O_WRONLY)
                try:
                    os.pwrite(fd, text + b" " * (EXIT_RESERVE - len(text)), 0)
                finally:
                    os.close(fd)
                os.replace(reserved, path)
            else:
                write_json(path, data)
            return text
        except OSError:
            if not os.path.isdir(dir):
                return text  # the attempt's folder is gone: nobody will read it
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def read_deadline(path: str) -> float | None:
    """The deadline in a lease file; None when it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as fh:
            return float(fh.read().strip() or "nan")
    except (OSError, ValueError):
        return None


def create_lease(path: str, deadline: float) -> bool:
    """An attempt's first lease, written straight into a new file (no temporary file and
    rename): a reader then finds no file, an empty one or the deadline, and reads the first two
    alike (no lease). False when there is one already (its supervisor renewed it first) or it
    cannot be made (no folder, no room)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return False
    try:
        os.write(fd, f"{deadline:.3f}\n".encode())
    finally:
        os.close(fd)
    return True


def first_lease(path: str, deadline: float) -> bool:
    """The shim's first lease: written into the empty ``lease`` a spare attempt folder comes
    with (spares.py; no new file), else made as ``create_lease`` makes it. Never over a lease
    its supervisor wrote first: that one replaces the file whole (``write_deadline``), so this
    either finds it there and leaves it, or writes into the empty file it replaced."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        return create_lease(path, deadline)
    except OSError:
        return False
    try:
        if os.fstat(fd).st_size:
            return False
        os.pwrite(fd, f"{deadline:.3f}\n".encode(), 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def write_deadline(dir: str, deadline: float) -> None:
    """Renew an attempt's lease (atomically); on a full disk, in place (no new blocks needed).
    Raises OSError when neither works (no lease file yet and no room for one)."""
    text = f"{deadline:.3f}\n"
    path = os.path.join(dir, LEASE)
    if create_lease(path, deadline):
        return
    tmp = path + ".tmp"
    try:
        write_into(tmp, text.encode())
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        fd = os.open(path, os.O_WRONLY)  # raises when there is none yet
        try:
            os.pwrite(fd, text.encode(), 0)
        finally:
            os.close(fd)
