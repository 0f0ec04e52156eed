"""The ``sim`` coder: runs the built-in simulated agent (``fleet_tui.coders.sim_agent``).

Why it exists: ``fleet-tui demo`` and the test suite need an agent that needs no account, no
network and no install, yet exercises the same path as a real one. The sim agent writes Claude
Code's stream-json, so this coder reuses the Claude normalizer: every sim run also tests it.
The prompt goes to the agent on stdin (it may be large); ``@sim`` lines in it drive the agent
(see the README, "The simulated agent"). No textual or rich imports here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import ClassVar

from fleet_tui import __version__
from fleet_tui.coders.base import AttemptContext, BaseCoder, Normalizer

AGENT_MODULE = "fleet_tui.coders.sim_agent"


class SimCoder(BaseCoder):
    """``python -m fleet_tui.coders.sim_agent`` with the prompt on stdin."""

    name: ClassVar[str] = "sim"
    per_model_accounts: ClassVar[bool] = True
    program: ClassVar[str | None] = None
    install_hint: ClassVar[str] = "built in: nothing to install"

    def argv(self, ctx: AttemptContext) -> list[str]:
        return [sys.executable, "-m", AGENT_MODULE]

    def stdin(self, ctx: AttemptContext) -> bytes | None:
        return ctx.prompt.encode("utf-8")

    def env(self, ctx: AttemptContext) -> dict[str, str]:
        """FLEET_ATTEMPT (for ``fail-until-attempt``), the ask_human MCP server, the model."""
        env = {"FLEET_ATTEMPT": str(ctx.attempt), "FLEET_TASK_ID": ctx.task.id, "PWD": str(ctx.workdir)}
        if ctx.model:
            env["FLEET_SIM_MODEL"] = ctx.model
        if ctx.mcp_command:
            env["FLEET_MCP_COMMAND"] = json.dumps(list(ctx.mcp_command))
            env.update(ctx.mcp_env)
        return env

    def normalizer(
        self, task_id: str, attempt: int, start_seq: int = 0, attempt_dir: Path | None = None
    ) -> Normalizer:
        from fleet_tui.coders.claude import ClaudeNormalizer  # the sim speaks Claude's stream-json

        return ClaudeNormalizer(task_id, attempt, start_seq, attempt_dir)

    def available(self) -> tuple[bool, str]:
        return True, f"built in ({sys.executable} -m {AGENT_MODULE})"

    def version(self) -> str | None:
        return f"fleet-tui {__version__} sim agent"
