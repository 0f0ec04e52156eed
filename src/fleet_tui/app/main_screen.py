"""The cockpit's main screen: a plain ``Screen`` whose own background is drawn as blank lines.

Textual repaints the whole screen it returns to when a dialog closes (``?``, a confirmation, the
detail screen), and a screen's own line cache is cleared by that repaint: its 48 background lines
were rendered again and cut at every pane edge into a few hundred new pieces, all of them then
hidden by the panes (a Textual screen draws its widgets over its background). That was half the
time of closing a dialog. The panes cover the whole screen, so its background is drawn with
Textual's ``BLANK`` lines (one cached blank line, reused): the same colour, and its pieces come
from the cut caches on every return. While a dialog covers it, the panes' live lines and cells
wait, and are drawn in the frame after the one that uncovers them (``FleetApp._frame``).

Closing a dialog draws the uncovered screen whole at once; Textual then asks for a second whole
repaint of it as it puts the dialog away (``App._replace_screen``, ``FleetApp`` marks it), which
the next tick drew again with nothing changed (3 ms idle, and a key pressed just after the close
waited behind it): that one repaint is dropped when the screen has been drawn whole since.

A key's change is drawn at once too (``key_in_hand``): Textual draws a screen's changes from a
60 Hz timer, so a cursor move waited 0-16 ms for the timer's next tick after its few milliseconds
of work. Only a key's: the live frames of a loud fleet still wait for the tick, at most 60 a second,
and so do the panes only they change (the stream, the gauges, the header) when a key's draw comes.
A live frame due while a key is in hand waits for that draw (``FleetApp.key_drawn``).

Its compositor draws an update from the rows the update writes (``compositor.py``), not every row
of every widget in the update's bounds: the same bytes reach the terminal. It keeps the screen as
composed, and a whole update is drawn from that, with what changed meanwhile; the one that
uncovers it shows it as it was, and what changed behind the dialog comes a frame later.
"""

from __future__ import annotations

import time
from typing import ClassVar, Self, cast

from textual.events import Idle, ScreenResume
from textual.geometry import Region
from textual.screen import Screen
from textual.widget import Widget

from fleet_tui.app.compositor import SpanCompositor

#: how long after a key the screen's next change counts as the key's (drawn at once): a key's
#: handling runs across a few of the loop's turns (the app, the focused widget, the messages it
#: posts), a few milliseconds even on a loaded machine
KEY_DRAW_S = 0.1


class MainScreen(Screen[None]):
    """The screen the cockpit composes into (``FleetApp.get_default_screen``)."""

    BLANK: ClassVar[bool] = True
    _covered = False  # a dialog or another screen went on top of it (not its first showing)
    _key_at = 0.0  # when a key whose change is not drawn yet was handled (monotonic), else 0.0
    #: what was waiting to be drawn when that key was handled (a live frame's panes), not its own
    _dirty_before: frozenset[Widget] = frozenset()
    _drawn_whole = False  # drawn whole since it was uncovered
    _put_away = False  # the next refresh is Textual's as it puts the dialog away (``putting_away``)

    def __init__(self, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name, id, classes)
        # an update drawn from the rows it shows, a whole screen from its kept frame
        # (compositor.py); a theme (the app's CSS) drops that frame
        self._compositor = SpanCompositor(css_version=lambda: self.app._css_update_count)

    def putting_away(self) -> None:
        """A dialog over this screen is being put away (``FleetApp._replace_screen``): Textual's
        first act there is a whole repaint of this screen, the one the close drew already."""
        self._put_away = True

    def refresh(
        self, *regions: Region, repaint: bool = True, layout: bool = False, recompose: bool = False
    ) -> Self:
        put_away, self._put_away = self._put_away, False
        if put_away and self._drawn_whole and repaint and not (regions or layout or recompose):
            return self  # drawn whole at the close, nothing asked of it since: not again
        return super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)

    def key_in_hand(self) -> None:
        """A key was handled (``FleetApp.on_event``, once its bindings' actions ran): what it
        changed is drawn as soon as the screen is idle, not at the timer's next tick. A key the
        app's priority bindings or a text field take never comes back to the app: its change
        waits for the tick, as before."""
        self._key_at = time.monotonic()
        self._dirty_before = frozenset(self._dirty_widgets)

    def on_idle(self, event: Idle) -> None:
        """Before Textual's own idle handler (which would start the 60 Hz timer for what is
        dirty): a key's change is drawn now, and the timer then finds nothing to draw."""
        if not self._key_at:
            return
        if time.monotonic() - self._key_at > KEY_DRAW_S:
            self._key_at = 0.0
        elif self._repaint_required:
            self._draw_now()  # the whole screen: everything waiting is drawn with it
        elif self._layout_required or self._scroll_required or self._dirty_widgets:
            self._draw_keys_own()

    def _draw_keys_own(self) -> None:
        """Only the key's own change is drawn at once: the focused widget and what changed after
        the key was handled. A live frame's panes that were waiting already are left for the
        timer's next tick, a frame later, and so are the panes only live frames change (the
        app's ``live_panes``: the stream unless it has the focus, the gauges, the header),
        whenever they changed: a loud fleet's stream was 3-8 ms of a key's draw (a frame's
        flush that reached the screen just after the key), the once-a-second gauges 5-9 ms.
        What a key changes there (the selected task's stream, cleared for its stored events)
        follows a frame later. The screen's compositor asks only the widgets the key's change
        crosses for rows (``compositor.py``), so a waiting pane is not drawn beside it."""
        dirty = self._dirty_widgets
        focused = self.focused
        live_panes = getattr(self.app, "live_panes", None)  # FleetApp's
        live = {pane for pane in live_panes() if pane is not focused} if live_panes is not None else set()
        waiting = {
            w
            for w in dirty
            if w is not focused
            and (w in self._dirty_before or any(node in live for node in w.ancestors_with_self))
        }
        reflow = self._layout_required or self._scroll_required
        if waiting == dirty and not reflow:
            return  # nothing of the key's yet: still armed
        dirty.difference_update(waiting)
        try:
            self._draw_now()
        finally:
            # (the draw emptied the set) Textual's idle handler, next, starts the timer for them
            dirty.update(waiting)

    def _on_screen_resume(self, event: ScreenResume) -> None:
        """Textual's own handler (which asks for the whole repaint), then the uncovered screen
        drawn at once, in this handler: a draw left for the screen's next message waited behind
        whatever other work the loop had queued (0.2-0.4 ms idle, up to 4 ms under 32 agents at
        200 events/s). The event goes no further up (``prevent_default``): Textual's handler, a
        ``Screen``'s, has run."""
        self._key_at = 0.0  # a key that covered or uncovered it is drawn by the switch itself
        uncovered = getattr(self.app, "uncovered", None)  # FleetApp's: the live frame it held
        if uncovered is not None:
            uncovered()
        super()._on_screen_resume(event)
        event.prevent_default()
        if self._covered:
            self._covered = False
            spans = cast(SpanCompositor, self._compositor)
            spans.defer_widgets = True  # the screen as it was: what changed behind, a frame later
            try:
                self._draw_now()
            finally:
                spans.defer_widgets = False
            if spans.deferred:
                self._dirty_widgets.update(spans.deferred)
                spans.deferred = []
                self.check_idle()  # Textual's idle handler starts the screen's timer for them

    def on_screen_suspend(self) -> None:
        self._covered = True
        self._key_at = 0.0
        self._drawn_whole = False

    def _draw_now(self) -> None:
        """The uncovered screen drawn at once, not at the screen's next update tick: Textual
        draws a screen from a 60 Hz timer, and under a loud fleet the timer had often ticked
        within the last 16 ms (the panes' live frames), so a close waited for the next tick
        with nothing else to do (the esc-close tail under 32 agents at 200 events/s). What the
        tick would have done, done now (textual is pinned in pyproject.toml); the tick then
        finds nothing to draw."""
        keys = bool(self._key_at)
        self._key_at = 0.0  # what a key in hand changed is drawn here
        self._dirty_before = frozenset()
        if self.is_current:
            whole = self._repaint_required
            self._on_timer_update()
            self._drawn_whole = self._drawn_whole or whole
        key_drawn = getattr(self.app, "key_drawn", None)  # FleetApp's: the live frame that waited
        if keys and key_drawn is not None:
            key_drawn()
