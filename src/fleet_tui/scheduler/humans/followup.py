"""Continuing an agent's own conversation: retries, follow-ups and crash-resumes as a new turn.

Why: a fresh session with a summary loses what the agent read, tried and decided. When the
previous attempt recorded a session id and its coder can resume (``BaseCoder.can_resume``), the
next attempt continues that session with only the new turn: the verifier's failure, the crash
notice, or a person's follow-up message (``fleet-tui send``). A context handoff still starts
fresh (the old context is the problem). ``continue = "fresh"`` (task) or ``continue_session``
(config) turns this off. Whatever is decided is written to the attempt's ``continue.json`` and
as the first (lifecycle) event of its log, including why a wanted continuation fell back.

Pending follow-ups live in the store's settings (``followup:<task id>``), so a message sent from
any machine reaches the engine that claims the task next.

A follow-up for a *running* agent does not cut it off mid-step: its engine watches the live event
stream (``TurnStop``, called by the runner on every tick) and stops the agent at its next turn
boundary — a tool result that closes every open tool call (the conversation is consistent: no
call without its result), its final result, or a question it waits on — or, when none comes
within ``followup_grace_s``, stops it anyway and says so in the attempt's record. No coder takes
the message into the running session instead: Claude Code could read more user turns on stdin
(``--input-format stream-json``), but every agent is launched with its prompt in a file and
stdin closed, because it must outlive the engine that started it.
"""

from __future__ import annotations

import getpass
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fleet_tui.coders.base import AttemptContext, CannotResume, Coder, CoderNotFound, get_coder
from fleet_tui.scheduler import lifecycle as lc
from fleet_tui.scheduler.api import CommandResult
from fleet_tui.scheduler.attempts.running import Running
from fleet_tui.scheduler.lifecycle import Commands
from fleet_tui.scheduler.model import Attempt, Event, Task
from fleet_tui.scheduler.policy.prompt import trim
from fleet_tui.scheduler.states import ACTIVE, TaskStatus
from fleet_tui.scheduler.store.protocol import Store

CONTINUE_FILE = "continue.json"
#: outcomes whose failure text becomes the next turn of the same session
RETRY_OUTCOMES = frozenset({"failure", "verify_failed", "stalled", "timeout", "over_budget"})


def user_name() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "user"


# -- pending follow-ups ---------------------------------------------------------------------------


def _key(task_id: str) -> str:
    return f"followup:{task_id}"


def pending(store: Store, task_id: str) -> list[dict[str, Any]]:
    """The follow-up messages waiting for the task's next attempt, oldest first."""
    raw = store.get_setting(_key(task_id))
    try:
        data = json.loads(raw) if raw else []
    except ValueError:
        return []
    return [m for m in data if isinstance(m, dict) and isinstance(m.get("text"), str)]


def add_pending(store: Store, task_id: str, text: str, by: str, now: float) -> None:
    msgs = [*pending(store, task_id), {"text": text, "by": by, "at": now}]
    store.set_setting(_key(task_id), json.dumps(msgs))


def clear_pending(store: Store, task_id: str) -> None:
    store.set_setting(_key(task_id), None)


def message_text(msgs: list[dict[str, Any]]) -> str | None:
    """The follow-ups as one text (each person's words kept whole)."""
    if not msgs:
        return None
    return "\n\n".join(str(m["text"]).strip() for m in msgs)


# -- the decision ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """How the next attempt starts: the new turn (None: nothing to continue with) and the session
    it would continue (None: fresh, with ``note`` saying why)."""

    mode: str  # the wanted mode: "auto" | "fresh"
    turn: str | None = None  # the new turn's text when the session is continued
    turn_kind: str | None = None  # retry | crash | followup
    session_id: str | None = None
    note: str = ""


def session_of(store: Store, task_id: str, n: int) -> str | None:
    """The last session id attempt ``n`` reported (its session_started or result events)."""
    sid = None
    for e in store.events(task_id, n):
        if e.session_id:
            sid = e.session_id
    return sid


def turn_text(
    kind: str, retry_reason: str | None, retry_output: str | None, message: str | None, crashed: bool
) -> str:
    """The new turn sent into the continued session."""
    if kind == "followup":
        body = "A person sent a follow-up on this task:\n\n" + (message or "").strip()
        if crashed:
            body += "\n\n(Your previous run stopped unexpectedly: check the working directory first.)"
        return body + "\n\nDo it in the same working directory, under the same rules as before.\n"
    if kind == "crash":
        return (
            "Your previous run stopped unexpectedly. Assess the current state of the working "
            "directory first (git status, git log, the files you would have changed), then continue "
            "the task from there instead of starting over.\n"
        )
    body = f"Your previous attempt did not pass: {retry_reason}."
    if retry_output:
        body += "\n\nOutput:\n```\n" + trim(retry_output) + "\n```"
    return body + "\n\nFix this in the same working directory, then finish the task.\n"


def merge_conflict_turn(base: str, branch: str, files: str) -> str:
    """What a retry of a task parked on a merge conflict asks its agent (``Commands.retry``)."""
    return (
        f"Your branch {branch} could not be merged into {base}: both changed {files}. Bring your "
        f"branch up to date: run `git merge {base}` in your working directory, resolve every "
        "conflict so that what both sides meant is kept, check that the work still holds (run the "
        "project's tests if it has any), and commit the merge. This merge of "
        f"{base} into your branch is the one merge asked of you: do not push, rebase or switch branches."
    )


def plan(
    store: Store,
    task: Task,
    prev: Attempt | None,
    default_mode: str,
    coder: Coder,
    *,
    retry_reason: str | None,
    retry_output: str | None,
    crashed: bool,
    handoff: bool,
    message: str | None,
) -> Plan:
    mode = task.spec.continue_mode or default_mode
    if prev is None or handoff:
        return Plan(mode)  # a first attempt, or a context handoff: fresh with a summary
    if message is not None:
        kind = "followup"
    elif retry_reason:
        kind = "retry"
    elif crashed:
        kind = "crash"
    else:
        return Plan(mode)
    turn = turn_text(kind, retry_reason, retry_output, message, crashed)
    if mode == "fresh":
        return Plan(mode, turn, kind, note="fresh session (continue = fresh)")
    if not getattr(coder, "can_resume", False):
        return Plan(mode, turn, kind, note=f"fresh session: the {coder.name} coder cannot continue a session")
    sid = session_of(store, task.id, prev.n)
    if sid is None:
        return Plan(mode, turn, kind, note=f"fresh session: attempt {prev.n} recorded no session id")
    return Plan(mode, turn, kind, sid)


@dataclass(frozen=True)
class Command:
    """The command line an attempt starts with, and whether it continues a session."""

    ctx: AttemptContext  # with the prompt actually sent
    argv: list[str]
    continued: bool
    note: str


def command(coder: Coder, ctx: AttemptContext, p: Plan, previous: Path | None) -> Command:
    """Prepare the coder and build the command line: the continued session when planned and
    possible, else the fresh one (the full prompt in ``ctx``), saying why."""
    if p.session_id and p.turn is not None and previous is not None:
        resume = getattr(coder, "resume_argv", None)
        if resume is None or not getattr(coder, "can_resume", False):
            note = f"fresh session: the {coder.name} coder cannot continue a session"
        else:
            turn_ctx = replace(ctx, prompt=p.turn)
            try:
                coder.prepare(turn_ctx)
                argv = list(resume(turn_ctx, p.session_id, previous))
            except CannotResume as e:
                note = f"fresh session: {e}"
            else:
                what = {"retry": "the failure", "crash": "a crash notice", "followup": "a follow-up"}
                why = what.get(p.turn_kind or "", "a new turn")
                return Command(turn_ctx, argv, True, f"continuing session {p.session_id} with {why}")
        coder.prepare(ctx)
        return Command(ctx, coder.argv(ctx), False, note)
    coder.prepare(ctx)
    return Command(ctx, coder.argv(ctx), False, p.note)


def record(adir: Path, p: Plan, cmd: Command) -> None:
    """The attempt's ``continue.json``, when it has something to say: a new turn (a retry, a
    crash, a follow-up), a continued session, or why not. A first attempt has none, and gets no
    file (on some file systems a new file costs more than the rest of starting an agent)."""
    if p.turn_kind is None and not cmd.continued and not cmd.note:
        return
    data = {
        "continue": p.mode,
        "turn": p.turn_kind,
        "continued": cmd.continued,
        "session_id": p.session_id if cmd.continued else None,
        "note": cmd.note,
    }
    (adir / CONTINUE_FILE).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def read_record(adir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((adir / CONTINUE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# -- a follow-up for a running agent: stop it at a turn boundary ----------------------------------

#: the stop reason a follow-up uses: the task goes back to the queue, its WIP kept (policy/outcome)
STOP_REASON = "retry_by_user"


def open_calls(events: list[Event]) -> dict[str, str]:
    """The tool calls in ``events`` that have no result yet: tool id -> tool name."""
    calls: dict[str, str] = {}
    for e in events:
        if e.kind == "tool_call" and e.tool_id:
            calls[e.tool_id] = e.tool or ""
        elif e.kind == "tool_result" and e.tool_id:
            calls.pop(e.tool_id, None)
    return calls


class TurnStop:
    """Watches a running agent's normalized events (``AttemptRunner.watch``) and stops it at its
    next turn boundary, or once ``grace_s`` has passed without one (saying so)."""

    def __init__(self, deadline: float, grace_s: float, calls: dict[str, str]) -> None:
        self.deadline = deadline
        self.grace_s = grace_s
        self.calls = dict(calls)  # open tool calls: id -> name (a result may not repeat the name)

    def boundary(self, e: Event) -> str | None:
        """What makes ``e`` a turn boundary (None: it is not one)."""
        if e.kind == "tool_call" and e.tool_id:
            self.calls[e.tool_id] = e.tool or ""
        elif e.kind == "tool_result":
            name = e.tool or self.calls.get(e.tool_id or "") or "a tool call"
            self.calls.pop(e.tool_id or "", None)
            if not self.calls:
                return f"after the result of {name}"
        elif e.kind == "result":
            return "at its final result"
        return None

    def __call__(self, runner: Any, events: list[Event], now: float) -> None:
        if runner.stop_reason is not None:
            return
        for e in events:
            why = self.boundary(e)
            if why:
                runner.stop(STOP_REASON, f"follow-up: stopped at a turn boundary ({why})")
                return
        if runner.open_questions:
            runner.stop(STOP_REASON, "follow-up: stopped while it waited for a person's answer")
        elif now >= self.deadline:
            runner.stop(
                STOP_REASON,
                f"follow-up: no turn boundary within {self.grace_s:g} s (followup_grace_s); stopped anyway",
            )


def adopted_watch(store: Store, grace_s: float, task_id: str, attempt: int, now: float) -> TurnStop | None:
    """For an agent an engine adopts: the watch its previous engine held when a follow-up was
    waiting for the agent's next turn boundary (pending follow-ups are cleared at each launch, so
    one pending for a running attempt was sent during it); None when there is none."""
    if not pending(store, task_id):
        return None
    return TurnStop(now + grace_s, grace_s, open_calls(store.events(task_id, attempt)))


async def stop_at_turn(
    r: Running, store: Store, clock: Callable[[], float], grace_s: float, kill_grace_s: float
) -> CommandResult:
    """The engine side of a follow-up for an agent it runs (``r``: its Running): stop it now when
    there is nothing to wait for, else watch for its next turn boundary and return at once."""
    import anyio

    name = r.task.name
    runner = r.runner
    if getattr(runner, "watch", None) is not None or runner.stop_reason is not None:
        return CommandResult(True, f"{name}: already stopping; the follow-up waits for it", r.task)
    try:
        mode = get_coder(r.coder).followup_stop  # type: ignore[attr-defined]
    except (CoderNotFound, AttributeError):
        mode = "turn"
    now_why = None
    if mode == "now":
        now_why = f"follow-up: the {r.coder} coder has no turns to wait for"
    elif r.verifying or runner.finished:
        now_why = "follow-up: the agent had finished its turn"
    elif runner.paused:
        now_why = "follow-up: the agent was paused"
    elif runner.open_questions:
        now_why = "follow-up: stopped while it waited for a person's answer"
    if now_why is None:
        grace = grace_s
        seen = await anyio.to_thread.run_sync(lambda: store.events(r.task.id, r.task.attempt))
        runner.watch = TurnStop(clock() + grace, grace, open_calls(seen))
        return CommandResult(
            True,
            f"{name}: follow-up queued; the agent stops at its next turn boundary "
            f"(at most {grace:g} s), then continues with it",
            r.task,
        )
    runner.stop(STOP_REASON, now_why)
    with anyio.move_on_after(kill_grace_s + 10):
        await r.done.wait()
    new = await anyio.to_thread.run_sync(store.get_task, r.task.id)
    return CommandResult(r.done.is_set(), f"{name}: agent stopped; follow-up queued", new)


def _running(task: Task) -> bool:
    return task.status in ACTIVE or (task.status == TaskStatus.PAUSED and bool(task.paused_running))


async def _stop_running(ctl: Commands, task: Task) -> CommandResult:
    """Ask the engine running ``task`` to stop it at a turn boundary; when that engine is gone
    (or too old to know the verb), stop it at once the way ``retry`` does."""
    res = await ctl.stop_for_followup(task)
    if res is None or (not res.ok and "unknown command" in res.message):
        res = await ctl.retry(task.id)
        if res.ok:
            res = CommandResult(True, f"{task.name}: agent stopped; follow-up queued", res.task)
    return res


# -- fleet-tui send -------------------------------------------------------------------------------


async def send(ctl: Commands, ref: str, text: str, by: str | None = None) -> CommandResult:
    """Queue ``text`` as the next turn of the task's conversation and open that attempt: a done,
    parked or paused task goes back to the queue; a running one is stopped at its next turn
    boundary first (by its engine, WIP kept) and requeued; a queued one takes the message at its
    next start."""
    import anyio

    if not text.strip():
        return CommandResult(False, "send: the message is empty; say what the agent should do")
    task = await ctl.get(ref)
    if isinstance(task, CommandResult):
        return task
    who = by or user_name()
    now = ctl.clock()
    store: Store = ctl.store
    why = lc.Reason.of(task)
    if task.status == TaskStatus.NEEDS_HUMAN and why is not None and why.code == lc.ReasonCode.TAKEN_OVER:
        return CommandResult(False, f"{task.name} is {task.reason}; finish the takeover first")
    await anyio.to_thread.run_sync(add_pending, store, task.id, text, who, now)
    if task.status == TaskStatus.QUEUED:
        return CommandResult(True, f"{task.name}: follow-up queued for its next attempt", task)
    if _running(task):
        res = await _stop_running(ctl, task)
        if res.ok:
            return res
        fresh = await ctl.get(task.id)
        if isinstance(fresh, CommandResult) or _running(fresh):
            await anyio.to_thread.run_sync(clear_pending, store, task.id)
            return res
        task = fresh  # its agent ended meanwhile: it takes the follow-up as a finished task does
    res = await ctl.command(task, lc.follow_up(who))
    if not res.ok:
        await anyio.to_thread.run_sync(clear_pending, store, task.id)
        return res
    ctl.wake()
    return CommandResult(True, f"{task.name}: follow-up queued (attempt {task.attempt + 1})", res.task)
