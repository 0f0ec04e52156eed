"""The detail screen shows a task's pull request (merge = "pr") when the engine knows one."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from textual.widgets import Static

from fleet_tui.screens.detail import DetailScreen

from . import scenarios as sc
from .fake_engine import FakeEngine
from .helpers import wait_for

pytestmark = pytest.mark.anyio
LINE = "PR #7 open, checks failing, changes requested · https://github.example/acme/widgets/pull/7"


class PullRequestEngine(FakeEngine):
    async def pull_request(self, ref: str) -> str | None:
        return LINE


def rendered(widget: Static) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(widget.content)
    return console.export_text()


async def test_detail_shows_the_pull_request() -> None:
    base = sc.parked()
    engine = PullRequestEngine(base.snapshot())
    engine.__dict__.update({k: v for k, v in base.__dict__.items() if k.endswith("_by_task") or k == "diffs"})
    app = sc.make_app(engine)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen), "detail")
        screen = app.screen
        assert isinstance(screen, DetailScreen)
        await wait_for(pilot, lambda: LINE in rendered(screen.query_one("#overview", Static)), "the PR row")
        assert "pull req" in rendered(screen.query_one("#overview", Static))


def test_queue_state_of_a_pull_request_task() -> None:
    from fleet_tui.app import format as fmt
    from fleet_tui.scheduler.model import Task, TaskSpec
    from fleet_tui.scheduler.states import TaskStatus as S

    spec = TaskSpec(name="a", prompt="p", merge="pr")
    opened = Task(id="a", spec=spec, status=S.DONE, reason="pull request #7 opened: https://x/pull/7")
    assert fmt.state_text(opened) == "done: pull request #7 opened"
    merged = Task(id="a", spec=spec, status=S.DONE, reason="merged feedfaceca via pull request #7")
    assert fmt.state_text(merged) == "done: merged feedfaceca via pull request #7"
    assert fmt.state_text(Task(id="b", spec=spec, status=S.DONE, reason="merged abc")) == "done"
