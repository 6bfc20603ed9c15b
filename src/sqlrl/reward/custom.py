"""A user's reward function as the trainer's evaluator: `sqlrl.train(config, out, reward=fn)`.

`fn(pred: SQLResult, gold: GoldResult, task: PrivateTask) -> float`: `pred` is the sandbox's result of
the trajectory's final SQL (`sqlrl.sql.sandbox.SQLResult`: status, columns, rows, message), `gold` the
cached gold result (`sqlrl.tasks.goldcache.GoldResult`, always scorable here), `task` the private task.

What is covered (the built-in reward's exclusion semantics):
- an unscorable gold (error, timeout, no rows) -> status `gold_unscorable`, value None: excluded and
  counted, `fn` is not called;
- infrastructure failures (a crashed sandbox worker, an unknown sandbox status, an exception from the
  sandbox or the gold cache) -> `infra_error`, value None: excluded and counted, `fn` is not called;
- every other prediction reaches `fn`, also no SQL (`empty_sql`), SQL errors and the statement time
  limit (`timeout`): those are the model's answers, not infrastructure;
- an exception raised by `fn` propagates, and so does a value that is not a finite number (TypeError /
  ValueError): never turned into a reward;
- the status is the built-in one (`no_sql`, `exec_error`, `timeout`, `match` / `mismatch` by execution
  match), so executable rates and `sql.jsonl` statuses mean what they mean for the built-in reward;
  `parts["custom"]` holds `fn`'s value.

What is not:
- evaluation (`sqlrl eval`, `sqlrl.evaluate`) scores with the built-in execution match, not `fn`;
- the function is not part of the run's config: resuming a run with another function is not detected;
- `accuracy` in steps.jsonl is the mean of `fn`'s values (the environment reads rewards as accuracy);
- Text-to-SQL tasks only (debugging tasks are scored by their hidden tests); no de-duplication.
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from collections.abc import Callable
from typing import Any

from sqlrl.reward.cut import fetch_cuts
from sqlrl.reward.match import Reward, execution_match
from sqlrl.reward.shape import gold_shape
from sqlrl.sql.sandbox import SQLResult, execute_each

__all__ = ["CustomReward", "RewardFn"]

RewardFn = Callable[[SQLResult, Any, Any], float]

# sandbox statuses that are the prediction's doing; any other status is infrastructure
_ANSWERS = frozenset(
    {"ok", "empty_sql", "timeout", "syntax_error", "forbidden", "multiple_statements", "runtime_error"}
    | {"too_many_rows", "too_large"}
)

_NO_SQL = SQLResult("empty_sql", message="no SQL statement")  # what the sandbox answers for empty SQL


class CustomReward:
    """Scores (final_sql, PrivateTask) pairs with `fn`; the interface of `sqlrl.reward.evaluator.Evaluator`
    that the trainer uses (`score`, `score_many`). `excluded` counts the excluded pairs by status."""

    def __init__(self, sandbox: Any, gold_cache: Any, fn: RewardFn):
        if not callable(fn):
            raise TypeError(f"reward: expected a function (pred, gold, task) -> float, got {fn!r}")
        self.sandbox = sandbox
        self.gold_cache = gold_cache
        self.fn = fn
        self.calls = 0
        self.excluded: Counter = Counter()

    def score(self, final_sql: str | None, task: Any) -> Reward:
        return self.score_many([(final_sql, task)])[0]

    def score_many(self, items: list[tuple[str | None, Any]]) -> list[Reward]:
        """Rewards in the order of `items`; `fn` is called in that order too."""
        out: list[Reward | None] = [None] * len(items)
        keys = [_check_task(task) for _, task in items]  # TypeError before any work
        uniq = list(dict.fromkeys(keys))
        gold_of = dict(zip(uniq, self._gold_results(uniq)))
        scorable = {k: g for k, g in gold_of.items() if not isinstance(g, BaseException) and g.scorable}
        cut_of = fetch_cuts(scorable, self._gold_results)
        todo: list[tuple[int, Any, Any, Any]] = []  # (position, task, gold, cut) of the pairs `fn` scores
        run: list[int] = []  # positions whose SQL the sandbox executes
        for i, ((sql, task), key) in enumerate(zip(items, keys)):
            gold, cut = gold_of[key], cut_of.get(key)
            if isinstance(gold, BaseException):  # infrastructure: never a wrong answer
                out[i] = self._exclude("infra_error", {"error": f"gold_cache: {type(gold).__name__}: {gold}"})
            elif not gold.scorable:
                out[i] = self._exclude("gold_unscorable", {"reason": gold.unscorable_reason})
            elif isinstance(cut, BaseException):
                err = f"gold_cache (full ordered result): {type(cut).__name__}: {cut}"
                out[i] = self._exclude("infra_error", {"error": err})
            else:
                todo.append((i, task, gold, cut))
                if sql is not None and sql.strip().strip(";").strip():
                    run.append(i)
        preds: dict[int, Any] = dict(
            zip(run, self._execute([(items[i][1].public.db_path, items[i][0]) for i in run]))
        )
        for i, task, gold, cut in todo:
            pred = preds.get(i, _NO_SQL)
            if isinstance(pred, str):
                out[i] = self._exclude("infra_error", {"error": pred})
            elif pred.status not in _ANSWERS:
                out[i] = self._exclude(
                    "infra_error", {"sandbox_status": pred.status, "message": pred.message[:500]}
                )
            else:
                out[i] = self._reward(pred, gold, cut, task)
        return out  # type: ignore[return-value]

    def _execute(self, items: list[tuple[str, str]]) -> list[Any]:
        """Sandbox results in order; an exception becomes its item's error text (infrastructure)."""
        return execute_each(self.sandbox, items, lambda e: f"sandbox: {type(e).__name__}: {e}")

    def _exclude(self, status: str, parts: dict) -> Reward:
        self.excluded[status] += 1
        return Reward(None, status, {"kind": "custom", **parts})

    def _gold_results(self, items: list[tuple[str, str]]) -> list[Any]:
        """The gold cache's result for each (database, SQL), or the exception its look-up raised."""
        out: list[Any] = []
        for db_path, sql in items:
            try:
                out.append(self.gold_cache.get(db_path, sql))
            except Exception as e:  # infrastructure: that item's pairs are excluded, never scored
                out.append(e)
        return out

    def _reward(self, pred: SQLResult, gold: Any, cut: Any, task: Any) -> Reward:
        self.calls += 1
        value = self.fn(pred, gold, task)  # the user's exception propagates
        if not isinstance(value, numbers.Real):
            raise TypeError(f"reward function returned {type(value).__name__} {value!r}; expected a float")
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"reward function returned {value}; expected a finite float")
        parts: dict[str, Any] = {"kind": "custom", "custom": value, "sandbox_status": pred.status}
        if pred.status == "ok":
            shape = gold_shape(task.gold_sql)
            m = execution_match(gold.columns, gold.rows, pred.columns, pred.rows, shape, cut)
            status = "match" if m.match else "mismatch"
            parts["execution_match"] = 1.0 if m.match else 0.0
        else:
            status = {"empty_sql": "no_sql", "timeout": "timeout"}.get(pred.status, "exec_error")
            parts["execution_match"] = 0.0
            if pred.message:
                parts["message"] = pred.message[:500]
        return Reward(value, status, parts, None if pred is _NO_SQL else pred.elapsed_ms)


def _check_task(task: Any) -> tuple[str, str]:
    gold_sql = getattr(task, "gold_sql", None)
    db_path = getattr(getattr(task, "public", None), "db_path", None)
    if not isinstance(gold_sql, str) or not isinstance(db_path, str):
        raise TypeError(
            f"reward: expected a PrivateTask (with .public.db_path and .gold_sql), got {type(task).__name__}"
        )
    return db_path, gold_sql
