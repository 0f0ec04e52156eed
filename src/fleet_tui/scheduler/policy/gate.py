"""Admission: may this queued task start here, now? (DESIGN section 11.)

Every gate is checked in a fixed order and the first that fails becomes the task's waiting
reason, shown verbatim in the cockpit's queue and by ``fleet-tui plan`` / ``run --until-idle``.
So each reason is a short sentence a person can act on ("slots full: 4/4 running",
"memory: 1.1 GiB free < 2.0 GiB floor + 1.5 GiB per claude agent").

The gate is pure: it takes a snapshot of the world (``GateInputs``: pause flag, running count,
a ``Headroom`` reading, rate limits, host tags, money spent) and returns a ``Decision``. It
reads no files and starts nothing, so the engine can call it on the event loop and the planner
can simulate a whole queue with it.

A machine reading that is unknown (``None``) never counts as plenty: its gate fails with
"<what> reading unknown". Rate-limit utilisation is different: most coders never report it
(Codex and OpenCode print none), so a missing figure means "no known limit", not "blocked".
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from fleet_tui.scheduler.model import Decision, RateLimit, Task
from fleet_tui.scheduler.policy.headroom import GIB, Headroom, MemoryModel, format_gib
from fleet_tui.scheduler.states import TaskStatus

# A "rejected" rate-limit reading without a reset time holds the account this long after it was
# observed; later, one attempt may probe again (its own rejection renews the hold).
REJECTED_HOLD_S = 300.0

GATE_ORDER: tuple[str, ...] = (
    "paused",
    "slots",
    "budget",
    "rate_limit",
    "load",
    "memory",
    "disk",
    "tags",
)


@dataclass(frozen=True)
class GateConfig:
    """The admission limits. Sizes in bytes; ``budget_usd_daily`` None means no budget."""

    max_concurrent: int
    rate_limit_threshold: float = 0.9
    max_load_per_core: float = 2.0
    mem_floor_bytes: int = 2 * GIB
    disk_floor_bytes: int = 1 * GIB
    budget_usd_daily: float | None = None

    def __post_init__(self) -> None:
        if self.max_concurrent < 0:
            raise ValueError("max_concurrent must be >= 0")
        if not 0.0 < self.rate_limit_threshold <= 1.0:
            raise ValueError("rate_limit_threshold must be in (0, 1]")
        if self.max_load_per_core <= 0:
            raise ValueError("max_load_per_core must be > 0")
        if self.mem_floor_bytes < 0 or self.disk_floor_bytes < 0:
            raise ValueError("floors must be >= 0 bytes")
        if self.budget_usd_daily is not None and self.budget_usd_daily < 0:
            raise ValueError("budget_usd_daily must be >= 0")


@dataclass(frozen=True, kw_only=True)
class GateInputs:
    """What the gate looks at: one consistent snapshot, taken by the engine.

    ``rate_limits`` maps an account (the coder's name) to its latest reading and the time until
    which the engine saw it blocked (an attempt ended rate-limited), or None. ``now`` is epoch
    seconds; every time comparison uses it, never the clock.
    """

    paused: bool
    running: int
    headroom: Headroom
    now: float
    rate_limits: Mapping[str, tuple[RateLimit, float | None]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    host_tags: frozenset[str] | tuple[str, ...] = ()
    spent_today: float = 0.0
    #: load this fleet's own agents put on the machine (the engine's running agents), taken off
    #: the load average before the load gate compares it (see ``effective_load``)
    own_load: float = 0.0


def effective_load(hr: Headroom, own_load: float) -> float | None:
    """Load per core with this fleet's own agents taken off: ``max(0, load1 - own) / cores``.

    An agent that runs keeps about one process runnable, so each of this engine's running
    agents counts one unit of the 1-minute load average; what is left is everybody else's. The
    fleet must not hold itself back: without this, agents that keep the load up stop the next
    ones, and several engines on one machine hold each other off for good."""
    if hr.load_per_core is None:
        return None
    if hr.cores <= 0 or own_load <= 0:
        return hr.load_per_core
    return max(0.0, hr.load_per_core - own_load / hr.cores)


def hhmm(ts: float) -> str:
    """Local wall-clock time, e.g. "14:05"."""
    return time.strftime("%H:%M", time.localtime(ts))


def _next_local_midnight(now: float) -> float:
    today = dt.datetime.fromtimestamp(now).date()
    tomorrow = dt.datetime.combine(today + dt.timedelta(days=1), dt.time())
    return tomorrow.timestamp()


def hhmmss(ts: float) -> str:
    """Local wall-clock time with seconds, e.g. "14:05:30"."""
    return time.strftime("%H:%M:%S", time.localtime(ts))


def _ratio(value: float, limit: float) -> str:
    """As many decimals as the limit needs (at least one), one more where the value would print
    equal to its limit: 0.02 against 0.01, 2.05 against 2.0."""
    shown = f"{limit:g}"
    decimals = max(1, len(shown.split(".")[1]) if "." in shown and "e" not in shown else 1)
    text = f"{value:.{decimals}f}"
    return f"{value:.{decimals + 1}f}" if text == f"{limit:.{decimals}f}" else text


def _limit(limit: float) -> str:
    """A configured limit as written: 0.01 stays 0.01, 2 is 2.0."""
    shown = f"{limit:g}"
    return shown if "." in shown or "e" in shown else f"{limit:.1f}"


def _rate_limit_gate(coder: str, cfg: GateConfig, inp: GateInputs) -> Decision | None:
    entry = inp.rate_limits.get(coder)
    if entry is None:
        return None
    rl, blocked_until = entry
    now = inp.now
    until: float | None = blocked_until if blocked_until is not None and blocked_until > now else None
    if rl.status == "rejected":
        if rl.resets_at is not None:
            if rl.resets_at > now:
                until = max(until or 0.0, rl.resets_at)
        elif until is None and now < rl.observed_at + REJECTED_HOLD_S:
            retry = rl.observed_at + REJECTED_HOLD_S
            return Decision(False, f"rate limit {coder} rejected, reset unknown; retry {hhmm(retry)}", retry)
    if until is not None:
        reset = rl.resets_at if rl.resets_at is not None and now < rl.resets_at < until else None
        if reset is not None:  # the account's reset, then the grace fleet-tui leaves after it
            return Decision(False, f"rate limit {coder} resets {hhmm(reset)}, retry {hhmmss(until)}", until)
        return Decision(False, f"rate limit {coder} resets {hhmm(until)}", until)
    util = rl.utilization
    window_over = rl.resets_at is not None and rl.resets_at <= now  # the reading is stale
    if util is not None and not window_over and util >= cfg.rate_limit_threshold:
        return Decision(
            False,
            f"rate limit {coder} at {util * 100:.0f}% >= {cfg.rate_limit_threshold * 100:.0f}%",
            rl.resets_at,
        )
    return None


def decide(
    task: Task, coder: str, cfg: GateConfig, inp: GateInputs, mem: MemoryModel, account: str | None = None
) -> Decision:
    """The first failing gate's reason, or ``Decision(ok=True)``. Order: ``GATE_ORDER``.

    ``coder`` is the task's resolved coder (``resolve_coder``). The gate does not look at the
    task's status, dependencies or backoff: the store's claim and ``plan`` handle those.
    """
    if inp.paused:
        return Decision(False, "fleet paused")
    if inp.running >= cfg.max_concurrent:
        return Decision(False, f"slots full: {inp.running}/{cfg.max_concurrent} running")
    if cfg.budget_usd_daily is not None and inp.spent_today >= cfg.budget_usd_daily:
        return Decision(
            False,
            f"daily budget spent: ${inp.spent_today:.2f} of ${cfg.budget_usd_daily:.2f}",
            _next_local_midnight(inp.now),
        )
    rate = _rate_limit_gate(account or coder, cfg, inp)
    if rate is not None:
        return rate
    hr = inp.headroom
    load = effective_load(hr, inp.own_load)
    if load is None:  # an unknown reading is never plenty, not even for a first agent
        return Decision(False, "load reading unknown")
    # on a busy machine the load gate never stops the first agent: with none of this engine's
    # running, one may start (memory and disk still hold); it holds back the second and later
    if inp.running > 0 and load > cfg.max_load_per_core:
        shown = _ratio(load, cfg.max_load_per_core)
        return Decision(
            False,
            f"load {shown}/core > {_limit(cfg.max_load_per_core)}: one agent at a time until it drops",
        )
    if hr.mem_available is None:
        return Decision(False, "memory reading unknown")
    need = mem.estimate(coder)
    if hr.mem_available - need < cfg.mem_floor_bytes:
        return Decision(
            False,
            f"memory: {format_gib(hr.mem_available)} free < {format_gib(cfg.mem_floor_bytes)} floor"
            f" + {format_gib(need)} per {coder} agent",
        )
    if hr.disk_free is None:
        return Decision(False, "disk reading unknown")
    if hr.disk_free < cfg.disk_floor_bytes:
        return Decision(
            False, f"disk: {format_gib(hr.disk_free)} free < {format_gib(cfg.disk_floor_bytes)} floor"
        )
    missing = [t for t in dict.fromkeys(task.spec.requires) if t not in inp.host_tags]
    if missing:
        return Decision(False, f"needs tags: {', '.join(missing)}")
    return Decision(True)


@functools.lru_cache(maxsize=4096)
def _held(reason: str) -> Decision:
    """One (immutable) decision per hold reason: a long held queue costs no allocations."""
    return Decision(False, reason)


def resolve_coder(task: Task, default_coder: str) -> str:
    """The coder a task runs with: frozen at first claim, else its spec's, else the default."""
    return task.coder or task.spec.coder or default_coder


def claim_order(task: Task) -> tuple[float, float, str]:
    """Sort key matching the store's claim: higher priority first, then older, then id."""
    return (-task.spec.priority, task.created_at, task.id)


def plan(
    tasks: Iterable[Task], cfg: GateConfig, inp: GateInputs, mem: MemoryModel, **kw: Any
) -> list[tuple[Task, Decision]]:
    """Every queued task with its decision: ``decisions`` (and its keywords) taken whole."""
    return list(decisions(tasks, cfg, inp, mem, **kw))


def decisions(
    tasks: Iterable[Task],
    cfg: GateConfig,
    inp: GateInputs,
    mem: MemoryModel,
    *,
    default_coder: str,
    held: Mapping[str, str] | None = None,
    account_of: Callable[[Task, str], str] | None = None,
    note_starting: bool = True,
    ordered: bool = False,
) -> Iterator[tuple[Task, Decision]]:
    """Simulate admission of every queued task in claim order, starting nothing.

    Each admitted task takes a slot and one agent's estimated memory from the simulated
    headroom, so with 4 slots and none running the 5th task reads "slots full: 0/4 running + 4
    starting before it". ``held`` maps task
    ids to a reason the gate does not know (e.g. "after user-schema" for unfinished
    dependencies); such a task, and one whose ``not_before`` is still ahead, is reported with
    that reason and takes nothing. Tasks not in ``queued`` are left out. ``note_starting=False``
    (the engine, which starts the admitted tasks at once) words a slot taken by one of them as
    already running. ``ordered``: ``tasks`` are all queued and already in claim order (the
    planner keeps them so), not sorted again.
    """
    held = held or {}
    state = inp
    # tasks alike (coder, account, tags) get the same decision from the same state: decide
    # once per kind and state, so a long queue of look-alikes costs little
    stage = 0
    seen: dict[tuple[object, ...], Decision] = {}
    # once the fleet is paused or its slots are all taken, every later task that is not held
    # gets the same decision: a long queue behind full slots costs a lookup per task
    full: Decision | None = None
    queue = tasks if ordered else sorted((t for t in tasks if t.status == TaskStatus.QUEUED), key=claim_order)
    for task in queue:
        why = held.get(task.id)
        if why is not None:
            yield task, _held(why)
            continue
        if task.not_before is not None and task.not_before > inp.now:
            coder = resolve_coder(task, default_coder)
            account = account_of(task, coder) if account_of is not None else coder
            rate = _rate_limit_gate(account, cfg, inp)
            if rate is not None:  # held back by its account's limit: say so, not just "waits until"
                yield task, rate
                continue
            nb = task.not_before
            yield task, Decision(False, f"waits until {hhmm(nb)}", nb)
            continue
        if full is not None:
            yield task, full
            continue
        coder = resolve_coder(task, default_coder)
        account = account_of(task, coder) if account_of is not None else coder
        kind = (stage, coder, account, tuple(task.spec.requires))
        decision = seen.get(kind) or decide(task, coder, cfg, state, mem, account)
        seen[kind] = decision
        if (
            note_starting
            and not decision.ok
            and state.running > inp.running
            and (decision.reason or "").startswith("slots full")
        ):
            # the slots are taken by tasks this plan starts first, not by running ones
            first = state.running - inp.running
            decision = Decision(
                False,
                f"slots full: {inp.running}/{cfg.max_concurrent} running + {first} starting before it",
                decision.retry_at,
            )
        yield task, decision
        if not decision.ok and (inp.paused or state.running >= cfg.max_concurrent):
            full = decision  # paused or slots full: ``decide`` says so before anything else
        if decision.ok:
            hr = state.headroom
            if hr.mem_available is not None:
                hr = dataclasses.replace(hr, mem_available=hr.mem_available - mem.estimate(coder))
            state = dataclasses.replace(state, running=state.running + 1, headroom=hr)
            stage += 1
