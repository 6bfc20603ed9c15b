"""Cost of the database check (`sqlrl.tasks.dbcheck`) beside the sha256 the fingerprint already pays.

Generates a SQLite database of about `--mb` MB (one table of 60-byte rows with an index on the text
column, seeded), then times, alternately and `--repeats` times each in one process: the check as run
on a cache miss (`dbcheck._check`: header, size, leftovers, `PRAGMA quick_check(5)`, table count) and
`sha256` of the file's bytes (what `SpiderData.fingerprint` reads). Both read every page; the page
cache is warm after the first read, so the figures are warm-cache figures (cold-cache ones are bounded
by the disk). Prints seconds and the ratio check / sha256.

    python bench/dbcheck_speed.py [--mb 200] [--repeats 3] [--path /tmp/x.sqlite]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import sqlite3
import tempfile
import time

from sqlrl.tasks import dbcheck


def generate(path: str, mb: float) -> None:
    rows = int(mb * 1e6 / 145)  # about 145 bytes per row with its index entry
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, a TEXT, b REAL, c INTEGER)")
    con.execute("CREATE INDEX ta ON t(a)")
    rng = random.Random(0)
    for start in range(0, rows, 100_000):
        batch = [
            (i, f"x{rng.randrange(10**12):012d}" + "y" * 40, rng.random(), rng.randrange(1000))
            for i in range(start, min(rows, start + 100_000))
        ]
        con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", batch)
    con.commit()
    con.close()


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=200.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--path", default=None, help="reuse (or create) this database instead of a temp file")
    a = ap.parse_args()
    tmp = None
    path = a.path
    if path is None:
        tmp = tempfile.TemporaryDirectory()
        path = os.path.join(tmp.name, "big.sqlite")
    if not os.path.exists(path):
        generate(path, a.mb)
    size = os.path.getsize(path)
    check_s, sha_s = [], []
    for _ in range(a.repeats):
        t = time.perf_counter()
        problem = dbcheck._check(os.path.realpath(path))
        check_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        sha256_file(path)
        sha_s.append(time.perf_counter() - t)
    print(f"database   {path}  {size / 1e6:.1f} MB  problem: {problem}")
    print(f"check      {' '.join(f'{s:.3f}' for s in check_s)} s  (min {min(check_s):.3f})")
    print(f"sha256     {' '.join(f'{s:.3f}' for s in sha_s)} s  (min {min(sha_s):.3f})")
    print(f"ratio      check / sha256 = {min(check_s) / min(sha_s):.2f}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
