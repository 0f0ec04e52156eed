"""The real agent CLIs driven THROUGH fleet-tui (add, run --until-idle, status/logs/questions/answer).

Why: tests/coders/test_real_*.py prove that each coder's flags and normalizer work with the
installed program when the coder is called directly. These tests prove the whole path a user
takes: the engine claims the task, the shim starts the real ``claude`` / ``codex`` / ``opencode`` /
``gemini`` with the environment of the ``fleet-tui run`` process, the runner normalizes its
stream into the store, and the outcome decides the task's next state (done; back to the queue
without using a retry on a rate limit; an ask_human question answered with ``fleet-tui answer``).
The model is a scripted fake API on loopback (tests/fakeapi), so no network and no account are
needed. A missing program skips the test with an install hint, except under ``CI=true`` where it
is a failure.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.fakeapi import HttpError, Request, Text, ToolCall, Turn, require_program
from tests.fakeapi.anthropic import serve_anthropic, tool_results
from tests.fakeapi.gemini import function_responses, gemini_tool_names, serve_gemini
from tests.fakeapi.openai_responses import (
    function_outputs,
    offers_tool_search,
    serve_openai_responses,
    tool_search_outputs,
)
from tests.fakeapi.user_mcp import FACT
from tests.fakeapi.user_setups import (
    CLAUDE_MODEL,
    CODEX_MODEL,
    GEMINI_MODEL,
    OPENCODE_MODEL,
    SCRUB,
    claude_user,
    codex_user,
    gemini_user,
    opencode_user,
    tree,
)

from fleet_tui.scheduler.store.opener import open_store
from helpers import by_name, fleet, fleet_bg, fleet_env, wait_for

pytestmark = [pytest.mark.realcli, pytest.mark.timeout(150)]

#: how long one `fleet-tui run --until-idle` may take (the scripted runs take a few seconds)
RUN_TIMEOUT_S = 120
ASK_ANSWER = "Use PostgreSQL 16."
#: a fake API's script: turns, or (turn, times) with times None for "forever"
Steps = list[Turn | tuple[Turn, int | None]]


@pytest.fixture
def claude_program() -> str:
    return require_program("claude")


@pytest.fixture
def codex_program() -> str:
    return require_program("codex")


@pytest.fixture
def opencode_program() -> str:
    return require_program("opencode")


@pytest.fixture
def gemini_program() -> str:
    return require_program("gemini")


class Fleet:
    """One fleet home with a scratch working directory and a scratch $HOME for the agent CLIs."""

    def __init__(self, tmp_path: Path) -> None:
        self.home = tmp_path / "fleet"
        self.work = tmp_path / "work"
        self.work.mkdir()
        (self.work / "README").write_text("a scratch repo\n")
        self.user_home = tmp_path / "userhome"  # the CLIs never see the real user's config
        self.user_home.mkdir()
        self.logs = tmp_path
        self.env: dict[str, str] = fleet_env(self.home, HOME=str(self.user_home))
        # a failure retries at once, a stuck agent is stopped quickly: a test never waits minutes
        for key, value in (("retry_backoff_s", "0"), ("stall_min", "1.5"), ("timeout_min", "3")):
            self("config", "set", key, value)

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return fleet(self.home, *args, check=check, timeout=timeout, env=self.env)

    def add(self, coder: str, name: str, prompt: str, *extra: str) -> str:
        out = self("add", prompt, "--coder", coder, "--name", name, "--cwd", str(self.work), *extra)
        return out.stdout.strip()

    def run_until_idle(self, *extra: str) -> subprocess.CompletedProcess[str]:
        """Exit 0 (all finished), 3 (a task needs a person) or 4 (``--max-wait`` left a wait)."""
        p = self("run", "--until-idle", *extra, timeout=RUN_TIMEOUT_S, check=False)
        assert p.returncode in (0, 3, 4), (p.returncode, p.stdout, p.stderr)
        return p

    def run_bg(self) -> subprocess.Popen[bytes]:
        return fleet_bg(self.home, "run", "--until-idle", env=self.env, log=self.logs / "run.log")

    def run_log(self) -> str:
        p = self.logs / "run.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def task(self, name: str) -> dict[str, Any]:
        return by_name(self.home)[name]

    def logs_json(self, name: str) -> list[dict[str, Any]]:
        out = self("logs", name, "--json").stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def questions(self) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = json.loads(self("questions", "--json").stdout)
        return data

    def stderr_of(self, name: str) -> str:
        t = self.task(name)
        p = self.home / "tasks" / t["id"] / "attempts" / str(t["attempt"]) / "stderr.log"
        return p.read_text(errors="replace")[-3000:] if p.exists() else "<no stderr.log>"


@pytest.fixture
def fl(tmp_path: Path) -> Fleet:
    return Fleet(tmp_path)


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in events]


def of_kind(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == kind]


def assert_tool_flow(events: list[dict[str, Any]], tool: str) -> dict[str, Any]:
    """A tool_call of ``tool``, its tool_result, usage and a final successful result, in order."""
    ks = kinds(events)
    calls = [e for e in of_kind(events, "tool_call") if e.get("tool") == tool]
    assert len(calls) == 1, ks
    (call,) = calls
    results = [e for e in of_kind(events, "tool_result") if e.get("tool_id") == call["tool_id"]]
    assert len(results) == 1 and not results[0].get("is_error"), results
    usage = of_kind(events, "usage")
    assert usage and sum(sum(v for v in e["usage"].values() if isinstance(v, int)) for e in usage) > 0
    final = of_kind(events, "result")
    assert final and not final[-1].get("is_error"), final
    assert events.index(call) < events.index(results[0]) < events.index(final[-1])
    return results[0]


def assert_done(fl: Fleet, name: str) -> dict[str, Any]:
    t = fl.task(name)
    assert t["status"] == "done", (t, fl.stderr_of(name))
    assert t["last_outcome"] == "success" and t["retries_used"] == 0, t
    return t


@dataclass
class LimitedRun:
    """A fleet whose one task (``limited``) met a 429 that never ended, after `run --until-idle`."""

    fl: Fleet
    coder: str
    idle_report: str  # what `run --until-idle` printed
    model_calls: int


def assert_rate_limited_requeued(lr: LimitedRun) -> None:
    """The attempt is ``rate_limited``; the task is back in the queue, its retry unused, and the
    account's limit is in the store, so every task of that coder waits on it."""
    fl = lr.fl
    t = fl.task("limited")
    assert t["last_outcome"] == "rate_limited", (t, fl.stderr_of("limited"))
    assert t["status"] == "queued" and t["retries_used"] == 0 and t["attempt"] == 1, t
    assert (t["reason"] or "").startswith("rate limited"), t
    assert t["waiting"], t  # it does not start again before the limit's back-off ends
    assert "limited: " in lr.idle_report, lr.idle_report
    store = open_store(None, str(fl.home))
    try:
        limits = {rl.account: (rl, until) for rl, until in store.rate_limits()}
    finally:
        store.close()
    rl, until = limits[lr.coder]
    assert rl.status == "rejected" and until is not None and until > time.time(), limits
    # the gauge's source, seen through `plan`: another task of the same account is held by it
    fl.add(lr.coder, "sibling", "another task of the same account")
    line = next(ln for ln in fl("plan").stdout.splitlines() if ln.startswith("sibling:"))
    assert f"rate limit {lr.coder} resets" in line, line


def test_rate_limited_task_itself_names_the_rate_limit(claude_limited: LimitedRun) -> None:
    """The task whose attempt was rate-limited should say so in `waiting`, `plan` and the idle
    report (DESIGN 4/11: "rate limit resets 14:05"); they say "waits until HH:MM" instead."""
    fl = claude_limited.fl
    line = next(ln for ln in fl("plan").stdout.splitlines() if ln.startswith("limited:"))
    assert "rate limit" in line, line
    assert "rate limit" in (fl.task("limited")["waiting"] or ""), fl.task("limited")
    assert "rate limit" in claude_limited.idle_report, claude_limited.idle_report


# -- Claude Code ------------------------------------------------------------------------------


def claude_env(fl: Fleet, url: str, **extra: str) -> None:
    fl.env.update(
        ANTHROPIC_BASE_URL=url,
        ANTHROPIC_API_KEY="sk-ant-fake",
        ANTHROPIC_AUTH_TOKEN="",
        CLAUDE_CODE_OAUTH_TOKEN="",
        **extra,
    )


def test_claude_write_tool_then_done(claude_program: str, fl: Fleet) -> None:
    target = fl.work / "hello.txt"
    script: Steps = [
        ToolCall("Write", {"file_path": str(target), "content": "hi from the fake model\n"}, text="Writing."),
        Text("Created hello.txt."),
    ]
    with serve_anthropic(script) as (url, rec):
        claude_env(fl, url)
        fl.add("claude", "hello", "Create hello.txt")
        fl.run_until_idle()
        calls = rec.model_requests()
    assert target.read_text() == "hi from the fake model\n", fl.stderr_of("hello")
    t = assert_done(fl, "hello")
    assert t["result_text"] == "Created hello.txt." and t["coder"] == "claude"
    assert t["tokens"] and t["tokens"] > 0 and t["cost_usd"] is not None, t
    events = fl.logs_json("hello")
    assert kinds(events)[0] == "session_started", kinds(events)
    result = assert_tool_flow(events, "Write")
    assert of_kind(events, "result")[-1].get("cost_usd") is not None
    (sent,) = tool_results(calls[1])  # the tool's result went back to the model
    assert sent["tool_use_id"] == result["tool_id"]


def test_claude_429_then_success(claude_program: str, fl: Fleet) -> None:
    script: Steps = [(HttpError(429, "slow down (fake)", retry_after=0), 2), Text("Finished after two 429s.")]
    with serve_anthropic(script) as (url, rec):
        claude_env(fl, url)
        fl.add("claude", "retrying", "Say something")
        fl.run_until_idle()
        statuses = [r.status for r in rec.model_requests()]
    assert statuses == [429, 429, 200]
    t = assert_done(fl, "retrying")
    assert t["result_text"] == "Finished after two 429s."
    retries = of_kind(fl.logs_json("retrying"), "api_retry")
    assert len(retries) == 2 and all(e["raw"]["error_status"] == 429 for e in retries), retries


@pytest.fixture(scope="module")
def claude_limited(tmp_path_factory: pytest.TempPathFactory) -> LimitedRun:
    """One run against a 429 that never ends; Claude Code gives up after CLAUDE_CODE_MAX_RETRIES."""
    require_program("claude")
    fl = Fleet(tmp_path_factory.mktemp("claude-limited"))
    script: Steps = [(HttpError(429, "per-minute rate limit (fake)", retry_after=0), None)]
    with serve_anthropic(script) as (url, rec):
        claude_env(fl, url, CLAUDE_CODE_MAX_RETRIES="1")
        fl.add("claude", "limited", "Say something")
        out = fl.run_until_idle("--max-wait", "0")  # the limit never ends: do not sit it out
        calls = len(rec.model_requests())
    return LimitedRun(fl, "claude", out.stdout, calls)


def test_claude_429_forever_requeues_without_a_retry(claude_limited: LimitedRun) -> None:
    assert claude_limited.model_calls == 2  # the first try and one retry, then Claude Code gave up
    retries = of_kind(claude_limited.fl.logs_json("limited"), "api_retry")
    assert len(retries) == 1 and retries[0]["raw"]["error_status"] == 429, retries
    assert_rate_limited_requeued(claude_limited)


def answer_the_question(fl: Fleet, name: str, text: str, run: subprocess.Popen[bytes]) -> None:
    """Wait for the task's question in `questions --json`, then answer it with `fleet-tui answer`."""

    def pending() -> list[dict[str, Any]]:
        if run.poll() is not None:
            raise AssertionError(f"the engine exited before the question came:\n{fl.run_log()}")
        return [q for q in fl.questions() if q["task"] == name]

    try:
        (q,) = wait_for(pending, 60, interval=0.3, what=f"{name}'s question")
    except AssertionError as e:
        events = [
            f"{ev['kind']}: {str(ev.get('text') or ev.get('tool') or '')[:200]}" for ev in fl.logs_json(name)
        ]
        raise AssertionError(f"{e}\nevents: {events[-15:]}\nstderr: {fl.stderr_of(name)}") from e
    assert q["text"] == text and q["status"] == "pending" and q["attempt"] == 1, q
    assert fl.task(name)["asking"] is True
    fl("answer", q["id"], ASK_ANSWER)


def stop(run: subprocess.Popen[bytes]) -> None:
    if run.poll() is None:
        run.terminate()
        try:
            run.wait(timeout=30)
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait(timeout=10)


# -- Codex --------------------------------------------------------------------------------------


def codex_env(fl: Fleet, url: str, retries: int | None = None) -> None:
    """The user's ~/.codex/config.toml names a custom provider at ``url`` (as Codex users do)."""
    for var in SCRUB:
        fl.env.pop(var, None)
    fl.env.update(codex_user(fl.user_home, url, retries=retries))


def shell_call(req: Request) -> ToolCall:
    """Call whichever shell tool this Codex version offers."""
    cmd = "echo ran-by-fake-model > marker.txt && ls"
    if "exec_command" in req.tool_names():
        return ToolCall("exec_command", {"cmd": cmd}, text="Running.")
    return ToolCall("shell", {"command": ["bash", "-lc", cmd]})


def test_codex_shell_tool_then_done(codex_program: str, fl: Fleet) -> None:
    with serve_openai_responses([shell_call, Text("The command ran.")]) as (url, rec):
        codex_env(fl, url)
        fl.add("codex", "marker", "Write marker.txt", "--model", "fake-model")
        fl.run_until_idle()
        calls = rec.model_requests()
    assert (fl.work / "marker.txt").read_text() == "ran-by-fake-model\n", fl.stderr_of("marker")
    t = assert_done(fl, "marker")
    assert t["result_text"] == "The command ran." and t["tokens"] and t["tokens"] > 0, t
    assert t["cost_usd"] in (None, 0, 0.0), t  # Codex reports no cost
    events = fl.logs_json("marker")
    result = assert_tool_flow(events, "shell")
    assert "marker.txt" in (result.get("text") or "")
    assert function_outputs(calls[1])


def test_codex_429_then_success(codex_program: str, fl: Fleet) -> None:
    script: Steps = [(HttpError(429, "slow down (fake)", retry_after=1), 2), Text("Finished after two 429s.")]
    with serve_openai_responses(script) as (url, rec):
        codex_env(fl, url)
        fl.add("codex", "retrying", "Say something", "--model", "fake-model")
        fl.run_until_idle()
        statuses = [r.status for r in rec.model_requests()]
    assert statuses == [429, 429, 200]
    t = assert_done(fl, "retrying")
    assert t["result_text"] == "Finished after two 429s."
    retries = of_kind(fl.logs_json("retrying"), "api_retry")
    assert len(retries) == 2 and all("429" in (e.get("text") or "") for e in retries), retries


@pytest.fixture(scope="module")
def codex_limited(tmp_path_factory: pytest.TempPathFactory) -> LimitedRun:
    """One run against a 429 that never ends; the user's provider sets request_max_retries and
    stream_max_retries to 1."""
    require_program("codex")
    fl = Fleet(tmp_path_factory.mktemp("codex-limited"))
    script: Steps = [(HttpError(429, "per-minute rate limit (fake)", retry_after=1), None)]
    with serve_openai_responses(script) as (url, rec):
        codex_env(fl, url, retries=1)
        fl.add("codex", "limited", "Say something", "--model", "fake-model")
        out = fl.run_until_idle("--max-wait", "0")  # the limit never ends: do not sit it out
        calls = len(rec.model_requests())
    return LimitedRun(fl, "codex", out.stdout, calls)


def test_codex_429_forever_requeues_without_a_retry(codex_limited: LimitedRun) -> None:
    assert codex_limited.model_calls == 2  # the first try and one retry
    assert_rate_limited_requeued(codex_limited)


# -- OpenCode and Gemini: one success flow each -------------------------------------------------


def test_opencode_write_tool_then_done(opencode_program: str, fl: Fleet) -> None:
    target = fl.work / "hello.txt"
    script: Steps = [
        ToolCall("write", {"filePath": str(target), "content": "hi from the fake model\n"}),
        Text("Created hello.txt."),
    ]
    with serve_anthropic(script) as (url, rec):
        for var in SCRUB:
            fl.env.pop(var, None)
        fl.env.update(opencode_user(fl.user_home, url + "/v1"))  # the provider's baseURL, as users set it
        fl.add("opencode", "hello", "Create hello.txt", "--model", "anthropic/claude-sonnet-4-5")
        fl.run_until_idle()
        calls = rec.model_requests()
    assert target.read_text() == "hi from the fake model\n", fl.stderr_of("hello")
    t = assert_done(fl, "hello")
    assert t["result_text"] == "Created hello.txt."
    result = assert_tool_flow(fl.logs_json("hello"), "write")
    (sent,) = tool_results(calls[1])
    assert sent["tool_use_id"] == result["tool_id"]


def test_gemini_write_file_then_done(gemini_program: str, fl: Fleet) -> None:
    target = fl.work / "hello.txt"
    script: Steps = [
        ToolCall("write_file", {"file_path": str(target), "content": "hi from the fake model\n"}),
        Text("Created hello.txt."),
    ]
    with serve_gemini(script) as (url, rec):
        fl.env.update(
            GEMINI_API_KEY="fake-key", GEMINI_CLI_HOME=str(fl.user_home), GOOGLE_GEMINI_BASE_URL=url
        )
        for var in ("GOOGLE_GENAI_USE_GCA", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_API_KEY"):
            fl.env.pop(var, None)
        fl.add("gemini", "hello", "Create hello.txt", "--model", "gemini-2.5-flash")
        fl.run_until_idle()
        calls = rec.model_requests()
    assert target.read_text() == "hi from the fake model\n", fl.stderr_of("hello")
    t = assert_done(fl, "hello")
    assert t["result_text"] == "Created hello.txt."
    assert_tool_flow(fl.logs_json("hello"), "write_file")
    (sent,) = function_responses(calls[1])
    assert sent["name"] == "write_file"


# -- Real users' setups (issue 13) ----------------------------------------------------------------
#
# Each CLI configured in a scratch HOME as its users configure it (tests/fakeapi/user_setups.py):
# a custom provider/base URL and a default model in the CLI's own config, and one MCP server of
# the user's own. One run through fleet-tui per CLI shows all of issue 13 at once: the task is
# done, the fake API saw the user's default model, the prompt (1 MB) reached it whole, the model
# called ask_human in its very first turn and got the person's answer, it called the user's own
# MCP tool and that really ran, and nothing under the user's HOME changed.

QUESTION = "Which database?"
#: the usage the fake reports per call: the 1 MB prompt estimated at 4 characters a token would
#: fill the context window and make the engine hand the task to a fresh session
TOKENS = 5000
BIG_PROMPT = (
    "Ask the person which database to use, then look up a fact, then stop. MARK-START\n"
    + "".join(f"context line {i:06d}: nothing to do here, keep going.\n" for i in range(18870))
    + "MARK-END"
)


@dataclass
class UserRun:
    fl: Fleet
    requests: list[Request]
    facts_log: Path
    before: dict[str, Any]

    def bodies(self) -> list[str]:
        return [json.dumps(r.body) for r in self.requests]


def run_user_setup(fl: Fleet, coder: str, serve: Any, script: Steps, configure: Any) -> UserRun:
    """Configure the user's HOME for ``coder`` (``configure(home, url, log) -> env``), load a
    task with the 1 MB prompt, run fleet-tui, answer the question with `fleet-tui answer`."""
    assert len(BIG_PROMPT.encode()) >= 1_000_000
    facts_log = fl.logs / "facts.jsonl"
    tasks = fl.work.parent / "tasks.toml"
    tasks.write_text(f"[[task]]\nname = \"real\"\ncoder = \"{coder}\"\ncwd = \"{fl.work}\"\n"
                     f"prompt = '''{BIG_PROMPT}'''\n")  # fmt: skip
    with serve(script) as (url, rec):
        for var in SCRUB:
            fl.env.pop(var, None)
        fl.env.update(configure(fl.user_home, url, facts_log))
        before = tree(fl.user_home)
        fl("load", str(tasks))
        run = fl.run_bg()
        try:
            answer_the_question(fl, "real", QUESTION, run)
            assert run.wait(timeout=RUN_TIMEOUT_S) == 0, fl.run_log()
        finally:
            stop(run)
        requests = rec.model_requests()
    return UserRun(fl, requests, facts_log, before)


def assert_user_run(ur: UserRun, model_seen: str, cli_own: tuple[str, ...] = ()) -> None:
    fl = ur.fl
    t = assert_done(fl, "real")
    assert fl.questions() == []
    first = ur.bodies()[0]
    assert "MARK-START" in first and "MARK-END" in first and len(first) > 1_000_000  # the prompt, whole
    assert model_seen in (ur.requests[0].path + first), (ur.requests[0].path, first[:300])
    assert any(ASK_ANSWER in b for b in ur.bodies()[1:]), "the person's answer never reached the model"
    calls = [json.loads(x) for x in ur.facts_log.read_text().splitlines()]
    assert [c["arguments"] for c in calls] == [{"topic": "life"}], calls  # the user's own tool ran
    assert any(FACT in b for b in ur.bodies()), "the user's tool result never reached the model"
    after = tree(fl.user_home)
    changed = sorted(k for k in set(after) | set(ur.before) if after.get(k) != ur.before.get(k))
    changed = [k for k in changed if not any(k == p or k.startswith(p + "/") for p in cli_own)]
    assert changed == [], changed  # nothing under the user's HOME changed
    assert t["result_text"] == "Asked and looked it up."


def test_claude_with_a_users_setup(claude_program: str, fl: Fleet) -> None:
    script: Steps = [
        ToolCall("mcp__ask_human__ask_human", {"question": QUESTION}, input_tokens=TOKENS),
        ToolCall("mcp__facts__lookup_fact", {"topic": "life"}, input_tokens=TOKENS),
        Text("Asked and looked it up.", input_tokens=TOKENS),
    ]
    ur = run_user_setup(fl, "claude", serve_anthropic, script, claude_user)
    # Claude Code logs its MCP servers' stderr under ~/.cache/claude-cli-nodejs (its own cache)
    assert_user_run(ur, f'"model": "{CLAUDE_MODEL}', (".cache/claude-cli-nodejs",))


def test_codex_with_a_users_setup(codex_program: str, fl: Fleet) -> None:
    """gpt-5.5 defers MCP tools: the model searches with tool_search in its very first turn."""

    def ask(req: Request) -> ToolCall | Text:
        found = json.dumps(tool_search_outputs(req))
        if '"mcp__ask_human"' not in found:
            return Text(f"tool_search did not find ask_human: {found[:300]}")
        return ToolCall("ask_human", {"question": QUESTION}, namespace="mcp__ask_human", input_tokens=TOKENS)

    def search(req: Request) -> ToolCall | Text:
        if not offers_tool_search(req):
            return Text("no tool_search offered")
        return ToolCall("tool_search", {"query": "ask a human person question"}, input_tokens=TOKENS)

    script: Steps = [
        search,
        ask,
        ToolCall("tool_search", {"query": "lookup fact topic"}, input_tokens=TOKENS),
        ToolCall("lookup_fact", {"topic": "life"}, namespace="mcp__facts", input_tokens=TOKENS),
        Text("Asked and looked it up.", input_tokens=TOKENS),
    ]
    ur = run_user_setup(fl, "codex", serve_openai_responses, script, codex_user)
    assert_user_run(ur, f'"model": "{CODEX_MODEL}')


def test_opencode_with_a_users_setup(opencode_program: str, fl: Fleet) -> None:
    script: Steps = [
        ToolCall("ask_human_ask_human", {"question": QUESTION}, input_tokens=TOKENS),
        ToolCall("facts_lookup_fact", {"topic": "life"}, input_tokens=TOKENS),
        Text("Asked and looked it up.", input_tokens=TOKENS),
    ]
    ur = run_user_setup(
        fl, "opencode", serve_anthropic, script, lambda h, u, log: opencode_user(h, u + "/v1", log)
    )
    assert "ask_human_ask_human" in ur.requests[0].tool_names()  # offered from the first turn
    # OpenCode itself, on its first run for this HOME (as when its user runs it), drops a
    # .gitignore into its global config dir, fills npm's cache and, when the npm registry answers,
    # installs its plugin SDK (@ai-sdk/provider) beside the config: new files of the CLI's own,
    # nothing of the user's changed (opencode.json included)
    own = (
        ".npm",
        ".cache",
        ".config/opencode/.gitignore",
        ".config/opencode/node_modules",
        ".config/opencode/package.json",
        ".config/opencode/bun.lock",
        ".config/opencode/package-lock.json",
    )
    assert_user_run(ur, f'"model": "{OPENCODE_MODEL.split("/")[1]}', own)


def test_gemini_with_a_users_setup(gemini_program: str, fl: Fleet) -> None:
    def named(part: str, args: dict[str, Any]) -> Any:
        def turn(req: Request) -> ToolCall | Text:
            names = [n for n in gemini_tool_names(req) if part in n]
            return (
                ToolCall(names[0], args, input_tokens=TOKENS)
                if names
                else Text(f"no {part} tool: {gemini_tool_names(req)}")
            )

        return turn

    script: Steps = [
        named("ask_human", {"question": QUESTION}),
        named("lookup_fact", {"topic": "life"}),
        Text("Asked and looked it up.", input_tokens=TOKENS),
    ]
    ur = run_user_setup(fl, "gemini", serve_gemini, script, gemini_user)
    assert_user_run(ur, f"/models/{GEMINI_MODEL}:")


def test_doctor_shows_each_coders_user_setup(fl: Fleet) -> None:
    """`fleet-tui doctor`, per coder: program and version, the user's config files it found, the
    model it will use, and the MCP servers the agent will see (the user's own + ask_human)."""
    for program in ("claude", "codex", "opencode", "gemini"):
        require_program(program)
    for var in SCRUB:
        fl.env.pop(var, None)
    log = fl.logs / "facts.jsonl"
    for configure in (claude_user, codex_user, opencode_user, gemini_user):
        fl.env.update(configure(fl.user_home, "http://127.0.0.1:9", log))
    out = fl("doctor").stdout
    blocks = {b.split()[0]: b for b in re.split(r"\nok +coder +", "\n" + out)[1:]}
    h = fl.user_home
    expect = {
        "claude": (CLAUDE_MODEL, f"{h}/.claude.json, {h}/.claude/settings.json"),
        "codex": (f"{CODEX_MODEL} (provider proxy)", f"{h}/.codex/config.toml"),
        "opencode": (OPENCODE_MODEL, f"{h}/.config/opencode/opencode.json"),
        "gemini": (GEMINI_MODEL, f"{h}/.gemini/settings.json"),
    }
    for name, (model, files) in expect.items():
        block = blocks[name]
        assert "usable" in block and f"config: {files}" in block, block
        assert f"model: {model}" in block and "MCP servers: facts, ask_human" in block, block
    fl("config", "set", "mcp", "fleet-only")
    out = fl("doctor").stdout
    assert out.count("MCP servers: ask_human\n") == 4, out
