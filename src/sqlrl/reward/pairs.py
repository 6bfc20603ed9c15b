"""What the Evaluator decides about a (prediction, gold) pair around the comparison itself: whether
the gold is scorable under the predictions' caps, whether a result may be reused for a repeat, and the
parent-side path's test-suite metric.

What is covered:
- `gold_scorable`: row cap, byte cap (`sqlrl.sql.engine.fits_caps`), the gold cache's own verdict;
- `memoizable`: results that the same (database, SQL, sandbox) reproduce;
- `test_suite_pending`: the test-suite metric of executed pairs, in the order `score_in_worker` uses.

What is not:
- executing anything: results come from the sandbox and the gold cache (`sqlrl.reward.evaluator`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from sqlrl.reward.match import Reward, test_suite_result_eq
from sqlrl.reward.reproducible import reproducible
from sqlrl.reward.scoring import VARIANT_TOO_LONG
from sqlrl.reward.shape import remove_distinct
from sqlrl.sql.engine import fits_caps
from sqlrl.sql.result import MAX_VALUE_BYTES

__all__ = [
    "TOO_LONG",
    "InfraFailure",
    "copy_reward",
    "gold_scorable",
    "memoizable",
    "takes_resolved",
    "test_suite_pending",
]


# the variant "result" of a prediction too long for its DISTINCT-free variant (`distinct_free`)
TOO_LONG = SimpleNamespace(status="too_long", message="no DISTINCT-free variant of SQL this long")


@dataclass(frozen=True)
class InfraFailure:
    """An exception from the sandbox in place of an item's result (scored as infra_error)."""

    error: str


def gold_scorable(
    gold: Any, max_rows: int | None = None, max_bytes: int | None = None, max_value: int | None = None
) -> tuple[bool, str | None]:
    """(scorable?, reason); a gold with more rows than the predictions' sandbox keeps (`max_rows`) is
    unscorable (`gold_too_many_rows`): no prediction could match it. With `max_bytes` (the sandbox's
    byte cap, given when it is below the gold cache's), a gold whose result the sandbox would not
    return whole (`sqlrl.sql.engine.fits_caps`, with its value limit `max_value` when known) is
    unscorable too (`gold_too_large`)."""
    n = getattr(gold, "row_count", None)
    if isinstance(max_rows, int) and isinstance(n, int) and n > max_rows:
        return False, "gold_too_many_rows"
    rows = getattr(gold, "rows", None)
    if isinstance(max_bytes, int) and rows and getattr(gold, "status", None) == "ok":
        cols = getattr(gold, "columns", None) or []
        value = max_value if isinstance(max_value, int) else MAX_VALUE_BYTES
        if fits_caps(cols, rows, len(rows), max_bytes, value) != "ok":
            return False, "gold_too_large"
    scorable = getattr(gold, "scorable", None)
    if scorable is None:
        status = getattr(gold, "status", None)
        scorable = status == "ok" and getattr(gold, "row_count", len(getattr(gold, "rows", []) or [])) > 0
        reason = None if scorable else f"gold_{status}"
        return bool(scorable), reason
    return bool(scorable), getattr(gold, "unscorable_reason", None)


def memoizable(res: Any) -> bool:
    """A sandbox result that the same (database, SQL, sandbox) would reproduce: never a timeout, a
    worker crash, an exception, a size/memory failure (too_large), or a runtime error that smells of
    the machine (I/O, memory, locks). `TOO_LONG` is: it depends on the SQL text alone."""
    if res is TOO_LONG:
        return True
    if isinstance(res, InfraFailure):
        return False
    return reproducible(getattr(res, "status", None), getattr(res, "message", ""))


_TAKES_RESOLVED: dict[type, bool] = {}  # gold cache type -> its get_many takes `resolved=`


def takes_resolved(gold_cache: Any) -> bool:
    t = type(gold_cache)
    hit = _TAKES_RESOLVED.get(t)
    if hit is None:
        try:
            hit = "resolved" in inspect.signature(gold_cache.get_many).parameters
        except (AttributeError, TypeError, ValueError):
            hit = False
        _TAKES_RESOLVED[t] = hit
    return hit


def copy_reward(r: Reward) -> Reward:
    parts = {k: list(v) if isinstance(v, list) else v for k, v in r.parts.items()}
    return Reward(r.value, r.status, parts, r.exec_ms)


def test_suite_pending(executed: list, gold_results: Callable[[list], list]) -> None:
    """Fill parts["test_suite_match"] (and "test_suite_reason") of the parent-side path's executed pairs
    (pair, prediction result, its DISTINCT-free variant's result or None, gold shape, parts, identical
    rows found) in place, fetching the golds' variants with `gold_results([(database, SQL)])`."""
    need: list[int] = []
    wanted: list[tuple[str, str]] = []
    for n, (p, *_) in enumerate(executed):
        g_sql = remove_distinct(p.gold_sql)
        if g_sql != p.gold_sql:
            need.append(n)
            wanted.append((p.db_path, g_sql))
    g_vars: dict[int, Any] = dict(zip(need, gold_results(wanted)))
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
        if p_res is TOO_LONG:
            parts["test_suite_match"] = 0.0
            parts["test_suite_reason"] = VARIANT_TOO_LONG
            continue
        if isinstance(p_res, InfraFailure) or getattr(p_res, "status", None) == "worker_crash":
            parts["test_suite_match"] = None
            parts["test_suite_reason"] = "pred_variant_infra"
            continue
        if p_res.status != "ok":
            parts["test_suite_match"] = 0.0
            parts["test_suite_reason"] = f"pred_variant_{p_res.status}"
            continue
        m = test_suite_result_eq(g_res.columns, g_res.rows, p_res.columns, p_res.rows, shape.order_matters)
        parts["test_suite_match"] = 1.0 if m.match else 0.0
        if m.reason == "permutation_bound":
            parts["test_suite_reason"] = "permutation_bound"


test_suite_pending.__test__ = False  # type: ignore[attr-defined]  # not a pytest test
