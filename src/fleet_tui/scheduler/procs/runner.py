"""Supervises one attempt: starts (or adopts) its shim, tails the raw output, normalizes, publishes.

The runner reads ``stdout.jsonl`` from a stored offset and splits lines itself, so lines far
beyond 64 KiB work, a line over the configured cap becomes one ``oversized`` event (and is
skipped without being held in memory), invalid UTF-8 is replaced instead of crashing, and a last
line without a newline is still read when the agent ends. Events go to the store in batches
together with the new offset, so a restarted supervisor continues exactly where this one stopped.
It also watches the attempt: inactivity (stall), the wall-clock cap, context pressure, the task's
budget and a lost claim each stop the agent with a stated reason.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import anyio

from fleet_tui.coders.base import Coder, Normalizer
from fleet_tui.scheduler.model import Event, Outcome
from fleet_tui.scheduler.private import user_umask
from fleet_tui.scheduler.procs import shim as shimmod

SHIM_PATH = str(Path(shimmod.__file__).resolve())
#: the shim runs as an imported module (its bytecode is cached; a script is compiled every time)
#: from its own folder, without site-packages: python starts in milliseconds
SHIM_BOOT = (
    f"import sys; sys.path.insert(0, {str(Path(SHIM_PATH).parent)!r}); import shim; sys.exit(shim.main())"
)
READ_CHUNK = 256 * 1024  # per tick and runner: a backlog is read in slices, yielding between them
EVENT_TEXT_CAP = 256 * 1024


@dataclass(frozen=True)
class RunLimits:
    max_line_bytes: int = 64 << 20
    stall_s: float | None = 600.0
    timeout_s: float | None = 3600.0
    context_share: float | None = 0.85
    budget_usd: float | None = None
    grace_s: float = 5.0
    tick_s: float = 0.1  # 10 Hz: the cockpit repaints at 10-20 Hz; exits wake at once (pidfd)


@dataclass(frozen=True)
class AttemptResult:
    exit_code: int | None
    exit_reason: str  # exited | stopped | lease_expired | spawn_failed | crashed
    outcome: Outcome  # the coder's classification
    stop_reason: str | None  # why fleet-tui stopped it (killed_by_user, stalled, timeout, ...)
    stop_detail: str | None
    cost_usd: float | None
    tokens: int
    last_text: str | None


def shim_args(
    attempt_dir: Path, workdir: Path, argv: list[str], stdin_file: Path | None, grace_s: float, nice: int = 0
) -> list[str]:
    args = [
        "--dir",
        str(attempt_dir),
        "--cwd",
        str(workdir),
        "--grace",
        str(grace_s),
        "--lease-file",
        str(attempt_dir / "lease"),
    ]
    if stdin_file is not None:
        args += ["--stdin-file", str(stdin_file)]
    if nice > 0:
        args += ["--nice", str(nice)]
    args += ["--umask", oct(user_umask())]  # fleet-tui's files are private; the agent's are the user's
    return [*args, "--", *argv]


class ShimProcess(Protocol):
    """What the engine holds of a started shim: a ``subprocess.Popen`` or a ``ForkedShim``."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def kill(self) -> None: ...


class ForkedShim:
    """A shim forked by the pool's server (not a child of this process): watched through /proc."""

    def __init__(self, pid: int, start_ticks: int | None) -> None:
        self._pid = pid
        self.start_ticks = start_ticks
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        return self._pid

    def poll(self) -> int | None:
        """None while it runs; 0 once it ended (its server reaps it and keeps the status)."""
        if self.returncode is None and not shimmod.alive(self._pid, self.start_ticks):
            self.returncode = 0
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self._pid, signal.SIGKILL)
            except OSError:
                pass


class ShimPool:
    """A fork server for shims, started ahead of time (interpreter up, modules imported): it
    forks one shim per attempt, so starting an agent costs a pipe write and a fork (about a
    millisecond) instead of an interpreter start (ten or more, in CPU as much as in time). When
    this process dies, the pipe closes and the server exits; the shims it forked live on. When
    the server is gone before it takes a job, ``spawn_shim`` starts the shim directly."""

    ANSWER_S = 60.0  # a server that took a job and does not answer within this is given up

    def __init__(self, size: int = 1) -> None:
        self.size = size  # kept for callers; one server forks any number of shims
        self.server: subprocess.Popen[bytes] | None = None
        self.closed = False
        self._lock = threading.Lock()

    def fill(self) -> None:
        with self._lock:
            if self.closed or (self.server is not None and self.server.poll() is None):
                return
            self.server = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", SHIM_BOOT, "--zygote"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )

    def spawn(self, args: list[str], env: dict[str, str]) -> ForkedShim | None:
        """A shim forked by the server for these shim arguments, or None (start it directly)."""
        with self._lock:
            p = self.server
            if p is None or p.stdin is None or p.stdout is None or p.poll() is not None:
                return None
            try:
                p.stdin.write(shimmod.encode_job(args, env))
                p.stdin.flush()
            except OSError:  # it died before taking the whole job: it forked nothing
                p.kill()
                self.server = None
                return None
            # it took the job: a shim may run from now on, so a second one must never be started
            # for this attempt (both would live on one lease); no answer fails the attempt's start
            deadline = time.monotonic() + self.ANSWER_S
            line = b""
            while not line and time.monotonic() < deadline and p.poll() is None:
                ready, _, _ = select.select([p.stdout], [], [], 1.0)
                if ready:
                    line = p.stdout.readline()
            try:
                pid, ticks = (int(x) for x in line.split())
            except ValueError:
                p.kill()
                self.server = None
                raise OSError("the shim server took the job but did not answer") from None
            return ForkedShim(pid, ticks or None)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            p, self.server = self.server, None
        if p is None:
            return
        try:
            if p.stdin:
                p.stdin.close()
            p.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            p.kill()
        if p.stdout is not None:
            p.stdout.close()


def spawn_shim(
    attempt_dir: Path,
    workdir: Path,
    argv: list[str],
    env: dict[str, str],
    stdin_bytes: bytes | None,
    grace_s: float,
    lease_deadline: float,
    pool: ShimPool | None = None,
    nice: int = 0,
) -> ShimProcess:
    """Start the shim for an attempt in its own session (forked by the pool's server when there
    is one); it survives this process."""
    attempt_dir.mkdir(parents=True, exist_ok=True)
    stdin_file = None
    if stdin_bytes is not None:
        stdin_file = attempt_dir / "stdin.txt"
        stdin_file.write_bytes(stdin_bytes)
    write_lease(attempt_dir, lease_deadline)
    args = shim_args(attempt_dir, workdir, argv, stdin_file, grace_s, nice)
    forked = pool.spawn(args, env) if pool is not None else None
    if forked is not None:
        return forked
    log = open(attempt_dir / "shim.log", "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", SHIM_BOOT, *args],
            cwd=str(workdir),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        log.close()
        if pool is not None:
            pool.fill()  # the server died: a new one for the next attempt


def write_lease(attempt_dir: Path, deadline: float) -> None:
    """Renew an attempt's lease file (atomically); on a full disk, in place (no new blocks)."""
    text = f"{deadline:.3f}\n"
    tmp = attempt_dir / "lease.tmp"
    try:
        tmp.write_text(text)
        os.replace(tmp, attempt_dir / "lease")
    except OSError:
        tmp.unlink(missing_ok=True)
        fd = os.open(attempt_dir / "lease", os.O_WRONLY)  # raises when there is none yet
        try:
            os.pwrite(fd, text.encode(), 0)
        finally:
            os.close(fd)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class LineSplitter:
    """Incremental line splitting over a growing file with a hard cap per line."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.buf = bytearray()
        self.skipping = 0  # bytes of an oversized line skipped so far (0: not skipping)

    def feed(self, chunk: bytes) -> list[bytes | int]:
        """Complete lines (bytes) and oversized markers (int = the line's size)."""
        out: list[bytes | int] = []
        start = 0
        while start < len(chunk):
            nl = chunk.find(b"\n", start)
            piece = chunk[start:] if nl < 0 else chunk[start:nl]
            if self.skipping:
                self.skipping += len(piece)
            elif len(self.buf) + len(piece) > self.cap:
                self.skipping = len(self.buf) + len(piece)
                self.buf = bytearray()
            else:
                self.buf += piece
            if nl < 0:
                break
            if self.skipping:
                out.append(self.skipping)
                self.skipping = 0
            else:
                out.append(bytes(self.buf))
                self.buf = bytearray()
            start = nl + 1
        return out

    def pending(self) -> int:
        return len(self.buf) + self.skipping

    def flush(self) -> list[bytes | int]:
        if self.skipping:
            n, self.skipping = self.skipping, 0
            return [n]
        if self.buf:
            line, self.buf = bytes(self.buf), bytearray()
            return [line]
        return []


class AttemptRunner:
    """Tails one attempt's output until its shim ends, then returns an AttemptResult."""

    def __init__(
        self,
        *,
        task_id: str,
        attempt: int,
        attempt_dir: Path,
        coder: Coder,
        limits: RunLimits,
        offset: int = 0,
        next_seq: int = 0,
        popen: ShimProcess | None = None,
        shim_pid: int | None = None,
        shim_ticks: int | None = None,
        sink: Callable[[list[Event], int], Any],
        clock: Callable[[], float] = time.time,
        started_at: float | None = None,
        is_asking: Callable[[], bool] = lambda: False,
    ) -> None:
        self.task_id = task_id
        self.attempt = attempt
        self.dir = attempt_dir
        self.limits = limits
        self.offset = offset
        self.read_pos = offset
        self.more = False  # more output is waiting than one slice
        self.popen = popen
        self.shim_pid = shim_pid if shim_pid is not None else (popen.pid if popen else None)
        self.shim_ticks = shim_ticks
        self.sink = sink
        self.clock = clock
        self.is_asking = is_asking
        self.normalizer: Normalizer = coder.normalizer(task_id, attempt, next_seq, attempt_dir)
        self.next_seq = next_seq
        self.splitter = LineSplitter(limits.max_line_bytes)
        self.err_splitter = LineSplitter(64 * 1024)
        self.err_offset = 0
        self.started_at = started_at if started_at is not None else clock()
        self.last_output = clock()
        self.stop_reason: str | None = None
        self.stop_detail: str | None = None
        self._stop_sent = False
        #: set by ``stop``: what runs after the agent (verifiers, reviewers) stops too
        self.stop_event = threading.Event()
        self.tokens = 0
        self.cost_usd: float | None = None
        self.context_tokens: int | None = None
        self.context_window: int | None = None
        self.last_text: str | None = None
        self.paused = False
        self.open_questions: set[str] = set()  # ask_human tool calls without a result yet
        self.asked = False
        self.finished = False  # the agent wrote its final result: no handoff, it is done working

    # -- control ------------------------------------------------------------------------------
    def stop(self, reason: str, detail: str | None = None) -> None:
        """Ask the shim to stop the agent (TERM, grace, KILL, descendants)."""
        if self.stop_reason is None:
            self.stop_reason, self.stop_detail = reason, detail
        self.stop_event.set()
        if self._stop_sent:
            return
        self._stop_sent = True
        if self.paused:
            self.signal_agent(signal.SIGCONT)
        if self.shim_pid is not None and shimmod.alive(self.shim_pid, self.shim_ticks):
            try:
                os.kill(self.shim_pid, signal.SIGTERM)
            except OSError:
                pass

    def agent_pid(self) -> int | None:
        info = read_json(self.dir / "shim.json")
        if not info or not info.get("agent_pid"):
            return None
        pid = int(info["agent_pid"])
        return pid if shimmod.alive(pid, info.get("agent_start_ticks")) else None

    def signal_agent(self, sig: int) -> bool:
        """Send ``sig`` to the agent's whole process group (pause/resume)."""
        pid = self.agent_pid()
        if pid is None:
            return False
        try:
            os.killpg(pid, sig)
        except OSError:
            return False
        if sig == signal.SIGSTOP:
            self.paused = True
        elif sig == signal.SIGCONT:
            self.paused = False
            self.last_output = self.clock()
        return True

    # -- the loop -----------------------------------------------------------------------------
    def shim_alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        if self.shim_pid is None:
            return False
        return shimmod.alive(self.shim_pid, self.shim_ticks)

    def _decode(self, raw: bytes) -> str:
        return raw.decode("utf-8", errors="replace")

    def _feed(self, items: list[bytes | int], ts: float) -> list[Event]:
        out: list[Event] = []
        for item in items:
            if isinstance(item, int):
                out.append(
                    Event(
                        task_id=self.task_id,
                        attempt=self.attempt,
                        seq=self.normalizer_seq(),
                        ts=ts,
                        kind="oversized",
                        text=f"line of {item} bytes over the {self.limits.max_line_bytes}-byte cap "
                        "skipped (kept in stdout.jsonl)",
                    )
                )
                continue
            try:
                evs = self.normalizer.feed(self._decode(item), ts)
            except Exception as e:  # a coder bug must not kill the supervisor
                evs = [
                    Event(
                        task_id=self.task_id,
                        attempt=self.attempt,
                        seq=self.normalizer_seq(),
                        ts=ts,
                        kind="error",
                        text=f"normalizer failed on a line: {e!r}",
                    )
                ]
            out.extend(evs)
        return out

    def normalizer_seq(self) -> int:
        """Take a sequence number from the normalizer's counter (shared numbering)."""
        n = getattr(self.normalizer, "seq", None)
        if isinstance(n, int):
            self.normalizer.seq = n + 1  # type: ignore[attr-defined]
            return n
        self.next_seq += 1
        return self.next_seq - 1

    def _read(self, path: Path, offset: int) -> bytes:
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                return fh.read(READ_CHUNK)
        except OSError:
            return b""

    def _cap_text(self, e: Event) -> Event:
        if e.text is not None and len(e.text) > EVENT_TEXT_CAP:
            return replace(
                e,
                text=e.text[:EVENT_TEXT_CAP] + f"\n[... {len(e.text) - EVENT_TEXT_CAP} more "
                "characters in stdout.jsonl]",
                raw=None,
            )
        return e

    def poll_output(self, final: bool = False) -> list[Event]:
        """Read the next slice of new output (``self.more`` says whether more is waiting); with
        ``final`` (the agent has ended) a last line without a newline is flushed once all is read."""
        ts = self.clock()
        events: list[Event] = []
        chunk = self._read(self.dir / "stdout.jsonl", self.read_pos)
        if chunk:
            self.read_pos += len(chunk)
            self.last_output = ts
            events.extend(self._feed(self.splitter.feed(chunk), ts))
        self.more = len(chunk) == READ_CHUNK
        if final and not self.more:
            events.extend(self._feed(self.splitter.flush(), ts))
        # the stored offset is the start of the current partial line: a restart re-reads it whole
        self.offset = self.read_pos - self.splitter.pending()
        err = self._read(self.dir / "stderr.log", self.err_offset)
        if err:
            self.err_offset += len(err)
            self.last_output = ts
            self.more = self.more or len(err) == READ_CHUNK
            flush = final and len(err) < READ_CHUNK
            lines = self.err_splitter.feed(err) + (self.err_splitter.flush() if flush else [])
            for item in lines:
                text = self._decode(item) if isinstance(item, bytes) else f"[stderr line of {item} bytes]"
                if text.strip():
                    events.append(
                        Event(
                            task_id=self.task_id,
                            attempt=self.attempt,
                            seq=self.normalizer_seq(),
                            ts=ts,
                            kind="stderr",
                            text=text,
                        )
                    )
        try:
            events.extend(self.normalizer.poll(ts))
        except Exception:
            pass
        events = [self._cap_text(e) for e in events]
        for e in events:
            self._account(e)
        return events

    def _account(self, e: Event) -> None:
        if e.kind == "tool_call" and e.tool and "ask_human" in e.tool:
            self.open_questions.add(e.tool_id or "")
            self.asked = True
        elif e.kind == "tool_result" and (e.tool_id or "") in self.open_questions:
            self.open_questions.discard(e.tool_id or "")
        if e.usage is not None:
            self.tokens += e.usage.total
        if e.cost_usd is not None:
            self.cost_usd = e.cost_usd if e.kind == "result" else (self.cost_usd or 0.0) + e.cost_usd
        if e.context_tokens is not None:
            self.context_tokens = e.context_tokens
        if e.context_window is not None:
            self.context_window = e.context_window
        if e.kind == "text" and e.text:
            self.last_text = e.text
        if e.kind == "result":
            self.finished = True

    def check_limits(self, now: float) -> None:
        lim = self.limits
        if self.stop_reason is not None or self.paused:
            return
        if self.open_questions or self.is_asking():
            self.last_output = now  # waiting on a person does not count towards a stall
        if lim.stall_s is not None and now - self.last_output > lim.stall_s:
            self.stop("stalled", f"no output for {lim.stall_s / 60:g} min")
        elif lim.timeout_s is not None and now - self.started_at > lim.timeout_s:
            self.stop("timeout", f"ran longer than {lim.timeout_s / 60:g} min")
        elif (
            lim.context_share is not None
            and not self.finished
            and self.context_tokens
            and self.context_window
            and self.context_tokens >= lim.context_share * self.context_window
        ):
            self.stop(
                "context_pressure",
                f"context {self.context_tokens}/{self.context_window} tokens >= {lim.context_share:.0%}",
            )
        elif lim.budget_usd is not None and self.cost_usd is not None and self.cost_usd > lim.budget_usd:
            self.stop("over_budget", f"cost ${self.cost_usd:.2f} > budget ${lim.budget_usd:.2f}")

    async def run(self) -> AttemptResult:
        pidfd: int | None = None
        if self.shim_pid is not None:
            try:  # wakes the moment the shim exits instead of on the next tick
                pidfd = os.pidfd_open(self.shim_pid)
            except (AttributeError, OSError):
                pidfd = None
        try:
            while True:
                alive = self.shim_alive()
                events = self.poll_output(final=not alive)
                ended = not alive and not self.more
                if events or ended:
                    await self.sink(events, self.offset)
                if ended:
                    break
                self.check_limits(self.clock())
                if self.more:  # a backlog: the next slice right away, after letting others run
                    await anyio.sleep(0)
                    continue
                if pidfd is not None:
                    with anyio.move_on_after(self.limits.tick_s):
                        await anyio.wait_readable(pidfd)
                else:
                    await anyio.sleep(self.limits.tick_s)
        finally:
            if pidfd is not None:
                os.close(pidfd)
        info = read_json(self.dir / "exit.json")
        if info is None:
            exit_code, reason = None, "crashed"
        else:
            exit_code, reason = info.get("exit_code"), str(info.get("reason") or "exited")
        try:
            outcome = self.normalizer.outcome(exit_code)
        except Exception as e:
            outcome = Outcome(kind="failure", detail=f"could not classify the outcome: {e!r}")
        return AttemptResult(
            exit_code=exit_code,
            exit_reason=reason,
            outcome=outcome,
            stop_reason=self.stop_reason,
            stop_detail=self.stop_detail,
            cost_usd=self.cost_usd if self.cost_usd is not None else outcome.cost_usd,
            tokens=self.tokens,
            last_text=self.last_text,
        )
