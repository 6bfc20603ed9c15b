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

from pathlib import Path

from sqlrl.artifacts import holds_run_lock, machine_info

FIELDS = ("prompt_ids", "token_ids", "final_sql", "stop_reason", "n_turns", "actions")


def mutate_golds(tasks: list) -> list:
    """Each gold replaced by a different valid query: another task's gold on the same db, else a schema query."""
    from sqlrl.tasks.data import PrivateTask

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


@holds_run_lock("work_dir")
def leakage_audit(tasks: list, policy, sandbox, budgets, *, work_dir: str | Path, progress=True) -> dict:
    """`progress`: True for a tqdm bar per run, False, or a handle counting the tasks of both runs (the
    experiment's progress line: 2 x len(tasks))."""
    from sqlrl.agent.envs import make_env
    from sqlrl.evaluation.runner import evaluate_tasks

    work_dir = Path(work_dir)
    with make_env(sandbox=sandbox, gold_dir=work_dir / ".gold_real") as env:
        real = evaluate_tasks(
            tasks, policy, sandbox, env.gold_cache, budgets, rollout_all=True, progress=progress
        )
    mutated_tasks = mutate_golds(tasks)
    with make_env(sandbox=sandbox, gold_dir=work_dir / ".gold_mutated") as env:
        mutated = evaluate_tasks(
            mutated_tasks, policy, sandbox, env.gold_cache, budgets, rollout_all=True, progress=progress
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
