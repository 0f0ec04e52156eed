"""Task detail (Enter): everything about one task in four tabs.

Overview (spec, state, prompt, transitions), Attempts (outcome, exit code, verifier output), Diff
(``engine.diff``) and Log (``engine.events`` with a search box). Data is fetched once, in a worker,
when the screen opens; everything shown comes through the EngineAPI, never from disk.
"""

from __future__ import annotations

from collections.abc import Callable

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
    log_matches,
    state_text,
)
from fleet_tui.app.queue import focus_now
from fleet_tui.app.theme import ThemeStyles
from fleet_tui.scheduler.api import EngineAPI
from fleet_tui.scheduler.model import Attempt, Event, Task, Transition

LOG_LIMIT = 5000
FULL_LINE = 4000  # the log shows whole events (newlines folded); scroll sideways


def overview(task: Task, transitions: list[Transition], now: float) -> Group:
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
    if task.merged_commit:
        rows.append(("merged", task.merged_commit))
    if task.result_text:
        rows.append(("result", task.result_text))
    for key, value in rows:
        grid.add_row(Text(f"{key:<10}", style="bold"), Text(value))
    trans = Table.grid(padding=(0, 2))
    for _ in range(4):
        trans.add_column(no_wrap=True)
    for tr in transitions:
        trans.add_row(
            clock_seconds(tr.ts),
            f"{tr.src or '-'} -> {tr.dst}",
            f"#{tr.attempt}",
            Text(f"{tr.reason or ''} {('by ' + tr.actor) if tr.actor else ''}".strip()),
        )
    return Group(
        grid,
        Text("\nPrompt", style="bold"),
        Text(spec.prompt),
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
        parts.append(Text(head, style="bold"))
        if at.detail:
            parts.append(Text(at.detail))
        if at.verify_output:
            parts.append(Text("verifier output:", style="italic"))
            parts.append(Text(at.verify_output))
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
    ]

    def __init__(self, engine: EngineAPI, task: Task, clock: Callable[[], float]) -> None:
        super().__init__()
        self.engine = engine
        self.fleet_task = task
        self.clock = clock
        self.events: list[Event] = []

    def compose(self) -> ComposeResult:
        yield Static(Text(f"{self.fleet_task.name} · {self.fleet_task.id}", no_wrap=True), id="detail-title")
        with TabbedContent(id="detail-tabs"):
            with TabPane("Overview", id="tab-overview"), VerticalScroll():
                yield Static(Text("loading..."), id="overview")
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
        self.run_worker(self._load(), group="detail-load", exclusive=True)

    async def _load(self) -> None:
        ref = self.fleet_task.id
        now = self.clock()
        try:
            transitions = await self.engine.transitions(ref)
        except Exception as exc:
            transitions = []
            self.notify(f"transitions: {exc}", severity="error")
        self.query_one("#overview", Static).update(overview(self.fleet_task, transitions, now))
        try:
            attempts = await self.engine.attempts(ref)
            self.query_one("#attempts", Static).update(attempts_view(attempts))
        except Exception as exc:
            self.query_one("#attempts", Static).update(Text(f"could not load attempts: {exc}"))
        try:
            diff = await self.engine.diff(ref)
            self.query_one("#diff", Static).update(
                diff_text(diff, self._styles) if diff else Text("(no diff)")
            )
        except Exception as exc:
            self.query_one("#diff", Static).update(Text(f"could not load the diff: {exc}"))
        try:
            self.events = await self.engine.events(ref, None, LOG_LIMIT)
        except Exception as exc:
            self.events = []
            self.notify(f"events: {exc}", severity="error")
        self.render_log("")

    def render_log(self, needle: str) -> None:
        log = self.query_one("#log", RichLog)
        log.clear()
        shown = [ev for ev in self.events if log_matches(ev, needle)]
        for ev in shown:
            log.write(event_line(ev, FULL_LINE, self._styles))
        if needle:
            log.border_subtitle = f"{len(shown)} of {len(self.events)} lines"
        else:
            log.border_subtitle = f"{len(self.events)} lines"

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

    def action_close(self) -> None:
        self.dismiss(None)
