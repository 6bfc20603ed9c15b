"""Deciding whether a final SQL answers the task: execution match, validity reward, test-suite metric.

Standard library + sqlglot only (never torch; sqlglot is imported only when SQL is parsed, so sandbox
workers can import this module cheaply). The gold SQL is never executed here, nor on a connection the
policy touched: gold results come from `GoldCache.get(db_path, sql)` (executed once, cached); the
prediction runs in the sandbox, and with a `Sandbox` the whole pair is scored inside its workers
(`Evaluator`, `_score_in_worker`), which receive the gold's cached result, never its SQL to execute.

Execution match (our metric, `execution_match`), exact rules
-------------------------------------------------------------
Inputs are the gold result (columns, rows) and the predicted result (columns, rows) plus the gold's
*shape* (`gold_shape(gold_sql)`: whether order matters, which output columns hold the ORDER BY keys,
LIMIT/OFFSET).

1. Column count. A different number of columns is a mismatch, even when both results are empty
   (`reason="column_count"`). Column *names* are ignored.
2. Values. Two cells are equal when Python `==` says so (so NULL equals NULL, int 1 equals float 1.0),
   or when at least one is a float, both are numbers (int/float, not str/bytes) and
   `math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)`. Two ints are compared exactly (10**6 != 10**6+1).
   Strings, bytes and numbers never equal each other ('1' != 1). Strings are case-sensitive.
3. Rows are a multiset: duplicates count (two copies of a row are not one), row order is ignored ...
4. ... unless the gold's TOP-LEVEL query has ORDER BY: the outermost SELECT's ORDER BY, or, for a
   top-level compound (UNION/INTERSECT/EXCEPT), the ORDER BY attached to the compound. An ORDER BY inside
   a subquery, CTE, IN (...) or derived table does not count. Gold parsed with sqlglot (dialect sqlite);
   if sqlglot cannot parse it, an ORDER BY token at parenthesis depth 0 counts.
   When order matters:
   a. If every ORDER BY key of the gold resolves to an output column of the gold (same alias, same
      expression text, `ORDER BY <n>` position, or the same column name where one side is unqualified)
      we know the sort key of every gold row. The gold rows are cut into *runs* of consecutive rows
      with equal key (rule 2 equality). The prediction must have the same number of rows and, for
      every run, the prediction's rows at those positions must equal the gold run as a multiset
      (rows tied on the key may come in any order).
      LIMIT ties: if the gold has a top-level LIMIT and the limit was reached (row count == the literal
      limit, or the limit is not a literal), the LAST run is a *boundary run*; with a top-level OFFSET
      (not literal 0) the FIRST run is one too. At a boundary run the database may have more rows tied
      on the key than were returned, and any of them is a correct answer, so the prediction's rows at
      those positions only have to carry the same key values (their other columns are not checked).
      This is an approximation from results alone: we cannot check that such a predicted row exists in
      the database with that key (a prediction fabricating a tied row with the right key would pass).
   b. Otherwise (a key is an expression that is not in the output, e.g. `ORDER BY count(*)`, or the
      gold projects `*`) the prediction must equal the gold as a sequence (position by position). Ties
      in unseen keys are then NOT relaxed: a correct prediction that orders tied rows differently, or
      picks a different tied row at a LIMIT cut, is scored as a mismatch (conservative).
   LIMIT without top-level ORDER BY: plain multiset comparison of what was returned.
5. Column permutation. The prediction may list the gold's columns in another order. Gold column j is
   *compatible* with predicted column i when their values, restricted to every compared segment (the
   whole result, each run, or each position), are equal as multisets. Among compatible assignments we
   search depth-first (most constrained gold column first, identity first, identical predicted columns
   tried once, partial assignments pruned by comparing the projected rows), and accept the first
   permutation under which rules 3/4 hold. The search is bounded: at most `max_tries` (5040) checks and
   `max_work` (500,000) row visits; past either bound the answer is mismatch with
   `reason="permutation_bound"` (a possible false negative, reported as such in parts).
6. DISTINCT is NOT stripped: `SELECT DISTINCT a` and `SELECT a` match only if their results do.
7. Float tolerance for multisets: rows are grouped by their non-numeric cells, then sorted by their
   numeric cells and compared pairwise; if that fails and a group has <= 64 rows, an exact bipartite
   matching is tried. A group larger than 64 whose near-equal floats sort differently between gold and
   prediction may be a false negative (never a false positive).
Guaranteed: the comparison is symmetric up to the float/ties rules, deterministic, never raises on
sqlite3 values (int/float/str/bytes/None), and finishes in bounded time (wide, NULL-heavy results
included: 30 columns x 2000 rows of mostly NULLs in well under 2 s).

Reward statuses (`Evaluator.score`)
------------------------------------
gold unscorable (GoldResult.scorable False) -> `gold_unscorable`, value None (excluded; decided
before looking at the prediction, so every arm is scored on the same tasks). No/empty SQL (or sandbox
`empty_sql`) -> `no_sql`, 0. Sandbox syntax_error / forbidden / multiple_statements / runtime_error /
too_many_rows / too_large -> `exec_error`, 0 (parts["sandbox_status"] records which). timeout ->
`timeout`, 0. worker_crash, an unknown sandbox status, or an exception from the sandbox or gold cache
-> `infra_error`, value None (excluded, never 0 or 1). ok -> `match` (1.0) or `mismatch` (0.0).
`Evaluator.score_many([(sql, task), ...])` gives exactly what `score` gives on each pair, scoring the
pairs in parallel inside the sandbox workers (or running the predictions through `execute_many` for a
sandbox without `execute_scored`). A deterministic pair repeated within one call is scored once (see
`Evaluator`); the rewards are the same with that de-duplication on or off.
Every Reward also carries `exec_ms`, the sandbox's milliseconds on the pair's SQL in that call (None
when nothing ran): a diagnostic for finding slow model SQL, not part of the verdict, equality or
`to_dict`.
`kind="validity"`: value 1.0 when the SQL executes with status ok (status still says match/mismatch as
a diagnostic), 0 otherwise; the other statuses are as above.

Test-suite metric (literature, `parts["test_suite_match"]`)
------------------------------------------------------------
Our re-implementation of the execution semantics of Zhong et al. 2020 ("Semantic Evaluation for
Text-to-SQL with Distilled Test Suites", `exec_eval`) on the single task database, NOT their test
suites of distilled databases (so it is weaker than their published metric). Every DISTINCT keyword
token is removed from gold and prediction (their `remove_distinct`, done with the sqlglot tokenizer so
string literals and the rest of the text are untouched; this also turns COUNT(DISTINCT x) into
COUNT(x), as theirs does). Both variants are executed (gold through the gold cache, prediction through
the sandbox; a variant equal to the original reuses its result), then compared with their `result_eq`:
two empty results are equal whatever their columns, otherwise the same rules as ours but with exact
value equality (no float tolerance), strict sequence comparison when order matters (no tie
relaxation), and column permutation allowed. Order matters iff the gold has a top-level ORDER BY (their
code uses the substring 'order by' anywhere in the gold; we use the top-level rule for both metrics).
1.0/0.0, or None with parts["test_suite_reason"] when it could not be computed.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from operator import itemgetter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlglot import exp

# sqlglot is imported where SQL is parsed or tokenized (gold_shape, the tokenizer fallbacks), not at
# import time: sandbox workers import this module for the comparison code (see `_score_in_worker`).

__all__ = [
    "ABS_TOL",
    "REL_TOL",
    "Evaluator",
    "GoldShape",
    "MatchResult",
    "Reward",
    "execution_match",
    "gold_shape",
    "is_deterministic_sql",
    "remove_distinct",
    "test_suite_result_eq",
    "validity_reward",
]

REL_TOL = 1e-6
ABS_TOL = 1e-9
MAX_TRIES = 5040
MAX_WORK = 500_000
_MATCHING_MAX = 64
_FAST_PATH = True  # execution_match's identical-rows shortcut (tests turn it off to compare)

STATUSES = ("no_sql", "exec_error", "timeout", "mismatch", "match", "gold_unscorable", "infra_error")
_EXEC_ERROR_STATUSES = frozenset(
    {"syntax_error", "forbidden", "multiple_statements", "runtime_error", "too_many_rows", "too_large"}
)


# ------------------------------------------------------------------------------------------ results


@dataclass(frozen=True)
class Reward:
    value: float | None  # None when excluded (gold_unscorable, infra_error)
    status: str  # one of STATUSES
    parts: dict = field(default_factory=dict)
    # milliseconds the sandbox spent executing this pair's SQL (the prediction and, for the test-suite
    # metric, its DISTINCT-free variant) in this call; None when nothing ran. A diagnostic (which model
    # SQL is slow): not part of the verdict, of equality or of `to_dict`. A repeat answered from an
    # identical pair of the same call carries that pair's time.
    exec_ms: float | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"Reward: unknown status {self.status!r}")
        if self.status in ("gold_unscorable", "infra_error") and self.value is not None:
            raise ValueError(f"Reward: status {self.status} must have value None")

    @property
    def excluded(self) -> bool:
        return self.value is None

    def to_dict(self) -> dict:
        return {"value": self.value, "status": self.status, "parts": dict(self.parts)}


@dataclass(frozen=True)
class MatchResult:
    match: bool
    reason: str  # "match" | "column_count" | "row_count" | "rows_differ" | "order_differs" | ...
    permutation: tuple[int, ...] | None = None  # pred column for each gold column, when matched
    mode: str = "multiset"  # multiset | runs | sequence
    tries: int = 0

    def __bool__(self) -> bool:
        return self.match

    def to_dict(self) -> dict:
        return {
            "match": self.match,
            "reason": self.reason,
            "permutation": list(self.permutation) if self.permutation is not None else None,
            "mode": self.mode,
            "tries": self.tries,
        }


# ------------------------------------------------------------------------------------ gold analysis


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
# `tests/test_reward.py` checks the equivalence against the tokenizer on Spider SQL and random text.
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


# ------------------------------------------------------------------------------------- comparisons


try:
    from _collections import _count_elements  # what Counter uses to count
except ImportError:  # pragma: no cover - other Pythons

    def _count_elements(mapping: dict, iterable: Any) -> None:
        get = mapping.get
        for v in iterable:
            mapping[v] = get(v, 0) + 1


def _counts(values: Any) -> dict:
    """{value: count}: a Counter without its Python-level overhead (equal dicts <=> equal multisets)."""
    d: dict = {}
    _count_elements(d, values)
    return d


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float)


class _Cmp:
    """Cell/row/multiset equality under one tolerance setting (tol=False: exact Python equality)."""

    def __init__(self, tol: bool, rel: float = REL_TOL, abs_: float = ABS_TOL):
        self.tol = tol
        self.rel = rel
        self.abs = abs_

    def cell(self, a: Any, b: Any) -> bool:
        if a == b:
            return True
        if not self.tol or not (type(a) is float or type(b) is float) or not (_is_num(a) and _is_num(b)):
            return False
        try:
            return math.isclose(float(a), float(b), rel_tol=self.rel, abs_tol=self.abs)
        except OverflowError:
            return False

    def row(self, a: tuple, b: tuple) -> bool:
        if a == b:
            return True
        if not self.tol:
            return False
        return len(a) == len(b) and all(self.cell(x, y) for x, y in zip(a, b))

    def multiset(self, a: list[tuple], b: list[tuple], has_float: bool) -> bool:
        if len(a) != len(b):
            return False
        if a == b or _counts(a) == _counts(b):
            return True
        if not (self.tol and has_float):
            return False
        return self._tol_multiset(a, b)

    def _tol_multiset(self, a: list[tuple], b: list[tuple]) -> bool:
        def split(rows: list[tuple]) -> dict:
            groups: dict[tuple, list[tuple]] = {}
            for r in rows:
                key = tuple(_NUM if _is_num(v) and not isinstance(v, bool) else v for v in r)
                groups.setdefault(key, []).append(r)
            return groups

        ga, gb = split(a), split(b)
        if ga.keys() != gb.keys():
            return False
        for key, ra in ga.items():
            rb = gb[key]
            if len(ra) != len(rb):
                return False
            numidx = [i for i, k in enumerate(key) if k is _NUM]

            def sk(r: tuple, numidx: list[int] = numidx) -> tuple:
                return tuple(float(r[i]) for i in numidx)

            sa, sb = sorted(ra, key=sk), sorted(rb, key=sk)
            if all(self.row(x, y) for x, y in zip(sa, sb)):
                continue
            if len(ra) > _MATCHING_MAX or not self._bipartite(sa, sb):
                return False
        return True

    def _bipartite(self, a: list[tuple], b: list[tuple]) -> bool:
        adj = [[j for j, y in enumerate(b) if self.row(x, y)] for x in a]
        match_b: list[int] = [-1] * len(b)

        def augment(i: int, seen: list[bool]) -> bool:
            for j in adj[i]:
                if not seen[j]:
                    seen[j] = True
                    if match_b[j] < 0 or augment(match_b[j], seen):
                        match_b[j] = i
                        return True
            return False

        return all(augment(i, [False] * len(b)) for i in range(len(a)))


class _NumMarker:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<num>"


_NUM = _NumMarker()


def _project(rows: list[tuple], cols: tuple[int, ...] | list[int]) -> list[tuple]:
    if not cols:
        return [()] * len(rows)
    if len(cols) == 1:
        c = cols[0]
        return [(r[c],) for r in rows]
    return list(map(itemgetter(*cols), rows))


class _Budget(Exception):
    pass


# the fast reject of `execution_match`: cell types whose equality is `==` under both settings (floats
# only without float_tol), and the most checks its permutation search can charge for k columns
_EXACT_TYPES = frozenset((int, str, bytes, type(None)))
_EXACT_TYPES_F = _EXACT_TYPES | {float}
_REJECT_MAX_COLS = 8
_MAX_CHARGES = [sum(math.perm(k, d) for d in range(1, k + 1)) for k in range(_REJECT_MAX_COLS + 1)]


def execution_match(
    gold_columns: list[str] | None,
    gold_rows: list,
    pred_columns: list[str] | None,
    pred_rows: list,
    shape: GoldShape | None = None,
    *,
    float_tol: bool = True,
    tie_relax: bool = True,
    empty_equal_any_columns: bool = False,
    max_tries: int = MAX_TRIES,
    max_work: int = MAX_WORK,
) -> MatchResult:
    """Compare a predicted result with the gold result under the module's rules. See the docstring.

    `gold_columns`/`pred_columns` may be None (then the column count is taken from the rows).
    `shape` comes from `gold_shape(gold_sql)`; None means "order does not matter".
    """
    shape = shape or GoldShape()
    cmp = _Cmp(float_tol)
    g = list(map(tuple, gold_rows))
    p = list(map(tuple, pred_rows))
    if empty_equal_any_columns and not g and not p:
        return MatchResult(True, "match", None, "multiset")
    kg = len(gold_columns) if gold_columns is not None else (len(g[0]) if g else 0)
    kp = len(pred_columns) if pred_columns is not None else (len(p[0]) if p else 0)
    if g and set(map(len, g)) != {kg} or p and set(map(len, p)) != {kp}:
        return MatchResult(False, "ragged_rows")
    if kg != kp:
        return MatchResult(False, "column_count")
    if len(g) != len(p):
        return MatchResult(False, "row_count")
    k, n = kg, len(g)
    if n == 0:
        return MatchResult(True, "match", tuple(range(k)))
    types = set(map(type, chain.from_iterable(g)))
    types.update(map(type, chain.from_iterable(p)))
    has_float = float_tol and float in types

    # ---- fast path (same answer as the search below, only cheaper): identical rows, as a sequence
    # when order matters or as a multiset when it does not, match under the identity permutation,
    # which the search tries first at every depth, so it is the first leaf it reaches. Taken only
    # when the search could not have run out of budget on the way there (at most k*k column checks,
    # k partial checks and one full check, each charging n rows), and in "runs" mode only without
    # floats (a run is a tolerance chain, so its boundary check is not implied by equal rows).
    steps = (k * k if float_tol else 0) + k + 1
    if _FAST_PATH and steps <= max_tries and n * steps <= max_work:
        fast_mode = "multiset"
        if shape.order_matters:
            runs_ok = tie_relax and shape.key_columns is not None and all(c < k for c in shape.key_columns)
            fast_mode = "runs" if runs_ok else "sequence"
        if fast_mode == "multiset":
            same = g == p or _counts(g) == _counts(p)
        else:
            same = (fast_mode == "sequence" or not has_float) and g == p
        if same:
            return MatchResult(True, "match", tuple(range(k)), fast_mode, 0)

    # ---- segments: multiset segments (list of position lists) and key-only boundary segments
    mode = "multiset"
    segs: list[list[int]] = [list(range(n))]
    key_only: list[tuple[list[int], tuple]] = []
    keycols: tuple[int, ...] = ()
    if shape.order_matters:
        if tie_relax and shape.key_columns is not None and all(c < k for c in shape.key_columns):
            mode = "runs"
            keycols = shape.key_columns
            keys = _project(g, keycols)
            runs: list[list[int]] = [[0]]
            for i in range(1, n):
                if cmp.row(keys[i], keys[i - 1]):
                    runs[-1].append(i)
                else:
                    runs.append([i])
            boundary: set[int] = set()
            if shape.has_limit and (shape.limit is None or n >= shape.limit):
                boundary.add(len(runs) - 1)
            if shape.has_offset:
                boundary.add(0)
            segs = [r for i, r in enumerate(runs) if i not in boundary]
            key_only = [(runs[i], keys[runs[i][0]]) for i in sorted(boundary)]
        else:
            mode = "sequence"
            segs = [[i] for i in range(n)]

    # ---- fast reject (same answer as the search below, only cheaper). When every cell is an int,
    # str, bytes or None (or also a float without float_tol), cell equality is Python `==`, which
    # hashing agrees with, so under ANY column permutation a match needs the cells of the compared
    # segments to be equal as multisets, and each key value of a boundary (key-only) row to be one
    # of that predicted row's cells. If either fails, the search can only end in "no match"; it is
    # skipped when it could have run out of budget first (it charges at most sum over d = 1..k of
    # k!/(k-d)! checks of n rows each), since then its answer would be "permutation_bound".
    if _FAST_PATH and k <= _REJECT_MAX_COLS and types <= (_EXACT_TYPES if float_tol else _EXACT_TYPES_F):
        charges = _MAX_CHARGES[k]
        if charges <= max_tries and n * charges <= max_work:
            if key_only:
                gc_ = chain.from_iterable(g[x] for s in segs for x in s)
                pc_ = chain.from_iterable(p[x] for s in segs for x in s)
            else:
                gc_, pc_ = chain.from_iterable(g), chain.from_iterable(p)
            reject = _counts(gc_) != _counts(pc_)
            if not reject:
                for positions, key in key_only:
                    for x in positions:
                        row = p[x]
                        if any(v not in row for v in key):
                            reject = True
                            break
                    if reject:
                        break
            if reject:
                return MatchResult(False, _diff_reason(mode), None, mode, 0)

    tries = 0
    work = 0

    def charge(rows: int) -> None:
        nonlocal tries, work
        tries += 1
        work += rows
        if tries > max_tries or work > max_work:
            raise _Budget

    # ---- column compatibility
    def col(rows: list[tuple], j: int) -> list[Any]:
        return [r[j] for r in rows]

    gcols = [col(g, j) for j in range(k)]
    pcols = [col(p, i) for i in range(k)]

    def signature(values: list[Any]) -> Any:
        if mode == "sequence":
            return tuple(values)
        return tuple(frozenset(Counter(values[i] for i in s).items()) for s in segs)

    gsig = [signature(c) for c in gcols]
    psig = [signature(c) for c in pcols]
    gfloat = [has_float and float in set(map(type, c)) for c in gcols]
    pfloat = [has_float and float in set(map(type, c)) for c in pcols]

    def coarse(values: list[Any]) -> tuple:
        nums = [float(v) for v in values if _is_num(v)]
        other = frozenset(Counter(v for v in values if not _is_num(v)).items())
        return other, len(nums), (min(nums), max(nums)) if nums else None

    gco = [coarse(c) if has_float else None for c in gcols]
    pco = [coarse(c) if has_float else None for c in pcols]

    def quick_reject(j: int, i: int) -> bool:
        (go, gn, gmm), (po, pn, pmm) = gco[j], pco[i]  # type: ignore[misc]
        if go != po or gn != pn:
            return True
        return gmm is not None and not (cmp.cell(gmm[0], pmm[0]) and cmp.cell(gmm[1], pmm[1]))

    def tol_compatible(j: int, i: int) -> bool:
        if quick_reject(j, i):
            return False
        charge(n)
        if mode == "sequence":
            return all(cmp.cell(a, b) for a, b in zip(gcols[j], pcols[i]))
        return all(cmp.multiset([(gcols[j][x],) for x in s], [(pcols[i][x],) for x in s], True) for s in segs)

    try:
        compat: list[list[int]] = []
        by_sig: dict[Any, list[int]] = {}
        for i, s in enumerate(psig):
            by_sig.setdefault(s, []).append(i)
        for j in range(k):
            cands = list(by_sig.get(gsig[j], []))
            if has_float:
                for i in range(k):
                    if i not in cands and (pfloat[i] or gfloat[j]):
                        if tol_compatible(j, i):
                            cands.append(i)
                cands.sort()
            if not cands:
                return MatchResult(False, _diff_reason(mode), None, mode, tries)
            # identity first
            if j in cands:
                cands.remove(j)
                cands.insert(0, j)
            compat.append(cands)

        # identical predicted columns are interchangeable: try one per class at each node
        pclass: dict[tuple, int] = {}
        pcls = [pclass.setdefault(tuple(c), i) for i, c in enumerate(pcols)]

        gorder = sorted(range(k), key=lambda j: (len(compat[j]), j))
        assign: dict[int, int] = {}
        used: set[int] = set()
        prune = mode != "sequence"

        def partial_ok() -> bool:
            gc = sorted(assign)
            pc = [assign[j] for j in gc]
            gp, pp = _project(g, gc), _project(p, pc)
            charge(n)
            for s in segs:
                a = gp if len(s) == n else [gp[x] for x in s]
                b = pp if len(s) == n else [pp[x] for x in s]
                if not cmp.multiset(a, b, has_float):
                    return False
            return True

        def full_ok() -> bool:
            perm = tuple(assign[j] for j in range(k))
            pp = _project(p, perm)
            charge(n)
            if mode == "sequence":
                return all(cmp.row(a, b) for a, b in zip(g, pp))
            for s in segs:
                a = g if len(s) == n else [g[x] for x in s]
                b = pp if len(s) == n else [pp[x] for x in s]
                if not cmp.multiset(a, b, has_float):
                    return False
            for positions, key in key_only:
                for x in positions:
                    if not cmp.row(tuple(pp[x][c] for c in keycols), key):
                        return False
            return True

        def search(depth: int) -> bool:
            if depth == k:
                return full_ok()
            j = gorder[depth]
            tried_cls: set[int] = set()
            for i in compat[j]:
                if i in used or pcls[i] in tried_cls:
                    continue
                tried_cls.add(pcls[i])
                assign[j] = i
                used.add(i)
                ok = (not prune or depth + 1 < 2 or depth + 1 == k or partial_ok()) and search(depth + 1)
                used.discard(i)
                if ok:
                    return True
                del assign[j]
            return False

        if search(0):
            perm = tuple(assign[j] for j in range(k))
            return MatchResult(True, "match", perm, mode, tries)
        return MatchResult(False, _diff_reason(mode), None, mode, tries)
    except _Budget:
        return MatchResult(False, "permutation_bound", None, mode, tries)


def _fail_parts(base: dict, want_ts: bool) -> dict[str, Any]:
    """The named parts of a prediction that did not execute (both scoring paths)."""
    fail = {**base, "executable": 0.0, "match": 0.0}
    if want_ts:
        fail["test_suite_match"] = 0.0
    return fail


def _match_parts(base: dict, m: MatchResult, shape: GoldShape, n_gold: int, n_pred: int) -> dict[str, Any]:
    """The named parts of an executed prediction's Reward (one definition for the parent-side and the
    in-worker scoring paths, which must give identical Rewards)."""
    return {
        **base,
        "executable": 1.0,
        "match": 1.0 if m.match else 0.0,
        "order_matters": shape.order_matters,
        "compare_mode": m.mode,
        "detail": m.reason,
        "permutation": list(m.permutation) if m.permutation is not None else None,
        "gold_row_count": n_gold,
        "pred_row_count": n_pred,
    }


def _diff_reason(mode: str) -> str:
    return "order_differs_or_rows_differ" if mode != "multiset" else "rows_differ"


def test_suite_result_eq(
    gold_columns: list[str] | None,
    gold_rows: list,
    pred_columns: list[str] | None,
    pred_rows: list,
    order_matters: bool,
) -> MatchResult:
    """Zhong et al. 2020 `result_eq`: exact values, strict order if it matters, column permutation,
    two empty results equal."""
    return execution_match(
        gold_columns,
        gold_rows,
        pred_columns,
        pred_rows,
        GoldShape(order_matters=order_matters),
        float_tol=False,
        tie_relax=False,
        empty_equal_any_columns=True,
    )


test_suite_result_eq.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


def validity_reward(sandbox_result: Any) -> float:
    """1.0 if the sandbox executed the SQL with status ok, else 0.0."""
    return 1.0 if getattr(sandbox_result, "status", None) == "ok" else 0.0


# --------------------------------------------------------------------------------------- evaluator


def _gold_scorable(gold: Any) -> tuple[bool, str | None]:
    scorable = getattr(gold, "scorable", None)
    if scorable is None:
        status = getattr(gold, "status", None)
        scorable = status == "ok" and getattr(gold, "row_count", len(getattr(gold, "rows", []) or [])) > 0
        reason = None if scorable else f"gold_{status}"
        return bool(scorable), reason
    return bool(scorable), getattr(gold, "unscorable_reason", None)


# ------------------------------------------------------------------------------------- memoization

# Names whose presence makes a statement possibly non-deterministic. Matched as whole words anywhere in
# the text (string literals and comments included: a false alarm only costs a cache miss), after
# quote characters are blanked so `"random"()` is caught too. date()/time() are only flagged when called
# (a Spider column is often named date or time); julianday, datetime, strftime, ... always.
_NONDET_WORDS = re.compile(
    r"\b(random|randomblob|changes|total_changes|last_insert_rowid|julianday|datetime|unixepoch|"
    r"strftime|timediff|current_date|current_time|current_timestamp|now)\b",
    re.I,
)
_NONDET_CALL = re.compile(r"\b(date|time)\s*(\(|/\*|--)", re.I)
_QUOTES = re.compile(r"[\"`\[\]]")
# sandbox statuses that are a function of (database bytes, SQL text, sandbox limits) alone
_MEMO_STATUSES = frozenset(
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


def _memoizable(res: Any) -> bool:
    """A sandbox result that the same (database, SQL, sandbox) would reproduce: never a timeout, a
    worker crash, an exception, a size/memory failure (too_large), or a runtime error that smells of
    the machine (I/O, memory, locks)."""
    if isinstance(res, _InfraFailure):
        return False
    st = getattr(res, "status", None)
    if st in _MEMO_STATUSES:
        return True
    return st == "runtime_error" and not _transient(str(getattr(res, "message", "") or ""))


_PublicTask: Any = None  # sqlrl.tasks.data.PublicTask, imported on first use
_TAKES_RESOLVED: dict[type, bool] = {}  # gold cache type -> its get_many takes `resolved=`


def _takes_resolved(gold_cache: Any) -> bool:
    t = type(gold_cache)
    hit = _TAKES_RESOLVED.get(t)
    if hit is None:
        import inspect

        try:
            hit = "resolved" in inspect.signature(gold_cache.get_many).parameters
        except (AttributeError, TypeError, ValueError):
            hit = False
        _TAKES_RESOLVED[t] = hit
    return hit


def _copy_reward(r: Reward) -> Reward:
    parts = {k: list(v) if isinstance(v, list) else v for k, v in r.parts.items()}
    return Reward(r.value, r.status, parts, r.exec_ms)


def _elapsed(*results: Any) -> float | None:
    """Summed `elapsed_ms` of the sandbox results among `results` (None where none has one)."""
    ms = [float(e) for r in results if (e := getattr(r, "elapsed_ms", None)) is not None]
    return round(sum(ms), 3) if ms else None


@dataclass
class _Pair:
    i: int  # position in the score_many input
    db_path: str
    gold_sql: str
    gold: Any
    sql: str
    key: tuple | None  # (db_path, gold SQL, prediction) of a deterministic prediction; None otherwise


class Evaluator:
    """Scores a final SQL for a PrivateTask. kind="execution" (match) or "validity" (executes).

    Where the scoring runs: with a `sqlrl.sql.sandbox.Sandbox` (anything with `execute_scored`) every pair
    is scored inside the sandbox workers (`_score_in_worker`): the prediction and its DISTINCT-free
    variant run there and are compared there with the gold result, which the worker gets from the gold
    cache through the parent (shipped once per worker and kept there); one round trip per chunk of
    pairs, and only the verdict (value, status, parts) comes back. The gold is never executed in a
    worker, on a connection the policy's SQL touched or anywhere else but the gold cache. Golds larger
    than `_WORKER_GOLD_MAX_CELLS` cells, and any other sandbox (only `execute` / `execute_many`), use the
    parent-side path: the predictions' results come back and are compared here. Both paths give the
    same Reward (value, status, parts), as tests/test_reward_workers.py checks.

    De-duplication within one call (on by default, `memo_entries=0` turns it off; rewards are identical
    either way): a deterministic prediction (`is_deterministic_sql`) repeated for the same database
    path and gold within one `score_many` call is scored once, and the repeats get copies of its reward
    when every execution behind it is reproducible (`_memoizable`: ok, syntax_error, forbidden,
    multiple_statements, too_many_rows, runtime errors other than I/O/memory/locks; never timeout,
    too_large, worker_crash or an exception); otherwise the repeats are scored on their own.
    Non-deterministic SQL (random(), the clock, ...) is scored every time. Nothing is kept between
    calls: the cross-call memo (LRU of sandbox results and rewards by database sha256) was removed,
    because it cost more than it saved (bench/bench_reward.py); `memo_cells` is accepted and ignored.

    Threads may share one Evaluator (veRL's reward workers, Agent Lightning's runners): a call's state
    lives in the calling thread and the counters (`memo_stats`) are updated under a lock. `Sandbox`
    hands its idle workers to whichever concurrent call takes them and `GoldCache` locks, so the whole
    stack gives each thread the rewards a serial call would (tests/test_reward_memo.py).
    """

    def __init__(
        self,
        sandbox: Any,
        gold_cache: Any,
        kind: str = "execution",
        *,
        test_suite: bool = True,
        memo_entries: int = 50_000,
        memo_cells: int = 2_000_000,
    ):
        if kind not in ("execution", "validity"):
            raise ValueError(f"Evaluator: kind must be 'execution' or 'validity', got {kind!r}")
        self.sandbox = sandbox
        self.gold_cache = gold_cache
        self.kind = kind
        self.test_suite = test_suite
        self.dedup = int(memo_entries) > 0
        self.executions = 0  # statements sent to the sandbox (predictions and variants)
        self.duplicate_hits = 0  # pairs answered with a copy of an identical pair's reward
        self._count_lock = threading.Lock()  # the counters above, when threads share this Evaluator
        # per thread: the current call's resolved database paths (`_gold_many`), so that threads sharing
        # one Evaluator (veRL's reward workers, Agent Lightning runners) never see each other's calls
        self._call = threading.local()

    @property
    def _resolved(self) -> dict | None:
        return getattr(self._call, "resolved", None)

    @_resolved.setter
    def _resolved(self, value: dict | None) -> None:
        self._call.resolved = value

    def _count(self, executions: int = 0, duplicate_hits: int = 0) -> None:
        with self._count_lock:
            self.executions += executions
            self.duplicate_hits += duplicate_hits

    def memo_stats(self) -> dict:
        with self._count_lock:
            return {"duplicate_hits": self.duplicate_hits, "executions": self.executions}

    def clear_memo(self) -> None:
        """Nothing to clear: no state is kept between calls (kept for API compatibility)."""

    @staticmethod
    def _check_task(task: Any) -> tuple[str, str]:
        global _PublicTask
        if _PublicTask is None:
            try:
                from sqlrl.tasks.data import PublicTask as _PublicTask
            except Exception:  # pragma: no cover - data.py always exists in the package
                _PublicTask = type("_NoPublicTask", (), {})
        if isinstance(task, _PublicTask):
            raise TypeError("Evaluator.score: got a PublicTask, which has no gold SQL; pass the PrivateTask")
        gold_sql = getattr(task, "gold_sql", None)
        public = getattr(task, "public", None)
        db_path = getattr(public, "db_path", None)
        if not isinstance(gold_sql, str) or not isinstance(db_path, str):
            raise TypeError(
                f"Evaluator.score: expected a PrivateTask (with .public.db_path and .gold_sql), "
                f"got {type(task).__module__}.{type(task).__qualname__}"
            )
        return db_path, gold_sql

    def score(self, final_sql: str | None, task: Any) -> Reward:
        return self.score_many([(final_sql, task)])[0]

    def _execute_batch(self, items: list[tuple[str, str]]) -> list[Any]:
        """Run predictions (and prediction variants) through the sandbox, in parallel when it has
        `execute_many`; an exception becomes that item's `_InfraFailure` (scored as infra_error)."""
        if not items:
            return []
        self._count(executions=len(items))
        many = getattr(self.sandbox, "execute_many", None)
        if many is not None and len(items) > 1:
            try:
                out = list(many(items))
                if len(out) == len(items):
                    return out
            except Exception:
                pass  # fall back to one call per item, so one bad item cannot fail the batch
        results: list[Any] = []
        for db_path, sql in items:
            try:
                results.append(self.sandbox.execute(db_path, sql))
            except Exception as e:
                results.append(_InfraFailure(f"sandbox: {type(e).__name__}: {e}"))
        return results

    def _execute_pending(self, pending: list[_Pair], want_ts: bool) -> tuple[list[Any], list[Any]]:
        """Parent-side path: the predictions in one batch, then the DISTINCT-free variants of those
        that executed in another (None where there is no variant)."""
        preds = self._execute_batch([(p.db_path, p.sql) for p in pending])
        variants: list[Any] = [None] * len(pending)
        if want_ts:
            todo: list[tuple[int, tuple[str, str]]] = []
            for n, (p, res) in enumerate(zip(pending, preds)):
                if isinstance(res, _InfraFailure) or getattr(res, "status", None) != "ok":
                    continue
                v_sql = remove_distinct(p.sql)
                if v_sql != p.sql:
                    todo.append((n, (p.db_path, v_sql)))
            for (n, _), res in zip(todo, self._execute_batch([x for _, x in todo])):
                variants[n] = res
        return preds, variants

    def score_many(self, items: list[tuple[str | None, Any]]) -> list[Reward]:
        """Score (final_sql, PrivateTask) pairs; same result as `score` on each. With a Sandbox the
        pairs are scored inside its workers in parallel, one round trip per chunk (see the class
        docstring); otherwise the predictions run through `sandbox.execute_many` in one batch and one
        batch of DISTINCT-free variants. A repeat of a deterministic pair in the same call is scored
        once."""
        checked = [self._check_task(task) for _, task in items]  # TypeError before any work
        base: dict[str, Any] = {"kind": self.kind}
        want_ts = self.kind == "execution" and self.test_suite
        out: list[Reward | None] = [None] * len(items)
        pending: list[_Pair] = []
        # one batched cache look-up (one path resolution and file hash per database, not per pair);
        # if it fails, fall back to per-pair look-ups so one bad gold only affects its own pair
        fetched = None
        # database paths resolved once for this call's look-ups (golds, then their variants)
        self._resolved = {} if _takes_resolved(self.gold_cache) else None
        if hasattr(self.gold_cache, "get_many"):
            try:
                uniq = list(dict.fromkeys(checked))  # a GRPO group shares its gold: look it up once
                got = dict(zip(uniq, self._gold_many(uniq)))
                fetched = [got[c] for c in checked]
            except Exception:
                fetched = None
        first: set[tuple] = set()  # keys of the deterministic pairs pending in this call
        dups: list[tuple[int, tuple]] = []  # (position, key) of repeats of a pending pair
        # _gold_scorable per gold object: `fetched` holds them all, so an id stays theirs in this call
        verdicts: dict[int, tuple[bool, str | None]] = {}
        for i, ((final_sql, _), (db_path, gold_sql)) in enumerate(zip(items, checked)):
            try:
                gold = fetched[i] if fetched is not None else self.gold_cache.get(db_path, gold_sql)
            except Exception as e:  # infrastructure: never a wrong answer
                out[i] = Reward(
                    None, "infra_error", {**base, "error": f"gold_cache: {type(e).__name__}: {e}"}
                )
                continue
            if fetched is not None:
                hit = verdicts.get(id(gold))
                if hit is None:
                    hit = verdicts[id(gold)] = _gold_scorable(gold)
                scorable, why = hit
            else:
                scorable, why = _gold_scorable(gold)
            if not scorable:
                out[i] = Reward(None, "gold_unscorable", {**base, "reason": why or "gold_unscorable"})
            elif final_sql is None or not final_sql.strip().strip(";").strip():
                out[i] = Reward(0.0, "no_sql", _fail_parts(base, want_ts))
            else:
                key = None
                if self.dedup and is_deterministic_sql(final_sql):
                    key = (db_path, gold_sql, final_sql)
                    if key in first:
                        dups.append((i, key))
                        continue
                    first.add(key)
                pending.append(_Pair(i, db_path, gold_sql, gold, final_sql, key))

        reusable: dict[tuple, Reward] = {}  # key -> reward whose every execution was reproducible
        if pending:
            rest = self._score_in_workers(pending, out, base, want_ts, reusable)
            if rest:
                preds, variants = self._execute_pending(rest, want_ts)
                self._finish_pending(rest, preds, variants, out, base, want_ts, reusable)
        # repeats of a pair scored in this call: a copy of its reward when every execution behind it
        # was reproducible, otherwise scored again on their own
        redo = []
        for i, key in dups:
            r = reusable.get(key)
            if r is not None:
                out[i] = _copy_reward(r)
            else:
                redo.append(i)
        if len(redo) < len(dups):
            self._count(duplicate_hits=len(dups) - len(redo))
        if redo:
            for i, r in zip(redo, self.score_many([items[i] for i in redo])):
                out[i] = r
        return out  # type: ignore[return-value]

    def _score_in_workers(
        self, pending: list[_Pair], out: list, base: dict, want_ts: bool, reusable: dict
    ) -> list[_Pair]:
        """Score the pending pairs inside the sandbox workers (`Sandbox.execute_scored` with
        `_score_in_worker`): one round trip per chunk, the prediction, its DISTINCT-free variant and
        both comparisons in the worker, golds shipped from the gold cache (never executed there).
        Returns the pairs left to the parent-side path: all of them when the sandbox has no
        `execute_scored` or the call fails, and those whose gold is too large to ship."""
        run = getattr(self.sandbox, "execute_scored", None)
        if run is None:
            return pending
        variants: dict[tuple[str, str], Any] = {}
        if want_ts:
            wanted = list(
                dict.fromkeys(
                    (p.db_path, v)
                    for p in pending
                    if (v := remove_distinct(p.gold_sql)) != p.gold_sql
                    and _cells(p.gold) <= _WORKER_GOLD_MAX_CELLS
                )
            )
            variants = dict(zip(wanted, self._gold_variants(wanted)))
        items: list[tuple] = []
        refs: dict[int, tuple[int, Any]] = {}
        sent: list[_Pair] = []
        rest: list[_Pair] = []
        # (ref keys, extra) of each distinct (gold object, gold SQL, database) in this call, or None
        # when that gold goes to the parent-side path: a GRPO group shares one gold, worked out once
        per_gold: dict[tuple, tuple | None] = {}
        for p in pending:
            gold = p.gold
            gid = (id(gold), p.gold_sql, p.db_path)  # `pending` holds the objects: ids stay valid
            if gid in per_gold:
                hit = per_gold[gid]
            else:
                hit = per_gold[gid] = self._gold_refs(p, gold, refs, variants, want_ts)
            if hit is None:
                rest.append(p)
                continue
            items.append((p.db_path, p.sql, *hit))
            sent.append(p)
        if not items:
            return rest
        try:
            got = run(items, refs, _SCORER, {"kind": self.kind, "ts": want_ts})
            if len(got) != len(items):
                raise RuntimeError("execute_scored: wrong number of results")
        except Exception:  # noqa: BLE001 - the parent-side path has its own per-pair failure handling
            return pending
        executions = 0
        for p, g in zip(sent, got):
            if type(g) is tuple and len(g) == 6:
                value, status, parts, memo_ok, n, ms = g
                executions += n
                r = Reward(value, status, parts, ms)
                out[p.i] = r
                if memo_ok and p.key is not None:
                    reusable[p.key] = r
                continue
            executions += 1
            if type(g) is tuple:  # ("__error__", text): the scorer raised (a bug, or memory)
                out[p.i] = Reward(None, "infra_error", {**base, "error": f"sandbox scorer: {g[-1]}"})
                continue
            st = getattr(g, "status", None)  # the watchdog's SQLResult: timeout or worker_crash
            msg = str(getattr(g, "message", "") or "")[:500]
            if st == "timeout":
                fail = _fail_parts(base, want_ts)
                out[p.i] = Reward(0.0, "timeout", {**fail, "sandbox_status": st, "message": msg}, _elapsed(g))
            else:
                out[p.i] = Reward(None, "infra_error", {**base, "sandbox_status": st, "message": msg})
        self._count(executions=executions)
        return rest

    def _finish_pending(
        self,
        chunk: list[_Pair],
        preds: list[Any],
        variants: list[Any],
        out: list,
        base: dict,
        want_ts: bool,
        reusable: dict,
    ) -> None:
        executed: list[tuple[_Pair, Any, Any, GoldShape, dict]] = []
        for p, res, vres in zip(chunk, preds, variants):
            i = p.i
            if isinstance(res, _InfraFailure):
                out[i] = Reward(None, "infra_error", {**base, "error": res.error})
                continue
            st = getattr(res, "status", None)
            msg = str(getattr(res, "message", "") or "")[:500]
            fail = _fail_parts(base, want_ts)
            ms = _elapsed(res, vres)
            if st != "ok":
                if st == "empty_sql":
                    out[i] = Reward(0.0, "no_sql", {**fail, "sandbox_status": st}, ms)
                elif st in _EXEC_ERROR_STATUSES:
                    out[i] = Reward(0.0, "exec_error", {**fail, "sandbox_status": st, "message": msg}, ms)
                elif st == "timeout":
                    out[i] = Reward(0.0, "timeout", {**fail, "sandbox_status": st, "message": msg}, ms)
                else:
                    out[i] = Reward(None, "infra_error", {**base, "sandbox_status": st, "message": msg})
                if p.key is not None and out[i].status in ("no_sql", "exec_error") and _memoizable(res):
                    reusable[p.key] = out[i]
                continue
            gold = p.gold
            shape = gold_shape(p.gold_sql)
            m = execution_match(gold.columns, gold.rows, res.columns, res.rows, shape)
            parts = _match_parts(base, m, shape, len(gold.rows), len(res.rows))
            if m.reason == "permutation_bound":
                parts["note"] = (
                    "column-permutation search bound reached; declared mismatch (may be a false negative)"
                )
            value = 1.0 if (m.match or self.kind == "validity") else 0.0
            out[i] = Reward(value, "match" if m.match else "mismatch", parts, ms)
            # identical rows found by execution_match's fast path (tries == 0 with rows: the search
            # always charges at least one try): the test-suite comparison of the same two results
            # takes its own fast path to a match (exact equality implies it; its budget is smaller)
            same = m.match and m.tries == 0 and len(gold.rows) > 0
            executed.append((p, res, vres, shape, parts, same))
        if want_ts:
            self._test_suite_pending(executed)
        for p, _, vres, _, parts, _ in executed:
            if p.key is None:
                continue
            if vres is not None and not _memoizable(vres):
                continue
            if str(parts.get("test_suite_reason", "")).startswith("gold_variant_infra"):
                continue
            reusable[p.key] = out[p.i]

    @staticmethod
    def _gold_refs(p: _Pair, gold: Any, refs: dict, variants: dict, want_ts: bool) -> tuple | None:
        """(ref keys, extra) for the worker items of pairs with this gold, registering the payloads in
        `refs`; None when a payload is too large to ship (the parent-side path scores those pairs)."""
        weight = _cells(gold)
        if weight > _WORKER_GOLD_MAX_CELLS:
            return None
        gk = _ref_key(gold, p.gold_sql)
        if gk not in refs:
            sh = gold_shape(p.gold_sql)
            shape_t = (sh.order_matters, sh.key_columns, sh.has_limit, sh.limit, sh.has_offset, sh.parsed)
            refs[gk] = (weight, (gold.columns, gold.rows, shape_t))
        if want_ts:
            v_sql = remove_distinct(p.gold_sql)
            if v_sql != p.gold_sql:
                g_var = variants[(p.db_path, v_sql)]
                if isinstance(g_var, BaseException):
                    return (gk,), f"gold_variant_infra: {type(g_var).__name__}"
                v_weight = _cells(g_var)
                if v_weight > _WORKER_GOLD_MAX_CELLS:
                    return None
                vk = _ref_key(g_var, "")
                if vk not in refs:
                    v_status = getattr(g_var, "status", "unknown")
                    refs[vk] = (v_weight, (v_status, g_var.columns, g_var.rows))
                return (gk, vk), None
        return (gk,), None

    def _gold_many(self, items: list[tuple[str, str]]) -> list[Any]:
        """`gold_cache.get_many`, with this call's resolved database paths where it takes them."""
        resolved = self._resolved
        if resolved is not None:
            return self.gold_cache.get_many(items, progress=False, resolved=resolved)
        return self.gold_cache.get_many(items, progress=False)

    def _gold_variants(self, wanted: list[tuple[str, str]]) -> list[Any]:
        """Gold-cache results (or the exception) for the DISTINCT-free gold variants, batched."""
        if not wanted:
            return []
        if hasattr(self.gold_cache, "get_many"):
            try:
                got = list(self._gold_many(wanted))
                if len(got) == len(wanted):
                    return got
            except Exception:
                pass  # one pair at a time, so an exception only affects its own pair
        out: list[Any] = []
        for db_path, sql in wanted:
            try:
                out.append(self.gold_cache.get(db_path, sql))
            except Exception as e:
                out.append(e)
        return out

    def _test_suite_pending(self, executed: list) -> None:
        """Fill parts["test_suite_match"] (and "test_suite_reason") in place; see the module docstring."""
        need: list[int] = []
        wanted: list[tuple[str, str]] = []
        for n, (p, *_) in enumerate(executed):
            g_sql = remove_distinct(p.gold_sql)
            if g_sql != p.gold_sql:
                need.append(n)
                wanted.append((p.db_path, g_sql))
        g_vars: dict[int, Any] = dict(zip(need, self._gold_variants(wanted)))
        for n, (p, res, vres, shape, parts, same) in enumerate(executed):
            g_res: Any = p.gold
            if n in g_vars:
                g_res = g_vars[n]
                if isinstance(g_res, BaseException):
                    parts["test_suite_match"] = None
                    parts["test_suite_reason"] = f"gold_variant_infra: {type(g_res).__name__}"
                    continue
                if getattr(g_res, "status", None) not in ("ok", "empty"):
                    parts["test_suite_match"] = None
                    parts["test_suite_reason"] = f"gold_variant_{getattr(g_res, 'status', 'unknown')}"
                    continue
            p_res = res if vres is None else vres
            if same and g_res is p.gold and p_res is res:  # the very pair execution_match found identical
                parts["test_suite_match"] = 1.0
                continue
            if isinstance(p_res, _InfraFailure) or getattr(p_res, "status", None) == "worker_crash":
                parts["test_suite_match"] = None
                parts["test_suite_reason"] = "pred_variant_infra"
                continue
            if p_res.status != "ok":
                parts["test_suite_match"] = 0.0
                parts["test_suite_reason"] = f"pred_variant_{p_res.status}"
                continue
            m = test_suite_result_eq(
                g_res.columns, g_res.rows, p_res.columns, p_res.rows, shape.order_matters
            )
            parts["test_suite_match"] = 1.0 if m.match else 0.0
            if m.reason == "permutation_bound":
                parts["test_suite_reason"] = "permutation_bound"


@dataclass(frozen=True)
class _InfraFailure:
    error: str


# ------------------------------------------------------------------------ scoring in the sandbox workers

# Golds whose result has more cells (rows x columns) than this are scored in the parent (their rows
# would be shipped to, and held by, every worker); everything else is scored by `_score_in_worker`.
_WORKER_GOLD_MAX_CELLS = 200_000
_SCORER = "sqlrl.reward.match:_score_in_worker"
_REFS: dict[tuple[int, str], tuple[int, Any]] = {}  # (id(gold result), gold sql) -> (key, gold result)
_REFS_MAX = 8192
_REFS_LOCK = threading.Lock()
_ref_serial = iter(range(1, 2**62))


def _ref_key(obj: Any, sql: str) -> int:
    """A process-wide key for a gold result object (and the SQL whose shape goes with it): the same
    object always gets the same key while it is registered, and the registry holds the object, so its
    id cannot be reused by another object under that key."""
    k = (id(obj), sql)
    with _REFS_LOCK:
        hit = _REFS.get(k)
        if hit is not None and hit[1] is obj:
            return hit[0]
        if len(_REFS) >= _REFS_MAX:
            for old in list(_REFS)[: _REFS_MAX // 2]:
                del _REFS[old]
        key = next(_ref_serial)
        _REFS[k] = (key, obj)
        return key


def _cells(res: Any) -> int:
    rows = getattr(res, "rows", None) or []
    return 1 + len(rows) * max(1, len(getattr(res, "columns", None) or []))


def _memoizable_tuple(res: tuple) -> bool:
    st = res[0]
    if st in _MEMO_STATUSES:
        return True
    return st == "runtime_error" and not _transient(str(res[5] or ""))


_SHAPES: dict[tuple, GoldShape] = {}  # shape tuple -> GoldShape, in the workers


def _score_in_worker(run: Any, sql: str, refs: list, extra: Any, options: dict) -> tuple:
    """`_score_pair` plus the milliseconds its statements took in the sandbox (a 6th element, the
    Reward's `exec_ms`)."""
    spent = [0.0]

    def timed(stmt: str) -> tuple:
        res = run(stmt)
        spent[0] += float(res[4] or 0.0)
        return res

    return (*_score_pair(timed, sql, refs, extra, options), round(spent[0], 3))


def _score_pair(run: Any, sql: str, refs: list, extra: Any, options: dict) -> tuple:
    """One pair, inside a sandbox worker (`Sandbox.execute_scored`): exactly what the Evaluator's
    parent-side path computes, from the prediction's sandbox result and the gold result shipped from
    the gold cache. The gold is never executed here: `run` only ever gets the prediction and its
    DISTINCT-free variant. refs: [(gold columns, gold rows, gold shape as a tuple)] plus, when the
    gold has a DISTINCT-free variant, (its gold-cache status, columns, rows). extra: None, or the
    reason the gold variant could not be fetched. Returns (value, status, parts, memoizable,
    statements run)."""
    kind = options["kind"]
    want_ts = options["ts"]
    res = run(sql)
    st = res[0]
    if st != "ok":
        msg = str(res[5] or "")[:500]
        fail = _fail_parts({"kind": kind}, want_ts)
        if st == "empty_sql":
            return (0.0, "no_sql", {**fail, "sandbox_status": st}, _memoizable_tuple(res), 1)
        if st in _EXEC_ERROR_STATUSES:
            out = (0.0, "exec_error", {**fail, "sandbox_status": st, "message": msg})
            return (*out, _memoizable_tuple(res), 1)
        if st == "timeout":
            return (0.0, "timeout", {**fail, "sandbox_status": st, "message": msg}, False, 1)
        return (None, "infra_error", {"kind": kind, "sandbox_status": st, "message": msg}, False, 1)
    g_cols, g_rows, shape_t = refs[0]
    shape = _SHAPES.get(shape_t)
    if shape is None:
        if len(_SHAPES) >= 4096:
            _SHAPES.clear()
        shape = _SHAPES[shape_t] = GoldShape(*shape_t)
    p_cols, p_rows = res[1], res[2]
    m = execution_match(g_cols, g_rows, p_cols, p_rows, shape)
    parts = _match_parts({"kind": kind}, m, shape, len(g_rows), len(p_rows))
    if m.reason == "permutation_bound":
        parts["note"] = "column-permutation search bound reached; declared mismatch (may be a false negative)"
    value = 1.0 if (m.match or kind == "validity") else 0.0
    reward = (value, "match" if m.match else "mismatch", parts)
    if not want_ts:
        return (*reward, True, 1)
    # the test-suite metric, in the order of the parent-side path: the prediction's variant first
    vres = None
    v_sql = remove_distinct(sql)
    if v_sql != sql:
        vres = run(v_sql)
    n = 1 if vres is None else 2
    memo_ok = vres is None or _memoizable_tuple(vres)
    if extra is not None:  # the gold variant could not be fetched (infrastructure)
        parts["test_suite_match"] = None
        parts["test_suite_reason"] = extra
        return (*reward, False, n)
    g_var = refs[1] if len(refs) > 1 else None
    if g_var is not None:
        if g_var[0] not in ("ok", "empty"):
            parts["test_suite_match"] = None
            parts["test_suite_reason"] = f"gold_variant_{g_var[0]}"
            return (*reward, memo_ok, n)
        g_cols, g_rows = g_var[1], g_var[2]
    elif vres is None and m.match and m.tries == 0 and len(g_rows) > 0:
        # identical rows found by execution_match's fast path: test-suite equality follows
        parts["test_suite_match"] = 1.0
        return (*reward, memo_ok, n)
    p_res = res if vres is None else vres
    if p_res[0] == "worker_crash":
        parts["test_suite_match"] = None
        parts["test_suite_reason"] = "pred_variant_infra"
        return (*reward, memo_ok, n)
    if p_res[0] != "ok":
        parts["test_suite_match"] = 0.0
        parts["test_suite_reason"] = f"pred_variant_{p_res[0]}"
        return (*reward, memo_ok, n)
    t = test_suite_result_eq(g_cols, g_rows, p_res[1], p_res[2], shape.order_matters)
    parts["test_suite_match"] = 1.0 if t.match else 0.0
    if t.reason == "permutation_bound":
        parts["test_suite_reason"] = "permutation_bound"
    return (*reward, memo_ok, n)


# --------------------------------------------------------------------------------------------- CLI
