"""veRL's custom reward function ``compute_score``, run in veRL's reward workers (trainer side).

veRL loads this file by path (``custom_reward_function.path``), so it uses absolute imports only.
The gold never enters the rollout batch: the row's ``reward_model.ground_truth`` is a reference (data
folder, split, task id); the ``PrivateTask`` is loaded here and the agent's ``final_sql`` is scored
with sqlrl's ``Evaluator``.

What is covered:
- An infrastructure failure is never scored as a wrong answer, and an unscorable gold is never scored:
  both return ``sqlrl_excluded = 1`` and NaN verdict metrics (``acc``, ``sqlrl_executable``).

What is not:
- The score of an excluded trajectory is 0.0 (veRL needs a finite reward); it is kept out of the
  update by ``advantage`` (mask and estimator), but veRL's own ``critic/score/*`` and validation
  ``reward`` means count it as 0.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from sqlrl.integrations.verl.common import gold_cache_dir

_EVAL_STATE: dict[str, Any] = {}
_EVAL_LOCK = threading.Lock()


def _private_task(ref: dict):
    from sqlrl.tasks.bird import open_data

    kw = {"seed": int(ref.get("split_seed", 0)), "val_fraction": float(ref.get("val_fraction", 0.1))}
    key = f"{ref['data']}|{ref['split']}|{kw['seed']}|{kw['val_fraction']}"
    with _EVAL_LOCK:
        tasks = _EVAL_STATE.get(key)
        if tasks is None:
            tasks = {t.public.task_id: t for t in open_data(ref["data"]).load(ref["split"], **kw)}
            _EVAL_STATE[key] = tasks
    return tasks[ref["task_id"]]


def _evaluator(kind: str):
    from sqlrl.agent.envs import make_env

    with _EVAL_LOCK:
        ev = _EVAL_STATE.get(f"evaluator:{kind}")
        if ev is None:
            cache_dir = gold_cache_dir()
            env = make_env(
                workers=int(os.environ.get("SQLRL_REWARD_WORKERS", "2")),
                timeout_s=float(os.environ.get("SQLRL_SQL_TIMEOUT_S", "5.0")),
                gold_dir=cache_dir,
                reward=kind,
            )
            ev = _EVAL_STATE[f"evaluator:{kind}"] = env.evaluator
        return ev


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """veRL custom reward function: sqlrl's Evaluator on the agent's final SQL.

    `ground_truth` is the JSON reference written by `task_to_row` (data folder, split, task id); the
    PrivateTask (with the gold) is loaded here, on the reward worker. `extra_info["sqlrl_final_sql"]` is
    the agent's decision (from SqlrlAgentLoop's extra_fields); without it (another agent loop) the last
    SQL block of `solution_str` is used.

    An excluded trajectory (unscorable gold, sandbox infra error during the rollout or the scoring) gets
    `sqlrl_excluded = 1` and score 0.0 only because veRL needs a finite reward: `SqlrlAgentLoopManager`
    zeroes its response mask and the `sqlrl_grpo` estimator leaves it out of its group's statistics and
    gives it advantage 0, so it does not count as a wrong answer in the update. Its verdict metrics
    (`acc`, `sqlrl_executable`) are NaN: no verdict, rather than a wrong one.
    """
    from sqlrl.agent.prompts import Parser

    extra_info = dict(extra_info or {})
    ref = json.loads(ground_truth) if isinstance(ground_truth, str) else dict(ground_truth)
    task = _private_task(ref)
    if "sqlrl_final_sql" in extra_info:
        final_sql = extra_info["sqlrl_final_sql"]
    else:
        final_sql = Parser.extract_sql(solution_str or "")
    kind = os.environ.get("SQLRL_REWARD_KIND") or ref.get("kind") or "execution"
    if extra_info.get("sqlrl_infra_error"):
        value, status = None, "infra_error"
    else:
        rw = _evaluator(kind).score(final_sql, task)
        value, status = rw.value, rw.status
    if value is None:
        nan = float("nan")
        return {"score": 0.0, "acc": nan, "sqlrl_excluded": 1.0, "sqlrl_executable": nan}
    return {
        "score": float(value),
        "acc": 1.0 if status == "match" else 0.0,
        "sqlrl_excluded": 0.0,
        "sqlrl_executable": 1.0 if status in ("match", "mismatch") else 0.0,
    }
