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

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio

from fleet_tui.coders.base import Coder, Normalizer
from fleet_tui.scheduler.model import Event, Outcome
from fleet_tui.scheduler.procs import attemptdir, invoke, proctree
from fleet_tui.scheduler.procs.attemptdir import ExitReason
from fleet_tui.scheduler.procs.attemptdir import read_json as read_json
from fleet_tui.scheduler.procs.attemptdir import write_lease as write_lease
from fleet_tui.scheduler.procs.invoke import SHIM_BOOT as SHIM_BOOT
from fleet_tui.scheduler.procs.invoke import SHIM_PATH as SHIM_PATH
from fleet_tui.scheduler.procs.invoke import Invocation
from fleet_tui.scheduler.procs.invoke import ShimPool as ShimPool
from fleet_tui.scheduler.procs.invoke import ShimProcess as ShimProcess
from fleet_tui.scheduler.procs.invoke import shim_args as shim_args

# the ``x as x`` imports are re-exports for the modules that import them from here; their homes
# are attemptdir (the attempt's files) and invoke (starting a shim)
READ_CHUNK = 256 * 1024  # per tick and runner: a backlog is read in slices, yielding between them
EVENT_TEXT_CAP = 256 * 1024


@dataclass(frozen=True)
class RunLimits:
    """The limits a runner holds an attempt to: line size, stall, timeout, context share."""

    max_line_bytes: int = 64 << 20
    stall_s: float | None = 600.0
    timeout_s: float | None = 3600.0
    context_share: float | None = 0.85
    budget_usd: float | None = None
    grace_s: float = 5.0
    tick_s: float = 0.1  # 10 Hz: the cockpit repaints at 10-20 Hz; exits wake at once (pidfd)


@dataclass(frozen=True)
class AttemptResult:
    """How an attempt ended, as its runner saw it: exit, output, and why it was stopped."""

    exit_code: int | None
    exit_reason: ExitReason
    outcome: Outcome  # the coder's classification
    stop_reason: str | None  # why fleet-tui stopped it (killed_by_user, stalled, timeout, ...)
    stop_detail: str | None
    cost_usd: float | None
    tokens: int
    last_text: str | None


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
    stdin_file: Path | None = None,
) -> ShimProcess:
    """Start the shim for an attempt away from this process's session (``invoke.start``); it
    survives this process. ``stdin_file``: a file that already holds ``stdin_bytes``."""
    inv = Invocation(tuple(argv), env, stdin_bytes, workdir, attempt_dir, stdin_file)
    return invoke.start(inv, grace_s=grace_s, lease_deadline=lease_deadline, pool=pool, nice=nice)


def _drained(fd: int, got: bytearray) -> bool:
    """What the pipe ``fd`` (non-blocking) holds, added to ``got``; True once every writer
    closed it."""
    try:
        while chunk := os.read(fd, 4096):
            got += chunk
        return True
    except BlockingIOError:
        return False


def _exit_from(record: bytes) -> attemptdir.ExitInfo | None:
    """The exit record a pooled shim sent down its done pipe; None for none (a shim that died
    without one, or whose record went by the file only)."""
    return attemptdir.exit_info(attemptdir.json_object(record))


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
        #: the agent's output is all read: what the sink takes now is the attempt's last
        self.ended = False
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
        self._files: dict[str, int] = {}  # the output files, opened once each (see _read)
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
        #: sees each tick's new events while the agent runs (a follow-up waiting for the agent's
        #: next turn boundary: humans/followup.py TurnStop)
        self.watch: Callable[[AttemptRunner, list[Event], float], None] | None = None

    # -- control ------------------------------------------------------------------------------
    def judged(self) -> None:
        """The stop that ended the agent was judged (its verdict sends the work to verification):
        forget it, so only a stop that comes later cuts the verifiers short."""
        self.stop_reason = self.stop_detail = None
        self.stop_event.clear()

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
        if self.shim_pid is not None and proctree.alive(self.shim_pid, self.shim_ticks):
            try:
                os.kill(self.shim_pid, signal.SIGTERM)
            except OSError:
                pass

    def agent_pid(self) -> int | None:
        info = attemptdir.read_shim(self.dir)
        if info is None or not info.agent_pid:
            return None
        pid = info.agent_pid
        return pid if proctree.alive(pid, info.agent_start_ticks) else None

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
        return proctree.alive(self.shim_pid, self.shim_ticks)

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

    def _read(self, name: str, offset: int) -> bytes:
        """The next slice of one of the attempt's output files, kept open while it runs (not
        opened again on every read); nothing while the shim has not made it yet."""
        try:
            fd = self._files.get(name)
            if fd is None:
                fd = self._files[name] = os.open(self.dir / name, os.O_RDONLY | os.O_CLOEXEC)
            return os.pread(fd, READ_CHUNK, offset)
        except OSError:
            return b""

    def close_files(self) -> None:
        for fd in self._files.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._files.clear()

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
        chunk = self._read(attemptdir.STDOUT, self.read_pos)
        if chunk:
            self.read_pos += len(chunk)
            self.last_output = ts
            events.extend(self._feed(self.splitter.feed(chunk), ts))
        self.more = len(chunk) == READ_CHUNK
        if final and not self.more:
            events.extend(self._feed(self.splitter.flush(), ts))
        # the stored offset is the start of the current partial line: a restart re-reads it whole
        self.offset = self.read_pos - self.splitter.pending()
        err = self._read(attemptdir.STDERR, self.err_offset)
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
        # a shim from the pool sends its exit record down its done pipe and closes it once the
        # record is written: that is its end, heard before the process is torn down (its pid
        # says so a millisecond later), with the record (no exit.json to read)
        done: int | None = getattr(self.popen, "done_fd", None)
        finished = False  # the done pipe closed: the exit record is written (or the shim died)
        record = bytearray()  # what came down the done pipe: the exit record, or nothing
        if done is not None:
            self.popen.done_fd = None  # type: ignore[union-attr]  # the runner's from now on
            os.set_blocking(done, False)
        elif self.shim_pid is not None:
            try:  # wakes the moment the shim exits instead of on the next tick
                pidfd = os.pidfd_open(self.shim_pid)
            except (AttributeError, OSError):
                pidfd = None
        try:
            while True:
                alive = not finished if done is not None else self.shim_alive()
                events = self.poll_output(final=not alive)
                if self.watch is not None:
                    self.watch(self, events, self.clock())
                ended = self.ended = not alive and not self.more
                if events or ended:
                    await self.sink(events, self.offset)
                if ended:
                    break
                self.check_limits(self.clock())
                if self.more:  # a backlog: the next slice right away, after letting others run
                    await anyio.sleep(0)
                    continue
                if done is not None:
                    with anyio.move_on_after(self.limits.tick_s):
                        await anyio.wait_readable(done)
                    finished = _drained(done, record)
                elif pidfd is not None:
                    with anyio.move_on_after(self.limits.tick_s):
                        await anyio.wait_readable(pidfd)
                else:
                    await anyio.sleep(self.limits.tick_s)
        finally:
            self.close_files()
            for fd in (pidfd, done):
                if fd is not None:
                    os.close(fd)
        info = _exit_from(bytes(record)) or attemptdir.read_exit(self.dir)
        if info is None:
            exit_code, reason = None, ExitReason.CRASHED
        else:
            exit_code, reason = info.exit_code, info.reason
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
