"""The values that cross boundaries: task specs, tasks, attempts, events, questions, hosts.

Everything here is a frozen dataclass so the engine, the stores, the coders and the cockpit can
hand values to each other (and across threads) without anyone mutating what another holds. The
cockpit only ever sees these, never a process, a repository or a database handle.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

from fleet_tui.scheduler.states import TaskStatus

EventKind = Literal[
    "session_started",
    "text",
    "thinking",
    "tool_call",
    "tool_result",
    "usage",
    "rate_limit",
    "question",
    "answer",
    "api_retry",
    "error",
    "result",
    "stderr",
    "oversized",
    "lifecycle",
    "verify",
]

EVENT_KINDS: tuple[str, ...] = EventKind.__args__  # type: ignore[attr-defined]

OutcomeKind = Literal[
    "success", "failure", "rate_limited", "auth_failed", "context_pressure", "stalled", "killed"
]


@dataclass(frozen=True)
class VerifySpec:
    """One verifier of a task (DESIGN section 7). ``kind`` is run, agent or artifact."""

    kind: Literal["run", "agent", "artifact"]
    run: str | None = None
    agent: str | None = None
    coder: str | None = None
    model: str | None = None
    path: str | None = None
    min_chars: int = 0
    contains: tuple[str, ...] = ()
    timeout_min: float | None = None

    @property
    def label(self) -> str:
        if self.kind == "run":
            return f"run: {self.run}"
        if self.kind == "agent":
            first = (self.agent or "").strip().splitlines()[0] if (self.agent or "").strip() else ""
            return f"agent: {first[:40]}"
        return f"artifact: {self.path}"


@dataclass(frozen=True)
class TaskSpec:
    """What the user asked for: a task as written in tasks.toml or given to ``add``."""

    name: str
    prompt: str
    cwd: str = "."
    coder: str | None = None  # None: the config's default coder, frozen at first claim
    model: str | None = None
    command: str | None = None  # for the shell coder
    git_ref: str | None = None
    priority: int = 0
    depends_on: tuple[str, ...] = ()
    timeout_min: float | None = None
    stall_min: float | None = None
    max_retries: int | None = None  # None: the config's default
    requires: tuple[str, ...] = ()
    verify: tuple[VerifySpec, ...] = ()
    budget_usd: float | None = None
    setup: str | None = None  # worktree setup command
    merge: Literal["manual", "auto", "pr"] = "manual"  # pr: push + pull request (pullrequest.py)
    env: tuple[tuple[str, str], ...] = ()
    source: str | None = None  # "file:line" the spec came from, for messages
    sandbox: str | None = None  # "bwrap" | "none"; None: the config's default (see sandbox.py)
    network: tuple[str, ...] | None = None  # sandboxed: None host network, () none, hosts allowlist
    sandbox_rw: tuple[str, ...] = ()  # extra writable paths in the sandbox (absolute)
    sandbox_ro: tuple[str, ...] = ()  # extra readable paths in the sandbox (absolute)
    notify_done: bool = False  # send a notification when this task is done (notify/)
    mcp: str | None = None  # "inherit" | "fleet-only"; None: the config's ``mcp`` (the user's servers)
    #: task-file key ``continue``: "auto" (a retry or follow-up continues the agent's own
    #: session when its CLI can) | "fresh"; None: the config's ``continue_session``
    continue_mode: str | None = None


@dataclass(frozen=True)
class Task:
    """A task as the store holds it now. ``attempt`` is the number of the current/last attempt."""

    id: str
    spec: TaskSpec
    status: TaskStatus
    reason: str | None = None  # why needs_human / cancelled / paused
    waiting: str | None = None  # why a queued task does not start (set by the gate/planner)
    attempt: int = 0
    retries_used: int = 0
    handoffs: int = 0
    false_completions: int = 0
    coder: str | None = None  # resolved at first claim, then frozen
    model: str | None = None
    owner: str | None = None
    host: str | None = None
    lease_until: float | None = None
    not_before: float | None = None  # retry backoff / rate-limit reset
    created_at: float = 0.0
    updated_at: float = 0.0
    started_at: float | None = None  # first claim
    attempt_started_at: float | None = None
    finished_at: float | None = None
    tokens: int = 0
    cost_usd: float = 0.0
    context_tokens: int | None = None
    context_window: int | None = None
    result_text: str | None = None
    branch: str | None = None
    worktree: str | None = None
    workdir: str | None = None  # where the agent runs (worktree or cwd), absolute
    paused_running: bool = False  # paused while its agent was alive (SIGSTOPped)
    merged_commit: str | None = None
    asking: bool = False  # a question of this task is pending

    @property
    def name(self) -> str:
        return self.spec.name

    def attempt_end(self) -> float | None:
        """When the last attempt ended (None while it runs, or before the first attempt)."""
        start = self.attempt_started_at or self.started_at
        if start is None or self.status in (TaskStatus.RUNNING, TaskStatus.VERIFYING):
            return None
        if self.finished_at is not None and self.finished_at >= start:
            return self.finished_at
        # back in the queue (a retry, a handoff) or paused: it left running when last moved
        return self.updated_at if self.updated_at >= start else start

    def elapsed(self, now: float) -> float | None:
        """The one definition of a task's time (``status``, ``--json`` ``elapsed_s``, the
        cockpit): the current attempt while it runs or verifies, else the last attempt from its
        start to its end. Time in the queue (backoff, rate limits, dependencies), parked or
        paused never counts. None before the first attempt."""
        start = self.attempt_started_at or self.started_at
        if start is None or (self.status == TaskStatus.QUEUED and self.attempt == 0):
            return None
        end = self.attempt_end()
        return max(0.0, (end if end is not None else now) - start)


@dataclass(frozen=True)
class Attempt:
    """One run of an agent on a task: who ran it, where its files are, how it ended."""

    task_id: str
    n: int
    owner: str
    dir: str
    started_at: float
    prompt: str = ""
    shim_pid: int | None = None
    shim_create_time: float | None = None
    agent_pid: int | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    outcome: str | None = None  # OutcomeKind, or an engine verdict like verify_failed
    detail: str | None = None
    stdout_offset: int = 0
    next_seq: int = 0
    verify_output: str | None = None
    cost_usd: float = 0.0
    tokens: int = 0


@dataclass(frozen=True)
class RateLimit:
    """A rate-limit reading for one coder account."""

    account: str  # usually the coder name
    status: str = "unknown"  # allowed | allowed_warning | rejected | unknown
    utilization: float | None = None  # 0..1
    resets_at: float | None = None  # epoch seconds
    window: str | None = None  # five_hour, seven_day, ...
    observed_at: float = 0.0


@dataclass(frozen=True)
class Usage:
    """Tokens an agent reported for one turn or one attempt (what the gauges and budgets add up)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_creation_tokens: int = 0

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_creation_tokens


@dataclass(frozen=True)
class Event:
    """One normalized agent event: the same type for every vendor (DESIGN section 6)."""

    task_id: str
    attempt: int
    seq: int
    ts: float
    kind: str  # one of EVENT_KINDS
    text: str | None = None
    tool: str | None = None
    tool_input: Any = None
    tool_id: str | None = None  # pairs tool_call with tool_result
    is_error: bool = False
    usage: Usage | None = None
    cost_usd: float | None = None
    context_tokens: int | None = None
    context_window: int | None = None
    rate_limit: RateLimit | None = None
    session_id: str | None = None
    raw: Any = None
    #: ``raw``'s JSON as the agent printed it, when ``raw`` is the whole value of its line: the
    #: store keeps that text instead of encoding ``raw`` again (a fifth of a loud fleet's engine
    #: time). Not compared, not shown: the same event whichever way its ``raw`` is kept
    raw_json: str | None = field(default=None, compare=False, repr=False)

    @classmethod
    def new(cls, task_id: str, attempt: int, seq: int, ts: float, kind: str, **kw: Any) -> Event:
        """``Event(...)`` for the normalizers, which make one per line an agent prints: the
        frozen dataclass's ``__init__`` sets its 17 fields one ``object.__setattr__`` at a
        time (3.4 us here, a third of a Codex line's normalizing); this fills the instance's
        ``__dict__`` in one step (1.1 us). A field left out reads its default from the class,
        as dataclasses keep simple defaults there; an unknown field is refused, as by
        ``__init__``. The instance is the same frozen, comparable ``Event``."""
        unknown = kw.keys() - _EVENT_FIELD_NAMES
        if unknown:
            raise TypeError(f"Event has no field {sorted(unknown)[0]!r}")
        e = object.__new__(cls)
        e.__dict__.update(task_id=task_id, attempt=attempt, seq=seq, ts=ts, kind=kind, **kw)
        return e


_EVENT_FIELD_NAMES = frozenset(f.name for f in fields(Event))


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended, classified by its coder (then refined by the engine)."""

    kind: str  # OutcomeKind
    detail: str = ""
    resets_at: float | None = None
    result_text: str | None = None
    cost_usd: float | None = None
    claimed_success: bool = False  # the agent itself said it succeeded


#: the last stored option of a question whose options are suggestions: any answer is accepted
FREE_TEXT = "(free text)"


@dataclass(frozen=True)
class Question:
    """A question an agent asked a person through ask_human, and its answer once given."""

    id: str
    task_id: str
    attempt: int
    asked_at: float
    text: str
    options: tuple[str, ...] = ()
    status: Literal["pending", "answered", "cancelled", "expired"] = "pending"
    answer: str | None = None
    answered_at: float | None = None
    answered_by: str | None = None

    @property
    def free_text(self) -> bool:
        """True when any answer is accepted: no options, or the agent allowed free text."""
        return not self.options or self.options[-1] == FREE_TEXT

    @property
    def choices(self) -> tuple[str, ...]:
        """The options a person picks from (without the free-text marker)."""
        return tuple(o for o in self.options if o != FREE_TEXT)


@dataclass(frozen=True)
class Host:
    """One machine running an engine on this store, as its last heartbeat described it."""

    name: str
    heartbeat: float
    cores: int = 0
    load: float | None = None
    mem_available: int | None = None
    disk_free: int | None = None
    running: int = 0
    tags: tuple[str, ...] = ()
    version: str = ""


@dataclass(frozen=True)
class Transition:
    """One move of a task between states, with its reason (the task's history)."""

    task_id: str
    ts: float
    src: str | None
    dst: str
    reason: str | None
    attempt: int
    actor: str | None


@dataclass(frozen=True)
class Command:
    """A command for the engine that owns a task (kill, pause, resume, retry, cancel, merge)."""

    id: int
    task_id: str | None  # None: fleet-wide (pause --all / resume --all)
    verb: str
    arg: str | None
    created_at: float
    target_owner: str | None = None
    status: str = "pending"  # pending | done | failed
    result: str | None = None


@dataclass(frozen=True)
class Decision:
    """The admission gate's verdict for one task: ok, or the first failing gate's reason."""

    ok: bool
    reason: str | None = None
    retry_at: float | None = None  # when the gate might pass again, if known


@dataclass(frozen=True)
class Gauges:
    """The fleet's headroom and limits at one moment, as the cockpit's gauges show them."""

    running: int = 0
    max_concurrent: int = 0
    paused: bool = False
    #: agents other engines on the store run (an engine's own snapshot counts only its own in
    #: ``running``, against its own ``max_concurrent``; a view of the whole fleet counts all there)
    running_elsewhere: int = 0
    load_per_core: float | None = None
    mem_available: int | None = None
    mem_floor: int | None = None
    disk_free: int | None = None
    rate_limits: tuple[RateLimit, ...] = ()
    hosts: int = 1
    budget_spent_usd: float = 0.0
    budget_usd: float | None = None
    # the gates the readings are held against (for bars that show how near each one is)
    max_load_per_core: float | None = None
    disk_floor: int | None = None
    agent_mem: int | None = None  # learned (or assumed) memory of one more agent, bytes
    agent_mem_measured: bool = False
    rate_limit_threshold: float = 0.9
    rate_holds: tuple[tuple[str, float], ...] = ()  # (account, held until) while an account is held


@dataclass(frozen=True)
class HostSeries:
    """One host's recent pulse in fixed buckets (``scheduler.series``): the peak of running agents,
    and the events, tokens and dollars counted in each bucket. Bucket ``i`` covers
    ``[start + i * bucket_s, start + (i + 1) * bucket_s)``; the last one is still filling."""

    host: str
    bucket_s: float
    start: float
    running: tuple[int, ...] = ()
    events: tuple[int, ...] = ()
    tokens: tuple[int, ...] = ()
    cost: tuple[float, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    """An immutable view of the fleet for the first paint and for gauges."""

    taken_at: float
    tasks: tuple[Task, ...] = ()
    questions: tuple[Question, ...] = ()
    hosts: tuple[Host, ...] = ()
    gauges: Gauges = field(default_factory=Gauges)
    series: tuple[HostSeries, ...] = ()  # per host, for sparklines (the fleet's is their sum)
    #: an attached view with no engine live on the store: when its figures were last fresh (the
    #: newest engine heartbeat, else when it was taken); None while an engine is live
    stale_since: float | None = None


# -- what ``Engine.subscribe()`` delivers: one small frozen record per kind of news ------------


@dataclass(frozen=True, slots=True)
class TaskChanged:
    """A task was added or changed (the whole new row)."""

    task: Task


@dataclass(frozen=True, slots=True)
class AgentEvent:
    """One normalized agent event, as stored."""

    event: Event


@dataclass(frozen=True, slots=True)
class QuestionChanged:
    """A question was asked, answered or dropped (``question.status`` says which)."""

    question: Question


@dataclass(frozen=True, slots=True)
class GaugesChanged:
    """Fresh fleet gauges (about once a second)."""

    gauges: Gauges


@dataclass(frozen=True, slots=True)
class Notice:
    """A line for the person: an engine warning, a reload, a fall-behind count."""

    text: str


#: one item of ``Engine.subscribe()``; consumers ``match`` on the class
EngineEvent = TaskChanged | AgentEvent | QuestionChanged | GaugesChanged | Notice


@dataclass(frozen=True)
class NotifyStats:
    """How sending went, over the store's whole history (shown by ``doctor``)."""

    sent: int = 0
    failed: int = 0
    sending: int = 0
    last_failure: str | None = None
    last_failure_at: float | None = None
