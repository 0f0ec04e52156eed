"""Small helpers for Pilot tests: wait for a condition without sleeping, type text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.pilot import Pilot

KEY_NAMES = {" ": "space", "/": "slash", ":": "colon", "-": "minus", "?": "question_mark", ",": "comma",
             "!": "exclamation_mark", ".": "full_stop", "_": "underscore"}  # fmt: skip


async def wait_for(pilot: Pilot[Any], condition: Callable[[], object], what: str = "condition") -> None:
    """Let the app process messages until ``condition()`` holds (bounded; no sleeps)."""
    for _ in range(400):
        if condition():
            return
        await pilot.pause()
    raise AssertionError(f"timed out waiting for {what}")


async def type_text(pilot: Pilot[Any], text: str) -> None:
    await pilot.press(*(KEY_NAMES.get(ch, ch) for ch in text))
