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

    def on_screen_resume(self, event: ScreenResume) -> None:
        uncovered = getattr(self.app, "uncovered", None)  # FleetApp's: the live frame it held
        if uncovered is not None:
            uncovered()
