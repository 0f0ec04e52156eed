"""Pilot tests of the panes and screens: answering questions, the filter, the new-task form,
live updates cell by cell, the stream, help, the command palette, detail and the engine worker."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console, RenderableType
from rich.style import Style
from textual import events
from textual._compositor import LayoutUpdate
from textual.color import Color as TColor
from textual.dom import DOMNode
from textual.filter import Monochrome
from textual.geometry import Region
from textual.message import Message
from textual.pilot import Pilot
from textual.screen import Screen
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Input, RichLog, Static

from fleet_tui.app.app import FleetApp
from fleet_tui.app.main_screen import MainScreen
from fleet_tui.app.scrollbars import SteadyScrollBar
from fleet_tui.app.stream import FILL_LIMIT, MAX_LINES, UNDRAWN, StreamLog
from fleet_tui.scheduler.model import (
    FREE_TEXT,
    AgentEvent,
    Event,
    GaugesChanged,
    Notice,
    Question,
    QuestionChanged,
    Snapshot,
    TaskChanged,
)
from fleet_tui.scheduler.states import TaskStatus
from fleet_tui.screens.confirm import ConfirmScreen
from fleet_tui.screens.detail import DetailScreen
from fleet_tui.screens.help import HelpScreen
from fleet_tui.screens.new_task import NewTaskScreen

from . import scenarios as sc
from .helpers import count_renders, following_200_lines, type_text, wait_for

pytestmark = pytest.mark.anyio
SIZE = (80, 24)


def rendered(widget: Static) -> str:
    """The text a Static shows, whatever renderable it holds."""
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(widget.content)
    return console.export_text()


def header(app: FleetApp) -> str:
    return str(app.query_one("#header", Static).render())


# ------------------------------------------------------------------------------------ inbox


async def test_new_question_rings_once_and_is_answered_inline() -> None:
    engine = sc.several_running()
    app = sc.make_app(engine)
    q = Question("q-9", "t-0002", 2, sc.NOW, "Use UUID or int ids?")
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: engine.subscribers, "subscription")
        assert app.bells == 0
        engine.push(QuestionChanged(q))
        await wait_for(pilot, lambda: app.questions, "question")
        engine.push(QuestionChanged(q))  # the same question again
        app.pull()  # and the snapshot (which does not have it yet) must not drop it
        await pilot.pause()
        assert app.bells == 1
        assert "1 question" in header(app)
        assert app.queue.get_cell("t-0002", "state") == "asks a question"
        await pilot.press("a")
        await wait_for(pilot, lambda: isinstance(app.focused, Input) and app.focused.id == "answer-input")
        await type_text(pilot, "uuid please")
        await pilot.press("enter")
        await wait_for(pilot, lambda: engine.calls, "answer")
        assert engine.calls == [("answer", ("q-9", "uuid please"))]
        engine.push(QuestionChanged(replace(q, status="answered", answer="uuid please")))
        await wait_for(pilot, lambda: not app.questions, "question gone")
        assert "question" not in header(app)
        assert app.queue.get_cell("t-0002", "state") == "running"


async def test_answer_with_an_option() -> None:
    engine = sc.with_question()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        assert app.bells == 0  # questions already pending at start are not new
        await pilot.press("a")
        await wait_for(pilot, lambda: isinstance(app.focused, Input) and app.focused.id == "answer-input")
        await pilot.press("down", "down", "enter")  # first down picks choice 1, the second choice 2
        await wait_for(pilot, lambda: engine.calls, "answer")
        assert engine.calls == [("answer", ("q-0001", "Apache-2.0"))]
        await wait_for(pilot, lambda: app.focused is app.queue, "focus back on the queue")


async def test_answer_escape_cancels_and_empty_is_not_sent() -> None:
    engine = sc.with_question()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("a")
        await wait_for(pilot, lambda: isinstance(app.focused, Input) and app.focused.id == "answer-input")
        await pilot.press("down", "2", "enter")  # typing drops the choice; a number picks that one
        await wait_for(pilot, lambda: engine.calls, "answer")
        assert engine.calls == [("answer", ("q-0001", "Apache-2.0"))]
        engine.calls.clear()
        await pilot.press("a")
        await wait_for(pilot, lambda: app.inbox.answering is not None)
        await pilot.press("enter")  # empty: refused
        await pilot.pause()
        assert engine.calls == []
        await pilot.press("escape")
        await pilot.pause()
        assert app.inbox.answering is None
        assert engine.calls == []


async def test_an_answer_outside_the_choices_is_refused_in_place() -> None:
    """A question whose options are the only answers: what is not one of them is said at once,
    and the form stays open with the text to mend (it closed, and the typing was lost, when
    only the engine refused it). A question whose options are suggestions takes free text."""
    engine = sc.with_question()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("a")
        await wait_for(pilot, lambda: isinstance(app.focused, Input) and app.focused.id == "answer-input")
        hint = app.query_one("#answer-input", Input).placeholder
        assert "type its number" in hint and "type an answer" not in hint
        await type_text(pilot, "apache")
        await pilot.press("enter")
        await wait_for(
            pilot, lambda: any("is not one of the options" in n.message for n in app._notifications)
        )
        assert engine.calls == []
        assert app.inbox.answering is not None
        assert app.query_one("#answer-input", Input).value == "apache"
        await pilot.press("-", "2", ".", "0", "enter")  # "apache-2.0": any case is the option
        await wait_for(pilot, lambda: engine.calls, "answer")
        assert engine.calls == [("answer", ("q-0001", "Apache-2.0"))]

    free = replace(sc.QUESTION, options=(*sc.QUESTION.options, FREE_TEXT))
    engine = sc.with_question()
    snap = engine.snapshot()
    engine.set_snapshot(replace(snap, questions=(free,)))
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("a")
        await wait_for(pilot, lambda: isinstance(app.focused, Input) and app.focused.id == "answer-input")
        assert "type an answer" in app.query_one("#answer-input", Input).placeholder
        await type_text(pilot, "BSD-3, like the rest")
        await pilot.press("enter")
        await wait_for(pilot, lambda: engine.calls, "answer")
        assert engine.calls == [("answer", ("q-0001", "BSD-3, like the rest"))]


async def test_answer_without_questions_says_so() -> None:
    app = sc.make_app(sc.several_running())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("a")
        await wait_for(pilot, lambda: app._notifications)
        assert any("No pending questions" in n.message for n in app._notifications)


# ------------------------------------------------------------------------------------ filter


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        ("state:queued", ["t-0004"]),
        ("user", ["t-0002"]),  # t-0001 (done) is folded away behind a count
        ("state:done", ["t-0001"]),  # unless the filter asks for finished tasks
        ("coder:codex", ["t-0003"]),
        ("state:run coder:claude", ["t-0002"]),
        ("", ["t-0002", "t-0003", "t-0005", "t-0004"]),  # needs you, running/verifying, queued
    ],
)
async def test_filter(text: str, ids: list[str]) -> None:
    app = sc.make_app(sc.several_running())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("slash")
        await type_text(pilot, text)
        await pilot.press("enter")
        await pilot.pause()
        assert app.queue.task_ids() == ids
        await pilot.press("slash", "escape")
        await pilot.pause()
        assert app.queue.row_count == 4


# ------------------------------------------------------------------------------------ new task


async def test_new_task_validation_then_submit(tmp_path: Path) -> None:
    engine = sc.several_running()
    app = sc.make_app(engine)
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, NewTaskScreen), "form")
        form = app.screen
        assert isinstance(form, NewTaskScreen)
        form.query_one("#f-name", Input).value = "Bad Name!"
        form.query_one("#f-cwd", Input).value = str(tmp_path / "missing")
        form.query_one("#f-priority", Input).value = "high"
        form.query_one("#f-depends_on", Input).value = "user-api, nope"
        await pilot.press("ctrl+s")
        await pilot.pause()

        def error(key: str) -> str:
            widget = form.query_one(f"#e-{key}", Static)
            return str(widget.render()) if widget.display else ""

        assert "required" in error("prompt")
        assert "a-z" in error("name")
        assert "no such directory" in error("cwd")
        assert "whole number" in error("priority")
        assert "nope" in error("depends_on")
        assert engine.calls == []

        form.query_one("#f-prompt").focus()
        await type_text(pilot, "Add a search endpoint")
        form.query_one("#f-name", Input).value = "search-api"
        form.query_one("#f-cwd", Input).value = str(tmp_path)
        form.query_one("#f-priority", Input).value = "5"
        form.query_one("#f-depends_on", Input).value = "user-api"
        form.query_one("#f-verify", Input).value = "pytest -q"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: engine.calls, "add")
        await wait_for(pilot, lambda: not isinstance(app.screen, NewTaskScreen), "form closed")
    ((verb, (specs,)),) = engine.calls
    assert verb == "add"
    (spec,) = specs
    assert spec.name == "search-api"
    assert spec.prompt == "Add a search endpoint"
    assert spec.cwd == str(tmp_path)
    assert spec.priority == 5
    assert spec.depends_on == ("user-api",)
    assert spec.verify[0].run == "pytest -q"


async def test_new_task_duplicate_name() -> None:
    engine = sc.several_running()
    app = sc.make_app(engine)
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, NewTaskScreen))
        form = app.screen
        form.query_one("#f-name", Input).value = "user-api"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "already exists" in str(form.query_one("#e-name", Static).render())
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, NewTaskScreen))
        assert engine.calls == []


# ------------------------------------------------------------------------------------ live view


async def test_live_task_changes_repaint_one_line_not_the_table() -> None:
    engine = sc.several_running()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: engine.subscribers)
        table = app.queue
        table.tick = lambda: None  # type: ignore[method-assign]  # the once-a-second repaint of running rows
        rebuilds: list[int] = []
        real_rebuild = table._rebuild
        table._rebuild = lambda: (rebuilds.append(1), real_rebuild())  # type: ignore[method-assign,func-returns-value,assignment]
        lines: list[int] = []
        real_refresh_line = table.refresh_line
        table.refresh_line = lambda y: (lines.append(y), real_refresh_line(y))  # type: ignore[method-assign,func-returns-value,assignment]
        api = app.tasks["t-0002"]
        row = table.task_ids().index("t-0002") + 1  # line 0 is the column header
        engine.push(TaskChanged(replace(api, tokens=20_000, updated_at=sc.NOW)))
        # the cell changes at once, its line is repainted with the next frame: wait for both
        await wait_for(
            pilot, lambda: table.get_cell("t-0002", "tokens") == "20k" and lines, "tokens cell repainted"
        )
        assert lines == [row] and rebuilds == []
        new = replace(
            api,
            id="t-0009",
            spec=replace(api.spec, name="late-task"),
            status=TaskStatus.QUEUED,
            updated_at=sc.NOW + 1,  # newer than the snapshot: a pull in between must keep it
        )
        engine.push(TaskChanged(new))
        await wait_for(pilot, lambda: table.row_count == 5, "new row")
        snap = engine.snapshot()
        engine.set_snapshot(Snapshot(taken_at=sc.NOW, tasks=snap.tasks[1:], gauges=snap.gauges))
        app.pull()
        await pilot.pause()
        assert "t-0001" not in table.model.tasks and "t-0009" in table.task_ids()


async def test_stream_fills_then_follows_live_without_duplicates() -> None:
    engine = sc.several_running()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: engine.subscribers)
        app.queue.go_bottom()  # another task first, so that moving to user-api fills the stream
        await pilot.pause()
        app.queue.select_id("t-0002")
        await wait_for(pilot, lambda: app.stream.flushes, "fill")
        filled = len(app.stream.lines)
        assert filled == 10
        old = engine.events_by_task["t-0002"][-1]
        engine.push(
            AgentEvent(old),  # already shown by the fill
            AgentEvent(Event("t-0002", 2, 10, sc.NOW, "text", text="live line")),
            AgentEvent(Event("t-0003", 1, 1, sc.NOW, "text", text="other task")),
        )
        await pilot.pause()
        app.stream.flush()
        assert len(app.stream.lines) == filled + 1
        assert "live line" in app.stream.lines[-1].text
        assert all("other task" not in line.text for line in app.stream.lines)


async def test_the_stream_is_filled_after_the_cursor_is_drawn_and_only_where_it_rests() -> None:
    """A cursor move reaches the screen before the new task's stored events are read and drawn
    (under a loud fleet the read and 200 lines drawn used to delay the cursor itself), and a key
    held down reads nothing for the rows the cursor only passed over."""
    engine = sc.several_running()
    app = sc.make_app(engine)
    reads: list[tuple[str, int]] = []
    load = engine.events

    async def events(ref: str, attempt: int | None = None, limit: int = 2000) -> list[Event]:
        reads.append((ref, app.queue.lines_drawn))
        return await load(ref, attempt, limit)

    engine.events = events  # type: ignore[method-assign]
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: engine.subscribers)
        app.queue.select_id("t-0004")
        await wait_for(pilot, lambda: app.stream.task_id == "t-0004" and not app.stream.filling, "first fill")
        reads.clear()
        drawn = app.queue.lines_drawn
        app.queue.select_id("t-0002")
        await wait_for(pilot, lambda: app.stream.task_id == "t-0002" and not app.stream.filling, "fill")
        assert [ref for ref, _ in reads] == ["t-0002"]
        assert reads[0][1] > drawn, "the stored events were read before the cursor's row was drawn"
        assert len(app.stream.lines) == 10
        # a key held down: the stream follows row after row within one turn of the loop
        reads.clear()
        for ref in ("t-0003", "t-0004", "t-0002"):
            app.stream.follow(ref, lambda ref=ref: events(ref, None, 200))  # type: ignore[misc]
        await wait_for(pilot, lambda: not app.stream.filling, "the last fill")
        assert [ref for ref, _ in reads] == ["t-0002"]
        assert app.stream.task_id == "t-0002" and len(app.stream.lines) == 10


async def test_gauges_and_notice_events() -> None:
    engine = sc.several_running()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: engine.subscribers)
        engine.set_paused(True)  # the engine's snapshot agrees, whenever the 1 s pull runs
        g = engine.snapshot().gauges
        engine.push(GaugesChanged(g), Notice("lost 3 batches"))
        await wait_for(pilot, lambda: app.snap.gauges.paused)
        app.pull()
        assert "PAUSED" in header(app)
        assert any("lost 3 batches" in n.message for n in app._notifications)


async def test_engine_runs_as_a_worker() -> None:
    started: list[bool] = []

    async def run_engine() -> None:
        started.append(True)

    app = sc.make_app(sc.empty(), run_engine=run_engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: started, "engine worker")


async def test_engine_crash_is_shown() -> None:
    async def run_engine() -> None:
        raise RuntimeError("store is locked")

    app = sc.make_app(sc.empty(), run_engine=run_engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: any("store is locked" in n.message for n in app._notifications))
        assert app.is_running


# ------------------------------------------------------------------------------------ screens


async def test_help_lists_every_binding() -> None:
    app = sc.make_app(sc.several_running())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        assert isinstance(app.screen, HelpScreen)
        listed = {(key, text) for _, rows in app.screen.sections for key, text in rows}
        keys = {key for key, _ in listed}
        assert {"n", "k", "p", "P", "r", "c", "m", "s", "/", "?", "q", "g", "G", "a", "⏎"} <= keys
        for key, _, description in app.action_table():
            assert (key, description) in listed
        assert {"ctrl+p", "tab / shift+tab"} <= keys
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen))
        first = app.screen_stack[-1]
        await pilot.press("question_mark")  # the help is kept: the second opening is the same one
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        again = app.screen
        await pilot.press("question_mark")  # ? closes it too
        await wait_for(pilot, lambda: app.screen is first)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: app.screen is again)
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is first)


async def test_command_palette_runs_actions() -> None:
    engine = sc.several_running()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+p")
        await type_text(pilot, "kill")
        await pilot.pause()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), "kill confirm from palette")


async def test_detail_screen_and_log_search() -> None:
    engine = sc.parked()
    app = sc.make_app(engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen), "detail")
        screen = app.screen
        assert isinstance(screen, DetailScreen)
        log = screen.query_one("#log", RichLog)
        await wait_for(pilot, lambda: screen.events, "events")
        assert "verify_failed" in rendered(screen.query_one("#overview", Static))
        assert "1 failed, 12 passed" in rendered(screen.query_one("#attempts", Static))
        assert "def refund(x: int)" in rendered(screen.query_one("#diff", Static))
        await pilot.press("slash")  # shows the log tab and focuses the search
        await wait_for(pilot, lambda: len(log.lines) == 5, "log")
        await type_text(pilot, "refund")
        await pilot.pause()
        assert len(log.lines) == 2
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, DetailScreen))


async def test_the_stream_draws_the_lines_in_view_and_the_others_when_scrolled_to() -> None:
    """A fill of 200 events draws the screenful at the end of the log, which the pane shows; a
    line above it is drawn when it is scrolled into view, with the text of its own event."""
    engine = sc.several_running()
    engine.events_by_task["t-0002"] = [
        Event("t-0002", 2, i, sc.NOW, "text", text=f"line {i:03d}") for i in range(200)
    ]
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        app.queue.go_bottom()
        await pilot.pause()
        app.queue.select_id("t-0002")
        await wait_for(pilot, lambda: app.stream.task_id == "t-0002" and app.stream.flushes, "fill")
        stream = app.stream
        assert len(stream.lines) == 200
        undrawn = [i for i, line in enumerate(stream.lines) if line is UNDRAWN]
        assert undrawn and len(undrawn) >= 200 - SIZE[1], "every line was drawn, not only those in view"
        assert "line 199" in stream.lines[-1].text
        stream.scroll_home(animate=False, immediate=True)
        await wait_for(pilot, lambda: stream.lines[0] is not UNDRAWN, "the top line drawn")
        assert "line 000" in stream.lines[0].text and "line 001" in stream.lines[1].text
        assert stream.lines[150] is UNDRAWN  # never shown, never drawn


async def test_live_lines_a_screenful_above_the_view_are_not_kept_drawn() -> None:
    """Following a live agent, each line is drawn as it comes; once it is more than a screenful
    above the view it is kept as its event only (the screen lines were most of what Python's
    collector walked under a loud fleet), and drawn again with its own text when scrolled to."""
    engine = sc.several_running()
    engine.events_by_task["t-0002"] = []
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: engine.subscribers)
        app.queue.select_id("t-0002")
        await wait_for(pilot, lambda: app.stream.task_id == "t-0002" and not app.stream.filling, "fill")
        stream = app.stream
        for start in range(0, 200, 10):
            engine.push(
                *(
                    AgentEvent(Event("t-0002", 2, i, sc.NOW, "text", text=f"line {i:03d}"))
                    for i in range(start, start + 10)
                )
            )
            await wait_for(
                pilot,
                lambda: bool(stream.lines) and f"line {start + 9:03d}" in stream.lines[-1].text,  # noqa: B023
                "drawn",
            )
        drawn = [i for i, line in enumerate(stream.lines) if line is not UNDRAWN]
        assert len(stream.lines) == 200
        assert len(drawn) <= 2 * stream.size.height and drawn[-1] == 199
        stream.scroll_home(animate=False, immediate=True)
        await wait_for(pilot, lambda: stream.lines[0] is not UNDRAWN, "the top line drawn")
        assert "line 000" in stream.lines[0].text and "line 001" in stream.lines[1].text


async def test_live_lines_wait_while_a_dialog_covers_the_panes_and_come_after_it_closes() -> None:
    """Closing a dialog is drawn without the live lines that came while it was open (under a
    loud fleet they made every close a redraw of the stream); they follow a frame later."""
    engine = sc.several_running()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: engine.subscribers)
        app.queue.select_id("t-0002")
        await wait_for(pilot, lambda: app.stream.task_id == "t-0002" and app.stream.flushes, "fill")
        filled = len(app.stream.lines)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "help")
        engine.push(AgentEvent(Event("t-0002", 2, 10, sc.NOW, "text", text="while covered")))
        await wait_for(pilot, lambda: app.stream.pending, "the line buffered")
        app._frame()  # the live frame's timer firing while the help is open
        assert len(app.stream.lines) == filled and app.stream.pending
        await pilot.press("escape")
        await wait_for(pilot, lambda: len(app.stream.lines) == filled + 1, "the held line drawn")
        assert "while covered" in app.stream.lines[-1].text and not app.stream.pending


async def test_a_snapshot_waits_while_a_dialog_covers_the_panes_and_comes_after_it_closes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gauges, sparklines and elapsed times a snapshot brings wait under a dialog too: redrawn
    beneath it they made the uncovered screen a fresh draw of those panes (under a loud fleet, 8
    of a slow close's 14 ms), where now it is drawn from their kept lines."""
    engine = sc.several_running()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        shown: list[float] = []
        gauges_show = app.gauges.show

        def counted(snap: Snapshot, now: float) -> None:
            shown.append(now)
            gauges_show(snap, now)

        monkeypatch.setattr(app.gauges, "show", counted)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "help")
        before = len(shown)
        app.pull()  # the pull timer firing while the help is open
        assert len(shown) == before
        await pilot.press("escape")
        await wait_for(pilot, lambda: len(shown) > before, "the held snapshot shown")
        app.pull()
        assert len(shown) == before + 2  # uncovered: at once again


async def test_a_closed_dialog_uncovers_the_queue_as_drawn_last_and_the_next_frame_updates_it() -> None:
    """Under a loud fleet nearly every running task's line changed while a dialog covered the
    queue; the close drew each of them anew. The uncovered queue shows its lines as drawn last,
    and the frame after the close brings the changed ones up to date."""
    engine = sc.several_running()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: engine.subscribers)
        await pilot.pause()
        main, queue = app.screen, app.queue
        running = [t for t in app.tasks.values() if t.status == TaskStatus.RUNNING]
        assert running
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "help")
        engine.push(*(TaskChanged(replace(t, tokens=77_777, updated_at=sc.NOW + 5)) for t in running))
        await wait_for(pilot, lambda: all(app.tasks[t.id].tokens == 77_777 for t in running), "changes")
        made: list[str] = []
        line = queue._line

        def counted(cells, style, width):  # type: ignore[no-untyped-def]
            made.append(cells[0][0])
            return line(cells, style, width)

        queue._line = counted  # type: ignore[method-assign]
        shown: list[tuple[int, str]] = []  # lines made when the main screen was drawn whole, and the queue
        display = app._display

        def displayed(screen: Screen[object], update: RenderableType | None) -> None:
            display(screen, update)
            if screen is main and isinstance(update, LayoutUpdate):
                region = queue.content_region
                rows = update.strips[region.y : region.bottom]
                shown.append((len(made), "".join(strip.text for line in rows for strip in line)))

        app._display = displayed  # type: ignore[method-assign,assignment]
        await pilot.press("escape")
        await wait_for(pilot, lambda: bool(shown), "the uncovered screen drawn")
        lines_made, queue_shown = shown[0]
        assert lines_made == 0 and "78k" not in queue_shown, (made, queue_shown)  # the lines as drawn last
        await wait_for(pilot, lambda: len(made) >= len(running) and not queue.repaint_pending, "updated")
        await pilot.pause()
        now_shown = "".join(strip.text for strip in queue.render_lines(queue.size.region))
        assert now_shown.count("78k") == len(running)
        kept = queue.render_lines(queue.size.region)
        queue._styles_cache.clear()
        assert kept == Widget.render_lines(queue, queue.size.region)  # as Textual draws them now
        # only the elapsed times changed (an hour on): the uncovering draw shows the lines as
        # drawn last, and leaves them to the next frame
        app.clock = lambda: sc.NOW + 3600
        queue.kept_lines_will_do()
        assert queue.render_lines(queue.size.region) == kept
        assert queue.repaint_pending
        queue.repaint_changed()
        assert queue.render_lines(queue.size.region) != kept


class _NoTick:
    """A screen update timer that never ticks (it is paused and resumed, never fires)."""

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass


async def test_containers_their_panes_cover_are_not_drawn_and_the_screen_looks_the_same() -> None:
    """A full repaint (closing a dialog) walks every widget Textual draws: the rows holding the
    panes are left out (``visibility: hidden``, their children shown), and the screen drawn
    without them is the one drawn with them, cell for cell and style for style."""
    app = sc.make_app(sc.gauges_fleet())
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        screen = app.screen
        hidden = [app.query_one("#top"), app.query_one("#bottom")]
        drawn = screen._compositor.visible_widgets
        assert not [w for w in hidden if w in drawn]
        shown = [app.queue_pane, app.stream, app.inbox, app.gauges, app.gauges.pulse]
        assert all(w in drawn for w in shown)
        without = screen._compositor.render_strips()
        for widget in hidden:
            widget.styles.visibility = "visible"
        await pilot.pause()
        assert all(w in screen._compositor.visible_widgets for w in hidden)
        assert screen._compositor.render_strips() == without


def _record_draws(app: FleetApp) -> list[tuple[object, type]]:
    """Each screen update the app hands its driver from now on: (the screen, the update's type)."""
    drawn: list[tuple[object, type]] = []
    display = app._display

    def recorded(screen: object, update: RenderableType | None) -> None:
        display(screen, update)  # type: ignore[arg-type]
        drawn.append((screen, type(update)))

    app._display = recorded  # type: ignore[method-assign,assignment]
    return drawn


@asynccontextmanager
async def _untimed_cockpit(size: tuple[int, int] = SIZE) -> AsyncIterator[FleetApp]:
    """A cockpit with several running rows whose main screen's update timer never ticks: what
    is drawn is drawn at once, by the cockpit itself."""
    app = sc.make_app(sc.several_running())
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.queue.row_count > 1, "rows")
        await pilot.pause()
        app.screen._Screen__update_timer = _NoTick()  # type: ignore[attr-defined]
        yield app


async def _until(condition: Callable[[], bool]) -> None:
    """Let the app run until ``condition()`` holds (bounded). Not ``pilot.pause``: it draws the
    screen itself, as the timer's tick would."""
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.01)


def _record_widgets_drawn(screen: Screen[Any]) -> list[set[Widget]]:
    """The widgets of each of ``screen``'s draws from now on, in order."""
    drawn: list[set[Widget]] = []
    update_widgets = screen._compositor.update_widgets

    def recorded(widgets: set[Widget]) -> None:
        drawn.append(set(widgets))
        update_widgets(widgets)

    screen._compositor.update_widgets = recorded  # type: ignore[method-assign]
    return drawn


def _as_the_key_is_handled(main: MainScreen, change: Callable[[], object]) -> None:
    """``change`` made just after the next key is in hand (``MainScreen.key_in_hand``): a live
    frame reaching the screen as the key was handled."""
    key_in_hand = main.key_in_hand

    def then_the_change() -> None:
        key_in_hand()
        change()

    main.key_in_hand = then_the_change  # type: ignore[method-assign]


def _key_down(app: FleetApp) -> int:
    """``down``, sent the way the terminal's driver sends it; the cursor's row before it."""
    row = app.queue.cursor_row
    assert app._driver is not None
    app._driver.send_message(events.Key("down", None))
    return row


async def _help_over_the_main_screen(pilot: Pilot[None]) -> Screen[object]:
    """Opens the help over the cockpit's main screen; returns the main screen."""
    main = pilot.app.screen
    await pilot.press("question_mark")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, HelpScreen), "help")
    return main


async def test_closing_a_dialog_draws_the_uncovered_screen_at_once_not_at_the_next_tick() -> None:
    """Textual draws a screen from a 60 Hz update timer; under a loud fleet that timer had often
    just ticked, and a close waited for the next tick with nothing else to do. Here the main
    screen's timer never ticks: the uncovered screen is drawn whole by the close itself."""
    app = sc.make_app(sc.several_running())
    async with app.run_test(size=SIZE) as pilot:
        main = await _help_over_the_main_screen(pilot)
        main._Screen__update_timer = _NoTick()  # type: ignore[attr-defined]
        drawn = _record_draws(app)
        await pilot.press("escape")
        await _until(lambda: (main, LayoutUpdate) in drawn)
        assert app.screen is main
        assert (main, LayoutUpdate) in drawn, "the uncovered screen was not drawn whole"


async def test_closing_a_dialog_draws_the_uncovered_screen_whole_once() -> None:
    """The close draws the uncovered screen whole at once; Textual then asks for a second whole
    repaint of it as it removes the dialog (``App._replace_screen``), which the timer's next tick
    drew again (3 ms idle, more under a loud fleet, and a key pressed just after the close paid
    for it). Nothing changed between the two: the screen is drawn whole once per close."""
    app = sc.make_app(sc.several_running())
    async with app.run_test(size=SIZE) as pilot:
        main = await _help_over_the_main_screen(pilot)
        await pilot.pause()
        drawn = _record_draws(app)
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is main, "help closed")
        for _ in range(3):  # the dialog put away (``App._replace_screen``) and the next ticks
            await pilot.pause()
        assert drawn.count((main, LayoutUpdate)) == 1, drawn
        assert not main._repaint_required


async def test_a_cursor_move_is_drawn_at_once_not_at_the_next_tick() -> None:
    """A key's change is drawn as soon as the cockpit is idle after it (``MainScreen.key_in_hand``),
    not at the screen's 60 Hz update timer's next tick (a cursor move waited 0-16 ms for it after
    about 1 ms of work). Here the timer never ticks, and the key is posted as the terminal's
    driver posts it (``pilot.press`` draws the screen itself, as the tick would)."""
    async with _untimed_cockpit() as app:
        main = app.screen
        drawn = _record_draws(app)
        row = app.queue.cursor_row
        assert app._driver is not None
        app._driver.send_message(events.Key("down", None))  # as the driver's input thread does
        await _until(lambda: app.queue.cursor_row != row and any(screen is main for screen, _ in drawn))
        assert app.queue.cursor_row == row + 1
        assert any(screen is main for screen, _ in drawn), "the moved cursor waited for the screen's timer"


async def test_a_key_draws_its_own_change_at_once_and_leaves_a_waiting_live_pane_for_the_tick() -> None:
    """A live frame's pane waiting to be drawn when a key comes (a loud fleet's stream, 3-5 ms
    of drawing) is not drawn with the key's change: the moved cursor is drawn at once, the
    stream at the timer's next tick."""
    async with _untimed_cockpit() as app:
        main = app.screen
        app.stream.refresh()  # a live frame's change, waiting for the tick
        await _until(lambda: app.stream in main._dirty_widgets)
        assert app.stream in main._dirty_widgets
        drawn = _record_widgets_drawn(main)
        row = _key_down(app)
        await _until(lambda: bool(drawn))
        assert app.queue.cursor_row == row + 1
        assert drawn, "the moved cursor waited for the screen's timer"
        assert app.queue in drawn[0]
        assert app.stream not in drawn[0], "the waiting stream was drawn with the key's change"
        assert app.stream in main._dirty_widgets
        main._on_timer_update()  # the tick
        assert app.stream in drawn[-1]


@pytest.mark.parametrize("lines_come", ["before the key", "as the key is handled"])
async def test_a_keys_draw_leaves_the_live_streams_new_lines_for_the_tick(lines_come: str) -> None:
    """The live stream's new lines (waiting for the next frame when the key came, or flushed by
    a live frame just as it was handled) are not drawn with the key's change: the moved cursor
    is drawn at once, the stream at the tick. Textual asks every pane in the queue's row of the
    screen for its rows when the queue's lines are drawn, and cuts away the rest: the stream
    answers with the rows it drew last instead of drawing its new lines to be cut away."""
    async with _untimed_cockpit(size=(160, 48)) as app:
        main = app.screen
        assert isinstance(main, MainScreen)
        stream = app.stream
        app.queue.select_id("t-0004")  # the last task row: below it, the folded finished tasks
        await _until(lambda: stream.task_id == "t-0004" and stream.size.height > 20)
        main._on_timer_update()  # the fill waits for the screen's refresh
        await _until(lambda: not stream.filling)
        assert stream.task_id == "t-0004" and not stream.filling
        main._on_timer_update()  # all drawn: nothing waits
        new = [Event("t-0004", 9, i, sc.NOW, "text", text=f"new line {i}") for i in range(40)]
        if lines_come == "before the key":
            stream._write_events(new)
            await _until(lambda: stream in main._dirty_widgets)
            assert stream in main._dirty_widgets
        else:
            _as_the_key_is_handled(main, lambda: stream._write_events(new))  # a live frame's flush
        before = stream.rows_drawn
        drawn = _record_widgets_drawn(main)
        row = _key_down(app)
        await _until(lambda: bool(drawn) and stream in main._dirty_widgets)
        assert app.queue.cursor_row == row + 1 and app.queue.selected_id is None  # (the folded row)
        assert drawn and app.queue in drawn[0], "the moved cursor was not drawn at once"
        assert stream.task_id == "t-0004"
        assert all(stream not in d for d in drawn), "the stream's new lines were drawn with the key's"
        assert stream.rows_drawn == before, "the stream's new lines were drawn in the key's draw"
        main._on_timer_update()  # the tick
        assert stream in drawn[-1] and stream.rows_drawn > before
        rows = [strip.text for strip in stream.render_lines(stream.region.size.region)]
        assert "new line 39" in "".join(rows), rows


async def test_a_keys_draw_leaves_the_gauges_and_header_of_a_live_frame_for_the_tick() -> None:
    """The once-a-second snapshot redraws the gauges and the header (5-9 ms under a loud
    fleet); one that lands just as a key is handled is drawn at the tick, not with the key."""
    async with _untimed_cockpit(size=(160, 48)) as app:
        main = app.screen
        assert isinstance(main, MainScreen)
        main._on_timer_update()  # all drawn: nothing waits
        _as_the_key_is_handled(main, lambda: (app.gauges.refresh(), app.header.refresh()))  # a snapshot
        drawn = _record_widgets_drawn(main)
        row = _key_down(app)
        await _until(lambda: bool(drawn) and app.gauges in main._dirty_widgets)
        assert app.queue.cursor_row == row + 1
        assert drawn and app.queue in drawn[0], "the moved cursor was not drawn at once"
        assert app.gauges not in drawn[0] and app.header not in drawn[0]
        main._on_timer_update()  # the tick
        assert app.gauges in drawn[-1] and app.header in drawn[-1]


def _frame_timer_fires(app: FleetApp) -> None:
    """The live frame's timer fires now (not when it was set to)."""
    timer = app._frame_timer
    assert timer is not None and app._frame_pending
    timer.stop()
    app._frame()


def _record_frames_and_key_draws(app: FleetApp, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """In order from now on: each live frame's flush of the stream ("frame"), each snapshot's
    panes shown ("snapshot"), each key's change drawn ("key drawn")."""
    order: list[str] = []

    def recorded(name: str, fn: Callable[..., None]) -> Callable[..., None]:
        def then(*args: Any) -> None:
            order.append(name)
            fn(*args)

        return then

    monkeypatch.setattr(app.stream, "flush", recorded("frame", app.stream.flush))
    monkeypatch.setattr(app, "_show_snapshot", recorded("snapshot", app._show_snapshot))
    monkeypatch.setattr(app, "key_drawn", recorded("key drawn", app.key_drawn))
    return order


async def test_live_work_due_as_a_key_arrives_waits_for_the_keys_draw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A key's handling runs across a few turns of the loop (the app, the queue, the key coming
    back): a live frame's timer or the snapshot's pull firing between two of them ran first (the
    stream's new lines and the snapshot's panes were 1-2 ms of the slowest cursor moves under 32
    agents at 200 events/s). Both wait for the key's change to be drawn, and come right after."""
    async with _untimed_cockpit(size=(160, 48)) as app:
        tid = app.stream.task_id
        assert tid is not None
        order = _record_frames_and_key_draws(app, monkeypatch)
        app.apply([AgentEvent(Event(tid, 9, 0, sc.NOW, "text", text="a live line"))])
        assert app.stream.pending and app._frame_pending
        row = _key_down(app)  # as the terminal's driver hands it over
        _frame_timer_fires(app)  # before the app got to the key
        app.pull()  # and the snapshot's
        assert order == [] and app.stream.pending, "live work ran before the key"
        await _until(lambda: "frame" in order)
        assert app.queue.cursor_row == row + 1
        assert order[0] == "key drawn" and order[1:] == ["snapshot", "frame"], order
        assert not app.stream.pending


async def test_a_live_frame_that_waited_for_a_key_waits_for_the_next_one_typed_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``escape`` then ``down``, typed fast: the frame that waited for the first key, due again
    as the second arrives, waits for that one too (it ran in the middle of the cursor move)."""
    async with _untimed_cockpit(size=(160, 48)) as app:
        tid = app.stream.task_id
        assert tid is not None
        order = _record_frames_and_key_draws(app, monkeypatch)
        app.apply([AgentEvent(Event(tid, 9, 0, sc.NOW, "text", text="a live line"))])
        row = _key_down(app)
        _frame_timer_fires(app)  # waits for the first key
        _key_down(app)
        _frame_timer_fires(app)  # its wait is over as the second key arrives: waits for that one
        assert order == [] and app.stream.pending, "the frame ran between the keys"
        await _until(lambda: "frame" in order and app.queue.cursor_row == row + 2)
        assert order[0] == "key drawn" and "frame" in order, order
        assert app.queue.cursor_row == row + 2


async def test_a_key_a_text_field_takes_holds_a_live_frame_back_briefly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A key that never comes back to the cockpit (typed into the filter) is never drawn as a
    key's: the frame due waits for it ``KEY_FIRST_S`` at most, then comes."""
    engine = sc.several_running()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: engine.subscribers)
        await pilot.press("slash")
        await wait_for(pilot, lambda: app.focused is app.filter_input, "the filter open")
        tid = app.stream.task_id
        assert tid is not None
        order = _record_frames_and_key_draws(app, monkeypatch)
        app.apply([AgentEvent(Event(tid, 9, 0, sc.NOW, "text", text="a live line"))])
        assert app._driver is not None
        app._driver.send_message(events.Key("a", "a"))
        _frame_timer_fires(app)  # as the key arrives: it waits
        assert app.stream.pending
        await wait_for(pilot, lambda: not app.stream.pending, "the frame come")
        assert app.filter_input.value == "a" and "frame" in order and "key drawn" not in order


@pytest.mark.parametrize("key", ["escape", "question_mark"])
async def test_the_key_that_closes_the_help_is_taken_by_the_app_not_passed_down_the_dialog(key: str) -> None:
    """The help's closing keys are priority bindings: the cockpit acts on them as it takes the
    key, instead of handing it to the dialog's scrolling body, which passes it up to the dialog
    and then to the app, a turn of the loop each (under a loud fleet those hops were a third of
    a close)."""
    app = sc.make_app(sc.several_running())
    async with app.run_test(size=SIZE) as pilot:
        main = app.screen
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "help")
        passed: list[Message] = []
        for node in app.screen.focused.ancestors_with_self[:-1]:  # type: ignore[union-attr]
            post = node.post_message

            def recorded(message: Message, post: Callable[[Message], bool] = post) -> bool:
                if isinstance(message, events.Key):
                    passed.append(message)
                return post(message)

            node.post_message = recorded  # type: ignore[method-assign]
        await pilot.press(key)
        await wait_for(pilot, lambda: app.screen is main, "help closed")
        assert passed == []


async def test_stream_is_batched_and_capped() -> None:
    engine = sc.several_running()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        app.queue.select_id("t-0002")
        await wait_for(pilot, lambda: app.stream.flushes, "fill")
        before = len(app.stream.lines)
        app.stream.offer([Event("t-0002", 3, i, sc.NOW, "text", text=f"line {i}") for i in range(3000)])
        assert len(app.stream.lines) == before  # buffered until the timer flushes
        app.stream.flush()
        assert len(app.stream.lines) == MAX_LINES
        assert "line 2999" in app.stream.lines[-1].text


async def test_a_stream_redraw_reads_its_style_once_not_per_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drawing the stream pane asks for its style (a walk over every ancestor's styles) once per
    pass; ``RichLog`` asked on every line, a third of a scrolling pane's redraw. Counted, not timed;
    the lines drawn are the same (the snapshots hold the look)."""
    engine = sc.several_running()
    app = sc.make_app(engine)
    async with app.run_test(size=(120, 48)) as pilot:
        app.queue.select_id("t-0002")
        await wait_for(pilot, lambda: app.stream.flushes, "fill")
        stream = app.stream
        region = Region(0, 0, stream.size.width, stream.size.height)
        stream.refresh()
        before = [strip.text for strip in stream.render_lines(region)]
        asks = 0
        style_of = vars(DOMNode)["rich_style"].fget

        def counted(node: DOMNode) -> Style:
            nonlocal asks
            if node is stream:
                asks += 1
            return style_of(node)

        monkeypatch.setattr(DOMNode, "rich_style", property(counted))
        stream.refresh()
        assert [strip.text for strip in stream.render_lines(region)] == before
        assert stream.size.height > 10 and asks <= 2


async def test_detail_tabs_by_number() -> None:
    app = sc.make_app(sc.parked())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen), "detail")
        tabs = app.screen.query_one("#detail-tabs")
        for key, tab in [("2", "tab-attempts"), ("3", "tab-diff"), ("4", "tab-log"), ("1", "tab-overview")]:
            await pilot.press(key)
            await pilot.pause()
            assert tabs.active == tab  # type: ignore[attr-defined]


async def test_stream_lines_follow_the_pane_width() -> None:
    """A line is cut to the pane's width when written; when the terminal is resized every kept
    line is rendered again at the new width (a field failure: lines cut during the first layout
    stayed cut at 42 columns in a 120-column tmux pane, hiding the end of the agent's output)."""
    engine = sc.several_running()
    app = sc.make_app(engine)
    long = "start " + "x" * 300 + " end"
    async with app.run_test(size=(60, 24)) as pilot:
        app.queue.select_id("t-0002")
        await wait_for(pilot, lambda: app.stream.flushes, "fill")
        app.stream.offer([Event("t-0002", 9, 1, sc.NOW, "text", text=long)])
        app.stream.flush()
        stream = app.stream
        narrow = stream.lines[-1].text
        assert narrow.endswith("…") and len(narrow) == stream.scrollable_content_region.width
        count = len(stream.lines)
        await pilot.resize_terminal(200, 24)
        await wait_for(pilot, lambda: stream.scrollable_content_region.width > len(narrow), "a wider pane")
        wide = stream.scrollable_content_region.width
        await wait_for(pilot, lambda: len(stream.lines[-1].text) == wide, "the line at the new width")
        assert len(stream.lines) == count and stream.lines[-1].text.endswith("…")
        assert all(len(line.text) <= wide for line in stream.lines)
        await pilot.resize_terminal(60, 24)
        await wait_for(
            pilot,
            lambda: (
                stream.scrollable_content_region.width < wide
                and len(stream.lines[-1].text) == stream.scrollable_content_region.width
            ),
            "cut again when narrower",
        )


async def test_stream_says_why_it_follows_no_task() -> None:
    """Opened on a queue whose tasks all finished (folded away), the stream says so and how to
    show them, not "No tasks yet"; ``f`` shows them and the stream follows the selected one."""
    done = [t for t in sc.running_tasks() if t.status in (TaskStatus.DONE,)]
    assert done
    snap = Snapshot(taken_at=sc.NOW, tasks=tuple(done), hosts=(sc.HOST,), gauges=sc.base_gauges())
    engine = sc.FakeEngine(snap)
    engine.events_by_task[done[0].id] = sc.stream_events(done[0].id)
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.stream.lines, "a line in the stream")
        said = " ".join(line.text.strip() for line in app.stream.lines)
        assert "finished and folded away: press f to show them" in said
        assert "No tasks yet" not in said
        await pilot.press("f")
        await wait_for(pilot, lambda: app.stream.task_id == done[0].id, "the stream following the task")
        await wait_for(pilot, lambda: app.stream.flushes, "fill")
        assert all("folded away" not in line.text for line in app.stream.lines)

    app = sc.make_app(sc.empty())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.stream.lines, "a line in the stream")
        assert "No tasks yet" in app.stream.lines[0].text


async def test_the_streams_own_lines_wrap_instead_of_being_cut() -> None:
    """A hint longer than the pane is wrapped, every word on screen (it was cut at the pane's edge:
    "press f to show the"); a wider pane takes it on one line again, a narrower one wraps it again."""
    hint = "No tasks yet: press n to add one, or run `fleet-tui load tasks.toml`."
    app = sc.make_app(sc.empty())
    async with app.run_test(size=(160, 30)) as pilot:
        stream = app.stream

        def said() -> str:
            return " ".join(line.text.strip() for line in stream.lines)

        def fits() -> bool:
            return all(line.cell_length <= stream.scrollable_content_region.width for line in stream.lines)

        await wait_for(pilot, lambda: stream.lines, "a line in the stream")
        assert stream.scrollable_content_region.width < len(hint)  # the case: a pane narrower than the hint
        assert fits() and said() == hint and len(stream.lines) == 2
        await pilot.resize_terminal(200, 30)
        await wait_for(pilot, lambda: [line.text for line in stream.lines] == [hint], "one line when it fits")
        await pilot.resize_terminal(160, 30)
        await wait_for(pilot, lambda: len(stream.lines) == 2 and fits(), "wrapped again")
        assert said() == hint


async def test_a_live_frame_due_as_the_cockpit_closes_does_nothing() -> None:
    """A frame timer set just before the cockpit closed fires after its screens are gone: it did
    ``self.screen`` and the quit ended in a ScreenStackError traceback (seen in
    test_the_cockpits_loop_never_runs_engine_work: 3 runs of 7 of tests/app under -n 2)."""
    app = sc.make_app(sc.empty())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
    assert not app.screen_stack  # what the late timer meets
    app._frame()  # nothing to draw, nothing raised


async def test_the_streams_scroll_bar_is_redrawn_only_when_it_would_look_different() -> None:
    """A log long enough that its thumb is one cell keeps its scroll bar as drawn while it grows
    at its end (textual redrew the bar for every line written); scrolling it home moves the thumb
    and draws the bar again."""
    long = 1200
    engine = sc.several_running()
    engine.events_by_task["t-0002"] = [
        Event("t-0002", 2, i, sc.NOW, "text", text=f"line {i:04d}") for i in range(FILL_LIMIT)
    ]
    app = sc.make_app(engine)
    async with app.run_test(size=(160, 48)) as pilot:  # wide: the stream has its bar
        await wait_for(pilot, lambda: engine.subscribers)
        app.queue.select_id("t-0002")
        await wait_for(pilot, lambda: app.stream.task_id == "t-0002" and app.stream.flushes, "fill")
        # past a screen's height squared, the thumb is one cell: more lines do not move it
        more = [Event("t-0002", 2, n, sc.NOW, "text", text=f"line {n}") for n in range(FILL_LIMIT, long)]
        engine.push(*(AgentEvent(e) for e in more))
        bar = app.stream.vertical_scrollbar
        assert isinstance(bar, SteadyScrollBar)
        await wait_for(pilot, lambda: bar.display and bar.window_virtual_size == long, "the bar shown")
        assert bar.window_size**2 < long
        renders = count_renders(bar)
        for seq in range(long, long + 30):  # the one-cell thumb stays at the end
            engine.push(AgentEvent(Event("t-0002", 2, seq, sc.NOW, "text", text=f"line {seq}")))
            await wait_for(pilot, lambda: f"line {seq}" in app.stream.lines[-1].text, "the line drawn")  # noqa: B023
        assert bar.window_virtual_size == long + 30
        assert bar.reused > 0 and renders == []
        app.stream.scroll_home(animate=False, immediate=True)
        await wait_for(pilot, lambda: renders, "the bar drawn again, its thumb at the top")
        assert bar.position == 0


async def test_a_growing_streams_scroll_bar_is_put_together_from_rows_textual_drew() -> None:
    """While the log grows its thumb moves every frame: the bar is put together from the rows
    drawn before for the same look, and each time it is the bar textual draws."""
    engine = sc.several_running()
    engine.events_by_task["t-0002"] = [
        Event("t-0002", 2, i, sc.NOW, "text", text=f"line {i:04d}") for i in range(40)
    ]
    app = sc.make_app(engine)
    async with app.run_test(size=(160, 48)) as pilot:  # wide: the stream has its bar
        await wait_for(pilot, lambda: engine.subscribers)
        app.queue.select_id("t-0002")
        await wait_for(pilot, lambda: app.stream.task_id == "t-0002" and app.stream.flushes, "fill")
        bar = app.stream.vertical_scrollbar
        assert isinstance(bar, SteadyScrollBar)
        await wait_for(pilot, lambda: bar.display, "the bar shown")
        seen: set[tuple[object, ...]] = set()
        for n in range(40, 400, 9):  # the thumb shrinks and moves down, in eighths of a cell
            batch = [Event("t-0002", 2, i, sc.NOW, "text", text=f"line {i}") for i in range(n, n + 9)]
            engine.push(*(AgentEvent(e) for e in batch))
            await wait_for(pilot, lambda: bar.window_virtual_size == n + 9, "the log grown")  # noqa: B023
            await pilot.pause()
            full = bar.size.region
            shown = bar.render_lines(full)
            seen.add(bar.appearance()[1])
            bar._styles_cache.clear()
            assert super(SteadyScrollBar, bar).render_lines(full) == shown  # textual's own bar
        assert len(seen) > 20
        assert bar.assembled >= len(seen) // 2  # most of them put together


def _textuals_own_rows(stream: StreamLog, region: Region) -> list[Strip]:
    """``stream``'s rows in ``region`` drawn from scratch by textual itself: its styles cache,
    the widget's style looked up for each line (what the pane keeps or puts together itself
    must be these)."""
    stream._styles_cache.clear()
    return RichLog.render_lines(stream, region)


async def test_a_cleared_stream_draws_one_blank_row_not_a_pane_of_them() -> None:
    """The selection moving to a task with nothing to show clears the pane within the key's own
    draw: the rows past the last line all look the same, so one is drawn (with the border, for
    the new title) and the others are copies of it, the same rows a full draw makes."""
    async with following_200_lines() as (app, pilot, _engine):
        stream = app.stream
        full = stream.region.size.region
        assert full.height > 20
        before = stream.rows_drawn
        app.queue.select_id("t-0003")  # running, nothing stored
        await wait_for(pilot, lambda: stream.task_id == "t-0003" and not stream.filling, "followed")
        await wait_for(pilot, lambda: "docs-pass" in str(stream.border_title), "retitled")
        await pilot.pause()
        kept = stream.render_lines(full)
        assert not stream.lines
        # at most two looks (the cleared pane, then its new title): two border rows and one blank
        assert 1 <= stream.rows_drawn - before <= 6
        assert kept == _textuals_own_rows(stream, full)


async def test_a_following_stream_draws_only_its_new_lines_and_the_same_rows_as_a_full_draw() -> None:
    """Following a live agent, a frame draws the new line (and the border), not every line in
    view again: the rows of the lines still in view are kept from the last draw, moved up. They
    are the rows a full draw makes."""
    async with following_200_lines() as (app, pilot, engine):
        stream = app.stream
        for seq in range(FILL_LIMIT, FILL_LIMIT + 5):
            before, direct = stream.rows_drawn, stream.rows_direct
            engine.push(AgentEvent(Event("t-0002", 2, seq, sc.NOW, "text", text=f"line {seq}")))
            await wait_for(pilot, lambda: f"line {seq}" in stream.lines[-1].text, "the line drawn")  # noqa: B023
            await wait_for(pilot, lambda: stream.rows_drawn > before, "the pane redrawn")  # noqa: B023
            assert stream.rows_drawn - before == 1  # the new line; the others and the border are kept
            assert stream.rows_direct - direct == 1  # between the edges textual drew, not through it
        full = stream.region.size.region

        def same_as_a_full_draw() -> list[Strip]:
            kept = stream.render_lines(full)
            assert kept == _textuals_own_rows(stream, full)
            stream._rows.clear()
            assert stream.render_lines(full) == kept  # made again, not kept
            return kept

        rows = same_as_a_full_draw()
        assert "line 204" in rows[-2].text and "line 203" in rows[-3].text
        stream.scroll_home(animate=False, immediate=True)  # scrolled back: the first lines
        await pilot.pause()
        assert "line 000" in same_as_a_full_draw()[1].text
        before = stream.rows_drawn
        stream.focus()  # a focused pane's border is drawn in another colour: every row again
        await wait_for(pilot, lambda: stream.rows_drawn - before >= full.height, "the pane drawn again")
        same_as_a_full_draw()
        # what the cockpit's styles do not do, but the rows put together here must follow
        stream.styles.border_left = ("heavy", TColor.parse("red"))  # each edge its own
        app._filters.append(Monochrome())  # a line filter that changes every colour
        stream.refresh()
        await pilot.pause()
        assert "┃" in same_as_a_full_draw()[5].text
        direct = stream.rows_direct
        stream.styles.padding = (0, 1)  # more than a line between edges: textual draws the rows
        await pilot.pause()
        assert same_as_a_full_draw()[5].text.startswith("┃ ")
        assert stream.rows_direct == direct
