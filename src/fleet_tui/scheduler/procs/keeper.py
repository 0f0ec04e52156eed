"""The keeper: hosts one helper command (setup, verifier, reviewer, merge) so it dies with its owner.

Agents run under the shim; the other programs fleet-tui starts run under this smaller host
(``python -I -m fleet_tui.scheduler.procs.keeper OWNER_PID GRACE PIDFILE UMASK [NICE] -- ARGV``).
It

- asks the kernel for SIGTERM when the thread that started it dies (``PR_SET_PDEATHSIG``), and
  exits at once if its owner is already gone — a ``kill -9`` of the engine ends the helper's
  whole process tree, instead of leaving a setup or a verifier running with ppid 1;
- is started in a session of its own (its pid is the process group of the command and its
  children) and makes itself a child subreaper, so the command's descendants can be found and
  killed (TERM the group and every descendant, wait the grace, KILL what is left, checking start
  times);
- on SIGTERM (a cancel, a timeout, a shutdown or its owner's death) does exactly that, then exits;
- with ``NICE`` above 0 (a verifier or a setup command: the agents' work, ``agent_nice``), runs the
  command at that niceness, its session's scheduling group included, as the shim does an agent:
  a test suite run as a verifier then leaves the cockpit its share of the CPU too;
- records itself and the command (pid + start time) in ``PIDFILE`` while the command runs, so
  an engine that starts later can kill what a ``kill -9`` of the keeper itself left behind
  (``owned.reap_stale``).

Standard library plus the /proc helpers of ``proctree``; no fleet-tui state, no store.
"""

from __future__ import annotations

import os
import select
import signal
import sys

from fleet_tui.scheduler.procs import proctree
from fleet_tui.scheduler.procs.attemptfiles import write_json


class Keeper:
    def __init__(
        self,
        owner: int,
        grace: float,
        pidfile: str,
        argv: list[str],
        umask: int | None = None,
        nice: int = 0,
    ) -> None:
        self.owner = owner
        self.nice = nice
        self.umask = umask
        self.grace = grace
        self.pidfile = pidfile
        self.argv = argv
        self.stop = False
        self.pid = os.getpid()

    def _alive_tree(self) -> list[proctree.Proc]:
        """Our descendants and the other members of our process group (not zombies)."""
        return proctree.tree(self.pid, group=self.pid)

    def _reap(self) -> None:
        proctree.reap_children()

    def kill_tree(self) -> None:
        proctree.kill_tree(self._alive_tree, self.grace, reap=self._reap)

    def run(self) -> int:
        proctree.die_with_parent(signal.SIGTERM)
        if os.getppid() != self.owner:
            return 125  # the owner died before we could watch it: start nothing
        proctree.become_subreaper()

        def on_term(signum: int, frame: object) -> None:
            self.stop = True

        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        signal.signal(signal.SIGHUP, on_term)
        if self.nice > 0:  # the command inherits it; the keeper only waits
            proctree.nice_at_least(self.nice)
            proctree.set_autogroup_nice(self.pid, self.nice)  # our session: the command's too
        # fleet-tui's files are private; the command works with the user's own umask
        own_umask = os.umask(self.umask) if self.umask is not None else None
        try:
            child = os.posix_spawnp(
                self.argv[0],
                self.argv,
                dict(os.environ),
                setsigdef=(signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE),
            )
        except OSError as e:
            os.write(2, f"fleet-tui: cannot start {self.argv[0]!r}: {e}\n".encode())
            return 127
        finally:
            if own_umask is not None:
                os.umask(own_umask)
        info: dict[str, object] = {
            "keeper_pid": self.pid,
            "keeper_ticks": proctree.proc_start_ticks(self.pid),
            "child_pid": child,
            "argv0": self.argv[0],
        }
        if self.pidfile:
            try:
                write_json(self.pidfile, info)
            except OSError:
                pass
        status: int | None = None
        try:
            while status is None:
                if self.stop:
                    self.kill_tree()
                    break
                select.select([wake_r], [], [], 0.2)
                try:
                    os.read(wake_r, 512)
                except BlockingIOError:
                    pass
                try:
                    wpid, wstatus = os.waitpid(child, os.WNOHANG)
                except ChildProcessError:
                    break
                if wpid == child:
                    status = wstatus
            if status is None:
                try:
                    _, status = os.waitpid(child, 0)
                except ChildProcessError:
                    status = None
            elif self._alive_tree():  # the command ended; what it left behind goes with it
                self.kill_tree()
        finally:
            if self.pidfile:
                try:
                    os.unlink(self.pidfile)
                except OSError:
                    pass
        if status is None:
            return 143
        if os.WIFSIGNALED(status):
            return 128 + os.WTERMSIG(status)
        return os.WEXITSTATUS(status)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        cut = args.index("--")
        owner, grace, pidfile = int(args[0]), float(args[1]), args[2]
        umask = int(args[3], 8) if cut > 3 and args[3] else None
        nice = int(args[4]) if cut > 4 and args[4] else 0
    except (ValueError, IndexError):
        print("usage: keeper OWNER_PID GRACE PIDFILE [UMASK [NICE]] -- ARGV...", file=sys.stderr)
        return 2
    if not args[cut + 1 :]:
        return 2
    return Keeper(owner, grace, pidfile, args[cut + 1 :], umask, nice).run()


if __name__ == "__main__":
    sys.exit(main())
