"""Why a prediction does not execute: the kind of its error (results.jsonl, summary.json, report).

- `failure_message(reward)`: results.jsonl's `error` for a reward (a dict) whose prediction did not
  execute (no_sql, exec_error, timeout): the sandbox's message, prefixed by its status when the sandbox
  refused the SQL rather than SQLite failing it (`too_many_rows: more than ...`); else None.
- `error_kind(message)`: the message up to its first ": " (`no such column`, `no such table`,
  `ambiguous column name`, `too_many_rows`, ...), at most 40 characters; a syntax error
  (`near "X": syntax error`, `incomplete input`, `unrecognized token`) is `syntax error`, and a few
  messages lose their variable part (`misuse of aggregate function count()` is `misuse of aggregate`).
- `exec_errors(rows, trajectories)` / `exec_error_kinds(...)`: each `exec_error` row with its message /
  {kind: count} over them,
  most frequent first; when a row has no `error` (an older evaluation folder), the messages of
  `trajectories()` (called then only: trajectories.jsonl rows) stand in, and a row with neither counts
  as `not recorded`.
- `missing_column_place(message, sql, columns)`: for `no such column: [Q.]C`, where C is in the database
  (`columns`: {table: column names}, case-insensitive): `IN_NAMED` (a table the SQL names: a wrong alias
  or scope), `IN_OTHER` (only tables it does not name: a missing join) or `IN_NONE` (no table: an
  invented name); None for any other message. A table counts as named when its name is a word of the
  SQL (runs of letters, digits and `_`, or a quoted name), so a name that only occurs in a string
  literal counts too.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

NOT_RECORDED = "not recorded"
NON_EXECUTABLE = ("no_sql", "exec_error", "timeout")  # the statuses of a final SQL that did not execute
_SQLITE = (None, "runtime_error", "syntax_error", "timeout")  # sandbox statuses whose message is SQLite's
_SYNTAX = re.compile(r'near ".*": syntax error|incomplete input|unrecognized token')
# messages whose variable part follows without ": " (it differs across SQLite versions)
_PREFIXES = ("misuse of aggregate", "misuse of window function", "wrong number of arguments to function")


def failure_message(reward: dict | None) -> str | None:
    if not reward or reward.get("status") not in NON_EXECUTABLE:
        return None
    parts = reward.get("parts") or {}
    message, status = parts.get("message"), parts.get("sandbox_status")
    if not message:
        return None
    return str(message) if status in _SQLITE else f"{status}: {message}"


def error_kind(message: str) -> str:
    if _SYNTAX.match(message):
        return "syntax error"
    for prefix in _PREFIXES:
        if message.startswith(prefix):
            return prefix
    return message.split(": ", 1)[0][:40]


IN_NAMED = "in a table the query names"
IN_OTHER = "only in tables the query does not name"
IN_NONE = "in no table"
_NO_COLUMN = re.compile(r"no such column: (.+)$", re.S)
_WORDS = re.compile(r'"([^"]+)"|`([^`]+)`|\[([^\]]+)\]|([A-Za-z0-9_]+)')


def missing_column_place(message: str, sql: str, columns: dict[str, tuple[str, ...]]) -> str | None:
    m = _NO_COLUMN.match(message or "")
    if not m:
        return None
    column = m.group(1).strip().rsplit(".", 1)[-1].strip('"`[]').lower()
    holders = {t.lower() for t, cols in columns.items() if column in {c.lower() for c in cols}}
    if not holders:
        return IN_NONE
    named = {next(g for g in w if g).lower() for w in _WORDS.findall(sql or "")}
    return IN_NAMED if holders & named else IN_OTHER


def trajectory_messages(trajectories: list[dict]) -> dict[str, str]:
    """{task_id: failure_message} from trajectories.jsonl rows whose prediction did not execute."""
    found = ((t.get("task_id"), failure_message(t.get("reward"))) for t in trajectories)
    return {tid: msg for tid, msg in found if tid is not None and msg}


def exec_errors(
    rows: list[dict], trajectories: Callable[[], list[dict]] | None = None
) -> list[tuple[dict, str | None]]:
    """(row, its message or None) for each `exec_error` row: the row's `error`, else its trajectory's
    (`trajectories()` is called only when some row has no `error`)."""
    errors = [r for r in rows if r.get("status") == "exec_error"]
    unrecorded = trajectories is not None and any(not r.get("error") for r in errors)
    messages = trajectory_messages(trajectories()) if unrecorded else {}
    return [(r, r.get("error") or messages.get(str(r.get("task_id")))) for r in errors]


def exec_error_kinds(
    rows: list[dict], trajectories: Callable[[], list[dict]] | None = None
) -> dict[str, int]:
    kinds = Counter(error_kind(m) if m else NOT_RECORDED for _, m in exec_errors(rows, trajectories))
    return dict(kinds.most_common())
