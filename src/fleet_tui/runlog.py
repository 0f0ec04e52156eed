"""What a headless ``fleet-tui run`` says while it works, and how it ends.

A service or a CI job has no cockpit: the run's output is its only window. So each task state
change, each change of a waiting reason, each question and each engine notice (a config edit
rejected, a sweep, a failed write) is one line on stdout — or one JSON object per line with
``--json``, for scripts — and ``--quiet`` turns it off. The last line says what the run actually
did, and ``run --until-idle`` ends with an exit code a script can act on:

- ``0``: nothing is left to do or wait for (every task done or cancelled, or left to another
  machine: running there, or needing tags this host lacks);
- ``3`` (``EXIT_NEEDS_PERSON``): something needs a person — a task is ``needs_human`` or paused,
  the fleet is paused, or a queued task waits on a parked dependency;
- ``4`` (``EXIT_STILL_WAITING``): ``--max-wait`` was given and a longer time-based wait is left.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

import anyio

from fleet_tui.scheduler.humans.inbox import sanitize_for_display
from fleet_tui.scheduler.model import EngineEvent, Notice, Question, QuestionChanged, Task, TaskChanged
from fleet_tui.scheduler.onloop import SWITCH_INTERVAL
from fleet_tui.scheduler.planner import same_wait
from fleet_tui.scheduler.states import TaskStatus

EXIT_NEEDS_PERSON = 3
EXIT_STILL_WAITING = 4

_FINISHED = (TaskStatus.DONE, TaskStatus.CANCELLED)


def _clean(text: str | None) -> str:
    return sanitize_for_display(text or "", one_line=True)


class RunPrinter:
    """Turns engine event batches into one line per change (text or JSON)."""

    #: waiting reasons printed at the start, and in one batch of changes, at most (then a count)
    PRIMED_WAITS = 10

    def __init__(self, out: TextIO | None = None, as_json: bool = False, host: str | None = None) -> None:
        self.out = out or sys.stdout
        self.as_json = as_json
        #: this engine's host: a task that runs on another one (a store shared between machines)
        #: is named with its host, ``p1 (beta): running -> done``
        self.host = host
        self.seen: dict[str, tuple[str, str | None, int]] = {}
        self.waiting: dict[str, str | None] = {}
        self.questions: set[str] = set()
        self.names: dict[str, str] = {}
        self._unflushed = False
        #: the output went away (``feed``): nothing more is printed
        self.gone = False
        #: waiting lines this batch may still print, and those it left out (``_waits``)
        self._waits_left, self._waits_skipped = self.PRIMED_WAITS, 0

    def prime(self, tasks: Sequence[Task]) -> None:
        """Remember the state before the run, so only changes are printed; and say what already
        waits, and why (at most ``PRIMED_WAITS`` of them): a run on a queue that cannot start
        (a full disk, a gate, a dependency) used to print nothing at all until it was stopped."""
        self._waits_left, self._waits_skipped = self.PRIMED_WAITS, 0
        for t in tasks:
            self.seen[t.id] = (t.status.value, t.reason, t.attempt)
            self.names[t.id] = t.name
            if t.status == TaskStatus.QUEUED and t.waiting:
                self.waiting[t.id] = t.waiting
                self._waits(t)
        self._end_batch()

    def _emit(self, kind: str, text: str, **fields: Any) -> None:
        now = time.time()
        if self.as_json:
            print(json.dumps({"ts": round(now, 3), "kind": kind, **fields, "text": text}), file=self.out)
        else:
            print(f"{time.strftime('%H:%M:%S', time.localtime(now))} {text}", file=self.out)
        self._unflushed = True

    def feed(self, batch: Sequence[EngineEvent]) -> None:
        """Print a batch of the engine's events: its lines leave at once (a service's log, a
        pipe), with one write for the whole batch rather than one per line. A reader that went
        away (a terminal that hung up, a closed pipe) ends the printing, not the engine: it
        still has its agents to stop or hand over."""
        if self.gone:
            return
        try:
            self._feed(batch)
        except OSError:
            self.gone = True

    def _feed(self, batch: Sequence[EngineEvent]) -> None:
        self._waits_left, self._waits_skipped = self.PRIMED_WAITS, 0
        for ev in batch:
            match ev:
                case TaskChanged(task):
                    self._task(task)
                case QuestionChanged(q):
                    self._question(q)
                case Notice(text) if text:
                    self._emit("notice", f"notice: {_clean(text)}")
        self._end_batch()

    def _end_batch(self) -> None:
        """The count of the waiting lines left out, then one write for the whole batch."""
        if self._waits_skipped:
            n = self._waits_skipped
            self._emit("notice", f"notice: {n} more task(s) wait (`fleet-tui plan` says why for each)")
        if self._unflushed:
            self._unflushed = False
            self.out.flush()

    def _question(self, q: Question) -> None:
        if q.id in self.questions:
            return
        self.questions.add(q.id)
        name = self.names.get(q.task_id, q.task_id)
        opts = f" [{' | '.join(_clean(o) for o in q.options)}]" if q.options else ""
        self._emit(
            "question",
            f"{name} asks ({q.id}): {_clean(q.text)}{opts}",
            task=name,
            task_id=q.task_id,
            question=q.id,
        )

    def _task(self, t: Task) -> None:
        self.names[t.id] = t.name
        key = (t.status.value, t.reason, t.attempt)
        old = self.seen.get(t.id)
        if old != key:  # the engine's snapshots hand on every task that moved again: most are seen
            fields = {"task": t.name, "task_id": t.id, "status": t.status.value, "attempt": t.attempt}
            self.seen[t.id] = key
            was = old[0] if old else "new"
            arrow = f"{was} -> {t.status.value}" if was != t.status.value else t.status.value
            extra = f" (attempt {t.attempt})" if t.status == TaskStatus.RUNNING else ""
            why = f": {_clean(t.reason)}" if t.reason else ""
            name = t.name if not t.host or t.host == self.host else f"{t.name} ({_clean(t.host)})"
            self._emit("state", f"{name}: {arrow}{extra}{why}", reason=t.reason, host=t.host, **fields)
        if (
            t.status == TaskStatus.QUEUED
            and t.waiting
            # a reading that moved is the same wait: 3,000 held tasks printed 3,000 lines at
            # each tenth of a GiB
            and not same_wait(t.waiting, self.waiting.get(t.id))
        ):
            self._waits(t)
        self.waiting[t.id] = t.waiting if t.status == TaskStatus.QUEUED else None

    def _waits(self, t: Task) -> None:
        """A task's waiting line, while the batch has room for one: a whole queue held at once (a
        gate, or the queue as a run starts) takes ``PRIMED_WAITS`` lines, then a count."""
        if self._waits_left <= 0:
            self._waits_skipped += 1
            return
        self._waits_left -= 1
        why = _clean(t.waiting)
        text = f"{t.name}: {why}" if why.startswith(("waits", "after ")) else f"{t.name}: waits: {why}"
        fields = {"task": t.name, "task_id": t.id, "status": t.status.value, "attempt": t.attempt}
        self._emit("waiting", text, waiting=t.waiting, **fields)


def needs_person(tasks: Sequence[Task], report: Sequence[tuple[str, str]], fleet_paused: bool) -> list[str]:
    """What a person must act on after an until-idle run: one line each."""
    out: list[str] = []
    if fleet_paused:
        out.append("the fleet is paused (fleet-tui resume --all)")
    for t in tasks:
        if t.status == TaskStatus.NEEDS_HUMAN:
            out.append(f"{t.name}: needs_human: {t.reason or '?'}")
        elif t.status == TaskStatus.PAUSED:
            out.append(f"{t.name}: paused")
    waits = dict(report)
    by_name = {t.name: t for t in tasks}
    held = (TaskStatus.PAUSED, TaskStatus.NEEDS_HUMAN, TaskStatus.CANCELLED)
    for t in tasks:
        why = waits.get(t.name, "")
        stuck = [d for d in t.spec.depends_on if d in by_name and by_name[d].status in held]
        if t.status == TaskStatus.QUEUED and why.startswith("after ") and stuck:
            out.append(f"{t.name}: {why} ({', '.join(f'{d} is {by_name[d].status.value}' for d in stuck)})")
    return out


def idle_summary(
    tasks: Sequence[Task],
    report: Sequence[tuple[str, str]],
    fleet_paused: bool,
    left_time_waits: bool,
    held_by_gate: float | None = None,
) -> tuple[list[str], int]:
    """The closing lines of ``run --until-idle`` and its exit code."""
    finished = sum(1 for t in tasks if t.status in _FINISHED)
    lines: list[str] = []
    person = needs_person(tasks, report, fleet_paused)
    waiting = [(n, r) for n, r in report]
    if waiting:
        lines.append(f"idle; {len(waiting)} task(s) still wait:")
        lines += [f"  {n}: {_clean(r)}" for n, r in waiting]
    parked = [p for p in person if ": needs_human" in p or p.endswith(": paused") or "fleet is paused" in p]
    if parked:
        lines.append(f"{len(parked)} need(s) a person:")
        lines += [f"  {_clean(p)}" for p in parked]
    # this engine is idle with none of its own: what still runs is another engine's (a second
    # `run` on the same store), which it leaves to that engine; it is not "everything finished"
    elsewhere = [t for t in tasks if t.status in (TaskStatus.RUNNING, TaskStatus.VERIFYING)]
    if elsewhere:
        lines.append(f"idle here; {len(elsewhere)} task(s) still run on another engine:")
        lines += [f"  {_clean(t.name)}: {t.status.value} on {_clean(t.host or '?')}" for t in elsewhere]
    if not waiting and not parked and not elsewhere:
        lines.append(f"idle; everything finished ({finished} task(s) done or cancelled)")
    if person:
        return lines, EXIT_NEEDS_PERSON
    if held_by_gate is not None:
        lines.append(
            f"stopped waiting (--max-wait): a gate above held every task for more than {held_by_gate:g} s"
            " with nothing running; it clears when there is room again"
        )
        return lines, EXIT_STILL_WAITING
    if left_time_waits:
        lines.append("stopped waiting (--max-wait): the waits above end by themselves")
        return lines, EXIT_STILL_WAITING
    return lines, 0


def run_headless(
    engine: Any, store: Any, *, until_idle: bool, on_quit: str, printer: RunPrinter | None
) -> int:
    """Run the engine to its end (idle, or a signal), printing as it goes; the exit code."""
    stopped: dict[str, Any] = {}

    async def main() -> None:
        async with anyio.create_task_group() as tg:

            async def on_signal() -> None:
                # SIGHUP: the terminal or ssh session it ran in went away; it ends the run as
                # SIGTERM does (unhandled, it ended the process at once: agents unsupervised
                # until their leases ran out, then killed)
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as sigs:
                    async for _ in sigs:
                        leave = on_quit == "leave"
                        n = stopped["agents"] = len(engine.runners)
                        stopped["leave"] = leave
                        what = (
                            f"leaving {n} agent(s) running for another engine to adopt"
                            if leave
                            else f"stopping {n} agent(s); their tasks go back to the queue"
                        )
                        with contextlib.suppress(OSError):  # a terminal that hung up
                            print(
                                f"fleet-tui: signal received: {what}" if n else "fleet-tui: stopping",
                                file=sys.stderr,
                            )
                        await engine.shutdown(leave_running=leave)
                        return

            async def show() -> None:
                assert printer is not None
                async for batch in engine.subscribe():
                    printer.feed(batch)

            tg.start_soon(on_signal)
            if printer is not None:
                tg.start_soon(show)
            await engine.run(until_idle=until_idle)
            tg.cancel_scope.cancel()

    sys.setswitchinterval(SWITCH_INTERVAL)  # see onloop.py
    anyio.run(main)
    if stopped:  # say what was actually done (to a terminal that may have hung up)
        n = stopped["agents"]
        with contextlib.suppress(OSError):
            if not n:
                print("stopped; no agent was running", file=sys.stderr)
            elif stopped["leave"]:
                print(f"stopped; {n} agent(s) left running for another engine to adopt", file=sys.stderr)
            else:
                print(f"stopped; {n} agent(s) stopped and their tasks requeued", file=sys.stderr)
        return 0
    if not until_idle:
        return 0
    lines, code = idle_summary(
        store.list_tasks(),
        engine.idle_report,
        store.get_setting("fleet_paused") == "1",
        engine.left_time_waits,
        engine.max_wait if engine.left_gate_wait else None,
    )
    for line in lines:
        print(line)
    return code
