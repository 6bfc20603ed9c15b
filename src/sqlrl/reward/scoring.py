"""Scoring one (prediction, gold result) pair inside a sandbox worker, and the Reward parts both
scoring paths share.

`score_in_worker` is the scorer `Evaluator` names for `Sandbox.execute_scored`
("sqlrl.reward.scoring:score_in_worker"); the sandbox workers preload this module, which imports only
the standard library until SQL is parsed.

What is covered:
- exactly what the Evaluator's parent-side path computes for the pair (value, status, parts), from
  the prediction's sandbox result and the gold result shipped from the gold cache;
- the test-suite metric on the DISTINCT-free variants, in the parent-side path's order; a prediction
  with no variant (`sqlrl.reward.shape.distinct_free`: too long to tokenize) has test-suite match 0;
- whether every execution behind the verdict is reproducible (so repeats may share it).

What is not:
- the gold is never executed here: `run` only ever gets the prediction and its DISTINCT-free variant;
- timeouts and worker crashes are reported by the sandbox's watchdog, not by this code.
"""

from __future__ import annotations

from typing import Any

from sqlrl.reward.bird import bird_set_match
from sqlrl.reward.cut import Cut
from sqlrl.reward.match import MatchResult, Reward, execution_match, test_suite_result_eq
from sqlrl.reward.reproducible import reproducible
from sqlrl.reward.shape import GoldShape, distinct_free

__all__ = [
    "EXEC_ERROR_STATUSES",
    "PERMUTATION_NOTE",
    "VARIANT_TOO_LONG",
    "elapsed_ms",
    "fail_parts",
    "match_parts",
    "score_in_worker",
    "worker_reward",
]

EXEC_ERROR_STATUSES = frozenset(
    {"syntax_error", "forbidden", "multiple_statements", "runtime_error", "too_many_rows", "too_large"}
)
PERMUTATION_NOTE = "column-permutation search bound reached; declared mismatch (may be a false negative)"
# parts["test_suite_reason"] of a prediction too long for its DISTINCT-free variant (`distinct_free`):
# its test-suite match is 0 (a possible false negative of that metric; the reward does not use it)
VARIANT_TOO_LONG = "pred_variant_too_long"


def fail_parts(base: dict, want_ts: bool) -> dict[str, Any]:
    """The named parts of a prediction that did not execute (both scoring paths)."""
    fail = {**base, "executable": 0.0, "match": 0.0, "bird_match": 0.0}
    if want_ts:
        fail["test_suite_match"] = 0.0
    return fail


def match_parts(
    base: dict, m: MatchResult, shape: GoldShape, gold_rows: list, pred_rows: list
) -> dict[str, Any]:
    """The named parts of an executed prediction's Reward (one definition for the parent-side and the
    in-worker scoring paths, which must give identical Rewards); `bird_match` is BIRD's metric
    (`sqlrl.reward.bird.bird_set_match`)."""
    n_gold, n_pred = len(gold_rows), len(pred_rows)
    return {
        **base,
        "executable": 1.0,
        "match": 1.0 if m.match else 0.0,
        "bird_match": 1.0 if bird_set_match(gold_rows, pred_rows) else 0.0,
        "order_matters": shape.order_matters,
        "compare_mode": m.mode,
        "detail": m.reason,
        "permutation": list(m.permutation) if m.permutation is not None else None,
        "gold_row_count": n_gold,
        "pred_row_count": n_pred,
    }


def _memoizable_tuple(res: tuple) -> bool:
    return reproducible(res[0], res[5])


_SHAPES: dict[tuple, GoldShape] = {}  # shape tuple -> GoldShape, in the workers


def score_in_worker(run: Any, sql: str, refs: list, extra: Any, options: dict) -> tuple:
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
    DISTINCT-free variant. refs: [(gold columns, gold rows, gold shape as a tuple, the gold's cut
    as (runs, pools) or None)] plus, when the
    gold has a DISTINCT-free variant, (its gold-cache status, columns, rows). extra: None, or the
    reason the gold variant could not be fetched. Returns (value, status, parts, memoizable,
    statements run)."""
    kind = options["kind"]
    want_ts = options["ts"]
    res = run(sql)
    st = res[0]
    if st != "ok":
        msg = str(res[5] or "")[:500]
        fail = fail_parts({"kind": kind}, want_ts)
        if st == "empty_sql":
            return (0.0, "no_sql", {**fail, "sandbox_status": st}, _memoizable_tuple(res), 1)
        if st in EXEC_ERROR_STATUSES:
            out = (0.0, "exec_error", {**fail, "sandbox_status": st, "message": msg})
            return (*out, _memoizable_tuple(res), 1)
        if st == "timeout":
            return (0.0, "timeout", {**fail, "sandbox_status": st, "message": msg}, False, 1)
        return (None, "infra_error", {"kind": kind, "sandbox_status": st, "message": msg}, False, 1)
    g_cols, g_rows, shape_t, cut_t = refs[0]
    shape = _SHAPES.get(shape_t)
    if shape is None:
        if len(_SHAPES) >= 4096:
            _SHAPES.clear()
        shape = _SHAPES[shape_t] = GoldShape(*shape_t)
    p_cols, p_rows = res[1], res[2]
    m = execution_match(g_cols, g_rows, p_cols, p_rows, shape, Cut(*cut_t) if cut_t is not None else None)
    parts = match_parts({"kind": kind}, m, shape, g_rows, p_rows)
    if m.reason == "permutation_bound":
        parts["note"] = PERMUTATION_NOTE
    value = 1.0 if (m.match or kind == "validity") else 0.0
    reward = (value, "match" if m.match else "mismatch", parts)
    if not want_ts:
        return (*reward, True, 1)
    # the test-suite metric, in the order of the parent-side path: the prediction's variant first
    vres = None
    v_sql = distinct_free(sql)
    if v_sql is not None and v_sql != sql:
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
    if v_sql is None:  # no variant of a prediction this long (`distinct_free`)
        parts["test_suite_match"] = 0.0
        parts["test_suite_reason"] = VARIANT_TOO_LONG
        return (*reward, memo_ok, n)
    if g_var is None and vres is None and m.match and m.tries == 0 and len(g_rows) > 0:
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


def elapsed_ms(*results: Any) -> float | None:
    """Summed `elapsed_ms` of the sandbox results among `results` (None where none has one)."""
    ms = [float(e) for r in results if (e := getattr(r, "elapsed_ms", None)) is not None]
    return round(sum(ms), 3) if ms else None


def worker_reward(g: Any, base: dict, want_ts: bool) -> tuple[Reward, bool, int]:
    """(Reward, reproducible?, statements executed) of one answer of `score_in_worker`'s workers: its
    tuple, ("__error__", text) when the scorer raised, or the watchdog's `SQLResult`."""
    if type(g) is tuple and len(g) == 6:
        value, status, parts, memo_ok, n, ms = g
        return Reward(value, status, parts, ms), memo_ok, n
    if type(g) is tuple:  # the scorer raised (a bug, or memory)
        return Reward(None, "infra_error", {**base, "error": f"sandbox scorer: {g[-1]}"}), False, 1
    st = getattr(g, "status", None)  # timeout or worker_crash
    msg = str(getattr(g, "message", "") or "")[:500]
    if st == "timeout":
        parts = {**fail_parts(base, want_ts), "sandbox_status": st, "message": msg}
        return Reward(0.0, "timeout", parts, elapsed_ms(g)), False, 1
    return Reward(None, "infra_error", {**base, "sandbox_status": st, "message": msg}), False, 1
