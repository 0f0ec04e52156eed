"""Human questions (DESIGN section 12): ask, answer (first answer wins), cancel, list, display.

Why it exists: three parts touch the inbox — the ``ask_human`` MCP server (asks and waits), the
engine (cancels the questions of a task that ended) and the cockpit / CLI (list and answer). The
rules they must agree on live here, in one place, over the Store contract:

- a question carries its task, attempt, time and options; its text is the agent's, stored as is;
- the first answer wins atomically (the store's conditional UPDATE of a *pending* row); a second
  answer is refused with ``already answered: <answer>`` and changes nothing;
- a question whose task stopped is cancelled, one that timed out is expired;
- agent text is data, never instructions: before it reaches a terminal it goes through
  :func:`sanitize_for_display`, so a question cannot move the cursor, retitle the window, write
  to the clipboard (OSC 52), hide text or reorder it with bidi overrides.

All functions are synchronous (like the Store); async callers use ``anyio.to_thread``.
No textual or rich imports here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from fleet_tui.scheduler.model import FREE_TEXT, Question
from fleet_tui.scheduler.store.protocol import Store

#: longest question text kept (an agent may paste a whole log into a question)
MAX_QUESTION_CHARS = 8_000
#: most options kept, and the longest option
MAX_OPTIONS = 20
MAX_OPTION_CHARS = 200


def free_text(q: Question) -> bool:
    """True when any answer is accepted: the question offers no options, or says so."""
    return q.free_text


def choices(q: Question) -> tuple[str, ...]:
    """The options a person picks from (without the free-text marker)."""
    return q.choices


def check_answer(q: Question, text: str) -> tuple[str | None, str | None]:
    """(the answer to record, None) or (None, why it is refused). An answer to a choice must be
    one of its options (any case; or its number); free-text questions take anything."""
    opts = choices(q)
    if free_text(q) or not opts:
        return text, None
    given = text.strip()
    for o in opts:
        if o.lower() == given.lower():
            return o, None
    if given.isdigit() and 1 <= int(given) <= len(opts):
        return opts[int(given) - 1], None
    import difflib

    close = difflib.get_close_matches(given.lower(), [o.lower() for o in opts], n=1, cutoff=0.5)
    hint = ""
    if close:
        hint = f" — did you mean {next(o for o in opts if o.lower() == close[0])!r}?"
    return None, f"{given!r} is not one of the options [{' | '.join(opts)}]{hint}"


class InboxError(ValueError):
    """A question that cannot be asked (empty text); the message says what is wrong."""


def ask(
    store: Store,
    task_id: str,
    attempt: int,
    text: str,
    options: Sequence[str] | None,
    now: float,
    allow_free_text: bool = False,
) -> Question:
    """Store a pending question of ``task_id``'s attempt ``attempt`` and return it.

    The text is trimmed and capped, options are trimmed, de-duplicated and capped; nothing is
    interpreted. Raises InboxError for an empty question."""
    text = (text or "").strip()
    if not text:
        raise InboxError("the question is empty: say what you need to know")
    if len(text) > MAX_QUESTION_CHARS:
        text = text[:MAX_QUESTION_CHARS] + " [...]"
    opts = [o for o in clean_options(options) if o != FREE_TEXT]
    if opts and allow_free_text:
        opts.append(FREE_TEXT)
    return store.add_question(task_id, attempt, text, opts, now)


def clean_options(options: Sequence[str] | None) -> list[str]:
    """Trimmed, non-empty, de-duplicated options, at most MAX_OPTIONS of MAX_OPTION_CHARS."""
    out: list[str] = []
    for o in options or ():
        o = str(o).strip()[:MAX_OPTION_CHARS]
        if o and o not in out:
            out.append(o)
        if len(out) >= MAX_OPTIONS:
            break
    return out


def answer(store: Store, qid: str, text: str, by: str, now: float) -> tuple[bool, str]:
    """Answer question ``qid``; the first answer wins.

    Returns (True, "answered <qid>") when this answer was recorded, else (False, message):
    ``already answered: <answer>`` when another answer won, or why the question cannot be
    answered (unknown, cancelled, expired, empty answer)."""
    q = store.get_question(qid)
    if q is None:
        return False, f"no question {qid!r} (`fleet-tui questions` lists them)"
    if not text.strip():
        return False, "the answer is empty"
    if q.status == "pending":
        checked, why = check_answer(q, text)
        if checked is None:
            return False, f"{why}; answer with one of them"
        text = checked
    if store.answer_question(qid, text, by, now):
        return True, f"answered {qid}"
    return False, refusal(store.get_question(qid) or q)


def refusal(q: Question) -> str:
    """Why question ``q`` no longer takes an answer."""
    if q.status == "answered":
        return f"already answered: {q.answer}"
    if q.status == "cancelled":
        return f"question {q.id} was cancelled (its task stopped)"
    if q.status == "expired":
        return f"question {q.id} expired (nobody answered in time; the agent went on)"
    return f"question {q.id} is {q.status}"


def cancel_for_task(store: Store, task_id: str, now: float) -> int:
    """Cancel every pending question of a task that was killed, cancelled or finished."""
    return store.close_questions(task_id, "cancelled", now)


def expire(store: Store, qid: str, now: float) -> bool:
    """Mark an unanswered question expired; False when it was answered or closed meanwhile."""
    return store.expire_question(qid, now)


def pending(store: Store) -> list[Question]:
    """Every pending question across all tasks, oldest first."""
    return store.pending_questions()


# -- display ------------------------------------------------------------------------------------
# C0 controls except TAB and LF, DEL, C1 controls; bidi embeddings/overrides/isolates, marks and
# the line/paragraph separators (U+2028/9), which can make displayed text differ from its meaning.
_CONTROLS = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029\u200e\u200f\u061c\ufff9-\ufffb]"
)


def _visible(m: re.Match[str]) -> str:
    c = ord(m.group(0))
    if c < 0x20:  # control pictures: ESC -> ␛, BEL -> ␇, NUL -> ␀ ...
        return chr(0x2400 + c)
    if c == 0x7F:
        return "\u2421"  # ␡
    if c <= 0x9F:  # an 8-bit C1 control is ESC + a character: CSI 0x9b -> ␛[
        return "\u241b" + chr(c - 0x40)
    return f"<U+{c:04X}>"


def sanitize_for_display(text: str | None, *, one_line: bool = False, limit: int | None = None) -> str:
    """Agent-provided ``text`` made inert for a terminal: data, never control.

    Every control character is shown instead of obeyed: ESC as ``␛`` (so an OSC 52 clipboard
    write reads ``␛]52;c;…␇`` and does nothing), other C0 controls as their control pictures, C1
    controls as ``␛`` plus their 7-bit letter, bidi overrides/isolates and invisible marks as
    ``<U+202E>``. Newline and tab are kept (CR LF becomes LF, a lone CR a newline). With
    ``one_line`` newlines and tabs become spaces; with ``limit`` the result is cut to that many
    characters with an ellipsis."""
    if not text:
        return ""
    s = text.replace("\r\n", "\n").replace("\r", "\n")
    s = _CONTROLS.sub(_visible, s)
    if one_line:
        s = " ".join(s.split())
    if limit is not None and len(s) > limit:
        s = s[: max(limit - 1, 0)] + "…"
    return s
