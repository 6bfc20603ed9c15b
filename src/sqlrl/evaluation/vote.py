"""Execution-guided self-consistency: sample k answers per task, execute them, answer with the majority
result; reported beside greedy evaluation, never instead of it.

For every scorable task the agent runs k times with temperature sampling (seeded); each final SQL is
executed in the sandbox on the task's database (the policy's own SQL only: the gold is never executed
or consulted while choosing); answers that execute are grouped by their result (column count and the
rows as a multiset: row order does not split a vote), the largest group wins, ties go to the group whose
first member was sampled first, and the winner's first SQL is the answer. When no sample executes, the
first sample's SQL is the answer. Only then is the chosen SQL scored against the gold (`Evaluator`),
like a greedy answer; `pass_at_k` (some sample matches) is the oracle bound beside it.

What is covered:
- the choice is a pure function of the k SQL texts and their sandbox results (`choose`);
- unscorable golds are excluded and counted, as in greedy evaluation; a sample whose execution is an
  infrastructure failure does not vote, and a chosen answer that is one is excluded from scoring.

What is not:
- k times the generation of a greedy evaluation, and k executions per task;
- ORDER BY questions vote on row multisets, so two answers that differ only in order share a vote.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["VoteOutput", "choose", "result_key", "self_consistency"]


@dataclass
class VoteOutput:
    results: list[dict]  # one per task: chosen SQL, votes, verdict (or the exclusion reason)
    summary: dict


def result_key(res: Any) -> tuple | None:
    """What a vote is cast on: (column count, rows as a sorted multiset of reprs); None unless status ok."""
    if getattr(res, "status", None) != "ok":
        return None
    rows = [tuple(r) for r in (res.rows or [])]
    return (len(res.columns or (rows[0] if rows else ())), tuple(sorted(map(repr, rows))))


def choose(sqls: Sequence[str | None], results: Sequence[Any]) -> tuple[int, int]:
    """(index of the chosen sample, size of its vote). Samples whose result is not ok do not vote; with
    no vote at all the first sample is chosen with a vote of 0."""
    groups: dict[tuple, list[int]] = {}
    for i, (sql, res) in enumerate(zip(sqls, results)):
        key = result_key(res) if sql else None
        if key is not None:
            groups.setdefault(key, []).append(i)
    if not groups:
        return 0, 0
    best = max(groups.values(), key=lambda members: (len(members), -members[0]))
    return best[0], len(best)


def self_consistency(
    tasks: list,
    policy: Any,
    sandbox: Any,
    gold_cache: Any,
    budgets: Any,
    *,
    k: int,
    temperature: float = 0.7,
    seed: int = 0,
    progress: bool = True,
) -> VoteOutput:
    """Vote over `k` sampled answers per PrivateTask (see the module docstring)."""
    from sqlrl.agent.envs import make_env
    from sqlrl.agent.loop import Sampling
    from sqlrl.reward.evaluator import Evaluator
    from sqlrl.sql.sandbox import execute_each
    from sqlrl.tasks.goldcache import audit_golds

    if k < 2:
        raise ValueError(f"self-consistency needs k >= 2 samples per task, got {k}")
    if not temperature > 0:
        raise ValueError(f"self-consistency samples with temperature > 0, got {temperature}")
    t0 = time.perf_counter()
    audit = audit_golds(tasks, gold_cache)
    scorable = [t for t in tasks if audit.per_task.get(t.public.task_id) is None]
    env = make_env(sandbox=sandbox)
    trajs = env.rollout(
        [t.public for t in scorable],
        policy,
        budgets,
        Sampling(temperature=temperature, seed=seed),
        n_samples=k,
        progress="self-consistency" if progress else False,
    )
    by_task: dict[str, list] = {}
    for tr in trajs:
        by_task.setdefault(tr.task_id, []).append(tr)
    samples = [(t, tr) for t in scorable for tr in by_task[t.public.task_id]]
    todo = [(t, tr) for t, tr in samples if tr.final_sql]
    executed = execute_each(sandbox, [(t.public.db_path, tr.final_sql) for t, tr in todo], lambda e: None)
    res_of = {id(tr): r for (_, tr), r in zip(todo, executed)}
    chosen: dict[str, tuple[Any, int]] = {}
    for t in scorable:
        group = by_task[t.public.task_id]
        idx, votes = choose([s.final_sql for s in group], [res_of.get(id(s)) for s in group])
        chosen[t.public.task_id] = (group[idx], votes)
    # every sample scored once: the chosen one's reward and pass@k both come from these
    scored = Evaluator(sandbox, gold_cache).score_many([(tr.final_sql, t) for t, tr in samples])
    reward_of = {id(tr): r for (_, tr), r in zip(samples, scored)}
    results, n, correct, oracle = [], 0, 0, 0
    for t in tasks:
        tid = t.public.task_id
        reason = audit.per_task.get(tid)
        if reason is not None:
            results.append(
                {"task_id": tid, "db_id": t.public.db_id, "status": "gold_unscorable", "reason": reason}
            )
            continue
        tr, votes = chosen[tid]
        r = reward_of[id(tr)]
        ok = None if r.value is None else r.status == "match"
        any_match = any(reward_of[id(s)].status == "match" for s in by_task[tid])
        if ok is not None:
            n += 1
            correct += ok
            oracle += any_match
        results.append(
            {
                "task_id": tid,
                "db_id": t.public.db_id,
                "final_sql": tr.final_sql,
                "sample": tr.sample,
                "votes": votes,
                "status": r.status,
                "correct": ok,
                "pass_at_k": any_match if ok is not None else None,
            }
        )
    summary = {
        "k": k,
        "temperature": temperature,
        "seed": seed,
        "n": n,
        "execution_match": correct / n if n else None,
        "pass_at_k": oracle / n if n else None,
        "excluded": len(tasks) - n,
        "elapsed_s": round(time.perf_counter() - t0, 3),
    }
    return VoteOutput(results, summary)


def run_self_consistency(
    *,
    policy: Any,
    data: str,
    split: str,
    out: str,
    budgets: Any,
    k: int,
    temperature: float,
    limit: int = 0,
    seed: int = 0,
    split_seed: int = 0,
    val_fraction: float = 0.1,
    sandbox_workers: int = 2,
) -> VoteOutput:
    """`sqlrl eval --self-consistency K`: the tasks greedy evaluation scores (same selection), voted;
    writes `self_consistency.jsonl` and `self_consistency.json` into the run folder `out`."""
    from pathlib import Path

    from sqlrl.agent.envs import make_env
    from sqlrl.artifacts import write_json_atomic, write_jsonl
    from sqlrl.evaluation.runner import split_tasks

    _, tasks = split_tasks(
        data, split, limit=limit, seed=seed, split_seed=split_seed, val_fraction=val_fraction
    )
    with make_env(
        workers=sandbox_workers, timeout_s=budgets.sql_timeout_s, gold_dir=Path(out) / ".goldcache"
    ) as env:
        res = self_consistency(
            tasks, policy, env.sandbox, env.gold_cache, budgets, k=k, temperature=temperature, seed=seed
        )
    write_jsonl(Path(out) / "self_consistency.jsonl", res.results)
    write_json_atomic(Path(out) / "self_consistency.json", res.summary)
    return res
