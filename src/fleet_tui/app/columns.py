"""The queue's columns and cells: which columns fit a width, and each cell's inert text.

Kept apart from the widget so the rules can be tested without an app: names come first and are
never cut while a column can still give way (on a narrow terminal low-value columns are dropped
rather than cut to one letter); every cell that came from an agent, a task file or git goes
through ``sanitize_for_display`` so it is shown as text, never acted on by the terminal.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len, set_cell_size

from fleet_tui.app.format import (
    GLYPHS,
    coder_model,
    context_pct,
    cost,
    count,
    duration,
    elapsed,
    state_text,
)
from fleet_tui.app.order import GroupInfo
from fleet_tui.scheduler.humans.inbox import sanitize_for_display
from fleet_tui.scheduler.model import Task


def clean(text: str) -> str:
    """A cell's text: one line, inert (no escape sequence or control character survives)."""
    return sanitize_for_display(text, one_line=True)


def cut_end(text: str, width: int) -> str:
    if width <= 0:
        return ""
    if cell_len(text) <= width:
        return text
    return set_cell_size(text, width - 1) + "…"


def cut_middle(text: str, width: int) -> str:
    """Cut in the middle, so names that share a prefix (``refactor-payments-api``,
    ``refactor-payments-ui``) still differ on screen."""
    if width <= 0:
        return ""
    if cell_len(text) <= width:
        return text
    if width < 5:
        return cut_end(text, width)
    tail = (width - 1) // 2
    head = width - 1 - tail
    return text[:head] + "…" + text[len(text) - tail :]


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    width: int
    right: bool = False


#: (key, label, minimum width, ideal width, right-aligned); in display order
_COLUMNS: tuple[tuple[str, str, int, int, bool], ...] = (
    ("glyph", " ", 1, 1, False),
    ("name", "name", 4, 4, False),  # minimum and ideal: the longest name
    ("state", "state", 14, 34, False),
    ("attempt", "#", 2, 2, True),
    ("elapsed", "time", 6, 6, True),
    ("tokens", "tok", 5, 5, True),
    ("ctx", "ctx", 4, 4, True),
    ("cost", "cost", 6, 6, True),
    ("coder", "coder/model", 8, 18, False),
    ("host", "host", 5, 12, False),
)
#: columns given up first when the width is short, so none is cut to a letter
_DROP_ORDER = ("ctx", "host", "tokens", "attempt", "coder", "cost", "elapsed")
#: then the spare width: (column, up to this width, 0 = its ideal); what is left goes to state
_GROW_ORDER = (("state", 24), ("coder", 0), ("host", 0), ("state", 0))


def layout(width: int, longest_name: int) -> tuple[Column, ...]:
    """The columns for a content ``width``: names whole first, then the state; optional columns
    dropped (in ``_DROP_ORDER``) rather than cut; what is left goes to state, coder, host, state."""
    spec = {key: (label, lo, hi, right) for key, label, lo, hi, right in _COLUMNS}
    name_w = max(longest_name, 4)
    widths = {key: lo for key, (_, lo, _, _) in spec.items()}
    widths["name"] = name_w
    keys = [key for key, *_ in _COLUMNS]

    def need() -> int:
        return sum(widths[k] for k in keys) + len(keys) - 1

    for key in _DROP_ORDER:
        if need() <= width:
            break
        keys.remove(key)
    if need() > width:  # even alone with the state the name does not fit: cut names in the middle
        widths["name"] = max(8, name_w - (need() - width))
    spare = width - need()
    for key, upto in _GROW_ORDER:
        if key in keys and spare > 0:
            grow = max(0, min(spare, (upto or spec[key][2]) - widths[key]))
            widths[key] += grow
            spare -= grow
    if spare > 0:
        widths["state"] += spare
    return tuple(
        Column(k, spec[k][0] if widths[k] >= len(spec[k][0]) else "coder", widths[k], spec[k][3])
        for k in keys
    )


def cell_texts(task: Task, now: float, asking: bool) -> dict[str, str]:
    """A task's cells as plain, inert text (before fitting to column widths)."""
    return {
        "glyph": GLYPHS["asking"] if asking else GLYPHS.get(task.status.value, "?"),
        "name": clean(task.name),
        "state": clean(state_text(task, asking)),
        "attempt": str(task.attempt) if task.attempt else "-",
        "elapsed": duration(elapsed(task, now)),
        "tokens": count(task.tokens),
        "ctx": context_pct(task),
        "cost": cost(task.cost_usd),
        "coder": clean(coder_model(task)),
        "host": clean(task.host or "-"),
    }


def group_text(info: GroupInfo) -> str:
    """``▾ api (/src/api) 42 · ? 1 · ! 2 · ◐ 3 · ◌ 30 · ● 6``: counts per state."""
    arrow = "▸" if info.collapsed else "▾"
    counts = " · ".join(f"{GLYPHS.get(state, '?')} {n}" for state, n in info.counts)
    label = clean(info.label)
    where = "" if info.label == info.root else f" ({clean(info.root)})"
    return f"{arrow} {label} · {info.total} · {counts}{where}"
