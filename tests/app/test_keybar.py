"""The footer line (app/keybar.py): one widget, whole keys, the pinned pair, a click presses a key,
and a dialog opened and closed over the main screen leaves it as it was."""

from __future__ import annotations

import pytest
from rich.text import Text
from textual.widget import Widget

from fleet_tui.app.app import FleetApp
from fleet_tui.app.keybar import KeyBar
from fleet_tui.screens.help import HelpScreen

from . import scenarios as sc
from .helpers import wait_for


def footer_line(app: FleetApp) -> str:
    strips = app.screen._compositor.render_strips()
    return "".join(seg.text for seg in strips[-1])


@pytest.mark.parametrize("width", [60, 80, 100, 160])
async def test_the_footer_shows_whole_keys_and_always_help_and_quit(width: int) -> None:
    app = sc.make_app(sc.several_running())
    async with app.run_test(size=(width, 24)) as pilot:
        await pilot.pause()
        line = footer_line(app)
        assert len(line) == width
        assert line.rstrip().endswith("? help q quit")
        keys = line[: -len("? help q quit") - 1].rstrip()
        # the keys shown are the screen's shown bindings' own words, in order, none cut short
        first: dict[str, str] = {}
        for _, b, _, _ in app.screen.active_bindings.values():
            if b.show:
                first.setdefault(b.action, f"{app.get_key_display(b)} {b.description}")
        words = " ".join(first.values())
        assert words.startswith(keys), (keys, words)
        assert keys == "" or words[len(keys) :][:1] in ("", " ")  # ends between two keys
        if width >= 160:
            assert "f finished" in keys


async def test_the_footer_is_one_widget() -> None:
    app = sc.make_app(sc.several_running())
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        bar = app.query_one(KeyBar)
        assert list(bar.children) == []
        assert not [w for w in app.screen.walk_children(Widget) if type(w).__name__ == "FooterKey"]


async def test_a_click_on_a_key_presses_it() -> None:
    app = sc.make_app(sc.several_running())
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        line = footer_line(app)
        before = app.queue.model.show_finished
        await pilot.click(KeyBar, offset=(line.index("f finished") + 3, 0))
        await wait_for(pilot, lambda: app.queue.model.show_finished != before, "finished toggled")
        await pilot.click(KeyBar, offset=(line.index("? help") + 1, 0))
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "help open")


async def test_closing_a_dialog_does_not_redraw_the_footer() -> None:
    app = sc.make_app(sc.several_running())
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        bar = app.query_one(KeyBar)
        renders = 0
        render = bar.render

        def counted() -> Text:
            nonlocal renders
            renders += 1
            return render()

        bar.render = counted  # type: ignore[method-assign]
        line = footer_line(app)
        for _ in range(3):
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "help open")
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is app.screen_stack[0], "help closed")
            await pilot.pause()
        assert renders == 0
        assert footer_line(app) == line


async def test_a_key_not_available_now_is_dimmed() -> None:
    app = sc.make_app(sc.several_running())
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        bar = app.query_one(KeyBar)
        assert all(enabled for *_, enabled in bar._keys)
        # None: shown but not available now (False would hide it)
        app.check_action = lambda action, parameters: None if action == "kill" else True  # type: ignore[method-assign]
        app.refresh_bindings()
        await wait_for(pilot, lambda: any(not e for *_, e in bar._keys), "kill disabled")
        await pilot.pause()
        strip = app.screen._compositor.render_strips()[-1]
        style = {seg.text: seg.style for seg in strip if seg.text in ("k", "n")}
        # Textual draws a dim style as a colour faded towards the background
        assert style["k"] is not None and style["n"] is not None
        assert style["k"].color != style["n"].color and style["k"].bgcolor == style["n"].bgcolor
