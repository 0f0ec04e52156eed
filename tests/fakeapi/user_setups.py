"""Each agent CLI configured the way its users configure it, in a temporary HOME.

Why: fleet-tui must run every CLI with the user's own setup (issue 13): their provider and base
URL, their default model, their MCP servers, all from the CLI's own config files and environment
variables, never from fleet-tui-only variables. These helpers write exactly what a user would
(``~/.claude.json`` + ``ANTHROPIC_BASE_URL``; ``~/.codex/config.toml`` with a
``model_providers`` entry; ``~/.config/opencode/opencode.json`` with the anthropic provider's
``baseURL``; ``~/.gemini/settings.json`` + ``GOOGLE_GEMINI_BASE_URL``), each with one MCP server
of the user's own (tests/fakeapi/user_mcp.py, which logs its calls), and take a snapshot of the
HOME tree so a test can show that nothing in it changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

USER_MCP = str(Path(__file__).with_name("user_mcp.py"))
CLAUDE_MODEL = "claude-sonnet-4-5"
CODEX_MODEL = "gpt-5.5"  # a model Codex knows: it defers MCP tools behind tool_search
OPENCODE_MODEL = "anthropic/claude-sonnet-4-5"
GEMINI_MODEL = "gemini-2.5-flash"

#: variables of the developer's own environment that would override a HOME's config
SCRUB = (
    "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "ANTHROPIC_MODEL",
    "CLAUDE_CODE_OAUTH_TOKEN", "CLAUDE_CONFIG_DIR", "CODEX_HOME", "OPENAI_API_KEY", "CODEX_API_KEY",
    "OPENAI_BASE_URL", "OPENCODE_CONFIG", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME",
    "XDG_CACHE_HOME", "GEMINI_API_KEY", "GEMINI_CLI_HOME", "GEMINI_MODEL", "GOOGLE_API_KEY",
    "GOOGLE_GEMINI_BASE_URL", "GOOGLE_GENAI_USE_GCA", "GOOGLE_GENAI_USE_VERTEXAI",
)  # fmt: skip


def _write(path: Path, text: str, mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)


def user_server(log: Path) -> tuple[str, list[str]]:
    """(command, args) of the user's own MCP server, logging its calls to ``log``."""
    return sys.executable, [USER_MCP, str(log)]


def claude_user(home: Path, url: str, log: Path) -> dict[str, str]:
    """A Claude Code user with an API key, a custom base URL, a default model and one MCP server."""
    cmd, args = user_server(log)
    _write(
        home / ".claude.json",
        json.dumps({"mcpServers": {"facts": {"type": "stdio", "command": cmd, "args": args}}}),
    )
    _write(home / ".claude" / "settings.json", json.dumps({"model": CLAUDE_MODEL}), 0o644)
    (home / ".cache").mkdir(exist_ok=True)  # a real HOME has one; Claude Code keeps MCP logs in it
    return {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "sk-ant-fake"}


def codex_user(home: Path, url: str, log: Path | None = None, retries: int | None = None) -> dict[str, str]:
    """A Codex user with a custom provider (Responses API at ``url``) as their default."""
    lines = [
        f'model = "{CODEX_MODEL}"',
        'model_provider = "proxy"',
        "",
        "[model_providers.proxy]",
        'name = "My proxy"',
        f'base_url = "{url}"',
        'wire_api = "responses"',
        'env_key = "PROXY_API_KEY"',
    ]
    if retries is not None:
        lines += [f"request_max_retries = {retries}", f"stream_max_retries = {retries}"]
    if log is not None:
        cmd, args = user_server(log)
        lines += ["", "[mcp_servers.facts]", f"command = {json.dumps(cmd)}", f"args = {json.dumps(args)}"]
    _write(home / ".codex" / "config.toml", "\n".join(lines) + "\n")
    return {"PROXY_API_KEY": "sk-fake"}


def opencode_user(home: Path, url: str, log: Path | None = None) -> dict[str, str]:
    """An OpenCode user whose anthropic provider points at ``url`` (the fake's /v1 root)."""
    cfg: dict[str, object] = {
        "$schema": "https://opencode.ai/config.json",
        "model": OPENCODE_MODEL,
        "provider": {"anthropic": {"options": {"baseURL": url}}},
    }
    if log is not None:
        cmd, args = user_server(log)
        cfg["mcp"] = {"facts": {"type": "local", "command": [cmd, *args]}}
    _write(home / ".config" / "opencode" / "opencode.json", json.dumps(cfg, indent=2), 0o644)
    # the bundled models.dev snapshot, never the network
    return {"ANTHROPIC_API_KEY": "sk-ant-fake", "OPENCODE_DISABLE_MODELS_FETCH": "1"}


def gemini_user(home: Path, url: str, log: Path | None = None) -> dict[str, str]:
    """A Gemini CLI user with an API key, a custom base URL, a default model and one MCP server."""
    settings: dict[str, object] = {
        "model": {"name": GEMINI_MODEL},
        "security": {"auth": {"selectedType": "gemini-api-key"}},
    }
    if log is not None:
        cmd, args = user_server(log)
        settings["mcpServers"] = {"facts": {"command": cmd, "args": args, "trust": True}}
    _write(home / ".gemini" / "settings.json", json.dumps(settings, indent=2), 0o644)
    return {"GEMINI_API_KEY": "fake-key", "GOOGLE_GEMINI_BASE_URL": url}


def tree(home: Path) -> dict[str, tuple[str, int, str]]:
    """Every entry under ``home``: relative path -> (kind, mode, content hash or link target)."""
    out: dict[str, tuple[str, int, str]] = {}
    for root, dirs, files in os.walk(home):
        for name in dirs + files:
            p = Path(root) / name
            rel = str(p.relative_to(home))
            st = p.lstat()
            if p.is_symlink():
                out[rel] = ("link", st.st_mode & 0o7777, os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", st.st_mode & 0o7777, "")
            else:
                out[rel] = ("file", st.st_mode & 0o7777, hashlib.sha256(p.read_bytes()).hexdigest())
    return out
