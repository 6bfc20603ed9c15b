"""Large-database benchmark: what a BIRD-sized database costs sqlrl, side by side, in one run.

On the database of `bench/make_big_db.py` (>= 5M rows, >= 500 MB), times:
1. the integrity check at open (`dbcheck._check`: `PRAGMA quick_check(5)`) beside the sha256 of the
   file that the fingerprint and the gold cache read anyway;
2. schema text: `schema_text` (CREATE statements), `schema_info(db, 3)` (example values over each
   table's first `SAMPLE_ROWS` rows), and the same values counted over whole tables (`--full-values`:
   what a full scan per column costs);
3. per gold-like query (point lookups, joins, GROUP BY over millions of rows, ORDER BY ... LIMIT):
   raw sqlite3 (one read-only immutable connection in this process, rows fetched under the same row
   cap as the sandbox), the sandbox (`Sandbox.execute`, 2 workers), the gold cache cold (executes and
   writes the disk cache), warm (memory) and from disk (a new cache object), and, for a LIMIT gold,
   the gold cache's fetch of its ordered result for the LIMIT cut as scoring does it
   (`reward.cut.cut_query`: up to CUT_TIE_ROWS rows past the window) beside the whole ordered
   result (no LIMIT: what that fetch costs unbounded, capped only by the row/byte caps);
4. the by-database split of a Spider-layout folder holding this database and a small one
   (`SpiderData.load('train' / 'validation')`, `split_info`: sha256, schema text, checks);
5. the sandbox's caps and deadlines at its defaults (5 s, hard 11 s, 100,000 rows) on runaway
   statements: status and wall time of each (`--sections caps` runs this one alone).

Every figure is one process, warm page cache after the first read (`--drop` is not attempted). Prints
seconds and ratios; the sandbox ratio is sandbox / raw on the same statements.

    python bench/make_big_db.py --out /tmp/sqlrl_big/big/big.sqlite
    python bench/bench_big_db.py --db /tmp/sqlrl_big/big/big.sqlite [--repeats 3] [--full-values]
        [--sections check,schema,golds,split,caps]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
import urllib.parse

from sqlrl.reward.cut import _unbounded, cut_query
from sqlrl.sql.result import MAX_ROWS
from sqlrl.sql.sandbox import Sandbox
from sqlrl.tasks import dbcheck, schemainfo
from sqlrl.tasks.data import SpiderData, schema_text
from sqlrl.tasks.goldcache import GoldCache

GOLDS = [
    ("point: pk", "SELECT name, email, country FROM customers WHERE id = 123456"),
    ("point: index", "SELECT id, order_date, total FROM orders WHERE customer_id = 4242"),
    (
        "join: pk",
        "SELECT c.name, o.order_date, o.total FROM orders AS o JOIN customers AS c ON c.id = o.customer_id "
        "WHERE o.id = 777777",
    ),
    (
        "join: 3 tables, index",
        "SELECT p.name, oi.quantity FROM order_items AS oi JOIN orders AS o ON o.id = oi.order_id "
        "JOIN products AS p ON p.id = oi.product_id WHERE o.customer_id = 31337",
    ),
    ("group by 2M rows", "SELECT status, COUNT(*), AVG(total) FROM orders GROUP BY status"),
    (
        "group by join 3M rows",
        "SELECT p.category, SUM(oi.quantity * oi.unit_price) FROM order_items AS oi "
        "JOIN products AS p ON p.id = oi.product_id GROUP BY p.category",
    ),
    ("count filter 3M rows", "SELECT COUNT(*) FROM order_items WHERE quantity > 3"),
    ("count distinct 2M rows", "SELECT COUNT(DISTINCT customer_id) FROM orders"),
    ("order by limit: 2M, no index", "SELECT id, total FROM orders ORDER BY total DESC LIMIT 5"),
    ("order by limit: key not shown", "SELECT name FROM customers ORDER BY credit DESC LIMIT 3"),
    ("order by limit: index", "SELECT id, order_date FROM orders ORDER BY order_date DESC LIMIT 10"),
    (
        "order by limit: group by",
        "SELECT country, COUNT(*) FROM customers GROUP BY country ORDER BY COUNT(*) DESC LIMIT 3",
    ),
    ("over the row cap", "SELECT id, quantity FROM order_items WHERE quantity >= 1"),
]


def _ro(path: str) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{urllib.parse.quote(path)}?mode=ro&immutable=1", uri=True)


def raw_run(con: sqlite3.Connection, sql: str, max_rows: int = MAX_ROWS) -> tuple[str, int, float]:
    """(status, rows kept, seconds): the statement on a raw connection, fetched under the sandbox's row
    cap (more than max_rows -> too_many_rows), without the sandbox's layers."""
    t0 = time.perf_counter()
    cur = con.execute(sql)
    n = 0
    while True:
        part = cur.fetchmany(1000)
        n += len(part)
        if not part or n > max_rows:
            break
    status = "too_many_rows" if n > max_rows else "ok"
    return status, min(n, max_rows), time.perf_counter() - t0


def _timed(fn, repeats: int) -> tuple[float, object]:
    """(median seconds, last result) over `repeats` calls; one call when the first takes over 2 s."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
        if times[0] > 2.0:
            break
    return statistics.median(times), out


def bench_check(db: str, repeats: int) -> None:
    print("\n## integrity check at open vs sha256 (warm page cache after the first read)")
    _timed(lambda: dbcheck._check(db), 1)  # warm the page cache

    def sha() -> str:
        import hashlib

        h = hashlib.sha256()
        with open(db, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()

    t_check, problem = _timed(lambda: dbcheck._check(db), repeats)
    t_sha, _ = _timed(sha, repeats)
    print(f"quick_check (dbcheck._check) {t_check:.2f} s -> {problem or 'ok'}; sha256 {t_sha:.2f} s; ")
    print(f"ratio check / sha256 {t_check / t_sha:.2f}x")


def bench_schema(db: str, full_values: bool) -> None:
    print("\n## schema text")
    t0 = time.perf_counter()
    text = schema_text(db)
    t_text = time.perf_counter() - t0
    print(f"schema_text: {t_text * 1000:.1f} ms, {len(text)} chars")
    schemainfo._CACHE.clear()
    t0 = time.perf_counter()
    info = schemainfo.schema_info(db, 3)
    t_vals = time.perf_counter() - t0
    print(f"schema_info(db, 3), values over the first {schemainfo.SAMPLE_ROWS} rows: {t_vals:.2f} s")
    print(info.file_order_text.split("\n\n")[0][:600])
    if full_values:
        keep = schemainfo.SAMPLE_ROWS
        schemainfo.SAMPLE_ROWS = 10**12  # every row: one full GROUP BY per column
        schemainfo._CACHE.clear()
        try:
            t0 = time.perf_counter()
            schemainfo.schema_info(db, 3)
            t_full = time.perf_counter() - t0
        finally:
            schemainfo.SAMPLE_ROWS = keep
            schemainfo._CACHE.clear()
        print(
            f"same values over whole tables: {t_full:.2f} s; ratio whole / first rows {t_full / t_vals:.0f}x"
        )


def bench_golds(db: str, repeats: int) -> None:
    print("\n## gold-like queries: raw sqlite3 vs sandbox vs gold cache (median of repeats)")
    print("(cold of the first query includes starting the gold cache's sandbox and the sha256 of the file)")
    con = _ro(db)
    raw_run(con, "SELECT COUNT(*) FROM order_items")  # page cache warm
    cache_dir = tempfile.mkdtemp(prefix="sqlrl_big_gold_")
    sandbox = Sandbox(workers=2, timeout_s=60.0, hard_timeout_s=90.0)
    gold = GoldCache(cache_dir, timeout_s=60.0)
    head = f"{'query':30} {'status':14} {'rows':>6} {'raw ms':>8} {'sandbox':>8} {'ratio':>6} "
    print(head + f"{'cold ms':>8} {'warm':>7} {'disk':>7}  cut fetch: bounded | whole ordered result")
    tot_raw = tot_box = 0.0
    try:
        sandbox.execute(db, "SELECT 1")  # workers started, outside the timings
        for name, sql in GOLDS:
            t_raw, (status, rows, _) = _timed(lambda s=sql: raw_run(con, s), repeats)
            t_box, res = _timed(lambda s=sql: sandbox.execute(db, s), repeats)
            same = "" if res.status == status and (res.row_count == rows or status != "ok") else " MISMATCH"
            t0 = time.perf_counter()
            gold.get(db, sql)
            t_cold = time.perf_counter() - t0
            t_warm, _ = _timed(lambda s=sql: gold.get(db, s), repeats)
            with GoldCache(cache_dir, timeout_s=60.0) as fresh:
                fresh.get(db, "SELECT 1")  # file sha256 resolved outside the timing
                t0 = time.perf_counter()
                fresh.get(db, sql)
                t_disk = time.perf_counter() - t0
            cut = ""
            q = cut_query(sql)
            if q is not None:
                parts = []
                for fq in (q.sql, _unbounded(sql).sql):  # type: ignore[union-attr]
                    t0 = time.perf_counter()
                    full = gold.get_many([(db, fq)])[0]
                    parts.append(f"{full.status} {full.row_count} rows {time.perf_counter() - t0:.2f} s")
                cut = " | ".join(parts)
            tot_raw, tot_box = tot_raw + t_raw, tot_box + t_box
            print(
                f"{name:30} {res.status + same:14} {res.row_count:>6} {t_raw * 1e3:8.1f} {t_box * 1e3:8.1f} "
                f"{t_box / max(t_raw, 1e-9):5.2f}x {t_cold * 1e3:8.1f} {t_warm * 1e6:5.0f}us "
                f"{t_disk * 1e3:5.1f}ms  {cut}"
            )
        print(f"total raw {tot_raw:.2f} s, sandbox {tot_box:.2f} s: sandbox / raw {tot_box / tot_raw:.2f}x")
    finally:
        sandbox.close()
        gold.close()
        con.close()
        shutil.rmtree(cache_dir, ignore_errors=True)


def bench_split(db: str, small: str) -> None:
    print("\n## by-database split (Spider layout: this database and a small one)")
    root = tempfile.mkdtemp(prefix="sqlrl_big_split_")
    try:
        for name, src in (("big", db), ("small", small)):
            os.makedirs(os.path.join(root, "database", name))
            os.symlink(src, os.path.join(root, "database", name, f"{name}.sqlite"))
        exs = [
            {"db_id": d, "question": f"q{i}", "query": sql}
            for d in ("big", "small")
            for i, (_, sql) in enumerate(GOLDS)
        ]
        with open(os.path.join(root, "train_spider.json"), "w") as f:
            json.dump(exs, f)
        with open(os.path.join(root, "tables.json"), "w") as f:
            json.dump([], f)
        data = SpiderData(root)
        t0 = time.perf_counter()
        n = {s: len(data.load(s)) for s in ("train", "validation")}
        t_load = time.perf_counter() - t0
        t0 = time.perf_counter()
        info = data.split_info()
        t_info = time.perf_counter() - t0
        t0 = time.perf_counter()
        damaged = {s: data.damaged_databases(s) for s in ("train", "validation")}
        t_dmg = time.perf_counter() - t0
        print(
            f"load train+validation {t_load:.2f} s ({n}); split_info {t_info:.2f} s; damaged_databases {t_dmg:.3f} s {damaged}"
        )
        print(f"train dbs {info['train']['db_ids']}, validation dbs {info['validation']['db_ids']}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


CAPS = [
    ("runaway cross join", "SELECT count(*) FROM orders, order_items"),
    ("sort 3M text rows, whole result", "SELECT comment FROM order_items ORDER BY comment"),
    ("sort 3M text rows, LIMIT 5", "SELECT comment FROM order_items ORDER BY comment DESC LIMIT 5"),
    ("every row of 3M", "SELECT * FROM order_items"),
    (
        "GROUP BY text, 3M rows",
        "SELECT comment, count(*) FROM order_items GROUP BY comment ORDER BY 2 DESC LIMIT 3",
    ),
]


def bench_caps(db: str) -> None:
    print("\n## sandbox caps and deadlines at their defaults (1 worker)")
    with Sandbox(workers=1) as sb:
        sb.execute(db, "SELECT 1")
        print(f"timeout_s {sb.timeout_s}, hard_timeout_s {sb.hard_timeout_s}, max_rows {sb.max_rows}")
        for name, sql in CAPS:
            t0 = time.perf_counter()
            r = sb.execute(db, sql)
            wall = time.perf_counter() - t0
            print(f"{name:34} {r.status:14} rows {r.row_count:>7} wall {wall:6.2f} s  {r.message[:80]}")
        print(f"workers killed by the watchdog {sb.kills}, crashed {sb.crashes}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default="/tmp/sqlrl_big/big/big.sqlite")
    ap.add_argument(
        "--small", default="", help="a small database for the split (default: made by make_big_db)"
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--full-values", action="store_true", help="also count example values over whole tables")
    ap.add_argument("--sections", default="check,schema,golds,split,caps")
    a = ap.parse_args()
    sections = set(a.sections.split(","))
    con = _ro(a.db)
    sizes = {
        t: con.execute(f"SELECT MAX(rowid) FROM {t}").fetchone()[0]
        for (t,) in con.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%'"
        ).fetchall()
    }
    con.close()
    print(
        f"database {a.db}: {os.path.getsize(a.db) / 1e6:.0f} MB, rows (max rowid) {sizes}, total {sum(sizes.values()):,}"
    )
    print(f"cpus {os.cpu_count()}, load average at start {os.getloadavg()}")
    small = a.small
    if not small and "split" in sections:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "make_big_db", os.path.join(os.path.dirname(__file__), "make_big_db.py")
        )
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
        small = os.path.join(tempfile.mkdtemp(prefix="sqlrl_big_small_"), "small.sqlite")
        mod.build(small, scale=0.001)
    try:
        if "check" in sections:
            bench_check(a.db, a.repeats)
        if "schema" in sections:
            bench_schema(a.db, a.full_values)
        if "golds" in sections:
            bench_golds(a.db, a.repeats)
        if "split" in sections:
            bench_split(a.db, small)
        if "caps" in sections:
            bench_caps(a.db)
    finally:
        if small and not a.small:
            shutil.rmtree(os.path.dirname(small), ignore_errors=True)
    print(f"\nload average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
