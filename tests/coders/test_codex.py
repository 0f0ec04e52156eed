"""The Codex coder against every Codex fixture stream and rollout, plus its argv/env/CODEX_HOME.

The fixtures live in the repository (``tests/fixtures/streams``);
PROVENANCE.md there says which lines are real codex-cli 0.171 captures. The rollout lines in
``ROLLOUT_*`` below were copied from a real 0.171 run against tests/fakeapi (trimmed).
"""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import pytest

from fleet_tui.coders.base import AttemptContext, get_coder
from fleet_tui.coders.codex import CodexCoder, CodexNormalizer, parse_try_again
from fleet_tui.scheduler.model import EVENT_KINDS, Event, Task, TaskSpec
from fleet_tui.scheduler.states import TaskStatus

STREAMS = Path(__file__).resolve().parents[1] / "fixtures" / "streams"
FILES = sorted(p.name for p in STREAMS.glob("codex-*.jsonl") if "rollout" not in p.name)
ROLLOUT = "codex-rollout-token-count.jsonl"


def lines(name: str) -> list[str]:
    return (STREAMS / name).read_text(encoding="utf-8").splitlines()


def run(name: str, attempt_dir: Path | None = None) -> tuple[list[Event], CodexNormalizer]:
    n = CodexNormalizer("t1", 1, attempt_dir=attempt_dir)
    events: list[Event] = []
    for i, line in enumerate(lines(name)):
        events += n.feed(line, 1000.0 + i)
    return events, n


def kinds(events: list[Event]) -> list[str]:
    return [e.kind for e in events]


def write_rollout(attempt_dir: Path, text: str, name: str = "rollout-2026-11-29T09-02-07-x.jsonl") -> Path:
    d = attempt_dir / "codex_home" / "sessions" / "2026" / "11" / "29"
    d.mkdir(parents=True, exist_ok=True)
    p = d / name
    with p.open("a", encoding="utf-8") as f:
        f.write(text)
    return p


def test_fixtures_are_there() -> None:
    assert len(FILES) >= 10, f"expected the Codex fixtures in {STREAMS}"
    assert (STREAMS / ROLLOUT).is_file()


@pytest.mark.parametrize("name", FILES)
def test_every_fixture_normalizes(name: str) -> None:
    events, _ = run(name)
    assert events[0].kind == "session_started" and events[0].session_id
    assert events[-1].kind == "result"
    assert all(e.kind in EVENT_KINDS for e in events)
    assert [e.seq for e in events] == list(range(len(events)))
    calls = [e for e in events if e.kind == "tool_call"]
    results = [e for e in events if e.kind == "tool_result"]
    assert sorted(str(c.tool_id) for c in calls) == sorted(str(r.tool_id) for r in results)
    for r in results:
        (call,) = [c for c in calls if c.tool_id == r.tool_id]
        assert call.seq < r.seq and call.tool == r.tool


EXPECTED_KINDS = {
    "codex-success-tool.jsonl": [
        "session_started",
        "thinking",
        "tool_call",
        "tool_result",
        "tool_call",
        "tool_result",
        "tool_call",
        "tool_result",
        "text",
        "usage",
        "result",
    ],
    "codex-real-local-0.171-probe.jsonl": [
        "session_started",
        "text",
        "tool_call",
        "tool_result",
        "text",
        "usage",
        "result",
    ],
    "codex-real-local-0.171-shell.jsonl": [
        "session_started",
        "error",
        "text",
        "tool_call",
        "tool_result",
        "text",
        "usage",
        "result",
    ],
    "codex-real-local-0.171-mcp.jsonl": [
        "session_started",
        "tool_call",
        "tool_result",
        "text",
        "usage",
        "result",
    ],
    "codex-real-local-0.171-429-then-ok.jsonl": [
        "session_started",
        "api_retry",
        "api_retry",
        "tool_call",
        "tool_result",
        "text",
        "usage",
        "result",
    ],
    "codex-real-local-0.171-429-exhausted.jsonl": ["session_started"]
    + ["api_retry"] * 5
    + ["error", "result"],
    "codex-real-local-0.171-quota.jsonl": ["session_started", "error", "result"],
    "codex-real-verbatim-0.46.jsonl": [
        "session_started",
        "thinking",
        "tool_call",
        "tool_result",
        "text",
        "usage",
        "result",
    ],
    "codex-rate-limit.jsonl": ["session_started", "error", "result"],
    "codex-auth-401.jsonl": ["session_started", "api_retry", "api_retry", "error", "result"],
    "codex-mcp-cancelled.jsonl": ["session_started", "tool_call", "tool_result", "text", "usage", "result"],
}


@pytest.mark.parametrize("name", sorted(EXPECTED_KINDS))
def test_kinds_in_order(name: str) -> None:
    events, _ = run(name)
    assert kinds(events) == EXPECTED_KINDS[name]


def test_every_fixture_has_expected_kinds() -> None:
    assert set(FILES) <= set(EXPECTED_KINDS), "a new fixture needs its expected kinds here"


EXPECTED_OUTCOMES = {
    "codex-success-tool.jsonl": "success",
    "codex-real-local-0.171-probe.jsonl": "success",
    "codex-real-local-0.171-shell.jsonl": "success",
    "codex-real-local-0.171-mcp.jsonl": "success",
    "codex-real-local-0.171-429-then-ok.jsonl": "success",
    "codex-real-verbatim-0.46.jsonl": "success",
    "codex-mcp-cancelled.jsonl": "success",  # the turn completed; the agent says what failed
    "codex-real-local-0.171-429-exhausted.jsonl": "rate_limited",
    "codex-rate-limit.jsonl": "rate_limited",
    "codex-auth-401.jsonl": "auth_failed",
    "codex-real-local-0.171-quota.jsonl": "auth_failed",  # insufficient_quota: billing, needs a human
}


@pytest.mark.parametrize("name", sorted(EXPECTED_OUTCOMES))
def test_outcomes(name: str) -> None:
    events, n = run(name)
    result = events[-1]
    out = n.outcome(1 if result.is_error else 0)
    assert out.kind == EXPECTED_OUTCOMES[name], out
    assert out.cost_usd is None  # Codex reports no cost
    assert out.claimed_success is (out.kind == "success")
    assert out.result_text == result.text
    if out.kind != "success":
        assert out.detail and result.is_error


def test_pinned_wording() -> None:
    """Codex's stdout offers only text; the wording the outcome relies on, as 0.171 prints it."""
    _, n = run("codex-real-local-0.171-429-exhausted.jsonl")
    assert n.turn_failed is not None and "429 Too Many Requests" in n.turn_failed
    assert n.reconnects == 5
    _, n = run("codex-real-local-0.171-quota.jsonl")
    assert n.turn_failed == "Quota exceeded. Check your plan and billing details."
    _, n = run("codex-rate-limit.jsonl")
    out = n.outcome(1)
    assert "You've hit your usage limit" in out.detail
    assert out.resets_at == parse_try_again("try again at Mar 10th, 2026 3:39 AM.")
    assert out.resets_at is not None


def test_result_text_is_the_last_agent_message() -> None:
    events, n = run("codex-success-tool.jsonl")
    assert events[-1].text == "Switched the test DB to PostgreSQL 16; all 42 tests pass."
    assert n.outcome(0).result_text == events[-1].text


def test_tool_calls_and_results() -> None:
    events, _ = run("codex-success-tool.jsonl")
    calls = [e for e in events if e.kind == "tool_call"]
    assert [c.tool for c in calls] == ["shell", "mcp__ask_human__ask_human", "file_change"]
    assert calls[0].tool_input == {"command": "/bin/bash -lc 'pytest -q'"}
    results = [e for e in events if e.kind == "tool_result"]
    assert results[0].is_error and results[0].text == "2 failed, 40 passed in 1.93s\n"  # exit 1
    assert not results[1].is_error and results[1].text == "Yes, use PostgreSQL 16."
    assert results[2].text == "update /home/dev/repo/tests/conftest.py"


def test_cancelled_mcp_call_without_ids_pairs_up() -> None:
    events, _ = run("codex-mcp-cancelled.jsonl")
    call, res = [e for e in events if e.kind in ("tool_call", "tool_result")]
    assert call.tool == "mcp__minimal__count" and call.tool_id == res.tool_id
    assert res.is_error and res.text == "user cancelled MCP tool call"


def test_usage_from_turn_completed() -> None:
    events, n = run("codex-real-verbatim-0.46.jsonl")
    (u,) = [e.usage for e in events if e.kind == "usage"]
    assert u is not None
    # input_tokens includes the cached part: 6040 = 1048 fresh + 4992 cached
    assert (u.input_tokens, u.cache_read_tokens, u.output_tokens) == (1048, 4992, 129)
    assert n.total_usage.total == 6040 + 129


def test_retry_notices_are_not_terminal() -> None:
    events, _ = run("codex-auth-401.jsonl")
    retries = [e for e in events if e.kind == "api_retry"]
    assert len(retries) == 2 and all("Reconnecting..." in (e.text or "") for e in retries)


def test_warning_item_is_a_non_fatal_error() -> None:
    events, _ = run("codex-real-local-0.171-shell.jsonl")
    err = events[1]
    assert err.kind == "error" and not err.is_error and "Model metadata" in (err.text or "")


# -- the rollout file -------------------------------------------------------------------------


def test_rollout_token_count(tmp_path: Path) -> None:
    d = tmp_path / "codex_home" / "sessions" / "2026" / "04" / "16"
    d.mkdir(parents=True)
    shutil.copy(STREAMS / ROLLOUT, d / "rollout-2026-04-16T22-08-13-019a2d7a.jsonl")
    n = CodexNormalizer("t1", 1, attempt_dir=tmp_path)
    events = n.poll(1.0)
    assert kinds(events) == ["usage", "rate_limit"]
    usage, rl_ev = events
    assert usage.usage is not None and usage.usage.total == 24117 + 412
    assert (usage.context_tokens, usage.context_window) == (12531, 258400)
    rl = rl_ev.rate_limit
    assert rl is not None
    assert (rl.account, rl.status, rl.utilization, rl.window) == ("codex", "allowed", 0.12, "five_hour")
    assert rl.resets_at == 1776394093.0
    assert n.poll(2.0) == []  # read incrementally: nothing new
    # stdout's turn.completed with the same cumulative total adds nothing more
    more = n.feed(
        json.dumps(
            {
                "type": "turn.completed",
                "usage": {"input_tokens": 24117, "cached_input_tokens": 19200, "output_tokens": 412},
            }
        ),
        3.0,
    )
    assert sum(e.usage.total for e in more if e.usage) == 0
    assert n.total_usage.total == 24117 + 412


TOKEN_COUNT = (
    '{"timestamp":"2026-11-29T09:01:48.973Z","ordinal":15,"type":"event_msg","payload":{"type":"token_count",'
    '"info":{"total_token_usage":{"input_tokens":10298,"cached_input_tokens":0,"cache_write_input_tokens":0,'
    '"output_tokens":88,"reasoning_output_tokens":0,"total_tokens":10386},"last_token_usage":{"input_tokens":'
    '10298,"cached_input_tokens":0,"cache_write_input_tokens":0,"output_tokens":88,"reasoning_output_tokens":0,'
    '"total_tokens":10386},"last_usage_includes_reasoning":false,"model_context_window":258400},'
    '"rate_limits":{"limit_id":"codex","limit_name":null,"primary":null,"secondary":null,"credits":null}}}\n'
)
ROLLOUT_429 = (
    '{"timestamp":"2026-11-29T09:02:08.046Z","ordinal":9,"type":"event_msg","payload":{"type":"task_complete",'
    '"last_agent_message":null,"error":{"message":"exceeded retry limit, last status: 429 Too Many Requests",'
    '"codex_error_info":{"response_too_many_failed_attempts":{"http_status_code":429}}}}}\n'
)
ROLLOUT_401 = (
    '{"timestamp":"2026-11-29T09:02:15.047Z","ordinal":9,"type":"event_msg","payload":{"type":"task_complete",'
    '"error":{"message":"unexpected status 401 Unauthorized","codex_error_info":'
    '{"http_connection_failed":{"http_status_code":401}}}}}\n'
)


def test_rollout_is_read_incrementally_and_partial_lines_wait(tmp_path: Path) -> None:
    n = CodexNormalizer("t1", 1, attempt_dir=tmp_path)
    assert n.poll(1.0) == []  # no codex_home yet
    half = len(TOKEN_COUNT) // 2
    p = write_rollout(tmp_path, TOKEN_COUNT[:half])
    assert n.poll(2.0) == []  # a partial line is left for later
    with p.open("a", encoding="utf-8") as f:
        f.write(TOKEN_COUNT[half:])
    events = n.poll(3.0)
    assert kinds(events) == ["usage"]  # null windows: no rate-limit reading
    assert events[0].usage is not None and events[0].usage.total == 10386
    assert events[0].context_window == 258400


def test_rollout_error_info_classifies_the_outcome(tmp_path: Path) -> None:
    # the stdout says nothing about the status; the rollout's codex_error_info does
    n = CodexNormalizer("t1", 1, attempt_dir=tmp_path)
    n.feed('{"type":"thread.started","thread_id":"x"}', 1.0)
    n.feed('{"type":"turn.failed","error":{"message":"something went wrong"}}', 2.0)
    write_rollout(tmp_path, ROLLOUT_429)
    assert n.outcome(1).kind == "rate_limited"
    n = CodexNormalizer("t1", 1, attempt_dir=tmp_path / "b")
    n.feed('{"type":"turn.failed","error":{"message":"something went wrong"}}', 2.0)
    write_rollout(tmp_path / "b", ROLLOUT_401)
    assert n.outcome(1).kind == "auth_failed"


def test_rollout_rejected_window(tmp_path: Path) -> None:
    line = json.dumps(
        {
            "type": "event_msg",
            "payload": {
                "type": "token_count",
                "info": None,
                "rate_limits": {
                    "primary": {"used_percent": 40.0, "window_minutes": 300, "resets_at": 1800000000},
                    "secondary": {"used_percent": 100.0, "window_minutes": 10080, "resets_at": 1800500000},
                },
            },
        }
    )
    write_rollout(tmp_path, line + "\n")
    n = CodexNormalizer("t1", 1, attempt_dir=tmp_path)
    n.feed('{"type":"turn.failed","error":{"message":"stream error"}}', 1.0)
    (ev,) = n.poll(2.0)
    assert ev.rate_limit is not None
    assert (ev.rate_limit.status, ev.rate_limit.window) == ("rejected", "seven_day")
    out = n.outcome(1)
    assert out.kind == "rate_limited" and out.resets_at == 1800500000.0


def test_outcome_reads_unpolled_rollout_and_keeps_its_events(tmp_path: Path) -> None:
    n = CodexNormalizer("t1", 1, start_seq=10, attempt_dir=tmp_path)
    n.feed('{"type":"thread.started","thread_id":"x"}', 1.0)
    write_rollout(tmp_path, TOKEN_COUNT)
    n.outcome(None)
    events = n.poll(5.0)
    assert kinds(events) == ["usage"] and events[0].seq == 11


@pytest.mark.parametrize(
    "line",
    [
        "Reading additional input from stdin...",
        "{not json",
        "[]",
        '{"type": 5}',
        '{"type": "item.completed", "item": "nope"}',
        '{"type": "item.completed", "item": {"type": "command_execution", "exit_code": "x"}}',
        '{"type": "item.started", "item": {"type": "mcp_tool_call"}}',
        '{"type": "turn.completed", "usage": "lots"}',
        '{"type": "turn.failed", "error": "str"}',
        '{"type": "error"}',
        '{"type": "something.new"}',
    ],
)
def test_garbage_never_raises(line: str) -> None:
    n = CodexNormalizer("t1", 1)
    events = n.feed(line, 1.0)
    assert all(e.kind in EVENT_KINDS for e in events)
    if not line.startswith("{") or line.startswith("{not"):
        assert kinds(events) == ["text"] and events[0].text == line
    n.outcome(None)


def test_outcome_without_a_turn_end() -> None:
    n = CodexNormalizer("t1", 1)
    n.feed('{"type":"thread.started","thread_id":"x"}', 1.0)
    out = n.outcome(-15)
    assert out.kind == "failure" and "-15" in out.detail
    n.feed(
        '{"type":"error","message":"Reconnecting... 1/5 (exceeded retry limit, last status: 429 Too Many '
        'Requests)"}',
        2.0,
    )
    n.feed('{"type":"error","message":"stream disconnected before completion"}', 3.0)
    assert n.outcome(None).kind == "failure"


def test_context_window_exceeded_is_context_pressure() -> None:
    n = CodexNormalizer("t1", 1)
    n.feed(
        '{"type":"turn.failed","error":{"message":"Codex ran out of room in the model\'s context window. '
        'Start a new thread or clear earlier history before retrying."}}',
        1.0,
    )
    assert n.outcome(1).kind == "context_pressure"


# -- the coder --------------------------------------------------------------------------------


def make_ctx(
    tmp_path: Path, mcp: bool = True, model: str | None = None, env: tuple[tuple[str, str], ...] = ()
) -> AttemptContext:
    spec = TaskSpec(name="demo", prompt="Write marker.txt", env=env)
    task = Task(id="t1", spec=spec, status=TaskStatus.RUNNING, attempt=2)
    return AttemptContext(
        task=task,
        attempt=2,
        prompt="Write marker.txt, then stop.",
        workdir=tmp_path / "work",
        attempt_dir=tmp_path / "attempts" / "2",
        home=tmp_path / "home",
        model=model,
        mcp_command=("python3", "-m", "fleet_tui.scheduler.humans.mcp_ask_human") if mcp else (),
        mcp_env={"FLEET_TASK_ID": "t1", "FLEET_ATTEMPT": "2"} if mcp else {},
    )


@pytest.fixture
def user_codex_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for the user's ~/.codex, so the tests never read the real one."""
    home = tmp_path / "user_codex"
    home.mkdir()
    monkeypatch.setenv("CODEX_HOME", str(home))
    return home


def test_argv_env_stdin(tmp_path: Path) -> None:
    coder = CodexCoder()
    ctx = make_ctx(tmp_path, model="gpt-5.5")
    argv = coder.argv(ctx)
    assert argv[:3] == ["codex", "exec", "--json"]
    assert argv[argv.index("-C") + 1] == str(ctx.workdir)
    assert "--skip-git-repo-check" in argv
    assert "--dangerously-bypass-approvals-and-sandbox" in argv
    assert argv[argv.index("-m") + 1] == "gpt-5.5"
    assert argv[-1] == "-" and coder.stdin(ctx) == b"Write marker.txt, then stop."
    assert "-m" not in coder.argv(make_ctx(tmp_path))
    assert coder.env(ctx) == {"CODEX_HOME": str(ctx.attempt_dir / "codex_home")}


USER_CONFIG = """model = "gpt-5.5"
model_provider = "proxy"

[model_providers.proxy]
name = "My proxy"
base_url = "http://127.0.0.1:9/v1"
wire_api = "responses"
env_key = "PROXY_API_KEY"

[mcp_servers.other]
command = "x"

[profiles.fast]
model = "m"
"""


def test_prepare_keeps_the_users_config_and_adds_ask_human(tmp_path: Path, user_codex_home: Path) -> None:
    (user_codex_home / "config.toml").write_text(USER_CONFIG)
    (user_codex_home / "config.toml").chmod(0o644)
    (user_codex_home / "auth.json").write_text('{"OPENAI_API_KEY": "sk-user"}')
    (user_codex_home / "AGENTS.md").write_text("be brief")
    coder = CodexCoder()
    ctx = make_ctx(tmp_path)
    coder.prepare(ctx)
    home = ctx.attempt_dir / "codex_home"
    cfg = tomllib.loads((home / "config.toml").read_text())
    assert cfg["model"] == "gpt-5.5" and cfg["profiles"]["fast"]["model"] == "m"  # the user's settings
    assert cfg["model_provider"] == "proxy"
    assert cfg["model_providers"]["proxy"]["base_url"] == "http://127.0.0.1:9/v1"
    assert sorted(cfg["mcp_servers"]) == ["ask_human", "other"]  # the user's server stays
    assert cfg["mcp_servers"]["other"] == {"command": "x"}
    server = cfg["mcp_servers"]["ask_human"]
    assert server["command"] == "python3"
    assert server["args"] == ["-m", "fleet_tui.scheduler.humans.mcp_ask_human"]
    assert server["env"] == {"FLEET_TASK_ID": "t1", "FLEET_ATTEMPT": "2"}
    assert server["tool_timeout_sec"] >= 3600
    assert server["default_tools_approval_mode"] == "approve"
    assert server["tools"]["ask_human"]["approval_mode"] == "approve"
    assert json.loads((home / "auth.json").read_text()) == {"OPENAI_API_KEY": "sk-user"}  # login copied
    for name in ("config.toml", "auth.json"):  # private copies, even of a 0644 original
        assert (home / name).stat().st_mode & 0o777 == 0o600
    assert (home / "AGENTS.md").is_symlink()
    assert (user_codex_home / "config.toml").read_text() == USER_CONFIG  # untouched
    assert (user_codex_home / "auth.json").read_text() == '{"OPENAI_API_KEY": "sk-user"}'


def test_fleet_only_leaves_the_users_servers_out(tmp_path: Path, user_codex_home: Path) -> None:
    (user_codex_home / "config.toml").write_text(USER_CONFIG)
    ctx = make_ctx(tmp_path)
    ctx = AttemptContext(**{**ctx.__dict__, "user_mcp": False})
    CodexCoder().prepare(ctx)
    cfg = tomllib.loads((ctx.attempt_dir / "codex_home" / "config.toml").read_text())
    assert list(cfg["mcp_servers"]) == ["ask_human"] and cfg["model_provider"] == "proxy"


def test_setup_names_config_servers_and_model(user_codex_home: Path) -> None:
    (user_codex_home / "config.toml").write_text(USER_CONFIG)
    s = CodexCoder().setup()
    assert s.config_files == (str(user_codex_home / "config.toml"),)
    assert s.mcp_servers == ("other", "ask_human")
    assert s.model == "gpt-5.5 (provider proxy)"
    assert CodexCoder().setup(user_mcp=False).mcp_servers == ("ask_human",)


def test_prepare_without_a_user_config(tmp_path: Path, user_codex_home: Path) -> None:
    ctx = make_ctx(tmp_path, mcp=False)
    CodexCoder().prepare(ctx)
    home = ctx.attempt_dir / "codex_home"
    assert "mcp_servers" not in tomllib.loads((home / "config.toml").read_text())
    assert not (home / "auth.json").exists()


def test_a_prompt_over_codexs_input_limit_goes_into_a_file(tmp_path: Path, user_codex_home: Path) -> None:
    from fleet_tui.coders.codex import MAX_INPUT_CHARS

    coder = CodexCoder()
    big = "x" * (MAX_INPUT_CHARS + 10)
    ctx = AttemptContext(**{**make_ctx(tmp_path).__dict__, "prompt": big})
    coder.prepare(ctx)
    note = (coder.stdin(ctx) or b"").decode()
    assert len(note) < 1000 and str(coder.prompt_file(ctx)) in note
    assert coder.prompt_file(ctx).read_text() == big
    assert coder.prompt_file(ctx).stat().st_mode & 0o777 == 0o600
    assert big not in coder.argv(ctx)


def test_registered_and_named() -> None:
    coder = get_coder("codex")
    assert isinstance(coder, CodexCoder)
    assert (coder.name, coder.program) == ("codex", "codex")
    assert "npm install -g @openai/codex" in coder.install_hint
    n = coder.normalizer("t1", 2, 5, Path("/tmp"))
    assert isinstance(n, CodexNormalizer) and n.seq == 5
