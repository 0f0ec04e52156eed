"""Fleets for cockpit tests and screenshots: fixed ids, fixed times, a pinned clock.

Every scenario returns a FakeEngine; ``make_app`` wraps it in a FleetApp whose clock is pinned
to ``NOW`` so elapsed times in screenshots never change.
"""

from __future__ import annotations

from fleet_tui.app.app import FleetApp
from fleet_tui.scheduler.model import (
    Attempt,
    Event,
    Gauges,
    Host,
    HostSeries,
    Question,
    RateLimit,
    Snapshot,
    Transition,
    Usage,
    VerifySpec,
)
from fleet_tui.scheduler.states import TaskStatus as S

from .fake_engine import FakeEngine, task

NOW = 1_764_000_000.0  # 2025-11-24 16:00:00 UTC (tests run with TZ=UTC)
GIB = 1 << 30


def base_gauges(**kw: object) -> Gauges:
    values: dict[str, object] = dict(
        running=0,
        max_concurrent=4,
        load_per_core=0.3,
        mem_available=int(9.8 * GIB),
        mem_floor=2 * GIB,
        disk_free=41 * GIB,
        hosts=1,
    )
    values.update(kw)
    return Gauges(**values)  # type: ignore[arg-type]


HOST = Host(name="box1", heartbeat=NOW, cores=8, load=2.4, mem_available=int(9.8 * GIB), running=3)


def empty() -> FakeEngine:
    return FakeEngine(Snapshot(taken_at=NOW, hosts=(HOST,), gauges=base_gauges()))


def running_tasks() -> list:
    return [
        task(
            id="t-0001",
            name="user-schema",
            status=S.DONE,
            attempt=1,
            coder="claude",
            model="sonnet",
            host="box1",
            started_at=NOW - 600,
            finished_at=NOW - 528,
            tokens=31_000,
            cost_usd=0.31,
            context_tokens=40_000,
            context_window=200_000,
            updated_at=NOW - 528,
        ),
        task(
            id="t-0002",
            name="user-api",
            status=S.RUNNING,
            attempt=2,
            coder="claude",
            model="sonnet",
            host="box1",
            started_at=NOW - 300,
            attempt_started_at=NOW - 40,
            tokens=12_400,
            cost_usd=0.12,
            context_tokens=88_000,
            context_window=200_000,
            updated_at=NOW - 2,
            workdir="/tmp",
            depends_on=("user-schema",),
            verify=(VerifySpec(kind="run", run="pytest -q"),),
        ),
        task(
            id="t-0003",
            name="docs-pass",
            status=S.RUNNING,
            attempt=1,
            coder="codex",
            model="gpt-5",
            host="box1",
            started_at=NOW - 95,
            attempt_started_at=NOW - 95,
            tokens=5_100,
            updated_at=NOW - 5,
        ),
        task(
            id="t-0004",
            name="search",
            status=S.QUEUED,
            waiting="after user-api",
            coder=None,
            depends_on=("user-api",),
            created_at=NOW - 700,
            updated_at=NOW - 700,
        ),
        task(
            id="t-0005",
            name="lint-fixes",
            status=S.VERIFYING,
            attempt=1,
            coder="opencode",
            host="box1",
            started_at=NOW - 200,
            attempt_started_at=NOW - 200,
            tokens=2_300,
            cost_usd=0.0,
            updated_at=NOW - 1,
        ),
    ]


def several_running() -> FakeEngine:
    engine = FakeEngine(
        Snapshot(
            taken_at=NOW,
            tasks=tuple(running_tasks()),
            hosts=(HOST,),
            gauges=base_gauges(
                running=3,
                rate_limits=(RateLimit("claude", "allowed", 0.42, NOW + 3900, "five_hour", NOW),),
            ),
        )
    )
    engine.events_by_task["t-0002"] = stream_events("t-0002")
    return engine


def stream_events(task_id: str) -> list[Event]:
    t = NOW - 40
    return [
        Event(task_id, 2, 0, t, "session_started", text="session 5f1c (claude sonnet)"),
        Event(task_id, 2, 1, t + 2, "thinking", text="The schema exists; next the endpoint and tests."),
        Event(task_id, 2, 2, t + 5, "tool_call", tool="Bash", tool_input={"command": "pytest -q"}),
        Event(task_id, 2, 3, t + 9, "tool_result", text="3 passed in 0.41s"),
        Event(
            task_id,
            2,
            4,
            t + 10,
            "usage",
            usage=Usage(9000, 3400),
            context_tokens=88_000,
            context_window=200_000,
        ),
        Event(task_id, 2, 5, t + 12, "text", text="Now adding the endpoint " + "and its validation " * 12),
        Event(task_id, 2, 6, t + 20, "tool_call", tool="Edit", tool_input={"file_path": "api/users.py"}),
        Event(task_id, 2, 7, t + 25, "stderr", text="warning: deprecated config key 'foo'"),
        Event(task_id, 2, 8, t + 30, "error", text="API error 529 overloaded", is_error=True),
        Event(task_id, 2, 9, t + 31, "api_retry", text="retrying in 2s (attempt 1/10)"),
    ]


QUESTION = Question(
    id="q-0001",
    task_id="t-0003",
    attempt=1,
    asked_at=NOW - 30,
    text="Which license header should new files carry?",
    options=("MIT", "Apache-2.0", "none"),
)


def with_question() -> FakeEngine:
    engine = several_running()
    snap = engine.snapshot()
    tasks = tuple(t if t.id != "t-0003" else _asking(t) for t in snap.tasks)
    engine.set_snapshot(
        Snapshot(taken_at=NOW, tasks=tasks, questions=(QUESTION,), hosts=snap.hosts, gauges=snap.gauges)
    )
    return engine


def _asking(t):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    return replace(t, asking=True)


def rate_limited() -> FakeEngine:
    reset = NOW + 1800
    tasks = [
        task(
            id="t-0101",
            name="refactor-db",
            status=S.QUEUED,
            coder="claude",
            model="opus",
            waiting="rate limit resets 16:30",
            not_before=reset,
            attempt=1,
            started_at=NOW - 900,
            tokens=80_000,
            cost_usd=2.10,
            updated_at=NOW - 60,
        ),
        task(
            id="t-0102",
            name="add-tests",
            status=S.QUEUED,
            coder="claude",
            waiting="rate limit resets 16:30",
            updated_at=NOW - 60,
        ),
        task(
            id="t-0103",
            name="port-cli",
            status=S.RUNNING,
            coder="codex",
            attempt=1,
            host="box1",
            started_at=NOW - 120,
            attempt_started_at=NOW - 120,
            tokens=3_000,
            updated_at=NOW - 3,
        ),
    ]
    return FakeEngine(
        Snapshot(
            taken_at=NOW,
            tasks=tuple(tasks),
            hosts=(HOST,),
            gauges=base_gauges(
                running=1,
                rate_limits=(
                    RateLimit("claude", "rejected", 1.0, reset, "five_hour", NOW - 60),
                    RateLimit("gemini", "allowed", 0.12, NOW + 86000, "daily", NOW - 60),
                ),
            ),
        )
    )


def parked() -> FakeEngine:
    tasks = [
        task(
            id="t-0201",
            name="payments",
            status=S.NEEDS_HUMAN,
            reason="verify_failed: run: pytest -q",
            attempt=3,
            retries_used=2,
            coder="claude",
            model="sonnet",
            host="box1",
            started_at=NOW - 3000,
            finished_at=NOW - 400,
            tokens=150_000,
            cost_usd=1.84,
            updated_at=NOW - 400,
        ),
        task(
            id="t-0202",
            name="invoices",
            status=S.NEEDS_HUMAN,
            reason="dependency_failed:payments",
            depends_on=("payments",),
            updated_at=NOW - 400,
        ),
        task(
            id="t-0203",
            name="emails",
            status=S.PAUSED,
            reason="by user",
            paused_running=True,
            attempt=1,
            coder="gemini",
            host="box1",
            started_at=NOW - 500,
            updated_at=NOW - 100,
            tokens=7_000,
        ),
        task(
            id="t-0204", name="cleanup", status=S.CANCELLED, reason="cancelled by user", updated_at=NOW - 50
        ),
    ]
    engine = FakeEngine(Snapshot(taken_at=NOW, tasks=tuple(tasks), hosts=(HOST,), gauges=base_gauges()))
    engine.attempts_by_task["t-0201"] = [
        Attempt(
            "t-0201",
            n,
            "box1:1234",
            f"/tmp/a{n}",
            NOW - 3000 + 800 * (n - 1),
            ended_at=NOW - 2300 + 800 * (n - 1),
            exit_code=0,
            outcome="verify_failed",
            detail="verifier run: pytest -q failed",
            verify_output=f"FAILED tests/test_pay.py::test_refund - assert 0 == {n}\n1 failed, 12 passed",
        )
        for n in (1, 2, 3)
    ]
    engine.transitions_by_task["t-0201"] = [
        Transition("t-0201", NOW - 3000, "queued", "running", None, 1, "box1"),
        Transition("t-0201", NOW - 2300, "running", "verifying", None, 1, "box1"),
        Transition("t-0201", NOW - 2290, "verifying", "queued", "verify_failed: run: pytest -q", 1, "box1"),
        Transition(
            "t-0201", NOW - 400, "verifying", "needs_human", "verify_failed: run: pytest -q", 3, "box1"
        ),
    ]
    engine.diffs["t-0201"] = "\n".join(
        [
            " api/pay.py        | 12 ++++++++----",
            " tests/test_pay.py |  4 ++++",
            " 2 files changed, 12 insertions(+), 4 deletions(-)",
            "diff --git a/api/pay.py b/api/pay.py",
            "--- a/api/pay.py",
            "+++ b/api/pay.py",
            "@@ -1,4 +1,8 @@",
            "-def refund(x):",
            "+def refund(x: int) -> int:",
            "+    if x < 0:",
            "+        raise ValueError(x)",
            "     return x",
        ]
    )
    engine.events_by_task["t-0201"] = [
        Event("t-0201", 3, i, NOW - 900 + i, kind, text=text)
        for i, (kind, text) in enumerate(
            [
                ("text", "Fixing the refund path"),
                ("tool_call", None),
                ("tool_result", "1 failed"),
                ("verify", "run: pytest -q -> exit 1"),
                ("result", "I fixed the refund bug."),
            ]
        )
    ]
    return engine


def make_app(engine: FakeEngine, **kw: object) -> FleetApp:
    return FleetApp(engine, title="fleet-tui", clock=lambda: NOW, **kw)  # type: ignore[arg-type]


#: agent/verifier/git text that tries to drive the terminal: an OSC 52 clipboard write, an OSC 0
#: title, a screen clear, an OSC 8 hyperlink, 8-bit C1 CSI/OSC, a bidi override and markup
HOSTILE = (
    "pwn\x1b]52;c;aGFja2Vk\x07 title\x1b]0;owned\x07 clear\x1b[2J "
    "\x1b]8;;http://evil.example/\x1b\\link\x1b]8;;\x1b\\ c1\x9b31m osc\x9d0;t\x9c "
    "bidi\u202eevil\u202c [b]mk[/b]"
)
#: what must never reach the screen
RAW_CONTROLS = ("\x1b", "\x07", "\x9b", "\x9c", "\x9d", "\u202e", "\u202c")


def hostile() -> FakeEngine:
    """Every widget fed hostile text: the task's prompt and reason, its events, a question with
    options, attempts with verifier output, transitions, a diff, an account and a host name."""
    t = task(
        id="t-0666",
        name="evil",
        prompt="prompt " + HOSTILE,
        status=S.NEEDS_HUMAN,
        reason="agent_blocked: " + HOSTILE,
        attempt=1,
        coder="shell",
        host="box1",
        started_at=NOW - 100,
        finished_at=NOW - 10,
        updated_at=NOW - 10,
        result_text="result " + HOSTILE,
    )
    question = Question("q-0666", "t-0666", 1, NOW - 5, "ask " + HOSTILE, options=("opt " + HOSTILE, "no"))
    host = Host(name="box\x1b]0;hostname\x07", heartbeat=NOW, cores=2, load=0.5, mem_available=GIB)
    engine = FakeEngine(
        Snapshot(
            taken_at=NOW,
            tasks=(t,),
            questions=(question,),
            hosts=(host,),
            gauges=base_gauges(
                rate_limits=(RateLimit("acct\x1b]52;c;eA==\x07", "allowed", 0.5, NOW + 60, "w\x1b[2J", NOW),)
            ),
        )
    )
    engine.events_by_task["t-0666"] = [
        Event("t-0666", 1, 0, NOW - 50, "text", text="text " + HOSTILE),
        Event("t-0666", 1, 1, NOW - 49, "tool_call", tool="Bash\x1b[2J", tool_input={"command": HOSTILE}),
        Event("t-0666", 1, 2, NOW - 48, "stderr", text="stderr " + HOSTILE),
        Event("t-0666", 1, 3, NOW - 47, "error", text="error " + HOSTILE, is_error=True),
    ]
    engine.attempts_by_task["t-0666"] = [
        Attempt(
            "t-0666", 1, "box1:1", "/tmp/a1", NOW - 100, ended_at=NOW - 10, exit_code=1,
            outcome="verify_failed", detail="detail " + HOSTILE, verify_output="verifier " + HOSTILE,
        )
    ]  # fmt: skip
    engine.transitions_by_task["t-0666"] = [
        Transition("t-0666", NOW - 10, "running", "needs_human", "reason " + HOSTILE, 1, "box1\x1b]0;x\x07")
    ]
    engine.diffs["t-0666"] = (
        f" evil{HOSTILE}.py | 1 +\n diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old\n+new {HOSTILE}"
    )
    return engine


def pulse_history(host: str, scale: float, n: int = 120) -> HostSeries:
    """A deterministic hour of 30 s buckets ending at ``NOW``: a ramp with a lull."""
    first = int(NOW // 30) - n + 1
    running = tuple(min(4, (i // 12) % 5) if i % 40 >= 6 else 0 for i in range(n))
    events = tuple(int(scale * (20 + 15 * ((i * 7) % 11))) * (1 if r else 0) for i, r in enumerate(running))
    tokens = tuple(e * 90 for e in events)
    cost = tuple(round(t * 0.000004, 4) for t in tokens)
    return HostSeries(host, 30.0, first * 30.0, running, events, tokens, cost)


def gauges_fleet(budget: float | None = 5.0) -> FakeEngine:
    """Gauges in every state: slots near (3/4), load over its gate (held), memory near its floor,
    disk ok; claude held until a reset, codex near its threshold, gemini ok; two hosts with an
    hour of history; today's spend against a budget."""
    engine = several_running()
    snap = engine.snapshot()
    hosts = (
        HOST,
        Host(name="box2", heartbeat=NOW - 2, cores=4, load=0.4, mem_available=6 * GIB, running=1),
    )
    g = base_gauges(
        running=3,
        max_concurrent=4,
        load_per_core=2.4,
        max_load_per_core=2.0,
        mem_available=int(4.5 * GIB),
        mem_floor=2 * GIB,
        agent_mem=int(1.5 * GIB),
        agent_mem_measured=True,
        disk_free=41 * GIB,
        disk_floor=1 * GIB,
        hosts=2,
        budget_usd=budget,
        budget_spent_usd=3.2,
        rate_limits=(
            RateLimit("claude", "rejected", 1.0, NOW + 1830, "five_hour", NOW - 60),
            RateLimit("codex", "allowed_warning", 0.81, NOW + 3 * 3600 + 300, "weekly", NOW - 30),
            RateLimit("gemini", "allowed", 0.12, NOW + 86000, "daily", NOW - 60),
        ),
        rate_holds=(("claude", NOW + 1830),),
    )
    engine.set_snapshot(
        Snapshot(
            taken_at=NOW,
            tasks=snap.tasks,
            hosts=hosts,
            gauges=g,
            series=(pulse_history("box1", 1.0), pulse_history("box2", 0.4)),
        )
    )
    return engine
