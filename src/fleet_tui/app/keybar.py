"""KeyBar: the cockpit's footer line (its keys, then ``? help  q quit`` pinned at the right) drawn
by one widget.

Textual's ``Footer`` is a container of one widget per key: the cockpit's footer was 19 of the
main screen's 45 widgets (16 keys, the footer, the pinned pair and the bar holding them). Every
full repaint of the screen walks each widget (its styles, its background, its cached lines), and
a full repaint is what closing a dialog costs: with the footer gone, closing the help took about a
fifth less time (5.0-5.2 ms against 6.0-7.1 ms at 160x48). One widget renders the same line.

What it shows, from the screen's ``active_bindings`` as ``Footer`` does: each shown binding once
per action, in order, dimmed when its action is not available now. Keys that do not fit the width
are left out whole from the first that does not fit (not cut in the middle; every key is in the
help); the pinned pair always shows. A click on a key presses it, as on ``Footer``. The line is
rebuilt only when the keys it would show change: the screen refreshes its bindings on every focus
change and on every return to it, changed or not.
"""

from __future__ import annotations

from typing import ClassVar

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual import events
from textual.screen import Screen
from textual.widget import Widget

#: (key, shown as, description, enabled) for each key of the line
Key = tuple[str, str, str, bool]

#: always at the right end, whatever the width
PINNED: tuple[Key, ...] = (("question_mark", "?", "help", True), ("q", "q", "quit", True))


def _width(key: Key) -> int:
    """Cells a key takes on the line: what it is shown as, a space, its description."""
    return cell_len(key[1]) + 1 + cell_len(key[2])


class KeyBar(Widget, can_focus=False):
    """The footer line: ``KeyBar(id=...)``; see the module's docstring."""

    ALLOW_SELECT = False
    COMPONENT_CLASSES: ClassVar[set[str]] = {"keybar--key", "keybar--description"}
    DEFAULT_CSS = """
    KeyBar {
        dock: bottom;
        height: 1;
        color: $footer-foreground;
        background: $footer-background;
        & > .keybar--key {
            color: $footer-key-foreground;
            background: $footer-key-background;
            text-style: bold;
        }
        & > .keybar--description {
            color: $footer-description-foreground;
            background: $footer-description-background;
        }
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._keys: tuple[Key, ...] = ()
        #: where each drawn key sits on the line: (first column, past its last one, key, enabled)
        self._spans: list[tuple[int, int, str, bool]] = []

    def on_mount(self) -> None:
        self._keys = self._shown(self.screen)
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _shown(self, screen: Screen[object]) -> tuple[Key, ...]:
        """The keys the line shows for ``screen``'s bindings now (pinned ones apart)."""
        seen: set[str] = set()
        keys: list[Key] = []
        for _, binding, enabled, _ in screen.active_bindings.values():
            if not binding.show or binding.action in seen:
                continue
            seen.add(binding.action)
            keys.append((binding.key, self.app.get_key_display(binding), binding.description, enabled))
        return tuple(keys)

    def _bindings_changed(self, screen: Screen[object]) -> None:
        if screen is not self.screen or screen is not self.app.screen:
            return  # covered by a dialog: looked at again when its screen is back on top
        keys = self._shown(screen)
        if keys != self._keys:
            self._keys = keys
            self.refresh()

    def render(self) -> Text:
        key_style = self.get_component_rich_style("keybar--key")
        text_style = self.get_component_rich_style("keybar--description")
        dim = Style(dim=True)
        room = self.size.width - sum(1 + _width(key) for key in PINNED)
        line = Text(no_wrap=True, overflow="crop", end="")
        self._spans = []

        def add(key: Key, before: str, after: str) -> None:
            k, shown, what, enabled = key
            start = line.cell_len + len(before)
            extra = Style() if enabled else dim
            line.append(before)
            line.append(shown, key_style + extra)
            line.append(f" {what}", text_style + extra)
            self._spans.append((start, line.cell_len, k, enabled))
            line.append(after)

        for key in self._keys:  # one space between keys
            gap = " " if line.cell_len else ""
            if line.cell_len + len(gap) + _width(key) > room:
                break  # this key and those after it are left out whole (all are in the help)
            add(key, gap, "")
        line.append(" " * max(0, room - line.cell_len))
        for key in PINNED:
            add(key, " ", "")
        return line

    def on_mouse_down(self, event: events.MouseDown) -> None:
        for start, end, key, enabled in self._spans:
            if start <= event.x < end:
                if enabled:
                    self.app.simulate_key(key)
                else:
                    self.app.bell()
                return
