"""The two read-only panes fed from the snapshot: the one-line header and the gauges.

Both are repainted from a frozen ``Snapshot`` about once a second (the memray-style pull), plus on
live gauge/question events, through ``reactive`` attributes as Textual's own widgets do: the
header's ``line`` and the gauges' ``figures``; setting one to what it already holds draws nothing.
The header's text is built by ``format``; the gauges' figures and states by ``fleet_tui.gauges``
(shared with ``status --gauges``), so the panes only draw them: a bar per gauge coloured by state
through the theme (ok / near / held), the number beside it, and Textual's sparklines for the
fleet's pulse (per host on demand, ``h``), all drawn by one widget (``PulseLines``). The pane fits
its size: when the bars do not fit one per line they pair up and drop their notes, and sparklines
get whatever lines are left.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

from rich.color import Color as RichColor
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.geometry import Size
from textual.reactive import reactive
from textual.renderables._blend_colors import blend_colors
from textual.renderables.sparkline import Sparkline as SparklineRenderable
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Static

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


class PulseLines(Widget):
    """The fleet's pulse: one line per sparkline, its label and latest figure in ``LABEL_WIDTH``
    cells, then Textual's sparkline over the rest of the line.

    One widget draws every line. It was a row of a label and a ``Sparkline`` widget per line,
    eight widgets drawn for four lines: a full repaint of the cockpit (closing a dialog) walked
    each of them and cut every screen line they cover at each one's edges, about a quarter of an
    idle close's time. The lines are drawn when the figures, the width or the theme change, and
    kept."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"pulse--label", "pulse--max-color", "pulse--min-color"}
    DEFAULT_CSS = """
    PulseLines {
        height: auto;
    }
    """
    #: the label's cells (``agents 3``, ``box1 events/s 120``), as the label column was
    LABEL_WIDTH = 22

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._pulses: tuple[Pulse, ...] = ()
        self._strips: list[Strip] = []
        self._drawn_for: tuple[object, ...] = ()
        self._lines: dict[Pulse, Strip] = {}  # each line on show, by its figures

    @property
    def labels(self) -> list[str]:
        """Each line's label as shown (read-only, for tests)."""
        return [self._label(p) for p in self._pulses]

    def set(self, pulses: Sequence[Pulse]) -> None:
        pulses = tuple(pulses)
        if pulses == self._pulses:
            return
        resized = len(pulses) != len(self._pulses)  # another height: a new layout
        self._pulses = pulses
        self.refresh(layout=resized)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._pulses)

    @staticmethod
    def _label(pulse: Pulse) -> str:
        who = "" if pulse.host == "fleet" else f"{pulse.host} "
        return inert(f"{who}{pulse.label} {pulse.now}", one_line=True)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        _, background = self.background_colors
        key = (self._pulses, width, self.app.theme, background)
        if key != self._drawn_for:
            # a line whose figures did not change is kept (a snapshot often moves one or two),
            # unless the width or the look changed: then every line again
            kept = self._lines if key[1:] == self._drawn_for[1:] else {}
            self._drawn_for = key
            # the pane's look, read once for every line: as Textual's Sparkline widget draws
            # it, its colours over the pane's background
            look = _Look(
                label=self.get_component_rich_style("pulse--label"),
                low=(background + self.get_component_styles("pulse--min-color").color).rich_color,
                high=(background + self.get_component_styles("pulse--max-color").color).rich_color,
                fill=Style(bgcolor=background.rich_color),
            )
            self._lines = {p: kept[p] if p in kept else self._draw(p, width, look) for p in self._pulses}
            self._strips = [self._lines[p] for p in self._pulses]
        return self._strips[y] if 0 <= y < len(self._strips) else Strip.blank(width)

    def _draw(self, pulse: Pulse, width: int, look: _Look) -> Strip:
        label_w = min(self.LABEL_WIDTH, width)
        parts = [Strip([Segment(self._label(pulse), look.label)]).adjust_cell_length(label_w)]
        line_w = width - label_w
        if line_w > 0:
            # the line always spans the hour (a young fleet's few buckets sit at the right end)
            values = list(pulse.values)
            data = [0.0] * max(KEEP - len(values), 0) + values
            parts.append(Strip(sparkline(data, line_w, look.low, look.high), line_w))
        return Strip.join(parts).apply_style(look.fill)


def sparkline(data: Sequence[float], width: int, low: RichColor, high: RichColor) -> list[Segment]:
    """One line of Textual's ``Sparkline`` (``textual.renderables.sparkline``, its widget's
    ``summary_function=max``), cell for cell and style for style, as segments: drawn through the
    console's render pipeline it was about 1.3 ms a line on a loaded machine, four lines a second
    while a fleet runs, and a key pressed meanwhile waited for it. Each cell is the largest value
    of its share of ``data``, as a bar of eight heights coloured from ``low`` to ``high``."""
    if not data:
        return [Segment("▁" * width, Style.from_color(low))]
    if len(data) == 1:
        return [Segment("█" * width, Style.from_color(high))]
    minimum, maximum = min(data), max(data)
    extent = maximum - minimum or 1
    n = len(data)
    # the data cut into ``width`` shares as Textual cuts it (empty shares dropped)
    shares = [
        max(data[n * b // width : n * (b + 1) // width])
        for b in range(width)
        if n * (b + 1) // width > n * b // width
    ]
    step = len(shares) / width
    top = len(BARS) - 1
    cells: list[Segment] = []
    index = 0.0
    for _ in range(width):
        ratio = (shares[int(index)] - minimum) / extent  # 0 to 1
        cells.append(Segment(BARS[int(ratio * top)], _bar_style(low, high, ratio)))
        index += step
    return cells


@lru_cache(maxsize=4096)
def _bar_style(low: RichColor, high: RichColor, ratio: float) -> Style:
    """A bar's colour, kept: the hour's figures move slowly, and a bar of the same height from
    the same extremes comes back in the next second's lines (blending was half a line's time)."""
    return Style.from_color(blend_colors(low, high, ratio))


#: the eight heights of a sparkline's bar (Textual's ``Sparkline.BARS``)
BARS = SparklineRenderable.BARS


@dataclass(frozen=True)
class _Look:
    """What the pulse lines are drawn in: the label's style, the sparkline's two colours and the
    pane's background."""

    label: Style
    low: RichColor
    high: RichColor
    fill: Style


class GaugesPane(Vertical):
    """Bars for slots, load, memory, disk, each rate-limit account and the day's spend, then
    sparklines of running agents, events/s, tokens/min and cost/hour."""

    can_focus = True
    BINDINGS: ClassVar[list[BindingType]] = [Binding("h", "per_host", "per host")]

    per_host: reactive[bool] = reactive(False, init=False)
    """Sparklines per host (``h``) instead of for the whole fleet."""
    figures: reactive[tuple[tuple[Gauge, ...], tuple[Pulse, ...]]] = reactive(
        ((), ()), init=False, repaint=False
    )
    """What the pane draws: the gauge rows and the sparklines (``fleet_tui.gauges``), worked out
    from each snapshot; a snapshot that changes neither draws nothing. A change does not repaint
    the pane: its watcher draws the lines that changed (none, for a figure that moved under the
    same text)."""

    @property
    def pulse_labels(self) -> list[str]:
        """The sparklines' labels on show, top to bottom (read-only)."""
        return self.pulse.labels

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.bars = Static("", id="gauge-bars")
        self.pulse = PulseLines(id="pulse")
        self.snap: Snapshot | None = None
        self.now = 0.0
        self._bars_drawn: list[Text] | None = None  # the bar lines on show

    def compose(self) -> ComposeResult:
        yield self.bars
        yield self.pulse

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
        # the figures move every second (free memory to the byte, the load's fill) where the
        # lines drawn from them mostly do not: those are not drawn again
        drawn = self._bars_drawn
        if shown_lines != drawn:
            # a new layout (a reflow and a repaint of the whole screen) only when the line count moved
            moved = drawn is None or len(shown_lines) != len(drawn)
            self.bars.update(Text("\n").join(shown_lines), layout=moved)
            self._bars_drawn = shown_lines
        hidden = max(len(lines) - height, 0)
        subtitle = f"{hidden} more line{'s' if hidden > 1 else ''} (a taller window)" if hidden else ""
        if subtitle != (self.border_subtitle or ""):  # setting it repaints the whole pane
            self.border_subtitle = subtitle
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
        self.pulse.set(shown)
        self.pulse.display = bool(shown)
