"""The Gemini coder against every Gemini fixture stream, plus its argv/env/per-run settings.

The fixtures live in the repository (``tests/fixtures/streams``);
PROVENANCE.md there says which lines are real captures of gemini-cli 0.61.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet_tui.coders.base import AttemptContext
from fleet_tui.coders.gemini import (
    EXIT_CODES,
    RATE_LIMIT_ADVICE,
    GeminiCoder,
    GeminiNormalizer,
    api_error_code,
)
from fleet_tui.scheduler.model import Event, Task, TaskSpec, Usage
from fleet_tui.scheduler.states import TaskStatus

STREAMS = Path(__file__).resolve().parents[1] / "fixtures" / "streams"
FILES = sorted(p.name for p in STREAMS.glob("gemini-*.jsonl"))


def run(name: str) -> tuple[list[Event], GeminiNormalizer]:
    """Feed a fixture like the runner does: every line, then one final poll."""
    n = GeminiNormalizer("t1", 1)
    events: list[Event] = []
    for i, line in enumerate((STREAMS / name).read_text().splitlines()):
        events += n.feed(line, 1000.0 + i)
    events += n.poll(2000.0)
    return events, n


def kinds(events: list[Event]) -> list[str]:
    return [e.kind for e in events]


def test_fixtures_are_there() -> None:
    assert len(FILES) >= 11, f"expected the Gemini fixtures in {STREAMS}"


@pytest.mark.parametrize("name", FILES)
def test_every_fixture_normalizes(name: str) -> None:
    events, n = run(name)
    assert [e.seq for e in events] == list(range(len(events)))
    assert events[0].kind == "session_started" and events[0].session_id
    assert events[-1].kind == "result"
    calls = {e.tool_id: e for e in events if e.kind == "tool_call"}
    for r in (e for e in events if e.kind == "tool_result"):
        assert r.tool_id in calls, "every tool_result pairs with an earlier tool_call"
        assert events.index(calls[r.tool_id]) < events.index(r)
        assert r.tool == calls[r.tool_id].tool
    assert sum(1 for e in events if e.kind == "usage") <= 1
    n.outcome(0), n.outcome(1), n.outcome(None)  # never raises


TOOL_RUN = ["session_started", "tool_call", "tool_result", "text", "usage", "result"]
EXPECTED_KINDS = {
    "gemini-api-error.jsonl": ["session_started", "result"],
    "gemini-rate-limit.jsonl": ["session_started", "rate_limit", "result"],
    "gemini-real-local-0.61-mcp-tool.jsonl": TOOL_RUN,
    "gemini-real-local-0.61-rate-limited-forever.jsonl": ["session_started", "usage", "rate_limit", "result"],
    "gemini-real-local-0.61-rate-limited-then-ok.jsonl": ["session_started", "text", "usage", "result"],
    "gemini-real-local-0.61-shell.jsonl": TOOL_RUN,
    "gemini-real-local-0.61-write-file.jsonl": TOOL_RUN,
    "gemini-real-verbatim.jsonl": [
        "session_started",
        "text",
        "tool_call",
        "tool_result",
        "text",
        "usage",
        "result",
    ],
    "gemini-success-tool.jsonl": [
        "session_started",
        "text",
        "tool_call",
        "tool_result",
        "tool_call",
        "tool_result",
        "text",
        "usage",
        "result",
    ],
    "gemini-upstream-snapshot-maxturns.jsonl": ["session_started", "error", "result"],
    "gemini-upstream-snapshot.jsonl": [
        "session_started",
        "text",
        "tool_call",
        "tool_result",
        "text",
        "result",
    ],
}


@pytest.mark.parametrize("name", sorted(EXPECTED_KINDS))
def test_kinds_in_order(name: str) -> None:
    events, _ = run(name)
    assert kinds(events) == EXPECTED_KINDS[name]


def test_every_fixture_has_expected_kinds() -> None:
    assert set(FILES) == set(EXPECTED_KINDS), "a new fixture needs its expected kinds here"


@pytest.mark.parametrize(
    ("name", "tool", "key", "output"),
    [
        ("gemini-real-local-0.61-shell.jsonl", "run_shell_command", "command", "README\nmarker.txt"),
        ("gemini-real-local-0.61-write-file.jsonl", "write_file", "file_path", ""),
        (
            "gemini-real-local-0.61-mcp-tool.jsonl",
            "mcp_fakemcp_echo",
            "text",
            "echo: ping from the fake model",
        ),
        ("gemini-success-tool.jsonl", "run_shell_command", "command", "2 failed, 40 passed in 1.93s"),
        ("gemini-real-verbatim.jsonl", "run_shell_command", "command", "file1.ts\nfile2.ts"),
    ],
)
def test_tool_call_and_result(name: str, tool: str, key: str, output: str) -> None:
    events, n = run(name)
    call = next(e for e in events if e.kind == "tool_call")
    result = next(e for e in events if e.kind == "tool_result")
    assert call.tool == tool and key in call.tool_input
    assert call.tool_id and call.tool_id == result.tool_id
    assert result.text == output and not result.is_error
    out = n.outcome(0)
    assert out.kind == "success" and out.claimed_success


def test_answered_tool_calls_are_not_kept() -> None:
    """An agent that runs for hours makes thousands of tool calls: each result still names its
    call's tool, and the normalizer keeps nothing of a call once it is answered."""
    n = GeminiNormalizer("t1", 1)
    events: list[Event] = []
    for i in range(500):
        call = {"type": "tool_use", "tool_name": "read_file", "tool_id": f"c{i}", "parameters": {}}
        result = {"type": "tool_result", "tool_id": f"c{i}", "status": "success", "output": "ok"}
        events += n.feed(json.dumps(call), 1000.0 + i)
        events += n.feed(json.dumps(result), 1000.5 + i)
    results = [e for e in events if e.kind == "tool_result"]
    assert len(results) == 500 and {e.tool for e in results} == {"read_file"}
    assert n.tools == {}


def test_mcp_ask_human_tool_name() -> None:
    events, _ = run("gemini-success-tool.jsonl")
    calls = [e for e in events if e.kind == "tool_call"]
    assert calls[1].tool == "mcp_ask_human_ask_human"
    assert calls[1].tool_input == {"question": "Switch the test DB to PostgreSQL 16?"}


def test_deltas_are_joined_and_result_text_is_the_final_answer() -> None:
    events, n = run("gemini-real-local-0.61-write-file.jsonl")
    texts = [e.text for e in events if e.kind == "text"]
    assert texts == [
        "Done: wrote hello.txt. Tool said: Successfully created and wrote to new file: "
        "/tmp/fakeapi-gemini_write_file-61r0x6dg/repo/hello.txt. Here is the updated code:\n"
        "hello from the fake model\n"
    ]
    assert events[-1].text == texts[0] and n.outcome(0).result_text == texts[0]
    events, n = run("gemini-success-tool.jsonl")
    assert events[-1].text == "Switched the test DB to PostgreSQL 16; all tests pass."


def test_poll_flushes_pending_text() -> None:
    n = GeminiNormalizer("t", 1)
    lines = (STREAMS / "gemini-real-local-0.61-shell.jsonl").read_text().splitlines()
    for line in lines[:5]:
        n.feed(line, 1.0)
    flushed = n.poll(2.0)
    assert kinds(flushed) == ["text"] and flushed[0].text == "The command ran. Output was: <untrusted_"
    assert n.poll(3.0) == []
    rest: list[Event] = []
    for line in lines[5:]:
        rest += n.feed(line, 4.0)
    assert kinds(rest) == ["text", "usage", "result"]
    # the result carries the whole answer, even though poll split the text events
    assert (rest[-1].text or "").startswith("The command ran. Output was: <untrusted_context>")


def test_usage_from_stats() -> None:
    events, _ = run("gemini-success-tool.jsonl")
    u = next(e for e in events if e.kind == "usage")
    assert u.usage == Usage(input_tokens=22690, output_tokens=420, cache_read_tokens=31200)
    assert u.context_tokens is None  # Gemini reports session totals, not context occupancy
    events, _ = run("gemini-real-verbatim.jsonl")  # an older build: no "input" key
    u = next(e for e in events if e.kind == "usage")
    assert u.usage == Usage(input_tokens=26928, output_tokens=87)
    events, _ = run("gemini-real-local-0.61-shell.jsonl")
    u = next(e for e in events if e.kind == "usage")
    assert u.usage is not None and u.usage.total == 25184


def test_terminal_quota_error_is_rate_limited() -> None:
    events, n = run("gemini-rate-limit.jsonl")
    rl = next(e for e in events if e.kind == "rate_limit").rate_limit
    assert rl is not None and rl.account == "gemini" and rl.status == "rejected"
    result = events[-1]
    assert rl.resets_at == pytest.approx(result.ts + 2 * 3600 + 24 * 60 + 55)
    assert result.is_error
    out = n.outcome(1)
    assert out.kind == "rate_limited" and out.resets_at == rl.resets_at
    assert out.detail.startswith("[API Error: You have exhausted your capacity")


def test_real_429_gave_up_exit_173() -> None:
    events, n = run("gemini-real-local-0.61-rate-limited-forever.jsonl")
    # 0.61 reports the 429 as a structured error: error.type is "unknown", the CLI appended its
    # 429 advice, and the process exits with status 429 -> 173
    assert (
        json.loads(
            (STREAMS / "gemini-real-local-0.61-rate-limited-forever.jsonl").read_text().splitlines()[-1]
        )["error"]["type"]
        == "unknown"
    )
    rl = next(e for e in events if e.kind == "rate_limit").rate_limit
    assert rl is not None and rl.resets_at == pytest.approx(events[-1].ts + 1)  # "retry after 1s"
    assert n.outcome(173).kind == "rate_limited"
    assert n.outcome(1).kind == "rate_limited"  # the advice text alone also says so


def test_rate_limit_advice_wording_is_pinned() -> None:
    """gemini-cli 0.61 errorParsing.ts appends this text exactly when an API error's status is 429."""
    line = (STREAMS / "gemini-real-local-0.61-rate-limited-forever.jsonl").read_text().splitlines()[-1]
    message = json.loads(line)["error"]["message"]
    assert RATE_LIMIT_ADVICE[0] in message
    assert (
        "Please wait and try again later. To increase your limits, request a quota increase"
        in RATE_LIMIT_ADVICE
    )
    assert "Possible quota limitations in place or slow response times detected." in RATE_LIMIT_ADVICE


def test_rate_limit_from_exit_code_alone() -> None:
    n = GeminiNormalizer("t", 1)
    assert n.outcome(173).kind == "rate_limited" and EXIT_CODES[173] == "rate limited (HTTP 429)"


def test_api_error_is_failure() -> None:
    events, n = run("gemini-api-error.jsonl")
    assert events[-1].is_error and events[-1].text == "[API Error: Requested entity was not found.]"
    out = n.outcome(1)
    assert out.kind == "failure" and "Requested entity was not found" in out.detail


def test_auth_failure_prints_nothing_and_exits_41() -> None:
    n = GeminiNormalizer("t", 1)
    out = n.outcome(41)
    assert out.kind == "auth_failed" and "41" in out.detail


def test_real_401_result_and_exit_145() -> None:
    """As gemini-cli 0.61 printed it against the fake API answering 401 (exit 145 = 401 & 0xFF)."""
    n = GeminiNormalizer("t", 1)
    line = {
        "type": "result", "timestamp": "2026-11-29T09:03:52.495Z", "status": "error",
        "error": {"type": "unknown",
                  "message": '[API Error: {"error":{"code":401,"message":"API key not valid.",'
                             '"status":"UNAUTHENTICATED"}}]'},
        "stats": {"total_tokens": 0, "input_tokens": 0, "output_tokens": 0, "cached": 0, "input": 0,
                  "duration_ms": 0, "tool_calls": 0, "models": {}},
    }  # fmt: skip
    n.feed(json.dumps(line), 1.0)
    assert n.outcome(145).kind == "auth_failed"
    assert n.outcome(1).kind == "auth_failed"  # the embedded API error code says 401
    assert GeminiNormalizer("t", 1).outcome(145).kind == "auth_failed"
    assert api_error_code(line["error"]["message"]) == 401  # type: ignore[index]
    assert api_error_code("[API Error: Requested entity was not found.]") is None
    assert api_error_code("{not json}") is None


def test_other_exit_codes() -> None:
    n = GeminiNormalizer("t", 1)
    assert n.outcome(42).kind == "failure" and "input error" in n.outcome(42).detail
    assert n.outcome(0).kind == "failure" and "no output" in n.outcome(0).detail
    assert n.outcome(None).kind == "failure"
    _events, n = run("gemini-real-local-0.61-shell.jsonl")
    assert n.outcome(1).kind == "failure"
    assert n.outcome(0).kind == "success"


def test_max_turns_error_then_success_status_is_failure() -> None:
    events, n = run("gemini-upstream-snapshot-maxturns.jsonl")
    assert events[1].is_error and events[1].text == "Maximum session turns exceeded"
    assert n.outcome(0).kind == "failure" and "Maximum session turns" in n.outcome(0).detail
    out = n.outcome(53)
    assert out.kind == "failure" and "turn limit" in out.detail


def test_warning_is_not_fatal_and_tool_error() -> None:
    n = GeminiNormalizer("t", 1)
    warn = {"type": "error", "severity": "warning", "message": "Loop detected, stopping execution"}
    use = {"type": "tool_use", "tool_name": "read_file", "tool_id": "r1", "parameters": {"file_path": "x"}}
    res = {"type": "tool_result", "tool_id": "r1", "status": "error",
           "error": {"type": "TOOL_EXECUTION_ERROR", "message": "File not found"}}  # fmt: skip
    events = n.feed(json.dumps(warn), 1.0) + n.feed(json.dumps(use), 2.0) + n.feed(json.dumps(res), 3.0)
    assert kinds(events) == ["error", "tool_call", "tool_result"]
    assert not events[0].is_error
    assert events[2].is_error and events[2].text == "TOOL_EXECUTION_ERROR: File not found"
    assert events[2].tool == "read_file"
    n.feed(json.dumps({"type": "result", "status": "success", "stats": {}}), 4.0)
    assert n.outcome(0).kind == "success"


@pytest.mark.parametrize(
    "line",
    [
        "",
        "  ",
        "Warning: 256-color support not detected.",
        "{broken",
        "[1]",
        "{}",
        '{"type": null}',
        '{"type": "message", "role": "assistant", "content": 5}',
        '{"type": "tool_result", "tool_id": {"x": 1}, "output": [1]}',
        '{"type": "result", "status": "error", "error": "boom", "stats": [1]}',
        '{"type": "result", "status": "error", "error": {"message": 3}, "stats": {"input_tokens": "x"}}',
        '{"type": "init", "session_id": 5, "model": []}',
        '{"type": "error"}',
        '{"type": "novel_event"}',
    ],
)
def test_never_raises_on_garbage(line: str) -> None:
    n = GeminiNormalizer("t", 1, start_seq=3)
    events = n.feed(line, 1.0) + n.poll(2.0)
    assert all(e.seq >= 3 for e in events)
    if line.strip() and not line.lstrip().startswith("{"):
        assert kinds(events) == ["text"] and events[0].text == line
    n.outcome(0), n.outcome(41), n.outcome(None)


def test_garbage_flushes_pending_text_first() -> None:
    n = GeminiNormalizer("t", 1)
    n.feed('{"type":"message","role":"assistant","content":"hel","delta":true}', 1.0)
    events = n.feed("not json", 2.0)
    assert [(e.kind, e.text) for e in events] == [("text", "hel"), ("text", "not json")]


# -- the coder: argv, env, per-run settings ------------------------------------------------------


def make_ctx(tmp_path: Path, env: tuple[tuple[str, str], ...] = (), **kw: object) -> AttemptContext:
    task = Task(id="t1", spec=TaskSpec(name="t", prompt="p", env=env), status=TaskStatus.RUNNING)
    work = tmp_path / "repo"
    work.mkdir(parents=True, exist_ok=True)
    args: dict = {
        "task": task, "attempt": 1, "prompt": "-fix it", "workdir": work,
        "attempt_dir": tmp_path / "attempts" / "1", "home": tmp_path / "home",
    }  # fmt: skip
    args.update(kw)
    return AttemptContext(**args)


@pytest.fixture
def user_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake user Gemini home, so the tests never read the real ~/.gemini."""
    home = tmp_path / "userhome"
    (home / ".gemini").mkdir(parents=True)
    monkeypatch.setenv("GEMINI_CLI_HOME", str(home))
    for var in ("GEMINI_API_KEY", "GOOGLE_GENAI_USE_GCA", "GOOGLE_GENAI_USE_VERTEXAI"):
        monkeypatch.delenv(var, raising=False)
    return home


def test_argv(tmp_path: Path) -> None:
    c = GeminiCoder()
    ctx = make_ctx(tmp_path)
    assert c.argv(ctx) == [
        "gemini", "--output-format", "stream-json", "--approval-mode", "yolo", "--skip-trust",
    ]  # fmt: skip
    assert c.stdin(ctx) == b"-fix it"  # the prompt goes on stdin: no ARG_MAX, never in ps
    argv = c.argv(make_ctx(tmp_path, model="gemini-2.5-pro"))
    assert argv[argv.index("--model") + 1] == "gemini-2.5-pro"
    assert (c.name, c.program, c.install_hint) == ("gemini", "gemini", "npm install -g @google/gemini-cli")


def test_env(tmp_path: Path) -> None:
    c = GeminiCoder()
    ctx = make_ctx(tmp_path)
    env = c.env(ctx)
    assert Path(env["GEMINI_CLI_HOME"]).is_relative_to(ctx.attempt_dir)
    assert env["GEMINI_CLI_TRUST_WORKSPACE"] == "true" and env["PWD"] == str(ctx.workdir)
    assert c.settings_path(ctx) == Path(env["GEMINI_CLI_HOME"]) / ".gemini" / "settings.json"


def test_prepare_registers_ask_human(
    tmp_path: Path, user_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", "k")
    c = GeminiCoder()
    ctx = make_ctx(tmp_path, mcp_command=("python", "-m", "fleet_tui.scheduler.humans.mcp_ask_human"),
                   mcp_env={"FLEET_TASK_ID": "t1"})  # fmt: skip
    c.prepare(ctx)
    s = json.loads(c.settings_path(ctx).read_text())
    server = s["mcpServers"]["ask_human"]
    assert server["command"] == "python"
    assert server["args"] == ["-m", "fleet_tui.scheduler.humans.mcp_ask_human"]
    assert server["env"] == {"FLEET_TASK_ID": "t1"}
    assert server["trust"] is True and server["timeout"] >= 3600_000
    assert s["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert list((user_home / ".gemini").iterdir()) == []  # the user's home is untouched


def test_prepare_keeps_the_users_settings_and_servers(
    tmp_path: Path, user_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", "k")
    user = {
        "model": {"name": "gemini-2.5-flash"},
        "mcpServers": {"facts": {"command": "facts"}},
        "general": {"vimMode": True},
        "mcp": {"allowed": ["facts"]},
    }
    path = user_home / ".gemini" / "settings.json"
    path.write_text(json.dumps(user))
    path.chmod(0o644)
    (user_home / ".gemini" / "GEMINI.md").write_text("context")
    c = GeminiCoder()
    ctx = make_ctx(tmp_path, mcp_command=("ask",))
    c.prepare(ctx)
    s = json.loads(c.settings_path(ctx).read_text())
    assert s["model"] == {"name": "gemini-2.5-flash"}
    assert s["general"]["vimMode"] is True and s["general"]["enableAutoUpdate"] is False
    assert sorted(s["mcpServers"]) == ["ask_human", "facts"]
    assert s["mcp"]["allowed"] == ["facts", "ask_human"]  # an allow-list must not hide ask_human
    assert c.settings_path(ctx).stat().st_mode & 0o777 == 0o600
    assert (c.settings_path(ctx).parent / "GEMINI.md").is_symlink()
    assert json.loads(path.read_text()) == user  # untouched
    setup = c.setup()
    assert setup.mcp_servers == ("facts", "ask_human") and setup.model == "gemini-2.5-flash"
    # fleet-only: the user's servers are left out, and extensions' servers are not allowed
    ctx = make_ctx(tmp_path / "b", mcp_command=("ask",), user_mcp=False)
    c.prepare(ctx)
    assert list(json.loads(c.settings_path(ctx).read_text())["mcpServers"]) == ["ask_human"]
    argv = c.argv(ctx)
    assert argv[argv.index("--allowed-mcp-server-names") + 1] == "ask_human"


def test_prepare_without_mcp_or_auth(tmp_path: Path, user_home: Path) -> None:
    c = GeminiCoder()
    ctx = make_ctx(tmp_path)
    c.prepare(ctx)
    s = json.loads(c.settings_path(ctx).read_text())
    assert "mcpServers" not in s and "security" not in s  # no auth: gemini exits 41 (auth_failed)


def test_prepare_auth_from_task_env_and_user_login(tmp_path: Path, user_home: Path) -> None:
    c = GeminiCoder()
    ctx = make_ctx(tmp_path, env=(("GOOGLE_GENAI_USE_VERTEXAI", "true"),))
    c.prepare(ctx)
    assert json.loads(c.settings_path(ctx).read_text())["security"]["auth"]["selectedType"] == "vertex-ai"

    (user_home / ".gemini" / "settings.json").write_text(
        json.dumps({"security": {"auth": {"selectedType": "oauth-personal"}}})
    )
    (user_home / ".gemini" / "oauth_creds.json").write_text("{}")
    ctx = make_ctx(tmp_path / "b")
    c.prepare(ctx)
    c.prepare(ctx)  # idempotent
    d = c.settings_path(ctx).parent
    assert (
        json.loads((d / "settings.json").read_text())["security"]["auth"]["selectedType"] == "oauth-personal"
    )
    assert (d / "oauth_creds.json").is_symlink()
    assert (d / "oauth_creds.json").resolve() == (user_home / ".gemini" / "oauth_creds.json").resolve()


def test_normalizer_factory(tmp_path: Path) -> None:
    n = GeminiCoder().normalizer("t9", 3, start_seq=5, attempt_dir=tmp_path)
    assert isinstance(n, GeminiNormalizer) and n.seq == 5 and n.attempt_dir == tmp_path
