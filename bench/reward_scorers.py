"""The scorers the reward benchmarks compare, and their timing and CPU accounting.

Shared by bench_reward.py and bench_reward_stream.py:
- `naive_score`: per pair, open a read-only sqlite3 connection, run the gold, run the prediction,
  compare with the same `execution_match`, close (no sandbox, no cache, no test-suite metric);
- `time_ours` / `time_naive`: wall time of `Evaluator.score_many` (in batches) and of the naive;
- the floor analysis: `naive_parts` (each naive step timed), `bare_exec` (an execution on an open
  connection, nothing else), `hardened_exec` (the sandbox worker's execution path in this process),
  `floor_round` (one round's pairs through all three) and `floor_summary`;
- `cpu_snapshot` / `cpu_delta`: CPU seconds of this process and of a sandbox's workers (Linux).
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import time

from sqlrl.reward.evaluator import Evaluator
from sqlrl.reward.match import execution_match
from sqlrl.reward.shape import gold_shape, remove_distinct


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
    """Seconds to run `sql` as a sandbox worker does (pre-check, then `run_one`: the hardened read-only
    connection with authorizer, setlimits, progress-handler deadline, capped fetch), but in this process:
    no IPC, no scoring, no process-level memory limits. `hard` holds the worker state: {"conns",
    "cfg", "deadline"}; each database is opened untimed on first use, as `bare_exec` does."""
    from sqlrl.sql.engine import run_one
    from sqlrl.sql.guard import check_statement
    from sqlrl.sql.result import SQLResult

    conns, cfg, deadline = hard["conns"], hard["cfg"], hard["deadline"]
    if db_path not in conns:
        run_one(conns, cfg, deadline, db_path, "SELECT * FROM sqlite_master", 5.0)
    t0 = time.perf_counter()
    pre = check_statement(sql or "", cfg["max_sql_chars"])
    ok = False
    if not isinstance(pre, SQLResult):
        ok = run_one(conns, cfg, deadline, db_path, pre, 5.0)[0] == "ok"
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


def floor_summary(floor: dict) -> dict | None:
    """Per-pair figures of a workload's floor analysis (None when it was skipped)."""
    if not floor:
        return None
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
    return fl
