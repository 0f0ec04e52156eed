"""The two read-only panes fed from the snapshot: the one-line header and the gauges.

Both are repainted from a frozen ``Snapshot`` about once a second (the memray-style pull), plus on
live gauge/question events; the text itself is built by ``format`` so the panes only display it.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from fleet_tui.app.format import gauges_lines, header_text
from fleet_tui.scheduler.model import Snapshot


class FleetHeader(Static):
    """``fleet-tui ─ 3 running · 5 queued · 1 question · rate 42% (resets 14:05) · mem 9.8G free``"""

    def show(self, title: str, snap: Snapshot, questions: int, now: float) -> None:
        text = header_text(title, snap, questions, now, self.content_region.width or None)
        if text != getattr(self, "_last", None):
            self._last = text
            self.update(Text(text, no_wrap=True, overflow="ellipsis"))


class GaugesPane(Static):
    """Slots, load, memory, disk, hosts and rate limits per account."""

    def on_mount(self) -> None:
        self.border_title = "Gauges"

    def show(self, snap: Snapshot, now: float) -> None:
        text = "\n".join(gauges_lines(snap, now))
        if text != getattr(self, "_last", None):
            self._last = text
            self.update(Text(text, no_wrap=True, overflow="ellipsis"))
