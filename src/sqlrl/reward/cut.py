"""Where a gold's top-level LIMIT/OFFSET cuts its full result and which rows may stand in for the ones
it kept; (keys not in the output, no LIMIT) which rows tie on an unseen key.

The gold cache runs `cut_query(gold).sql` once, like any gold: the gold without LIMIT/OFFSET, its sort
keys appended as output columns when they are not, and `LIMIT offset + n + CUT_TIE_ROWS` for a literal
`LIMIT n` (a bounded top-N sort). `build_cut` reads the gold's rows as the window `[offset, offset +
rows)` of that ordered result and gives the `Cut` that `execution_match` applies: runs of rows with
equal sort key; a run strictly inside the window is compared exactly; the first run (only with an
OFFSET) and the last run may, when rows tied with them lie outside the window, hold ANY rows of the
full result with that key, each predicted row its own row of that pool. With no ORDER BY anywhere
the full query is the gold without LIMIT/OFFSET (bounded by the caps only) and the Cut is one run
whose pool is that whole result (`execution_match` rule 4d).

What is covered:
- keys that are output columns or not (appended), `LIMIT n, m`, OFFSET, no ORDER BY; unseen keys
  and no LIMIT/OFFSET: the whole gold with its keys, one window, no pools;
- no cut unless the gold agrees with its full result, nor for a fetch stopped inside the ties; `fetch_cuts`:
  one batched fetch per call (an exception is infrastructure); inserted keys and LIMIT follow a newline.
What is not:
- no cut (nothing relaxed: a possible false negative, never a false positive) for: keys that are
  not all output columns in a compound SELECT, a top-level SELECT DISTINCT or beside a term naming
  an output column (`ORDER BY 2`, an alias); a LIMIT whose rows an ORDER BY below it picks (derived
  table, CTE, window); a non-literal OFFSET; SQL sqlglot cannot tokenize; a full result failed or
  over the caps; a key not in one run and one block (ties are Python equality: under NOCASE 'Ann'
  and 'ann' do not tie). A non-literal LIMIT adds none to the full query.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlrl.reward.cells import counts
from sqlrl.reward.refs import IdentityMemo
from sqlrl.reward.shape import gold_shape

__all__ = ["Cut", "CutQuery", "build_cut", "cut_query", "fetch_cuts"]

CUT_TIE_ROWS = 10_000  # rows fetched past the gold's window, for the ties of its last run
_CUTS = IdentityMemo(4096)  # (gold result, full result, gold SQL) -> Cut | None


@dataclass(frozen=True)
class Cut:
    runs: tuple[int, ...]  # lengths of the window's runs of equal sort key, top to bottom
    # (run index, every full-result row carrying that run's key), only where ties cross the cut
    pools: tuple[tuple[int, tuple[tuple, ...]], ...] = ()

    def cells(self) -> int:
        """Cells held by the pools (what shipping this cut to a worker costs)."""
        return sum(len(rows) * (len(rows[0]) if rows else 0) for _, rows in self.pools)


@dataclass(frozen=True)
class CutQuery:
    sql: str  # the full ordered result's query
    offset: int  # the gold's literal OFFSET (0 when absent)
    extra_keys: int  # sort keys appended after the gold's output columns (0: keys are output columns)
    limit: int | None = None  # the LIMIT ending `sql` (offset + the gold's LIMIT + CUT_TIE_ROWS), if any
    unordered: bool = False  # a LIMIT/OFFSET without a top-level ORDER BY: `sql` is the whole result


def cut_query(gold_sql: str) -> CutQuery | None:
    """The query of the gold's ordered result up to CUT_TIE_ROWS rows past its window, or None when the
    gold has no top-level ORDER BY with LIMIT/OFFSET or the query cannot be built (module docstring)."""
    return _cut_query(gold_sql, int(CUT_TIE_ROWS))


@lru_cache(maxsize=65536)
def _cut_query(gold_sql: str, tie_rows: int) -> CutQuery | None:
    q = _unbounded(gold_sql)
    if q is None or q.unordered:
        return q
    import sqlglot

    lim = sqlglot.parse_one(gold_sql, read="sqlite").args.get("limit")
    lit = lim.args.get("expression") if lim is not None else None
    if not (isinstance(lit, sqlglot.exp.Literal) and not lit.is_string and str(lit.this).isdigit()):
        return q
    limit = q.offset + int(lit.this) + tie_rows
    return CutQuery(f"{q.sql}{_sep(gold_sql)}LIMIT {limit}", q.offset, q.extra_keys, limit)


def _sep(gold_sql: str) -> str:
    """What joins an insertion to the gold's text: a newline when a line comment could swallow it."""
    return "\n" if "--" in gold_sql else " "


def _unbounded(gold_sql: str) -> CutQuery | None:
    """The query of the gold's whole ordered result (no LIMIT), or None."""
    import sqlglot
    from sqlglot.tokens import TokenType as T

    shape = gold_shape(gold_sql)
    bounded = shape.has_limit or shape.has_offset
    if not (shape.parsed and (bounded if not shape.order_matters else bounded or shape.key_columns is None)):
        return None
    node = sqlglot.parse_one(gold_sql, read="sqlite")
    offset = node.args.get("offset")
    off = 0
    if offset is not None:
        lit = offset.args.get("expression")
        if not (isinstance(lit, sqlglot.exp.Literal) and not lit.is_string and str(lit.this).isdigit()):
            return None
        off = int(lit.this)
    try:
        toks = sqlglot.tokenize(gold_sql, read="sqlite")
    except Exception:
        return None
    if not shape.order_matters and any(t.token_type == T.ORDER_BY for t in toks):
        return None  # an ORDER BY below the LIMIT (derived table, CTE, window) picks the rows: no pool
    depth, top = 0, []  # top: (index in toks, token) at parenthesis depth 0
    for t in toks:
        if t.token_type == T.L_PAREN:
            depth += 1
        elif t.token_type == T.R_PAREN:
            depth -= 1
        elif depth == 0:
            top.append(t)
    limit = next((i for i, t in enumerate(top) if t.token_type == T.LIMIT), None)
    if (limit is None) == bounded:
        return None
    if limit is None:  # no LIMIT: the whole result, its keys appended (up to a trailing semicolon)
        limit = next((i for i, t in enumerate(top) if t.token_type == T.SEMICOLON), len(top))
    cut_at = top[limit].start if limit < len(top) else len(gold_sql)
    if not shape.order_matters:  # the whole result, bounded by the gold cache's caps only
        return CutQuery(gold_sql[:cut_at].rstrip(), off, 0, None, True)
    if shape.key_columns is not None:
        return CutQuery(gold_sql[:cut_at].rstrip(), off, 0)
    kinds = [t.token_type for t in top]
    if any(k in (T.UNION, T.INTERSECT, T.EXCEPT) for k in kinds):
        return None
    first_select = kinds.index(T.SELECT) if T.SELECT in kinds else None
    if first_select is None or (first_select + 1 < len(kinds) and kinds[first_select + 1] == T.DISTINCT):
        return None
    order = max((i for i, k in enumerate(kinds[:limit]) if k == T.ORDER_BY), default=None)
    frm = next((i for i, k in enumerate(kinds) if k == T.FROM and i > first_select), None)
    if order is None or frm is None or frm > order:
        return None
    aliases = {p.alias.lower() for p in node.expressions if isinstance(p, sqlglot.exp.Alias)}
    terms = _order_terms(gold_sql, toks, top[order].end, cut_at, aliases)
    if not terms:
        return None
    extra = "".join(f", {term} AS sqlrl_cut_key_{i}" for i, term in enumerate(terms))
    at = top[frm].start
    sep = _sep(gold_sql)
    head = gold_sql[:at].rstrip() + ("\n" if sep == "\n" else "")
    return CutQuery(head + extra + sep + gold_sql[at:cut_at].rstrip(), off, len(terms))


def _order_terms(sql: str, toks: list, after: int, before: int, aliases: set[str]) -> list[str]:
    """The ORDER BY terms' text between the two positions, without ASC/DESC and NULLS FIRST/LAST; []
    when a term names an output column (`_output_ref`): SQLite sorts by that column, which the
    term's text, appended as a key, would not hold."""
    from sqlglot.tokens import TokenType as T

    terms: list[list] = [[]]
    depth = 0
    inside = [t for t in toks if after < t.start < before]
    for t in inside:
        if t.token_type == T.L_PAREN:
            depth += 1
        elif t.token_type == T.R_PAREN:
            depth -= 1
        if depth == 0 and t.token_type == T.COMMA:
            terms.append([])
        else:
            terms[-1].append(t)
    out = []
    for term in terms:
        if len(term) >= 2 and term[-2].text.upper() == "NULLS" and term[-1].text.upper() in ("FIRST", "LAST"):
            term = term[:-2]
        if term and term[-1].token_type in (T.ASC, T.DESC):
            term = term[:-1]
        if not term or _output_ref(term, aliases):
            return []
        out.append(sql[term[0].start : term[-1].end + 1])
    return out


def _output_ref(term: list, aliases: set[str]) -> bool:
    """Whether SQLite reads this ORDER BY term as an output column: a number (`2`, `(2)`, `+2`,
    `2 COLLATE x`, `0x2`; hex and blob literals counted too: refusing is safe) or a bare name equal
    to an output alias (`SELECT name AS age, * ... ORDER BY age` sorts by name, not t.age)."""
    from sqlglot.tokens import TokenType as T

    core = []
    for t in term:
        if t.token_type == T.COLLATE:
            break
        if t.token_type not in (T.L_PAREN, T.R_PAREN, T.PLUS, T.DASH):
            core.append(t)
    if len(core) != 1:
        return False
    kind, text = core[0].token_type, core[0].text
    if kind in (T.VAR, T.IDENTIFIER):
        return text.lower() in aliases
    return kind == T.HEX_STRING or (kind == T.NUMBER and text.isdigit())


def build_cut(gold_rows: list, full_rows: list, n_cols: int, query: CutQuery, key_columns: Any) -> Cut | None:
    """The Cut of the gold's rows inside its full ordered result, or None when the full result does not
    hold the gold's rows as its window under the rule (then nothing is relaxed)."""
    if query.unordered:
        return _pool_cut(gold_rows, full_rows, n_cols)
    n, o, extra = len(gold_rows), query.offset, query.extra_keys
    keycols = tuple(range(n_cols, n_cols + extra)) if extra else tuple(key_columns or ())
    if n == 0 or not keycols or any(len(r) != n_cols + extra for r in full_rows):
        return None
    if len(full_rows) < o + n:
        return None
    all_keys = [tuple(r[c] for c in keycols) for r in full_rows]
    rows = [tuple(r[:n_cols]) for r in full_rows] if extra else [tuple(r) for r in full_rows]
    keys = all_keys[o : o + n]
    if query.limit is not None and len(full_rows) >= query.limit and all_keys[-1] == keys[-1]:
        return None  # the fetch stopped inside the last run's ties: its pool may be incomplete
    runs = [1]
    for i in range(1, n):
        if keys[i] == keys[i - 1]:
            runs[-1] += 1
        else:
            runs.append(1)
    starts = [sum(runs[:i]) for i in range(len(runs))]
    if len({keys[s] for s in starts}) < len(starts):
        return None  # one key in two runs: SQL's ordering ties what Python's equality does not (a collation)
    pools = []
    for idx in sorted({0, len(runs) - 1}):
        key = keys[starts[idx]]
        where = [i for i, k in enumerate(all_keys) if k == key]
        if where[-1] - where[0] + 1 != len(where):
            return None  # the key's rows are not one block of the full result: the same as above
        pool = tuple(rows[i] for i in where)
        if len(pool) > runs[idx]:
            pools.append((idx, pool))
    pooled = dict(pools)
    gold = [tuple(r) for r in gold_rows]
    for idx, (s, length) in enumerate(zip(starts, runs)):
        g = counts(gold[s : s + length])
        have = counts(pooled[idx]) if idx in pooled else counts(rows[o + s : o + s + length])
        if any(have.get(r, 0) < c for r, c in g.items()) or (idx not in pooled and g != have):
            return None
    return Cut(tuple(runs), tuple(pools))


def _pool_cut(gold_rows: list, full_rows: list, n_cols: int) -> Cut | None:
    """A gold with LIMIT/OFFSET and no top-level ORDER BY: one run of all its rows whose pool is the
    whole result, or None when the result does not hold the gold's rows (as a multiset) or holds
    nothing else (the plain multiset comparison is then the same rule)."""
    gold = [tuple(r) for r in gold_rows]
    full = tuple(tuple(r) for r in full_rows)
    if not gold or len(full) <= len(gold) or any(len(r) != n_cols for r in full):
        return None
    have = counts(full)
    if any(have.get(r, 0) < c for r, c in counts(gold).items()):
        return None
    return Cut((len(gold),), ((0, full),))


def fetch_cuts(
    golds: dict[tuple[str, str], Any], fetch: Callable[[list[tuple[str, str]]], list]
) -> dict[tuple[str, str], Cut | None | BaseException]:
    """{(database, gold SQL): Cut, None (no cut), or the exception raised fetching its full result} for
    the scorable gold results given. `fetch([(database, full SQL)])` gives the gold cache's result for
    each item, or the exception its look-up raised (it does not raise)."""
    want = {k: q for k in golds if (q := cut_query(k[1])) is not None}
    if not want:
        return {}
    fulls = fetch([(db, q.sql) for (db, _), q in want.items()])
    out: dict[tuple[str, str], Cut | None | BaseException] = {}
    for (k, q), full in zip(want.items(), fulls):
        gold = golds[k]
        if isinstance(full, BaseException):
            out[k] = full
        elif getattr(full, "status", None) != "ok":
            out[k] = None
        else:
            out[k] = _cached_cut(gold, full, q, k[1])
    return out


def _cached_cut(gold: Any, full: Any, q: CutQuery, gold_sql: str) -> Cut | None:
    """`build_cut` once per (gold result, full result, SQL) while both objects live in the memo."""

    def build() -> Cut | None:
        n_cols = len(gold.columns) if gold.columns is not None else len(gold.rows[0])
        return build_cut(gold.rows, full.rows, n_cols, q, gold_shape(gold_sql).key_columns)

    return _CUTS.get((gold, full), gold_sql, build)
