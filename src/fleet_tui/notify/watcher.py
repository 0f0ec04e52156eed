"""The engine's notifier and loop guard: it follows the engine's event bus and acts on what it sees.

Runs as one task of every engine (headless ``run`` and the cockpit's alike) and subscribes to the
same event stream the cockpit reads, so the engine's own code paths need no hooks: a new question,
a task parked ``needs_human`` or done, the fleet drained, an account rate-limited and free again
all show up there. Each becomes a Notice; the store decides which engine sends it (one claim per
event key), and the senders work in the background (send.py). Agent events also feed the loop
detector; a loop stops the attempt with ``looping`` (the task is parked with the reason, which
the cockpit shows and which is then notified like any parked task).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import anyio

from fleet_tui.notify import notice as nt
from fleet_tui.notify.desktop import Desktop, desktop_session
from fleet_tui.notify.notice import Notice
from fleet_tui.notify.send import (
    AppriseTarget,
    Result,
    Target,
    TerminalTarget,
    Tracker,
    Worker,
    stdout_writer,
    wants,
)
from fleet_tui.notify.telegram import Telegram
from fleet_tui.scheduler.lifecycle import StopReason
from fleet_tui.scheduler.model import (
    AgentEvent,
    EngineEvent,
    Event,
    Gauges,
    GaugesChanged,
    Question,
    QuestionChanged,
    Task,
    TaskChanged,
)
from fleet_tui.scheduler.model import Notice as EngineNotice
from fleet_tui.scheduler.policy.loops import LoopDetector, LoopLimits
from fleet_tui.scheduler.states import TaskStatus

if TYPE_CHECKING:
    from fleet_tui.config import Config
    from fleet_tui.notify.host import NotifierHost


def build_targets(cfg: Config, terminal: Any = None, problems: list[str] | None = None) -> list[Target]:
    """The threaded targets the config asks for (apprise URLs, the terminal, Telegram)."""
    out: list[Target] = []
    for entry in cfg.notify:
        try:
            out.append(AppriseTarget(entry, cfg.notify_timeout_s))
        except Exception as e:
            if problems is not None:
                problems.append(f"notify: {e}")
    if cfg.notify_terminal != "off":
        write = terminal or stdout_writer()
        if write is not None:
            out.append(TerminalTarget(write, cfg.notify_terminal))
    if cfg.telegram_token and cfg.telegram_chat:
        out.append(Telegram(cfg.telegram_token, cfg.telegram_chat, cfg.telegram_api, cfg.notify_timeout_s))
    elif (cfg.telegram_token or cfg.telegram_chat) and problems is not None:
        problems.append("telegram: set both telegram_token and telegram_chat")
    return out


def desktop_wanted(cfg: Config) -> bool:
    return cfg.notify_desktop == "on" or (cfg.notify_desktop == "auto" and desktop_session())


class Watcher:
    def __init__(self, engine: NotifierHost, terminal: Any = None) -> None:
        self.engine = engine
        self.terminal = terminal
        self.started = engine.clock()
        self.prev: dict[str, Task] = {}
        self.loops = LoopDetector(LoopLimits())
        self.rate_seen: dict[str, float | None] = {}
        self.active = False
        self.workers: list[Worker] = []
        self.desktop: Desktop | None = None
        self.telegram: Telegram | None = None
        self._sig: Any = None
        self._tg: Any = None
        self.sent = 0
        self.failed = 0
        self.pending: list[Tracker] = []
        self._closing = False

    @property
    def cfg(self) -> Config:
        return self.engine.cfg

    # -- targets (rebuilt when the config changes) ------------------------------------------------
    async def _sync_targets(self) -> None:
        c = self.cfg
        sig = (c.notify, c.notify_terminal, c.notify_desktop, c.notify_timeout_s,
               c.telegram_token, c.telegram_chat, c.telegram_api)  # fmt: skip
        if sig == self._sig:
            return
        self._sig = sig
        for w in self.workers:
            w.stop()
        problems: list[str] = []
        # on a thread: the first apprise import takes most of a second, the engine must not wait
        targets = await anyio.to_thread.run_sync(build_targets, c, self.terminal, problems)
        for p in problems:
            self._notice(p)
        self.workers = [Worker(t) for t in targets]
        if self.telegram is not None:
            self.telegram.stopped = True  # its poller ends after its current long poll
        self.telegram = next((t for t in targets if isinstance(t, Telegram)), None)
        if self.telegram is not None and self._tg is not None:
            self._tg.start_soon(self._poll_telegram, self.telegram)
        self.desktop = Desktop(c.notify_timeout_s) if desktop_wanted(c) else None

    def _notice(self, text: str) -> None:
        self.engine.bus.publish([EngineNotice(text)])

    # -- the loop --------------------------------------------------------------------------------
    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            await self._sync_targets()
            snap = self.engine.snapshot()
            self.prev = {t.id: t for t in snap.tasks}
            self.active = any(t.status not in nt.SETTLED for t in snap.tasks)
            names = {t.id: t.name for t in snap.tasks}
            for q in snap.questions:
                await self.emit(nt.question_notice(q, names.get(q.task_id, q.task_id)))
            try:
                async for batch in self.engine.subscribe():
                    await self._sync_targets()
                    for ee in batch:
                        if isinstance(ee, AgentEvent):  # thousands a second: no coroutine for each
                            self._feed_loops(ee.event)
                        else:
                            await self.handle(ee)
            finally:
                # the engine stops (``run --until-idle`` right after the last transition): what
                # it did last may still sit unread on the bus, and sends may be under way
                self._closing = True
                # with nowhere to send (no target, no desktop) there is nothing to sweep for: the
                # sweep reads every task, the whole queue's, on the way out (7 ms of 200 tasks'
                # `run --until-idle` here; a 10,000-task queue's stop waited on it)
                if self.workers or self.desktop is not None:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(self.cfg.notify_timeout_s + 2):
                        await self._final_sweep()
                        await anyio.to_thread.run_sync(self._wait_pending, limiter=anyio.CapacityLimiter(1))
                for w in self.workers:
                    w.stop()
                tg.cancel_scope.cancel()

    async def _final_sweep(self) -> None:
        store = self.engine.store
        tasks = tuple(await anyio.to_thread.run_sync(store.list_tasks))
        for t in tasks:
            await self._task(t)
        await self._check_drained(tasks)
        for q in await anyio.to_thread.run_sync(store.pending_questions):
            await self._question(q)

    def _wait_pending(self) -> None:
        deadline = time.monotonic() + self.cfg.notify_timeout_s + 1
        for tr in list(self.pending):
            tr.done.wait(max(0.0, deadline - time.monotonic()))

    async def handle(self, ee: EngineEvent) -> None:
        match ee:
            case AgentEvent(event):
                self._feed_loops(event)
            case QuestionChanged(question):
                await self._question(question)
            case TaskChanged(task):
                await self._task(task)
            case GaugesChanged(gauges):
                await self._gauges(gauges)

    def _stop_looping(self, task_id: str, reason: str) -> bool:
        r = self.engine.runners.get(task_id)
        if r is None or r.runner.stop_reason is not None:
            return False
        r.runner.stop(StopReason.LOOPING, reason)
        self._notice(f"{r.task.name}: looping: {reason}; stopping it")
        return True

    def _feed_loops(self, e: Event) -> None:
        if e.task_id not in self.engine.runners:
            return
        c, limits = self.cfg, self.loops.limits
        # the config's limits, which a reload may change; not a new object for every event
        if (limits.same_call, limits.output_tokens) != (c.loop_same_call, c.loop_output_tokens):
            self.loops.limits = LoopLimits(same_call=c.loop_same_call, output_tokens=c.loop_output_tokens)
        reason = self.loops.feed(e)
        if reason:
            self._stop_looping(e.task_id, reason)

    async def _question(self, q: Question) -> None:
        if q.status != "pending":
            return
        if self.cfg.loop_same_question and q.task_id in self.engine.runners:
            earlier = await anyio.to_thread.run_sync(self.engine.store.questions, q.task_id)
            norm = " ".join(q.text.split()).lower()
            for old in earlier:
                if old.id != q.id and old.status == "answered" and " ".join(old.text.split()).lower() == norm:
                    text = nt.one_line(q.text, 60)
                    if self._stop_looping(q.task_id, f'asked "{text}" again after it was answered'):
                        return
        t = self.prev.get(q.task_id)
        await self.emit(nt.question_notice(q, t.name if t else q.task_id), t)

    async def _task(self, t: Task) -> None:
        old = self.prev.get(t.id)
        self.prev[t.id] = t
        if not t.asking and self.desktop is not None and t.id in self.desktop.shown and self._tg is not None:
            self._tg.start_soon(self.desktop.withdraw, t.id)
        if t.status not in nt.SETTLED:
            self.active = True
        if t.status in (TaskStatus.DONE, TaskStatus.CANCELLED, TaskStatus.NEEDS_HUMAN, TaskStatus.QUEUED):
            self.loops.forget(t.id)
        if not self.workers and self.desktop is None:
            return  # nowhere to send a notice (the default): none is composed, for every end
        fresh = (old is None and t.updated_at >= self.started - 5) or (
            old is not None and (old.status != t.status or old.reason != t.reason)
        )
        if not fresh:
            return
        if t.status == TaskStatus.NEEDS_HUMAN:
            await self.emit(nt.needs_human_notice(t), t)
        elif t.status == TaskStatus.DONE:
            await self.emit(nt.done_notice(t), t)

    async def _gauges(self, g: Gauges) -> None:
        now = self.engine.clock()
        snap = self.engine.snapshot()
        current = {rl.account: rl for rl in g.rate_limits}
        for rl in g.rate_limits:
            if rl.status != "rejected":
                continue
            if (rl.resets_at or now + 1) > now:
                if rl.account not in self.rate_seen:
                    self.rate_seen[rl.account] = rl.resets_at
                    # counted only for the notice: gauges come every second, over any queue
                    queued = sum(1 for t in snap.tasks if t.status == TaskStatus.QUEUED)
                    await self.emit(nt.rate_limited_notice(rl, queued))
            elif rl.resets_at is not None and now - rl.resets_at < 3600:
                # its reset time passed (seen by this engine, or by whichever engine is up then)
                self.rate_seen.pop(rl.account, None)
                await self.emit(nt.rate_resumed_notice(rl.account, rl.resets_at))
        for account, resets in list(self.rate_seen.items()):
            now_rl = current.get(account)
            if now_rl is None or now_rl.status != "rejected":
                del self.rate_seen[account]
                await self.emit(nt.rate_resumed_notice(account, resets))
        await self._check_drained(snap.tasks)

    async def _check_drained(self, tasks: tuple[Task, ...]) -> None:
        if self.active and tasks and all(t.status in nt.SETTLED for t in tasks):
            self.active = False
            await self.emit(nt.drained_notice(tasks))

    # -- sending -------------------------------------------------------------------------------
    async def emit(self, n: Notice, task: Task | None = None) -> None:
        c = self.cfg
        workers = [w for w in self.workers if wants(w.target.kinds, c.notify_events, n, task)]
        desktop = self.desktop if self.desktop and wants(None, c.notify_events, n, task) else None
        expected = len(workers) + (1 if desktop else 0)
        if not expected:
            return
        store = self.engine.store
        try:
            mine = await anyio.to_thread.run_sync(
                store.claim_notification, n.key, n.kind, n.task_id, n.title, n.body, self.engine.owner,
                self.engine.clock(),
            )  # fmt: skip
        except Exception as e:
            self._notice(f"notification not sent (store: {e})")
            return
        if not mine:
            return  # another engine sends this one
        tracker = Tracker(n, expected, self._finished)
        self.pending = [p for p in self.pending if not p.done.is_set()] + [tracker]
        for w in workers:
            w.submit(n, tracker)
        if desktop is not None and self._closing:
            await self._send_desktop(desktop, n, tracker)  # the task group is going: send it now
        elif desktop is not None and self._tg is not None:
            self._tg.start_soon(self._send_desktop, desktop, n, tracker)

    def _finished(self, n: Notice, results: list[Result]) -> None:
        bad = [r for r in results if not r.ok]
        if bad:
            self.failed += 1
        else:
            self.sent += 1
        detail = "; ".join(r.detail for r in bad) or ", ".join(r.target for r in results)
        self.engine.store.finish_notification(n.key, "failed" if bad else "sent", detail, time.time())

    async def _send_desktop(self, d: Desktop, n: Notice, tracker: Tracker) -> None:
        res = Result(d.name, False, "desktop: the engine stopped first")
        try:
            with anyio.CancelScope(shield=True):  # bounded by notify_timeout_s: let it finish
                await d.send(n, self._answer_from_desktop)
            res = Result(d.name, True)
        except Exception as e:
            res = Result(d.name, False, f"desktop: {type(e).__name__}: {e}"[:300])
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(tracker.report, res)

    def _answer_from_desktop(self, qid: str, text: str) -> None:
        if self._tg is not None:
            self._tg.start_soon(self.answer, qid, text, "desktop")

    async def answer(self, qid: str, text: str, who: str) -> str:
        """Answer a question from a notification; the first answer wins, as in the cockpit."""
        store = self.engine.store
        ok = await anyio.to_thread.run_sync(store.answer_question, qid, text, who, self.engine.clock())
        if ok:
            self.engine.wake()
            self._notice(f"question {qid} answered from {who}")
            return f"answered {qid}: {text}"
        q = await anyio.to_thread.run_sync(store.get_question, qid)
        if q is None:
            return f"no question {qid}"
        return f"{qid} was already {q.status}" + (f" (answer: {q.answer})" if q.answer else "")

    def _options(self, qid: str) -> tuple[str, ...]:
        q = self.engine.store.get_question(qid)
        return q.options if q else ()

    async def _poll_telegram(self, tele: Telegram) -> None:
        await tele.run(self.answer, self._options, self._notice)
