"""`sqlrl eval`: run the agent greedily over a split, then score each finished trajectory.

Order of events for every task: the gold audit decides whether the task is scorable (unscorable golds
are excluded and counted, never scored and never shown to the policy); the agent runs on the public
task only; after the trajectory has ended the evaluator receives it together with the private task
and writes the reward into a separate field.

Writes to the run folder: `run.json` (provenance), `trajectories.jsonl`, `results.jsonl`,
`summary.json` (see docs/DESIGN.md "Run folders"; `by_hardness`: accuracy per official Spider hardness
of the gold, `sqlrl.tasks.hardness`; `bird_execution_match`: BIRD's set-of-rows metric,
`sqlrl.reward.bird`; `by_difficulty`: both metrics per BIRD difficulty, on BIRD splits only;
`turn_use`: turns used, repeated first queries, replies after an error, accuracy by turns used,
`sqlrl.evaluation.turnuse`; `checker`, with agent.checker: how the checker turn changed the answers,
`sqlrl.evaluation.checker`; `exec_error_kinds` and results.jsonl's `error`: why predictions do not
execute, `sqlrl.evaluation.errorkinds`).
Guaranteed: every task of the split appears in `results.jsonl` exactly once, scored or excluded with
its reason. Not guaranteed: identical numbers across machines in bf16 (see `sqlrl.agent.loop`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from sqlrl.agent.envs import make_env
from sqlrl.agent.loop import Budgets, Sampling, Trajectory
from sqlrl.artifacts import git_commit, holds_run_lock, machine_info, write_json_atomic, write_jsonl
from sqlrl.evaluation.checker import checker_row, checker_summary, score_first_answers
from sqlrl.evaluation.errorkinds import NON_EXECUTABLE, exec_error_kinds, failure_message
from sqlrl.evaluation.turnuse import turn_use
from sqlrl.generation.device import pick_device
from sqlrl.tasks.bird import accuracy_by_difficulty
from sqlrl.tasks.data import resolve_data_root, select_tasks
from sqlrl.tasks.hardness import accuracy_by_hardness

log = logging.getLogger(__name__)


@dataclass
class EvalOutput:
    trajectories: list[Trajectory]
    results: list[dict]
    summary: dict


def evaluate_tasks(
    tasks: list,
    policy,
    sandbox,
    gold_cache,
    budgets: Budgets,
    *,
    sampling: Sampling = Sampling(temperature=0.0, seed=0),
    kind: str = "execution",
    progress=True,
    rollout_all: bool = False,
    chunk_size: int = 0,
    done: dict[str, Trajectory] | None = None,
    on_chunk=None,
) -> EvalOutput:
    """Score `tasks` (PrivateTask). With `rollout_all`, the agent also runs on tasks whose gold is
    unscorable (they are still excluded from scoring); the leakage audit uses this so that both of its
    runs roll out exactly the same tasks whatever the golds are.

    The rolled-out tasks run in chunks of `chunk_size` (0: one chunk), fixed by position, so a resumed
    evaluation batches each task exactly as an uninterrupted one; `done` (task id -> scored trajectory)
    holds the tasks finished before, which are not run again; `on_chunk(trajectories)` receives each
    scored chunk. `progress`: True for a tqdm bar, False, or a handle (`progress.PartHandle`) that
    counts tasks."""
    from sqlrl.tasks.goldcache import audit_golds

    t_start = time.perf_counter()
    env = make_env(sandbox=sandbox, gold_cache=gold_cache, reward=kind)
    audit = audit_golds(tasks, gold_cache)
    scorable = [t for t in tasks if audit.per_task.get(t.public.task_id) is None]
    rolled = tasks if rollout_all else scorable
    scorable_ids = {t.public.task_id for t in scorable}
    private = {t.public.task_id: t for t in scorable}
    done = done or {}
    size = chunk_size if chunk_size > 0 else max(1, len(rolled))
    handle = progress if hasattr(progress, "update") else None
    trajectories: list[Trajectory] = []
    for start in range(0, len(rolled), size):
        chunk = rolled[start : start + size]
        todo = [t for t in chunk if t.public.task_id not in done]
        ran: list[Trajectory] = []
        if todo:
            # a chunk's sampling seed depends on its position only (as `rollout(chunk_size=size)`)
            shifted = dataclasses.replace(
                sampling, seed=None if sampling.seed is None else sampling.seed + start
            )
            bar = "eval" if progress is True and handle is None else False
            ran = env.rollout([t.public for t in todo], policy, budgets, shifted, progress=bar)
            scored_ran = [tr for tr in ran if tr.task_id in scorable_ids]
            env.score(scored_ran, private)
            if budgets.checker:
                score_first_answers(scored_ran, private, env.evaluator)
            if on_chunk is not None:
                on_chunk(ran)
            if handle is not None:
                handle.update(len(todo))
        by_ran = {tr.task_id: tr for tr in ran}
        trajectories += [done.get(t.public.task_id) or by_ran[t.public.task_id] for t in chunk]
    by_id = {tr.task_id: tr for tr in trajectories}
    results = []
    for t in tasks:
        tid = t.public.task_id
        reason = audit.per_task.get(tid)
        if reason is not None:
            results.append(
                {
                    "task_id": tid,
                    "db_id": t.public.db_id,
                    "final_sql": None,
                    "status": "gold_unscorable",
                    "reason": reason,
                    "correct": None,
                    "reward": None,
                    "test_suite_correct": None,
                    "bird_correct": None,
                    **({"difficulty": t.difficulty} if t.difficulty else {}),
                }
            )
            continue
        tr = by_id[tid]
        rw = tr.reward or {}
        value = rw.get("value")
        ts = (rw.get("parts") or {}).get("test_suite_match")
        bird = (rw.get("parts") or {}).get("bird_match")
        correct = None if value is None else bool(value >= 1.0) if kind == "execution" else None
        check = checker_row(tr, correct)
        results.append(
            {
                "task_id": tid,
                "db_id": t.public.db_id,
                "final_sql": tr.final_sql,
                "status": rw.get("status"),
                "correct": correct,
                "reward": value,
                "test_suite_correct": None if ts is None else bool(ts),
                "bird_correct": None if value is None or bird is None else bool(bird),
                "turns": len(tr.turns),
                "stop_reason": tr.stop_reason,
                "exec_ms": rw.get("exec_ms"),
                **({"error": msg[:300]} if (msg := failure_message(rw)) else {}),
                **({"difficulty": t.difficulty} if t.difficulty else {}),
                **({} if check is None else {"checker": check}),
            }
        )
    summary = summarize(results, trajectories, kind=kind)
    if budgets.checker:
        summary["checker"] = checker_summary(results)
    summary["turn_use"] = turn_use(results, trajectories)
    summary["by_hardness"] = accuracy_by_hardness(results, {t.public.task_id: t.gold_sql for t in tasks})
    by_difficulty = accuracy_by_difficulty(results)
    if by_difficulty is not None:
        summary["by_difficulty"] = by_difficulty
    summary["elapsed_s"] = round(time.perf_counter() - t_start, 3)
    summary["budgets"] = budgets.to_dict()
    summary["gold_audit"] = audit.to_dict() if hasattr(audit, "to_dict") else None
    if done:
        summary["resumed_tasks"] = sum(t.public.task_id in done for t in rolled)
    return EvalOutput(trajectories, results, summary)


def summarize(results: list[dict], trajectories: list[Trajectory], kind: str = "execution") -> dict:
    scored = [r for r in results if r["reward"] is not None]
    excluded = Counter()
    for r in results:
        if r["reward"] is None:
            excluded[r.get("reason") or r["status"]] += 1
    status_counts = Counter(r["status"] for r in results)
    per_db: dict[str, dict] = defaultdict(lambda: {"n": 0, "correct": 0})
    for r in scored:
        d = per_db[r["db_id"]]
        d["n"] += 1
        d["correct"] += int(bool(r["correct"]))
    for d in per_db.values():
        d["accuracy"] = d["correct"] / d["n"] if d["n"] else None
    n = len(scored)
    ts = [r["test_suite_correct"] for r in scored if r.get("test_suite_correct") is not None]
    bd = [r["bird_correct"] for r in scored if r.get("bird_correct") is not None]
    gen_tokens = sum(tr.generated_tokens for tr in trajectories)
    gen_s = sum(tr.timings.get("gen_s", 0.0) for tr in trajectories)
    return {
        "n": n,
        "n_tasks": len(results),
        "kind": kind,
        "execution_match": (sum(bool(r["correct"]) for r in scored) / n)
        if n and kind == "execution"
        else None,
        "mean_reward": (sum(r["reward"] for r in scored) / n) if n else None,
        "test_suite_match": (sum(ts) / len(ts)) if ts else None,
        "bird_execution_match": (sum(bd) / len(bd)) if bd and kind == "execution" else None,
        "executable_rate": (sum(r["status"] not in NON_EXECUTABLE for r in scored) / n) if n else None,
        "excluded": dict(excluded),
        "status_counts": dict(status_counts),
        "exec_error_kinds": exec_error_kinds(scored),
        "per_db": dict(sorted(per_db.items())),
        "mean_turns": (sum(len(tr.turns) for tr in trajectories) / len(trajectories))
        if trajectories
        else None,
        "stop_reasons": dict(Counter(tr.stop_reason for tr in trajectories)),
        "generated_tokens": gen_tokens,
        "generation_s": round(gen_s, 3),
    }


def write_eval_run(out_dir: str | Path, output: EvalOutput, provenance: dict) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "trajectories.jsonl", (tr.to_dict() for tr in output.trajectories))
    write_jsonl(out / "results.jsonl", output.results)
    summary = dict(output.summary)
    for k in ("model", "fingerprint", "split", "machine"):
        if k in provenance:
            summary[k] = provenance[k]
    write_json_atomic(out / "summary.json", summary)
    write_json_atomic(out / "run.json", provenance)


def load_policy(
    model: str, *, device: str = "auto", dtype: str = "auto", engine: str = "auto", max_batch: int = 256
):
    from sqlrl.generation.models import load_model
    from sqlrl.generation.policy import HFPolicy

    device = pick_device(device)
    if dtype == "auto":
        dtype = "bfloat16" if device == "cuda" else "float32"
    loaded = load_model(model, device=device, dtype=dtype)
    return HFPolicy(loaded, engine=engine, max_batch=max_batch)


def load_endpoint_policy(endpoint: str, model: str, tokenizer: str | None = None, api_key: str | None = None):
    """An OpenAI-compatible server (e.g. vLLM) as the policy. The chat template comes from the
    tokenizer of `tokenizer` (default: `model`, resolved like any sqlrl model name), so prompts are
    token ids built exactly as for a local model."""
    import os

    from transformers import AutoTokenizer

    from sqlrl.generation.models import resolve_model
    from sqlrl.generation.policy import OpenAIPolicy

    src = tokenizer or model
    tok_src = src if os.path.isdir(src) else str(resolve_model(src))
    tok = AutoTokenizer.from_pretrained(tok_src)
    return OpenAIPolicy(endpoint, model, api_key=api_key or os.environ.get("OPENAI_API_KEY"), tokenizer=tok)


PARTIAL = "trajectories.partial.jsonl"  # scored trajectories of the chunks finished so far
PARTIAL_KEY = "partial.json"  # what they were made with: a resumed evaluation must match it


def eval_chunk_size(policy) -> int:
    """Tasks per saved chunk: the policy's batch (`run.gen_max_batch`) on a GPU; 2 elsewhere (on a CPU a
    0.5B model takes about a minute a task, so an interruption loses at most one chunk)."""
    model = getattr(policy, "model", None)
    device = getattr(getattr(model, "device", None), "type", "cpu")
    batch = int(getattr(policy, "max_batch", 0) or 64)
    return max(1, batch) if device == "cuda" else 2


def trajectory_from_dict(d: dict) -> Trajectory:
    from sqlrl.agent.loop import Turn

    return Trajectory(**{**d, "turns": [Turn(**t) for t in d["turns"]]})


def eval_device() -> dict:
    """The accelerator and software an evaluation runs on (`artifacts.machine_info`): greedy answers of one
    set of weights differ between GPU models, so an evaluation is resumed only on the device it began on."""
    from sqlrl.artifacts import machine_info

    m = machine_info()
    return {k: m.get(k) for k in ("accelerator", "torch", "cuda")}


def load_partial(out: Path, key: dict) -> dict[str, Trajectory]:
    """The scored trajectories an interrupted evaluation into `out` wrote with the same `key` (model,
    tasks, budgets, chunking, device); anything else there is removed (with a warning) and the evaluation starts
    over."""
    from sqlrl.artifacts import read_json, read_jsonl

    kp, tp = out / PARTIAL_KEY, out / PARTIAL
    if not kp.exists():
        tp.unlink(missing_ok=True)
        return {}
    if read_json(kp) != key:
        log.warning(
            f"{out}: the partial predictions there are of another model, task set, budgets or device; starting over"
        )
        kp.unlink()
        tp.unlink(missing_ok=True)
        return {}
    return {d["task_id"]: trajectory_from_dict(d) for d in read_jsonl(tp)} if tp.exists() else {}


def split_tasks(
    data: str, split: str, *, limit: int = 0, seed: int = 0, split_seed: int = 0, val_fraction: float = 0.1
) -> tuple:
    """(the folder's reader (`open_data`), the tasks `sqlrl eval` scores: the split, or a seeded subset of
    `limit`); ValueError when the split has none."""
    from sqlrl.tasks.bird import open_data

    ds = open_data(resolve_data_root(data))
    tasks = select_tasks(ds.load(split, seed=split_seed, val_fraction=val_fraction), limit, seed)
    if not tasks:
        raise ValueError(f"split {split!r} of {ds.root} has no tasks")
    return ds, tasks


@holds_run_lock("out")
def run_eval(
    *,
    model: str,
    data: str,
    split: str,
    out: str | Path,
    budgets: Budgets,
    limit: int = 0,
    seed: int = 0,
    split_seed: int = 0,
    val_fraction: float = 0.1,
    device: str = "auto",
    dtype: str = "auto",
    engine: str = "auto",
    policy=None,
    sandbox_workers: int = 2,
    command: list[str] | None = None,
    progress=True,
    chunk_size: int | None = None,
) -> EvalOutput:
    """Evaluate into `out`. Each chunk of tasks (`eval_chunk_size`) is saved when scored; rerunning an
    interrupted evaluation with the same model, tasks and budgets resumes after the last saved chunk and
    writes the same predictions as an uninterrupted run. `progress`: as `progress.open_part`."""
    from sqlrl.artifacts import append_jsonl_many
    from sqlrl.evaluation.progress import open_part

    out = Path(out)
    ds, tasks = split_tasks(
        data, split, limit=limit, seed=seed, split_seed=split_seed, val_fraction=val_fraction
    )
    if policy is None:
        policy = load_policy(model, device=device, dtype=dtype, engine=engine)
    fingerprint = ds.fingerprint(split, seed=split_seed, val_fraction=val_fraction)
    size = chunk_size or eval_chunk_size(policy)
    key = {
        "model": {"name": getattr(policy, "name", model), "identity": getattr(policy, "identity", None)},
        "task_ids": [t.public.task_id for t in tasks],
        "fingerprint": fingerprint,
        "budgets": budgets.to_dict(),
        "chunk_size": size,
        "device": eval_device(),
    }
    key = json.loads(json.dumps(key))
    out.mkdir(parents=True, exist_ok=True)
    done = load_partial(out, key)
    if done:
        log.info(
            f"resuming evaluation {out} after {len(done)} of {len(tasks)} tasks (their predictions are kept)"
        )
    write_json_atomic(out / PARTIAL_KEY, key)

    def save(chunk: list[Trajectory]) -> None:
        append_jsonl_many(out / PARTIAL, (tr.to_dict() for tr in chunk))

    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    bar = open_part(
        progress, title="sqlrl eval", label="evaluate", kind="task", total=len(tasks), initial=len(done)
    )
    with make_env(
        workers=sandbox_workers, timeout_s=budgets.sql_timeout_s, gold_dir=out / ".goldcache"
    ) as env:
        output = evaluate_tasks(
            tasks,
            policy,
            env.sandbox,
            env.gold_cache,
            budgets,
            progress=bar if bar is not None else False,
            chunk_size=size,
            done=done,
            on_chunk=save,
        )
    if bar is not None:
        bar.close()
    prov = {
        "command": command or sys.argv,
        "git": git_commit(),
        "machine": machine_info(),
        "model": key["model"],
        "data": str(ds.root),
        "split": split,
        "split_seed": split_seed,
        "val_fraction": val_fraction,
        "limit": limit,
        "task_ids": key["task_ids"],
        "fingerprint": fingerprint,
        "budgets": budgets.to_dict(),
        "sampling": {"temperature": 0.0, "seed": seed},
        "engine": getattr(policy, "engine", engine),
        "chunk_size": size,
        "resumed_tasks": len(done),
        "started": started,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_eval_run(out, output, prov)
    (out / PARTIAL).unlink(missing_ok=True)
    (out / PARTIAL_KEY).unlink(missing_ok=True)
    return output
