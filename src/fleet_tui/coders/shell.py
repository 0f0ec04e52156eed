"""The ``shell`` coder: any command as an agent, for scripts, tools and CLIs without an adapter.

Why it exists: not every worker is a coding-agent CLI with a JSON stream. A task with
``coder = "shell"`` runs its ``command`` with ``/bin/sh -c`` in the task's working directory (the
engine starts every agent there); the prompt is in ``$FLEET_PROMPT`` (when it fits in the
environment, up to 100 000 bytes), in the file ``$FLEET_PROMPT_FILE`` and on stdin. Each output
line becomes a ``text`` event; a line that is a JSON object or array is also kept parsed in
``raw``. Exit 0 is success (the command "claims" success; verifiers still decide ``done``);
anything else is a failure with detail ``exit N``.

A task without a command does not raise: ``argv`` returns a command that prints a clear message
(on stdout and stderr) and exits 2, so the attempt fails fast with that message as its text,
whoever spawns it. ``fleet-tui validate`` should catch it earlier. No textual or rich imports.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import ClassVar

from fleet_tui.coders.base import AttemptContext, BaseCoder, BaseNormalizer, Normalizer
from fleet_tui.scheduler.model import Event, Outcome
from fleet_tui.scheduler.procs.attemptfiles import write_into

SHELL = "/bin/sh"
#: FLEET_PROMPT is set only up to this many bytes (Linux caps one env string at 128 KiB)
MAX_ENV_PROMPT = 100_000
MISSING_EXIT = 2


def missing_command_message(task_name: str) -> str:
    return (
        f"fleet-tui: task {task_name!r} uses the shell coder but has no command; "
        f'set command = "..." in its [[task]] (or use `fleet-tui add --command CMD`)'
    )


class ShellNormalizer(BaseNormalizer):
    """Each line -> one ``text`` event (JSON lines keep their parsed value in ``raw``)."""

    def feed(self, line: str, ts: float) -> list[Event]:
        try:
            if not line.strip():
                return []
            return [self.ev(ts, "text", text=line, raw=self.parse_json(line))]
        except Exception:  # never raise on a line, whatever it holds
            return [self.ev(ts, "text", text=repr(line))]

    def outcome(self, exit_code: int | None) -> Outcome:
        if exit_code == 0:
            return Outcome("success", result_text=self.last_text, claimed_success=True)
        if exit_code is None:
            detail = "no exit status"
        elif exit_code < 0:
            detail = f"exit {exit_code} (signal {-exit_code})"
        else:
            detail = f"exit {exit_code}"
        return Outcome("failure", detail=detail, result_text=self.last_text)


class ShellCoder(BaseCoder):
    """``/bin/sh -c <task.spec.command>``."""

    name: ClassVar[str] = "shell"
    program: ClassVar[str | None] = None
    install_hint: ClassVar[str] = "built in: needs /bin/sh"
    #: a plain command has no turns: a follow-up stops it at once
    followup_stop: ClassVar[str] = "now"

    def argv(self, ctx: AttemptContext) -> list[str]:
        command = ctx.task.spec.command
        if not command or not command.strip():
            msg = shlex.quote(missing_command_message(ctx.task.spec.name))
            return [SHELL, "-c", f"echo {msg}; echo {msg} >&2; exit {MISSING_EXIT}"]
        return [SHELL, "-c", command]

    def interactive_argv(self, session_id: str | None, attempt_dir: Path) -> tuple[list[str], dict[str, str]]:
        """A command has no conversation to resume: a person taking over gets their own shell."""
        return [os.environ.get("SHELL") or SHELL], {}

    def prompt_file(self, ctx: AttemptContext) -> Path:
        return ctx.attempt_dir / "prompt.txt"

    def prepare(self, ctx: AttemptContext) -> None:
        path = self.prompt_file(ctx)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_into(str(path), ctx.prompt.encode("utf-8"))

    def env(self, ctx: AttemptContext) -> dict[str, str]:
        env = {
            "FLEET_ATTEMPT": str(ctx.attempt),
            "FLEET_TASK_ID": ctx.task.id,
            "FLEET_TASK_NAME": ctx.task.spec.name,
            "FLEET_PROMPT_FILE": str(self.prompt_file(ctx)),
            "PWD": str(ctx.workdir),
        }
        if len(ctx.prompt.encode("utf-8")) <= MAX_ENV_PROMPT:
            env["FLEET_PROMPT"] = ctx.prompt
        if ctx.model:
            env["FLEET_MODEL"] = ctx.model
        if ctx.mcp_command:
            env["FLEET_MCP_COMMAND"] = json.dumps(list(ctx.mcp_command))
            env.update(ctx.mcp_env)
        return env

    def stdin(self, ctx: AttemptContext) -> bytes | None:
        return ctx.prompt.encode("utf-8")

    def normalizer(
        self, task_id: str, attempt: int, start_seq: int = 0, attempt_dir: Path | None = None
    ) -> Normalizer:
        return ShellNormalizer(task_id, attempt, start_seq)

    def available(self) -> tuple[bool, str]:
        ok = Path(SHELL).exists()
        return ok, SHELL if ok else f"{SHELL} not found"

    def version(self) -> str | None:
        return SHELL
