"""The two read-only panes fed from the snapshot: the one-line header and the gauges.

Both are repainted from a frozen ``Snapshot`` about once a second (the memray-style pull), plus on
live gauge/question events, through ``reactive`` attributes as Textual's own widgets do: the
header's ``line`` and the gauges' ``figures``; setting one to what it already holds draws nothing.
The header's text is built by ``format``; the gauges' figures and states by ``fleet_tui.gauges``
(shared with ``status --gauges``), so the panes only draw them: a bar per gauge coloured by state
through the theme (ok / near / held), the number beside it, and Textual ``Sparkline`` widgets for
the fleet's pulse (per host on demand, ``h``). The pane fits its size: when the bars do not fit one
per line they pair up and drop their notes, and sparklines get whatever lines are left.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.widgets import Sparkline, Static

from fleet_tui.app.format import header_text, inert
from fleet_tui.app.theme import ThemeStyles
from fleet_tui.gauges import Gauge, Pulse, gauges, pulses
from fleet_tui.scheduler.model import Snapshot
from fleet_tui.scheduler.series import KEEP

#: the theme variable each state is drawn with
STATE_VARIABLES = {"ok": "text-success", "near": "text-warning", "held": "text-error"}


class FleetHeader(Static):
    """``fleet-tui ─ 3 running · 5 queued · 1 question · rate 42% (resets 14:05) · mem 9.8G free``"""

    line: reactive[str] = reactive("", init=False)
    """The header's text, fitted to the width (plain text: names in it are inert)."""

    def show(self, title: str, snap: Snapshot, questions: int, now: float) -> None:
        self.line = header_text(title, snap, questions, now, self.content_region.width or None)

    def watch_line(self, line: str) -> None:
        # one line high whatever it says: no new layout (a layout is a reflow and a repaint of
        # the whole screen, several times a second while tasks change)
        self.update(Text(line, no_wrap=True, overflow="ellipsis"), layout=False)


class PulseRow(Horizontal):
    """One sparkline with its label and latest figure."""

    def __init__(self, pulse: Pulse) -> None:
        super().__init__(classes="pulse-row")
        self.label = Static("", classes="pulse-label")
        self.line = Sparkline([0.0], classes="pulse-line")
        self.set(pulse)

    def compose(self) -> ComposeResult:
        yield self.label
        yield self.line

    def set(self, pulse: Pulse) -> None:
        who = "" if pulse.host == "fleet" else f"{pulse.host} "
        text = Text(inert(f"{who}{pulse.label} {pulse.now}", one_line=True), no_wrap=True)
        self.label.update(text, layout=False)  # a fixed width, one line: its size never changes
        # the line always spans the hour: a young fleet's few buckets sit at the right end
        # instead of being stretched over the whole width
        values = list(pulse.values)
        self.line.data = [0.0] * max(KEEP - len(values), 0) + values


class GaugesPane(Vertical):
    """Bars for slots, load, memory, disk, each rate-limit account and the day's spend, then
    sparklines of running agents, events/s, tokens/min and cost/hour."""

    can_focus = True
    BINDINGS: ClassVar[list[BindingType]] = [Binding("h", "per_host", "per host")]

    per_host: reactive[bool] = reactive(False, init=False)
    """Sparklines per host (``h``) instead of for the whole fleet."""
    figures: reactive[tuple[tuple[Gauge, ...], tuple[Pulse, ...]]] = reactive(((), ()), init=False)
    """What the pane draws: the gauge rows and the sparklines (``fleet_tui.gauges``), worked out
    from each snapshot; a snapshot that changes neither draws nothing."""

    @property
    def pulse_rows(self) -> list[PulseRow]:
        """The per-host pulse rows on show (read-only)."""
        return list(self._rows)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.bars = Static("", id="gauge-bars")
        self.pulse_box = Vertical(id="pulse")
        self.snap: Snapshot | None = None
        self.now = 0.0
        self._rows: list[PulseRow] = []
        self._bar_lines = -1

    def compose(self) -> ComposeResult:
        yield self.bars
        yield self.pulse_box

    def on_mount(self) -> None:
        self.border_title = "Gauges"
        self._styles = ThemeStyles(self.app)

    def on_resize(self) -> None:
        self._draw()

    def action_per_host(self) -> None:
        self.per_host = not self.per_host
        self.notify("sparklines per host" if self.per_host else "sparklines for the whole fleet")

    def show(self, snap: Snapshot, now: float) -> None:
        self.snap, self.now = snap, now
        self.figures = (tuple(gauges(snap, now)), tuple(pulses(snap, now, per_host=self.per_host)))

    def watch_figures(self) -> None:
        self._draw()

    def watch_per_host(self) -> None:
        if self.snap is not None:
            self.show(self.snap, self.now)

    def _draw(self) -> None:
        if self.snap is None:  # nothing shown yet
            return
        figure_rows, shown = self.figures
        rows = list(figure_rows)
        width = self.content_region.width or 40
        height = self.content_region.height or 4
        paired = len(rows) > height
        label_w = min(max((len(r.label) for r in rows), default=5), 10) + 1
        lines = self._pairs(rows, width) if paired else [self._line(r, width, label_w) for r in rows]
        shown_lines = lines[:height] if paired else lines
        # a new layout (a reflow and a repaint of the whole screen) only when the line count moved
        self.bars.update(Text("\n").join(shown_lines), layout=len(shown_lines) != self._bar_lines)
        self._bar_lines = len(shown_lines)
        hidden = max(len(lines) - height, 0)
        self.border_subtitle = (
            f"{hidden} more line{'s' if hidden > 1 else ''} (a taller window)" if hidden else ""
        )
        room = max(height - len(lines), 0)
        self._show_pulses(list(shown[:room]))

    # ------------------------------------------------------------------ drawing

    def _bar(self, gauge: Gauge, width: int) -> Text:
        style = self._styles(STATE_VARIABLES[gauge.state])
        if gauge.key == "today":
            return Text(" " * width)
        n = round(max(0.0, min(gauge.fill, 1.0)) * width)
        if gauge.fill > 0 and n == 0:
            n = 1  # something is used: show it
        bar = Text("█" * n, style=style)
        bar.append("░" * (width - n), style=self._styles("foreground-muted"))
        return bar

    def _line(self, gauge: Gauge, width: int, label_w: int) -> Text:
        """``slots  ████░░░░ 3/4 gate 2.0``: the note after the number when there is room."""
        label = f"{inert(gauge.label, one_line=True)[: label_w - 1]:<{label_w}}"
        value = f" {gauge.value}"
        bar_w = max(4, min(24, width - len(label) - len(value) - 1 - min(len(gauge.note), 30)))
        text = Text(label)
        text.append_text(self._bar(gauge, bar_w))
        text.append(value, style=self._styles(STATE_VARIABLES[gauge.state]))
        room = width - len(text.plain) - 1
        if gauge.note and room > 3:
            note = gauge.note if len(gauge.note) <= room else gauge.note[: room - 1] + "…"
            text.append(" " + note, style=self._styles("foreground-muted"))
        text.truncate(width, overflow="ellipsis")
        return text

    def _cell(self, gauge: Gauge, width: int) -> Text:
        """The short form for paired lines: label, bar, number (a held account keeps its time). The
        label is cut only where the cell has no room for it (a bar of three at the least): a rate
        limit's account, ``sim:sim-b``, read "sim:si" on any width."""
        value = gauge.value.replace(" free", "")
        if gauge.key.startswith("rate:") and gauge.value == "held" and "resumes " in gauge.note:
            value = "→" + gauge.note.split("resumes ", 1)[1].split(" ")[0]
        value = " " + value
        label = f"{inert(gauge.label, one_line=True)[: max(6, width - len(value) - 4)]} "
        bar_w = max(2, width - len(label) - len(value))
        text = Text(label)
        text.append_text(self._bar(gauge, bar_w))
        text.append(value, style=self._styles(STATE_VARIABLES[gauge.state]))
        text.truncate(width, overflow="ellipsis")
        return text

    def _pairs(self, rows: list[Gauge], width: int) -> list[Text]:
        half = (width - 1) // 2
        out = []
        for i in range(0, len(rows), 2):
            line = self._cell(rows[i], half)
            if i + 1 < len(rows):
                line.pad_right(half - len(line.plain) + 1)
                line.append_text(self._cell(rows[i + 1], width - half - 1))
            out.append(line)
        return out

    def _show_pulses(self, shown: list[Pulse]) -> None:
        if len(shown) != len(self._rows):
            self.pulse_box.remove_children()
            self._rows = [PulseRow(p) for p in shown]
            if self._rows:
                self.pulse_box.mount_all(self._rows)
        else:
            for row, p in zip(self._rows, shown, strict=True):
                row.set(p)
        self.pulse_box.display = bool(shown)
