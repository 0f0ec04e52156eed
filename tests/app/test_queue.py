"""The queue at scale under Pilot: a generated 10,000-task fleet over 20 repositories.

Order (needs you, running, paused, queued in claim order, finished newest first), grouping with
counts, folding, the name jump, next-attention, the sort cycle, the cursor staying on its task
while rows reorder, drawing cost that follows the screen, and inert cells. Plus the pure parts:
column layout, fuzzy scores, repository roots and labels.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from textual.color import Color as TColor
from textual.filter import Monochrome, NoColor
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

import fleet_tui.app.queue as queue_module
from fleet_tui.app.app import FleetApp
from fleet_tui.app.columns import layout
from fleet_tui.app.format import parse_filter
from fleet_tui.app.order import QueueModel, Row, fuzzy_score, sort_key
from fleet_tui.app.rows import row_of
from fleet_tui.app.scrollbars import SteadyScrollBar
from fleet_tui.repos import repo_labels, repo_root
from fleet_tui.scheduler.model import Question, QuestionChanged, Snapshot, TaskChanged
from fleet_tui.scheduler.states import TaskStatus as S
from fleet_tui.scheduler.view import carry_over

from . import scenarios as sc
from .helpers import count_renders, type_text, wait_for
from .queue_fleet import LONG_NAMES, REPOS, ROOT, big_fleet, long_names, make_task

pytestmark = pytest.mark.anyio
SIZE = (120, 36)


def screen_text(app: FleetApp) -> list[str]:
    return ["".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips()]


# ------------------------------------------------------------------------------------ pure parts


def test_bands_then_claim_order_then_newest_finished() -> None:
    model = QueueModel()
    tasks = [
        make_task(1, "a", S.QUEUED, priority=0),
        make_task(2, "a", S.QUEUED, priority=5),
        make_task(3, "a", S.DONE, finished_at=100.0),
        make_task(4, "a", S.DONE, finished_at=200.0),
        make_task(5, "a", S.RUNNING),
        make_task(6, "a", S.NEEDS_HUMAN, reason="stalled"),
        make_task(7, "a", S.PAUSED),
        make_task(8, "a", S.RUNNING, asking=True),
        make_task(9, "a", S.QUEUED, priority=5),
    ]
    model.replace_all(tasks)
    model.set_show_finished(True)
    ids = [r.ref for r in model.rows()]
    # asking, needs_human, running, paused, queued (priority 5 oldest first, then 0), done newest first
    assert ids == [
        "t-00008",
        "t-00006",
        "t-00005",
        "t-00007",
        "t-00002",
        "t-00009",
        "t-00001",
        "t-00004",
        "t-00003",
    ]
    model.set_order("name")
    assert {r.ref for r in model.rows()[:2]} == {"t-00008", "t-00006"}  # the bands hold in every order
    assert [r.ref for r in model.rows()][2:4] == ["t-00005", "t-00007"]


def test_sort_key_is_total_and_stable() -> None:
    a, b = make_task(1, "a", S.QUEUED), make_task(2, "a", S.QUEUED)
    for order in ("priority", "age", "name", "cost"):
        assert sort_key(a, False, order) != sort_key(b, False, order)
        assert sort_key(a, False, order)[-1] == a.id
    # under the priority order, tokens and cost do not move a task (its line is repainted only)
    assert sort_key(a, False) == sort_key(replace(a, tokens=99, cost_usd=1.0), False)
    assert sort_key(a, False, "cost") != sort_key(replace(a, cost_usd=1.0), False, "cost")


def test_fuzzy_prefers_substring_prefix_and_short_names() -> None:
    assert fuzzy_score("api", "api") > fuzzy_score("api", "api-client")  # type: ignore[operator]
    assert fuzzy_score("api", "api-client") > fuzzy_score("api", "old-api")  # type: ignore[operator]
    assert fuzzy_score("api", "old-api") > fuzzy_score("api", "a-p-i")  # type: ignore[operator]
    assert fuzzy_score("bl42", "billing-fix-00042") is not None
    assert fuzzy_score("zz", "billing") is None


def test_repo_root_and_labels(tmp_path: Path) -> None:
    (tmp_path / "work" / "api" / ".git").mkdir(parents=True)
    (tmp_path / "work" / "api" / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "plain").mkdir()
    assert repo_root(str(tmp_path / "work" / "api" / "pkg" / "sub")) == str(tmp_path / "work" / "api")
    assert repo_root(str(tmp_path / "plain")) == str(tmp_path / "plain")  # no git: the cwd itself
    labels = repo_labels(["/x/work/api", "/x/old/api", "/x/web"])
    assert labels == {"/x/work/api": "work/api", "/x/old/api": "old/api", "/x/web": "web"}


def test_layout_fits_names_first_and_drops_columns_rather_than_cutting() -> None:
    wide = layout(196, 41)
    assert [c.key for c in wide][:3] == ["glyph", "name", "state"]
    assert next(c for c in wide if c.key == "name").width == 41
    assert sum(c.width for c in wide) + len(wide) - 1 == 196
    narrow = layout(77, 41)
    keys = [c.key for c in narrow]
    assert next(c for c in narrow if c.key == "name").width == 41  # whole, at 80 columns
    assert "ctx" not in keys and "host" not in keys  # given up, not cut to a letter
    assert all(c.width >= len(c.label) for c in narrow)
    assert sum(c.width for c in narrow) + len(narrow) - 1 <= 77


# ------------------------------------------------------------------------------------ 10,000 tasks


async def test_ten_thousand_tasks_open_grouped_and_draw_only_the_screen() -> None:
    engine = big_fleet()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        queue = app.queue
        rows = queue.rows
        assert len(queue.model.tasks) == 10_000
        groups = [r.ref.rsplit("/", 1)[1] for r in rows if r.kind == "group"]
        # repositories with a task that needs you first, then with running tasks, then the rest
        assert groups[:4] == ["api-server", "gateway", "ledger", "notifier"]
        assert groups[4:11] == sorted(["web-client", "billing", "search", "infra", "docs", "mobile", "auth"])
        assert groups[11:] == sorted(groups[11:])
        assert queue.selected_id == "t-00000"  # the cursor starts on the task that asks
        assert sum(1 for r in rows if r.kind == "group") == 20
        assert sum(1 for r in rows if r.kind == "folded") == 20  # 120 finished, folded per repository
        assert queue.row_count == 10_000 - 120
        # the first repository's rows: the one asking (t-00000 is api-server's), so look there
        api = queue.model.index(Row("group", f"{ROOT}/api-server"))
        assert api is not None
        first, second = (queue.model.tasks[r.ref] for r in rows[api + 1 : api + 3])
        assert first.id == "t-00000"  # it asks a question: first in its repository
        assert second.status == S.QUEUED and second.spec.priority == 2  # then queued, highest priority
        text = "\n".join(screen_text(app))
        assert "api-server · 500 · ? 1 · ◌ 493 · ● 6" in text  # group header with its counts
        # drawing follows the screen: a few screens' worth of lines, not ten thousand
        assert queue.lines_drawn < 20 * 36


async def test_needs_you_first_in_each_group_then_running_then_queued() -> None:
    engine = big_fleet()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        model = app.queue.model
        for root in (f"{ROOT}/api-server", f"{ROOT}/search"):
            ids = model.ids_in(root)
            states = [model.tasks[t].status for t in ids]
            bands = [0 if model.is_asking(model.tasks[t]) or s == S.NEEDS_HUMAN else 1 if s == S.RUNNING else
                     3 if s == S.QUEUED else 4 for t, s in zip(ids, states, strict=True)]  # fmt: skip
            assert bands == sorted(bands)
            queued = [model.tasks[t] for t in ids if model.tasks[t].status == S.QUEUED]
            assert [(-t.spec.priority, t.created_at) for t in queued] == sorted(
                (-t.spec.priority, t.created_at) for t in queued
            )


async def test_cursor_stays_on_its_task_while_rows_reorder() -> None:
    engine = big_fleet()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: engine.subscribers, "subscription")
        queue = app.queue
        target = "t-05000"
        assert queue.select_id(target)
        group = queue.model.group_of(target)
        # twenty queued tasks of the same repository start running: they move above the cursor
        movers = [
            t for t in app.tasks.values() if queue.model.group_of(t.id) == group and t.status == S.QUEUED
        ]
        movers = [t for t in movers if t.id != target][:20]
        engine.push(*(TaskChanged(replace(t, status=S.RUNNING, updated_at=sc.NOW)) for t in movers))
        await wait_for(pilot, lambda: app.tasks[movers[-1].id].status == S.RUNNING, "moves applied")
        await pilot.pause()
        assert queue.selected_id == target
        assert 0 <= queue.cursor_row - round(queue.scroll_y) < queue.size.height  # still on screen
        # one task's change that does not move it repaints its line only
        drawn = queue.lines_drawn
        t = app.tasks[target]
        engine.push(TaskChanged(replace(t, waiting="rate limit resets 17:05", updated_at=sc.NOW + 1)))
        await wait_for(pilot, lambda: app.tasks[target].waiting == "rate limit resets 17:05", "change")
        await pilot.pause()
        assert queue.selected_id == target
        assert queue.lines_drawn - drawn <= 3


async def test_a_scrolled_queue_keeps_the_lines_it_drew_and_they_are_a_full_draws(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A scroll (or a rebuilt list) moves lines: a task line whose task, state, elapsed time,
    style and width are those it was drawn with is kept, not made again, and so is the row put
    together from it, and the kept lines and rows are exactly what drawing them anew makes. The
    scroll bar is drawn again only as it looks different (``SteadyScrollBar``), and a thumb back
    where it was is drawn as it was."""
    engine = big_fleet()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        queue = app.queue
        assert queue.select_id("t-09990")  # a screen of queued tasks
        await pilot.pause()
        made: list[str] = []
        line = queue._line

        def counted(cells, style, width):  # type: ignore[no-untyped-def]
            made.append(cells[0][0])
            return line(cells, style, width)

        rows_made: list[Strip] = []

        def row_made(line: Strip, *args: Any) -> Strip:
            rows_made.append(line)
            return row_of(line, *args)

        queue._line = counted  # type: ignore[method-assign]
        monkeypatch.setattr(queue_module, "row_of", row_made)
        bar = queue.vertical_scrollbar
        assert isinstance(bar, SteadyScrollBar)
        bar_renders = count_renders(bar)
        drawn = queue.lines_drawn
        start = round(queue.scroll_y)
        queue.scroll_to(y=start - 1, animate=False, immediate=True)  # one row up
        await wait_for(pilot, lambda: queue.lines_drawn - drawn >= queue.size.height - 1, "redrawn")
        await pilot.pause()
        assert len(made) <= 2  # the line come into view (and the cursor's, if it moved)
        assert len(rows_made) <= 2  # and its row
        drawn = queue.lines_drawn
        queue.scroll_to(y=start // 2, animate=False, immediate=True)  # the thumb somewhere new
        await wait_for(pilot, lambda: queue.lines_drawn - drawn >= queue.size.height - 1, "redrawn")
        await pilot.pause()
        assert bar_renders  # the bar drawn again
        bar_renders.clear()
        reused = bar.reused
        drawn = queue.lines_drawn
        queue.scroll_to(y=start, animate=False, immediate=True)  # back where it was
        await wait_for(pilot, lambda: queue.lines_drawn - drawn >= queue.size.height - 1, "redrawn")
        await pilot.pause()
        assert bar.reused > reused and bar_renders == []  # the thumb where it was: drawn as it was
        full = queue.size.region
        assert bar.render_lines(bar.size.region) == _textuals_own_rows(bar, bar.size.region)
        kept = queue.render_lines(full)
        queue._kept.clear()
        queue._made.clear()
        assert queue.render_lines(full) == kept == _textuals_own_rows(queue, full)
        assert len(made) > queue.size.height // 2  # (the lines were made anew)
        assert type(queue.vertical_scrollbar).__name__ == "SteadyScrollBar"


def _textuals_own_rows(widget: Widget, region: Region) -> list[Strip]:
    """``widget``'s rows in ``region`` drawn from scratch by Textual itself, its styles cache."""
    widget._styles_cache.clear()
    return Widget.render_lines(widget, region)


async def test_the_queues_rows_are_textuals_own_in_every_look() -> None:
    """The queue puts each row together from its line (``rows.py``): the rows are those Textual
    draws, with the cursor focused or not, a group, a folded count, a colour filter, and where it
    has a border and padding (left to Textual)."""
    engine = big_fleet()
    app = sc.make_app(engine)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        queue = app.queue
        full = queue.size.region

        def same() -> list[Strip]:
            rows = queue.render_lines(full)
            assert rows == _textuals_own_rows(queue, full)
            return rows

        rows = same()
        assert len(rows) == full.height and rows[1].text.startswith("▾")  # a group's header
        assert queue._edges is not None  # put together by the queue, not through Textual
        queue.focus()
        await pilot.pause()
        same()
        app.action_toggle_finished()  # the finished tasks shown, or folded
        await pilot.pause()
        same()
        app._filters.append(Monochrome())
        queue.refresh()
        await pilot.pause()
        same()
        queue.styles.border = ("heavy", TColor.parse("red"))
        queue.styles.padding = (0, 1)
        await pilot.pause()
        assert same()[3].text.startswith("┃ ")


async def test_the_queues_scroll_bar_at_every_thumb_place_is_textuals_own() -> None:
    """A long queue's bar at each thumb place (its ends in every eighth of a cell) is put
    together from rows the bar makes itself, never drawn through Textual, and is the bar Textual
    draws: in the cockpit's look, hovered, in another theme and through a colour filter."""
    engine = big_fleet()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        queue = app.queue
        bar = queue.vertical_scrollbar
        assert isinstance(bar, SteadyScrollBar)
        full = bar.size.region
        ends: set[int] = set()

        async def every_place(look: str) -> None:
            """(In the looks after the first, the bar's drawings of each place in the looks
            before are kept: none of them will do.)"""
            places = range(0, round(queue.max_scroll_y) + 1, 263)
            first = look == "the cockpit's"
            for y in places if first else reversed(places):  # the places drawn last first
                queue.scroll_to(y=y, animate=False, immediate=True)
                await pilot.pause()
                thumb = bar.appearance()[1]
                assert thumb is not None
                ends.update((thumb[0] % 8, thumb[1] % 8))
                if first:
                    bar._drawings.clear()  # (drawn as the scroll was shown)
                assembled = bar.assembled
                shown = bar.render_lines(full)
                assert bar.assembled == assembled + first  # put together, not drawn through Textual
                assert shown == _textuals_own_rows(bar, full), (look, y)

        await every_place("the cockpit's")
        assert len(ends) == 8
        bar.mouse_over = True
        await every_place("hovered")
        app.theme = "textual-light"
        await pilot.pause()
        await every_place("another theme")
        app._filters.append(NoColor())
        bar.refresh()
        await pilot.pause()
        await every_place("a colour filter")


async def test_idle_cockpit_draws_nothing() -> None:
    """Nothing changes and nothing on screen runs: a pull is no work (same snapshot, no lines)."""
    engine = big_fleet()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        queue = app.queue
        queue.select_id("t-09999")  # a screen of queued tasks only
        await pilot.pause()
        drawn = queue.lines_drawn
        updates: list[str] = []
        real = queue.apply
        queue.apply = lambda tasks, *a, **k: (updates.extend(t.id for t in tasks), real(tasks, *a, **k))  # type: ignore[method-assign,func-returns-value,assignment]
        for _ in range(3):
            app.pull()
            await pilot.pause()
        assert updates == [] and queue.lines_drawn == drawn


async def test_jump_by_typing_part_of_a_name_and_escape_goes_back() -> None:
    engine = big_fleet()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        start = app.queue.selected_id
        assert start is not None  # the cursor starts on a task, not on a group header
        await pilot.press("j")
        await type_text(pilot, "ledg4208")  # fuzzy: ledger-...-04208
        await wait_for(pilot, lambda: app.queue.selected_id == "t-04208", "jumped")
        assert "Stream: ledger-" in (app.stream.border_title or "")
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.queue.selected_id == start, "back")
        await pilot.press("j")
        await type_text(pilot, "infra-docs-0")  # several matches: down steps through them
        await pilot.pause()
        first = app.queue.selected_id
        await pilot.press("down")
        await pilot.pause()
        assert app.queue.selected_id != first
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.focused is app.queue, "focus back")
        assert app.queue.selected_id != start


async def test_jump_reveals_a_finished_task() -> None:
    app = sc.make_app(big_fleet())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert "t-00100" not in app.queue.task_ids()  # done: folded
        await pilot.press("j")
        await type_text(pilot, "00100")
        await wait_for(pilot, lambda: app.queue.selected_id == "t-00100", "jumped to a finished task")


async def test_next_attention_cycles_through_tasks_that_need_you() -> None:
    app = sc.make_app(big_fleet())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        seen = []
        for _ in range(5):
            await pilot.press("exclamation_mark")
            await pilot.pause()
            seen.append(app.queue.selected_id)
        # t-00000 asks; t-00008..t-00010 are needs_human; then it wraps around
        assert sorted(s or "" for s in set(seen)) == ["t-00000", "t-00008", "t-00009", "t-00010"]
        assert seen[4] == seen[0]


async def test_fold_groups_finished_and_filter_by_repo() -> None:
    app = sc.make_app(big_fleet())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        queue = app.queue
        total = queue.row_count
        await pilot.press("f")  # finished tasks shown
        await pilot.pause()
        assert queue.row_count == total + 120
        await pilot.press("f")
        await pilot.pause()
        assert queue.select_id("t-00003")
        await pilot.press("space")  # folds t-00003's repository: the cursor lands on its header
        await pilot.pause()
        assert queue.cursor_ref == Row("group", f"{ROOT}/{REPOS[3]}")
        assert queue.row_count == total - 500 + 6  # its 500 tasks, of which 6 were finished (folded)
        await pilot.press("right")
        await pilot.pause()
        assert queue.row_count == total
        await pilot.press("slash")
        await type_text(pilot, "repo:ledg state:needs")
        await pilot.press("enter")
        await pilot.pause()
        assert [app.tasks[t].name for t in queue.task_ids()] == ["ledger-fix-00008"]
        app.filter_input.value = "repo:ledger"
        await pilot.pause()
        assert {queue.model.group_of(t) for t in queue.task_ids()} == {f"{ROOT}/ledger"}
        assert "10000" in (app.queue_pane.border_title or "")


async def test_sort_cycle_keeps_bands_and_the_cursor() -> None:
    app = sc.make_app(big_fleet())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.queue.select_id("t-07777")
        for expected in ("age", "name", "cost", "priority"):
            await pilot.press("o")
            await pilot.pause()
            assert app.queue.model.order == expected
            assert app.queue.selected_id == "t-07777"
            if expected != "priority":
                assert f"by {expected}" in (app.queue_pane.border_title or "")


async def test_single_repository_shows_no_group_headers() -> None:
    app = sc.make_app(sc.several_running())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert not any(r.kind == "group" for r in app.queue.rows)


async def test_agent_text_in_cells_is_inert() -> None:
    engine = sc.several_running()
    app = sc.make_app(engine)
    hostile = "auth_failed: \x1b]52;c;cm0gLXJmIC8=\x07\x1b]0;pwned\x07\x1b[2Jgone \x1b]8;;http://x\x07link"
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: engine.subscribers, "subscription")
        t = app.tasks["t-0004"]
        bad = replace(t, status=S.NEEDS_HUMAN, reason=hostile, host="box\x1b[31m1", updated_at=sc.NOW)
        engine.push(TaskChanged(bad))
        await wait_for(pilot, lambda: app.tasks["t-0004"].reason == hostile, "hostile reason")
        await pilot.pause()
        cell = app.queue.get_cell("t-0004", "state")
        assert "\x1b" not in cell and "\x07" not in cell and "gone" in cell and "link" in cell
        assert all("\x1b" not in line and "\x07" not in line for line in screen_text(app))


async def test_footer_keeps_help_and_quit_and_names_stay_whole_at_80x24() -> None:
    app = sc.make_app(long_names())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.pause()
        lines = screen_text(app)
        assert "? help" in lines[-1] and "q quit" in lines[-1]
        assert not lines[0].rstrip().endswith("…")  # the header fits
        text = "\n".join(lines)
        for name in LONG_NAMES[:4]:
            assert name in text  # whole, at 80 columns
        assert app.queue.row_count >= 4
        assert app.queue.size.height >= 8  # the queue has most of the height: 7 rows under its header


async def test_question_moves_its_task_to_the_top() -> None:
    engine = big_fleet(asking=0)
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: engine.subscribers, "subscription")
        root = f"{ROOT}/billing"
        tid = next(t for t in reversed(app.queue.model.ids_in(root)) if app.tasks[t].status == S.QUEUED)
        app.queue.select_id(tid)
        engine.push(QuestionChanged(Question("q-x", tid, 1, sc.NOW, "Which one?")))
        await wait_for(pilot, lambda: app.questions, "question")
        await pilot.pause()
        group = app.queue.model.index(Row("group", root))
        assert group is not None and app.queue.rows[group + 1].ref == tid
        assert app.queue.selected_id == tid
        assert parse_filter("repo:api").repos == ("api",)


def test_snapshot_hands_unchanged_tasks_over_as_the_same_objects() -> None:
    """The engine's (and the attached view's) snapshot: the cockpit skips unchanged tasks by
    identity, and a snapshot where nothing changed keeps the very same tuple."""
    a, b = make_task(1, "a", S.QUEUED), make_task(2, "a", S.RUNNING)
    old = Snapshot(taken_at=0.0, tasks=(a, b))
    new = Snapshot(taken_at=1.0, tasks=(replace(a), replace(b, tokens=5)))
    snap, changed = carry_over(old, new)
    assert snap.tasks[0] is a and snap.tasks[1] is new.tasks[1] and changed == [new.tasks[1]]
    again, none = carry_over(snap, Snapshot(taken_at=2.0, tasks=tuple(replace(t) for t in snap.tasks)))
    assert again.tasks is snap.tasks and none == [] and again.taken_at == 2.0
    gone, _ = carry_over(again, Snapshot(taken_at=3.0, tasks=(a,)))
    assert gone.tasks == (a,)


async def test_page_and_edge_keys_move_by_a_screen_and_to_the_ends() -> None:
    app = sc.make_app(big_fleet())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        queue = app.queue
        page = queue.size.height - 1  # one line is the column header
        start = queue.cursor_row
        await pilot.press("pagedown")
        await pilot.pause()
        assert queue.cursor_row == start + page
        assert round(queue.scroll_y) <= queue.cursor_row < round(queue.scroll_y) + page  # on screen
        await pilot.press("pageup")
        await pilot.pause()
        assert queue.cursor_row == start
        await pilot.press("end")
        await pilot.pause()
        assert queue.cursor_row == len(queue.rows) - 1
        assert round(queue.scroll_y) == len(queue.rows) - page  # the last row at the bottom
        await pilot.press("home")
        await pilot.pause()
        assert queue.cursor_row == 0 and round(queue.scroll_y) == 0
