"""The real ``gemini`` program, run with GeminiCoder's argv/env/prepare, against a fake API.

Why: fixtures show what one version printed once; these runs prove that the flags, the per-run
settings (``GEMINI_CLI_HOME``, the auth type, the trusted ``ask_human`` MCP server) and the
normalizer work with the program installed here. The model is tests/fakeapi/gemini.py on
loopback (``GOOGLE_GEMINI_BASE_URL``), so no network and no account are needed. When ``gemini``
is missing the tests skip, saying how to install it, except under CI (``CI=true``) where a
missing program is a failure.
"""

from __future__ import annotations

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
    Turn,
    require_program,
    run_attempt,
)
from tests.fakeapi.gemini import function_responses, gemini_tool_names, serve_gemini

from fleet_tui.coders.base import AttemptContext
from fleet_tui.coders.gemini import GeminiCoder
from fleet_tui.scheduler.model import Task, TaskSpec
from fleet_tui.scheduler.states import TaskStatus

pytestmark = [pytest.mark.realcli, pytest.mark.timeout(240)]

MODEL = "gemini-2.5-flash"  # a fixed model: no "auto" router call in the recorded requests


@pytest.fixture(scope="module")
def gemini_program() -> str:
    return require_program("gemini")


def make_ctx(tmp_path: Path, **kw: object) -> AttemptContext:
    work = tmp_path / "work"
    work.mkdir()
    (work / "README").write_text("a scratch repo\n")
    spec = TaskSpec(name="real-gemini", prompt="Write hello.txt")
    task = Task(id="t-real", spec=spec, status=TaskStatus.RUNNING, attempt=1)
    args: dict = {
        "task": task, "attempt": 1, "prompt": "Create hello.txt, then stop.", "workdir": work,
        "attempt_dir": tmp_path / "attempts" / "1", "home": tmp_path / "fleet", "model": MODEL,
    }  # fmt: skip
    args.update(kw)
    return AttemptContext(**args)


@pytest.fixture
def fake_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A fake key (prepare derives the auth type from it) and a scratch HOME and user Gemini home."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("GEMINI_API_KEY", "fake-key")
    monkeypatch.setenv("GEMINI_CLI_HOME", str(home))  # prepare reads the "user's" settings here
    for var in ("GOOGLE_GENAI_USE_GCA", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    return {"HOME": str(home), "GEMINI_API_KEY": "fake-key"}


def run_against_fake(
    script: list[Turn | tuple[Turn, int | None]],
    ctx: AttemptContext,
    env: dict[str, str],
    timeout: float = 120,
) -> tuple[AttemptRun, list[Request]]:
    with serve_gemini(script) as (url, rec):
        run = run_attempt(GeminiCoder(), ctx, {**env, "GOOGLE_GEMINI_BASE_URL": url}, timeout=timeout)
        return run, rec.model_requests()


def final_text(run: AttemptRun) -> str:
    return "".join(e.text or "" for e in run.of_kind("text"))


def test_write_file_then_finish(gemini_program: str, tmp_path: Path, fake_env: dict[str, str]) -> None:
    ctx = make_ctx(tmp_path)
    target = ctx.workdir / "hello.txt"
    script: list = [
        ToolCall("write_file", {"file_path": str(target), "content": "hi from the fake model\n"}),
        Text("Created hello.txt."),
    ]
    run, calls = run_against_fake(script, ctx, fake_env)
    assert not run.timed_out, run.stderr
    assert target.read_text() == "hi from the fake model\n"
    kinds = run.kinds()
    assert kinds == ["session_started", "tool_call", "tool_result", "text", "usage", "result"], kinds
    (call,) = run.of_kind("tool_call")
    (result,) = run.of_kind("tool_result")
    assert call.tool == "write_file" and result.tool_id == call.tool_id and not result.is_error
    (usage,) = run.of_kind("usage")
    assert usage.usage.total > 0
    assert run.outcome.kind == "success" and run.outcome.claimed_success
    assert run.outcome.result_text == "Created hello.txt." == final_text(run)
    assert run.exit_code == 0
    # the prompt reached the model and the tool's result came back to it
    assert len(calls) == 2
    assert "Create hello.txt, then stop." in str(calls[0].body["contents"])
    (sent,) = function_responses(calls[1])
    assert sent["name"] == "write_file"
    # settings went to the attempt's own Gemini home; the user's was not written
    assert GeminiCoder.settings_path(ctx).is_file()
    assert not (Path(fake_env["HOME"]) / ".gemini").exists()


def test_shell_tool_runs_in_the_workdir(
    gemini_program: str, tmp_path: Path, fake_env: dict[str, str]
) -> None:
    ctx = make_ctx(tmp_path, prompt="-Run a command that writes marker.txt")  # a prompt like a flag
    script: list = [
        ToolCall("run_shell_command", {"command": "echo ran > marker.txt && pwd", "description": "marker"}),
        Text("The command ran."),
    ]
    run, calls = run_against_fake(script, ctx, fake_env)
    assert not run.timed_out, run.stderr
    assert (ctx.workdir / "marker.txt").read_text() == "ran\n"
    (result,) = run.of_kind("tool_result")
    assert result.tool == "run_shell_command" and str(ctx.workdir) in (result.text or "")
    assert run.outcome.kind == "success"
    assert "-Run a command that writes marker.txt" in str(calls[0].body["contents"])


def test_ask_human_mcp_server_is_registered_and_trusted(
    gemini_program: str, tmp_path: Path, fake_env: dict[str, str]
) -> None:
    server = tmp_path / "echo_mcp.py"
    server.write_text(ECHO_MCP)
    ctx = make_ctx(tmp_path, mcp_command=(sys.executable, str(server)), mcp_env={"FAKE_ANSWER": "yes-42"})

    def ask(req: Request) -> ToolCall:
        names = gemini_tool_names(req)
        assert "mcp_ask_human_ask_human" in names, names
        return ToolCall("mcp_ask_human_ask_human", {"question": "Use PostgreSQL?"})

    run, _calls = run_against_fake([ask, Text("Got the answer.")], ctx, fake_env)
    assert not run.timed_out, run.stderr
    (call,) = run.of_kind("tool_call")
    (result,) = run.of_kind("tool_result")
    assert call.tool == "mcp_ask_human_ask_human" and call.tool_input == {"question": "Use PostgreSQL?"}
    assert result.tool_id == call.tool_id and not result.is_error
    assert "answer: yes-42 to Use PostgreSQL?" in (result.text or "")
    assert run.outcome.kind == "success"


def test_429_then_success(gemini_program: str, tmp_path: Path, fake_env: dict[str, str]) -> None:
    """Retries are logged on stderr only; stdout shows a normal run."""
    ctx = make_ctx(tmp_path)
    script: list = [
        (HttpError(429, "Resource has been exhausted (fake)", retry_after=0), 1),
        Text("ok after 429"),
    ]
    run, calls = run_against_fake(script, ctx, fake_env)
    assert not run.timed_out, run.stderr
    assert [r.status for r in calls] == [429, 200]
    assert run.kinds() == ["session_started", "text", "usage", "result"]
    assert run.outcome.kind == "success" and run.outcome.result_text == "ok after 429"


def test_401_exits_145_auth_failed(gemini_program: str, tmp_path: Path, fake_env: dict[str, str]) -> None:
    ctx = make_ctx(tmp_path)
    run, _calls = run_against_fake([(HttpError(401, "API key not valid."), None)], ctx, fake_env)
    assert not run.timed_out, run.stderr
    assert run.exit_code == 401 & 0xFF
    assert run.kinds() == ["session_started", "result"]
    assert run.of_kind("result")[0].is_error
    assert run.outcome.kind == "auth_failed"


def test_no_auth_prints_nothing_and_exits_41(
    gemini_program: str, tmp_path: Path, fake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trap from DESIGN section 6: no auth method -> empty stdout, exit 41 -> auth_failed."""
    monkeypatch.delenv("GEMINI_API_KEY")  # prepare then configures no auth type
    ctx = make_ctx(tmp_path)
    env = {**fake_env, "GEMINI_API_KEY": ""}
    run, calls = run_against_fake([Text("never")], ctx, env, timeout=60)
    assert not run.timed_out, run.stderr
    assert run.exit_code == 41 and run.stdout == "" and run.events == []
    assert calls == []
    assert run.outcome.kind == "auth_failed"
