"""The sim coder: the built-in simulated agent launched like any coder, read by the Claude normalizer.

The argv/env/stdin tests need nothing else. The end-to-end tests run the agent exactly as the
coder describes it (argv, env merged, prompt on stdin, cwd = workdir) and feed its stdout to the
coder's normalizer, so they also check that the sim's stream means to the Claude normalizer what
the directives say (success, failure, rate limit, false completion, context, cost).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fleet_tui.coders.base import AttemptContext, get_coder
from fleet_tui.coders.sim import SimCoder
from fleet_tui.scheduler.model import Event, Outcome, Task, TaskSpec
from fleet_tui.scheduler.states import TaskStatus

pytestmark = pytest.mark.timeout(60)


def ctx_for(tmp_path: Path, prompt: str, attempt: int = 1, **kw: Any) -> AttemptContext:
    task = Task(
        id="t-sim",
        spec=TaskSpec(name="sim-task", prompt=prompt, coder="sim"),
        status=TaskStatus.RUNNING,
        attempt=attempt,
    )
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return AttemptContext(
        task=task,
        attempt=attempt,
        prompt=prompt,
        workdir=work,
        attempt_dir=tmp_path / "attempts" / str(attempt),
        home=tmp_path,
        **kw,
    )


def test_registered_and_built_in() -> None:
    coder = get_coder("sim")
    assert isinstance(coder, SimCoder) and coder.name == "sim" and coder.program is None
    assert coder.available()[0] is True and coder.version()


def test_argv_stdin_env(tmp_path: Path) -> None:
    coder = SimCoder()
    ctx = ctx_for(tmp_path, "@sim steps=1", attempt=3)
    assert coder.argv(ctx) == [sys.executable, "-m", "fleet_tui.coders.sim_agent"]
    assert coder.stdin(ctx) == b"@sim steps=1"
    env = coder.env(ctx)
    assert env["FLEET_ATTEMPT"] == "3" and "FLEET_MCP_COMMAND" not in env
    ctx2 = ctx_for(
        tmp_path,
        "x",
        mcp_command=("fleet-tui", "mcp-ask-human"),
        mcp_env={"FLEET_HOME": "/h", "FLEET_TASK_ID": "t-sim"},
        model="opus",
    )
    env2 = coder.env(ctx2)
    assert json.loads(env2["FLEET_MCP_COMMAND"]) == ["fleet-tui", "mcp-ask-human"]
    assert env2["FLEET_HOME"] == "/h" and env2["FLEET_SIM_MODEL"] == "opus"


def run(tmp_path: Path, prompt: str, attempt: int = 1) -> tuple[int, list[Event], Outcome, AttemptContext]:
    pytest.importorskip("fleet_tui.coders.claude")
    coder = SimCoder()
    ctx = ctx_for(tmp_path, prompt, attempt)
    coder.prepare(ctx)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(coder.env(ctx))
    res = subprocess.run(
        coder.argv(ctx), cwd=ctx.workdir, env=env, input=coder.stdin(ctx), capture_output=True, timeout=30
    )
    norm = coder.normalizer("t-sim", attempt, 0, ctx.attempt_dir)
    events: list[Event] = []
    for i, line in enumerate(res.stdout.decode("utf-8", "replace").splitlines()):
        events += norm.feed(line, 1000.0 + i)
    events += norm.poll(2000.0)
    return res.returncode, events, norm.outcome(res.returncode), ctx


def kinds(events: list[Event]) -> set[str]:
    return {e.kind for e in events}


def test_a_working_run_is_a_claimed_success(tmp_path: Path) -> None:
    code, events, out, ctx = run(tmp_path, "Greet.\n@sim steps=2 pace=0\n@sim write=hello.txt text=hi")
    assert code == 0
    assert {"session_started", "tool_call", "tool_result", "result"} <= kinds(events)
    assert [e.tool for e in events if e.kind == "tool_call"][-1] == "Write"
    assert out.kind == "success" and out.claimed_success is True
    assert out.cost_usd and out.cost_usd > 0
    assert (ctx.workdir / "hello.txt").read_text() == "hi"
    assert [e.seq for e in events] == list(range(len(events)))


def test_failure_and_fail_until_attempt(tmp_path: Path) -> None:
    code, _, out, _ = run(tmp_path, "@sim fail=nope")
    assert code == 1 and out.kind == "failure" and out.claimed_success is False
    prompt = "@sim fail-until-attempt=2 pace=0\n@sim write=f.txt"
    assert run(tmp_path, prompt, attempt=1)[2].kind == "failure"
    assert run(tmp_path, prompt, attempt=2)[2].kind == "success"


def test_rate_limit_is_rate_limited_with_the_reset_time(tmp_path: Path) -> None:
    before = time.time()
    code, events, out, _ = run(tmp_path, "@sim rate-limit=900 retries=2 pace=0")
    assert code == 1 and "rate_limit" in kinds(events)
    assert out.kind == "rate_limited"
    assert out.resets_at is not None and before + 898 <= out.resets_at <= time.time() + 901


def test_false_completion_claims_success(tmp_path: Path) -> None:
    code, events, out, ctx = run(tmp_path, "@sim false-completion")
    assert code == 0 and out.kind == "success" and out.claimed_success is True
    assert "tool_call" not in kinds(events) and list(ctx.workdir.iterdir()) == []


def test_context_tokens_rise_toward_the_window(tmp_path: Path) -> None:
    _, events, _, _ = run(tmp_path, "@sim context=190000 window=200000 steps=5 pace=0")
    ctx = [e.context_tokens for e in events if e.context_tokens is not None]
    assert ctx and ctx == sorted(ctx) and max(ctx) == 190000


def test_hostile_output_does_not_break_the_normalizer(tmp_path: Path) -> None:
    code, events, out, _ = run(tmp_path, "@sim garbage=9 invalid-utf8 huge=200K no-final-newline")
    assert code == 0 and out.kind == "success"
    assert "text" in kinds(events)
