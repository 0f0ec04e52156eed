"""The command line (DESIGN section 9): argument parsing that hands off to the engine or the app.

No logic of its own beyond turning arguments into calls and results into text or stable JSON.
Exit codes: 0 ok, 1 a user error (the message on stderr names the problem and the fix), 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from fleet_tui import __version__, wheel_cli
from fleet_tui.cli_context import (
    Ctx,
    UserError,
    coder_tools,
    controller,
    merger,
    task_or_fail,
)
from fleet_tui.report import (
    elapsed,
    event_json,
    event_line,
    fmt_dur,
    group_by_repo,
    print_graph,
    task_json,
    why,
)
from fleet_tui.scheduler.humans.inbox import sanitize_for_display as clean


def _slug(text: str) -> str:
    words = re.findall(r"[a-z0-9]+", text.lower())[:4]
    return ("-".join(words) or "task")[:40] + "-" + os.urandom(2).hex()


# -- commands -----------------------------------------------------------------------------------
def cmd_add(ctx: Ctx) -> int:
    from fleet_tui.scheduler.model import TaskSpec, VerifySpec
    from fleet_tui.taskfile import validate_spec

    a = ctx.args
    # said here: the task file's wording ('has no prompt: add prompt = "..."') fits no command line
    if not a.prompt.strip() and not a.command:
        raise UserError(
            'the prompt is empty: say what the agent should do (fleet-tui add "Fix the flaky test")'
        )
    coder = a.coder or ("shell" if a.command else None)
    spec = TaskSpec(
        name=a.name or _slug(a.prompt),
        prompt=a.prompt,
        cwd=str(Path(a.cwd).resolve()),
        coder=coder,
        model=a.model,
        command=a.command,
        git_ref=a.git_ref,
        priority=a.priority,
        depends_on=tuple(a.after),
        max_retries=a.max_retries,
        verify=tuple(VerifySpec(kind="run", run=v) for v in a.verify),
        timeout_min=a.timeout_min,
        budget_usd=a.budget_usd,
        merge=a.merge,
        source="fleet-tui add",
        notify_done=a.notify_done,
    )
    names, available = coder_tools()
    problems = validate_spec(
        spec,
        known_coders=names,
        existing_names=_name_statuses(ctx),
        coder_available=available,
        default_coder=ctx.cfg.default_coder,
    )
    if problems:
        raise UserError("cannot add the task:\n" + "\n".join(f"  {p}" for p in problems))
    res = anyio.run(controller(ctx).add, [spec])
    if not res.ok:
        raise UserError(res.message)
    print(res.task.id)
    return 0


def _name_statuses(ctx: Ctx) -> dict[str, str]:
    """Each task name in the store and the status of its newest task (a finished one's name may be
    taken again)."""
    return {t.name: t.status.value for t in ctx.store.list_tasks()}


def cmd_import(ctx: Ctx) -> int:
    """``import github OWNER/REPO``: one task per matching open issue not imported yet."""
    from fleet_tui.scheduler.github import ghimport
    from fleet_tui.scheduler.github.api import GitHub, GitHubError
    from fleet_tui.scheduler.github.pullrequest import put_link
    from fleet_tui.scheduler.model import TaskSpec, VerifySpec
    from fleet_tui.taskfile import validate_spec

    a = ctx.args
    if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", a.repo):
        raise UserError(f"import github: {a.repo!r} is not OWNER/REPO (like octo/widgets)")
    cwd = Path(a.cwd).resolve()
    git_ref = a.git_ref
    if git_ref is None and a.merge == "pr":  # a pull request needs a branch: the checkout's branch
        from fleet_tui.scheduler.git.worktree import _git

        status, out, _ = _git(cwd, "symbolic-ref", "--short", "-q", "HEAD", check=False)
        if status != 0 or not out.strip():
            raise UserError(
                f"import github: {cwd} is not on a git branch: give --cwd a checkout of {a.repo} or --git-ref"
            )
        git_ref = out.strip()
    template = TaskSpec(
        name="-",
        prompt="-",
        cwd=str(cwd),
        coder=a.coder,
        model=a.model,
        git_ref=git_ref,
        priority=a.priority,
        verify=tuple(VerifySpec(kind="run", run=v) for v in a.verify),
        merge=a.merge,
    )
    try:
        issues = GitHub().issues(a.repo, label=a.label, assignee=a.assignee, milestone=a.milestone)
    except GitHubError as e:
        raise UserError(f"import github {a.repo}: {e}") from None
    store = ctx.store
    planned = ghimport.plan(a.repo, issues, template, [t.spec for t in store.list_tasks()])
    specs = [p.spec for p in planned if p.spec is not None]
    names, available = coder_tools()
    taken = _name_statuses(ctx)
    for spec in specs:
        if problems := validate_spec(
            spec, known_coders=names, existing_names=taken, coder_available=available
        ):
            raise UserError(f"cannot import issue {spec.source}:\n" + "\n".join(f"  {p}" for p in problems))
    tasks = store.add_tasks(specs, time.time()) if specs else []
    for t, p in zip(tasks, [p for p in planned if p.spec is not None], strict=True):
        put_link(
            store,
            t.id,
            {"repo": a.repo, "issue": p.issue.number, "issue_url": p.issue.url, "comment": a.comment},
        )
        print(f"{t.id}  {t.name}  <- {p.issue.url}")
    skipped = len(planned) - len(specs)
    print(f"queued {len(tasks)} task(s) from {len(issues)} matching issue(s); {skipped} already imported")
    return 0


def _load(ctx: Ctx, path: str) -> Any:
    from fleet_tui.taskfile import load_taskfile

    p = Path(path)
    if not p.is_file():
        raise UserError(f"{path}: {'not a regular file' if p.exists() else 'no such file'}")
    names, available = coder_tools()
    existing = _name_statuses(ctx) if ctx.args.cmd == "load" else {}
    return load_taskfile(
        p,
        known_coders=names,
        existing_names=existing,
        coder_available=available,
        default_coder=ctx.cfg.default_coder,
    )


def cmd_validate(ctx: Ctx) -> int:
    res = _load(ctx, ctx.args.file)
    for w in res.warnings:
        print(f"{clean(str(w))} (warning)", file=sys.stderr)
    if not res.ok:
        for e in res.errors:
            print(clean(str(e)), file=sys.stderr)
        print(f"{len(res.errors)} problem(s); nothing queued", file=sys.stderr)
        return 1
    print(f"{ctx.args.file}: {len(res.specs)} task(s), no problems")
    return 0


def cmd_load(ctx: Ctx) -> int:
    res = _load(ctx, ctx.args.file)
    if not res.ok:
        for e in res.errors:
            print(clean(str(e)), file=sys.stderr)
        print(f"{len(res.errors)} problem(s); nothing queued", file=sys.stderr)
        return 1
    out = anyio.run(controller(ctx).add, list(res.specs))
    if not out.ok:
        raise UserError(out.message)
    print(clean(out.message))
    return 0


def _engine(ctx: Ctx, **kw: Any) -> Any:
    from fleet_tui.scheduler.engine import Engine

    return Engine(ctx.store, ctx.home, ctx.cfg, config_path=ctx.config_path, **kw)


def _shim_pool(ctx: Ctx) -> Any:
    """The shims' fork server, started before the engine is imported: its interpreter's start
    and its first spare attempt folders then happen while this process imports (on another
    core), not between the engine's start and its first agent's."""
    if ctx.cfg.max_concurrent < 1:
        return None
    from fleet_tui.scheduler.procs.invoke import ShimPool

    pool = ShimPool.for_home(ctx.home, ctx.cfg.max_concurrent, ctx.cfg.agent_nice)
    pool.fill()
    return pool


def cmd_run(ctx: Ctx) -> int:
    import dataclasses

    a = ctx.args
    if a.max_concurrent is not None:
        if a.max_concurrent < 1:
            raise UserError("--max-concurrent must be at least 1")
        ctx._cfg = dataclasses.replace(ctx.cfg, max_concurrent=a.max_concurrent)
    engine = _engine(ctx, host=a.host_name, tags=a.tag or (), shim_pool=_shim_pool(ctx))
    if a.max_concurrent is not None:
        engine.overrides["max_concurrent"] = a.max_concurrent  # the flag wins over hot reloads
    if a.max_wait is not None:
        if a.max_wait < 0:
            raise UserError("--max-wait must be 0 or more seconds")
        engine.max_wait = a.max_wait
    from fleet_tui.runlog import RunPrinter, run_headless

    printer = RunPrinter(as_json=a.json, host=engine.host) if not a.quiet else None
    if printer is not None:
        printer.prime(ctx.store.list_tasks())
    try:
        return run_headless(
            engine, ctx.store, until_idle=a.until_idle, on_quit=ctx.cfg.on_quit, printer=printer
        )
    except BaseException as e:  # a store that failed for good: one clear line, no traceback
        from fleet_tui.scheduler.store.outage import store_error_of

        err = store_error_of(e)
        if err is None:
            raise
        raise UserError(str(err)) from None


def _fresh_waiting(ctx: Ctx, tasks: list[Any], now: float) -> list[Any]:
    from fleet_tui.report import fresh_waiting

    cfg = ctx.cfg
    return fresh_waiting(
        ctx.store, tasks, now, cfg.stale_s, lambda: anyio.run(_engine(ctx).plan), cfg.max_concurrent
    )


def cmd_status(ctx: Ctx) -> int:
    if getattr(ctx.args, "gauges", False):
        from fleet_tui.report import print_gauges

        return print_gauges(ctx.store, ctx.cfg, ctx.home, as_json=ctx.args.json)
    from fleet_tui.scheduler.control import archived_ids

    store = ctx.store
    now = time.time()
    tasks = store.list_tasks()
    if not ctx.args.all:
        hidden = archived_ids(store)
        tasks = [t for t in tasks if t.id not in hidden]
    tasks = _fresh_waiting(ctx, tasks, now)
    from fleet_tui.scheduler.github.pullrequest import link_json, link_line
    from fleet_tui.scheduler.github.pullrequest import links as pr_links

    links = pr_links(store, tasks)
    if ctx.args.json:
        from fleet_tui.scheduler.timing import work_s

        out = []
        for t in tasks:
            d = task_json(t, now)
            atts = store.attempts(t.id)
            d["verify_output"] = atts[-1].verify_output if atts else None
            d["last_outcome"] = atts[-1].outcome if atts else None
            d["work_s"] = work_s(atts, now) if atts else None
            d["pull_request"] = link_json(links.get(t.id))
            d["issue_url"] = links.get(t.id, {}).get("issue_url")
            out.append(d)
        print(json.dumps(out, indent=1))
        return 0
    if ctx.args.graph:
        return print_graph(tasks)
    if not tasks:
        print("no tasks (add one: fleet-tui add PROMPT, or fleet-tui load tasks.toml)")
        return 0
    names = {t.name: t for t in tasks}
    w = max(len(t.name) for t in tasks)
    groups = group_by_repo(tasks) if ctx.args.group == "repo" else [("", tasks)]
    for header, members in groups:
        if header:
            print(header)
        for t in members:
            coder = "/".join(x for x in (t.coder or t.spec.coder, t.model or t.spec.model) if x)
            print(
                f"{'  ' if header else ''}{t.id}  {t.name:<{w}}  {t.status.value:<11} "
                f"{fmt_dur(elapsed(t, now)):>7}  a{t.attempt}  "
                f"{clean(coder, one_line=True):<14} {clean(why(t, names), one_line=True)}"
                f"{'  · ' + clean(pr, one_line=True) if (pr := link_line(links.get(t.id))) else ''}".rstrip()
            )
    return 0


#: events read per page by ``logs``: all are shown, this many at a time (bounded memory)
LOGS_PAGE = 1000


def _write_raw(path: Path, tty: bool) -> None:
    """One attempt's raw stdout.jsonl, streamed: bytes as they are into a pipe or a file; on a
    terminal, its control characters shown instead of obeyed (a vendor line can hold escapes)."""
    import codecs
    import shutil

    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return
    with fh:
        if not tty:
            shutil.copyfileobj(fh, sys.stdout.buffer, 1 << 20)
            return
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        while piece := fh.readline(1 << 20):
            text = decoder.decode(piece)
            sys.stdout.write(clean(text.rstrip("\n")) + ("\n" if text.endswith("\n") else ""))
        sys.stdout.write(clean(decoder.decode(b"", final=True)))


def cmd_logs(ctx: Ctx) -> int:
    t = task_or_fail(ctx, ctx.args.task)
    store = ctx.store
    if ctx.args.raw:
        from fleet_tui.scheduler.attempts.launch import attempt_dir
        from fleet_tui.scheduler.procs import attemptdir

        tty = sys.stdout.isatty()
        for n in range(1, t.attempt + 1):
            _write_raw(attempt_dir(ctx.home, t.id, n) / attemptdir.STDOUT, tty)
        sys.stdout.flush()
        return 0
    after: tuple[int, int] | None = None
    while True:
        got = 0
        while True:  # every event, in order, one page at a time
            evs = store.events(t.id, after=after, limit=LOGS_PAGE)
            for e in evs:
                print(json.dumps(event_json(e)) if ctx.args.json else event_line(e))
            got += len(evs)
            if evs:
                after = (evs[-1].attempt, evs[-1].seq)
            if len(evs) < LOGS_PAGE:
                break
        sys.stdout.flush()
        if not ctx.args.follow:
            return 0
        cur = store.get_task(t.id)
        if not got and cur is not None and cur.status.value in ("done", "cancelled", "needs_human"):
            return 0
        time.sleep(0.2)


def cmd_simple(ctx: Ctx) -> int:
    verb = ctx.args.cmd
    ref = ctx.args.task
    if verb in ("pause", "resume") and ctx.args.all:
        ref = None
    elif ref is None:
        raise UserError(f"{verb}: give a TASK (or --all for pause/resume)")
    c = controller(ctx)
    if verb == "merge":
        res = anyio.run(merger(ctx, c).merge, ref)
    else:
        fn = getattr(c, verb)
        res = anyio.run(fn, ref)
    if not res.ok:
        raise UserError(res.message)
    print(clean(res.message))
    return 0


def cmd_archive(ctx: Ctx) -> int:
    """Keep finished tasks out of status and the cockpit; their records stay (``status --all``)."""
    from fleet_tui.scheduler.control import archive

    found = [task_or_fail(ctx, ref) for ref in ctx.args.tasks]
    busy = [t for t in found if t.status.value not in ("done", "cancelled")]
    if busy:
        raise UserError(
            "only finished tasks are archived: "
            + ", ".join(f"{t.name} is {t.status.value}" for t in busy)
            + " (cancel a task first to archive it)"
        )
    archive(ctx.store, found)
    print(f"archived {len(found)}: {', '.join(t.name for t in found)} (`fleet-tui status --all` shows them)")
    return 0


def cmd_questions(ctx: Ctx) -> int:
    from fleet_tui.scheduler.humans.inbox import choices, free_text

    qs = ctx.store.pending_questions()
    names = {t.id: t.name for t in ctx.store.list_tasks()}
    if ctx.args.json:
        print(
            json.dumps(
                [
                    {
                        "id": q.id,
                        "task_id": q.task_id,
                        "task": names.get(q.task_id),
                        "attempt": q.attempt,
                        "asked_at": q.asked_at,
                        "text": q.text,
                        "options": list(choices(q)),
                        "free_text": free_text(q),
                        "status": q.status,
                    }
                    for q in qs
                ],
                indent=1,
            )
        )
        return 0
    if not qs:
        print("no pending questions")
    for q in qs:  # agent-provided text is data: never let it drive the terminal
        shown = [clean(o, one_line=True) for o in choices(q)]
        if shown and free_text(q):
            shown.append("or any answer")
        opts = f"  [{' | '.join(shown)}]" if shown else ""
        print(f"{q.id}  {names.get(q.task_id, q.task_id)}: {clean(q.text, one_line=True)}{opts}")
    return 0


def cmd_answer(ctx: Ctx) -> int:
    from fleet_tui.scheduler.procs.attempt_guard import inside_attempt

    why_inside = inside_attempt()
    if why_inside is not None:  # an agent must not answer its own or another agent's question
        raise UserError(
            f"answer refused: {why_inside}; only a person answers questions "
            "(from a shell of their own or the cockpit's inbox)"
        )
    res = anyio.run(controller(ctx).answer, ctx.args.question, ctx.args.text)
    if not res.ok:
        raise UserError(res.message)
    print(clean(res.message))
    return 0


def cmd_config(ctx: Ctx) -> int:
    from fleet_tui.config import KEYS, ConfigError, format_value, get_value, set_value
    from fleet_tui.redact import redact_config_value as _redact

    key = ctx.args.key
    try:
        if ctx.args.action == "get":
            try:
                print(_redact(key, get_value(ctx.config_path, key)))
            except ConfigError:
                if key not in KEYS:
                    raise
                print(_redact(key, format_value(getattr(ctx.cfg, key))))  # lenient, warned on stderr
        else:
            if ctx.args.value is None:
                raise UserError("config set KEY VALUE: give a value")
            ctx.ready_home()
            left = set_value(ctx.config_path, key, ctx.args.value)
            from fleet_tui.config import load_config_lenient, parse_value

            if left:
                shown = format_value(parse_value(key, ctx.args.value))
                print(f"{key} = {_redact(key, shown)}")
                print("the config still has problems:\n" + "\n".join(left), file=sys.stderr)
            else:
                value = format_value(getattr(load_config_lenient(ctx.config_path)[0], key))
                print(f"{key} = {_redact(key, value)}")
    except ConfigError as e:
        raise UserError(str(e)) from e
    return 0


def cmd_plan(ctx: Ctx) -> int:
    import dataclasses

    from fleet_tui.coders.base import get_coder
    from fleet_tui.scheduler import caps

    eng = _engine(ctx)
    # the slots of this machine's engines as they run (``run --max-concurrent``, say)
    cap = caps.live_total(ctx.store, time.time(), ctx.cfg.stale_s, ctx.cfg.max_concurrent, host=eng.host)
    eng.cfg = dataclasses.replace(eng.cfg, max_concurrent=cap)
    decisions = eng.planner.plan(False, _running_here(ctx, eng.host))
    if not decisions:
        print("nothing queued")
    usable: dict[str, tuple[bool, str]] = {}
    for t, d in decisions:
        coder = t.coder or t.spec.coder or ctx.cfg.default_coder
        if coder not in usable:
            try:
                usable[coder] = get_coder(coder).available()
            except Exception as e:
                usable[coder] = (False, str(e))
        ok, detail = usable[coder]
        if not ok:  # the engine would claim it and park it as never_started: say so now
            print(f"{t.name}: waits: never starts here: {clean(detail, one_line=True)}")
        else:
            print(f"{t.name}: {'would start' if d.ok else 'waits: ' + clean(d.reason or '?', one_line=True)}")
    return 0


def _agents_by_host(ctx: Ctx, owners: set[str] | None = None) -> dict[str, int]:
    """Running agents per host, counted from the tasks (of these engines only, when given): two
    engines on one machine (a `run` and a cockpit, say) write the same host row in turn, each
    with its own agents only."""
    from fleet_tui.scheduler.states import ACTIVE

    running: dict[str, int] = {}
    for t in ctx.store.list_tasks():
        if t.status in ACTIVE and t.host and (owners is None or t.owner in owners):
            running[t.host] = running.get(t.host, 0) + 1
    return running


def _running_here(ctx: Ctx, host: str) -> int:
    """The agents the live engines on this machine run now: the slots a plan made here counts
    as taken. The plan's own engine has none; counted as free, a queue behind a running engine's
    full slots read "would start" while that engine, rightly, started nothing."""
    live = {e["owner"] for e in ctx.store.live_engines(time.time(), ctx.cfg.stale_s)}
    return _agents_by_host(ctx, live).get(host, 0) if live else 0


def cmd_hosts(ctx: Ctx) -> int:
    from fleet_tui.scheduler.policy.headroom import format_gib

    now = time.time()
    hosts = ctx.store.hosts()
    if not hosts:
        print("no hosts have run an engine on this store yet")
    running = _agents_by_host(ctx) if hosts else {}  # a live host's, not its row's last writer's
    for h in hosts:
        age = now - h.heartbeat
        live = age < ctx.cfg.stale_s
        # a silent host's figures are its last report, not the present: say how old they are
        state = "live" if live else f"silent {fmt_dur(age)} (its figures are that old)"
        mem = format_gib(h.mem_available) if h.mem_available is not None else "?"
        disk = format_gib(h.disk_free) if h.disk_free is not None else "?"
        load = f"{h.load:.2f}" if h.load is not None else "?"
        line = (
            f"{h.name}  {state}  cores {h.cores}  load/core {load}  mem {mem}  disk {disk}  "
            f"running {running.get(h.name, 0) if live else f'none now ({h.running} at its last report)'}  "
            f"tags {','.join(h.tags) or '-'}  v{h.version}"
        )
        print(clean(line, one_line=True))  # another host wrote this row
    return 0


def cmd_doctor(ctx: Ctx) -> int:
    from fleet_tui.coders.base import coder_names, get_coder, setup_lines

    bad = 0
    user_mcp = ctx.cfg.mcp == "inherit"
    for name in coder_names():
        try:
            c = get_coder(name)
            ok, detail = c.available()
            ver = c.version() if ok and c.program else None
        except Exception as e:
            ok, detail, ver = False, str(e), None
        mark = "ok " if ok else "-- "
        line = f"{mark} coder {name:<9} {'usable' if ok else 'not usable'}  {ver or ''}  {detail}"
        print(clean(line, one_line=True))
        if ok and getattr(c, "program", None):  # what the agent will run with: the user's setup
            for line in setup_lines(c, user_mcp, ctx.cfg.default_model):
                print("      " + clean(line, one_line=True))
    try:
        st = ctx.store
        print(clean(f"ok  store {st.url}  ({len(st.list_tasks())} tasks)", one_line=True))
    except UserError as e:
        print(f"--  store: {e}")
        bad += 1
    print(f"ok  home {ctx.home}")
    bad += _doctor_sandbox(ctx)
    bad += _doctor_notify(ctx)
    return 1 if bad else 0


def _doctor_sandbox(ctx: Ctx) -> int:
    """The sandbox line: whether bwrap works here, and whether tasks use it by default."""
    from fleet_tui.config import ConfigError, config_path, load_config
    from fleet_tui.scheduler.sandbox.bwrap import probe

    try:
        mode = load_config(config_path(ctx.home)).sandbox
    except ConfigError:
        mode = "none"
    ok, detail = probe()
    use = f"default sandbox = {mode}"
    if ok:
        hint = "" if mode == "bwrap" else " (turn it on: fleet-tui config set sandbox bwrap)"
        print(f"ok  sandbox bwrap usable ({detail}); {use}{hint}")
        return 0
    print(f"--  sandbox bwrap not usable: {detail}; {use}")
    return 1 if mode == "bwrap" else 0


def _doctor_notify(ctx: Ctx) -> int:
    """Notification targets and how sending went (the store's notifications table)."""
    try:
        stats = ctx.store.notification_stats()
    except Exception as e:  # a store problem is reported above already
        print(f"--  notifications: {e}")
        return 0
    cfg = ctx.cfg
    where = [*(u.rpartition(" ")[2].split("://")[0] + "://" for u in cfg.notify)]
    if cfg.telegram_token:
        where.append("telegram")
    where += [f"desktop={cfg.notify_desktop}", f"terminal={cfg.notify_terminal}"]
    mark = "-- " if stats.failed else "ok "
    line = f"{mark} notifications: {stats.sent} sent, {stats.failed} failed  ({', '.join(where)})"
    if stats.last_failure:
        line += f"; last failure: {stats.last_failure}"
    print(line)
    return 0


def cmd_notify(ctx: Ctx) -> int:
    from fleet_tui.notify import send_test

    results = send_test(ctx.cfg)
    if not results:
        raise UserError(
            "no notification targets: add one with `fleet-tui config set notify ntfys://YOUR-TOPIC` "
            "(any apprise URL), or set telegram_token and telegram_chat"
        )
    for r in results:
        said = r.target if r.ok else r.detail if r.detail.startswith(r.target) else f"{r.target}: {r.detail}"
        print(f"{'ok ' if r.ok else '-- '} {said}")
    return 0 if all(r.ok for r in results) else 1


def cmd_mcp(ctx: Ctx) -> int:
    # the lean entry point: answers the handshake itself, runs the SDK server behind it
    from fleet_tui.scheduler.humans.mcp_stdio import main as mcp_main

    return mcp_main()


def cmd_cockpit(ctx: Ctx) -> int:
    from fleet_tui.launcher import run_cockpit

    return run_cockpit(ctx, attach=bool(getattr(ctx.args, "attach", False)))


def cmd_example(ctx: Ctx) -> int:
    """Print the bundled example task file (it ships inside the package, so an installed tool has it)."""
    from importlib.resources import files

    sys.stdout.write(files("fleet_tui").joinpath("examples", "tasks.toml").read_text(encoding="utf-8"))
    return 0


def cmd_demo(ctx: Ctx) -> int:
    from fleet_tui.launcher import run_demo

    return run_demo(ctx)


# -- parser -------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse with a did-you-mean for a mistyped command or choice (``stauts`` -> ``status``)."""

    def error(self, message: str) -> Any:
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:
            import difflib

            choices = re.findall(r"'([^']*)'", m.group(2))
            close = difflib.get_close_matches(m.group(1), choices, n=1, cutoff=0.6)
            if close:
                message = f"unknown {'command' if self.prog == 'fleet-tui' else 'choice'} {m.group(1)!r}"
                message += f" — did you mean {close[0]!r}? (`fleet-tui --help` lists them)"
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="fleet-tui", description="Run many coding agents in parallel from one queue.")
    p.add_argument("--home", help="state folder (default $FLEET_HOME, else ~/.local/state/fleet-tui)")
    p.add_argument(
        "--store", help="store URL (postgresql://... or sqlite:///path); default: fleet.db in the home"
    )
    p.add_argument(
        "--attach", action="store_true", help="open the cockpit on a store whose engine runs elsewhere"
    )
    p.add_argument("--version", action="version", version=f"fleet-tui {__version__}")
    sub = p.add_subparsers(dest="cmd")

    sub.add_parser("demo", help="the cockpit on sample tasks run by the simulated agent")
    sub.add_parser("example", help="print an example tasks.toml (runs with the simulated agent)")
    r = sub.add_parser("run", help="the engine without the UI")
    r.add_argument(
        "--until-idle",
        action="store_true",
        help="exit once nothing can change without a person: sits out backoffs and rate-limit "
        "resets; exit 0 all finished, 3 something needs a person, 4 --max-wait left a wait",
    )
    r.add_argument(
        "--max-wait", type=float, metavar="S", help="with --until-idle: do not sit out a wait longer than S s"
    )
    r.add_argument("--quiet", "-q", action="store_true", help="print no line per change, only the end")
    r.add_argument("--json", action="store_true", help="one JSON object per line for each change")
    r.add_argument("--max-concurrent", type=int)
    r.add_argument("--store", default=argparse.SUPPRESS)  # also accepted before `run`
    r.add_argument("--host-name")
    r.add_argument("--tag", action="append")

    a = sub.add_parser("add", help="queue one task; prints its id")
    a.add_argument("prompt")
    a.add_argument("--name")
    a.add_argument("--cwd", default=".")
    a.add_argument("--coder")
    a.add_argument("--model")
    a.add_argument("--priority", type=int, default=0)
    a.add_argument("--command", help="a shell command (the shell coder)")
    a.add_argument("--after", action="append", default=[], metavar="NAME")
    a.add_argument("--verify", action="append", default=[], metavar="CMD")
    a.add_argument("--git-ref")
    a.add_argument("--max-retries", type=int)
    a.add_argument("--timeout-min", type=float)
    a.add_argument("--budget-usd", type=float)
    a.add_argument(
        "--merge", choices=["manual", "auto", "pr"], default="manual", help="pr: push + pull request"
    )
    a.add_argument("--notify-done", action="store_true", help="notify when this task is done")

    for name in ("load", "validate"):
        s = sub.add_parser(name, help=f"{name} a tasks.toml")
        s.add_argument("file")
    sub.add_parser("plan", help="the admission decision for every queued task; starts nothing")
    st = sub.add_parser("status", help="one line per task")
    st.add_argument("--json", action="store_true")
    st.add_argument("--graph", action="store_true")
    st.add_argument("--group", choices=["repo"], help="group the lines by repository, like the cockpit")
    st.add_argument("--all", action="store_true", help="include archived tasks")
    ar = sub.add_parser("archive", help="keep finished tasks out of status and the cockpit (records stay)")
    ar.add_argument("tasks", nargs="+", metavar="TASK")
    st.add_argument(
        "--gauges", action="store_true", help="the gauges as text bars and sparklines (with --json: figures)"
    )
    lg = sub.add_parser("logs", help="a task's events")
    lg.add_argument("task")
    lg.add_argument("--follow", "-f", action="store_true")
    lg.add_argument("--raw", action="store_true")
    lg.add_argument("--json", action="store_true")
    im = sub.add_parser("import", help="queue one task per matching GitHub issue (not imported yet)")
    im.add_argument("source", choices=["github"])
    im.add_argument("repo", metavar="OWNER/REPO")
    im.add_argument("--label")
    im.add_argument("--assignee")
    im.add_argument("--milestone", help="a milestone number or title")
    im.add_argument("--cwd", default=".", help="a checkout of the repository")
    im.add_argument("--coder")
    im.add_argument("--model")
    im.add_argument("--git-ref", help="base branch (default with --merge pr: the checkout's branch)")
    im.add_argument("--merge", choices=["pr", "manual", "auto"], default="pr")
    im.add_argument("--verify", action="append", default=[], metavar="CMD")
    im.add_argument("--priority", type=int, default=0)
    im.add_argument(
        "--comment",
        action="store_true",
        help="comment on the issue when its task starts, parks, opens its PR",
    )
    for verb in ("kill", "pause", "resume", "retry", "cancel", "merge"):
        s = sub.add_parser(verb, help=f"{verb} a task")
        s.add_argument("task", nargs="?")
        if verb in ("pause", "resume"):
            s.add_argument("--all", action="store_true", help=f"{verb} the whole fleet")
    q = sub.add_parser("questions", help="pending questions from agents")
    q.add_argument("--json", action="store_true")
    an = sub.add_parser("answer", help="answer a question")
    an.add_argument("question")
    an.add_argument("text")
    c = sub.add_parser("config", help="get or set a config key")
    c.add_argument("action", choices=["get", "set"])
    c.add_argument("key")
    c.add_argument("value", nargs="?")
    sub.add_parser("hosts", help="machines sharing the store")
    sub.add_parser("doctor", help="check coders, the store and the home")
    sub.add_parser("mcp-ask-human", help="the stdio MCP server agents call (started by coders)")
    nt = sub.add_parser("notify", help="notifications: `notify test` sends one to every target")
    nt.add_argument("action", choices=["test"])
    COMMANDS.update(wheel_cli.register(sub))  # send, approve, edit, takeover
    return p


COMMANDS = {
    "add": cmd_add,
    "load": cmd_load,
    "validate": cmd_validate,
    "run": cmd_run,
    "status": cmd_status,
    "logs": cmd_logs,
    "kill": cmd_simple,
    "pause": cmd_simple,
    "resume": cmd_simple,
    "retry": cmd_simple,
    "cancel": cmd_simple,
    "merge": cmd_simple,
    "import": cmd_import,
    "questions": cmd_questions,
    "archive": cmd_archive,
    "answer": cmd_answer,
    "config": cmd_config,
    "plan": cmd_plan,
    "hosts": cmd_hosts,
    "doctor": cmd_doctor,
    "mcp-ask-human": cmd_mcp,
    "notify": cmd_notify,
    "demo": cmd_demo,
    "example": cmd_example,
}


def main(argv: Sequence[str] | None = None) -> int:
    from fleet_tui.config import ConfigError
    from fleet_tui.scheduler.private import go_private
    from fleet_tui.scheduler.store.protocol import StoreError
    from fleet_tui.trust import TrustError

    go_private()  # the home's files (prompts, outputs, per-run configs) are the user's alone
    args = build_parser().parse_args(argv)
    ctx = Ctx(args)
    fn = COMMANDS.get(args.cmd or "", cmd_cockpit)
    try:
        return fn(ctx)
    except (UserError, StoreError, ConfigError, TrustError) as e:  # also a store failing after open
        print(f"fleet-tui: {clean(str(e))}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        ctx.close()


def entry() -> None:
    """The ``fleet-tui`` command: ``main``, then out of the process at once.

    The interpreter's own teardown (collecting and freeing some 30,000 objects and 360 modules,
    which the kernel reclaims anyway) took 40-70 ms after every command: a sixth of an empty
    ``run``, and of every ``status`` a script calls. By the time ``main`` returns, the store and
    every file the command wrote are closed (``Ctx.close``); what still runs here is what a normal
    exit runs first: other threads that are not daemons are waited for, the exit handlers
    (logging's flush, temporary folders' clean-up) run, and both output streams are flushed."""
    import atexit
    import os
    import threading

    code = main()
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away: nothing more to say to it
            pass
    os._exit(code)


if __name__ == "__main__":
    entry()
