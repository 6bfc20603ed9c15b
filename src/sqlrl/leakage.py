"""Gold-mutation leakage audit (`sqlrl audit leakage`).

The same tasks run twice through the full evaluation path, greedily: once with the real golds and
once with every gold replaced by a *different valid* query (the gold of another task on the same
database, else a fixed schema query). If nothing the policy sees depends on the gold, then the policy
inputs (prompt token ids), the generated token ids and SQL, the number of turns and the stopping
decision are identical between the two runs; only scores may differ. The first differing task and
field are named. A static check also verifies that no prompt or observation contains a gold query
string (real or mutated; golds shorter than 20 characters are skipped to avoid trivial matches).

Guaranteed: a pass means that for these tasks, budgets and this model, the rollout was independent
of the gold content. Not guaranteed: independence for other inputs, or under non-deterministic
kernels (a greedy run that is not reproducible on the machine shows up as a failure, never a pass).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sqlrl.artifacts import machine_info, write_json_atomic

FIELDS = ("prompt_ids", "token_ids", "final_sql", "stop_reason", "n_turns", "actions")


def mutate_golds(tasks: list) -> list:
    """Each gold replaced by a different valid query: another task's gold on the same db, else a schema query."""
    from sqlrl.data import PrivateTask

    by_db: dict[str, list[str]] = {}
    for t in tasks:
        by_db.setdefault(t.public.db_id, []).append(t.gold_sql)
    out = []
    for t in tasks:
        others = [g for g in by_db[t.public.db_id] if g.strip() != t.gold_sql.strip()]
        new = (
            others[len(out) % len(others)]
            if others
            else "SELECT name FROM sqlite_master WHERE type = 'table'"
        )
        if new.strip() == t.gold_sql.strip():
            new = "SELECT count(*) FROM sqlite_master"
        out.append(PrivateTask(public=t.public, gold_sql=new))
    return out


def _view(tr) -> dict:
    return {
        "prompt_ids": tr.prompt_ids,
        "token_ids": tr.token_ids,
        "final_sql": tr.final_sql,
        "stop_reason": tr.stop_reason,
        "n_turns": len(tr.turns),
        "actions": [t.action for t in tr.turns],
    }


def compare_runs(a: list, b: list) -> dict | None:
    """The first difference between two trajectory lists (same order), or None."""
    if len(a) != len(b):
        return {"task_id": None, "field": "count", "a": len(a), "b": len(b)}
    for ta, tb in zip(a, b):
        if ta.task_id != tb.task_id:
            return {"task_id": ta.task_id, "field": "task_id", "a": ta.task_id, "b": tb.task_id}
        va, vb = _view(ta), _view(tb)
        for f in FIELDS:
            if va[f] != vb[f]:
                return {"task_id": ta.task_id, "field": f, "a": _short(va[f]), "b": _short(vb[f])}
    return None


def _short(v):
    if isinstance(v, list) and len(v) > 20:
        return f"<list of {len(v)}>"
    return v


def static_check(trajectories: list, golds: list[str], min_len: int = 20) -> dict:
    needles = sorted({g.strip() for g in golds if len(g.strip()) >= min_len})
    hits = []
    for tr in trajectories:
        texts = [tr.prompt_text] + [t.observation or "" for t in tr.turns]
        for g in needles:
            if any(g in x for x in texts):
                hits.append({"task_id": tr.task_id, "gold": g[:200]})
                break
    return {"passed": not hits, "golds_checked": len(needles), "hits": hits[:10], "n_hits": len(hits)}


def leakage_audit(tasks: list, policy, sandbox, budgets, *, work_dir: str | Path) -> dict:
    from sqlrl.evaluate import evaluate_tasks
    from sqlrl.goldcache import GoldCache

    work_dir = Path(work_dir)
    real = evaluate_tasks(
        tasks, policy, sandbox, GoldCache(work_dir / ".gold_real"), budgets, rollout_all=True
    )
    mutated_tasks = mutate_golds(tasks)
    mutated = evaluate_tasks(
        mutated_tasks, policy, sandbox, GoldCache(work_dir / ".gold_mutated"), budgets, rollout_all=True
    )
    diff = compare_runs(real.trajectories, mutated.trajectories)
    golds = [t.gold_sql for t in tasks] + [t.gold_sql for t in mutated_tasks]
    static = static_check(real.trajectories + mutated.trajectories, golds)
    changed_golds = sum(a.gold_sql != b.gold_sql for a, b in zip(tasks, mutated_tasks))
    score_changes = sum((ra["reward"] != rb["reward"]) for ra, rb in zip(real.results, mutated.results))
    return {
        "passed": diff is None and static["passed"] and changed_golds == len(tasks),
        "tasks": len(tasks),
        "golds_mutated": changed_golds,
        "first_difference": diff,
        "fields_compared": list(FIELDS),
        "static_check": static,
        "score_changes": score_changes,
        "budgets": budgets.to_dict(),
        "model": {"name": getattr(policy, "name", None), "identity": getattr(policy, "identity", None)},
        "task_ids": [t.public.task_id for t in tasks],
        "machine": machine_info(),
    }


def cli_main(argv: list[str]) -> int:
    from sqlrl.evaluate import (
        add_budget_args,
        add_runtime_args,
        budgets_from_args,
        load_policy,
        resolve_data_root,
        select_tasks,
    )

    p = argparse.ArgumentParser(prog="sqlrl audit leakage", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--data", default="embedded")
    p.add_argument("--split", default="validation")
    p.add_argument("--limit", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="folder for leakage.json")
    add_runtime_args(p)
    add_budget_args(p)
    a = p.parse_args(argv)
    from sqlrl.data import SpiderData
    from sqlrl.sandbox import Sandbox

    try:
        tasks = select_tasks(SpiderData(resolve_data_root(a.data)).load(a.split), a.limit, a.seed)
    except (ValueError, FileNotFoundError) as e:
        print(f"sqlrl audit leakage: {e}", file=sys.stderr)
        return 2
    budgets = budgets_from_args(a)
    policy = load_policy(a.model, device=a.device, dtype=a.dtype, engine=a.engine)
    with Sandbox(workers=2, timeout_s=budgets.sql_timeout_s) as sandbox:
        result = leakage_audit(tasks, policy, sandbox, budgets, work_dir=a.out)
    write_json_atomic(Path(a.out) / "leakage.json", result)
    verdict = "PASSED" if result["passed"] else "FAILED"
    print(
        f"leakage audit {verdict}: {result['tasks']} tasks, first difference: {result['first_difference']}, "
        f"static hits: {result['static_check']['n_hits']} -> {Path(a.out) / 'leakage.json'}"
    )
    return 0 if result["passed"] else 1
