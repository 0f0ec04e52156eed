"""The real Codex CLI, run with CodexCoder's argv/env/stdin/prepare, against a fake Responses API.

Why: fixtures show what one version printed once; these runs prove that the flags, the per-run
CODEX_HOME (a private copy of the user's config.toml, here a scratch HOME's ``~/.codex/config.toml``
with a custom model provider, as a Codex user configures one, plus ask_human) and the
normalizer — including the rollout poll — work with the program installed here. The model is
tests/fakeapi/openai_responses.py on loopback. When ``codex`` is missing the tests skip, saying
how to install it, except under CI (``CI=true``) where a missing program is a failure.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tests.fakeapi import HttpError, Request, Text, ToolCall, Turn, require_program, run_attempt
from tests.fakeapi.openai_responses import function_outputs, serve_openai_responses
from tests.fakeapi.user_setups import SCRUB, codex_user

from fleet_tui.coders.base import AttemptContext
from fleet_tui.coders.codex import CodexCoder
from fleet_tui.scheduler.model import Task, TaskSpec
from fleet_tui.scheduler.states import TaskStatus

#: the repository (the stub MCP server is run from it as tests.fakeapi.ask_human_stub)
ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.realcli, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def codex_program() -> str:
    return require_program("codex")


@pytest.fixture(autouse=True)
def user_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A scratch HOME: the coder (prepare, in this process) and the CLI read the user's config there."""
    home = tmp_path / "home"
    home.mkdir()
    for var in SCRUB:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(home))
    return home


def make_ctx(tmp_path: Path, base_url: str, retries: int | None = None) -> AttemptContext:
    """The attempt; the user's ~/.codex/config.toml names a provider at ``base_url`` and the model."""
    codex_user(tmp_path / "home", base_url, retries=retries)
    (tmp_path / "work").mkdir(exist_ok=True)
    (tmp_path / "work" / "README").write_text("a scratch repo\n")
    spec = TaskSpec(name="real-codex", prompt="Write marker.txt")
    task = Task(id="t-real", spec=spec, status=TaskStatus.RUNNING, attempt=1)
    return AttemptContext(
        task=task,
        attempt=1,
        prompt="Run a shell command that writes marker.txt, then stop.",
        workdir=tmp_path / "work",
        attempt_dir=tmp_path / "attempts" / "1",
        home=tmp_path / "fleet",
        model="fake-model",
    )


def home_env(tmp_path: Path) -> dict[str, str]:
    """The agent's environment: the scratch HOME and the provider's key variable."""
    return {"HOME": str(tmp_path / "home"), "PROXY_API_KEY": "sk-fake"}


def shell_call(req: Request) -> ToolCall:
    """Call whichever shell tool this Codex version offers."""
    names = req.tool_names()
    if "exec_command" in names:
        return ToolCall("exec_command", {"cmd": "echo ran-by-fake-model > marker.txt && ls"}, text="Running.")
    return ToolCall("shell", {"command": ["bash", "-lc", "echo ran-by-fake-model > marker.txt && ls"]})


def test_shell_call_then_finish(codex_program: str, tmp_path: Path) -> None:
    with serve_openai_responses([shell_call, Text("The command ran.")]) as (url, rec):
        ctx = make_ctx(tmp_path, url)
        run = run_attempt(CodexCoder(), ctx, home_env(tmp_path))
        calls = rec.model_requests()
    assert not run.timed_out, run.stderr
    assert (ctx.workdir / "marker.txt").read_text() == "ran-by-fake-model\n"
    kinds = run.kinds()
    assert kinds[0] == "session_started" and "result" in kinds, kinds
    (call,) = run.of_kind("tool_call")
    (result,) = run.of_kind("tool_result")
    assert call.tool == "shell" and result.tool_id == call.tool_id and not result.is_error
    assert "marker.txt" in (result.text or "")
    assert kinds.index("tool_call") < kinds.index("tool_result") < kinds.index("result")
    assert run.outcome.kind == "success" and run.outcome.claimed_success
    assert run.outcome.result_text == "The command ran."
    assert run.exit_code == 0
    # usage: stdout's cumulative total and the rollout's token_count agree, counted once
    usage = run.of_kind("usage")
    assert usage and sum(e.usage.total for e in usage) > 0
    windows = [e.context_window for e in usage if e.context_window]
    assert windows, "the rollout's model_context_window should have been read"
    # the tool's output went back to the model
    assert len(calls) == 2 and function_outputs(calls[1])
    # everything Codex wrote stayed in the attempt's CODEX_HOME
    assert list((ctx.attempt_dir / "codex_home" / "sessions").glob("**/rollout-*.jsonl"))
    assert sorted(p.name for p in (tmp_path / "home" / ".codex").iterdir()) == ["config.toml"]


def test_429_then_success(codex_program: str, tmp_path: Path) -> None:
    script: list[Turn | tuple[Turn, int]] = [
        (HttpError(429, "slow down (fake)", retry_after=1), 2),
        Text("Finished after two 429s."),
    ]
    with serve_openai_responses(script) as (url, rec):
        run = run_attempt(CodexCoder(), make_ctx(tmp_path, url), home_env(tmp_path))
        statuses = [r.status for r in rec.model_requests()]
    assert not run.timed_out, run.stderr
    assert statuses == [429, 429, 200]
    retries = run.of_kind("api_retry")
    assert len(retries) == 2 and all("429" in (e.text or "") for e in retries)
    assert run.outcome.kind == "success"
    assert run.outcome.result_text == "Finished after two 429s."


def test_429_forever_is_rate_limited(codex_program: str, tmp_path: Path) -> None:
    script = [(HttpError(429, "per-minute rate limit (fake)", retry_after=1), None)]
    with serve_openai_responses(script) as (url, rec):
        run = run_attempt(CodexCoder(), make_ctx(tmp_path, url, retries=1), home_env(tmp_path))
        calls = len(rec.model_requests())
    assert not run.timed_out, run.stderr
    assert calls == 2  # the first try and one retry
    assert run.outcome.kind == "rate_limited", run.outcome
    assert run.of_kind("result")[-1].is_error
    assert run.exit_code != 0


def test_auth_failure(codex_program: str, tmp_path: Path) -> None:
    script = [(HttpError(401, "Incorrect API key provided (fake)"), None)]
    with serve_openai_responses(script) as (url, _rec):
        run = run_attempt(CodexCoder(), make_ctx(tmp_path, url, retries=1), home_env(tmp_path))
    assert not run.timed_out, run.stderr
    assert run.outcome.kind == "auth_failed", run.outcome


def test_insufficient_quota(codex_program: str, tmp_path: Path) -> None:
    script = [(HttpError(429, "You exceeded your current quota", error_type="insufficient_quota"), None)]
    with serve_openai_responses(script) as (url, _rec):
        run = run_attempt(CodexCoder(), make_ctx(tmp_path, url, retries=1), home_env(tmp_path))
    assert not run.timed_out, run.stderr
    assert run.outcome.kind == "auth_failed", run.outcome  # billing: a human must act
    assert run.outcome.detail == "Quota exceeded. Check your plan and billing details."


def test_ask_human_mcp_tool_runs_unattended(codex_program: str, tmp_path: Path) -> None:
    """config.toml's mcp_servers.ask_human (approve modes) + exec flags: the call is not cancelled."""
    log = tmp_path / "asked.jsonl"
    state = {"asked": False, "waits": 0}

    def turn(req: Request) -> ToolCall | Text:
        if state["asked"]:
            return Text("Asked; the answer was PostgreSQL 16.")
        if "mcp__ask_human" in req.tool_names():  # Codex offers MCP tools as a namespace
            state["asked"] = True
            return ToolCall("ask_human", {"question": "Which database?"}, namespace="mcp__ask_human")
        state["waits"] += 1  # the MCP server was not up when this request was built: let it start
        if state["waits"] > 5:
            return Text("ask_human never appeared")
        return ToolCall("exec_command", {"cmd": "sleep 1"})

    with serve_openai_responses([(turn, None)]) as (url, _rec):
        base = make_ctx(tmp_path, url)
        ctx = AttemptContext(
            task=base.task,
            attempt=1,
            prompt=base.prompt,
            workdir=base.workdir,
            attempt_dir=base.attempt_dir,
            home=base.home,
            model=base.model,
            mcp_command=(sys.executable, "-m", "tests.fakeapi.ask_human_stub"),
            mcp_env={"FAKE_ANSWER": "Use PostgreSQL 16.", "FAKE_ASK_LOG": str(log), "PYTHONPATH": str(ROOT)},
        )
        run = run_attempt(CodexCoder(), ctx, home_env(tmp_path))
    assert not run.timed_out, run.stderr
    calls = [e for e in run.of_kind("tool_call") if e.tool == "mcp__ask_human__ask_human"]
    assert len(calls) == 1, run.stdout
    (result,) = [e for e in run.of_kind("tool_result") if e.tool_id == calls[0].tool_id]
    assert result.text == "Use PostgreSQL 16." and not result.is_error
    assert log.read_text().strip() == '{"question": "Which database?"}'
    assert run.outcome.kind == "success"
