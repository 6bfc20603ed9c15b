"""Reward throughput on real training streams: every pair a GRPO run scored, replayed step by step.

    python bench/bench_reward_stream.py [--data ../shared/data/spider] [--run RESULTS_FOLDER]
        [--arms grpo,no_update,validity] [--workers 2] [--steps N] [--slow-ms 50] [--json OUT]

Workload: `arms/<arm>/train/sql.jsonl.gz` of a committed experiment (default
`results/2026-12-01-spider-0.5b-single-turn-seed3`: Qwen2.5-Coder-0.5B on Spider, 24 steps x 32 tasks x 8
samples per arm at temperature 1, written by the trainer, `run.log_sql`): the final SQL of every
training trajectory, in the order the trainer scored them, one scoring call per step (3 x 6,144 pairs).
It includes duplicates inside a group, syntax errors, and a few predictions that run for seconds
or until the 5 s statement limit.

Scorers, on the same pairs:
- ours, as the trainer scores: per arm one fresh `Sandbox(workers)` and one `Evaluator` (the arm's
  reward kind, `test_suite=False`), one `score_many` per step (the sandbox deals each call's pairs
  over its workers in strided chunks, so one task's samples run on different workers).
- naive: per pair open a read-only connection, run the gold, run the prediction, compare with the same
  `execution_match`, close (reward_scorers.naive_score), plus the statement deadline the sandbox applies
  (5 s, a progress handler): without one a runaway prediction of the stream would never return.
Floor (first, one process): each distinct prediction of a step executed bare on an open connection
(no sandbox, IPC or scoring, the same deadline); "best ratio possible" = naive seconds / floor seconds,
where the floor of a step is max(its longest bare execution, its bare seconds / workers) (one
statement runs on one worker: no scorer can finish a step before its slowest prediction), summed over
the steps; "pooled" (the stream's bare seconds / workers, ignoring that) is printed too. "Of the
floor" = our ratio / the best ratio possible. "Slow" pairs (prediction over `--slow-ms` bare) dominate the totals for any
scorer; the "fast part" (every other pair) is timed again on its own for ours and read from per-pair
timings for the naive. The naive and ours run in alternating order per arm (naive first on the first
arm). Also printed: each scorer's slowest and median step and the verdict agreement (ours match ==
naive match wherever neither timed out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from reward_scorers import bare_exec, cpu_delta, cpu_snapshot, naive_score  # noqa: E402
from sqlrl.artifacts import read_jsonl  # noqa: E402
from sqlrl.reward.evaluator import Evaluator  # noqa: E402
from sqlrl.reward.shape import gold_shape  # noqa: E402
from sqlrl.sql.sandbox import Sandbox  # noqa: E402
from sqlrl.tasks.data import SpiderData  # noqa: E402
from sqlrl.tasks.goldcache import GoldCache  # noqa: E402

RUN = "results/2026-12-01-spider-0.5b-single-turn-seed3"
TIMEOUT_S = 5.0  # the sandbox's default and the training config's agent.sql_timeout_s


def load_stream(run: Path, arm: str, max_steps: int | None) -> list[list[dict]]:
    """The arm's scored trajectories grouped by scoring call ((step, round)), in order."""
    f = run / "arms" / arm / "train" / "sql.jsonl.gz"
    if not f.is_file():
        f = run / "arms" / arm / "train" / "sql.jsonl"
    calls: dict[tuple, list] = defaultdict(list)
    for r in read_jsonl(f):  # plain or gzipped
        if r.get("infra_error"):
            continue  # never scored
        if max_steps is None or r["step"] <= max_steps:
            calls[(r["step"], r["round"])].append(r)
    return [calls[k] for k in sorted(calls)]


def time_ours(calls: list[list], tasks: dict, gc, workers: int, kind: str) -> dict:
    """One fresh sandbox + evaluator for the whole stream, as a training run has; per-call wall times."""
    with Sandbox(workers=workers, timeout_s=TIMEOUT_S) as sb:
        ev = Evaluator(sb, gc, kind=kind, test_suite=False)
        # the workers are up before the clock starts (a training run starts them with its env)
        first = tasks[calls[0][0]["task_id"]].public.db_path
        sb.execute_many([(first, "SELECT 1")] * workers)
        snap = cpu_snapshot(sb)
        per_call, rewards = [], []
        t0 = time.perf_counter()
        for call in calls:
            t1 = time.perf_counter()
            rewards += ev.score_many([(r["final_sql"], tasks[r["task_id"]]) for r in call])
            per_call.append(time.perf_counter() - t1)
        total = time.perf_counter() - t0
        parent, wrk = cpu_delta(sb, snap)
    return {"total": total, "per_call": per_call, "rewards": rewards, "cpu": (parent, wrk)}


def time_naive(calls: list[list], tasks: dict) -> dict:
    per_pair, per_call, verdicts = [], [], []
    t0 = time.perf_counter()
    for call in calls:
        t1 = time.perf_counter()
        for r in call:
            t = tasks[r["task_id"]]
            t2 = time.perf_counter()
            verdicts.append(naive_score(t.public.db_path, t.gold_sql, r["final_sql"], TIMEOUT_S))
            per_pair.append(time.perf_counter() - t2)
        per_call.append(time.perf_counter() - t1)
    return {
        "total": time.perf_counter() - t0,
        "per_call": per_call,
        "per_pair": per_pair,
        "verdicts": verdicts,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "spider"))
    ap.add_argument(
        "--run", default=str(ROOT / RUN), help="experiment folder with arms/*/train/sql.jsonl[.gz]"
    )
    ap.add_argument("--arms", default="grpo,no_update,validity")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None, help="only the first N steps of each arm")
    ap.add_argument(
        "--slow-ms", type=float, default=50.0, help="bare execution time that makes a pair 'slow'"
    )
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = Path(args.run)
    ds = SpiderData(args.data)
    tasks = {t.public.task_id: t for t in ds.load("train_spider")}
    arms = [a for a in args.arms.split(",") if a]
    kinds = {}
    streams = {}
    for arm in arms:
        cfg = json.loads((run / "arms" / arm / "train" / "config.json").read_text())
        kinds[arm] = cfg["grpo"]["reward"]
        streams[arm] = load_stream(run, arm, args.steps)
        if not streams[arm]:
            print(f"no scored trajectories for arm {arm} under {run}", file=sys.stderr)
            return 2
    out: dict = {
        "run": str(run.relative_to(ROOT)) if run.is_relative_to(ROOT) else str(run),
        "workers": args.workers,
        "cpu_count": os.cpu_count(),
        "timeout_s": TIMEOUT_S,
        "slow_ms": args.slow_ms,
        "arms": {},
    }
    with (
        tempfile.TemporaryDirectory(prefix="bench_reward_stream_") as tmp,
        GoldCache(Path(tmp) / "gold", workers=args.workers) as gc,
    ):
        # the gold cache is warm and every gold's shape parsed before any clock starts (cached gold)
        needed = {
            (tasks[r["task_id"]].public.db_path, tasks[r["task_id"]].gold_sql)
            for a in arms
            for c in streams[a]
            for r in c
        }
        gc.get_many(sorted(needed), progress=False)
        for _, g in needed:
            gold_shape(g)
        totals: dict = defaultdict(float)
        for n_arm, arm in enumerate(arms):
            res, exact = measure_arm(args, gc, tasks, streams[arm], kinds[arm], n_arm)
            out["arms"][arm] = res
            for key in ("naive_s", "ours_s", "bare_s", "bare_slow_s"):
                totals[key] += res[key]
            totals["floor_s"] += exact["floor"]
            totals["fast_floor_s"] += exact["floor_fast"]
            totals["pairs"] += res["pairs"]
            totals["fast_naive_s"] += exact["naive_fast"]
            totals["fast_ours_s"] += exact["fast"]
            totals["fast_pairs"] += res["fast_part"]["pairs"]
            print_arm(arm, res, exact, args)
    out["total"] = summarize_total(totals, args.workers)
    o = out["total"]
    print(
        f"all arms: {o['pairs']} pairs; naive {o['naive_s']:.1f} s, ours {o['ours_s']:.1f} s: "
        f"{o['ratio']}x; best possible "
        f"{o['best_ratio_possible']}x (pooled {o['best_ratio_possible_pooled']}x), of the floor "
        f"{o['of_floor']} (target >= 0.8: {'met' if o['of_floor'] >= 0.8 else 'NOT met'}); "
        f"{o['bare_slow_share']:.0%} of the bare execution time is in slow pairs\n"
        f"fast part ({o['fast_part']['pairs']} pairs): {o['fast_part']['ratio']}x "
        f"(best possible {o['fast_part']['best_ratio_possible']}x), of the floor "
        f"{o['fast_part']['of_floor']} (target >= 0.8: "
        f"{'met' if o['fast_part']['of_floor'] >= 0.8 else 'NOT met'})"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


def bare_floor(
    calls: list[list], tasks: dict, slow_ms: float, workers: int
) -> tuple[float, float, set, list[bool], float, float]:
    """Each distinct prediction of a call executed bare, once: (bare seconds, of which in slow pairs,
    the slow (call, database, SQL) keys, whether each pair of the stream is slow, the floor of the
    stream and of its fast part: per call max(longest execution, the call's bare seconds / workers))."""
    conns: dict = {}
    bare_total = bare_slow = floor = floor_fast = 0.0
    slow_keys: set = set()
    for n_call, call in enumerate(calls):
        seen = set()
        times: list[float] = []
        for r in call:
            db = tasks[r["task_id"]].public.db_path
            if (db, r["final_sql"]) in seen:
                continue
            seen.add((db, r["final_sql"]))
            dt = bare_exec(conns, db, r["final_sql"], TIMEOUT_S)[0]
            times.append(dt)
            bare_total += dt
            if dt * 1e3 > slow_ms:
                bare_slow += dt
                slow_keys.add((n_call, db, r["final_sql"]))
        fast = [t for t in times if t * 1e3 <= slow_ms]
        floor += max(max(times, default=0.0), sum(times) / workers)
        floor_fast += max(max(fast, default=0.0), sum(fast) / workers)
    for c in conns.values():
        c.close()
    is_slow = [
        (n_call, tasks[r["task_id"]].public.db_path, r["final_sql"]) in slow_keys
        for n_call, call in enumerate(calls)
        for r in call
    ]
    return bare_total, bare_slow, slow_keys, is_slow, floor, floor_fast


def measure_arm(args, gc, tasks: dict, calls: list[list], kind: str, n_arm: int) -> tuple[dict, dict]:
    """One arm's stream through the floor, the naive and ours (whole stream, then the fast part only):
    its figures, and the unrounded times the printout and the totals use."""
    pairs = [r for c in calls for r in c]
    bare_total, bare_slow, slow_keys, is_slow, floor, floor_fast = bare_floor(
        calls, tasks, args.slow_ms, args.workers
    )
    fast_calls = []
    k = 0
    for call in calls:
        fast_calls.append([r for j, r in enumerate(call) if not is_slow[k + j]])
        k += len(call)
    # the timed runs, in alternating order per arm
    order = ["naive", "ours"]
    if n_arm % 2:
        order.reverse()
    got: dict = {}
    for who in order:
        if who == "naive":
            got[who] = time_naive(calls, tasks)
        else:
            got[who] = time_ours(calls, tasks, gc, args.workers, kind)
    got["fast"] = time_ours(fast_calls, tasks, gc, args.workers, kind)
    naive = got["naive"]
    naive_fast = sum(t for t, s in zip(naive["per_pair"], is_slow) if not s)
    agree = total = 0
    for rw, m in zip(got["ours"]["rewards"], naive["verdicts"]):
        if m is None or rw.status in ("timeout", "infra_error", "gold_unscorable"):
            continue
        total += 1
        agree += (rw.status == "match") == bool(m)
    n = len(pairs)
    n_fast = n - sum(is_slow)
    res = {
        "reward_kind": kind,
        "calls": len(calls),
        "pairs": n,
        "slow_pairs": sum(is_slow),
        "distinct_slow_predictions": len(slow_keys),
        "naive_s": round(naive["total"], 3),
        "ours_s": round(got["ours"]["total"], 3),
        "ratio": round(naive["total"] / got["ours"]["total"], 2),
        "slowest_call_s": {w: round(max(got[w]["per_call"]), 3) for w in ("naive", "ours")},
        "median_call_s": {w: round(statistics.median(got[w]["per_call"]), 4) for w in ("naive", "ours")},
        "bare_s": round(bare_total, 3),
        "bare_slow_s": round(bare_slow, 3),
        "floor_s": round(floor, 3),
        "best_ratio_possible": round(naive["total"] / floor, 2),
        "best_ratio_possible_pooled": round(naive["total"] / (bare_total / args.workers), 2),
        "of_floor": round(floor / got["ours"]["total"], 2),
        "fast_part": {
            "pairs": n_fast,
            "naive_s": round(naive_fast, 3),
            "ours_s": round(got["fast"]["total"], 3),
            "ratio": round(naive_fast / got["fast"]["total"], 2),
            "naive_us_per_pair": round(naive_fast / n_fast * 1e6, 1),
            "ours_us_per_pair": round(got["fast"]["total"] / n_fast * 1e6, 1),
            "ours_cpu_us_per_pair": {
                "parent": round(got["fast"]["cpu"][0] / n_fast * 1e6, 1),
                "workers": round(got["fast"]["cpu"][1] / n_fast * 1e6, 1),
            },
            "floor_s": round(floor_fast, 3),
            "best_ratio_possible": round(naive_fast / max(1e-9, floor_fast), 2),
            "of_floor": round(floor_fast / got["fast"]["total"], 2),
        },
        "verdict_agreement_with_naive": f"{agree}/{total}",
    }
    exact = {
        "naive": naive["total"],
        "ours": got["ours"]["total"],
        "naive_fast": naive_fast,
        "fast": got["fast"]["total"],
        "bare_total": bare_total,
        "bare_slow": bare_slow,
        "floor": floor,
        "floor_fast": floor_fast,
    }
    return res, exact


def print_arm(arm: str, res: dict, exact: dict, args) -> None:
    n_fast = res["fast_part"]["pairs"]
    fp = res["fast_part"]
    print(
        f"{arm} ({res['reward_kind']} reward): {res['pairs']} pairs in {res['calls']} calls, {res['slow_pairs']} slow "
        f"(> {args.slow_ms:g} ms bare: {res['distinct_slow_predictions']} distinct predictions, "
        f"{exact['bare_slow']:.1f} of {exact['bare_total']:.1f} s bare)\n"
        f"  naive {exact['naive']:.2f} s; ours {exact['ours']:.2f} s ({res['ratio']}x); "
        f"best possible on {args.workers} workers {res['best_ratio_possible']}x "
        f"(pooled {res['best_ratio_possible_pooled']}x); of the floor {res['of_floor']}\n"
        f"  slowest call: naive {res['slowest_call_s']['naive']} s, ours "
        f"{res['slowest_call_s']['ours']} s; median call naive {res['median_call_s']['naive']} s, "
        f"ours {res['median_call_s']['ours']} s\n"
        f"  fast part ({n_fast} pairs): naive {exact['naive_fast']:.2f} s ({fp['naive_us_per_pair']} "
        f"us/pair), ours {exact['fast']:.2f} s ({fp['ours_us_per_pair']} us/pair; "
        f"CPU parent {fp['ours_cpu_us_per_pair']['parent']} + workers "
        f"{fp['ours_cpu_us_per_pair']['workers']} us/pair): "
        f"{fp['ratio']}x (best possible {fp['best_ratio_possible']}x; of the floor {fp['of_floor']})\n"
        f"  verdicts agree with naive {res['verdict_agreement_with_naive']}",
        flush=True,
    )


def summarize_total(t: dict, workers: int) -> dict:
    return {
        "pairs": int(t["pairs"]),
        "naive_s": round(t["naive_s"], 3),
        "ours_s": round(t["ours_s"], 3),
        "ratio": round(t["naive_s"] / t["ours_s"], 2),
        "best_ratio_possible": round(t["naive_s"] / t["floor_s"], 2),
        "best_ratio_possible_pooled": round(t["naive_s"] / (t["bare_s"] / workers), 2),
        "of_floor": round(t["floor_s"] / t["ours_s"], 2),
        "bare_slow_share": round(t["bare_slow_s"] / t["bare_s"], 3),
        "fast_part": {
            "pairs": int(t["fast_pairs"]),
            "ratio": round(t["fast_naive_s"] / t["fast_ours_s"], 2),
            "best_ratio_possible": round(t["fast_naive_s"] / t["fast_floor_s"], 2),
            "of_floor": round(t["fast_floor_s"] / t["fast_ours_s"], 2),
        },
    }


if __name__ == "__main__":
    sys.exit(main())
