"""Replica pool vs copy-per-rollout: bytes of I/O and wall time per rollout on real Spider databases.

Workload (same seeded sequence for every arm): rollouts spread over a few Spider databases of different
sizes; `--write-frac` (default 20%) of them run one write among their 2-4 SELECTs, the others run the
SELECTs only. `--write-kind delete` (default): DELETE one row of a non-empty table, a real change of at
least one page. `--write-kind noop-update`: `UPDATE t SET c = c` on one row, which dirties the replica
for the pool's authorizer while SQLite mostly writes no page (this flatters any reset proportional to
the changed pages). `--concurrency` threads run rollouts at once (lease -> statements -> release). Each
arm gets a fresh pool (the first, lazy copies are counted); arms run alternately, `--repeats` times
each (ABCD DCBA order) in one process; figures are summed over repeats.

Arms: copy_per_rollout (baseline), pool_wal_reset (default pool: WAL-mode replicas, a dirty one is reset
by discarding its WAL), pool_delta_reset (`wal_reset=False`: rollback-mode replicas, in-place reset of
the differing blocks), pool_full_copy_reset (`wal_reset=False, delta_reset=False`).

I/O, measured the same way for every arm: the pool's counters (`bytes_copied`, `bytes_read`, and for
the WAL arm `wal_bytes`: what SQLite wrote into the discarded WAL files, which the other arms write
into their replica files uncounted); and /proc/<pid>/io of the parent plus every worker, from after
the workers started to before the pool closed: rchar / wchar (syscall bytes, incl. the SQL's own page
reads and the pipe traffic common to all arms), read_bytes / write_bytes (storage layer) and
cancelled_write_bytes (dirty bytes dropped by deleting / truncating a file before writeback).

    python bench/bench_pool.py [--rollouts 300] [--repeats 2] [--out x.json] [--text x.txt]
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import random
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import redirect_stdout
from pathlib import Path

from sqlrl.sql.replicas import CopyPerRollout, ReplicaPool

DEFAULT_DBS = ["sakila_1", "college_2", "chinook_1", "hospital_1", "sports_competition"]


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _queries(path: str, write_kind: str = "noop-update") -> tuple[list[str], list[str]]:
    """(read-only SELECTs, single-row writes) built from the schema (read via a read-only connection)."""
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
            if write_kind == "noop-update":
                writes.append(
                    f"UPDATE {_q(t)} SET {_q(cols[-1])} = {_q(cols[-1])} "
                    f"WHERE rowid IN (SELECT rowid FROM {_q(t)} LIMIT 1)"
                )
            elif c.execute(f"SELECT EXISTS (SELECT 1 FROM {_q(t)})").fetchone()[0]:  # delete: non-empty only
                writes.append(f"DELETE FROM {_q(t)} WHERE rowid IN (SELECT rowid FROM {_q(t)} LIMIT 1)")
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


_IO_KEYS = ("rchar", "wchar", "syscr", "syscw", "read_bytes", "write_bytes", "cancelled_write_bytes")


def _proc_io(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            k, v = line.split(":")
            out[k.strip()] = int(v)
    return out


def _io_snapshot(pool) -> dict:
    """{pid: /proc/<pid>/io} for this process and the pool's worker processes."""
    pids = [os.getpid()] + [w.proc.pid for w in pool._workers if w.proc is not None]
    return {pid: _proc_io(pid) for pid in pids}


def _io_delta(a: dict, b: dict) -> dict:
    if set(a) != set(b):  # a worker was respawned: its counters restarted
        return {"error": f"process set changed: {sorted(a)} -> {sorted(b)}"}
    return {k: sum(b[p][k] - a[p][k] for p in a) for k in _IO_KEYS}


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
        io0 = _io_snapshot(pool)
        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.perf_counter() - t0
        io1 = _io_snapshot(pool)
        st = pool.stats()
    finally:
        pool.close()
    return {"wall_s": wall, "setup_s": setup_s, "stats": st, "statuses": statuses, "io": _io_delta(io0, io1)}


def _machine() -> dict:
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "loadavg": list(os.getloadavg()),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "git_commit": git("rev-parse", "--short", "HEAD"),
        "git_dirty_files": git("status", "--porcelain", "--untracked-files=no").splitlines(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--spider", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "spider")
    )
    p.add_argument("--dbs", default=",".join(DEFAULT_DBS))
    p.add_argument("--rollouts", type=int, default=300)
    p.add_argument("--write-frac", type=float, default=0.2)
    p.add_argument("--write-kind", choices=("delete", "noop-update"), default="delete")
    p.add_argument("--replicas-per-db", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--root", default=None, help="folder for replicas (default: a temp dir)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--text", default=None, help="also write the printed report here")
    args = p.parse_args(argv)
    machine_before = _machine()
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = _main(args, machine_before)
    sys.stdout.write(buf.getvalue())
    if args.text:
        with open(args.text, "w") as f:
            f.write(buf.getvalue())
    return rc


def _main(args, machine_before: dict) -> int:
    argv_s = " ".join(["python"] + [os.path.relpath(sys.argv[0])] + sys.argv[1:])

    dbs = [d for d in args.dbs.split(",") if d]
    templates = {d: os.path.join(args.spider, "database", d, f"{d}.sqlite") for d in dbs}
    sizes = {d: os.path.getsize(pth) for d, pth in templates.items()}
    qs = {d: _queries(pth, args.write_kind) for d, pth in templates.items()}
    plan = _plan(dbs, qs, args.rollouts, args.write_frac, args.seed)
    n_write = sum(w for _, _, w in plan)
    n_stmts = sum(len(s) for _, s, _ in plan)

    arms = {
        "copy_per_rollout": (CopyPerRollout, {}),
        "pool_wal_reset": (ReplicaPool, {}),  # default: WAL-mode replicas, reset = discard the WAL
        "pool_delta_reset": (ReplicaPool, {"wal_reset": False}),  # previous default: changed blocks only
        "pool_full_copy_reset": (ReplicaPool, {"wal_reset": False, "delta_reset": False}),  # ablation
    }
    order = []
    for r in range(args.repeats):
        order += list(arms) if r % 2 == 0 else list(reversed(list(arms)))  # ABCD DCBA ...
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
        io_ok = all("error" not in r["io"] for r in runs)
        proc_io = {k: sum(r["io"][k] for r in runs) for k in _IO_KEYS} if io_ok else None
        summary[arm] = {
            "rollouts": n,
            "bytes_copied": b,
            "bytes_per_rollout": b / n,
            "bytes_read": sum(r["stats"]["bytes_read"] for r in runs),
            "wal_bytes": sum(r["stats"].get("wal_bytes", 0) for r in runs),
            "proc_io": proc_io,
            "proc_io_runs": [r["io"] for r in runs],
            "worker_crashes": sum(r["stats"]["worker_crashes"] for r in runs),
            "resets": sum(r["stats"]["resets"] for r in runs),
            "delta_resets": sum(r["stats"]["delta_resets"] for r in runs),
            "wal_resets": sum(r["stats"].get("wal_resets", 0) for r in runs),
            "dirty_releases": sum(r["stats"]["dirty_releases"] for r in runs),
            "clean_releases": sum(r["stats"]["clean_releases"] for r in runs),
            "wall_s": w,
            "ms_per_rollout": 1e3 * w / n,
            "wall_s_runs": [round(r["wall_s"], 3) for r in runs],
            "statuses": statuses,
        }
    c = summary["copy_per_rollout"]

    def counted(s: dict) -> int:  # pool counters: reset reads + writes, plus the discarded WAL bytes
        return s["bytes_copied"] + s["bytes_read"] + s["wal_bytes"]

    def pio(s: dict, *keys: str) -> int | None:
        return None if s["proc_io"] is None else sum(s["proc_io"][k] for k in keys)

    def ratio(a: int | None, b: int | None) -> float | None:
        return None if a is None or b is None else a / max(1, b)

    ratios = {}
    for arm in ("pool_wal_reset", "pool_delta_reset", "pool_full_copy_reset"):
        p_ = summary[arm]
        ratios[arm] = {
            "written_bytes_copy_over_pool": c["bytes_copied"] / max(1, p_["bytes_copied"] + p_["wal_bytes"]),
            "read_plus_written_copy_over_pool": counted(c) / max(1, counted(p_)),
            "proc_rchar_plus_wchar_copy_over_pool": ratio(
                pio(c, "rchar", "wchar"), pio(p_, "rchar", "wchar")
            ),
            "proc_storage_read_plus_write_copy_over_pool": ratio(
                pio(c, "read_bytes", "write_bytes"), pio(p_, "read_bytes", "write_bytes")
            ),
            "time_copy_over_pool": c["wall_s"] / max(1e-9, p_["wall_s"]),
        }
    print(f"command: {argv_s}")
    mb = machine_before
    print(
        f"machine: {mb['cpu_count']} CPUs (shared), load average before {mb['loadavg']}, "
        f"after {list(os.getloadavg())}; {mb['platform']}; Python {mb['python']}, SQLite {mb['sqlite']}; "
        f"git {mb['git_commit']}"
        + (f" + uncommitted changes in {len(mb['git_dirty_files'])} files" if mb["git_dirty_files"] else "")
    )
    print(
        f"\n{args.rollouts} rollouts x {args.repeats} repeats per arm; {n_write} write rollouts "
        f"({100 * n_write / args.rollouts:.0f}%, write kind {args.write_kind}), {n_stmts} statements per pass; "
        f"replicas/db={args.replicas_per_db}, workers={args.workers}, concurrency={args.concurrency}"
    )
    print("databases: " + ", ".join(f"{d} ({sizes[d] / 1024:.0f} KiB)" for d in dbs))
    print("\npool counters (summed over repeats)")
    hdr = (
        f"{'arm':<21} {'reset written':>14} {'reset read':>14} {'WAL discarded':>14} {'KiB/rollout':>11} "
        f"{'resets':>7} {'wal':>5} {'delta':>6} {'dirty':>6} {'clean':>6} {'ms/rollout':>11}"
    )
    print(hdr)
    print("-" * len(hdr))
    for arm, s in summary.items():
        print(
            f"{arm:<21} {s['bytes_copied']:>14,} {s['bytes_read']:>14,} {s['wal_bytes']:>14,} "
            f"{counted(s) / s['rollouts'] / 1024:>11.1f} {s['resets']:>7} {s['wal_resets']:>5} "
            f"{s['delta_resets']:>6} {s['dirty_releases']:>6} {s['clean_releases']:>6} {s['ms_per_rollout']:>11.2f}"
        )
    print("\n/proc/<pid>/io, parent + workers, during the runs (summed over repeats)")
    hdr = (
        f"{'arm':<21} {'rchar':>14} {'wchar':>14} {'KiB r+w/roll':>12} {'read_bytes':>12} "
        f"{'write_bytes':>14} {'cancelled_wr':>14}"
    )
    print(hdr)
    print("-" * len(hdr))
    for arm, s in summary.items():
        q = s["proc_io"]
        if q is None:
            print(f"{arm:<21} (a worker was respawned: not measured)")
            continue
        print(
            f"{arm:<21} {q['rchar']:>14,} {q['wchar']:>14,} {(q['rchar'] + q['wchar']) / s['rollouts'] / 1024:>12.1f} "
            f"{q['read_bytes']:>12,} {q['write_bytes']:>14,} {q['cancelled_write_bytes']:>14,}"
        )
    print()

    def fx(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.1f}x"

    for arm, r in ratios.items():
        print(
            f"copy_per_rollout / {arm}: counters written {r['written_bytes_copy_over_pool']:.1f}x, "
            f"read+written {r['read_plus_written_copy_over_pool']:.1f}x; /proc rchar+wchar "
            f"{fx(r['proc_rchar_plus_wchar_copy_over_pool'])}, storage read+write "
            f"{fx(r['proc_storage_read_plus_write_copy_over_pool'])}; wall time {r['time_copy_over_pool']:.2f}x"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "command": argv_s,
                    "machine_before": machine_before,
                    "loadavg_after": list(os.getloadavg()),
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
