"""The gauges as figures: each reading against its gate, its state, and the fleet's pulse.

Why it exists: the cockpit's gauges pane, ``fleet-tui status --gauges`` and its ``--json`` must show
the same numbers and agree on what is "near" and what is "held". This module turns a ``Snapshot``
into ``Gauge`` rows (fill toward the gate, value, note, state) and ``Pulse`` lines (sparkline
data), and draws them as plain text for the command line. No Textual or Rich here; the pane
styles the same rows through the theme.

States: ``held`` when the gate holds work back (slots full, load over its limit, memory under the
floor plus one agent, disk under its floor, an account held or over its threshold, the daily
budget spent; an unknown reading is held, as the gate treats it); ``near`` from ``NEAR`` of the way
to the gate; else ``ok``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Literal

from fleet_tui.scheduler.humans.inbox import sanitize_for_display
from fleet_tui.scheduler.model import HostSeries, Snapshot
from fleet_tui.scheduler.series import fleet_total, window

State = Literal["ok", "near", "held"]
NEAR = 0.75
SPARKS = "▁▂▃▄▅▆▇█"


@dataclass(frozen=True)
class Gauge:
    key: str  # slots, load, mem, disk, budget, rate:<account>
    label: str
    fill: float  # 0..1: how far toward the gate
    value: str  # the number beside the bar
    note: str  # what it is held against, the window, the countdown
    state: State
    numbers: tuple[tuple[str, float | int | bool | str | None], ...] = ()  # for --json


@dataclass(frozen=True)
class Pulse:
    """One sparkline: a label, values oldest first, and the latest figure as text."""

    key: str  # agents, events, tokens, cost
    label: str
    host: str  # "fleet" or a host name
    values: tuple[float, ...]
    now: str


def _clean(text: str) -> str:
    return sanitize_for_display(text, one_line=True)


def size(n: float | None) -> str:
    if n is None:
        return "?"
    for unit, div in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div:
            v = n / div
            return f"{v:.1f}{unit}" if v < 10 else f"{v:.0f}{unit}"
    return f"{int(n)}B"


def countdown(seconds: float) -> str:
    """``4m07s``, ``1h05m``, ``12s``."""
    s = max(int(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def hhmm(ts: float) -> str:
    return time.strftime("%H:%M", time.localtime(ts))


def _state(fill: float, held: bool) -> State:
    if held:
        return "held"
    return "near" if fill >= NEAR else "ok"


def gauges(snap: Snapshot, now: float) -> list[Gauge]:
    """Every gauge of the snapshot, in display order: slots, load, mem, disk, accounts, budget."""
    g = snap.gauges
    out: list[Gauge] = []
    cap = g.max_concurrent
    fill = g.running / cap if cap else 1.0
    elsewhere = f"+{g.running_elsewhere} on other engines" if g.running_elsewhere else ""
    out.append(
        Gauge(
            "slots",
            "slots",
            min(fill, 1.0),
            f"{g.running}/{cap or '?'}",
            "fleet paused" if g.paused else elsewhere,
            "held" if g.paused or g.running >= cap else _state(fill, False),
            (("running", g.running), ("max", cap), ("paused", g.paused), ("elsewhere", g.running_elsewhere)),
        )
    )
    gate = g.max_load_per_core
    if g.load_per_core is None:
        out.append(
            Gauge("load", "load", 1.0, "?", "reading unknown", "held", (("per_core", None), ("gate", gate)))
        )
    else:
        fill = g.load_per_core / gate if gate else 0.0
        out.append(
            Gauge(
                "load",
                "load",
                min(fill, 1.0),
                f"{g.load_per_core:.1f}/core",
                f"gate {gate:.1f}" if gate else "",
                _state(fill, bool(gate) and g.load_per_core > (gate or 0)),
                (("per_core", round(g.load_per_core, 3)), ("gate", gate)),
            )
        )
    floor = g.mem_floor or 0
    agent = g.agent_mem or 0
    need = floor + agent
    mem_numbers = (
        ("free", g.mem_available),
        ("floor", floor),
        ("agent", agent),
        ("agent_measured", g.agent_mem_measured),
    )
    per = f"{size(agent)}/agent{'' if g.agent_mem_measured else ' assumed'}" if agent else ""
    if g.mem_available is None:
        out.append(Gauge("mem", "mem", 1.0, "?", "reading unknown", "held", mem_numbers))
    else:
        fill = need / g.mem_available if g.mem_available else 1.0
        room = (g.mem_available - floor) // agent if agent else None
        note = (f"floor {size(floor)}" if g.mem_floor is not None else "") + (f" + {per}" if per else "")
        if room is not None:
            note += f" · room for {max(room, 0)}"
        out.append(
            Gauge(
                "mem",
                "mem",
                min(fill, 1.0),
                f"{size(g.mem_available)} free",
                note,
                _state(fill, g.mem_available < need),
                mem_numbers,
            )
        )
    dfloor = g.disk_floor or 0
    if g.disk_free is None:
        out.append(
            Gauge("disk", "disk", 1.0, "?", "reading unknown", "held", (("free", None), ("floor", dfloor)))
        )
    else:
        fill = dfloor / g.disk_free if g.disk_free else 1.0
        out.append(
            Gauge(
                "disk",
                "disk",
                min(fill, 1.0),
                f"{size(g.disk_free)} free",
                f"floor {size(dfloor)}" if g.disk_floor is not None else "",
                _state(fill, g.disk_free < dfloor),
                (("free", g.disk_free), ("floor", dfloor)),
            )
        )
    holds = dict(g.rate_holds)
    for rl in g.rate_limits:
        account = _clean(rl.account)
        window_name = _clean(rl.window or "")
        until = holds.get(rl.account)
        if rl.status == "rejected" and rl.resets_at is not None:  # as the gate: held until the reset
            until = max(until or 0.0, rl.resets_at)
        until = until if until is not None and until > now else None
        over = rl.resets_at is not None and rl.resets_at <= now  # the window has reset since
        util = None if over else rl.utilization
        fill = util or 0.0
        threshold = g.rate_limit_threshold
        held = until is not None or (util is not None and util >= threshold)
        if until is not None:
            value = "held"
            note = f"resumes {hhmm(until)} (in {countdown(until - now)})"
        else:
            value = "?" if util is None else f"{util * 100:.0f}%"
            if over:
                note = f"reset {hhmm(rl.resets_at or now)}"
            elif rl.resets_at is not None:
                note = f"resets in {countdown(rl.resets_at - now)}"
            else:
                note = ""
        if window_name:
            note = f"{window_name} · {note}" if note else window_name
        out.append(
            Gauge(
                f"rate:{account}",
                account,
                1.0 if until is not None else min(fill, 1.0),
                value,
                note,
                "held" if held else _state(fill / threshold if threshold else fill, False),
                (
                    ("utilization", util),
                    ("threshold", threshold),
                    ("window", window_name or None),
                    ("resets_at", rl.resets_at),
                    ("held_until", until),
                ),
            )
        )
    if g.budget_usd is not None:
        fill = g.budget_spent_usd / g.budget_usd if g.budget_usd else 1.0
        out.append(
            Gauge(
                "budget",
                "budget",
                min(fill, 1.0),
                f"${g.budget_spent_usd:.2f}",
                f"of ${g.budget_usd:.2f} today",
                _state(fill, g.budget_spent_usd >= g.budget_usd),
                (("spent_today_usd", round(g.budget_spent_usd, 4)), ("budget_usd", g.budget_usd)),
            )
        )
    else:  # the day's total is always shown
        out.append(
            Gauge(
                "today",
                "today",
                0.0,
                f"${g.budget_spent_usd:.2f}",
                "no daily budget",
                "ok",
                (("spent_today_usd", round(g.budget_spent_usd, 4)), ("budget_usd", None)),
            )
        )
    return out


# ---------------------------------------------------------------------------------------- pulse


def _pulses(s: HostSeries, host: str) -> list[Pulse]:
    b = s.bucket_s or 1.0
    events = tuple(v / b for v in s.events)
    tokens = tuple(v * 60 / b for v in s.tokens)
    cost = tuple(v * 3600 / b for v in s.cost)
    # the last bucket is still filling: its rate is read over the part that has passed
    return [
        Pulse(
            "agents",
            "agents",
            host,
            tuple(float(v) for v in s.running),
            f"{s.running[-1] if s.running else 0}",
        ),
        Pulse("events", "events/s", host, events, f"{_last(events):.1f}"),
        Pulse("tokens", "tok/min", host, tokens, _count(_last(tokens))),
        Pulse("cost", "$/hour", host, cost, f"${_last(cost):.2f}"),
    ]


def _last(values: tuple[float, ...]) -> float:
    """The latest complete bucket's figure (the one before the filling one), else the only one."""
    return values[-2] if len(values) >= 2 else (values[-1] if values else 0.0)


def _count(n: float) -> str:
    if n < 1000:
        return f"{n:.0f}"
    if n < 1_000_000:
        return f"{n / 1000:.1f}k"
    return f"{n / 1_000_000:.1f}M"


def pulses(snap: Snapshot, now: float, per_host: bool = False) -> list[Pulse]:
    """The fleet's sparklines (sum over hosts), then with ``per_host`` one line per host (its
    running agents)."""
    total = fleet_total(snap.series, now)
    if total is None:
        return []
    out = _pulses(total, "fleet")
    g = snap.gauges  # the fleet's agents now (every engine's), not the bucket's peak
    out[0] = replace(out[0], now=str(g.running + g.running_elsewhere))
    if per_host and len(snap.series) > 1:
        for s in snap.series:  # one line per host: its running agents
            out.append(_pulses(window(s, now), _clean(s.host))[0])
    return out


def spark(values: tuple[float, ...] | list[float], width: int) -> str:
    """``values`` as a text sparkline of at most ``width`` cells (each cell the max of its span)."""
    if width <= 0 or not values:
        return ""
    vals = list(values)
    if len(vals) > width:
        step = len(vals) / width
        vals = [max(vals[int(i * step) : max(int((i + 1) * step), int(i * step) + 1)]) for i in range(width)]
    top = max(vals)
    if top <= 0:
        return SPARKS[0] * len(vals)
    return "".join(SPARKS[min(int(v / top * (len(SPARKS) - 1) + 0.5), len(SPARKS) - 1)] for v in vals)


# ---------------------------------------------------------------------------------------- text


def bar(fill: float, width: int) -> str:
    """A text bar: ``██████░░░░``."""
    width = max(width, 1)
    n = round(max(0.0, min(fill, 1.0)) * width)
    return "█" * n + "░" * (width - n)


def text_report(snap: Snapshot, now: float, width: int = 80, per_host: bool = True) -> list[str]:
    """``status --gauges``: one line per gauge (bar, number, state, note), then the sparklines."""
    rows = gauges(snap, now)
    label_w = max([len(r.label) for r in rows] + [8])
    bar_w = max(10, min(30, width - label_w - 40))
    lines = []
    for r in rows:
        drawn = bar(r.fill, bar_w) if r.key != "today" else " " * bar_w
        line = f"{r.label:<{label_w}} {drawn} {r.value:>10}  {r.state:<4}  {r.note}"
        lines.append(line.rstrip())
    spark_w = max(10, min(60, width - label_w - 24))
    for p in pulses(snap, now, per_host=per_host):
        who = "" if p.host == "fleet" else f" {p.host}"
        lines.append(f"{p.label:<{label_w}} {spark(p.values, spark_w)} {p.now}{who}")
    return lines


def as_json(snap: Snapshot, now: float) -> dict[str, Any]:
    """The same figures for scripts (``status --gauges --json``)."""
    series = {}
    for host, s in [("fleet", fleet_total(snap.series, now))] + [
        (x.host, window(x, now)) for x in snap.series
    ]:
        if s is None:
            continue
        b = s.bucket_s or 1.0
        series[_clean(host)] = {
            "bucket_s": s.bucket_s,
            "start": s.start,
            "running": list(s.running),
            "events_per_s": [round(v / b, 3) for v in s.events],
            "tokens_per_min": [round(v * 60 / b, 1) for v in s.tokens],
            "cost_per_hour": [round(v * 3600 / b, 4) for v in s.cost],
        }
    return {
        "taken_at": snap.taken_at,
        "gauges": [
            {
                "key": r.key,
                "label": r.label,
                "state": r.state,
                "fill": round(r.fill, 4),
                "value": r.value,
                "note": r.note,
                **dict(r.numbers),
            }
            for r in gauges(snap, now)
        ],
        "spent_today_usd": round(snap.gauges.budget_spent_usd, 4),
        "budget_usd": snap.gauges.budget_usd,
        "hosts": [_clean(h.name) for h in snap.hosts],
        "series": series,
    }
