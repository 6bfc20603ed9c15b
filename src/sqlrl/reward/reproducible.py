"""Which (SQL, sandbox result) pairs the same database bytes reproduce, for de-duplicating repeats.

What is covered:
- `is_deterministic_sql(sql)`: False when the text names anything that may give different results on
  the same database bytes (random(), the clock, connection state). Whole words anywhere in the text
  (string literals and comments included: a false alarm only costs a cache miss), quote characters
  blanked first so `"random"()` is caught too; date()/time() only when called (Spider often has a
  column named date or time); julianday, datetime, strftime, ... always.
- `reproducible(status, message)`: whether a sandbox status is a function of (database bytes, SQL
  text, sandbox limits) alone: ok, empty_sql, syntax_error, forbidden, multiple_statements,
  too_many_rows, and runtime errors whose message does not smell of the machine.

What is not:
- conservative only: a False for deterministic SQL is allowed, a True for non-deterministic SQL is
  not; timeout, too_large, worker_crash and I/O/memory/lock errors are never reproducible.
"""

from __future__ import annotations

import re
from functools import lru_cache

__all__ = ["MEMO_STATUSES", "is_deterministic_sql", "reproducible"]

_NONDET_WORDS = re.compile(
    r"\b(random|randomblob|changes|total_changes|last_insert_rowid|julianday|datetime|unixepoch|"
    r"strftime|timediff|current_date|current_time|current_timestamp|now)\b",
    re.I,
)
_NONDET_CALL = re.compile(r"\b(date|time)\s*(\(|/\*|--)", re.I)
_QUOTES = re.compile(r"[\"`\[\]]")
# sandbox statuses that are a function of (database bytes, SQL text, sandbox limits) alone
MEMO_STATUSES = frozenset(
    {"ok", "empty_sql", "syntax_error", "forbidden", "multiple_statements", "too_many_rows"}
)
# runtime errors that may depend on the machine rather than the SQL: never memoized
_TRANSIENT_ERROR = re.compile(
    r"unable to open|disk i/o|out of memory|locked|busy|malformed|interrupt|not a database|no such file"
    r"|memory|resource",
    re.I,
)


_TRANSIENT_ERROR_LOWER = re.compile(_TRANSIENT_ERROR.pattern)


def _transient(msg: str) -> bool:
    """`_TRANSIENT_ERROR.search(msg)`; for an ASCII message (where re.I is plain ASCII case folding)
    the same search on the lower-cased text without re.I, which is several times cheaper."""
    if msg.isascii():
        return _TRANSIENT_ERROR_LOWER.search(msg.lower()) is not None
    return _TRANSIENT_ERROR.search(msg) is not None


# The ASCII shortcut of `is_deterministic_sql` (same answer, tests turn it off to compare): every word
# of both patterns contains one of these substrings, so ASCII text whose lower-cased form contains none
# of them cannot match; otherwise the same patterns without re.I search the lower-cased text (for ASCII
# text re.I is plain ASCII case folding, and lower-casing changes no \b or \s). Non-ASCII text takes the
# re.I search itself (Unicode folding: 'ſ' matches 's', the Kelvin sign matches 'k').
_ASCII_SHORTCUT = True
_NONDET_HINTS = ("random", "changes", "last_insert_rowid", "julianday", "date", "time", "unixepoch", "now")
_NONDET_WORDS_LOWER = re.compile(_NONDET_WORDS.pattern)
_NONDET_CALL_LOWER = re.compile(_NONDET_CALL.pattern)


@lru_cache(maxsize=65536)
def is_deterministic_sql(sql: str) -> bool:
    """False when `sql` might give different results on the same database bytes (random(), the clock,
    connection state). Conservative: a False for deterministic SQL is allowed, a True for
    non-deterministic SQL is not."""
    if _ASCII_SHORTCUT and sql.isascii():
        low = sql.lower()
        for hint in _NONDET_HINTS:
            if hint in low:
                break
        else:
            return True
        text = _QUOTES.sub(" ", low)
        return not (_NONDET_WORDS_LOWER.search(text) or _NONDET_CALL_LOWER.search(text))
    text = _QUOTES.sub(" ", sql)
    return not (_NONDET_WORDS.search(text) or _NONDET_CALL.search(text))


def reproducible(status: str | None, message: str | None) -> bool:
    """Whether a sandbox result with this status and message is a function of the database and SQL."""
    if status in MEMO_STATUSES:
        return True
    return status == "runtime_error" and not _transient(str(message or ""))
