"""Task detail (Enter): everything about one task in four tabs, live.

Overview (spec, state, prompt, transitions), Attempts (outcome, exit code, verifier output), Diff
(``engine.diff``) and Log (``engine.events`` with a search box). The screen paints at once from the
task the cockpit already holds; transitions, attempts, the log and the diff (git: the slow one)
load in workers of their own. While it is open it follows the task: the overview is redrawn from
the cockpit's live task once a second, the app forwards live events to the log (``offer``), and
transitions and attempts are reloaded when the task's state or attempt changes. Everything shown
comes through the EngineAPI, never from disk, and every string from an agent, a verifier, git or
the task file goes through ``format.inert``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, cast

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Input, RichLog, Static, TabbedContent, TabPane

from fleet_tui.app.format import (
    clock_seconds,
    coder_model,
    cost,
    count,
    diff_text,
    duration,
    elapsed,
    event_line,
    inert,
    log_matches,
    state_text,
)
from fleet_tui.app.queue import focus_now
from fleet_tui.app.theme import ThemeStyles
from fleet_tui.scheduler.api import EngineAPI
from fleet_tui.scheduler.model import Attempt, Event, Task, Transition

LOG_LIMIT = 5000
LOG_CHUNK = 250  # log lines written per turn of the loop while filling (keys stay responsive)
FULL_LINE = 4000  # the log shows whole events (newlines folded); scroll sideways


def overview(task: Task, transitions: list[Transition], now: float, pull_request: str | None = None) -> Group:
    spec = task.spec
    grid = Table.grid()
    grid.add_column(no_wrap=True)
    grid.add_column(ratio=1, overflow="fold")
    rows: list[tuple[str, str]] = [
        ("id", task.id),
        (
            "state",
            f"{task.status.value}"
            + (f" ({state_text(task, task.asking)})" if task.reason or task.waiting or task.asking else ""),
        ),
        (
            "attempt",
            f"{task.attempt} (retries used {task.retries_used}, handoffs {task.handoffs}, "
            f"false completions {task.false_completions})",
        ),
        ("coder", coder_model(task)),
        ("host", task.host or "-"),
        ("time", duration(elapsed(task, now))),
        ("tokens", f"{count(task.tokens)} · cost {cost(task.cost_usd)}"),
        ("workdir", task.workdir or spec.cwd),
        ("branch", task.branch or "-"),
        ("priority", str(spec.priority)),
        ("after", ", ".join(spec.depends_on) or "-"),
        ("verify", "; ".join(v.label for v in spec.verify) or "-"),
    ]
    if pull_request:  # merge = "pr" (scheduler/github/pullrequest.py)
        rows.append(("pull req", pull_request))
    if task.merged_commit:
        rows.append(("merged", task.merged_commit))
    if task.result_text:
        rows.append(("result", task.result_text))
    for key, value in rows:
        grid.add_row(Text(f"{key:<10}", style="bold"), Text(inert(value)))
    trans = Table.grid(padding=(0, 2))
    for _ in range(4):
        trans.add_column(no_wrap=True)
    for tr in transitions:
        trans.add_row(
            clock_seconds(tr.ts),
            Text(inert(f"{tr.src or '-'} -> {tr.dst}", one_line=True)),
            f"#{tr.attempt}",
            Text(inert(f"{tr.reason or ''} {('by ' + tr.actor) if tr.actor else ''}".strip())),
        )
    return Group(
        grid,
        Text("\nPrompt", style="bold"),
        Text(inert(spec.prompt)),
        Text("\nTransitions", style="bold"),
        trans if transitions else Text("(none)"),
    )


def attempts_view(attempts: list[Attempt]) -> Group:
    parts: list[Text] = []
    for at in attempts:
        took = duration((at.ended_at - at.started_at) if at.ended_at else None)
        head = (
            f"#{at.n}  {at.outcome or 'running'}  exit {at.exit_code if at.exit_code is not None else '-'}"
            f"  started {clock_seconds(at.started_at)}  took {took}  on {at.owner}"
        )
        parts.append(Text(inert(head, one_line=True), style="bold"))
        if at.detail:
            parts.append(Text(inert(at.detail)))
        if at.verify_output:
            parts.append(Text("verifier output:", style="italic"))
            parts.append(Text(inert(at.verify_output)))
        parts.append(Text(""))
    return Group(*parts) if parts else Group(Text("(no attempts yet)"))


class DetailScreen(Screen[None]):
    BINDINGS = [
        Binding("escape", "close", "Back"),
        Binding("slash", "search", "Search log", key_display="/", priority=True),
        Binding("1", "tab('tab-overview')", "Overview"),
        Binding("2", "tab('tab-attempts')", "Attempts"),
        Binding("3", "tab('tab-diff')", "Diff"),
        Binding("4", "tab('tab-log')", "Log"),
        Binding("c", "review", "Comment on the diff", show=False),  # listed in the help
    ]

    def __init__(
        self,
        engine: EngineAPI,
        task: Task,
        clock: Callable[[], float],
        current: Callable[[], Task | None] | None = None,
    ) -> None:
        super().__init__()
        self.engine = engine
        self.fleet_task = task
        self.clock = clock
        #: the cockpit's live copy of the task (None: keep showing the one given)
        self.current = current or (lambda: None)
        self.events: list[Event] = []
        self.transitions: list[Transition] = []
        self.pull_request: str | None = None
        self.loaded = False  # stored events are in (live ones are merged after them)
        self._pending: list[Event] = []
        self._needle = ""
        self._last: tuple[int, int] = (-1, -1)
        self._overview_key: object = None
        self._reload_key: tuple[object, ...] = (task.status, task.attempt, task.reason)

    def compose(self) -> ComposeResult:
        task = self.fleet_task
        yield Static(Text(inert(f"{task.name} · {task.id}", one_line=True), no_wrap=True), id="detail-title")
        with TabbedContent(id="detail-tabs"):
            with TabPane("Overview", id="tab-overview"), VerticalScroll():
                # drawn from the task in hand: the screen shows something useful in its first frame
                yield Static(overview(task, [], self.clock()), id="overview")
            with TabPane("Attempts", id="tab-attempts"), VerticalScroll():
                yield Static(Text("loading..."), id="attempts")
            with TabPane("Diff", id="tab-diff"), VerticalScroll():
                yield Static(Text("loading..."), id="diff")
            with TabPane("Log", id="tab-log"):
                yield Input(placeholder="search the log", id="log-search")
                yield RichLog(id="log", max_lines=LOG_LIMIT, wrap=False)
        yield Footer()

    def on_mount(self) -> None:
        self._styles = ThemeStyles(self.app)
        self.run_worker(self._load_history(), group="detail-history", exclusive=True)
        self.run_worker(self._load_events(), group="detail-events", exclusive=True)
        self.run_worker(self._load_diff(), group="detail-diff", exclusive=True)
        self.set_interval(1.0, self.tick)
        self.set_interval(1 / 10, self.flush)

    # ------------------------------------------------------------------ loading

    async def _load_history(self) -> None:
        ref = self.fleet_task.id
        try:
            self.transitions = await self.engine.transitions(ref)
            pull_request = getattr(self.engine, "pull_request", None)  # optional in EngineAPI
            self.pull_request = await pull_request(ref) if pull_request else None
        except Exception as exc:
            self.notify(inert(f"transitions: {exc}"), severity="error")
        self._overview_key = None
        self.tick()
        try:
            attempts = await self.engine.attempts(ref)
            self.query_one("#attempts", Static).update(attempts_view(attempts))
        except Exception as exc:
            self.query_one("#attempts", Static).update(Text(inert(f"could not load attempts: {exc}")))

    async def _load_diff(self) -> None:
        try:
            diff = await self.engine.diff(self.fleet_task.id)
            self.query_one("#diff", Static).update(
                diff_text(diff, self._styles) if diff else Text("(no diff)")
            )
        except Exception as exc:
            self.query_one("#diff", Static).update(Text(inert(f"could not load the diff: {exc}")))

    async def _load_events(self) -> None:
        try:
            stored = await self.engine.events(self.fleet_task.id, None, LOG_LIMIT)
        except Exception as exc:
            stored = []
            self.notify(inert(f"events: {exc}"), severity="error")
        live, self._pending = self._pending, []
        self.events = []
        self._last = (-1, -1)
        self._append(stored + sorted(live, key=lambda e: (e.attempt, e.seq)))
        self.loaded = True
        await self._render_log(self._needle)

    # ------------------------------------------------------------------ live

    def offer(self, events: Iterable[Event]) -> None:
        """Live events from the cockpit; those of other tasks are ignored."""
        tid = self.fleet_task.id
        self._pending.extend(ev for ev in events if ev.task_id == tid)

    def _append(self, events: Iterable[Event]) -> list[Event]:
        added = []
        for ev in events:
            key = (ev.attempt, ev.seq)
            if key <= self._last:
                continue
            self._last = key
            added.append(ev)
        self.events.extend(added)
        if len(self.events) > LOG_LIMIT:
            del self.events[: len(self.events) - LOG_LIMIT]
        return added

    def flush(self) -> None:
        if not self.loaded or not self._pending:
            return
        pending, self._pending = self._pending, []
        added = self._append(pending)
        log = self.query_one("#log", RichLog)
        for ev in added:
            if log_matches(ev, self._needle):
                log.write(event_line(ev, FULL_LINE, self._styles), scroll_end=None)
        if added:
            self._subtitle(log)

    def tick(self) -> None:
        """Redraw the overview from the live task (time, state, tokens); reload the history when
        the state or attempt changed."""
        task = self.current() or self.fleet_task
        self.fleet_task = task
        now = self.clock()
        key = (task, len(self.transitions), int(now))
        if key != self._overview_key:
            self._overview_key = key
            self.query_one("#overview", Static).update(
                overview(task, self.transitions, now, self.pull_request)
            )
        reload = (task.status, task.attempt, task.reason)
        if reload != self._reload_key:
            self._reload_key = reload
            self.run_worker(self._load_history(), group="detail-history", exclusive=True)

    async def _render_log(self, needle: str) -> None:
        log = self.query_one("#log", RichLog)
        log.clear()
        shown = [ev for ev in self.events if log_matches(ev, needle)]
        for i in range(0, len(shown), LOG_CHUNK):
            for ev in shown[i : i + LOG_CHUNK]:
                log.write(event_line(ev, FULL_LINE, self._styles))
            if needle != self._needle:
                return  # the search changed meanwhile; a newer render is on its way
            await asyncio.sleep(0)
        self._subtitle(log)

    def _subtitle(self, log: RichLog) -> None:
        total = len(self.events)
        if self._needle:
            shown = sum(1 for ev in self.events if log_matches(ev, self._needle))
            log.border_subtitle = f"{shown} of {total} lines"
        else:
            log.border_subtitle = f"{total} lines"

    def render_log(self, needle: str) -> None:
        self._needle = needle
        if self.loaded:
            self.run_worker(self._render_log(needle), group="detail-render", exclusive=True)

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "log-search":
            self.render_log(event.value)

    def action_search(self) -> None:
        self.query_one("#detail-tabs", TabbedContent).active = "tab-log"
        focus_now(self.query_one("#log-search", Input))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # "/" and the tab numbers are plain characters while typing in the search box
        return not (action in ("search", "tab") and isinstance(self.focused, Input))

    def action_tab(self, tab: str) -> None:
        self.query_one("#detail-tabs", TabbedContent).active = tab

    def action_review(self) -> None:
        """``c``: comment on the diff's lines; sending them is a follow-up (``fleet-tui send``)."""
        self.run_worker(self._review(), group="detail-review", exclusive=True)

    async def _review(self) -> None:
        from fleet_tui.scheduler.humans.followup import send
        from fleet_tui.screens.review import ReviewScreen

        task = self.fleet_task
        try:
            diff = await self.engine.diff(task.id)
        except Exception as exc:
            self.notify(inert(f"could not load the diff: {exc}"), severity="error")
            return
        if not diff.strip():
            self.notify("No diff to comment on yet.", severity="warning")
            return
        comments = self.__dict__.setdefault("review_comments", {})
        sender = getattr(self.app, "send", None)

        def send_text(text: str) -> None:
            if sender is not None:
                sender(lambda: send(cast(Any, self.engine), task.id, text))

        await self.app.push_screen(ReviewScreen(task.name, diff, comments, send_text))

    def action_close(self) -> None:
        self.dismiss(None)
