"""Benchmark: every gold query of Spider's train_spider.json through the sandbox vs raw sqlite3.

Raw: one read-only connection per database (same URI flags as the sandbox: mode=ro&immutable=1),
reused, in this process, `execute(sql).fetchall()` for every query. Sandbox: the same queries,
all rows fetched and shipped back to this process. Both sides run in the same run, after one
untimed raw pass that warms the OS file cache. Sandbox start-up (spawning the workers) is timed
separately and excluded from the ratio; connection opening is included on both sides.

    python bench/bench_sandbox.py [--spider DIR] [--limit N] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import time
import urllib.parse
from pathlib import Path

from sqlrl.sql.sandbox import Sandbox

DEFAULT_SPIDER = str(Path(__file__).resolve().parents[2] / "shared" / "data" / "spider")


def load(spider: str, limit: int | None) -> list[tuple[str, str]]:
    with open(os.path.join(spider, "train_spider.json")) as f:
        data = json.load(f)
    items = [(os.path.join(spider, "database", d["db_id"], d["db_id"] + ".sqlite"), d["query"]) for d in data]
    return items[:limit] if limit else items


def _proc_cpu(pid: int) -> float:
    """user+system CPU seconds of a live process (Linux /proc), 0.0 where unavailable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def run_raw(items: list[tuple[str, str]]) -> tuple[float, float, list[tuple[str, int]]]:
    conns: dict[str, sqlite3.Connection] = {}
    out = []
    c0 = time.process_time()
    t0 = time.perf_counter()
    for db, sql in items:
        c = conns.get(db)
        if c is None:
            uri = "file:" + urllib.parse.quote(os.path.abspath(db)) + "?mode=ro&immutable=1"
            c = conns[db] = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        try:
            rows = c.execute(sql).fetchall()
            out.append(("ok", len(rows)))
        except sqlite3.Error as e:
            out.append((f"error: {e}", 0))
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    for c in conns.values():
        c.close()
    return dt, cpu, out


def run_sandbox(items, workers: int, mode: str) -> tuple[float, float, float, list[tuple[str, int]]]:
    """(startup_s, wall_s, cpu_s of this process + the workers, [(status, row_count)])."""
    t0 = time.perf_counter()
    sb = Sandbox(workers=workers, timeout_s=30.0)
    # wait until every worker answers (spawn start-up), excluded from the timed part
    sb.execute_many([(items[0][0], "SELECT 1")] * workers * 4)
    startup = time.perf_counter() - t0
    pids = [w.proc.pid for w in sb._all]
    w0 = sum(_proc_cpu(p) for p in pids)
    c0 = time.process_time()
    t1 = time.perf_counter()
    if mode == "many":
        res = sb.execute_many(items)
    else:
        res = [sb.execute(db, sql) for db, sql in items]
    dt = time.perf_counter() - t1
    cpu = time.process_time() - c0 + sum(_proc_cpu(p) for p in pids) - w0
    kills, crashes = sb.kills, sb.crashes
    sb.close()
    assert kills == 0 and crashes == 0, "no worker may be killed or crash on gold queries"
    return startup, dt, cpu, [(r.status, r.row_count) for r in res]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spider", default=DEFAULT_SPIDER)
    p.add_argument("--limit", type=int, default=None, help="only the first N queries")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    a = p.parse_args(argv)
    items = load(a.spider, a.limit)
    print(f"{len(items)} gold queries over {len({db for db, _ in items})} databases; cpus={os.cpu_count()}")
    try:
        print(f"load average at start: {os.getloadavg()}")
    except OSError:
        pass
    run_raw(items)  # warm the OS file cache (untimed)

    configs = [
        ("raw", 0, ""),
        ("sandbox workers=1 execute_many", 1, "many"),
        ("sandbox workers=1 execute() loop", 1, "execute"),
        ("sandbox workers=2 execute_many", 2, "many"),
    ]
    walls: dict[str, list[float]] = {c[0]: [] for c in configs}
    cpus: dict[str, list[float]] = {c[0]: [] for c in configs}
    starts: dict[str, list[float]] = {c[0]: [] for c in configs}
    raw_out: list = []
    mismatches: dict[str, int] = {}
    statuses: dict[str, dict[str, int]] = {}
    for _ in range(a.rounds):  # interleaved, so load changes on a shared machine hit every config
        for label, workers, mode in configs:
            if workers == 0:
                dt, cpu, raw_out = run_raw(items)
            else:
                st, dt, cpu, out = run_sandbox(items, workers, mode)
                starts[label].append(st)
                # honesty check: same queries, same outcome (ok <-> ok, same row counts)
                mismatches[label] = max(
                    mismatches.get(label, 0),
                    sum(
                        1
                        for (rs, rn), (ss, sn) in zip(raw_out, out)
                        if (rs == "ok") != (ss == "ok") or (rs == "ok" and rn != sn)
                    ),
                )
                counts: dict[str, int] = {}
                for s_, _n in out:
                    counts[s_] = counts.get(s_, 0) + 1
                statuses[label] = counts
            walls[label].append(dt)
            cpus[label].append(cpu)

    med = statistics.median
    raw_ok = sum(1 for s_, _ in raw_out if s_ == "ok")
    print(f"raw sqlite3 ok={raw_ok}/{len(items)}; raw = one ro connection per db, this process, fetchall()")
    print(
        f"{'config':<34} {'wall min':>9} {'wall med':>9} {'ratio med':>9} {'ratio min':>9} "
        f"{'cpu med':>8} {'cpu ratio':>9} {'startup':>8}"
    )
    rw, rc = walls["raw"], cpus["raw"]
    for label, _w, _m in configs:
        w, c = walls[label], cpus[label]
        st = f"{med(starts[label]):7.2f}s" if starts[label] else "       -"
        print(
            f"{label:<34} {min(w):8.3f}s {med(w):8.3f}s {med(w) / med(rw):8.2f}x {min(w) / min(rw):8.2f}x "
            f"{med(c):7.3f}s {med(c) / med(rc):8.2f}x {st}"
        )
    for label in statuses:
        print(f"  {label}: statuses={statuses[label]} mismatches_vs_raw={mismatches[label]}")
    print("target: sandbox total <= 1.3x raw (wall, median over rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
