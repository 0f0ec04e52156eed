"""Each running engine's slot cap (``max_concurrent``), as that engine runs with it.

Why it exists: an engine started with ``run --max-concurrent N``, or one whose config changed
since, runs with a cap that this machine's ``config.toml`` does not say. ``fleet-tui plan``, a
process of its own, counted the machine's running agents against the config's cap, and said
"would start" for tasks that its engines rightly held back (or "waits" for tasks they would
start). So each engine keeps the cap it runs with in the store's settings (``cap:<engine>``)
while it runs, and a plan on a machine where engines run counts against the sum of theirs. The
slots gauge of ``status --gauges`` and of an attached cockpit, which count every agent, count
them against every live engine's slots the same way (scheduler/view.py).

An engine writes its row when it starts and when its cap changes, and deletes it when it stops;
a starting engine deletes the rows of engines that are no longer live (a crash leaves its row).
"""

from __future__ import annotations

from collections.abc import Collection

from fleet_tui.scheduler.store.protocol import Store

SETTING = "cap:"


def key(owner: str) -> str:
    """The setting that holds engine ``owner``'s cap (set to None when it stops)."""
    return SETTING + owner


def save(store: Store, owner: str, cap: int) -> None:
    """Engine ``owner`` runs with ``cap`` slots from now on."""
    store.set_setting(key(owner), str(cap))


def prune(store: Store, live: Collection[str]) -> int:
    """Delete the caps of engines not in ``live`` (stopped without a word: a crash, a kill);
    how many went."""
    gone = 0
    for key in store.settings_with_prefix(SETTING):
        if key[len(SETTING) :] not in live:
            store.set_setting(key, None)
            gone += 1
    return gone


def total(store: Store, owners: Collection[str], default: int) -> int:
    """The slots of engines ``owners`` together: each one's recorded cap, ``default`` (the
    config's) for an engine that recorded none (a version before this one)."""
    caps = store.settings_with_prefix(SETTING)
    out = 0
    for owner in owners:
        text = caps.get(key(owner))
        try:
            out += max(0, int(text)) if text is not None else default
        except ValueError:  # a garbled row: the config's cap, as for an engine that wrote none
            out += default
    return out


def live_total(store: Store, now: float, stale_s: float, default: int, host: str | None = None) -> int:
    """The slots of the engines live now (on ``host`` only, when given): ``total``; ``default``
    when none is."""
    owners = [e["owner"] for e in store.live_engines(now, stale_s) if host is None or e["host"] == host]
    return total(store, owners, default) if owners else default
