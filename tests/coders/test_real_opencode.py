"""The real ``opencode`` program, run with OpenCodeCoder's argv/env/prepare, against a fake API.

Why: fixtures show what one version printed once; these runs prove that the flags, the per-run
config (``OPENCODE_CONFIG`` layered on the user's own config, per-run data/state/cache dirs,
permissions, the ``ask_human`` MCP server) and the normalizer work with the program installed
here. The model is tests/fakeapi/anthropic.py on loopback: OpenCode's bundled ``anthropic``
provider pointed at it by the ``baseURL`` in a scratch HOME's ``~/.config/opencode/opencode.json``,
as an OpenCode user configures it, so no network and no account are needed. When ``opencode`` is
missing the tests skip, saying how to install it, except under CI (``CI=true``) where a missing
program is a failure.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tests.fakeapi import (
    ECHO_MCP,
    AttemptRun,
    HttpError,
    Request,
    Text,
    ToolCall,
    require_program,
    run_attempt,
)
from tests.fakeapi.anthropic import serve_anthropic, tool_results
from tests.fakeapi.user_setups import SCRUB, opencode_user

from fleet_tui.coders.base import AttemptContext
from fleet_tui.coders.opencode import OpenCodeCoder
from fleet_tui.scheduler.model import Task, TaskSpec
from fleet_tui.scheduler.states import TaskStatus

pytestmark = [pytest.mark.realcli, pytest.mark.timeout(240)]

MODEL = "anthropic/claude-sonnet-4-5"


@pytest.fixture(scope="module")
def opencode_program() -> str:
    return require_program("opencode")


def make_ctx(tmp_path: Path, **kw: object) -> AttemptContext:
    work = tmp_path / "work"
    work.mkdir()
    (work / "README").write_text("a scratch repo\n")
    spec = TaskSpec(name="real-opencode", prompt="Write hello.txt")
    task = Task(id="t-real", spec=spec, status=TaskStatus.RUNNING, attempt=1)
    args: dict = {
        "task": task, "attempt": 1, "prompt": "Create hello.txt, then stop.", "workdir": work,
        "attempt_dir": tmp_path / "attempts" / "1", "home": tmp_path / "fleet", "model": MODEL,
    }  # fmt: skip
    args.update(kw)
    return AttemptContext(**args)


@pytest.fixture
def fake_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment for the agent: a fake key and a scratch HOME (nothing of the user's is read)."""
    home = tmp_path / "home"
    home.mkdir()
    for var in SCRUB:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(home))  # prepare (in this process) reads the user's config there
    # models.dev metadata: use the snapshot bundled in the binary, never the network
    return {"ANTHROPIC_API_KEY": "sk-ant-fake", "HOME": str(home), "OPENCODE_DISABLE_MODELS_FETCH": "1"}


def run_against_fake(
    script: list, ctx: AttemptContext, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> tuple[AttemptRun, list[Request]]:
    """Run the coder's program against the fake API, named in the user's opencode.json."""
    with serve_anthropic(script) as (url, rec):
        opencode_user(Path(env["HOME"]), url + "/v1")
        run = run_attempt(OpenCodeCoder(), ctx, env, timeout=120)
        return run, rec.model_requests()


def test_write_tool_then_finish(
    opencode_program: str, tmp_path: Path, fake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = make_ctx(tmp_path)
    target = ctx.workdir / "hello.txt"
    script = [
        ToolCall("write", {"filePath": str(target), "content": "hi from the fake model\n"}),
        Text("Created hello.txt."),
    ]
    run, calls = run_against_fake(script, ctx, fake_env, monkeypatch)
    assert not run.timed_out, run.stderr
    assert target.read_text() == "hi from the fake model\n"
    kinds = run.kinds()
    assert kinds == ["session_started", "tool_call", "tool_result", "usage", "text", "usage", "result"], kinds
    (call,) = run.of_kind("tool_call")
    (result,) = run.of_kind("tool_result")
    assert call.tool == "write" and result.tool_id == call.tool_id and not result.is_error
    assert sum(e.usage.total for e in run.of_kind("usage")) > 0
    assert all(e.context_tokens for e in run.of_kind("usage"))
    assert run.of_kind("result")[0].cost_usd is not None
    assert run.outcome.kind == "success" and run.outcome.claimed_success
    assert run.outcome.result_text == "Created hello.txt."
    assert run.exit_code == 0
    # the prompt reached the model and the tool's result came back to it
    assert len(calls) == 2
    assert "Create hello.txt, then stop." in str(calls[0].body["messages"])
    (sent,) = tool_results(calls[1])
    assert sent["tool_use_id"] == call.tool_id
    # OpenCode's sessions went to the attempt's own data dir, never to $HOME; the user's config
    # file is as they wrote it
    assert any((ctx.attempt_dir / "opencode" / "xdg" / "data").iterdir())
    home = Path(fake_env["HOME"])
    assert not (home / ".local" / "share" / "opencode").exists()
    assert json.loads((home / ".config" / "opencode" / "opencode.json").read_text())["model"] == MODEL


def test_shell_tool_runs_in_the_workdir(
    opencode_program: str, tmp_path: Path, fake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = make_ctx(tmp_path, prompt="-Run a command that writes marker.txt")  # a prompt like a flag
    script = [
        ToolCall("bash", {"command": "echo ran > marker.txt && pwd", "description": "Write a marker file"}),
        Text("The command ran."),
    ]
    # the supervisor's own cwd is elsewhere: OpenCode must take the workdir from PWD/--dir
    run, calls = run_against_fake(script, ctx, fake_env, monkeypatch)
    assert not run.timed_out, run.stderr
    assert (ctx.workdir / "marker.txt").read_text() == "ran\n"
    (result,) = run.of_kind("tool_result")
    assert result.tool == "bash" and str(ctx.workdir) in (result.text or "")
    assert run.outcome.kind == "success"
    assert "-Run a command that writes marker.txt" in str(calls[0].body["messages"])


def test_ask_human_mcp_server_is_registered(
    opencode_program: str, tmp_path: Path, fake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = tmp_path / "echo_mcp.py"
    server.write_text(ECHO_MCP)
    ctx = make_ctx(tmp_path, mcp_command=(sys.executable, str(server)), mcp_env={"FAKE_ANSWER": "yes-42"})

    def ask(req):  # type: ignore[no-untyped-def]
        names = req.tool_names()
        assert "ask_human_ask_human" in names, names
        return ToolCall("ask_human_ask_human", {"question": "Use PostgreSQL?"})

    run, _calls = run_against_fake([ask, Text("Got the answer.")], ctx, fake_env, monkeypatch)
    assert not run.timed_out, run.stderr
    (call,) = run.of_kind("tool_call")
    (result,) = run.of_kind("tool_result")
    assert call.tool == "ask_human_ask_human" and call.tool_input == {"question": "Use PostgreSQL?"}
    assert result.tool_id == call.tool_id and not result.is_error
    assert result.text == "answer: yes-42 to Use PostgreSQL?"
    assert run.outcome.kind == "success"


def test_429_then_success(
    opencode_program: str, tmp_path: Path, fake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retryable 429s are retried silently: nothing on stdout, then a normal run."""
    ctx = make_ctx(tmp_path)
    script = [(HttpError(429, "slow down (fake)", retry_after=0), 2), Text("ok after 429s")]
    run, calls = run_against_fake(script, ctx, fake_env, monkeypatch)
    assert not run.timed_out, run.stderr
    assert [r.status for r in calls] == [429, 429, 200]
    assert run.kinds() == ["session_started", "text", "usage", "result"]
    assert run.outcome.kind == "success" and run.outcome.result_text == "ok after 429s"


def test_401_is_auth_failed(
    opencode_program: str, tmp_path: Path, fake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = make_ctx(tmp_path)
    run, _calls = run_against_fake([(HttpError(401, "invalid x-api-key"), None)], ctx, fake_env, monkeypatch)
    assert not run.timed_out, run.stderr
    assert run.exit_code == 1
    assert run.kinds() == ["session_started", "error"]
    assert run.outcome.kind == "auth_failed" and "401" in run.outcome.detail


def test_429_until_it_gives_up_is_rate_limited(
    opencode_program: str, tmp_path: Path, fake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """opencode 1.18.33 gives up after a few 429s that carry ``retry-after`` (exit 1, an error line
    with ``statusCode: 429``); the outcome says rate_limited with a reset time."""
    ctx = make_ctx(tmp_path)
    run, calls = run_against_fake(
        [(HttpError(429, "rate limited (fake)", retry_after=1), None)], ctx, fake_env, monkeypatch
    )
    assert not run.timed_out, run.stderr
    assert run.exit_code == 1 and len(calls) > 1 and all(r.status == 429 for r in calls)
    assert run.kinds() == ["session_started", "error", "rate_limit"]
    assert run.outcome.kind == "rate_limited" and run.outcome.resets_at is not None
