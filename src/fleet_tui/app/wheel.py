"""The cockpit's take-the-wheel keys: ``F`` follow-up, ``A`` approve, ``T`` take over.

Why a mixin of its own: these keys are the person stepping into a task, and they share the
engine-side functions of ``fleet-tui send``, ``approve`` and ``takeover`` (scheduler/humans/followup.py,
settle.py, takeover.py); keeping them here leaves app.py the cockpit's layout and plumbing.
FleetApp mixes this in; it relies on the app's ``engine``, ``send``, ``apply``,
``_need_selected``, ``_confirm_then`` and ``spawn_shell``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from textual.app import SuspendNotSupported

from fleet_tui.app.hosted import on_engine
from fleet_tui.scheduler.model import Task, TaskChanged
from fleet_tui.screens.confirm import ConfirmScreen


class WheelKeys:
    engine: Any

    def action_follow_up(self: Any) -> None:
        """``F``: a message continues the selected task's conversation (``fleet-tui send``)."""
        from fleet_tui.scheduler.humans.followup import send
        from fleet_tui.screens.followup import FollowUpScreen

        if (task := self._need_selected()) is None:
            return

        def done(text: str | None) -> None:
            if text:
                self.send(lambda: on_engine(self.engine, send, task.id, text))

        self.push_screen(FollowUpScreen(task.name), done)

    def action_approve(self: Any) -> None:
        """``A``: a parked task becomes done, approved by the person (``fleet-tui approve``)."""
        from fleet_tui.scheduler.humans.followup import user_name
        from fleet_tui.scheduler.humans.settle import approve

        if (task := self._need_selected()) is not None:
            self._confirm_then(
                f"Approve {task.name}? It becomes done, with you as its verifier.",
                task.reason or "",
                "Approve",
                lambda: on_engine(self.engine, approve, task.id, user_name()),
            )

    def action_takeover(self: Any) -> None:
        """``T``: ``fleet-tui takeover`` from the cockpit: a tmux window, else the cockpit suspends."""
        if (task := self._need_selected()) is None:
            return

        def confirmed(ok: bool | None) -> None:
            if ok:
                self.run_worker(self._takeover(task), group="commands", exit_on_error=False)

        self.push_screen(
            ConfirmScreen(
                f"Take over {task.name}? Its agent stops (WIP kept); its CLI opens.", yes="Take over"
            ),
            confirmed,
        )

    async def _takeover(self: Any, task: Task) -> None:
        import anyio

        from fleet_tui.scheduler.humans import takeover
        from fleet_tui.scheduler.humans.followup import user_name
        from fleet_tui.screens.takeover import TakeoverDoneScreen

        by = user_name()
        engine: Any = self.engine
        res = await on_engine(engine, takeover.begin, task.id, by)
        if not res.ok or res.task is None:
            self.notify(res.message, severity="warning")
            return
        taken = res.task
        self.apply([TaskChanged(taken)])
        default = getattr(getattr(engine, "cfg", None), "default_coder", "claude")
        it = await anyio.to_thread.run_sync(
            takeover.interactive_command, engine.store, engine.home, default, taken
        )
        if it.note:
            self.notify(it.note, severity="warning")
        if os.environ.get("TMUX"):
            err = await anyio.to_thread.run_sync(takeover.open_tmux_window, it, f"takeover:{taken.name}")
            if err:
                self.notify(err, severity="error")
                return
        else:
            argv = ["env", *(f"{k}={v}" for k, v in it.env.items()), *it.argv] if it.env else it.argv
            try:
                with self.suspend():
                    self.spawn_shell(argv, it.workdir)
            except SuspendNotSupported:
                self.notify(
                    "This terminal cannot suspend the cockpit: use `fleet-tui takeover`.", severity="error"
                )
                return

        def verify(t: Task) -> takeover.VerifyVerdict:
            from fleet_tui.scheduler.policy.verify import run_verifiers

            reviewer = engine.reviewer(t) if hasattr(engine, "reviewer") else None
            vr = run_verifiers(t.spec.verify, Path(t.workdir or t.worktree or t.spec.cwd), reviewer=reviewer)
            return takeover.VerifyVerdict(vr.passed, vr.label, vr.output or "")

        def chosen(choice: str | None) -> None:
            self.send(lambda: on_engine(engine, takeover.finish, taken.id, choice or "leave", by, verify))

        self.push_screen(TakeoverDoneScreen(taken.name), chosen)
