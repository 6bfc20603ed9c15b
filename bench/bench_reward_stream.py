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
  over its workers in strided chunks, so one task's samples run on different workers). Before the
  clock, as a training run has them by then: the workers up and `Evaluator.prefetch` of the stream's
  tasks (the trainer runs it beside generation): every gold and full ordered result behind a LIMIT
  cut in the gold cache, each worker's connection to each database open (`Sandbox.warm`).
- naive: per pair open a read-only connection, run the gold, run the prediction, compare with the same
  `execution_match`, close (reward_scorers.naive_score), plus the statement deadline the sandbox applies
  (5 s, a progress handler): without one a runaway prediction of the stream would never return.
Floor (first, one process): each distinct prediction of a step executed bare on an open connection
(opened untimed; no pre-check, authorizer, caps, sandbox, IPC or comparison; the same deadline).
Left out of the floor but paid by every scorer, the naive included: comparing each executed
prediction with its gold (`execution_match` on the cached gold, timed per fast prediction and
printed as "of the floor plus the comparisons", spread over the workers too). "Best ratio
possible" = naive seconds / floor seconds, where the floor of a step is max(its longest bare execution, its bare seconds / workers) (one
statement runs on one worker: no scorer can finish a step before its slowest prediction), summed over
the steps; "pooled" (the stream's bare seconds / workers, ignoring that) is printed too. "Of the
floor" = our ratio / the best ratio possible. "Slow" pairs (prediction over `--slow-ms` bare)
dominate the totals for any scorer; the "fast part" (every other pair) is timed again on its own for ours and read from per-pair
timings for the naive. The naive and ours run in alternating order per arm (naive first on the first
arm). Also printed: each scorer's slowest and median step and the verdict agreement (ours match ==
naive match wherever neither timed out), and for the fast part where ours spends its CPU: the
bare executions, the workers' code (`score_batch` on the batches ours sends) and the parent's
(`Evaluator.score_many` with those answers replayed), each alone in this process (`breakdown`);
bare / (workers' + parent's) is what ours would reach of the floor with no IPC, no waiting and the
cores shared perfectly: an upper bound on it. And the floor's own premise (bare seconds / workers):
the fast part's bare executions in one fresh process against the same dealt over `workers` fresh
processes at once (`bare_split`: each process first-touches its own connections' pages).
"""

from __future__ import annotations

import argparse
import json
import marshal
import multiprocessing
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import OrderedDict, defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from reward_scorers import bare_exec, cpu_delta, cpu_snapshot, naive_score  # noqa: E402
from sqlrl.artifacts import read_jsonl  # noqa: E402
from sqlrl.reward.evaluator import Evaluator  # noqa: E402
from sqlrl.reward.match import execution_match  # noqa: E402
from sqlrl.reward.shape import gold_shape  # noqa: E402
from sqlrl.sql.engine import Deadline  # noqa: E402
from sqlrl.sql.result import MAX_ROWS  # noqa: E402
from sqlrl.sql.sandbox import Sandbox  # noqa: E402
from sqlrl.sql.scoring import score_batch  # noqa: E402
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
        # before the clock, as a training run has it by then (its env starts the workers; the trainer's
        # `prefetch` runs beside generation): the workers up, every gold and full ordered result behind
        # a LIMIT cut in the gold cache, and each worker's connection to each database open
        # (`Sandbox.warm`), as the floor's connections are
        ev.prefetch([tasks[r["task_id"]] for call in calls for r in call])
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
    start_load = _load()
    print(f"load average at the start (1, 5, 15 min): {start_load}", flush=True)
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
            totals["fast_compare_s"] += exact["compare"]
            for k, v in exact["breakdown"].items():
                totals[f"fast_cpu_{k}"] += v
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
        f"{'met' if o['fast_part']['of_floor'] >= 0.8 else 'NOT met'}); of the floor plus the "
        f"comparisons {o['fast_part']['of_floor_plus_compare']}; CPU per pair, each part alone in one "
        f"process: bare {o['fast_part']['cpu_one_process_us_per_pair']['bare']}, workers' code "
        f"{o['fast_part']['cpu_one_process_us_per_pair']['workers']}, parent's "
        f"{o['fast_part']['cpu_one_process_us_per_pair']['parent']}: at best "
        f"{o['fast_part']['bound_of_floor_one_process']} of the floor; bare executions dealt over "
        f"{args.workers} processes take {o['fast_part']['bare_split_over_one_process']}x the CPU of one"
    )
    out["load_average"] = {"start": start_load, "end": _load()}
    print(f"load average at the end (1, 5, 15 min): {out['load_average']['end']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


def _load() -> list[float] | None:
    """The machine's load average (other jobs share its cores), None where the OS has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def compare_seconds(conns: dict, gc, task, sql: str | None) -> float:
    """Seconds of the comparison every scorer makes after executing a fast prediction (the naive too):
    `execution_match` of its rows (fetched again, untimed) with the cached gold's; 0 when it fails."""
    if not sql or not sql.strip():
        return 0.0
    try:
        cur = conns[task.public.db_path].execute(sql)
        rows, cols = cur.fetchall(), [d[0] for d in cur.description or []]
        gold = gc.get(task.public.db_path, task.gold_sql)
        if getattr(gold, "status", None) != "ok":
            return 0.0
        shape = gold_shape(task.gold_sql)
        t0 = time.perf_counter()
        execution_match(gold.columns, gold.rows, cols, rows, shape)
        return time.perf_counter() - t0
    except (sqlite3.Error, ValueError):
        return 0.0


def bare_floor(
    calls: list[list], tasks: dict, slow_ms: float, workers: int, gc=None
) -> tuple[float, float, set, list[bool], float, float, float]:
    """Each distinct prediction of a call executed bare, once: (bare seconds, of which in slow pairs,
    the slow (call, database, SQL) keys, whether each pair of the stream is slow, the floor of the
    stream and of its fast part: per call max(longest execution, the call's bare seconds / workers),
    and the seconds the fast predictions' comparisons with their golds take (`compare_seconds`,
    with `gc`; not part of the floor))."""
    conns: dict = {}
    bare_total = bare_slow = floor = floor_fast = compare = 0.0
    slow_keys: set = set()
    for n_call, call in enumerate(calls):
        seen = set()
        times: list[float] = []
        for r in call:
            db = tasks[r["task_id"]].public.db_path
            if (db, r["final_sql"]) in seen:
                continue
            seen.add((db, r["final_sql"]))
            dt, ok = bare_exec(conns, db, r["final_sql"], TIMEOUT_S)
            times.append(dt)
            if gc is not None and ok and dt * 1e3 <= slow_ms:
                compare += compare_seconds(conns, gc, tasks[r["task_id"]], r["final_sql"])
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
    return bare_total, bare_slow, slow_keys, is_slow, floor, floor_fast, compare


def _bare_part(items: list[tuple[str, str]]) -> float:
    """CPU seconds of executing `items` bare, each once, in this (fresh) process, on connections opened
    untimed as the floor's are: first touch of every page, as in a sandbox worker."""
    conns: dict = {}
    for db, _ in items:
        if db not in conns:
            bare_exec(conns, db, "SELECT 1")
    t0 = time.process_time()
    for db, sql in items:
        bare_exec(conns, db, sql, TIMEOUT_S)
    return time.process_time() - t0


def bare_split(calls: list[list], tasks: dict, workers: int) -> tuple[float, float]:
    """CPU seconds of the calls' distinct predictions executed bare (1) in one fresh process and (2) dealt
    strided over `workers` fresh processes at once, as the sandbox deals them: what splitting the same
    executions over processes with their own connections and page caches costs, before any IPC."""
    parts: list[list] = [[] for _ in range(workers)]
    everything: list = []
    for call in calls:
        d = list(dict.fromkeys((tasks[r["task_id"]].public.db_path, r["final_sql"]) for r in call))
        everything += d
        for k in range(workers):
            parts[k] += d[k::workers]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as ex:
        one = ex.submit(_bare_part, everything).result()
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as ex:
        split = sum(ex.map(_bare_part, parts))
    return one, split


class _InProcessSandbox:
    """A sandbox whose `execute_scored` runs the workers' code (`score_batch`) in this process on the
    batches the sandbox would send (marshalled both ways, gold payloads shipped once, one connection per
    database kept); `record` keeps each batch and its answer."""

    max_rows = MAX_ROWS

    def __init__(self, cfg: dict) -> None:
        self.cfg, self.record = cfg, []
        self.conns, self.deadline, self.refs, self.scorers = OrderedDict(), Deadline(), {}, {}

    def execute_scored(self, items, refs, scorer, options=None, timeout_s=None):
        t = TIMEOUT_S if timeout_s is None else float(timeout_s)
        todo = [(os.path.abspath(it[0]), it[1], t, tuple(it[2]), it[3], None) for it in items]
        adds = {k: refs[k][1] for it in todo for k in it[3] if k not in self.refs}
        batch = marshal.dumps(("score", scorer, options, [], adds, todo, 0))
        out = _Sink()
        score_batch(
            out, self.cfg, self.conns, self.deadline, [0.0] * 3, self.refs, self.scorers, marshal.loads(batch)
        )
        self.record.append((batch, out.data))
        return marshal.loads(out.data)


class _Sink:
    def send_bytes(self, data: bytes) -> None:
        self.data = data


def breakdown(calls: list[list], tasks: dict, gc, kind: str, reps: int = 3) -> dict:
    """CPU seconds (process_time, best of `reps`) of the fast part's stages, each in this one process
    with nothing else to wait for: the floor's bare executions (each distinct prediction of a call,
    `bare_exec`); the workers' code on the batches ours sends (pre-check, hardened connection, caps,
    comparison, parts, marshalling: `score_batch`); the parent's code (`Evaluator.score_many` with
    the workers' answers replayed). What the real run spends beyond the last two is IPC, waking
    processes and sharing the cores."""
    with Sandbox(workers=1) as sb:
        sandbox_cfg = dict(sb._cfg)  # the sandbox's own limits
    inproc = _InProcessSandbox(sandbox_cfg)
    ev = Evaluator(inproc, gc, kind=kind, test_suite=False)
    for call in calls:  # golds and cuts fetched, connections opened, batches recorded: untimed
        ev.prefetch([tasks[r["task_id"]] for r in call])
        ev.score_many([(r["final_sql"], tasks[r["task_id"]]) for r in call])
    recorded = list(inproc.record)
    conns: dict = {}
    distinct = [
        list(dict.fromkeys((tasks[r["task_id"]].public.db_path, r["final_sql"]) for r in call))
        for call in calls
    ]
    for d in distinct:
        for db, sql in d:
            bare_exec(conns, db, sql, TIMEOUT_S)

    def bare() -> None:
        for d in distinct:
            for db, sql in d:
                bare_exec(conns, db, sql, TIMEOUT_S)

    def workers() -> None:
        refs: dict = {}  # as a fresh worker's: each batch adds the payloads it was recorded adding
        for batch, _ in recorded:
            score_batch(
                _Sink(),
                sandbox_cfg,
                inproc.conns,
                inproc.deadline,
                [0.0] * 3,
                refs,
                inproc.scorers,
                marshal.loads(batch),
            )

    def parent() -> None:
        e = Evaluator(_Replay(iter([a for _, a in recorded])), gc, kind=kind, test_suite=False)
        for call in calls:
            e.score_many([(r["final_sql"], tasks[r["task_id"]]) for r in call])

    best = {}
    for _ in range(reps):
        for name, fn in (("bare", bare), ("workers", workers), ("parent", parent)):
            t0 = time.process_time()
            fn()
            best[name] = min(best.get(name, 1e9), time.process_time() - t0)
    for c in conns.values():
        c.close()
    for _, c in inproc.conns.values():
        c.close()
    return best


class _Replay:
    """A sandbox answering `execute_scored` calls with recorded answers, in order."""

    max_rows = MAX_ROWS

    def __init__(self, answers) -> None:
        self.answers = answers

    def execute_scored(self, items, refs, scorer, options=None, timeout_s=None):
        return marshal.loads(next(self.answers))


def measure_arm(args, gc, tasks: dict, calls: list[list], kind: str, n_arm: int) -> tuple[dict, dict]:
    """One arm's stream through the floor, the naive and ours (whole stream, then the fast part only):
    its figures, and the unrounded times the printout and the totals use."""
    pairs = [r for c in calls for r in c]
    bare_total, bare_slow, slow_keys, is_slow, floor, floor_fast, compare = bare_floor(
        calls, tasks, args.slow_ms, args.workers, gc
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
    bd = breakdown(fast_calls, tasks, gc, kind)
    bd["bare_one_process"], bd["bare_split"] = bare_split(fast_calls, tasks, args.workers)
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
            "floor_us_per_pair": round(floor_fast / n_fast * 1e6, 1),
            "bare_us_per_pair": round((bare_total - bare_slow) / n_fast * 1e6, 1),
            "compare_us_per_pair": round(compare / n_fast * 1e6, 1),
            "cpu_one_process_us_per_pair": {k: round(v / n_fast * 1e6, 1) for k, v in bd.items()},
            "bound_of_floor_one_process": round(bd["bare"] / (bd["workers"] + bd["parent"]), 2),
            "bare_split_over_one_process": round(bd["bare_split"] / bd["bare_one_process"], 2),
            "of_floor_plus_compare": round((floor_fast + compare / args.workers) / got["fast"]["total"], 2),
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
        "compare": compare,
        "breakdown": bd,
    }
    return res, exact


def print_arm(arm: str, res: dict, exact: dict, args) -> None:
    n_fast = res["fast_part"]["pairs"]
    fp = res["fast_part"]
    cpu = fp["cpu_one_process_us_per_pair"]
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
        f"    floor {fp['floor_us_per_pair']} us/pair (bare execution {fp['bare_us_per_pair']} us/pair over "
        f"{args.workers} workers); the comparison with the gold, which every scorer makes and the floor "
        f"leaves out: {fp['compare_us_per_pair']} us/pair; of the floor plus it {fp['of_floor_plus_compare']}\n"
        f"    CPU per pair, each part alone in one process (best of 3): bare executions {cpu['bare']}, the "
        f"workers' code {cpu['workers']}, the parent's {cpu['parent']}: with no IPC, no waiting and "
        f"perfect sharing of the cores ours would reach {fp['bound_of_floor_one_process']} of the floor\n"
        f"    the same bare executions, first touch, in one fresh process {cpu['bare_one_process']} us/pair of "
        f"CPU, dealt over {args.workers} at once {cpu['bare_split']} "
        f"({fp['bare_split_over_one_process']}x: own connections and page caches per process)\n"
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
            "of_floor_plus_compare": round(
                (t["fast_floor_s"] + t["fast_compare_s"] / workers) / t["fast_ours_s"], 2
            ),
            "cpu_one_process_us_per_pair": {
                k: round(t[f"fast_cpu_{k}"] / t["fast_pairs"] * 1e6, 1)
                for k in ("bare", "workers", "parent", "bare_one_process", "bare_split")
            },
            "bare_split_over_one_process": round(
                t["fast_cpu_bare_split"] / t["fast_cpu_bare_one_process"], 2
            ),
            "bound_of_floor_one_process": round(
                t["fast_cpu_bare"] / (t["fast_cpu_workers"] + t["fast_cpu_parent"]), 2
            ),
        },
    }


if __name__ == "__main__":
    sys.exit(main())
