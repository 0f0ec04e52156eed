"""Verifiers: the evidence a task is done (DESIGN section 7).

``run`` executes a shell command in the task's working directory under a keeper (owned.py: it
dies with the engine and stops when the task is stopped; its exit code is the verdict, its output
is kept), ``artifact`` checks a file (exists, long enough, contains each string),
``agent`` asks a read-only reviewer through a coder and needs an explicit PASS (a reply without
PASS or FAIL counts as FAIL). They run in order and stop at the first failure.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fleet_tui.scheduler.model import VerifySpec
from fleet_tui.scheduler.procs.owned import run_owned

OUTPUT_CAP = 64 * 1024


@dataclass(frozen=True)
class VerifyResult:
    """What a task's verifiers said: passed, or which one failed and why."""

    passed: bool
    label: str | None  # the failing verifier's label
    output: str  # every verifier's output, in order
    reason: str | None = None  # why it failed, in a few words (a reviewer's verdict, not its prompt)


class AgentReviewer(Protocol):
    """Runs a read-only reviewer (``review.make_reviewer``): the reply text, or raises with why not."""

    def __call__(
        self, prompt: str, coder: str | None, model: str | None, workdir: Path, timeout_s: float = ...
    ) -> str: ...


def _cap(text: str) -> str:
    return text if len(text) <= OUTPUT_CAP else text[:2000] + "\n[...]\n" + text[-(OUTPUT_CAP - 2100) :]


def run_verifier(
    v: VerifySpec,
    workdir: Path,
    timeout_s: float,
    reviewer: AgentReviewer | None,
    wrap: Callable[[list[str]], list[str]] | None = None,
    cancel: threading.Event | None = None,
    home: Path | None = None,
    nice: int = 0,
) -> tuple[bool, str]:
    if v.kind == "run":
        argv = ["/bin/sh", "-c", v.run or "false"]
        if wrap is not None:  # the task's sandbox (sandbox_policy.verifier_wrap)
            try:
                argv = wrap(argv)
            except Exception as e:
                return False, f"not run: {e}"
        try:
            p = run_owned(
                argv,
                cwd=workdir,
                timeout_s=timeout_s,
                cancel=cancel,
                home=home,
                merge_stderr=True,
                nice=nice,
            )
        except OSError as e:
            return False, f"could not run: {e}"
        if p.cancelled:
            return False, "stopped: the task was stopped during verification"
        if p.timed_out:
            return False, f"timed out after {timeout_s:g}s"
        out = p.stdout.decode("utf-8", errors="replace")
        return p.exit_code == 0, _cap(out + f"\n(exit {p.exit_code})")
    if v.kind == "artifact":
        path = workdir / (v.path or "")
        if not path.is_file():
            return False, f"{v.path}: missing"
        text = path.read_text(encoding="utf-8", errors="replace")
        if len(text) < v.min_chars:
            return False, f"{v.path}: {len(text)} characters < {v.min_chars}"
        missing = [s for s in v.contains if s not in text]
        if missing:
            return False, f"{v.path}: does not contain {', '.join(repr(m) for m in missing)}"
        return True, f"{v.path}: ok ({len(text)} characters)"
    if reviewer is None:
        return False, "no agent reviewer available"
    prompt = (
        f"{v.agent}\n\nYou are a read-only reviewer: do not change any file. End your reply with a "
        "line that is exactly PASS or FAIL."
    )
    try:
        reply = reviewer(prompt, v.coder, v.model, workdir, timeout_s=timeout_s)
    except Exception as e:
        return False, f"reviewer failed: {e}"
    verdict = verdict_of(reply)
    if verdict is None:
        return False, _cap(reply) + "\n(no PASS or FAIL in the reply: counted as FAIL)"
    return verdict == "PASS", _cap(reply)


def failure_reason(v: VerifySpec, out: str) -> str:
    """A failed verifier in a few words: a run's command, an artifact's problem, or what a
    reviewer said (its last line that is more than the bare verdict), never its prompt."""
    if v.kind == "run":
        return v.label
    lines = [ln.strip() for ln in out.strip().splitlines() if ln.strip()]
    if v.kind == "artifact":
        return f"artifact: {lines[0] if lines else v.path}"
    # the reviewer's words next to its last FAIL: that line without the verdict, or the line before
    at = max((i for i, ln in enumerate(lines) if re.search(r"\bFAIL\b", ln)), default=None)
    text = ""
    if at is not None:
        text = re.sub(r"[*_`#>\s-]*\bFAIL\b[*_`:.!\s-]*", " ", lines[at]).strip()
        if not text and at > 0:
            text = lines[at - 1]
    if not text:
        said = [ln for ln in lines if not ln.startswith(("(no PASS or FAIL", "=="))]
        text = said[-1] if said else "no reply"
    return "agent: " + (text if len(text) <= 120 else text[:119] + "…")


def verdict_of(reply: str) -> str | None:
    """The reply's last PASS or FAIL (a whole word), or None."""
    found = re.findall(r"\b(PASS|FAIL)\b", reply)
    return found[-1] if found else None


def run_verifiers(
    specs: Sequence[VerifySpec],
    workdir: Path,
    timeout_s: float = 600.0,
    reviewer: AgentReviewer | None = None,
    wrap: Callable[[list[str]], list[str]] | None = None,
    cancel: threading.Event | None = None,
    home: Path | None = None,
    nice: int = 0,
) -> VerifyResult:
    """Run each verifier in order (blocking). Setting ``cancel`` stops the running one (its whole
    process tree) and the rest: the result is then a failure the caller must not count. Commands
    run at niceness ``nice`` (the engine's ``agent_nice``: they are the agents' work)."""
    outputs: list[str] = []
    for v in specs:
        if cancel is not None and cancel.is_set():
            return VerifyResult(False, v.label, "\n".join([*outputs, "stopped during verification"]))
        t = v.timeout_min * 60 if v.timeout_min else timeout_s
        ok, out = run_verifier(v, workdir, t, reviewer, wrap, cancel, home, nice)
        outputs.append(f"== {v.label}: {'PASS' if ok else 'FAIL'}\n{out.strip()}")
        if not ok:
            return VerifyResult(False, v.label, "\n".join(outputs), failure_reason(v, out))
    return VerifyResult(True, None, "\n".join(outputs))
