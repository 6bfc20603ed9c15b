"""Why a prediction does not execute: the kind of its SQLite error (results.jsonl, summary.json, report).

- `error_kind(message)`: the message up to its first ": " (`no such column`, `no such table`,
  `ambiguous column name`, ...), at most 40 characters; a syntax error (`near "X": syntax error`,
  `incomplete input`, `unrecognized token`) is `syntax error`, and a few messages lose their variable
  part (`misuse of aggregate function count()` is `misuse of aggregate`).
- `exec_error_kinds(rows)`: {kind: count} over results.jsonl rows with status `exec_error`, most frequent
  first; a row without its `error` field (evaluated before results.jsonl held it) counts as
  `not recorded`.
"""

from __future__ import annotations

import re
from collections import Counter

NOT_RECORDED = "not recorded"
_SYNTAX = re.compile(r'near ".*": syntax error|incomplete input|unrecognized token')


# messages whose variable part follows without ": " (it differs across SQLite versions)
_PREFIXES = ("misuse of aggregate", "misuse of window function", "wrong number of arguments to function")


def error_kind(message: str) -> str:
    if _SYNTAX.match(message):
        return "syntax error"
    for prefix in _PREFIXES:
        if message.startswith(prefix):
            return prefix
    return message.split(": ", 1)[0][:40]


def exec_error_kinds(rows: list[dict]) -> dict[str, int]:
    kinds = Counter(
        error_kind(r["error"]) if r.get("error") else NOT_RECORDED
        for r in rows
        if r.get("status") == "exec_error"
    )
    return dict(kinds.most_common())
