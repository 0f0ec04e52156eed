"""What every command starts from: the fleet home, its config and its store, opened lazily.

Shared by ``cli`` and ``wheel_cli`` (the wheel's subcommands), so neither imports the other's
internals. A ``UserError`` is a problem the user can fix: printed without a traceback, exit 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

#: commands that only look: they work (with a warning) while config.toml is broken
LENIENT_CONFIG_COMMANDS = frozenset(
    {"status", "plan", "hosts", "logs", "questions", "doctor", "validate", "example"}
)


class UserError(Exception):
    """A problem the user can fix; printed without a traceback, exit 1."""


def resolve_home(arg: str | None) -> Path:
    if arg:
        return Path(arg).expanduser().resolve()
    env = os.environ.get("FLEET_HOME")
    if env:
        return Path(env).expanduser().resolve()
    from platformdirs import user_state_dir

    return Path(user_state_dir("fleet-tui"))


#: commands that only read the store: they open it without a write lock and write nothing
READONLY_COMMANDS = ("status", "logs", "questions", "plan", "hosts")


class Ctx:
    """Home, config and store, opened lazily."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.home = resolve_home(getattr(args, "home", None))
        self._store: Any = None
        self._cfg: Any = None
        self._home_ready = False

    @property
    def config_path(self) -> Path:
        return self.home / "config.toml"

    def ready_home(self) -> None:
        """Create the home (private: 0700) when missing, and refuse one another user can write."""
        if self._home_ready:
            return
        from fleet_tui.trust import TrustError, check_trusted

        try:
            if not self.home.is_dir():
                self.home.mkdir(parents=True, mode=0o700)
            check_trusted(self.home, "the fleet home")
            st = self.home.stat()
            if st.st_uid == os.geteuid() and st.st_mode & 0o077 and (self.home / "fleet.db").exists():
                try:  # a home made by an older fleet-tui: its prompts and outputs are private now
                    self.home.chmod(0o700)
                except OSError:
                    pass
        except TrustError as e:
            raise UserError(str(e)) from e
        except OSError as e:
            why = e.strerror or str(e)
            if self.home.exists() and not self.home.is_dir():  # mkdir said only "File exists"
                why = "it is a file, not a folder"
            raise UserError(f"cannot use the fleet home {self.home}: {why}: pick another with --home") from e
        self._home_ready = True

    @property
    def cfg(self) -> Any:
        if self._cfg is None:
            from fleet_tui.config import ConfigError, load_config, load_config_lenient

            self.ready_home()
            try:
                self._cfg = load_config(self.config_path)
            except ConfigError as e:
                if not self.read_only:
                    raise UserError(
                        f"{e}\nfix the config first (`fleet-tui config set KEY VALUE` or an editor)"
                    ) from e
                # looking must keep working while the file is broken: say so, use what is valid
                try:
                    self._cfg, _ = load_config_lenient(self.config_path)
                except ConfigError as refused:  # untrusted or unreadable: never used
                    raise UserError(str(refused)) from refused
                print(
                    f"fleet-tui: warning: the config is broken; its valid keys are used, defaults "
                    f"for the rest:\n{e}\nfix: `fleet-tui config set KEY VALUE` or edit {self.config_path}",
                    file=sys.stderr,
                )
        return self._cfg

    @property
    def read_only(self) -> bool:
        """Commands that only look: they work (with a warning) while config.toml is broken."""
        cmd = getattr(self.args, "cmd", None)
        if cmd == "config":
            return getattr(self.args, "action", None) == "get"
        return cmd in LENIENT_CONFIG_COMMANDS

    @property
    def store(self) -> Any:
        if self._store is None:
            from fleet_tui.scheduler.store.opener import open_store
            from fleet_tui.scheduler.store.protocol import StoreError, sqlite_path
            from fleet_tui.trust import TrustError, check_trusted

            url = getattr(self.args, "store", None) or os.environ.get("FLEET_STORE") or self.cfg.store
            try:
                if not url or url.startswith("sqlite:"):  # its tasks run as this user: trust it
                    check_trusted(Path(sqlite_path(url)) if url else self.home / "fleet.db", "the store")
                self._store = open_store(
                    url, str(self.home), readonly=getattr(self.args, "cmd", None) in READONLY_COMMANDS
                )
            except (StoreError, TrustError) as e:
                raise UserError(str(e)) from e
            except OSError as e:
                raise UserError(f"cannot use the fleet home {self.home}: {e}") from e
        return self._store

    def close(self) -> None:
        """Close the store if it was opened: its change watcher lets go of any waiter at once,
        so the process exits without waiting out a wait (``run`` ends in milliseconds)."""
        if self._store is not None:
            try:
                self._store.close()
            except Exception:  # closing is best effort: the process ends anyway
                pass
            self._store = None


def coder_tools() -> tuple[list[str], Any]:
    from fleet_tui.coders.base import coder_names, get_coder

    names = coder_names()

    def available(name: str) -> tuple[bool, str]:
        try:
            return get_coder(name).available()
        except Exception as e:
            return False, str(e)

    return names, available


def controller(ctx: Ctx) -> Any:
    from fleet_tui.scheduler.control import ControlConfig, Controller

    return Controller(
        ctx.store,
        actor="cli",
        cfg=ControlConfig(heartbeat_s=ctx.cfg.heartbeat_s, command_timeout_s=ctx.cfg.kill_grace_s + 25),
    )


def task_or_fail(ctx: Ctx, ref: str) -> Any:
    t = ctx.store.get_task(ref)
    if t is None:
        from fleet_tui.scheduler.control import no_task_message

        raise UserError(no_task_message(ref, ctx.store.task_names()))
    return t


def merger(ctx: Ctx, c: Any) -> Any:
    """The merge service on this store and home, acting as the controller ``c`` does."""
    from fleet_tui.scheduler.merger import Merger

    return Merger(c.life, ctx.home, lambda: ctx.cfg.keep_worktrees)
