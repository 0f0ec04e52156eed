"""The ``agent`` verifier's reviewer: one read-only run of a coder that answers PASS or FAIL.

Why it exists: DESIGN section 7 lets a task be judged by another agent ("Review the diff for
missing auth checks"). That reviewer is not an attempt: it must not take a slot, touch the task's
state or ask a person, and it must leave the working directory as it found it. So it is run
here, outside the store, and waited for (the engine calls the verifiers in a thread). It is run
the way attempts are (``procs/invoke.py``): the coder builds the command exactly as for an
attempt (``prepare``, ``argv``, ``env``, ``stdin``) and a shim runs it in the task's working
directory, writing ``shim.json``, ``stdout.jsonl``, ``stderr.log`` and ``exit.json`` into the
review's folder; that shim is hosted by a keeper, so the reviewer's whole tree dies when it
overruns, when the task is stopped and when the engine dies. Its stdout goes through the coder's
own normalizer, so every vendor's stream format works without new parsing.

The reply handed to ``verify.py`` is the run's final result text (or its last text message);
when that has no verdict, every text message of the run, so a scripted ``@sim say=PASS`` or a
reviewer that states its verdict before a closing summary still counts. ``verify.py`` treats a
reply without PASS or FAIL as FAIL. A reviewer that fails to run (not found, an error result,
a timeout, files changed in a git working directory) raises ``ReviewerError``, which
``verify.py`` turns into a failed verifier with the reason.

Everything a review produced stays under ``tasks/<id>/reviews/<n>/`` (an attempt directory:
prompt, raw stdout, stderr, the shim's records, plus the reply), next to the attempts, for
``logs`` and post-mortems.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from dataclasses import replace
from pathlib import Path

from fleet_tui.coders.base import AttemptContext, Coder, CoderNotFound, get_coder
from fleet_tui.config import Config
from fleet_tui.scheduler.model import Task
from fleet_tui.scheduler.procs import attemptdir, invoke
from fleet_tui.scheduler.procs.attemptdir import ExitReason
from fleet_tui.scheduler.procs.invoke import Invocation, Ran
from fleet_tui.scheduler.sandbox import policy as sbp

#: how long one review may run unless its verifier says otherwise (``timeout_min``)
DEFAULT_TIMEOUT_S = 600.0
#: between SIGTERM and SIGKILL of an overrunning reviewer's process group
KILL_GRACE_S = 3.0
#: how much of a reviewer's stdout is read for its reply (its end)
OUTPUT_CAP = 64 << 20
#: environment variables of the engine that must not leak into a reviewer
_DROP_ENV = (
    "FLEET_PROMPT",
    "FLEET_MCP_COMMAND",
    "FLEET_ATTEMPT",
    "FLEET_TASK_NAME",
    "FLEET_WORKDIR",
    "FLEET_STORE",  # the store URL may carry a password: agents get none
)


class ReviewerError(RuntimeError):
    """The reviewer could not give a verdict; the message says why (shown as the verifier's output)."""


class Reviewer:
    """``(prompt, coder, model, workdir, timeout_s=...) -> reply``: what ``verify.AgentReviewer`` asks.

    One instance per task verification; each call is one review run in its own directory.
    """

    def __init__(self, home: Path, task: Task, cfg: Config) -> None:
        self.home = Path(home)
        self.task = task
        self.cfg = cfg
        #: what this task's reviews cost so far (added to the attempt's and the task's figures)
        self.cost_usd = 0.0
        self.tokens = 0
        #: set by the engine to stop a running review (kill, cancel, shutdown)
        self.cancel: threading.Event | None = None

    def coder_name(self, coder: str | None) -> str:
        """The verifier's coder, else the task's (frozen at claim, else its spec's), else the default."""
        return coder or self.task.coder or self.task.spec.coder or self.cfg.default_coder

    def reviews_dir(self) -> Path:
        return self.home / "tasks" / self.task.id / "reviews"

    def _new_dir(self) -> Path:
        root = self.reviews_dir()
        root.mkdir(parents=True, exist_ok=True)
        n = 1 + max((int(p.name) for p in root.iterdir() if p.name.isdigit()), default=0)
        while True:
            d = root / str(n)
            try:
                d.mkdir()
                return d
            except FileExistsError:  # another review of the same task started meanwhile
                n += 1

    def __call__(
        self,
        prompt: str,
        coder: str | None,
        model: str | None,
        workdir: Path,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> str:
        name = self.coder_name(coder)
        try:
            impl = get_coder(name)
        except CoderNotFound as e:
            raise ReviewerError(str(e)) from e
        ok, detail = impl.available()
        if not ok:
            raise ReviewerError(f"reviewer coder {name}: {detail}")
        workdir = Path(workdir)
        adir = self._new_dir()
        # the reviewer sees a task whose prompt is the review and whose coder/model are its own
        spec = replace(self.task.spec, prompt=prompt, coder=name, model=model, command=None)
        rtask = replace(self.task, spec=spec, coder=name, model=model)
        ctx = AttemptContext(
            task=rtask,
            attempt=self.task.attempt,  # so ``@sim:N`` lines in a review prompt follow the attempt
            prompt=prompt,
            workdir=workdir,
            attempt_dir=adir,
            home=self.home,
            model=model,
            mcp_command=(),  # no ask_human: a reviewer never waits on a person
        )
        (adir / attemptdir.PROMPT).write_text(prompt, encoding="utf-8")
        try:
            impl.prepare(ctx)
            argv = impl.argv(ctx)
            extra = impl.env(ctx)
            stdin = impl.stdin(ctx)
        except (ValueError, OSError) as e:
            raise ReviewerError(f"reviewer coder {name}: {e}") from e
        fleet = {
            "PWD": str(workdir),
            "FLEET_TASK_ID": self.task.id,
            "FLEET_REVIEW": "1",
            "FLEET_ATTEMPT": str(self.task.attempt),
        }
        env = invoke.environment(fleet, dict(self.task.spec.env), extra, drop=_DROP_ENV)
        argv = self._sandboxed(argv, impl, workdir, adir, env)
        before = _fingerprint(workdir)
        saved = _Snapshot.take(workdir) if before is not None else None
        inv = Invocation(tuple(argv), env, stdin, workdir, adir)
        ran = _run(inv, timeout_s, self.home, self.cancel, nice=self.cfg.agent_nice)
        if ran.cancelled:
            raise ReviewerError(f"the {name} reviewer was stopped (the task was stopped)")
        if ran.timed_out:
            raise ReviewerError(f"the {name} reviewer timed out after {timeout_s:g}s (killed)")
        out = _tail(adir / attemptdir.STDOUT, OUTPUT_CAP)
        code = ran.exit.exit_code if ran.exit is not None else None
        reply, problem, cost, tokens = _reply(impl, self.task.id, self.task.attempt, adir, out, code)
        self.cost_usd += cost
        self.tokens += tokens
        (adir / "reply.txt").write_text(reply, encoding="utf-8")
        after = _fingerprint(workdir)
        if before is not None and after is not None and before != after:
            # put the working directory back as the reviewer found it, or the next WIP commit
            # would take the reviewer's files as the agent's work
            undone = saved.restore(workdir) if saved is not None else []
            what = f"; undone: {', '.join(undone[:10])}" if undone else ""
            raise ReviewerError(
                f"the {name} reviewer changed files in {workdir}{what}; a reviewer must be read-only "
                f"(its reply was: {reply[-500:]!r})"
            )
        if problem:
            raise ReviewerError(problem)
        return reply

    def _sandboxed(
        self, argv: list[str], impl: Coder, workdir: Path, adir: Path, env: dict[str, str]
    ) -> list[str]:
        """``argv`` in the task's sandbox, read-only everywhere but the review's own folders."""
        mode = sbp.mode_of(self.task.spec.sandbox, self.cfg.sandbox)
        if mode == "none":
            return argv
        try:
            sbp.ensure_available(mode)
        except sbp.SandboxUnavailable as e:
            raise ReviewerError(f"reviewer not run: {e}") from e
        policy = sbp.for_task(
            self.task.spec, workdir=workdir, run_dir=adir, fleet_home=self.home, env=env, coder=impl,
            readonly=True,
        )  # fmt: skip
        return sbp.wrap(policy, adir, argv)


def make_reviewer(home: Path, task: Task, cfg: Config) -> Reviewer:
    """The reviewer ``agent`` verifiers of ``task`` use (see ``Engine.reviewer``)."""
    return Reviewer(home, task, cfg)


def _run(
    inv: Invocation,
    timeout_s: float,
    home: Path | None = None,
    cancel: threading.Event | None = None,
    nice: int = 0,
) -> Ran:
    """Run under a shim hosted by a keeper (``invoke.run``): on timeout or cancel, or when the
    engine dies, its whole process tree is stopped (TERM, grace, KILL). The reviewer is an agent:
    it runs at ``nice`` (``agent_nice``) as the task's agents do."""
    try:
        ran = invoke.run(inv, timeout_s=timeout_s, cancel=cancel, home=home, grace_s=KILL_GRACE_S, nice=nice)
    except OSError as e:
        raise ReviewerError(f"could not start the reviewer {inv.argv[0]!r}: {e}") from e
    if ran.exit is not None and ran.exit.reason == ExitReason.SPAWN_FAILED:
        raise ReviewerError(f"could not start the reviewer {inv.argv[0]!r}: {ran.exit.error}")
    return ran


def _tail(path: Path, cap: int) -> bytes:
    """The last ``cap`` bytes of ``path`` (empty when it is missing)."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - cap))
            return fh.read()
    except OSError:
        return b""


def _reply(
    impl: Coder, task_id: str, attempt: int, adir: Path, out: bytes, code: int | None
) -> tuple[str, str | None, float, int]:
    """Normalize the reviewer's stdout: (reply text, a problem that voids the verdict or None,
    its cost in USD, its tokens)."""
    norm = impl.normalizer(task_id, attempt, 0, adir)
    texts: list[str] = []
    result_text: str | None = None
    cost: float | None = None
    tokens = 0
    for raw in out.decode("utf-8", errors="replace").splitlines():
        try:
            events = norm.feed(raw, 0.0)
        except Exception:  # a coder bug must not hide the reply
            continue
        for e in events:
            if e.usage is not None:
                tokens += e.usage.total
            if e.cost_usd is not None:
                cost = e.cost_usd if e.kind == "result" else (cost or 0.0) + e.cost_usd
            if e.kind == "text" and e.text:
                texts.append(e.text)
            elif e.kind == "result" and e.text:
                result_text = e.text
    with contextlib.suppress(Exception):
        for e in norm.poll(0.0):
            if e.kind == "text" and e.text:
                texts.append(e.text)
    outcome = norm.outcome(code)
    final = outcome.result_text or result_text or (texts[-1] if texts else "")
    reply = final
    if not _has_verdict(final) and texts:
        body = texts if texts[-1] == final else [*texts, final]
        reply = "\n".join(t for t in body if t)
    problem = None
    if outcome.kind != "success":
        why = outcome.detail or (f"exit {code}" if code is not None else "no exit status")
        problem = f"the reviewer did not finish ({outcome.kind}: {why})"
    if cost is None:
        cost = outcome.cost_usd
    return reply, problem, float(cost or 0.0), tokens


def _has_verdict(text: str) -> bool:
    from fleet_tui.scheduler.policy.verify import verdict_of

    return verdict_of(text) is not None


def _fingerprint(workdir: Path) -> str | None:
    """A hash of a git working directory's changes (None outside git): the reviewer must not move it."""
    try:
        st = subprocess.run(
            ["git", "status", "--porcelain=v1", "-z", "--untracked-files=all"],
            cwd=workdir,
            capture_output=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        if st.returncode != 0:
            return None
        diff = subprocess.run(
            ["git", "diff", "HEAD", "--no-color", "--no-ext-diff"],
            cwd=workdir,
            capture_output=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    import hashlib  # here: it loads OpenSSL's library, a cost every command paid at start

    h = hashlib.sha256(st.stdout)
    h.update(diff.stdout)
    for line in st.stdout.split(b"\0"):  # untracked files' content is not in the diff
        if line.startswith(b"?? "):
            p = Path(workdir) / os.fsdecode(line[3:])
            with contextlib.suppress(OSError):
                h.update(p.read_bytes()[: 1 << 20])
    return h.hexdigest()


class _Snapshot:
    """A git working directory's state before a review: its changes as a stash commit (tracked
    files) and its untracked files, so whatever a reviewer changes can be undone."""

    def __init__(self, stash: str | None, untracked: dict[str, bytes | None]) -> None:
        self.stash = stash
        self.untracked = untracked

    @staticmethod
    def take(workdir: Path) -> _Snapshot | None:
        try:
            st = _git(workdir, "stash", "create")
            files = _git(workdir, "ls-files", "-z", "--others", "--exclude-standard")
        except (OSError, subprocess.SubprocessError):
            return None
        if files.returncode != 0:
            return None
        untracked: dict[str, bytes | None] = {}
        for rel in filter(None, files.stdout.split(b"\0")):
            name = os.fsdecode(rel)
            try:
                data = (Path(workdir) / name).read_bytes()
            except OSError:
                data = None
            untracked[name] = data if data is None or len(data) <= 1 << 20 else None
        stash = st.stdout.decode().strip() if st.returncode == 0 else ""
        return _Snapshot(stash or None, untracked)

    def restore(self, workdir: Path) -> list[str]:
        """Undo the review's changes; returns the paths that were put back or removed."""
        undone: list[str] = []
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            diff = _git(workdir, "diff", "--name-only", "-z", self.stash or "HEAD")
            undone += [os.fsdecode(p) for p in diff.stdout.split(b"\0") if p]
            _git(workdir, "checkout", "-f", self.stash or "HEAD", "--", ".")
            _git(workdir, "reset", "-q")
            files = _git(workdir, "ls-files", "-z", "--others", "--exclude-standard")
            for rel in filter(None, files.stdout.split(b"\0")):
                name = os.fsdecode(rel)
                if name not in self.untracked:
                    (Path(workdir) / name).unlink(missing_ok=True)
                    undone.append(name)
            for name, data in self.untracked.items():
                p = Path(workdir) / name
                if data is not None and (not p.exists() or p.read_bytes() != data):
                    p.parent.mkdir(parents=True, exist_ok=True)
                    p.write_bytes(data)
                    undone.append(name)
        return sorted(set(undone))


def _git(workdir: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", *args], cwd=workdir, capture_output=True, timeout=60, stdin=subprocess.DEVNULL
    )
