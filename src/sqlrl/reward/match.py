"""Whether a predicted SQL result equals the gold result, and the `Reward`/`MatchResult` types.

`execution_match` is our metric; `test_suite_result_eq` is Zhong et al. 2020's `result_eq`. Both are
pure functions of two results (columns, rows) and the gold's shape (`sqlrl.reward.shape.gold_shape`):
standard library only, nothing is executed or parsed here, so sandbox workers import this cheaply.

What is covered:
- the comparison rules, stated exactly in `execution_match`'s docstring: column count, cell equality
  (exact for integral values, a tolerance for non-integral floats), rows as a multiset, a top-level
  ORDER BY with tie runs, a LIMIT/OFFSET cut decided from the gold's full (ordered) result
  (`sqlrl.reward.cut`; without ORDER BY any rows of it), column permutation within a bounded search,
  DISTINCT not stripped;
- determinism, symmetry up to the float/tie rules, no exception on sqlite3 values, bounded time;
- the test-suite equality (`test_suite_result_eq`): exact values, strict order, empty equals empty.

What is not:
- without a cut, ties at a LIMIT/OFFSET cut are not relaxed, and without key columns in the output
  neither are ties inside the result (conservative mismatches; `sqlrl.reward.cut` says when);
- a float-tolerance group over 64 rows may be a false negative, and so may a result past the
  permutation search bound (reason "permutation_bound"); neither is ever a false positive;
- execution match cannot tell a right query from a wrong one with the same result: a gold of one
  all-NULL or all-zero row (`count(*)` = 0) is matched by any query returning it (golds with no rows
  are excluded; the literature's answer, test-suite accuracy, needs databases this data lacks);
- reward statuses and the scoring of (SQL, task) pairs: `sqlrl.reward.evaluator`.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any

from sqlrl.reward.cells import ABS_TOL, REL_TOL, CellCmp, counts, is_num, project
from sqlrl.reward.shape import GoldShape

if TYPE_CHECKING:
    from sqlrl.reward.cut import Cut

__all__ = [
    "ABS_TOL",
    "REL_TOL",
    "STATUSES",
    "MatchResult",
    "Reward",
    "execution_match",
    "test_suite_result_eq",
    "validity_reward",
]

MAX_TRIES = 5040
MAX_WORK = 500_000
_FAST_PATH = True  # execution_match's identical-rows shortcut and fast reject (off: the search alone)

STATUSES = ("no_sql", "exec_error", "timeout", "mismatch", "match", "gold_unscorable", "infra_error")


@dataclass(frozen=True)
class Reward:
    value: float | None  # None when excluded (gold_unscorable, infra_error)
    status: str  # one of STATUSES
    parts: dict = field(default_factory=dict)
    # sandbox milliseconds on this pair's SQL (prediction and DISTINCT-free variant) in this call, None
    # when nothing ran; a diagnostic, not part of the verdict, equality or `to_dict` (a repeat answered
    # from an identical pair of the same call carries that pair's time)
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
    mode: str = "multiset"  # multiset | runs | sequence | subset
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
    cut: Cut | None = None,
    *,
    float_tol: bool = True,
    tie_relax: bool = True,
    empty_equal_any_columns: bool = False,
    max_tries: int = MAX_TRIES,
    max_work: int = MAX_WORK,
) -> MatchResult:
    """Compare a predicted result with the gold result.

    `gold_columns`/`pred_columns` may be None (then the column count is taken from the rows).
    `shape` comes from `gold_shape(gold_sql)`; None means "order does not matter". The rules:

    1. Column count. A different number of columns is a mismatch, even when both results are empty
       (`reason="column_count"`). Column *names* are ignored.
    2. Values. Two cells are equal when Python `==` says so (NULL equals NULL, 3 equals 3.0, 0 equals
       -0.0), or when one is a NON-INTEGRAL float, both are numbers (int/float, not str/bytes) and
       `math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-9)`: integers and integral floats compare exactly
       (1000001 != 1000000.0, 1e16 != 1e16 + 2). The tolerance absorbs float rounding noise (0.1 +
       0.2 == 0.3, a sum in another order), not a rounded answer: 1077459.33 != 1077460 or 1077459.3,
       37.776619 != 37.776617, 114827242.3846 != 114827242.4 (values above 5e10 rounded to one
       decimal, or near zero to nine, fall within it). Numbers never equal str/bytes ('1' != 1).
    3. Rows are a multiset: duplicates count, row order is ignored ...
    4. ... unless the gold has a top-level ORDER BY (see `sqlrl.reward.shape`). Then:
       a. If every ORDER BY key resolves to an output column of the gold, the gold rows are cut into
          *runs* of consecutive rows with equal key (Python `==`, as SQLite ties them: no float
          tolerance, so keys 37.7766 and 37.776617 are two runs). The prediction must have the
          same number of rows and, for every run, its rows at those positions must equal the gold run
          as a multiset (rows tied on the key may come in any order).
       b. LIMIT/OFFSET: with a `cut` (`sqlrl.reward.cut`, built from the gold's full ordered result,
          the same query without LIMIT/OFFSET) the runs are the cut's, whether or not the keys are
          output columns. Every run strictly inside the window is compared as in (a): every row
          above the cut must be present. Only at the first run (with an OFFSET) and the last run,
          and only where the full result holds more rows with that run's key than the window, may
          other rows stand in: each predicted row there must be its own row of the full result
          carrying that key. A row that is not in the full result, or carries another key, never
          matches. Without a cut, no tie at the cut is relaxed (runs as in (a), or (c)).
       c. Keys not in the output (e.g. `ORDER BY count(*)`, or a projected `*`) and no LIMIT/OFFSET:
          with a cut (the gold run with its keys appended) the runs are the cut's, as in (a): rows
          tied on an unseen key may come in any order. Without one the prediction must equal the
          gold as a sequence (ties NOT relaxed: a conservative mismatch).
       d. LIMIT n (and an OFFSET) without any ORDER BY: which rows the gold returned is the engine's
          choice, so with a cut (`sqlrl.reward.cut`: the gold's whole result without LIMIT/OFFSET,
          run once and cached with the gold) the prediction matches when it has as many rows as the
          gold and its rows, as a multiset, are rows of that whole result: each predicted row its own
          row (`compare_mode` "subset"). Without a cut (an ORDER BY below the LIMIT, in a derived
          table, CTE or window, picks the rows; the whole result failed or is over the caps, or holds
          no other row) the rows returned are compared as a multiset.
    5. Column permutation. The prediction may list the gold's columns in another order. Gold column
       j is *compatible* with predicted column i when their values, restricted to every compared
       segment (the whole result, each run, or each position), are equal as multisets. Among
       compatible assignments the search goes depth-first (most constrained gold column first,
       identity first, identical predicted columns tried once, partial assignments pruned by
       comparing the projected rows) and accepts the first permutation under which rules 3/4 hold.
       At most `max_tries` (5040) checks and `max_work` (500,000) row visits (the row comparisons of
       an exact matching, rule 7, included); past either bound the answer is mismatch with
       `reason="permutation_bound"` (a possible false negative).
    6. DISTINCT is NOT stripped: `SELECT DISTINCT a` and `SELECT a` match only if their results do.
    7. Float tolerance for multisets: rows are grouped by their non-numeric cells, sorted by their
       numeric cells and compared pairwise; if that fails and a group has <= 64 rows, an exact
       bipartite matching is tried. A larger group whose near-equal floats sort differently may be a
       false negative (never a false positive).
    Guaranteed: symmetric up to the float/ties rules, deterministic, never raises on sqlite3 values
    (int/float/str/bytes/None), bounded time (30 columns x 2000 rows of mostly NULLs in well under 2 s).
    """
    shape = shape or GoldShape()
    cmp = CellCmp(float_tol)
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
    cut = cut if tie_relax and (shape.order_matters or shape.has_limit or shape.has_offset) else None
    if cut is not None and sum(cut.runs) != n:
        raise ValueError(f"execution_match: the cut covers {sum(cut.runs)} rows, the gold has {n}")
    runs_ok = cut is not None or (
        tie_relax and shape.key_columns is not None and all(c < k for c in shape.key_columns)
    )
    mode = ("runs" if runs_ok else "sequence") if shape.order_matters else ("subset" if cut else "multiset")
    if cut is not None and cut.pools:
        types.update(map(type, chain.from_iterable(chain.from_iterable(rows for _, rows in cut.pools))))
        has_float = float_tol and float in types
    steps = (k * k if float_tol else 0) + k + 1
    if _FAST_PATH and steps <= max_tries and n * steps <= max_work and _identical(g, p, mode, has_float):
        return MatchResult(True, "match", tuple(range(k)), mode, 0)
    segs, pooled = _segments(g, mode, shape, cut)
    if (
        _FAST_PATH
        and k <= _REJECT_MAX_COLS
        and types <= (_EXACT_TYPES if float_tol else _EXACT_TYPES_F)
        and _MAX_CHARGES[k] <= max_tries
        and n * _MAX_CHARGES[k] <= max_work
        and _cells_differ(g, p, segs, pooled)
    ):
        return MatchResult(False, _diff_reason(mode), None, mode, 0)
    meter = _Meter(max_tries, max_work)
    try:
        search = _Search(g, p, mode, segs, pooled, cmp, has_float, meter)
        perm = search.run()
    except _Budget:
        return MatchResult(False, "permutation_bound", None, mode, meter.tries)
    if perm is None:
        return MatchResult(False, _diff_reason(mode), None, mode, meter.tries)
    return MatchResult(True, "match", perm, mode, meter.tries)


def _identical(g: list[tuple], p: list[tuple], mode: str, has_float: bool) -> bool:
    """Fast path, the search's answer only cheaper: identical rows (a sequence when order matters)
    match under the identity permutation, the search's first leaf. The caller takes it only when the
    search could not run out of budget on the way there (k*k column checks, k partial checks and one
    full one, of n rows each); in "runs" mode only without floats."""
    if mode == "multiset":
        return g == p or counts(g) == counts(p)
    return (mode == "sequence" or not has_float) and g == p


def _segments(
    g: list[tuple], mode: str, shape: GoldShape, cut: Cut | None
) -> tuple[list[list[int]], list[tuple[list[int], list[tuple]]]]:
    """(exact multiset segments as position lists, pooled segments: (positions, the rows that may
    stand there)); rule 4."""
    n = len(g)
    if mode == "multiset":
        return [list(range(n))], []
    if mode == "sequence":
        return [[i] for i in range(n)], []
    if cut is not None:
        pools = dict(cut.pools)
        segs: list[list[int]] = []
        pooled: list[tuple[list[int], list[tuple]]] = []
        start = 0
        for i, length in enumerate(cut.runs):
            positions = list(range(start, start + length))
            if i in pools:
                pooled.append((positions, list(pools[i])))
            else:
                segs.append(positions)
            start += length
        return segs, pooled
    keys = project(g, shape.key_columns)  # type: ignore[arg-type]
    runs: list[list[int]] = [[0]]
    for i in range(1, n):
        if keys[i] == keys[i - 1]:  # SQLite's tie: exact (rule 4a), never the float tolerance
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs, []


def _cells_differ(g: list[tuple], p: list[tuple], segs: list[list[int]], pooled: list) -> bool:
    """Fast reject, the search's answer only cheaper: True when no column permutation can match.
    With int/str/bytes/None cells (floats too without float_tol) equality is `==`, so any match needs
    the exact segments' cells equal as multisets and each pooled predicted row's cells equal, as a
    multiset, to some pool row's. The caller checks the types (pools included), and that the search
    (sum over d = 1..k of k!/(k-d)! checks of n rows) could not have run out of budget first (its
    answer would then be "permutation_bound")."""
    if pooled:
        gc_ = chain.from_iterable(g[x] for s in segs for x in s)
        pc_ = chain.from_iterable(p[x] for s in segs for x in s)
    else:
        gc_, pc_ = chain.from_iterable(g), chain.from_iterable(p)
    if counts(gc_) != counts(pc_):
        return True
    for positions, pool in pooled:
        shapes = {frozenset(counts(r).items()) for r in pool}
        if any(frozenset(counts(p[x]).items()) not in shapes for x in positions):
            return True
    return False


class _Meter:
    """The permutation search's budget: checks (`tries`) and row visits (`work`)."""

    def __init__(self, max_tries: int, max_work: int):
        self.tries = 0
        self.work = 0
        self.max_tries = max_tries
        self.max_work = max_work

    def charge(self, rows: int) -> None:
        self.tries += 1
        self.work += rows
        if self.tries > self.max_tries or self.work > self.max_work:
            raise _Budget


class _Search:
    """The column-permutation search of rule 5: compatible columns, then a depth-first search."""

    def __init__(
        self,
        g: list[tuple],
        p: list[tuple],
        mode: str,
        segs: list[list[int]],
        pooled: list[tuple[list[int], list[tuple]]],
        cmp: CellCmp,
        has_float: bool,
        meter: _Meter,
    ):
        self.g, self.p, self.mode, self.segs = g, p, mode, segs
        self.pooled, self.cmp, self.has_float = pooled, cmp, has_float
        self.charge = meter.charge
        self.n = len(g)
        self.k = len(g[0])
        self.assign: dict[int, int] = {}
        self.used: set[int] = set()
        self.pool_counts = [counts(pool) for _, pool in pooled]  # once, not once per full check

    def _signature(self, values: list[Any]) -> Any:
        if self.mode == "sequence":
            return tuple(values)
        return tuple(frozenset(Counter(values[i] for i in s).items()) for s in self.segs)

    @staticmethod
    def _coarse(values: list[Any]) -> tuple:
        nums = [float(v) for v in values if is_num(v)]
        other = frozenset(Counter(v for v in values if not is_num(v)).items())
        return other, len(nums), (min(nums), max(nums)) if nums else None

    def _candidates(self, gcols: list[list[Any]], pcols: list[list[Any]]) -> list[list[int]] | None:
        """For each gold column, the compatible predicted columns (identity first); None when one has none."""
        k, has_float, cmp, segs = self.k, self.has_float, self.cmp, self.segs
        gsig = [self._signature(c) for c in gcols]
        psig = [self._signature(c) for c in pcols]
        gfloat = [has_float and float in set(map(type, c)) for c in gcols]
        pfloat = [has_float and float in set(map(type, c)) for c in pcols]
        gco = [self._coarse(c) if has_float else None for c in gcols]
        pco = [self._coarse(c) if has_float else None for c in pcols]

        def quick_reject(j: int, i: int) -> bool:
            (go, gn, gmm), (po, pn, pmm) = gco[j], pco[i]  # type: ignore[misc]
            if go != po or gn != pn:
                return True
            return gmm is not None and not (cmp.cell(gmm[0], pmm[0]) and cmp.cell(gmm[1], pmm[1]))

        def tol_compatible(j: int, i: int) -> bool:
            if quick_reject(j, i):
                return False
            self.charge(self.n)
            if self.mode == "sequence":
                return all(cmp.cell(a, b) for a, b in zip(gcols[j], pcols[i]))
            return all(
                cmp.multiset([(gcols[j][x],) for x in s], [(pcols[i][x],) for x in s], True, self.charge)
                for s in segs
            )

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
                return None
            if j in cands:  # identity first
                cands.remove(j)
                cands.insert(0, j)
            compat.append(cands)
        return compat

    def _partial_ok(self) -> bool:
        g, p, n, assign = self.g, self.p, self.n, self.assign
        gc = sorted(assign)
        pc = [assign[j] for j in gc]
        gp, pp = project(g, gc), project(p, pc)
        self.charge(n)
        for s in self.segs:
            a = gp if len(s) == n else [gp[x] for x in s]
            b = pp if len(s) == n else [pp[x] for x in s]
            if not self.cmp.multiset(a, b, self.has_float, self.charge):
                return False
        return True

    def _full_ok(self) -> bool:
        g, n, cmp = self.g, self.n, self.cmp
        perm = tuple(self.assign[j] for j in range(self.k))
        pp = project(self.p, perm)
        self.charge(n)
        if self.mode == "sequence":
            return all(cmp.row(a, b) for a, b in zip(g, pp))
        for s in self.segs:
            a = g if len(s) == n else [g[x] for x in s]
            b = pp if len(s) == n else [pp[x] for x in s]
            if not cmp.multiset(a, b, self.has_float, self.charge):
                return False
        for (positions, pool), have in zip(self.pooled, self.pool_counts):
            if not cmp.submultiset([pp[x] for x in positions], pool, self.has_float, have, self.charge):
                return False
        return True

    def _search(self, depth: int) -> bool:
        if depth == self.k:
            return self._full_ok()
        j = self.gorder[depth]
        assign, used, pcls = self.assign, self.used, self.pcls
        tried_cls: set[int] = set()
        for i in self.compat[j]:
            if i in used or pcls[i] in tried_cls:
                continue
            tried_cls.add(pcls[i])
            assign[j] = i
            used.add(i)
            ok = (
                not self.prune or depth + 1 < 2 or depth + 1 == self.k or self._partial_ok()
            ) and self._search(depth + 1)
            used.discard(i)
            if ok:
                return True
            del assign[j]
        return False

    def run(self) -> tuple[int, ...] | None:
        """The first matching permutation (pred column per gold column), or None; _Budget past the bound."""
        k = self.k
        gcols = [[r[j] for r in self.g] for j in range(k)]
        pcols = [[r[i] for r in self.p] for i in range(k)]
        compat = self._candidates(gcols, pcols)
        if compat is None:
            return None
        self.compat = compat
        # identical predicted columns are interchangeable: try one per class at each node
        pclass: dict[tuple, int] = {}
        self.pcls = [pclass.setdefault(tuple(c), i) for i, c in enumerate(pcols)]
        self.gorder = sorted(range(k), key=lambda j: (len(compat[j]), j))
        self.prune = self.mode != "sequence"
        if self._search(0):
            return tuple(self.assign[j] for j in range(k))
        return None


def _diff_reason(mode: str) -> str:
    return "order_differs_or_rows_differ" if mode not in ("multiset", "subset") else "rows_differ"


def test_suite_result_eq(
    gold_columns: list[str] | None,
    gold_rows: list,
    pred_columns: list[str] | None,
    pred_rows: list,
    order_matters: bool,
) -> MatchResult:
    """Zhong et al. 2020's `result_eq` (the test-suite metric, `parts["test_suite_match"]`).

    Two empty results are equal whatever their columns; otherwise the rules of `execution_match` but
    with exact value equality (no float tolerance), strict sequence comparison when order matters (no
    tie relaxation), and column permutation allowed. The caller decides `order_matters` by the gold's
    top-level ORDER BY (their code uses the substring 'order by' anywhere in the gold). The metric
    compares the DISTINCT-free variants (`remove_distinct`) of gold and prediction, executed on the
    single task database, NOT their test suites of distilled databases (so it is weaker than their
    published metric).
    """
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
