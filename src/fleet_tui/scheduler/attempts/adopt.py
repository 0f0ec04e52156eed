"""Adoption: a restarted engine takes over the attempts of a dead one instead of starting them
again.

An orphaned task (its engine's heartbeat stopped) whose shim lives on this machine is adopted
where it runs: the claim changes hands (fenced by the old owner and attempt) and a runner
reattaches to the shim's output where the dead engine left it. A shim that ended meanwhile is
reaped the same way (its exit record read). A dead shim without an exit record, or an attempt on
another machine whose lease expired, is requeued as crashed (its next prompt says to assess the
worktree first).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import anyio

from fleet_tui.coders.base import CoderNotFound, get_coder
from fleet_tui.config import Config
from fleet_tui.scheduler import lifecycle as lc
from fleet_tui.scheduler.attempts.launch import Launch, attempt_dir
from fleet_tui.scheduler.control import owner_alive
from fleet_tui.scheduler.lifecycle import AttemptOutcome, Lifecycle
from fleet_tui.scheduler.model import Attempt, Task
from fleet_tui.scheduler.procs import attemptdir
from fleet_tui.scheduler.procs import shim as shimmod
from fleet_tui.scheduler.procs.owned import reap_attempt
from fleet_tui.scheduler.procs.runner import write_lease


class Adopter:
    """Adopts orphans for one engine (the lifecycle's actor) on ``host``; ``start_runner`` takes
    over the output of an adopted live (or ended) shim, ``wake`` tells the scheduler a task came
    back to the queue."""

    def __init__(
        self,
        life: Lifecycle,
        config: Callable[[], Config],
        host: str,
        start_runner: Callable[[Task, Launch], None],
        wake: Callable[[], None],
        home: Path,
    ) -> None:
        self.life = life
        self.home = Path(home)
        self.store = life.store
        self._config = config
        self.host = host
        self._start_runner = start_runner
        self._wake = wake

    async def adopt(self, t: Task) -> None:
        """Take over a task whose engine is gone: adopt its live shim, reap a finished one, or
        requeue a crashed one with a prompt that says to assess the worktree first."""
        cfg = self._config()
        now = self.life.clock()
        store = self.store
        stale_s = cfg.stale_s
        same_host = t.host == self.host
        alive = await anyio.to_thread.run_sync(owner_alive, store, t.owner, now, stale_s)
        if alive:
            return
        att = await anyio.to_thread.run_sync(store.get_attempt, t.id, t.attempt)
        if att is None and same_host and t.attempt > 0:
            att = await anyio.to_thread.run_sync(self._unrecorded, t, now)
        info = attemptdir.read_shim(Path(att.dir)) if att and att.dir else None
        if same_host and att is not None and info is not None:
            new = await anyio.to_thread.run_sync(
                lambda: self.life.adopt(t, self.host, cfg.lease_s, reclaim=False)
            )
            if new is None:
                return
            pid, ticks = info.pid, info.start_ticks
            adir = Path(att.dir)
            shim_alive = shimmod.alive(pid, ticks)
            if shim_alive or attemptdir.has_exit(adir):
                if shim_alive:
                    write_lease(adir, time.time() + cfg.lease_s / 2)
                try:
                    coder = get_coder(new.coder or cfg.default_coder)
                except CoderNotFound:
                    coder = get_coder("shell")
                launch = Launch(
                    dir=adir,
                    coder=coder,
                    coder_name=new.coder or "",
                    popen=None,
                    shim_pid=pid,
                    shim_ticks=ticks,
                    offset=att.stdout_offset,
                    next_seq=att.next_seq,
                    started_at=att.started_at,
                    adopted=True,
                )
                self.life.tell(new)
                self._start_runner(new, launch)
                return
            # a dead shim without an exit record: its agent may still run (ppid 1); it dies first
            await anyio.to_thread.run_sync(reap_attempt, adir)
            t = new
        elif not same_host or att is None or info is None:
            # a remote (or never-started) attempt: reclaim only once its lease expired
            new = await anyio.to_thread.run_sync(
                lambda: self.life.adopt(t, self.host, cfg.lease_s, reclaim=not same_host)
            )
            if new is None:
                return
            t = new
        await anyio.to_thread.run_sync(
            lambda: store.update_attempt(
                t.id,
                t.attempt,
                outcome=AttemptOutcome.CRASHED.value,
                ended_at=now,
                detail="supervisor lost it",
            )
        )
        await anyio.to_thread.run_sync(lambda: self.life.apply(t, lc.requeue_crashed(), held=True))
        self._wake()

    def _unrecorded(self, t: Task, now: float) -> Attempt | None:
        """The record of an attempt whose engine died after starting its agent but before
        recording it (launch.py records an attempt once its agent runs), made from the
        ``shim.json`` in its folder and written; None when no shim got that far."""
        adir = attempt_dir(self.home, t.id, t.attempt)
        info = attemptdir.read_shim(adir)
        if info is None:
            return None
        try:
            prompt = (adir / attemptdir.PROMPT).read_text(encoding="utf-8")
        except (OSError, ValueError):
            prompt = ""
        a = Attempt(
            task_id=t.id,
            n=t.attempt,
            owner=t.owner or "",
            dir=str(adir),
            started_at=info.started_at or t.attempt_started_at or now,
            prompt=prompt,
            shim_pid=info.pid,
            shim_create_time=float(info.start_ticks or 0),
        )
        self.store.put_attempt(a)
        return a
