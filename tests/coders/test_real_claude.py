"""The real Claude Code program, run with ClaudeCoder's argv/env/stdin/prepare, against a fake API.

Why: fixtures show what one version printed once; these runs prove that the flags, the per-run
config and the normalizer work with the program installed here (pinned by the project's CI to
the version the fixtures come from). The model is tests/fakeapi/anthropic.py on loopback, so no
network and no account are needed. When ``claude`` is missing the tests skip, saying how to
install it, except under CI (``CI=true``) where a missing program is a failure.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tests.fakeapi import HttpError, Text, ToolCall, Turn, require_program, run_attempt
from tests.fakeapi.anthropic import serve_anthropic, tool_results

from fleet_tui.coders.base import AttemptContext
from fleet_tui.coders.claude import ClaudeCoder
from fleet_tui.scheduler.model import Task, TaskSpec
from fleet_tui.scheduler.states import TaskStatus

#: the repository (the stub MCP server is run from it as tests.fakeapi.ask_human_stub)
ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.realcli, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def claude_program() -> str:
    return require_program("claude")


def make_ctx(tmp_path: Path) -> AttemptContext:
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "README").write_text("a scratch repo\n")
    spec = TaskSpec(name="real-claude", prompt="Write hello.txt")
    task = Task(id="t-real", spec=spec, status=TaskStatus.RUNNING, attempt=1)
    return AttemptContext(
        task=task,
        attempt=1,
        prompt="Create hello.txt containing 'hi from the fake model', then stop.",
        workdir=tmp_path / "work",
        attempt_dir=tmp_path / "attempts" / "1",
        home=tmp_path / "fleet",
    )


def fake_env(tmp_path: Path, base_url: str, **extra: str) -> dict[str, str]:
    """Point the CLI at the fake and keep it away from the user's own login and config."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "sk-ant-fake",
        "ANTHROPIC_AUTH_TOKEN": "",
        "CLAUDE_CODE_OAUTH_TOKEN": "",
        "HOME": str(home),
    }
    env.update(extra)
    return env


@pytest.fixture
def api_key_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The coder decides on config isolation from the supervisor's environment."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake")


def test_tool_call_then_finish(claude_program: str, tmp_path: Path, api_key_env: None) -> None:
    ctx = make_ctx(tmp_path)
    target = ctx.workdir / "hello.txt"
    script: list[Turn] = [
        ToolCall("Write", {"file_path": str(target), "content": "hi from the fake model\n"}, text="Writing."),
        Text("Created hello.txt."),
    ]
    with serve_anthropic(script) as (url, rec):
        run = run_attempt(ClaudeCoder(), ctx, fake_env(tmp_path, url))
        model_calls = rec.model_requests()
    assert not run.timed_out, run.stderr
    assert target.read_text() == "hi from the fake model\n"
    kinds = run.kinds()
    assert kinds[0] == "session_started" and kinds[-1] == "result", kinds
    (call,) = run.of_kind("tool_call")
    (result,) = run.of_kind("tool_result")
    assert call.tool == "Write" and result.tool_id == call.tool_id and not result.is_error
    assert kinds.index("tool_call") < kinds.index("tool_result") < kinds.index("result")
    usage = run.of_kind("usage")
    assert usage and sum(e.usage.total for e in usage) > 0
    assert run.of_kind("result")[0].cost_usd is not None
    assert run.outcome.kind == "success" and run.outcome.claimed_success
    assert run.outcome.result_text == "Created hello.txt."
    assert run.exit_code == 0
    # the fake saw the tool's result come back
    assert len(model_calls) == 2
    (sent,) = tool_results(model_calls[1])
    assert sent["tool_use_id"] == call.tool_id
    # the CLI's state went to the attempt's own config dir, not to $HOME
    assert (ctx.attempt_dir / "claude_config").is_dir()
    assert not (tmp_path / "home" / ".claude").exists()


def test_429_then_success(claude_program: str, tmp_path: Path, api_key_env: None) -> None:
    ctx = make_ctx(tmp_path)
    script: list[Turn | tuple[Turn, int]] = [
        (HttpError(429, "slow down (fake)", retry_after=0), 2),
        Text("Finished after two 429s."),
    ]
    with serve_anthropic(script) as (url, rec):
        run = run_attempt(ClaudeCoder(), ctx, fake_env(tmp_path, url))
        statuses = [r.status for r in rec.model_requests()]
    assert not run.timed_out, run.stderr
    assert statuses == [429, 429, 200]
    retries = run.of_kind("api_retry")
    assert len(retries) == 2 and all(e.raw["error_status"] == 429 for e in retries)
    assert run.outcome.kind == "success"
    assert run.outcome.result_text == "Finished after two 429s."


def test_429_forever_is_rate_limited(claude_program: str, tmp_path: Path, api_key_env: None) -> None:
    ctx = make_ctx(tmp_path)
    script = [(HttpError(429, "per-minute rate limit (fake)", retry_after=0), None)]
    with serve_anthropic(script) as (url, rec):
        run = run_attempt(ClaudeCoder(), ctx, fake_env(tmp_path, url, CLAUDE_CODE_MAX_RETRIES="1"))
        calls = len(rec.model_requests())
    assert not run.timed_out, run.stderr
    assert calls == 2  # the first try and one retry
    assert len(run.of_kind("api_retry")) == 1
    result = run.of_kind("result")[-1]
    assert result.is_error and result.raw["api_error_status"] == 429
    assert run.outcome.kind == "rate_limited", run.outcome
    assert run.exit_code != 0


def test_auth_failure(claude_program: str, tmp_path: Path, api_key_env: None) -> None:
    ctx = make_ctx(tmp_path)
    script = [(HttpError(401, "invalid x-api-key"), None)]
    with serve_anthropic(script) as (url, _rec):
        run = run_attempt(ClaudeCoder(), ctx, fake_env(tmp_path, url, CLAUDE_CODE_MAX_RETRIES="1"))
    assert not run.timed_out, run.stderr
    assert run.outcome.kind == "auth_failed", (run.outcome, run.stdout[-2000:])


def test_ask_human_mcp_tool_runs_unattended(claude_program: str, tmp_path: Path, api_key_env: None) -> None:
    """--mcp-config/--strict-mcp-config/--allowedTools: the ask_human tool is called, no prompt."""
    base = make_ctx(tmp_path)
    log = tmp_path / "asked.jsonl"
    ctx = AttemptContext(
        task=base.task,
        attempt=1,
        prompt=base.prompt,
        workdir=base.workdir,
        attempt_dir=base.attempt_dir,
        home=base.home,
        mcp_command=(sys.executable, "-m", "tests.fakeapi.ask_human_stub"),
        mcp_env={"FAKE_ANSWER": "Use PostgreSQL 16.", "FAKE_ASK_LOG": str(log), "PYTHONPATH": str(ROOT)},
    )
    script: list[Turn] = [
        ToolCall("mcp__ask_human__ask_human", {"question": "Which database?"}),
        Text("Asked; the answer was PostgreSQL 16."),
    ]
    with serve_anthropic(script) as (url, rec):
        run = run_attempt(ClaudeCoder(), ctx, fake_env(tmp_path, url))
        offered = rec.model_requests()[0].tool_names()
    assert not run.timed_out, run.stderr
    init = run.of_kind("session_started")[0].raw
    # 2.1.332 defers MCP tools behind ToolSearch (ENABLE_TOOL_SEARCH=false lists them directly)
    assert "mcp__ask_human__ask_human" in init["tools"]
    assert "mcp__ask_human__ask_human" in offered or "ToolSearch" in offered
    assert {"name": "ask_human", "status": "connected"}.items() <= init["mcp_servers"][0].items()
    (call,) = run.of_kind("tool_call")
    (result,) = run.of_kind("tool_result")
    assert call.tool == "mcp__ask_human__ask_human" and result.tool_id == call.tool_id
    assert result.text == "Use PostgreSQL 16." and not result.is_error
    assert log.read_text().strip() == '{"question": "Which database?"}'
    assert run.outcome.kind == "success"
