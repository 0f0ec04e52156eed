"""Talking to GitHub's REST API: pull requests, their reviews and checks, issues and comments.

Everything fleet-tui asks of GitHub goes through this one wrapper so the rest of the engine sees
frozen values (``PullRequest``, ``Issue``) and one exception, ``GitHubError``, whose message is a
single line fit to be a task's reason ("GitHub API: bad credentials (401) ...", "GitHub API rate
limit exhausted until 14:05 ..."), never a traceback.

The client library is PyGithub rather than githubkit: PyGithub is synchronous (the engine calls
GitHub from worker threads through ``anyio.to_thread``, like git and the store), it reads a
response's fields lazily, so it works against GitHub Enterprise versions and test doubles that
send only the fields used, and it raises typed exceptions per status (bad credentials, rate limit,
not found). githubkit validates every response against the full OpenAPI schema with pydantic and
pulls in much more. PyGithub's own retry/sleep on rate limits is switched off: a rate limit
becomes a reason now, not a thread asleep for an hour.

The API root is ``GITHUB_API_URL`` (GitHub Enterprise: ``https://HOST/api/v3``), else
api.github.com. The token comes from ``GH_TOKEN``, else ``GITHUB_TOKEN``, else ``gh auth token``
when the gh CLI is logged in. It is kept in memory only: never logged, never written to the home.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

DEFAULT_API_URL = "https://api.github.com"

T = TypeVar("T")


class GitHubError(RuntimeError):
    """A GitHub call that failed; the message is one line naming the problem and the fix."""


class RateLimited(GitHubError):
    """The API's rate limit is exhausted; ``reset_at`` (epoch seconds) when GitHub said."""

    def __init__(self, message: str, reset_at: float | None) -> None:
        super().__init__(message)
        self.reset_at = reset_at


@dataclass(frozen=True)
class PullRequest:
    """A pull request as fleet-tui tracks it."""

    number: int
    url: str  # the page a person opens (html_url)
    state: str  # open | closed | merged
    head_sha: str | None = None
    merge_commit: str | None = None
    checks: str | None = None  # passing | failing | pending | None (no checks)
    review: str | None = None  # approved | changes_requested | None
    review_id: int | None = None  # id of the latest changes-requested review
    review_text: str | None = None  # its body, for a person (or a follow-up) to act on


@dataclass(frozen=True)
class Issue:
    """A GitHub issue, as the fleet reads one into a task."""

    number: int
    title: str
    body: str
    url: str


def api_url() -> str:
    return (os.environ.get("GITHUB_API_URL") or DEFAULT_API_URL).rstrip("/")


def find_token() -> str | None:
    """GH_TOKEN, GITHUB_TOKEN, or the gh CLI's token when it is logged in (None: no token)."""
    for var in ("GH_TOKEN", "GITHUB_TOKEN"):
        if os.environ.get(var, "").strip():
            return os.environ[var].strip()
    gh = shutil.which("gh")
    if gh is None:
        return None
    try:
        out = subprocess.run([gh, "auth", "token"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _when(reset: str | None) -> str:
    try:
        return time.strftime("%H:%M", time.localtime(float(reset or "")))
    except ValueError:
        return "later"


def explain(e: BaseException) -> str:
    """One line for a failed GitHub call (the token is never part of it)."""
    from github import GithubException
    from requests import RequestException

    if isinstance(e, GitHubError):
        return str(e)
    if isinstance(e, GithubException):
        headers = {k.lower(): v for k, v in (e.headers or {}).items()}
        msg = e.message or (e.data.get("message") if isinstance(e.data, dict) else None) or ""
        if e.status in (403, 429) and (
            headers.get("x-ratelimit-remaining") == "0" or "rate limit" in msg.lower()
        ):
            return (
                f"GitHub API rate limit exhausted until {_when(headers.get('x-ratelimit-reset'))} "
                f"({e.status}): fleet-tui tries again after the reset"
            )
        if e.status == 401:
            return "GitHub API: bad credentials (401): set GH_TOKEN or GITHUB_TOKEN, or run `gh auth login`"
        if e.status == 404:
            return f"GitHub API: not found (404) at {api_url()}: check OWNER/REPO and the token's access"
        if e.status == 422:
            errors = e.data.get("errors") if isinstance(e.data, dict) else None
            detail = "; ".join(
                str(x.get("message") or x) if isinstance(x, dict) else str(x) for x in errors or []
            )
            return f"GitHub API refused the request (422): {detail or msg or 'validation failed'}"
        return f"GitHub API error {e.status}: {msg or 'no message'}"
    if isinstance(e, RequestException):
        return f"cannot reach the GitHub API at {api_url()}: {type(e).__name__} (set GITHUB_API_URL?)"
    return f"GitHub API call failed: {type(e).__name__}: {e}"


class GitHub:
    """A thin, blocking client over PyGithub for the calls fleet-tui makes."""

    def __init__(self, token: str | None = None, base_url: str | None = None) -> None:
        from github import Auth, Github

        token = token or find_token()
        if not token:
            raise GitHubError("no GitHub token: set GH_TOKEN or GITHUB_TOKEN, or log in with `gh auth login`")
        self._gh = Github(
            auth=Auth.Token(token), base_url=base_url or api_url(), retry=None, timeout=20, lazy=True
        )

    def _call(self, fn: Callable[[], T]) -> T:
        from github import GithubException

        try:
            return fn()
        except GitHubError:
            raise
        except Exception as e:  # every failure becomes one line for a reason
            text = explain(e)
            if isinstance(e, GithubException) and "rate limit" in text:
                reset = {k.lower(): v for k, v in (e.headers or {}).items()}.get("x-ratelimit-reset")
                raise RateLimited(text, float(reset) if reset and reset.isdigit() else None) from None
            raise GitHubError(text) from None

    def _repo(self, full_name: str) -> Any:
        return self._gh.get_repo(full_name)  # lazy: no call until something is asked of it

    # -- pull requests ---------------------------------------------------------------------------
    def find_pull(self, repo: str, head: str, base: str) -> PullRequest | None:
        """The open pull request from branch ``head`` (same repository) into ``base``, if any."""
        owner = repo.split("/")[0]

        def go() -> PullRequest | None:
            for p in self._repo(repo).get_pulls(state="open", head=f"{owner}:{head}", base=base):
                return _pull(p)
            return None

        return self._call(go)

    def create_pull(self, repo: str, *, head: str, base: str, title: str, body: str) -> PullRequest:
        return self._call(
            lambda: _pull(self._repo(repo).create_pull(base=base, head=head, title=title, body=body))
        )

    def update_pull(self, repo: str, number: int, *, title: str, body: str) -> PullRequest:
        def go() -> PullRequest:
            p = self._repo(repo).get_pull(number)
            p.edit(title=title, body=body)
            return _pull(p)

        return self._call(go)

    def pull_status(self, repo: str, number: int) -> PullRequest:
        """State, checks and review verdict of one pull request (3-4 calls)."""

        def go() -> PullRequest:
            r = self._repo(repo)
            p = r.get_pull(number)
            pr = _pull(p)
            verdicts: dict[str, Any] = {}  # the latest verdict of each reviewer
            for rv in p.get_reviews():
                if rv.state in ("APPROVED", "CHANGES_REQUESTED", "DISMISSED"):
                    verdicts[rv.user.login if rv.user else "?"] = rv
            latest = [rv for rv in verdicts.values() if rv.state == "CHANGES_REQUESTED"]
            review = None
            if latest:
                review = "changes_requested"
            elif any(rv.state == "APPROVED" for rv in verdicts.values()):
                review = "approved"
            last = max(latest, key=lambda rv: rv.id) if latest else None
            checks = _checks(r, pr.head_sha) if pr.head_sha and pr.state == "open" else None
            return PullRequest(
                number=pr.number,
                url=pr.url,
                state=pr.state,
                head_sha=pr.head_sha,
                merge_commit=pr.merge_commit,
                checks=checks,
                review=review,
                review_id=last.id if last else None,
                review_text=(last.body or "").strip() or None if last else None,
            )

        return self._call(go)

    # -- issues ----------------------------------------------------------------------------------
    def issues(
        self,
        repo: str,
        *,
        label: str | None = None,
        assignee: str | None = None,
        milestone: str | None = None,
    ) -> list[Issue]:
        """Open issues (not pull requests) matching every filter given."""

        def go() -> list[Issue]:
            r = self._repo(repo)
            kw: dict[str, Any] = {"state": "open"}
            if label:
                kw["labels"] = [label]
            if assignee:
                kw["assignee"] = assignee
            if milestone:
                if milestone.isdigit():
                    kw["milestone"] = r.get_milestone(int(milestone))
                else:
                    found = [m for m in r.get_milestones(state="all") if m.title == milestone]
                    if not found:
                        raise GitHubError(f"{repo} has no milestone titled {milestone!r}")
                    kw["milestone"] = found[0]
            return [
                Issue(number=i.number, title=i.title or "", body=i.body or "", url=i.html_url)
                for i in r.get_issues(**kw)
                if i.pull_request is None
            ]

        return self._call(go)

    def comment(self, repo: str, number: int, text: str) -> None:
        self._call(lambda: self._repo(repo).get_issue(number).create_comment(text))


def _pull(p: Any) -> PullRequest:
    state = "merged" if p.merged else p.state
    return PullRequest(
        number=p.number,
        url=p.html_url,
        state=state,
        head_sha=p.head.sha if p.head else None,
        merge_commit=p.merge_commit_sha if p.merged else None,
    )


def _checks(repo: Any, sha: str) -> str | None:
    """passing / failing / pending over the commit's check runs and its combined status."""
    seen: list[str] = []
    commit = repo.get_commit(sha)
    for run in commit.get_check_runs():
        if run.status != "completed":
            seen.append("pending")
        elif run.conclusion in ("success", "neutral", "skipped"):
            seen.append("passing")
        else:
            seen.append("failing")
    combined = commit.get_combined_status()
    if combined.total_count:
        seen.append({"success": "passing", "pending": "pending"}.get(combined.state, "failing"))
    if not seen:
        return None
    return "failing" if "failing" in seen else "pending" if "pending" in seen else "passing"
