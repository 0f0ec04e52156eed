"""The cockpit's main screen: a plain ``Screen`` whose own background is drawn as blank lines.

Textual repaints the whole screen it returns to when a dialog closes (``?``, a confirmation, the
detail screen), and a screen's own line cache is cleared by that repaint: its 48 background lines
were rendered again and cut at every pane edge into a few hundred new pieces, all of them then
hidden by the panes (a Textual screen draws its widgets over its background). That was half the
time of closing a dialog. The panes cover the whole screen, so its background is drawn with
Textual's ``BLANK`` lines (one cached blank line, reused): the same colour, and its pieces come
from the cut caches on every return. While a dialog covers it, the panes' live lines and cells
wait, and are drawn in the frame after the one that uncovers them (``FleetApp._frame``).
"""

from __future__ import annotations

from typing import ClassVar

from textual.events import ScreenResume
from textual.screen import Screen


class MainScreen(Screen[None]):
    """The screen the cockpit composes into (``FleetApp.get_default_screen``)."""

    BLANK: ClassVar[bool] = True
    _covered = False  # a dialog or another screen went on top of it (not its first showing)

    def on_screen_resume(self, event: ScreenResume) -> None:
        uncovered = getattr(self.app, "uncovered", None)  # FleetApp's: the live frame it held
        if uncovered is not None:
            uncovered()
        if self._covered:  # after Textual's own handler (which asks for the repaint): draw it now
            self._covered = False
            self.call_next(self._draw_now)

    def on_screen_suspend(self) -> None:
        self._covered = True

    def _draw_now(self) -> None:
        """The uncovered screen drawn at once, not at the screen's next update tick: Textual
        draws a screen from a 60 Hz timer, and under a loud fleet the timer had often ticked
        within the last 16 ms (the panes' live frames), so a close waited for the next tick
        with nothing else to do (the esc-close tail under 32 agents at 200 events/s). What the
        tick would have done, done now (textual is pinned in pyproject.toml); the tick then
        finds nothing to draw."""
        if self.is_current:
            self._on_timer_update()
