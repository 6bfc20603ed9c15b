"""Replica pool vs copy-per-rollout: bytes copied and wall time per rollout on real Spider databases.

Workload (same seeded sequence for both arms): rollouts spread over a few Spider databases of different
sizes; `--write-frac` (default 20%) of them run one UPDATE (a no-op rewrite of one row, enough to dirty
the replica) among their statements, the others run 2-4 SELECTs only. `--concurrency` threads run
rollouts at once (lease -> statements -> release), like a batch of trajectories. Each arm gets a fresh
pool (replicas are created lazily: the first copies are counted). Arms run alternately, `--repeats`
times each (ABBA order) in one process; figures are summed over repeats.

    python bench/bench_pool.py [--rollouts 300] [--out bench_pool.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

from sqlrl.pool import CopyPerRollout, ReplicaPool

DEFAULT_DBS = ["sakila_1", "college_2", "chinook_1", "hospital_1", "sports_competition"]


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _queries(path: str) -> tuple[list[str], list[str]]:
    """(read-only SELECTs, single-row UPDATEs) built from the schema (read via a read-only connection)."""
    c = sqlite3.connect("file:" + path + "?mode=ro&immutable=1", uri=True)
    try:
        tables = [r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        reads, writes = [], []
        for t in tables:
            if t.startswith("sqlite_"):
                continue
            cols = [r[1] for r in c.execute(f"PRAGMA table_info({_q(t)})")]
            if not cols:
                continue
            reads += [
                f"SELECT count(*) FROM {_q(t)}",
                f"SELECT * FROM {_q(t)} LIMIT 5",
                f"SELECT {_q(cols[0])}, count(*) FROM {_q(t)} GROUP BY 1 ORDER BY 2 DESC LIMIT 3",
            ]
            writes.append(
                f"UPDATE {_q(t)} SET {_q(cols[-1])} = {_q(cols[-1])} "
                f"WHERE rowid IN (SELECT rowid FROM {_q(t)} LIMIT 1)"
            )
        return reads, writes
    finally:
        c.close()


def _plan(
    dbs: list[str], qs: dict, n: int, write_frac: float, seed: int
) -> list[tuple[str, list[str], bool]]:
    rng = random.Random(seed)
    writers = set(rng.sample(range(n), round(n * write_frac)))  # exactly write_frac of the rollouts
    plan = []
    for i in range(n):
        db = rng.choice(dbs)
        reads, writes = qs[db]
        stmts = [rng.choice(reads) for _ in range(rng.randint(2, 4))]
        w = i in writers
        if w:
            stmts.insert(rng.randint(0, len(stmts)), rng.choice(writes))
        plan.append((db, stmts, w))
    return plan


def _run_arm(arm: tuple, templates: dict, plan: list, args, root: str) -> dict:
    cls, extra = arm
    t_setup = time.perf_counter()
    pool = cls(
        templates,
        root,
        **extra,
        replicas_per_db=args.replicas_per_db,
        workers=args.workers,
        timeout_s=10.0,
        lease_timeout_s=600.0,
    )
    setup_s = time.perf_counter() - t_setup
    statuses: dict[str, int] = {}
    lock = threading.Lock()
    it = iter(enumerate(plan))

    def worker() -> None:
        while True:
            with lock:
                nxt = next(it, None)
            if nxt is None:
                return
            i, (db, stmts, _) = nxt
            tid = f"{cls.__name__}-{i}"
            pool.lease(tid, db)
            try:
                for s in stmts:
                    r = pool.execute(tid, s)
                    with lock:
                        statuses[r.status] = statuses.get(r.status, 0) + 1
            finally:
                pool.release(tid)

    try:
        pool.wait_ready()  # worker start-up (spawn) is not counted in either arm
        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.perf_counter() - t0
        st = pool.stats()
    finally:
        pool.close()
    return {"wall_s": wall, "setup_s": setup_s, "stats": st, "statuses": statuses}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--spider", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "spider")
    )
    p.add_argument("--dbs", default=",".join(DEFAULT_DBS))
    p.add_argument("--rollouts", type=int, default=300)
    p.add_argument("--write-frac", type=float, default=0.2)
    p.add_argument("--replicas-per-db", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--root", default=None, help="folder for replicas (default: a temp dir)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)

    dbs = [d for d in args.dbs.split(",") if d]
    templates = {d: os.path.join(args.spider, "database", d, f"{d}.sqlite") for d in dbs}
    sizes = {d: os.path.getsize(pth) for d, pth in templates.items()}
    qs = {d: _queries(pth) for d, pth in templates.items()}
    plan = _plan(dbs, qs, args.rollouts, args.write_frac, args.seed)
    n_write = sum(w for _, _, w in plan)
    n_stmts = sum(len(s) for _, s, _ in plan)

    arms = {
        "copy_per_rollout": (CopyPerRollout, {}),
        "pool_lazy_reset": (ReplicaPool, {}),  # delta (in-place, changed blocks only) reset
        "pool_full_copy_reset": (ReplicaPool, {"delta_reset": False}),  # ablation
    }
    order = []
    for r in range(args.repeats):
        order += list(arms) if r % 2 == 0 else list(reversed(list(arms)))  # ABC CBA ...
    res: dict[str, list[dict]] = {a: [] for a in arms}
    root = args.root or tempfile.mkdtemp(prefix="sqlrl-bench-pool-")
    for k, arm in enumerate(order):
        out = _run_arm(arms[arm], templates, plan, args, os.path.join(root, f"{arm}-{k}"))
        res[arm].append(out)
        print(
            f"  run {k + 1}/{len(order)} {arm}: {out['wall_s']:.2f} s, {out['stats']['bytes_copied']:,} B",
            file=sys.stderr,
        )

    summary = {}
    for arm, runs in res.items():
        n = args.rollouts * len(runs)
        b = sum(r["stats"]["bytes_copied"] for r in runs)
        w = sum(r["wall_s"] for r in runs)
        statuses: dict[str, int] = {}
        for r in runs:
            for s, c in r["statuses"].items():
                statuses[s] = statuses.get(s, 0) + c
        summary[arm] = {
            "rollouts": n,
            "bytes_copied": b,
            "bytes_per_rollout": b / n,
            "bytes_read": sum(r["stats"]["bytes_read"] for r in runs),
            "resets": sum(r["stats"]["resets"] for r in runs),
            "delta_resets": sum(r["stats"]["delta_resets"] for r in runs),
            "dirty_releases": sum(r["stats"]["dirty_releases"] for r in runs),
            "clean_releases": sum(r["stats"]["clean_releases"] for r in runs),
            "wall_s": w,
            "ms_per_rollout": 1e3 * w / n,
            "wall_s_runs": [round(r["wall_s"], 3) for r in runs],
            "statuses": statuses,
        }
    c = summary["copy_per_rollout"]
    ratios = {}
    for arm in ("pool_lazy_reset", "pool_full_copy_reset"):
        p_ = summary[arm]
        ratios[arm] = {
            "written_bytes_copy_over_pool": c["bytes_copied"] / max(1, p_["bytes_copied"]),
            "read_plus_written_copy_over_pool": (c["bytes_copied"] + c["bytes_read"])
            / max(1, p_["bytes_copied"] + p_["bytes_read"]),
            "time_copy_over_pool": c["wall_s"] / max(1e-9, p_["wall_s"]),
        }
    print(
        f"\n{args.rollouts} rollouts x {args.repeats} repeats per arm; {n_write} write rollouts "
        f"({100 * n_write / args.rollouts:.0f}%), {n_stmts} statements per pass; "
        f"replicas/db={args.replicas_per_db}, workers={args.workers}, concurrency={args.concurrency}"
    )
    print("databases: " + ", ".join(f"{d} ({sizes[d] / 1024:.0f} KiB)" for d in dbs))
    hdr = (
        f"{'arm':<21} {'bytes written':>14} {'KiB wr/roll':>11} {'bytes read':>14} {'resets':>7} "
        f"{'delta':>6} {'dirty':>6} {'clean':>6} {'ms/rollout':>11}"
    )
    print(hdr)
    print("-" * len(hdr))
    for arm, s in summary.items():
        print(
            f"{arm:<21} {s['bytes_copied']:>14,} {s['bytes_per_rollout'] / 1024:>11.1f} {s['bytes_read']:>14,} "
            f"{s['resets']:>7} {s['delta_resets']:>6} {s['dirty_releases']:>6} {s['clean_releases']:>6} "
            f"{s['ms_per_rollout']:>11.2f}"
        )
    for arm, r in ratios.items():
        print(
            f"copy_per_rollout / {arm}: bytes written {r['written_bytes_copy_over_pool']:.1f}x, "
            f"read+written {r['read_plus_written_copy_over_pool']:.1f}x, wall time {r['time_copy_over_pool']:.2f}x"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "args": vars(args),
                    "databases": {d: {"path": templates[d], "bytes": sizes[d]} for d in dbs},
                    "write_rollouts_per_pass": n_write,
                    "statements_per_pass": n_stmts,
                    "summary": summary,
                    "ratios": ratios,
                },
                f,
                indent=2,
            )
    if not args.root:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
