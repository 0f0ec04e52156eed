"""The fleet's pulse over the last hour, as data: running agents, events, tokens and cost per bucket.

Why it exists: the cockpit draws sparklines of the last hour, and so must an attached cockpit and
``fleet-tui status --gauges``, which live in other processes. So the history is collected where the
agents are (each engine samples its own runners once a second, ``SeriesCollector.observe``), kept in
fixed buckets, and written to the store under ``series:<engine>`` (``save``); ``load`` reads every
engine's back, ``by_host`` sums each host's engines (two engines on one machine, say a cockpit and
a headless ``run``, each count their own agents) and ``fleet_total`` sums the hosts. Buckets are
aligned to the epoch, so they line up. Rows of a version before per-engine rows
(``series:<host>``) are read alike. An engine starting drops the rows that ended over an hour
ago (``prune``): each engine's run leaves one. Counters are cumulative per attempt (a runner's
event ``seq``, tokens and cost) and only their growth is counted, so a restart or a new attempt
never counts anything twice.

No textual or rich imports; pure apart from ``save``/``load``, which take the store.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fleet_tui.scheduler.model import HostSeries
from fleet_tui.scheduler.store.protocol import Store

BUCKET_S = 30.0
KEEP = 120  # one hour of 30 s buckets
SAVE_EVERY_S = 1.0  # with the host row, once per housekeeping tick
SETTING = "series:"


@dataclass(frozen=True)
class Counters:
    """What one live attempt has produced so far (cumulative)."""

    key: tuple[str, int]  # (task id, attempt)
    events: int
    tokens: int
    cost: float


class SeriesCollector:
    """Samples of one host, bucketed. ``observe`` once a second; ``series`` for the snapshot."""

    def __init__(
        self, host: str, *, key: str | None = None, bucket_s: float = BUCKET_S, keep: int = KEEP
    ) -> None:
        self.host = host
        self.key = SETTING + (key or host)  # its row in the store: the engine's own
        self.bucket_s = bucket_s
        self.keep = keep
        self._buckets: dict[int, list[float]] = {}  # index -> [running peak, events, tokens, cost]
        self._last: dict[tuple[str, int], Counters] = {}
        self._observed = False
        self._saved_at = 0.0

    def observe(self, now: float, running: int, counters: Iterable[Counters]) -> None:
        idx = int(now // self.bucket_s)
        b = self._buckets.setdefault(idx, [0.0, 0.0, 0.0, 0.0])
        b[0] = max(b[0], running)
        seen: dict[tuple[str, int], Counters] = {}
        for c in counters:
            seen[c.key] = c
            old = self._last.get(c.key)
            if old is None and not self._observed:
                continue  # adopted at start: what it did before is not this hour's pulse
            base = old or Counters(c.key, 0, 0, 0.0)
            b[1] += max(c.events - base.events, 0)
            b[2] += max(c.tokens - base.tokens, 0)
            b[3] += max(c.cost - base.cost, 0.0)
        self._last = seen
        self._observed = True
        for old_idx in [i for i in self._buckets if i <= idx - self.keep]:
            del self._buckets[old_idx]

    def series(self, now: float) -> HostSeries:
        last = int(now // self.bucket_s)
        first = min(self._buckets, default=last)
        first = max(first, last - self.keep + 1)
        rows = [self._buckets.get(i, [0.0, 0.0, 0.0, 0.0]) for i in range(first, last + 1)]
        return HostSeries(
            host=self.host,
            bucket_s=self.bucket_s,
            start=first * self.bucket_s,
            running=tuple(int(r[0]) for r in rows),
            events=tuple(int(r[1]) for r in rows),
            tokens=tuple(int(r[2]) for r in rows),
            cost=tuple(round(r[3], 6) for r in rows),
        )

    def save(self, store: Store, now: float) -> None:
        """Write the series to the store every few seconds (for status and attached cockpits)."""
        if now - self._saved_at < SAVE_EVERY_S:
            return
        self._saved_at = now
        store.set_setting(self.key, encode(self.series(now)))


def encode(s: HostSeries) -> str:
    return json.dumps(
        {
            "host": s.host,
            "bucket_s": s.bucket_s,
            "start": s.start,
            "running": s.running,
            "events": s.events,
            "tokens": s.tokens,
            "cost": s.cost,
        },
        separators=(",", ":"),
    )


def decode(text: str) -> HostSeries | None:
    """A stored series, or None when it is not one (never raises on a bad row)."""
    try:
        d = json.loads(text)
        return HostSeries(
            host=str(d["host"]),
            bucket_s=float(d["bucket_s"]),
            start=float(d["start"]),
            running=tuple(int(v) for v in d["running"]),
            events=tuple(int(v) for v in d["events"]),
            tokens=tuple(int(v) for v in d["tokens"]),
            cost=tuple(float(v) for v in d["cost"]),
        )
    except (ValueError, KeyError, TypeError):
        return None


def window(s: HostSeries, now: float, keep: int = KEEP) -> HostSeries:
    """``s`` cut to the hour ending at ``now`` and padded with empty buckets up to ``now``
    (a series saved a while ago ends in silence, not in its last reading)."""
    if s.bucket_s <= 0:
        return s
    first = round(s.start / s.bucket_s)
    last = int(now // s.bucket_s)
    lo = max(first, last - keep + 1)
    if lo > last:
        return HostSeries(s.host, s.bucket_s, last * s.bucket_s, (0,), (0,), (0,), (0.0,))

    def cut(values: Sequence[float], zero: float) -> list[float]:
        out = [zero] * (last - lo + 1)
        for i, v in enumerate(values):
            j = first + i - lo
            if 0 <= j < len(out):
                out[j] = v
        return out

    return HostSeries(
        host=s.host,
        bucket_s=s.bucket_s,
        start=lo * s.bucket_s,
        running=tuple(int(v) for v in cut(s.running, 0)),
        events=tuple(int(v) for v in cut(s.events, 0)),
        tokens=tuple(int(v) for v in cut(s.tokens, 0)),
        cost=tuple(cut(s.cost, 0.0)),
    )


def _recent(s: HostSeries, now: float) -> bool:
    return s.start + s.bucket_s * len(s.running) > now - KEEP * s.bucket_s


def load(store: Store, now: float, *, skip: str | None = None) -> list[HostSeries]:
    """Every engine's stored series that reaches into the last hour, cut to it; ``skip``: the
    row (``SeriesCollector.key``) of the caller, who has a fresher copy of its own."""
    out = []
    for key, text in sorted(store.settings_with_prefix(SETTING).items()):
        s = decode(text) if key != skip else None
        if s is not None and _recent(s, now):
            out.append(window(s, now))
    return out


def prune(store: Store, now: float) -> int:
    """Drop the stored series that ended over an hour ago, and rows that are not series;
    how many went."""
    gone = 0
    for key, text in store.settings_with_prefix(SETTING).items():
        s = decode(text)
        if s is None or not _recent(s, now):
            store.set_setting(key, None)
            gone += 1
    return gone


def by_host(series: Sequence[HostSeries], now: float) -> tuple[HostSeries, ...]:
    """One series per host, its engines' summed, sorted by host."""
    hosts: dict[str, list[HostSeries]] = {}
    for s in series:
        hosts.setdefault(s.host, []).append(s)
    return tuple(t for host, mine in sorted(hosts.items()) if (t := _sum(mine, host, now)) is not None)


def fleet_total(series: Sequence[HostSeries], now: float) -> HostSeries | None:
    """The hosts' series summed bucket by bucket (all aligned to the same bucket size)."""
    return _sum(series, "fleet", now)


def _sum(series: Sequence[HostSeries], name: str, now: float) -> HostSeries | None:
    if not series:
        return None
    bucket = series[0].bucket_s
    same = [window(s, now) for s in series if s.bucket_s == bucket]
    lo = min(round(s.start / bucket) for s in same)
    last = int(now // bucket)
    n = last - lo + 1
    running = [0] * n
    events = [0] * n
    tokens = [0] * n
    cost = [0.0] * n
    for s in same:
        off = round(s.start / bucket) - lo
        for i in range(len(s.running)):
            running[off + i] += s.running[i]
            events[off + i] += s.events[i]
            tokens[off + i] += s.tokens[i]
            cost[off + i] += s.cost[i]
    return HostSeries(name, bucket, lo * bucket, tuple(running), tuple(events), tuple(tokens), tuple(cost))
