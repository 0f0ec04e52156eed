"""Agent text is data on screen (issue 12, point 1): every widget that shows a string from an
agent, a verifier, git or a task file draws it inert.

The hostile text (``scenarios.HOSTILE``) carries an OSC 52 clipboard write, an OSC 0 title, a screen
clear, an OSC 8 hyperlink, 8-bit C1 sequences and a bidi override. Each test brings one widget on
screen and checks the rendered screen (the SVG export of what the compositor draws) holds none of
those control characters, while the visible words around them are shown (the escapes themselves
as visible text: ``␛]52;c;…␇``).
"""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import TabbedContent

from fleet_tui.app.app import FleetApp
from fleet_tui.scheduler.api import CommandResult
from fleet_tui.scheduler.model import Notice
from fleet_tui.screens.confirm import ConfirmScreen
from fleet_tui.screens.detail import DetailScreen

from . import scenarios as sc
from .helpers import wait_for

pytestmark = pytest.mark.anyio
SIZE = (160, 48)


def screen_text(app: FleetApp) -> str:
    """The characters the compositor draws (the SVG export without its markup)."""
    svg = app.export_screenshot()
    body = svg[svg.index("<g class") :] if "<g class" in svg else svg
    return html.unescape(re.sub(r"<[^>]+>", "", body)).replace("\xa0", " ")


def assert_inert(app: FleetApp, *visible: str) -> None:
    shot = screen_text(app)
    found = [repr(c) for c in sc.RAW_CONTROLS if c in shot]
    assert not found, f"raw control characters reached the screen: {found}"
    for word in visible:
        assert word in shot, f"{word!r} is not on screen"


async def started(pilot: Pilot[Any]) -> FleetApp:
    app = pilot.app
    assert isinstance(app, FleetApp)
    await wait_for(pilot, lambda: app.stream.flushes, "the stream filled")
    await pilot.pause()
    return app


async def test_stream_inbox_and_titles_are_inert() -> None:
    app = sc.make_app(sc.hostile())
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        # stream lines (text, tool call, stderr, error), its title and state subtitle, the inbox
        assert_inert(app, "text pwn", "stderr pwn", "ask pwn", "Stream: evil")
        assert "[b]mk[/b]" in screen_text(app)  # markup in agent text is shown, not applied
        assert "text pwn␛]52;c;aGFja2Vk␇ title␛]0;owned␇" in screen_text(app)  # shown visibly


async def test_answer_form_is_inert() -> None:
    app = sc.make_app(sc.hostile())
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("a")
        await wait_for(pilot, lambda: app.inbox.answering is not None, "the answer form")
        await pilot.pause()
        assert_inert(app, "evil asks: ask pwn", "1. opt pwn")


async def test_toasts_are_inert() -> None:
    engine = sc.hostile()
    engine.results["retry"] = CommandResult(False, "refused: " + sc.HOSTILE)
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await wait_for(pilot, lambda: engine.subscribers, "subscription")
        engine.push(Notice("notice " + sc.HOSTILE))
        await pilot.press("r")
        await wait_for(pilot, lambda: len(app._notifications) >= 2, "two toasts")
        # the toast draws the notification's message as plain text (markup off)
        shown = [n for n in app._notifications if n.message.startswith(("notice pwn", "refused: pwn"))]
        assert len(shown) == 2, [n.message for n in app._notifications]
        for note in shown:
            assert not note.markup
            assert not [c for c in sc.RAW_CONTROLS if c in note.message], repr(note.message)
            assert "[b]mk[/b]" in note.message


async def test_detail_screen_is_inert_on_every_tab() -> None:
    app = sc.make_app(sc.hostile())
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen), "detail")
        screen = app.screen
        assert isinstance(screen, DetailScreen)
        await wait_for(pilot, lambda: screen.loaded and screen.transitions, "detail loaded")
        tabs = screen.query_one("#detail-tabs", TabbedContent)
        expected = {
            "tab-overview": ("prompt pwn", "reason pwn", "result pwn"),
            "tab-attempts": ("detail pwn", "verifier pwn"),
            "tab-diff": ("+new pwn",),
            "tab-log": ("text pwn", "error pwn"),
        }
        for tab, words in expected.items():
            tabs.active = tab
            await pilot.pause()
            await pilot.pause()
            assert_inert(app, *words)


async def test_merge_confirmation_diffstat_is_inert() -> None:
    app = sc.make_app(sc.hostile())
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("m")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), "merge confirmation")
        await pilot.pause()
        assert_inert(app, "Merge evil")


async def test_gauges_are_inert() -> None:
    app = sc.make_app(sc.hostile())
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        assert_inert(app, "acct")
