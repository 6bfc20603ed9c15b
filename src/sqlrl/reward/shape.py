"""The gold SQL's shape and its DISTINCT-free variant, read from the SQL text with sqlglot (sqlite).

`gold_shape(sql)` gives what the result comparison needs from the gold: whether order matters, which
output columns hold the ORDER BY keys, and the top-level LIMIT/OFFSET. `remove_distinct(sql)` is
Zhong et al. 2020's `remove_distinct` for the test-suite metric.

What is covered:
- only the TOP-LEVEL ORDER BY counts (the outermost SELECT's, or the one attached to a top-level
  UNION/INTERSECT/EXCEPT); one inside a subquery, CTE, IN (...) or derived table does not;
- an ORDER BY key resolves to an output column by alias, expression text, `ORDER BY <n>`, or the same
  column name where one side is unqualified; a projected `*` resolves no key;
- SQL that sqlglot cannot parse: an ORDER BY token at parenthesis depth 0 means order matters
  (no key columns, no LIMIT/OFFSET);
- `remove_distinct` removes exactly the DISTINCT keyword tokens of the sqlglot tokenizer, leaving
  every other character (string literals included) verbatim; COUNT(DISTINCT x) becomes COUNT(x);
- `distinct_free` (a prediction's variant) is `remove_distinct` in bounded time: text longer than
  `VARIANT_MAX_CHARS` that the fast scan cannot answer (a comment, a backslash, ...) gets no variant
  (None): the tokenizer takes about 4 us a character, seconds on the longest SQL the sandbox runs.

What is not:
- no SQL is executed here, and the shape says nothing about the results;
- sqlglot is imported on first use, not at import time (sandbox workers import this module).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlglot import exp

__all__ = ["VARIANT_MAX_CHARS", "GoldShape", "distinct_free", "gold_shape", "remove_distinct"]

# the longest text `distinct_free` hands to the sqlglot tokenizer (about 0.1 s at 20,000 characters)
VARIANT_MAX_CHARS = 20_000


@dataclass(frozen=True)
class GoldShape:
    order_matters: bool = False
    key_columns: tuple[int, ...] | None = None  # gold output columns holding every ORDER BY key
    has_limit: bool = False
    limit: int | None = None  # literal LIMIT count, None if absent or not a literal
    has_offset: bool = False  # a top-level OFFSET that is not the literal 0
    parsed: bool = True


def _literal_int(node: Any) -> int | None:
    from sqlglot import exp

    if isinstance(node, exp.Limit | exp.Offset):
        node = node.args.get("expression")
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return int(node.this)
        except (TypeError, ValueError):
            return None
    return None


def _projections(node: exp.Expression) -> list[exp.Expression] | None:
    from sqlglot import exp

    while isinstance(node, exp.Subquery | exp.SetOperation):
        node = node.this
    if isinstance(node, exp.Select):
        return list(node.expressions)
    return None


def _key_index(key: exp.Expression, projs: list[exp.Expression]) -> int | None:
    from sqlglot import exp

    if any(
        isinstance(p, exp.Star) or (isinstance(p, exp.Column) and isinstance(p.this, exp.Star)) for p in projs
    ):
        return None
    if isinstance(key, exp.Literal) and not key.is_string:
        n = _literal_int(key)
        return n - 1 if n is not None and 1 <= n <= len(projs) else None
    if isinstance(key, exp.Column) and not key.table:
        name = key.name.lower()
        for i, p in enumerate(projs):
            if isinstance(p, exp.Alias) and p.alias.lower() == name:
                return i
    text = key.sql(dialect="sqlite").lower()
    for i, p in enumerate(projs):
        if p.unalias().sql(dialect="sqlite").lower() == text:
            return i
    if isinstance(key, exp.Column):
        hits = [
            i
            for i, p in enumerate(projs)
            if isinstance(p, exp.Column)
            and p.name.lower() == key.name.lower()
            and (not p.table or not key.table or p.table.lower() == key.table.lower())
        ]
        if len(hits) == 1:
            return hits[0]
    return None


def _tokens(sql: str) -> list | None:
    import sqlglot

    try:
        return sqlglot.tokenize(sql, read="sqlite")
    except Exception:
        return None


def _toplevel_order_by_tokens(sql: str) -> bool:
    from sqlglot.tokens import TokenType

    toks = _tokens(sql)
    if toks is None:
        return bool(re.search(r"\border\s+by\b", sql, re.I))
    depth = 0
    for t in toks:
        if t.token_type == TokenType.L_PAREN:
            depth += 1
        elif t.token_type == TokenType.R_PAREN:
            depth -= 1
        elif t.token_type == TokenType.ORDER_BY and depth == 0:
            return True
    return False


@lru_cache(maxsize=65536)
def gold_shape(gold_sql: str) -> GoldShape:
    """Top-level ORDER BY / LIMIT / OFFSET of the gold and which output columns hold the sort keys."""
    import sqlglot
    from sqlglot import exp

    try:
        node = sqlglot.parse_one(gold_sql, read="sqlite")
    except Exception:
        node = None
    if node is None:
        return GoldShape(order_matters=_toplevel_order_by_tokens(gold_sql), parsed=False)
    order = node.args.get("order")
    limit = node.args.get("limit")
    offset = node.args.get("offset")
    keys: tuple[int, ...] | None = None
    if order is not None:
        projs = _projections(node)
        if projs:
            idx = [_key_index(o.this if isinstance(o, exp.Ordered) else o, projs) for o in order.expressions]
            if idx and all(i is not None for i in idx):
                keys = tuple(dict.fromkeys(idx))  # type: ignore[arg-type]
    off_n = _literal_int(offset) if offset is not None else None
    return GoldShape(
        order_matters=order is not None,
        key_columns=keys,
        has_limit=limit is not None,
        limit=_literal_int(limit) if limit is not None else None,
        has_offset=offset is not None and off_n != 0,
        parsed=True,
    )


# A faster `remove_distinct` for the common case, exact where it answers: the text is cut into
# quoted spans ('...', "...", `...`, [...]; a doubled quote is two adjacent spans, which cover the same
# characters as the tokenizer's one escaped span) and the rest. The rest must consist of ASCII letters,
# digits, "_", the six ASCII white-space characters and operator/punctuation characters only (so no
# comment, stray quote or bracket, "@", "$", ":", "#", "?", "{" or non-ASCII), and the text must hold
# no backslash anywhere. On such text the DISTINCT tokens of the sqlglot (sqlite) tokenizer are
# exactly the case-insensitive occurrences of "distinct" outside the quoted spans, none of which may
# touch a letter, digit or "_" (otherwise: no answer, and the tokenizer decides).
# `tests/reward/test_reward.py` checks the equivalence against the tokenizer on Spider SQL and random text.
_RD_LEX = re.compile(r"""'[^']*'|"[^"]*"|`[^`]*`|\[[^\]]*\]|[^'"`\[]+|.""", re.S)
_RD_SAFE = re.compile(r"[A-Za-z0-9_ \t\n\r\x0b\x0c(),.*=<>+\-/%;|!&~^]*")
_RD_WORD = re.compile(r"distinct", re.I)


def _remove_distinct_fast(sql: str) -> str | None:
    """`remove_distinct` without the sqlglot tokenizer, or None outside the safe subset above."""
    if "\\" in sql:
        return None
    out: list[str] = []
    for m in _RD_LEX.finditer(sql):
        part = m.group()
        c = part[0]
        if c in "'\"`[":
            if len(part) < 2 or part[-1] != ("]" if c == "[" else c):
                return None  # an unterminated quote or bracket
            out.append(part)
            continue
        if "--" in part or "/*" in part or _RD_SAFE.fullmatch(part) is None:
            return None
        pos, n = 0, len(part)
        for w in _RD_WORD.finditer(part):
            a, b = w.span()
            if (a > 0 and (part[a - 1].isalnum() or part[a - 1] == "_")) or (
                b < n and (part[b].isalnum() or part[b] == "_")
            ):
                return None
            out.append(part[pos:a])
            pos = b
        out.append(part[pos:])
    return "".join(out)


@lru_cache(maxsize=65536)
def remove_distinct(sql: str) -> str:
    """Remove every DISTINCT keyword token (Zhong et al.'s `remove_distinct`), leaving the rest verbatim."""
    if "distinct" not in sql.lower():
        return sql
    fast = _remove_distinct_fast(sql)
    if fast is not None:
        return fast
    return _remove_distinct_tokens(sql)


def distinct_free(sql: str) -> str | None:
    """`remove_distinct` of a prediction, or None (no variant) when the text is longer than
    `VARIANT_MAX_CHARS` and the fast scan cannot answer; such text is not kept in the cache either."""
    if len(sql) <= VARIANT_MAX_CHARS:
        return remove_distinct(sql)
    if "distinct" not in sql.lower():
        return sql
    return _remove_distinct_fast(sql)


def _remove_distinct_tokens(sql: str) -> str:
    from sqlglot.tokens import TokenType

    toks = _tokens(sql)
    if toks is None:
        return sql
    spans = [(t.start, t.end + 1) for t in toks if t.token_type == TokenType.DISTINCT]
    if not spans:
        return sql
    out, pos = [], 0
    for s, e in spans:
        out.append(sql[pos:s])
        pos = e
    out.append(sql[pos:])
    return "".join(out)
