"""Evaluation of SQL-debugging tasks: roll out (`sqlrl.agent.debugging.DebugEnv`), score, summarize.

What is covered:
- `evaluate_debug` runs the tasks in waves (in order) that fit the replica pool; each wave is scored,
  releasing its replicas, before the next starts; a wave's sampling seeds are offset by the number of
  trajectories before it.
- Every trajectory appears in `results` once; those with reward None (infrastructure errors) are
  counted as `excluded`, never as wrong answers.
- `write_debug_eval_run` writes trajectories.jsonl, results.jsonl, summary.json (and run.json with a
  provenance); `category_table` / `category_table_md` give accuracy per task category.

What is not: the same numbers across machines in bf16 (see `sqlrl.agent.loop`).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

from sqlrl.agent.debugging import DebugTrajectory
from sqlrl.agent.envs import make_env
from sqlrl.agent.loop import Budgets, Sampling
from sqlrl.artifacts import write_json_atomic, write_jsonl
from sqlrl.tasks.debugging import CATEGORIES, DebugTaskPrivate


def _results(trajs: Sequence[DebugTrajectory]) -> list[dict]:
    out = []
    for tr in trajs:
        rw = tr.reward or {}
        value = rw.get("value")
        parts = rw.get("parts") or {}
        out.append(
            {
                "task_id": tr.task_id,
                "sample": tr.sample,
                "db_id": tr.db_id,
                "category": tr.extra.get("category"),
                "final_sql": tr.final_sql,
                "submission": list(tr.extra.get("submission") or []),
                "status": rw.get("status"),
                "reward": value,
                "solved": None if value is None else rw.get("status") == "solved",
                "passed": parts.get("passed"),
                "total": parts.get("total"),
                "turns": len(tr.turns),
                "n_executions": tr.n_executions,
                "stop_reason": tr.stop_reason,
            }
        )
    return out


def summarize_debug(results: Sequence[dict], trajectories: Sequence[DebugTrajectory] = ()) -> dict:
    """n (scored), mean_reward, solved_rate, status_counts, per_category {n, solved, mean_reward}, ..."""
    scored = [r for r in results if r["reward"] is not None]
    n = len(scored)
    per_cat: dict[str, dict] = defaultdict(lambda: {"n": 0, "solved": 0, "reward_sum": 0.0})
    for r in scored:
        d = per_cat[r["category"]]
        d["n"] += 1
        d["solved"] += int(bool(r["solved"]))
        d["reward_sum"] += r["reward"]
    per_category = {
        c: {"n": d["n"], "solved": d["solved"], "mean_reward": d["reward_sum"] / d["n"] if d["n"] else None}
        for c, d in sorted(per_cat.items())
    }
    return {
        "kind": "debug",
        "n": n,
        "n_trajectories": len(results),
        "excluded": sum(r["reward"] is None for r in results),
        "mean_reward": sum(r["reward"] for r in scored) / n if n else None,
        "solved_rate": sum(bool(r["solved"]) for r in scored) / n if n else None,
        "status_counts": dict(Counter(r["status"] for r in results)),
        "per_category": per_category,
        "stop_reasons": dict(Counter(r["stop_reason"] for r in results)),
        "mean_turns": sum(r["turns"] for r in results) / len(results) if results else None,
        "generated_tokens": sum(tr.generated_tokens for tr in trajectories),
        "generation_s": round(sum(tr.timings.get("gen_s", 0.0) for tr in trajectories), 3),
    }


def evaluate_debug(
    tasks_private: Sequence[DebugTaskPrivate],
    policy,
    budgets: Budgets,
    *,
    pool_root: str | Path,
    sampling: Sampling = Sampling(temperature=0.0, seed=0),
    n_samples: int = 1,
    replicas_per_db: int = 4,
    workers: int = 2,
    pool=None,
    timeout_s: float = 10.0,
) -> tuple[list[DebugTrajectory], list[dict], dict]:
    """Roll out and score debugging tasks. Returns (trajectories, results, summary).

    A `ReplicaPool` over the tasks' databases is created under `pool_root` (and closed at the end)
    unless `pool` is given. Tasks run in waves (in order) that fit the pool's replicas; each wave is
    scored, releasing its replicas, before the next starts."""
    tasks = list(tasks_private)
    for t in tasks:
        if not isinstance(t, DebugTaskPrivate):
            raise TypeError("evaluate_debug takes DebugTaskPrivate tasks (it scores them)")
    t_start = time.perf_counter()
    if pool is None:
        env = make_env(
            kind="debug",
            templates={t.public.db_id: t.public.db_path for t in tasks},
            pool_root=pool_root,
            replicas_per_db=max(replicas_per_db, n_samples),
            workers=workers,
            timeout_s=budgets.sql_timeout_s,
        )
    else:
        env = make_env(kind="debug", pool=pool)
    with env:
        waves: list[list[DebugTaskPrivate]] = []
        used: Counter = Counter()
        for t in tasks:
            db = t.public.db_id
            if waves and used[db] + n_samples <= env.capacity(db):
                waves[-1].append(t)
            else:
                waves.append([t])
                used = Counter()
            used[db] += n_samples
        by_id = {t.task_id: t for t in tasks}
        trajs: list[DebugTrajectory] = []
        done = 0
        for wave in waves:
            w = env.rollout(
                [t.public for t in wave],
                policy,
                budgets,
                sampling,
                n_samples=n_samples,
                seed_offset=done * n_samples,
            )
            env.score(w, by_id, timeout_s=timeout_s)
            trajs.extend(w)
            done += len(wave)
    results = _results(trajs)
    summary = summarize_debug(results, trajs)
    summary["n_tasks"] = len(tasks)
    summary["n_samples"] = n_samples
    summary["budgets"] = budgets.to_dict()
    summary["elapsed_s"] = round(time.perf_counter() - t_start, 3)
    return trajs, results, summary


def write_debug_eval_run(
    out_dir: str | Path,
    trajectories: Sequence[DebugTrajectory],
    results: Sequence[dict],
    summary: dict,
    provenance: dict | None = None,
) -> None:
    """Write trajectories.jsonl, results.jsonl, summary.json (and run.json with a provenance)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "trajectories.jsonl", (tr.to_dict() for tr in trajectories))
    write_jsonl(out / "results.jsonl", list(results))
    summ = dict(summary)
    if provenance:
        for k in ("model", "fingerprint", "split", "machine"):
            if k in provenance:
                summ[k] = provenance[k]
        write_json_atomic(out / "run.json", provenance)
    write_json_atomic(out / "summary.json", summ)


def category_table(results: Sequence[dict]) -> dict:
    """Evaluation by category: for each of query / management / personalization and `all`:
    n_trajectories, n (scored), excluded (reward None, e.g. infra_error), solved, accuracy (= solved / n,
    the solved rate) and mean_pass_fraction (mean fraction of hidden tests passed over scored ones)."""
    out: dict[str, dict] = {}
    for cat in (*CATEGORIES, "all"):
        rows = [r for r in results if cat == "all" or r.get("category") == cat]
        scored = [r for r in rows if r.get("reward") is not None]
        n = len(scored)
        solved = sum(bool(r.get("solved")) for r in scored)
        out[cat] = {
            "n_trajectories": len(rows),
            "n": n,
            "excluded": len(rows) - n,
            "solved": solved,
            "accuracy": solved / n if n else None,
            "mean_pass_fraction": sum(r["reward"] for r in scored) / n if n else None,
        }
    return out


def category_table_md(rows: Sequence[tuple[str, dict]]) -> str:
    """A markdown table: one row per (label, category_table(...)); cells 'solved/n (acc %), pass frac'."""
    cols = (*CATEGORIES, "all")
    lines = [
        "| model | " + " | ".join(cols) + " | excluded |",
        "| --- | " + " | ".join("---" for _ in cols) + " | --- |",
    ]
    for label, tab in rows:
        cells = []
        for c in cols:
            d = tab[c]
            if not d["n"]:
                cells.append("-")
                continue
            cells.append(
                f"{d['solved']}/{d['n']} ({100 * d['accuracy']:.1f}%), pass {d['mean_pass_fraction']:.3f}"
            )
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {tab['all']['excluded']} |")
    return "\n".join(lines) + "\n"
