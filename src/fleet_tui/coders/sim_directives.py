"""The simulated agent's directive language: ``@sim`` lines in a prompt -> a Plan.

Kept apart from the program that acts them out (sim_agent.py) so the language reads on its own.
Standard library only: the sim agent imports it at start and must start fast.

Why it exists: fleet-tui must be usable (``fleet-tui demo``) and testable without an account
or a network, and every hard case the engine must survive (rate limits, false completions, a
stubborn process that ignores SIGTERM, a grandchild that escapes with ``setsid``, garbage
output, huge lines, a full context window, a question for a human) must be reproducible on
demand. This program behaves like ``claude -p --output-format stream-json --verbose``: the
same line shapes as the ``claude-*.jsonl`` fixtures, so the ``sim`` coder reuses the Claude
normalizer and exercises it for real. It is stdlib only and starts fast; ``mcp`` (and anyio)
are imported only when an ``ask`` directive actually calls the ``ask_human`` MCP server.

Run: ``python -m fleet_tui.coders.sim_agent [PROMPT...]``. The prompt is the arguments if given,
else ``$FLEET_PROMPT`` if set, else stdin (unless stdin is a terminal). Environment:
``FLEET_ATTEMPT`` (attempt number, default 1), ``FLEET_MCP_COMMAND`` (JSON argv of the stdio
MCP server that serves ``ask_human``), ``FLEET_SIM_MODEL`` (default for ``model=``).

Directives are prompt lines that start with ``@sim``, followed by space-separated tokens
``key=value`` or bare ``key`` (shell quoting: ``say="two words"``; in text values ``\\n`` is a
newline and ``\\t`` a tab). Every other prompt line is ignored. A prompt without any directive
runs ``steps=3``. Settings apply to the whole run wherever they appear; actions run in prompt
order; parameters belong to the action before them on the same line. Unknown keys are reported
on stderr and ignored.

Settings:
  pace=S                 seconds per step / pause between simulated API calls (default 0.05)
  model=NAME             model name reported (default $FLEET_SIM_MODEL, else claude-sim)
  window=N               context window reported in result.modelUsage (default 200000)
  context=N              context occupancy (input+cache tokens per message) climbs linearly to N
                         by the last message (default: starts ~12000, +450 per message)
  cost=USD               total_cost_usd of the result (default: computed from the tokens)
  ignore-sigterm         ignore SIGTERM (SIGKILL still works)
  no-final-newline       the last line written has no trailing newline
  fail-until-attempt=N   on attempts < N ($FLEET_ATTEMPT) skip file actions and fail at the end
Actions:
  steps=N                N steps, each a tool call (Bash/Grep/Glob) and its result, `pace` apart
  say=TEXT               an assistant text message
  write=PATH text=TEXT   Write tool: create/overwrite PATH (relative, inside the cwd)
  append=PATH text=TEXT  Bash tool: append TEXT to PATH
  edit=PATH old=A new=B [all]  Edit tool: replace A by B (first, or all); error if A is absent
  ask=QUESTION [options=A,B]   call mcp__ask_human__ask_human via $FLEET_MCP_COMMAND; without
                         it the tool result is an error and the run goes on
  sleep=S                a Bash `sleep S` tool call that really sleeps
  repeat=N [command=CMD] N identical Bash tool calls of CMD (default "npm test"), each failing the
                         same way: an agent stuck in a loop
  wait-file=PATH [timeout=S]   a tool call that blocks until PATH exists (default timeout 300)
  escape=PIDFILE [seconds=S]   start a grandchild in its own session (setsid) that sleeps S
                         (default 300); its pid is written to PIDFILE (atomically)
  api-retry=N [status=429]     N system/api_retry lines (429 rate_limit, 529 overloaded,
                         401 authentication_failed), then go on as Claude does once a retry works
  rate-warning=U [seconds=S]   a rate_limit_event allowed_warning, utilization U, reset in S
  rate-limit=S [retries=N]     end rate-limited: N api_retry lines, a rate_limit_event
                         "rejected" with resetsAt now+S, a synthetic error message, a result
                         with is_error and api_error_status 429; exit 1
  fail[=MESSAGE]         end with an error result (subtype error_during_execution); exit 1
  exit=N                 end now with exit code N (success result if 0, else an error result)
  crash=N                exit N at once, without a result line
  false-completion       end claiming success without doing anything (no tool calls)
  garbage=N              N lines that are not Claude stream-json (text, broken JSON, {}, ...)
  invalid-utf8           a raw line and a JSON line containing invalid UTF-8 bytes
  huge=N                 one valid assistant line of exactly N bytes (suffix K or M: KiB, MiB)
  burst=N [seconds=S]    N assistant messages per second for S seconds (default 1)
  stderr=TEXT            a line on stderr
Exit codes: 0 success; 1 fail / rate-limit / fail-until-attempt; N for exit=N and crash=N.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: setting -> converter (bare flags get True)
SETTINGS: dict[str, Callable[[str], Any]] = {
    "pace": float,
    "model": str,
    "window": int,
    "context": int,
    "cost": float,
    "fail-until-attempt": int,
    "ignore-sigterm": bool,
    "no-final-newline": bool,
}
ACTIONS = {
    "steps",
    "say",
    "write",
    "append",
    "edit",
    "ask",
    "sleep",
    "repeat",
    "wait-file",
    "escape",
    "api-retry",
    "rate-warning",
    "rate-limit",
    "fail",
    "exit",
    "crash",
    "false-completion",
    "garbage",
    "invalid-utf8",
    "huge",
    "burst",
    "stderr",
}
PARAMS = {"text", "old", "new", "all", "options", "seconds", "timeout", "retries", "status", "command"}
TERMINAL = {"rate-limit", "fail", "exit", "crash", "false-completion"}  # nothing runs after these
NO_CALL = {"burst", "garbage", "invalid-utf8", "stderr", "api-retry", "rate-warning", "crash"}


@dataclass
class Action:
    name: str
    value: str | None
    params: dict[str, str | None] = field(default_factory=dict)

    def param(self, key: str, default: str = "") -> str:
        v = self.params.get(key)
        return default if v is None else v

    def num(self, key: str | None, default: float) -> float:
        """The action's value (key None) or a parameter as a number; default when absent/bad."""
        v = self.value if key is None else self.params.get(key)
        try:
            return float(v) if v is not None else default
        except ValueError:
            return default


@dataclass
class Plan:
    """What the prompt's directives ask for (settings, then actions in order)."""

    pace: float = 0.05
    model: str = "claude-sim"
    window: int = 200_000
    context: int = 0
    cost: float | None = None
    fail_until_attempt: int = 0
    ignore_sigterm: bool = False
    no_final_newline: bool = False
    actions: list[Action] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def planned_calls(self) -> int:
        """How many model calls (distinct message ids with usage) the run makes, roughly."""
        n = 0
        for a in self.actions:
            n += int(a.num(None, 0)) if a.name == "steps" else a.name not in NO_CALL
            if a.name in TERMINAL:
                return max(n, 1)
        return n + 1  # the closing summary


def parse(prompt: str, model: str | None = None, attempt: int | None = None) -> Plan:
    """The plan for a prompt: every ``@sim`` line's settings and actions, in order.

    ``@sim:N ...`` applies only on attempt N and ``@sim:N+ ...`` from attempt N on (``attempt``
    None: every line applies)."""
    plan, seen = Plan(model=model or Plan.model), False
    for raw in prompt.splitlines():
        line = raw.strip()
        if line.startswith("@sim:"):
            head, _, rest = line.partition(" ")
            cond = head[5:]
            try:
                n = int(cond.rstrip("+"))
            except ValueError:
                plan.warnings.append(f"bad attempt condition {head!r} ignored")
                continue
            if attempt is not None and not (attempt == n or (cond.endswith("+") and attempt >= n)):
                continue
            line = "@sim " + rest
        if line != "@sim" and not line.startswith(("@sim ", "@sim\t")):
            continue
        seen = True
        try:
            tokens = shlex.split(line[4:])
        except ValueError:
            tokens = line[4:].split()
        current: Action | None = None
        for tok in tokens:
            key, eq, val = tok.partition("=")
            value = val.replace("\\n", "\n").replace("\\t", "\t") if eq else None
            if key in SETTINGS:
                try:
                    conv = SETTINGS[key]
                    setattr(plan, key.replace("-", "_"), True if conv is bool else conv(value or ""))
                except ValueError:
                    plan.warnings.append(f"bad value in {tok!r} ignored")
            elif key in ACTIONS:
                current = Action(key, value)
                plan.actions.append(current)
            elif key in PARAMS and current is not None:
                current.params[key] = value
            else:
                plan.warnings.append(f"unknown directive key {key!r} ignored")
    if not seen:
        plan.actions.append(Action("steps", "3"))
    return plan


def parse_size(s: str) -> int:
    """``123``, ``64K`` (KiB) or ``2M`` (MiB) -> bytes."""
    s = s.strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1024, "M": 1024 * 1024}.get(s[-1:], 1)
    return int(float(s[:-1] if mult > 1 else s) * mult)
