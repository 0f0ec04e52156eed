"""``fleet-tui import github OWNER/REPO``: one task per matching open issue, imported once.

Teams keep their work in issues; this turns each matching issue into a queued task whose prompt
is the issue's title, body and URL and whose name comes from its number and title. A task records
where it came from in its spec's ``source`` (``github:OWNER/REPO#N``), so importing again finds
the issues already imported and queues nothing new for them (idempotent, even across machines
sharing a store). The task's GitHub record (``pullrequest.put_link``) remembers the issue, so its
pull request says "Closes #N" and, with ``--comment``, the issue hears when the task starts, parks
and opens its pull request.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from fleet_tui.scheduler.github.api import Issue
from fleet_tui.scheduler.model import TaskSpec

#: the longest task name made from an issue
NAME_MAX = 48


@dataclass(frozen=True)
class Planned:
    """An issue to queue as ``spec`` (or, when ``spec`` is None, skipped because imported)."""

    issue: Issue
    spec: TaskSpec | None


def source_of(repo: str, number: int) -> str:
    return f"github:{repo}#{number}"


def task_name(repo: str, issue: Issue, taken: Collection[str]) -> str:
    """``gh-12-fix-the-login-bug``; with the repository's name when that is taken."""
    words = "-".join(re.findall(r"[a-z0-9]+", issue.title.lower()))
    name = f"gh-{issue.number}-{words}"[:NAME_MAX].rstrip("-")
    if name in taken:
        short = re.sub(r"[^a-z0-9_-]+", "-", repo.split("/")[-1].lower()).strip("-") or "repo"
        name = f"{short}-{issue.number}-{words}"[:NAME_MAX].rstrip("-")
    n = 2
    base = name
    while name in taken:
        name = f"{base[: NAME_MAX - 4]}-{n}"
        n += 1
    return name


def prompt_of(issue: Issue) -> str:
    body = issue.body.strip() or "(the issue has no description)"
    return f"{issue.title.strip()}\n\n{body}\n\nGitHub issue: {issue.url}"


def plan(
    repo: str, issues: Sequence[Issue], template: TaskSpec, existing: Sequence[TaskSpec]
) -> list[Planned]:
    """What to queue for ``issues``: a spec per issue not imported yet (``template`` gives every
    other key: cwd, coder, git_ref, merge, verifiers...)."""
    imported = {s.source for s in existing if s.source}
    taken = {s.name for s in existing}
    out: list[Planned] = []
    for issue in issues:
        src = source_of(repo, issue.number)
        if src in imported:
            out.append(Planned(issue, None))
            continue
        name = task_name(repo, issue, taken)
        taken.add(name)
        imported.add(src)
        out.append(Planned(issue, replace(template, name=name, prompt=prompt_of(issue), source=src)))
    return out
