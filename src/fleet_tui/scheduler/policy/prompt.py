"""The prompt an agent receives: the task's own words plus the context fleet-tui owes it.

Kept in one place so every coder gets the same protocol: where it works and what it may not do
with git, when to ask a person, what its dependencies produced, why a retry happens (the failure
text of the last attempt), and how to continue after a crash or a context handoff.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleet_tui.scheduler.model import Task

MAX_CONTEXT_CHARS = 4000


def trim(text: str, limit: int = MAX_CONTEXT_CHARS) -> str:
    """Keep the head and the tail of a long text (errors usually sit at the end)."""
    text = text.strip()
    if len(text) <= limit:
        return text
    head = limit // 3
    tail = limit - head - 40
    return f"{text[:head]}\n[... {len(text) - head - tail} characters cut ...]\n{text[-tail:]}"


@dataclass(frozen=True)
class DependencyResult:
    """What a finished dependency left for the task after it (its result and branch)."""

    name: str
    result_text: str | None
    branch: str | None


@dataclass(frozen=True)
class PromptContext:
    """Everything an attempt's prompt is built from."""

    task: Task
    attempt: int
    workdir: str
    branch: str | None = None
    dependencies: Sequence[DependencyResult] = ()
    retry_reason: str | None = None  # why the previous attempt did not count
    retry_output: str | None = None  # verifier output / error text of the previous attempt
    crashed: bool = False
    handoff: str | None = None  # summary of the previous session (context handoff)
    ask_human: bool = True
    followup: str | None = None  # a person's follow-up message (fleet-tui send)


def build_prompt(ctx: PromptContext) -> str:
    parts = [ctx.task.spec.prompt.rstrip()]
    rules = [f"You work in {ctx.workdir}."]
    if ctx.branch:
        rules.append(
            f"This is a git worktree on branch {ctx.branch}: commit your work to this branch. "
            "Do not merge, push, rebase onto or switch to another branch; a person merges."
        )
    if ctx.ask_human:
        rules.append(
            "If you meet a decision you cannot make from the task and the code, or anything that "
            "needs a login, a captcha or a one-time code, call the ask_human tool and wait for the "
            "answer. Never type credentials or solve captchas yourself."
        )
    parts.append("## fleet-tui\n" + "\n".join(f"- {r}" for r in rules))
    if ctx.dependencies:
        lines = []
        for d in ctx.dependencies:
            where = f" (branch {d.branch})" if d.branch else ""
            lines.append(f"### {d.name}{where}\n{trim(d.result_text or '(no result text)', 1500)}")
        parts.append("## Results of the tasks this one depends on\n" + "\n\n".join(lines))
    if ctx.crashed:
        parts.append(
            "## Resuming after a crash\nA previous attempt at this task stopped unexpectedly. Assess "
            "the current state of the working directory first (git status, git log, the files you "
            "would have changed), then continue from there instead of starting over."
        )
    if ctx.handoff:
        parts.append("## Continuing from a previous session\n" + trim(ctx.handoff, 6000))
    if ctx.retry_reason:
        body = f"Attempt {ctx.attempt - 1} did not pass: {ctx.retry_reason}."
        if ctx.retry_output:
            body += "\n\nOutput:\n```\n" + trim(ctx.retry_output) + "\n```"
        parts.append("## Why this is attempt " + str(ctx.attempt) + "\n" + body)
    if ctx.followup:
        parts.append(
            "## A follow-up from a person\nThe task was worked on before; the working directory holds "
            "that work. Now do this:\n\n" + ctx.followup.strip()
        )
    # a NUL cannot travel in an argument or a variable: one from an agent's result, a verifier's
    # output or a log is shown as the control picture instead
    return ("\n\n".join(parts) + "\n").replace("\0", "\u2400")
