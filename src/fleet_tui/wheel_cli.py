"""The "take the wheel" verbs of the command line: send, approve, edit, takeover.

Why a module of their own: they are the person stepping into a task (a follow-up into the agent's
own conversation, settling a parked task, editing a queued one, driving the agent's CLI by
hand), and keeping them here leaves cli.py a plain table of verbs. Each verb is argument
handling around an engine-side function (scheduler/humans/followup.py, scheduler/humans/settle.py).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio

from fleet_tui.cli_context import UserError, coder_tools, controller, merger, task_or_fail
from fleet_tui.scheduler.humans.inbox import sanitize_for_display as clean


def register(sub: Any) -> dict[str, Any]:
    """Add the verbs to the CLI's subparsers; returns their handlers by name."""
    s = sub.add_parser("send", help="a follow-up: continue the task's conversation with MESSAGE")
    s.add_argument("task")
    s.add_argument("message", help="the next turn for the agent ('-' reads it from stdin)")
    a = sub.add_parser("approve", help="a parked (needs_human) task becomes done, approved by you")
    a.add_argument("task")
    e = sub.add_parser("edit", help="edit a queued task's TOML in $EDITOR (validated like a task file)")
    e.add_argument("task")
    t = sub.add_parser(
        "takeover", help="stop the task's agent and open its CLI's own session in the worktree, by hand"
    )
    t.add_argument("task")
    t.add_argument(
        "--then",
        choices=("verify", "requeue", "done", "leave"),
        help="what to do when you exit (default: ask)",
    )
    t.add_argument("--foreground", action="store_true", help="in this terminal even inside tmux")
    return {"send": cmd_send, "approve": cmd_approve, "edit": cmd_edit, "takeover": cmd_takeover}


def _fail(message: str) -> Exception:

    return UserError(message)


def cmd_send(ctx: Any) -> int:
    from fleet_tui.scheduler.humans import followup

    args: argparse.Namespace = ctx.args
    text = sys.stdin.read() if args.message == "-" else args.message
    res = anyio.run(followup.send, controller(ctx), args.task, text)
    if not res.ok:
        raise _fail(res.message)
    print(clean(res.message))
    return 0


def cmd_approve(ctx: Any) -> int:
    from fleet_tui.scheduler.humans import followup, settle

    ctl = controller(ctx)
    res = anyio.run(settle.approve, ctl, ctx.args.task, followup.user_name())
    if not res.ok:
        raise _fail(res.message)
    if res.task is not None:  # what its worktree holds goes to the branch; auto-merge if asked
        merger(ctx, ctl).after_done(res.task)
    print(clean(res.message))
    return 0


EDIT_HEADER = (
    "# fleet-tui edit {name}: change the task, save and quit (an unchanged file changes nothing).\n"
    "# Checked like a task file; cwd stays absolute; name and depends_on cannot change here.\n"
)


def cmd_edit(ctx: Any) -> int:
    import tomlkit

    from fleet_tui.scheduler.humans import settle
    from fleet_tui.scheduler.states import TaskStatus
    from fleet_tui.taskfile import load_taskfile, spec_table

    t = task_or_fail(ctx, ctx.args.task)
    if t.status != TaskStatus.QUEUED:
        raise _fail(
            f"{t.name} is {t.status.value}: only a queued task can be edited "
            "(a finished one takes a follow-up: `fleet-tui send`)"
        )
    folder = Path(tempfile.mkdtemp(prefix="fleet-edit-"))
    path = folder / f"{t.name}.toml"
    before = EDIT_HEADER.format(name=t.name) + tomlkit.dumps({"task": [spec_table(t.spec)]})
    path.write_text(before, encoding="utf-8")
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    try:
        rc = subprocess.call([*shlex.split(editor), str(path)])
    except OSError as e:
        raise _fail(f"cannot start the editor {editor!r}: {e}; set $EDITOR") from e
    if rc != 0:
        raise _fail(f"the editor exited {rc}; nothing changed (your edit is in {path})")
    if path.read_text(encoding="utf-8") == before:
        print(f"{t.name}: unchanged")
        return 0
    names, available = coder_tools()
    others = ctx.store.task_names() - {t.name}
    res = load_taskfile(path, known_coders=names, existing_names=others, coder_available=available)
    if not res.ok or len(res.specs) != 1:
        for err in res.errors:
            print(clean(str(err)), file=sys.stderr)
        if res.ok:
            print(f"{path}: holds {len(res.specs)} tasks; keep exactly one [[task]]", file=sys.stderr)
        raise _fail(f"nothing changed; fix the file and run edit again (your edit is in {path})")
    new = replace(res.specs[0], source=t.spec.source)
    why = settle.check_edit(t.spec, new)
    if why:
        raise _fail(f"{why} (your edit is in {path})")
    if ctx.store.update_spec(t.id, new, time.time()) is None:
        raise _fail(f"{t.name} left the queue meanwhile; nothing changed (your edit is in {path})")
    path.unlink(missing_ok=True)
    folder.rmdir()
    print(f"{t.name}: edited")
    return 0


TAKEOVER_QUESTION = "{name}: you are back. [v]erify now, [r]equeue, mark [d]one, or [l]eave parked? "
_KEYS = {"v": "verify", "r": "requeue", "d": "done", "l": "leave"}


def _ask(name: str) -> str:
    while True:
        try:
            answer = input(TAKEOVER_QUESTION.format(name=name)).strip().lower()
        except EOFError:
            return "leave"
        choice = _KEYS.get(answer[:1]) if answer else None
        if choice:
            return choice


def cmd_takeover(ctx: Any) -> int:
    from fleet_tui.scheduler.humans import followup, takeover
    from fleet_tui.scheduler.policy.review import make_reviewer
    from fleet_tui.scheduler.policy.verify import run_verifiers
    from fleet_tui.scheduler.sandbox.policy import verifier_wrap

    by = followup.user_name()
    ctl = controller(ctx)
    res = anyio.run(takeover.begin, ctl, ctx.args.task, by)
    if not res.ok or res.task is None:
        raise _fail(res.message)
    task = res.task
    it = takeover.interactive_command(ctx.store, ctx.home, ctx.cfg.default_coder, task)
    if it.note:
        print(f"{task.name}: {it.note}", file=sys.stderr)
    print(clean(f"{task.name}: {task.reason}; opening {shlex.join(it.argv)} in {it.workdir}"), flush=True)
    if os.environ.get("TMUX") and not ctx.args.foreground:
        err = takeover.open_tmux_window(it, f"takeover:{task.name}")
        if err:
            raise _fail(f"{err}; the task stays taken over: run takeover with --foreground")
    else:
        try:
            subprocess.call(it.argv, cwd=it.workdir, env={**os.environ, **it.env, "PWD": it.workdir})
        except OSError as e:
            print(f"{task.name}: cannot start {it.argv[0]}: {e}", file=sys.stderr)
    choice = ctx.args.then or _ask(task.name)

    def verify(t: Any) -> takeover.VerifyVerdict:
        wd = Path(t.workdir or t.worktree or t.spec.cwd)
        wrap = verifier_wrap(ctx.home, ctx.cfg.sandbox, t, wd)
        reviewer = (
            make_reviewer(ctx.home, t, ctx.cfg) if any(v.kind == "agent" for v in t.spec.verify) else None
        )
        vr = run_verifiers(t.spec.verify, wd, reviewer=reviewer, wrap=wrap)
        return takeover.VerifyVerdict(vr.passed, vr.label, vr.output or "")

    out = anyio.run(takeover.finish, ctl, task.id, choice, by, verify)
    if out.ok and out.task is not None and out.task.status.value == "done":
        merger(ctx, ctl).after_done(out.task)
    if not out.ok:
        raise _fail(out.message)
    print(clean(out.message))
    return 0
