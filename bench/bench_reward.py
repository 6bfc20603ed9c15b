"""Reward throughput: prediction/gold pairs per second with a warm gold cache, vs a naive scorer.

    python bench/bench_reward.py [--data ../shared/data/spider] [--rounds 5] [--rounds-c 15]
        [--tasks-a 150] [--tasks-b 32] [--group 8] [--batch 256] [--seed 0] [--workers 2]

Three workloads, each measured in rounds; in (a) and (b) every round uses tasks no other round (and no
warm-up) used, so neither the Evaluator's memo nor SQLite's per-connection statement cache carries
over from an earlier round; the scorers take turns inside a round (who goes first alternates), and
ours with and without the memo use separate sandboxes (no shared statement cache).
Ours is measured twice in every round, on the same pairs and against the same naive timing:
- COLD: a fresh sandbox (and one for de-duplication off) every round, its workers started and each
  database of the round opened once per worker (`SELECT 1`) before timing: schemas not yet read,
  nothing prepared, no gold shipped to a worker.
- STEADY: one sandbox (and one for de-duplication off) kept for all rounds, as in a training run
  (one Sandbox + Evaluator scores every step), warmed up by an untimed round first (a training run's
  first step). In (a) and (b) each round still brings new tasks, golds and SQL. In (c) the pairs are
  the same every round, so each round's prediction texts get their own number of trailing blanks
  (r + 1 in round r, none in the warm-up; for every scorer alike): no statement is found already
  prepared in a worker's statement cache, as in training, where each step brings new model SQL.
  Trailing blanks change no verdict and no de-duplication (checked: rewards cold == steady).
(a) all-distinct: per task the gold itself and one perturbation of it (projection list reversed,
    DISTINCT toggled, ORDER BY direction flipped, or wrapped with LIMIT 1); pairs are de-duplicated by
    (database, SQL text), so no prediction repeats: the worst case for memoization.
(b) GRPO-shaped: `--tasks-b` tasks x `--group` samples (one training step of 32 x 8 by default).
    Which samples repeat an earlier sample's SQL exactly is copied from real GRPO training rollouts
    (`results/2026-11-29-spider-0.5b-single-turn/arms/*/train/rollouts.jsonl.gz`: Qwen2.5-Coder-0.5B,
    T = 1, groups of 8; the trainer logged the first 4 samples of one group per step). Each synthetic
    group takes the repeat pattern of one logged group for its first 4 samples; samples 5-8 are all
    new SQL (the logs do not show them), so duplicates are a LOWER bound of what the real groups had.
    The distinct SQL texts of a task are the gold, its perturbations and LIMIT-wrapped variants.
(c) the logged rollouts themselves: the model's real final SQL (144 samples: 36 groups x the 4 logged
    samples, 12 Spider tasks), the same pairs every round (see STEADY below for the statement cache);
    each arm is its own training run, so ours gets one Evaluator per arm (no memo shared between arms).

Scorers, on the same pairs:
- ours: a fresh `Evaluator(Sandbox, GoldCache)` per round and run, golds (and their DISTINCT-free
  variants) already in the gold cache; `score_many` in batches of `--batch` pairs, as the trainer
  calls it; each pair is scored inside the hardened sandbox's workers (prediction, variant and
  comparisons there, golds shipped from the gold cache). The Evaluator keeps nothing between calls
  (the cross-call memo was removed); a deterministic pair repeated within one call is scored once.
  Also timed with that de-duplication off (`memo_entries=0`), and both must give identical rewards
  (`Reward.to_dict()`), checked here.
- naive: per pair, open a read-only sqlite3 connection, run the gold, run the prediction, compare with
  the same `execution_match`, close. No sandbox, no cache, no test-suite metric.
Printed: median pairs/s over the rounds for each, the ratio of medians and the per-round range, the
verdict agreement (ours match == naive match wherever ours did not time out) and de-duplication counts.
Where STEADY's time goes (Linux): CPU seconds per pair of the bench process (the Evaluator's parent side)
and of the sandbox workers (summed over them, from /proc/PID/schedstat), over all rounds; on two cores the
wall time per pair cannot be below half their sum.
Every gold's shape (`gold_shape`, a sqlglot parse) is computed before the rounds, as part of the cached
gold, for both scorers (before, whichever scorer went first in a round paid for it).

Floor (after each round, one process, skip with `--no-floor`): the naive steps timed one by one
(connect, gold, pred, compare, close; mean us per pair over all rounds), and the executions ours cannot
avoid, run bare on already-open read-only connections without statement cache, sandbox, limits or IPC:
each distinct prediction of a run and, where it executed and contains DISTINCT, its DISTINCT-free
variant (the test-suite metric). "best ratio possible" = naive per pair / (bare per pair / 2 cores).
The same executions are also timed through the sandbox's hardened path in this process
(`hardened_exec`: pre-check + `_run_one`, the worker's code without IPC or scoring): the best ratio
possible while keeping the hardening, with every other cost (IPC, scoring, the parent) at zero.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import random
import sqlite3
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import sqlglot
from sqlglot import exp

from sqlrl.reward.evaluator import Evaluator
from sqlrl.reward.match import execution_match
from sqlrl.reward.shape import gold_shape, remove_distinct
from sqlrl.sql.sandbox import Sandbox
from sqlrl.tasks.data import PrivateTask, PublicTask
from sqlrl.tasks.goldcache import GoldCache

ROOT = Path(__file__).resolve().parents[1]
ROLLOUTS = "results/2026-11-29-spider-0.5b-single-turn/arms/*/train/rollouts.jsonl.gz"


def perturb(sql: str, i: int) -> str:
    try:
        node = sqlglot.parse_one(sql, read="sqlite")
    except Exception:
        return sql + " LIMIT 1"
    kind = i % 4
    if kind == 0 and isinstance(node, exp.Select) and len(node.expressions) > 1:
        node.set("expressions", list(reversed(node.expressions)))
        return node.sql(dialect="sqlite")
    if kind == 1 and isinstance(node, exp.Select):
        node.set("distinct", None if node.args.get("distinct") else exp.Distinct())
        return node.sql(dialect="sqlite")
    if kind == 2 and node.args.get("order") is not None:
        for o in node.args["order"].expressions:
            o.set("desc", not o.args.get("desc"))
        return node.sql(dialect="sqlite")
    return f"SELECT * FROM ({sql}) LIMIT 1"


def variants(gold: str, k: int) -> list[str]:
    """`k` distinct SQL texts for one task: the gold, its perturbations, then LIMIT-wrapped variants."""
    out = list(dict.fromkeys([gold] + [perturb(gold, j) for j in range(4)]))
    m = 2
    while len(out) < k:
        v = f"SELECT * FROM ({gold}) LIMIT {m}"
        if v not in out:
            out.append(v)
        m += 1
    return out[:k]


def _deadline(con: sqlite3.Connection, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    con.set_progress_handler(lambda: time.monotonic() > end, 10_000)


def naive_score(
    db_path: str, gold_sql: str, pred_sql: str | None, timeout_s: float | None = None
) -> bool | None:
    """The naive scorer. `timeout_s`: a statement deadline (progress handler) for gold and prediction,
    and None when the prediction ran past it (bench_reward_stream.py: real model SQL can run forever);
    None (the workloads here): no deadline."""
    pred_sql = pred_sql or ""
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        if timeout_s:
            _deadline(con, timeout_s)
        cur = con.execute(gold_sql)
        g_rows, g_cols = cur.fetchall(), [d[0] for d in cur.description or []]
        if timeout_s:
            _deadline(con, timeout_s)
        try:
            cur = con.execute(pred_sql)
            p_rows, p_cols = cur.fetchall(), [d[0] for d in cur.description or []]
        except sqlite3.Error as e:
            return None if timeout_s and str(e) == "interrupted" else False
        return execution_match(g_cols, g_rows, p_cols, p_rows, gold_shape(gold_sql)).match
    finally:
        con.close()


def naive_parts(db_path: str, gold_sql: str, pred_sql: str | None, t: dict) -> None:
    """`naive_score` with each step timed into `t` (seconds): connect, gold, pred, compare, close.
    Used only for the floor analysis, never for the naive figures."""
    pc = time.perf_counter
    t0 = pc()
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    t1 = pc()
    try:
        cur = con.execute(gold_sql)
        g_rows, g_cols = cur.fetchall(), [d[0] for d in cur.description or []]
        t2 = pc()
        try:
            cur = con.execute(pred_sql or "")
            p_rows, p_cols = cur.fetchall(), [d[0] for d in cur.description or []]
            ok = True
        except sqlite3.Error:
            ok = False
        t3 = pc()
        if ok:
            execution_match(g_cols, g_rows, p_cols, p_rows, gold_shape(gold_sql))
        t4 = pc()
    finally:
        con.close()
    t5 = pc()
    for k, a, b in (
        ("connect", t0, t1),
        ("gold", t1, t2),
        ("pred", t2, t3),
        ("compare", t3, t4),
        ("close", t4, t5),
    ):
        t[k] = t.get(k, 0.0) + (b - a)


def bare_exec(
    conns: dict, db_path: str, sql: str | None, timeout_s: float | None = None
) -> tuple[float, bool]:
    """Seconds to execute and fetch `sql` on an already-open read-only connection to `db_path` (no
    sandbox, no limits, no IPC), and whether it executed. `timeout_s`: a statement deadline, as in
    `naive_score` (None here: none)."""
    con = conns.get(db_path)
    if con is None:
        # no statement cache: every round's SQL is prepared anew, as in the sandbox's fresh statements
        con = sqlite3.connect(f"file:{db_path}?mode=ro&immutable=1", uri=True, cached_statements=0)
        conns[db_path] = con
        con.execute("SELECT * FROM sqlite_master").fetchall()
    if timeout_s:
        _deadline(con, timeout_s)
    t0 = time.perf_counter()
    try:
        con.execute(sql or "").fetchall()
        ok = True
    except (sqlite3.Error, ValueError):
        ok = False
    return time.perf_counter() - t0, ok


def hardened_exec(hard: dict, db_path: str, sql: str | None) -> tuple[float, bool]:
    """Seconds to run `sql` as a sandbox worker does (pre-check, then `_run_one`: the hardened read-only
    connection with authorizer, setlimits, progress-handler deadline, capped fetch), but in this process:
    no IPC, no scoring, no process-level memory limits. `hard` holds the worker state: {"conns",
    "cfg", "deadline"}; each database is opened untimed on first use, as `bare_exec` does."""
    from sqlrl.sql.sandbox import SQLResult, _precheck, _run_one

    conns, cfg, deadline = hard["conns"], hard["cfg"], hard["deadline"]
    if db_path not in conns:
        _run_one(conns, cfg, deadline, db_path, "SELECT * FROM sqlite_master", 5.0)
    t0 = time.perf_counter()
    pre = _precheck(sql or "", cfg["max_sql_chars"])
    ok = False
    if not isinstance(pre, SQLResult):
        ok = _run_one(conns, cfg, deadline, db_path, pre, 5.0)[0] == "ok"
    return time.perf_counter() - t0, ok


def floor_round(
    pairs, conns: dict, floor: dict, runs: list[int] | None = None, hard: dict | None = None
) -> None:
    """Single-process costs of one round's pairs for the floor analysis: the naive steps, and the bare
    executions that ours cannot avoid: each distinct prediction and, where it executed and contains
    DISTINCT, its DISTINCT-free variant (the test-suite metric), on warm open connections."""
    t: dict = floor.setdefault("naive", {})
    for task, p in pairs:
        naive_parts(task.public.db_path, task.gold_sql, p, t)
    seen: set = set()
    ends = set(itertools.accumulate(runs or [len(pairs)]))
    for n, (task, p) in enumerate(pairs):
        if n in ends:  # a new training run: nothing shared with the previous one
            seen = set()
        key = (task.public.db_path, p)
        if key in seen:
            continue
        seen.add(key)
        dt, ok = bare_exec(conns, task.public.db_path, p)
        floor["pred"] = floor.get("pred", 0.0) + dt
        if hard is not None:
            floor["hard"] = floor.get("hard", 0.0) + hardened_exec(hard, task.public.db_path, p)[0]
        v = remove_distinct(p) if (ok and p) else p
        if ok and v != p and (task.public.db_path, v) not in seen:
            seen.add((task.public.db_path, v))
            floor["variant"] = floor.get("variant", 0.0) + bare_exec(conns, task.public.db_path, v)[0]
            if hard is not None:
                floor["hard"] = floor.get("hard", 0.0) + hardened_exec(hard, task.public.db_path, v)[0]
    floor["pairs"] = floor.get("pairs", 0) + len(pairs)


def duplicate_patterns(root: Path) -> tuple[list[list[int]], dict]:
    """Per logged GRPO group: for each sample (in sample order), the index of the first sample with the
    exact same final SQL. Plus a summary of the evidence."""
    groups: dict[tuple, list[tuple[int, str]]] = defaultdict(list)
    files = sorted(root.glob(ROLLOUTS))
    for f in files:
        arm = f.parts[-3]
        with gzip.open(f, "rt") as fh:
            for line in fh:
                d = json.loads(line)
                groups[(arm, d["step"], d["task_id"])].append((int(d["sample"]), d.get("final_sql") or ""))
    patterns = []
    for key in sorted(groups):
        sqls = [s for _, s in sorted(groups[key])]
        patterns.append([sqls.index(s) for s in sqls])
    samples = sum(len(p) for p in patterns)
    distinct = sum(len(set(p)) for p in patterns)
    info = {
        "files": [str(f.relative_to(root)) for f in files],
        "groups": len(patterns),
        "samples": samples,
        "distinct": distinct,
        "group_sizes": sorted({len(p) for p in patterns}),
    }
    return patterns, info


def logged_rollouts(root: Path, data: str) -> list[tuple[str, PrivateTask, str | None]]:
    """The logged GRPO rollouts: (arm, task, the model's final SQL), in (arm, step, sample) order."""
    examples = json.load(open(os.path.join(data, "train_spider.json")))
    rows = []
    for f in sorted(root.glob(ROLLOUTS)):
        with gzip.open(f, "rt") as fh:
            for line in fh:
                d = json.loads(line)
                i = int(d["task_id"].split("/")[1])
                e = examples[i]
                db = os.path.abspath(os.path.join(data, "database", e["db_id"], e["db_id"] + ".sqlite"))
                pub = PublicTask(d["task_id"], e["db_id"], e["question"], "", "", db)
                rows.append(
                    ((f.parts[-3], d["step"], d["sample"]), PrivateTask(pub, e["query"]), d["final_sql"])
                )
    return [(key[0], t, sql) for key, t, sql in sorted(rows, key=lambda r: r[0])]


def load_tasks(data: str, seed: int) -> list[PrivateTask]:
    examples = json.load(open(os.path.join(data, "train_spider.json")))
    idx = list(range(len(examples)))
    random.Random(seed).shuffle(idx)
    tasks = []
    for i in idx:
        e = examples[i]
        db = os.path.join(data, "database", e["db_id"], e["db_id"] + ".sqlite")
        if os.path.isfile(db):
            pub = PublicTask(f"train_spider/{i:05d}", e["db_id"], e["question"], "", "", os.path.abspath(db))
            tasks.append(PrivateTask(pub, e["query"]))
    return tasks


def time_ours(sb, gc, pairs, batch: int, runs: list[int] | None = None, **kw) -> tuple[float, list, dict]:
    """`runs`: sizes of consecutive slices of `pairs` that are separate training runs (one Evaluator
    each, so nothing is memoized across them); default one run."""
    t0 = time.perf_counter()
    out: list = []
    start = 0
    for size in runs or [len(pairs)]:
        ev = Evaluator(sb, gc, **kw)
        part = pairs[start : start + size]
        start += size
        for b in range(0, len(part), batch):
            out += ev.score_many([(p, t) for t, p in part[b : b + batch]])
    return time.perf_counter() - t0, out, ev.memo_stats()


def _proc_cpu_s(pid: int) -> float | None:
    """CPU seconds of process `pid` (its main thread; the workers have no others): /proc/PID/schedstat's
    time on the CPU (nanoseconds), else /proc/PID/stat's user + system ticks (10 ms resolution); None
    elsewhere or when the process is gone."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def cpu_snapshot(sb) -> tuple[float, dict]:
    """(this process's CPU seconds, {worker pid: its CPU seconds}) for `sb`'s live workers."""
    pids = [w.proc.pid for w in getattr(sb, "_all", []) if getattr(w, "proc", None) is not None]
    return time.process_time(), {p: c for p in pids if (c := _proc_cpu_s(p)) is not None}


def cpu_delta(sb, before: tuple[float, dict]) -> tuple[float, float]:
    """(parent CPU seconds, workers' CPU seconds) since `before`; workers respawned meanwhile are not
    counted (their pids changed)."""
    parent = time.process_time() - before[0]
    after = cpu_snapshot(sb)[1]
    return parent, sum(after[p] - c for p, c in before[1].items() if p in after)


def time_naive(pairs) -> tuple[float, list]:
    t0 = time.perf_counter()
    out = [naive_score(t.public.db_path, t.gold_sql, p) for t, p in pairs]
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "spider"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rounds-c", type=int, default=15, help="rounds for (c), which is small (144 pairs)")
    ap.add_argument("--tasks-a", type=int, default=150, help="tasks per round, workload (a)")
    ap.add_argument("--tasks-b", type=int, default=32, help="tasks (groups) per round, workload (b)")
    ap.add_argument("--group", type=int, default=8, help="samples per task, workload (b)")
    ap.add_argument("--batch", type=int, default=256, help="pairs per score_many call")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-floor", action="store_true", help="skip the single-process floor analysis")
    args = ap.parse_args(argv)

    patterns, evidence = duplicate_patterns(ROOT)
    if not patterns:
        print(f"no GRPO rollouts found under {ROOT / ROLLOUTS}", file=sys.stderr)
        return 2
    all_tasks = load_tasks(args.data, args.seed)
    rng = random.Random(args.seed)
    rng.shuffle(patterns)

    # one sandbox per scorer: a statement prepared by one scorer's run must not be found in SQLite's
    # statement cache by the other's (its connections stay open and warm, as in training)
    with (
        Sandbox(workers=args.workers) as sb,
        Sandbox(workers=args.workers) as sb_off,
        GoldCache(workers=args.workers) as gc,
    ):
        # golds that execute; their results and DISTINCT-free variants go into the gold cache now
        golds = gc.get_many([(t.public.db_path, t.gold_sql) for t in all_tasks], progress=False)
        tasks = [t for t, g in zip(all_tasks, golds) if g.scorable]
        gc.get_many([(t.public.db_path, remove_distinct(t.gold_sql)) for t in tasks], progress=False)
        excluded = len(all_tasks) - len(tasks)
        # the gold's shape (sqlglot parse: top-level ORDER BY, LIMIT, sort keys) is part of the cached
        # gold for both scorers: parsed here, once per gold, so neither scorer pays for it in a round
        # (before, whichever scorer went first in a round parsed it and the others got a cache hit)
        for t in tasks:
            gold_shape(t.gold_sql)
        pos = 0

        def take(n: int) -> list[PrivateTask]:
            nonlocal pos
            got = tasks[pos : pos + n]
            pos += n
            if len(got) < n:
                raise SystemExit("not enough Spider tasks for these --rounds/--tasks-*")
            return got

        def workload_a(ts: list[PrivateTask]) -> list:
            seen, pairs = set(), []
            for k, t in enumerate(ts):
                for p in (t.gold_sql, perturb(t.gold_sql, k)):
                    if (t.public.db_path, p) not in seen:
                        seen.add((t.public.db_path, p))
                        pairs.append((t, p))
            return pairs

        pat_i = 0

        def workload_b(ts: list[PrivateTask]) -> list:
            nonlocal pat_i
            pairs = []
            for t in ts:
                pat = patterns[pat_i % len(patterns)]
                pat_i += 1
                slots = pat[: args.group] + list(range(len(pat), args.group))  # samples 5..8: new SQL
                texts = variants(t.gold_sql, args.group)
                first = {s: j for j, s in enumerate(dict.fromkeys(slots))}
                pairs += [(t, texts[first[s]]) for s in slots]
            return pairs

        # warm-up on tasks no measured round uses: sandbox workers up, connections and page cache warm
        warm = workload_a(take(32))
        time_ours(sb, gc, warm, args.batch)
        time_ours(sb_off, gc, warm, args.batch, memo_entries=0)
        time_naive(warm)

        logged = logged_rollouts(ROOT, args.data)
        real_golds = gc.get_many([(t.public.db_path, t.gold_sql) for _, t, _ in logged], progress=False)
        logged = [x for x, g in zip(logged, real_golds) if g.scorable]
        real = [(t, p) for _, t, p in logged]
        arms = list(dict.fromkeys(a for a, _, _ in logged))
        real_runs = [sum(1 for a, _, _ in logged if a == arm) for arm in arms]  # one Evaluator per arm
        gc.get_many([(t.public.db_path, remove_distinct(t.gold_sql)) for t, _ in real], progress=False)
        for t, _ in real:
            gold_shape(t.gold_sql)
        floor_conns: dict = {}
        from collections import OrderedDict

        from sqlrl.sql.sandbox import _Deadline

        floor_hard = {"conns": OrderedDict(), "cfg": dict(sb._cfg), "deadline": _Deadline()}

        def workload_c(_: list) -> list:
            return list(real)

        def fresh_sandbox(pairs: list) -> Sandbox:
            """A cold sandbox: workers started and each database of the round opened once per worker
            (SELECT 1: no schema read, no statement prepared, no gold shipped), nothing else warm."""
            s = Sandbox(workers=args.workers)
            dbs = sorted({t.public.db_path for t, _ in pairs})
            s.execute_many([(db, "SELECT 1") for db in dbs for _ in range(args.workers)])
            return s

        results = {}
        for name, make, n_tasks in (
            ("a", workload_a, args.tasks_a),
            ("b", workload_b, args.tasks_b),
            ("c", workload_c, 0),
        ):
            n_rounds = args.rounds_c if name == "c" else args.rounds
            if name == "c":
                # steady state for (c): one pair of sandboxes for all its rounds, warmed up by one
                # untimed round of the same pairs (a training run's first step). Every round's SQL
                # gets its own trailing blanks (r + 1 of them; the warm-up round none), for every
                # scorer alike, so no round finds its statements already prepared in a worker's
                # statement cache (a training step brings new model SQL); verdicts do not change.
                steady = (Sandbox(workers=args.workers), Sandbox(workers=args.workers))
                warm_pairs = workload_c([])
                time_ours(steady[0], gc, warm_pairs, args.batch, real_runs)
                time_ours(steady[1], gc, warm_pairs, args.batch, real_runs, memo_entries=0)
            else:
                steady = (sb, sb_off)  # warmed up above on tasks no round uses
            rows = defaultdict(list)
            agree = {"cold": 0, "steady": 0}
            total = {"cold": 0, "steady": 0}
            identical = {"cold": 0, "steady": 0}
            cold_eq_steady = 0
            memo = {}
            n_pairs = distinct = 0
            floor: dict = {}
            cpu = {"parent": 0.0, "workers": 0.0, "wall": 0.0, "pairs": 0}
            for r in range(n_rounds):
                pairs = make(take(n_tasks))
                if name == "c":
                    pairs = [(t, p if p is None else p + " " * (r + 1)) for t, p in pairs]
                n_pairs += len(pairs)
                runs = real_runs if name == "c" else [len(pairs)]
                start = 0
                for size in runs:
                    distinct += len({(t.public.db_path, p) for t, p in pairs[start : start + size]})
                    start += size
                cold = (fresh_sandbox(pairs), fresh_sandbox(pairs))
                order = ["naive", "cold", "cold_off", "steady", "steady_off"]
                if r % 2:
                    order.reverse()
                got = {}
                for who in order:
                    if who == "naive":
                        dt, got[who] = time_naive(pairs)
                    else:
                        mode = who.split("_")[0]
                        off = who.endswith("_off")
                        s_ = (cold if mode == "cold" else steady)[1 if off else 0]
                        kw = {"memo_entries": 0} if off else {}
                        snap = cpu_snapshot(s_) if who == "steady" else None
                        dt, got[who], st_ = time_ours(s_, gc, pairs, args.batch, runs, **kw)
                        if snap is not None:  # where STEADY's time goes: CPU of the parent and the workers
                            par, wrk = cpu_delta(s_, snap)
                            cpu["parent"] += par
                            cpu["workers"] += wrk
                            cpu["wall"] += dt
                            cpu["pairs"] += len(pairs)
                        if not off:
                            memo[mode] = st_
                    rows[who].append(len(pairs) / dt)
                for s_ in cold:
                    s_.close()
                if not args.no_floor:
                    floor_round(pairs, floor_conns, floor, runs, floor_hard)
                for mode in ("cold", "steady"):
                    identical[mode] += sum(
                        a.to_dict() == b.to_dict() for a, b in zip(got[mode], got[mode + "_off"])
                    )
                    for rw, m in zip(got[mode], got["naive"]):
                        if rw.status in ("timeout", "infra_error", "gold_unscorable"):
                            continue
                        total[mode] += 1
                        agree[mode] += (rw.value == 1.0) == bool(m)
                cold_eq_steady += sum(a.to_dict() == b.to_dict() for a, b in zip(got["cold"], got["steady"]))
            if name == "c":
                for s_ in steady:
                    s_.close()
            med = {k: statistics.median(v) for k, v in rows.items()}
            fl = None
            if floor:
                us = {k: v / floor["pairs"] * 1e6 for k, v in floor["naive"].items()}
                naive_us = sum(us.values())
                bare = (floor.get("pred", 0.0) + floor.get("variant", 0.0)) / floor["pairs"] * 1e6
                fl = {
                    "naive_us_per_pair": round(naive_us, 1),
                    "naive_steps_us_per_pair": {k: round(v, 1) for k, v in us.items()},
                    "bare_pred_us_per_pair": round(floor.get("pred", 0.0) / floor["pairs"] * 1e6, 1),
                    "bare_variant_us_per_pair": round(floor.get("variant", 0.0) / floor["pairs"] * 1e6, 1),
                    "max_ratio_2_cores": round(naive_us / (bare / 2), 2) if bare > 0 else None,
                }
                hard_us = floor.get("hard", 0.0) / floor["pairs"] * 1e6
                if hard_us > 0:
                    fl["hardened_us_per_pair"] = round(hard_us, 1)
                    fl["max_ratio_2_cores_hardened"] = round(naive_us / (hard_us / 2), 2)
            res = {
                "rounds": n_rounds,
                "pairs_per_round": n_pairs // n_rounds,
                "distinct_sql_share": round(distinct / n_pairs, 3),
                "naive_pairs_per_s": round(med["naive"], 1),
                "floor": fl,
                "cold_equals_steady": f"{cold_eq_steady}/{n_pairs}",
                # STEADY (de-duplication on), all rounds: CPU per pair of the bench process (the parent)
                # and of the sandbox workers (summed, /proc/PID/schedstat), and wall time
                "steady_cpu_us_per_pair": {
                    k: round(cpu[k] / cpu["pairs"] * 1e6, 1) for k in ("parent", "workers", "wall")
                }
                if cpu["pairs"]
                else None,
            }
            for mode in ("cold", "steady"):
                per_round = [o / n for o, n in zip(rows[mode], rows["naive"])]
                res[mode] = {
                    "ours_pairs_per_s": round(med[mode], 1),
                    "ours_memo_off_pairs_per_s": round(med[mode + "_off"], 1),
                    "ratio": round(med[mode] / med["naive"], 2),
                    "ratio_memo_off": round(med[mode + "_off"] / med["naive"], 2),
                    "ratio_per_round_min_max": [round(min(per_round), 2), round(max(per_round), 2)],
                    "memo_on_equals_memo_off": f"{identical[mode]}/{n_pairs}",
                    "verdict_agreement_with_naive": f"{agree[mode]}/{total[mode]}",
                    "memo_last_round": {
                        "duplicate_hits": memo[mode]["duplicate_hits"],
                        "sandbox_executions": memo[mode]["executions"],
                    },
                }
            results[name] = res

    out = {
        "evidence_for_b": {
            **evidence,
            "logged_samples_repeating_an_earlier_one": evidence["samples"] - evidence["distinct"],
            "assumed_for_samples_5_to_8": "all new SQL (lower bound on duplicates)",
        },
        "tasks_excluded_unscorable_gold": excluded,
        "rounds": args.rounds,
        "rounds_c": args.rounds_c,
        "batch": args.batch,
        "workers": args.workers,
        "cpu_count": os.cpu_count(),
        "workloads": results,
    }
    out["target_10x"] = {
        k: {m: ("met" if v[m]["ratio"] >= 10 else "NOT met") for m in ("cold", "steady")}
        for k, v in results.items()
    }
    if args.json:
        print(json.dumps(out))
        return 0
    ev = out["evidence_for_b"]
    print(
        f"evidence for (b): {ev['groups']} logged GRPO groups ({ev['samples']} samples, first 4 of 8 per "
        f"group) in {len(ev['files'])} files {ROLLOUTS}: {ev['distinct']} distinct SQL, "
        f"{ev['logged_samples_repeating_an_earlier_one']} samples repeat an earlier one exactly; "
        "samples 5-8 of each group assumed all new (lower bound on duplicates)"
    )
    print(
        f"rounds {args.rounds} ((c): {args.rounds_c}; medians shown), batch {args.batch} pairs per score_many, "
        f"{args.workers} sandbox workers, {os.cpu_count()} CPUs, "
        f"{excluded} tasks skipped (unscorable gold)"
    )
    print(
        "two measurements of ours on the same pairs in every round, against the same naive timing:\n"
        "  COLD:   a fresh sandbox every round (workers started and each database opened once per worker\n"
        "          before timing; schemas unread, no statement prepared, no gold shipped)\n"
        "  STEADY: one sandbox for all rounds, as in a training run (one Sandbox + Evaluator per run),\n"
        "          warmed up by an untimed round; (a)/(b): every round has new tasks, hence new golds\n"
        "          and new SQL; (c): the same pairs every round, each round's SQL with its own trailing\n"
        "          blanks so no statement is found already prepared"
    )
    labels = {
        "a": "(a) all-distinct predictions",
        "b": f"(b) GRPO-shaped {args.tasks_b} tasks x {args.group}",
        "c": "(c) the logged rollouts themselves (real model SQL, 3 arms x 12 groups of 4)",
    }
    for k, v in results.items():
        print(
            f"\n{labels[k]}: {v['pairs_per_round']} pairs per round, {v['distinct_sql_share']:.1%} distinct (within a run)"
        )
        print(f"  {'naive (connect, gold, pred, compare)':<40} {v['naive_pairs_per_s']:>9.1f} pairs/s")
        for mode in ("cold", "steady"):
            m_ = v[mode]
            tag = mode.upper()
            lo, hi = m_["ratio_per_round_min_max"]
            mm = m_["memo_last_round"]
            for label, text in (
                ("ours  Evaluator.score_many", f"{m_['ours_pairs_per_s']:>9.1f} pairs/s"),
                ("ours  de-duplication off", f"{m_['ours_memo_off_pairs_per_s']:>9.1f} pairs/s"),
                (
                    "ratio ours / naive",
                    f"{m_['ratio']:>9.2f}x  (per round {lo}-{hi}x; de-duplication off "
                    f"{m_['ratio_memo_off']}x)  target 10x: {out['target_10x'][k][mode]}",
                ),
                ("rewards de-dup on == off", m_["memo_on_equals_memo_off"]),
                ("verdicts agree with naive", m_["verdict_agreement_with_naive"]),
                (
                    "de-duplication, last round",
                    f"{mm['duplicate_hits']} repeats answered from a pair scored in the same call, "
                    f"{mm['sandbox_executions']} sandbox executions",
                ),
            ):
                print(f"  {tag + ' ' + label:<40} {text}")
        print(f"  {'rewards cold == steady':<40} {v['cold_equals_steady']}")
        c_ = v.get("steady_cpu_us_per_pair")
        if c_:
            need = v["naive_pairs_per_s"] and 1e6 / v["naive_pairs_per_s"] / 10
            print(
                f"  {'STEADY CPU per pair, all rounds':<40} parent {c_['parent']:.0f} us + workers "
                f"{c_['workers']:.0f} us (both cores: wall >= {(c_['parent'] + c_['workers']) / 2:.0f} us); "
                f"measured wall {c_['wall']:.0f} us; 10x needs wall <= {need:.0f} us"
            )
        f = v["floor"]
        if f:
            st = f["naive_steps_us_per_pair"]
            print(
                f"  {'floor, one process, all rounds':<40} naive {f['naive_us_per_pair']:.0f} us/pair = "
                + " + ".join(f"{k} {st[k]:.0f}" for k in ("connect", "gold", "pred", "compare", "close"))
            )
            print(
                f"  {'':<40} bare execution on open connections "
                f"{f['bare_pred_us_per_pair'] + f['bare_variant_us_per_pair']:.0f} us/pair (distinct "
                f"predictions {f['bare_pred_us_per_pair']:.0f} + DISTINCT-free variants "
                f"{f['bare_variant_us_per_pair']:.0f})"
            )
            print(
                f"  {'':<40} best ratio possible on 2 cores (zero overhead, "
                f"perfect split) {f['max_ratio_2_cores']}x"
            )
            if f.get("hardened_us_per_pair"):
                print(
                    f"  {'':<40} the same executions through the sandbox's hardened path (pre-check, "
                    f"authorizer, limits, deadline, capped fetch; in one process, no IPC, no scoring) "
                    f"{f['hardened_us_per_pair']:.0f} us/pair: best ratio possible with it "
                    f"{f['max_ratio_2_cores_hardened']}x"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
