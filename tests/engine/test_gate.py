"""Admission gate: every reason's text, the order of the gates, fail-closed readings, plan."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

import pytest

from fleet_tui.scheduler.model import Decision, RateLimit, Task, TaskSpec
from fleet_tui.scheduler.policy.gate import (
    GATE_ORDER,
    REJECTED_HOLD_S,
    GateConfig,
    GateInputs,
    claim_order,
    decide,
    hhmmss,
    plan,
    resolve_coder,
)
from fleet_tui.scheduler.policy.headroom import GIB, Headroom, MemoryModel
from fleet_tui.scheduler.states import TaskStatus

pytestmark = pytest.mark.timeout(30)

NOW = 1_800_000_000.0
CFG = GateConfig(max_concurrent=4)  # 90%, 2.0/core, 2 GiB memory floor, 1 GiB disk floor


def hhmm(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%H:%M")


def task(
    name: str = "t",
    *,
    priority: int = 0,
    requires: tuple[str, ...] = (),
    coder: str | None = None,
    status: TaskStatus = TaskStatus.QUEUED,
    created_at: float = 0.0,
    not_before: float | None = None,
) -> Task:
    spec = TaskSpec(name=name, prompt="p", priority=priority, requires=requires, coder=coder)
    return Task(
        id=f"id-{name}",
        spec=spec,
        status=status,
        created_at=created_at,
        not_before=not_before,
    )


def headroom(**kw: Any) -> Headroom:
    base: dict[str, Any] = dict(
        cores=8, load_per_core=0.5, mem_available=16 * GIB, disk_free=100 * GIB, taken_at=NOW
    )
    base.update(kw)
    return Headroom(**base)


def inputs(**kw: Any) -> GateInputs:
    hr_kw = {k: kw.pop(k) for k in ("load_per_core", "mem_available", "disk_free") if k in kw}
    base: dict[str, Any] = dict(paused=False, running=0, headroom=headroom(**hr_kw), now=NOW)
    base.update(kw)
    return GateInputs(**base)


def rl(
    util: float | None = None,
    status: str = "allowed",
    resets_at: float | None = None,
    observed_at: float = NOW - 10,
) -> RateLimit:
    return RateLimit(
        account="claude",
        status=status,
        utilization=util,
        resets_at=resets_at,
        observed_at=observed_at,
    )


def limits(entry: tuple[RateLimit, float | None]) -> Mapping[str, tuple[RateLimit, float | None]]:
    return {"claude": entry}


def reason(t: Task | None = None, coder: str = "claude", cfg: GateConfig = CFG, **kw: Any) -> str | None:
    return decide(t or task(), coder, cfg, inputs(**kw), MemoryModel()).reason


# --------------------------------------------------------------------------- each gate


def test_all_clear_admits() -> None:
    assert decide(task(), "claude", CFG, inputs(), MemoryModel()) == Decision(True)


def test_fleet_paused() -> None:
    assert reason(paused=True) == "fleet paused"


def test_slots_full() -> None:
    assert reason(running=4) == "slots full: 4/4 running"
    assert reason(running=3) is None
    assert reason(cfg=GateConfig(max_concurrent=0)) == "slots full: 0/0 running"


def test_daily_budget() -> None:
    cfg = GateConfig(max_concurrent=4, budget_usd_daily=10.0)
    d = decide(task(), "claude", cfg, inputs(spent_today=12.4), MemoryModel())
    assert d.reason == "daily budget spent: $12.40 of $10.00"
    assert d.retry_at is not None and NOW < d.retry_at <= NOW + 86400 + 3600
    assert dt.datetime.fromtimestamp(d.retry_at).strftime("%H:%M") == "00:00"
    assert reason(cfg=cfg, spent_today=9.99) is None
    assert reason(spent_today=1e6) is None  # no budget configured


def test_rate_limit_blocked_until() -> None:
    until = NOW + 1800
    d = decide(task(), "claude", CFG, inputs(rate_limits=limits((rl(0.1), until))), MemoryModel())
    assert d == Decision(False, f"rate limit claude resets {hhmm(until)}", until)
    # a block that has passed does not hold
    assert reason(rate_limits=limits((rl(0.1), NOW - 1))) is None


def test_rate_limit_utilisation() -> None:
    reset = NOW + 3600
    d = decide(
        task(), "claude", CFG, inputs(rate_limits=limits((rl(0.93, resets_at=reset), None))), MemoryModel()
    )
    assert d == Decision(False, "rate limit claude at 93% >= 90%", reset)
    assert reason(rate_limits=limits((rl(0.90), None))) == "rate limit claude at 90% >= 90%"
    assert reason(rate_limits=limits((rl(0.89), None))) is None
    cfg = GateConfig(max_concurrent=4, rate_limit_threshold=0.5)
    assert reason(cfg=cfg, rate_limits=limits((rl(0.6), None))) == "rate limit claude at 60% >= 50%"


def test_rate_limit_reading_of_an_ended_window_is_stale() -> None:
    assert reason(rate_limits=limits((rl(0.99, resets_at=NOW - 60), None))) is None


def test_rate_limit_unknown_utilisation_does_not_block() -> None:
    # Codex/OpenCode never report utilisation: no figure is not a block.
    assert reason(rate_limits=limits((rl(None), None))) is None
    assert reason(rate_limits={}) is None


def test_rate_limit_of_another_account_does_not_apply() -> None:
    assert reason(coder="codex", rate_limits=limits((rl(0.99), NOW + 600))) is None


def test_rate_limit_rejected_status() -> None:
    reset = NOW + 900
    d = decide(
        task(),
        "claude",
        CFG,
        inputs(rate_limits=limits((rl(status="rejected", resets_at=reset), None))),
        MemoryModel(),
    )
    assert d == Decision(False, f"rate limit claude resets {hhmm(reset)}", reset)
    # the later of the engine's block and the reading's reset wins
    later = NOW + 2000
    got = decide(
        task(),
        "claude",
        CFG,
        inputs(rate_limits=limits((rl(status="rejected", resets_at=reset), later))),
        MemoryModel(),
    )
    assert got.retry_at == later
    # rejected, reset unknown: held for a while after it was seen, then probed again
    seen = NOW - 10
    d = decide(
        task(),
        "claude",
        CFG,
        inputs(rate_limits=limits((rl(status="rejected", observed_at=seen), None))),
        MemoryModel(),
    )
    retry = seen + REJECTED_HOLD_S
    assert d == Decision(False, f"rate limit claude rejected, reset unknown; retry {hhmm(retry)}", retry)
    old = NOW - REJECTED_HOLD_S - 1
    assert reason(rate_limits=limits((rl(status="rejected", observed_at=old), None))) is None


HOLDS = ": one agent at a time until it drops"


def test_load_per_core() -> None:
    # with one agent of this engine running, the load gate holds back the next
    assert reason(load_per_core=2.4, running=1) == "load 2.4/core > 2.0" + HOLDS
    assert reason(load_per_core=2.04, running=1) == "load 2.04/core > 2.0" + HOLDS  # never "2.0 > 2.0"
    assert reason(load_per_core=2.0, running=1) is None
    cfg = GateConfig(max_concurrent=4, max_load_per_core=1.0)
    assert reason(cfg=cfg, load_per_core=1.5, running=1) == "load 1.5/core > 1.0" + HOLDS


def test_memory_floor_plus_one_agent() -> None:
    assert (
        reason(mem_available=int(1.1 * GIB))
        == "memory: 1.1 GiB free < 2.0 GiB floor + 1.5 GiB per claude agent"
    )
    # exactly floor + one agent is enough
    assert reason(mem_available=int(3.5 * GIB)) is None
    assert reason(mem_available=int(3.5 * GIB) - 1) is not None
    # a small agent fits where a big one does not
    assert reason(coder="sim", mem_available=int(2.2 * GIB)) is None


def test_memory_uses_learned_estimate() -> None:
    mem = MemoryModel()
    for _ in range(3):
        mem.record("claude", 4 * GIB)
    d = decide(task(), "claude", CFG, inputs(mem_available=5 * GIB), mem)
    assert d.reason == "memory: 5.0 GiB free < 2.0 GiB floor + 4.0 GiB per claude agent"


def test_disk_floor() -> None:
    assert reason(disk_free=int(0.8 * GIB)) == "disk: 0.8 GiB free < 1.0 GiB floor"
    assert reason(disk_free=1 * GIB) is None


def test_host_tags() -> None:
    assert reason(task(requires=("docker",))) == "needs tags: docker"
    assert reason(task(requires=("docker", "gpu", "docker")), host_tags=("gpu",)) == "needs tags: docker"
    assert reason(task(requires=("docker", "gpu"))) == "needs tags: docker, gpu"
    assert reason(task(requires=("docker",)), host_tags=frozenset({"docker", "x"})) is None


# --------------------------------------------------------------------------- unknown readings


@pytest.mark.parametrize(
    ("field", "text"),
    [
        ("load_per_core", "load reading unknown"),
        ("mem_available", "memory reading unknown"),
        ("disk_free", "disk reading unknown"),
    ],
)
def test_unknown_reading_fails_closed(field: str, text: str) -> None:
    d = decide(task(), "sim", CFG, inputs(**{field: None}), MemoryModel())
    assert d == Decision(False, text)


# --------------------------------------------------------------------------- order

FAILING: dict[str, dict[str, Any]] = {
    "paused": {"paused": True},
    "slots": {"running": 4},
    "budget": {"spent_today": 50.0},
    "rate_limit": {"rate_limits": limits((rl(0.95), None))},
    "load": {"load_per_core": 9.0},
    "memory": {"mem_available": 1 * GIB},
    "disk": {"disk_free": 1},
    "tags": {},  # the task requires a tag the host lacks
}
PREFIX = {
    "paused": "fleet paused",
    "slots": "slots full",
    "budget": "daily budget spent",
    "rate_limit": "rate limit claude",
    "load": "load 9.0/core",
    "memory": "memory: 1.0 GiB free",
    "disk": "disk: 0.0 GiB free",
    "tags": "needs tags: docker",
}


def test_gates_are_checked_in_order() -> None:
    assert tuple(FAILING) == GATE_ORDER
    cfg = GateConfig(max_concurrent=4, budget_usd_daily=10.0)
    t = task(requires=("docker",))
    for i, gate in enumerate(GATE_ORDER):
        kw: dict[str, Any] = {}
        for later in GATE_ORDER[i:]:  # this gate and every later one fail
            kw.update(FAILING[later])
        kw.setdefault("running", 1)  # the load gate holds back a second agent, never the first
        d = decide(t, "claude", cfg, inputs(**kw), MemoryModel())
        assert not d.ok
        assert d.reason is not None and d.reason.startswith(PREFIX[gate]), (gate, d.reason)
    assert decide(t, "claude", cfg, inputs(host_tags=("docker",)), MemoryModel()).ok


def test_unknown_readings_keep_their_place_in_the_order() -> None:
    d = decide(task(), "claude", CFG, inputs(running=4, mem_available=None), MemoryModel())
    assert d.reason == "slots full: 4/4 running"
    d = decide(task(), "claude", CFG, inputs(load_per_core=None, mem_available=None), MemoryModel())
    assert d.reason == "load reading unknown"


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "kw",
    [
        {"max_concurrent": -1},
        {"max_concurrent": 1, "rate_limit_threshold": 0.0},
        {"max_concurrent": 1, "rate_limit_threshold": 1.5},
        {"max_concurrent": 1, "max_load_per_core": 0},
        {"max_concurrent": 1, "mem_floor_bytes": -1},
        {"max_concurrent": 1, "budget_usd_daily": -1.0},
    ],
)
def test_config_rejects_nonsense(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        GateConfig(**kw)


def test_inputs_and_config_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        CFG.max_concurrent = 9  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs().running = 9  # type: ignore[misc]


# --------------------------------------------------------------------------- plan


def test_plan_counts_slots_in_priority_order() -> None:
    tasks = [task(f"t{i}", priority=i, created_at=float(i)) for i in range(6)]
    got = plan(tasks, CFG, inputs(running=1), MemoryModel(), default_coder="sim")
    names = [t.name for t, _ in got]
    assert names == ["t5", "t4", "t3", "t2", "t1", "t0"]
    oks = [d.ok for _, d in got]
    assert oks == [True, True, True, False, False, False]
    assert got[3][1].reason == "slots full: 1/4 running + 3 starting before it"
    assert got[5][1].reason == "slots full: 1/4 running + 3 starting before it"


def test_plan_fifth_task_at_cap_four() -> None:
    tasks = [task(f"t{i}", created_at=float(i)) for i in range(5)]
    got = plan(tasks, CFG, inputs(), MemoryModel(), default_coder="sim")
    assert [t.name for t, _ in got] == ["t0", "t1", "t2", "t3", "t4"]  # same priority: oldest first
    assert [d.reason for _, d in got] == [None] * 4 + ["slots full: 0/4 running + 4 starting before it"]


def test_plan_takes_memory_per_admitted_agent() -> None:
    # 5.5 GiB free, 2 GiB floor, 1.5 GiB per claude agent: two fit, the third does not.
    tasks = [task(f"t{i}", created_at=float(i)) for i in range(3)]
    got = plan(tasks, CFG, inputs(mem_available=int(5.5 * GIB)), MemoryModel(), default_coder="claude")
    assert [d.ok for _, d in got] == [True, True, False]
    assert got[2][1].reason == "memory: 2.5 GiB free < 2.0 GiB floor + 1.5 GiB per claude agent"


def test_plan_failed_task_does_not_take_a_slot() -> None:
    tasks = [
        task("needs-docker", priority=9, requires=("docker",)),
        task("a", priority=5),
        task("b", priority=4),
    ]
    cfg = GateConfig(max_concurrent=1)
    got = plan(tasks, cfg, inputs(), MemoryModel(), default_coder="sim")
    assert [(t.name, d.reason) for t, d in got] == [
        ("needs-docker", "needs tags: docker"),
        ("a", None),
        ("b", "slots full: 0/1 running + 1 starting before it"),
    ]


def test_small_words_limits_and_resets() -> None:
    """Point 15: a limit of 0.01 prints as written, and a rate-limit label shows the grace after
    the account's reset (the task starts at the retry time, not at the reset)."""
    cfg = GateConfig(max_concurrent=4, max_load_per_core=0.01)
    assert reason(cfg=cfg, load_per_core=0.5, running=1) == "load 0.50/core > 0.01" + HOLDS
    assert reason(cfg=cfg, load_per_core=0.011, running=1) == "load 0.011/core > 0.01" + HOLDS
    now = inputs().now
    rejected = RateLimit(account="claude", status="rejected", resets_at=now + 600, observed_at=now)
    d = decide(task(), "claude", CFG, inputs(rate_limits=limits((rejected, now + 630))), MemoryModel())
    assert d.reason == f"rate limit claude resets {hhmm(now + 600)}, retry {hhmmss(now + 630)}"


def test_plan_skips_non_queued_and_honours_held_and_backoff() -> None:
    later = NOW + 600
    tasks = [
        task("run", status=TaskStatus.RUNNING),
        task("done", status=TaskStatus.DONE),
        task("paused", status=TaskStatus.PAUSED),
        task("dep", priority=3),
        task("backoff", priority=2, not_before=later),
        task("go", priority=1),
    ]
    cfg = GateConfig(max_concurrent=1)
    got = plan(tasks, cfg, inputs(), MemoryModel(), default_coder="sim", held={"id-dep": "after user-schema"})
    assert [(t.name, d) for t, d in got] == [
        ("dep", Decision(False, "after user-schema")),
        ("backoff", Decision(False, f"waits until {hhmm(later)}", later)),
        ("go", Decision(True)),
    ]


def test_plan_uses_each_tasks_coder() -> None:
    tasks = [task("c", coder="claude", priority=2), task("s", priority=1)]
    # 3.0 GiB free: a claude agent (1.5) would leave less than the 2 GiB floor; sim (0.1) fits
    got = plan(tasks, CFG, inputs(mem_available=3 * GIB), MemoryModel(), default_coder="sim")
    assert [(t.name, d.ok) for t, d in got] == [("c", False), ("s", True)]


def test_plan_with_fleet_paused_admits_nothing() -> None:
    got = plan([task("a"), task("b")], CFG, inputs(paused=True), MemoryModel(), default_coder="sim")
    assert {d.reason for _, d in got} == {"fleet paused"}


def test_a_long_queue_behind_full_slots_is_decided_without_looking_at_each_task() -> None:
    """Once the slots are taken every later task reads the same; held and timed tasks keep
    their own reason. Counted: the account (the per-task work) is asked for 5 of 2000 tasks."""
    asked: list[str] = []

    def account(t: Task, coder: str) -> str:
        asked.append(t.id)
        return coder

    tasks = [task(f"q{i:04d}", created_at=float(i)) for i in range(2000)]
    tasks[1500] = task("held", created_at=1500.0)
    tasks[1600] = task("later", created_at=1600.0, not_before=NOW + 3600)
    got = plan(
        tasks, CFG, inputs(running=1), MemoryModel(), default_coder="sim", account_of=account,
        held={"id-held": "after user-schema"},
    )  # fmt: skip
    assert [d.ok for _, d in got[:3]] == [True, True, True]
    rest = {d.reason for t, d in got[3:] if t.id not in ("id-held", "id-later")}
    assert rest == {"slots full: 1/4 running + 3 starting before it"}
    by_id = {t.id: d.reason for t, d in got}
    assert by_id["id-held"] == "after user-schema"
    assert by_id["id-later"] == f"waits until {hhmm(NOW + 3600)}"
    assert len(asked) == 5  # three admitted, the first one held back by the slots, the timed one


def test_resolve_coder_and_claim_order() -> None:
    frozen = dataclasses.replace(task(coder="codex"), coder="claude")
    assert resolve_coder(frozen, "sim") == "claude"
    assert resolve_coder(task(coder="codex"), "sim") == "codex"
    assert resolve_coder(task(), "sim") == "sim"
    a, b = task("a", priority=1, created_at=5.0), task("b", priority=1, created_at=1.0)
    assert sorted([a, b], key=claim_order) == [b, a]
