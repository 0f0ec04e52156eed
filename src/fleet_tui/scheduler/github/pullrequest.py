"""``merge = "pr"``: a verified task's branch pushed to the repo's remote and a pull request kept.

Teams review every change through pull requests, so a task may end as a pull request instead of a
local merge. After a task reaches ``done`` its branch is pushed over the repository's configured
remote with the user's own git credentials (fleet-tui holds none for git), then a pull request is
opened against the task's base (or the existing one updated: later attempts push to the same
branch and rewrite the body). A push or API failure parks the task with a one-line reason.

What fleet-tui knows about a task's GitHub side (its repository, the issue it came from, its pull
request and that pull request's last seen state) is a small JSON record in the store's
``settings`` table under ``github.task.<id>``: every store (SQLite, PostgreSQL) already has that
table, so no schema change is needed and every machine sharing the store sees the same record.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

from fleet_tui.scheduler import lifecycle as lc
from fleet_tui.scheduler.api import CommandResult
from fleet_tui.scheduler.git import worktree as wt
from fleet_tui.scheduler.github.api import GitHub, GitHubError
from fleet_tui.scheduler.model import Task, TaskSpec
from fleet_tui.scheduler.states import TaskStatus

KEY_PREFIX = "github.task."
#: the most of a verifier's output quoted in a pull request body
BODY_OUTPUT_CHARS = 3000


# -- the per-task record ------------------------------------------------------------------------
def is_linked(spec: TaskSpec) -> bool:
    """Whether a task may have a GitHub record (a pull request task, or one imported from an issue)."""
    return spec.merge == "pr" or (spec.source or "").startswith("github:")


def get_link(store: Any, task_id: str) -> dict[str, Any]:
    raw = store.get_setting(KEY_PREFIX + task_id)
    if not raw:
        return {}
    try:
        d = json.loads(raw)
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


#: one writer at a time per process: the engine's after-work and its poll both update records
_LINK_LOCK = threading.Lock()


def put_link(store: Any, task_id: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Merge ``changes`` into the task's record (a None value removes the key; ``said`` lists are
    united) over its *current* stored value, so two writers do not undo each other's news."""
    with _LINK_LOCK:
        link = get_link(store, task_id)
        for k, v in changes.items():
            if k == "said":
                link["said"] = sorted({*(link.get("said") or []), *(v or [])})
            elif v is None:
                link.pop(k, None)
            else:
                link[k] = v
        store.set_setting(KEY_PREFIX + task_id, json.dumps(link, sort_keys=True))
        return link


def links(store: Any, tasks: list[Task]) -> dict[str, dict[str, Any]]:
    """The GitHub records of the given tasks that have one."""
    out: dict[str, dict[str, Any]] = {}
    for t in tasks:
        if is_linked(t.spec):
            link = get_link(store, t.id)
            if link:
                out[t.id] = link
    return out


def link_json(link: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``pull_request`` value of ``status --json`` (None: no pull request yet)."""
    if not link or not (link.get("pr") or link.get("error")):
        return None
    return {
        "repo": link.get("repo"),
        "number": link.get("pr"),
        "url": link.get("url"),
        "state": link.get("state"),
        "checks": link.get("checks"),
        "review": link.get("review"),
        "error": link.get("error"),
    }


def link_line(link: dict[str, Any] | None) -> str:
    """A short text for ``status`` and the cockpit: ``PR #12 open, checks passing``."""
    if not link or not link.get("pr"):
        return f"PR: {link['error']}" if link and link.get("error") else ""
    bits = [str(link.get("state") or "?")]
    if link.get("checks"):
        bits.append(f"checks {link['checks']}")
    if link.get("review"):
        bits.append(str(link["review"]).replace("_", " "))
    if link.get("error"):  # the last poll failed (a rate limit, a revoked token): say so
        bits.append(f"last check failed: {str(link['error'])[:80]}")
    return f"PR #{link['pr']} {', '.join(bits)}"


def summary(store: Any, task: Task) -> str | None:
    """``link_line`` and the pull request's URL, for the task's detail screen (None: no PR)."""
    link = get_link(store, task.id) if is_linked(task.spec) else {}
    line = link_line(link)
    return f"{line} · {link['url']}" if line and link.get("url") else line or None


# -- remote and repository ----------------------------------------------------------------------
def remote_for(repo_root: Path, base: str) -> tuple[str, str]:
    """(remote name, its URL) to push to: the base branch's upstream remote, else ``origin``, else
    the only remote. Raises GitHubError (a reason) when there is none."""
    _, out, _ = wt._git(repo_root, "config", "--get", f"branch.{base}.remote", check=False)
    names = wt._git(repo_root, "remote", check=False)[1].split()
    name = out.strip() if out.strip() in names else "origin" if "origin" in names else None
    if name is None and len(names) == 1:
        name = names[0]
    if name is None:
        why = "no git remote" if not names else f"several remotes ({', '.join(names)}) and none is origin"
        raise GitHubError(f"push_rejected: {why}: add one with `git remote add origin URL`")
    url = wt._git(repo_root, "remote", "get-url", "--push", name, check=False)[1].strip()
    return name, url


_SLUG = re.compile(r"[:/]([^/:]+)/([^/]+?)(?:\.git)?/?$")


def repo_slug(url: str) -> str | None:
    """``owner/name`` from a remote URL (https, ssh, scp-like, or a path ending in owner/name.git)."""
    m = _SLUG.search(url.strip())
    return f"{m.group(1)}/{m.group(2)}" if m else None


def push(repo_root: Path, remote: str, branch: str) -> None:
    """Push the task's branch to the same name on the remote; a refusal raises with git's words."""
    status, out, err = wt._git(
        repo_root, "push", "--porcelain", remote, f"refs/heads/{branch}:refs/heads/{branch}", check=False
    )
    if status == 0:
        return
    text = f"{err}\n{out}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    bang = next((ln for ln in out.splitlines() if ln.startswith("!")), "")  # --porcelain: the refusal
    remote_says = [ln[7:].strip() for ln in lines if ln.startswith("remote:") and ln[7:].strip()]
    fatal = [ln for ln in lines if ln.startswith(("fatal:", "error:"))]
    parts = [bang.split("\t")[-1].strip() if bang else "", *remote_says[:3], *fatal[:1]]
    detail = "; ".join(x for x in parts if x) or f"git push exited {status}"
    if "non-fast-forward" in text or "fetch first" in text:
        detail = f"non-fast-forward: {remote}/{branch} has commits the task's branch lacks ({detail})"
    raise GitHubError(f"push_rejected: {detail[:300]}")


# -- the pull request ---------------------------------------------------------------------------
def title_of(task: Task) -> str:
    first = next((ln.strip() for ln in task.spec.prompt.splitlines() if ln.strip()), "")
    if not first:
        return task.name
    return first if len(first) <= 72 else first[:71].rstrip() + "…"


def body_of(store: Any, task: Task, info: wt.WorktreeInfo, link: dict[str, Any]) -> str:
    """The pull request's description: the prompt, the verifiers' verdicts, the diffstat, the cost."""
    atts = store.attempts(task.id)
    out = (atts[-1].verify_output or "").strip() if atts else ""
    lines = ["## Task", "", task.spec.prompt.strip(), "", "## Verifier results", ""]
    if task.spec.verify:
        lines += [f"- `{v.label}`: passed" for v in task.spec.verify]
        if out:
            tail = out[-BODY_OUTPUT_CHARS:]
            lines += ["", "<details><summary>verifier output</summary>", "", "```", tail, "```", "</details>"]
    else:
        lines.append("- no verifiers configured (the agent exited 0 and reported success)")
    _, stat, _ = wt._git(info.repo_root, "diff", "--stat", f"{info.base_ref}...{info.branch}", check=False)
    lines += ["", "## Diffstat", "", "```", stat.rstrip() or "(no changes)", "```", ""]
    lines.append(
        f"Cost ${task.cost_usd:.2f}, {task.tokens} tokens, attempt {task.attempt} "
        f"({task.coder or task.spec.coder or '?'}{'/' + task.model if task.model else ''})."
    )
    lines.append(f"fleet-tui task `{task.name}` (id `{task.id}`): `fleet-tui logs {task.id}`.")
    if link.get("issue"):
        lines.append(f"\nCloses #{link['issue']}.")
    return "\n".join(lines)


def publish(life: lc.Lifecycle, task: Task, info: wt.WorktreeInfo, gh: GitHub | None = None) -> CommandResult:
    """Push the task's branch and open (or update) its pull request. Blocking; never raises: a
    failure parks the task (``needs_human``) with the reason."""
    store = life.store
    link = get_link(store, task.id)
    try:
        if info.path.exists():
            wt.wip_commit(info.path, f"fleet-tui: work of {task.name}")
        if blocks := wt.conflict_blocks(info):  # merged on GitHub, they would reach the base
            raise GitHubError(
                f"push_rejected: its branch adds {wt.CONFLICT_MARKERS} in "
                f"{', '.join(blocks)}: not pushing them; resolve them on {info.branch} first"
            )
        remote, url = remote_for(info.repo_root, info.base_ref)
        repo = link.get("repo") or repo_slug(url)
        if not repo:
            raise GitHubError(f"pull_request_failed: cannot tell the GitHub repository from remote {remote}")
        push(info.repo_root, remote, info.branch)
        gh = gh or GitHub()
        title, body = title_of(task), body_of(store, task, info, link)
        pr = None
        if link.get("pr") and link.get("state") == "open":
            pr = gh.update_pull(repo, int(link["pr"]), title=title, body=body)
            if pr.state != "open":
                pr = None
        if pr is None:
            found = gh.find_pull(repo, info.branch, info.base_ref)
            if found is not None:
                pr = gh.update_pull(repo, found.number, title=title, body=body)
            else:
                pr = gh.create_pull(repo, head=info.branch, base=info.base_ref, title=title, body=body)
    except (GitHubError, wt.WorktreeError) as e:
        reason = str(e)
        if lc.Reason.parse(reason).code not in (
            lc.ReasonCode.PUSH_REJECTED,
            lc.ReasonCode.PULL_REQUEST_FAILED,
        ):
            reason = f"pull_request_failed: {reason}"
        put_link(store, task.id, {"error": reason})
        new = life.apply(task, lc.park_done(reason), expect=[TaskStatus.DONE])
        return CommandResult(False, f"{task.name}: {reason}", new or task)
    updated = link.get("pr") == pr.number
    link = put_link(
        store,
        task.id,
        {
            "repo": repo,
            "pr": pr.number,
            "url": pr.url,
            "state": pr.state,
            "head": info.branch,
            "base": info.base_ref,
            "error": None,
        },
    )
    verb = "updated" if updated else "opened"
    new = life.apply(
        task,
        lc.mark_done(f"pull request #{pr.number} {verb}: {pr.url}"),
        expect=[TaskStatus.DONE, TaskStatus.NEEDS_HUMAN],
    )
    if link.get("comment") and link.get("issue") and not updated:
        say(gh, store, task.id, link, "pr", f"fleet-tui opened pull request #{pr.number} for this issue.")
    return CommandResult(True, f"{task.name}: pull request #{pr.number} {verb}: {pr.url}", new or task)


def say(gh: GitHub, store: Any, task_id: str, link: dict[str, Any], key: str, text: str) -> None:
    """Comment on the task's issue once per ``key`` (start, park:<attempt>, pr)."""
    said = list(link.get("said") or [])
    if key in said or not link.get("issue") or not link.get("repo"):
        return
    gh.comment(str(link["repo"]), int(link["issue"]), text)
    link.update(put_link(store, task_id, {"said": [key]}))
