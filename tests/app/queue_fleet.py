"""Generated fleets for the queue's scale tests, snapshots and benchmark: fixed ids, names, times.

``big_fleet(n, repos)`` spreads ``n`` tasks over ``repos`` repositories (fixed paths that do not
exist, so each ``cwd`` is its own group and the result does not depend on the machine): most
tasks queued behind each other with mixed priorities, 8 running, a few asking or parked, a
hundred-odd finished. ``long_names()`` is a small fleet whose names share long prefixes.
"""

from __future__ import annotations

from fleet_tui.scheduler.model import Question, Snapshot, Task, TaskSpec
from fleet_tui.scheduler.states import TaskStatus as S

from .fake_engine import FakeEngine
from .scenarios import HOST, NOW, base_gauges

REPOS = (
    "api-server", "web-client", "billing", "search", "infra", "docs", "mobile", "auth", "ledger",
    "notifier", "gateway", "analytics", "scheduler", "importer", "exporter", "reports", "admin",
    "cli", "sdk-python", "sdk-go",
)  # fmt: skip
VERBS = ("fix", "add", "refactor", "test", "docs", "migrate", "bump", "lint")
ROOT = "/nonexistent-fleet-tui-test/src"


def make_task(
    i: int, repo: str, status: S, *, priority: int = 0, name: str | None = None, **kw: object
) -> Task:
    name = name or f"{repo}-{VERBS[i % len(VERBS)]}-{i:05d}"
    spec = TaskSpec(name=name, prompt=f"Work item {i}.", cwd=f"{ROOT}/{repo}", priority=priority)
    values: dict[str, object] = dict(created_at=NOW - 100_000 + i, updated_at=NOW - 100_000 + i)
    values.update(kw)
    return Task(id=f"t-{i:05d}", spec=spec, status=status, **values)  # type: ignore[arg-type]


def big_tasks(n: int = 10_000, repos: int = 20) -> list[Task]:
    tasks: list[Task] = []
    for i in range(n):
        repo = REPOS[i % repos]
        if i < 8:  # 8 running sims
            tasks.append(
                make_task(
                    i, repo, S.RUNNING, attempt=1, coder="sim", host="box1", started_at=NOW - 60 * (i + 1),
                    attempt_started_at=NOW - 60 * (i + 1), tokens=1000 * (i + 1), cost_usd=0.01 * (i + 1),
                )
            )  # fmt: skip
        elif i < 11:  # parked: the person must look
            tasks.append(
                make_task(i, repo, S.NEEDS_HUMAN, attempt=3, reason="retries_exhausted", coder="sim")
            )
        elif i < 131:  # finished, newest last
            tasks.append(
                make_task(
                    i, repo, S.DONE, attempt=1, coder="sim", host="box1", started_at=NOW - 5000 + i,
                    finished_at=NOW - 4000 + i * 10, cost_usd=0.05,
                )
            )  # fmt: skip
        else:
            tasks.append(
                make_task(i, repo, S.QUEUED, priority=(i * 7) % 3, waiting="slots full: 8/8 running")
            )
    return tasks


def big_fleet(n: int = 10_000, repos: int = 20, asking: int = 1) -> FakeEngine:
    """``n`` tasks over ``repos`` repositories; the running task ``t-00000`` asks a question."""
    tasks = big_tasks(n, repos)
    questions = tuple(
        Question(f"q-{k}", tasks[k].id, 1, NOW - 30, "Which license header?", ("MIT", "Apache-2.0"))
        for k in range(asking)
    )
    return FakeEngine(
        Snapshot(
            taken_at=NOW,
            tasks=tuple(tasks),
            questions=questions,
            hosts=(HOST,),
            gauges=base_gauges(running=8, max_concurrent=8),
        )
    )


LONG_NAMES = (
    "refactor-payments-api-client-retry-policy",
    "refactor-payments-api-client-timeouts",
    "refactor-payments-webhooks",
    "migrate-user-preferences-to-jsonb",
    "x",
)


def long_names() -> FakeEngine:
    """Names that share a 20-character prefix, a one-letter name, and long coder/model values."""
    tasks = [
        make_task(0, "billing", S.RUNNING, name=LONG_NAMES[0], attempt=1, coder="claude", model="sonnet-4.5",
                  host="build-box-eu-west-1", started_at=NOW - 75, attempt_started_at=NOW - 75, tokens=48_000,
                  cost_usd=0.42, context_tokens=90_000, context_window=200_000),
        make_task(1, "billing", S.QUEUED, name=LONG_NAMES[1], waiting="after " + LONG_NAMES[0]),
        make_task(2, "billing", S.NEEDS_HUMAN, name=LONG_NAMES[2], attempt=2,
                  reason="verify_failed: run: pytest -q tests/webhooks (3 failed, 41 passed)", coder="codex",
                  model="gpt-5-codex"),
        make_task(3, "billing", S.QUEUED, name=LONG_NAMES[3], priority=5),
        make_task(4, "billing", S.DONE, name=LONG_NAMES[4], attempt=1, coder="sim", started_at=NOW - 900,
                  finished_at=NOW - 880),
    ]  # fmt: skip
    return FakeEngine(
        Snapshot(taken_at=NOW, tasks=tuple(tasks), hosts=(HOST,), gauges=base_gauges(running=1))
    )
