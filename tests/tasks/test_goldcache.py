"""Tests for sqlrl.tasks.goldcache: statuses and reasons, execute-once caching, the disk cache, the audit CLI."""

from __future__ import annotations

import json
import logging
import math
import re
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from sqlrl.tasks.data import PrivateTask, PublicTask, SpiderData, embedded_root
from sqlrl.tasks.goldcache import (
    CACHE_FILE,
    GoldCache,
    GoldCacheError,
    GoldResult,
    audit_golds,
    no_bars,
    unstable_gold,
)

SPIDER = Path(__file__).resolve().parents[3] / "shared" / "data" / "spider"

RECURSIVE = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


@dataclass(frozen=True)
class FakeSQLResult:
    status: str
    columns: list
    rows: list
    row_count: int
    elapsed_ms: float
    message: str


class SqliteExecutor:
    """Stand-in for sqlrl.sql.sandbox.Sandbox: real read-only SQLite, timeout by progress handler."""

    def __init__(self, timeout_s: float | None = None, crash_first: int = 0):
        self.timeout_s = timeout_s
        self.calls: list[tuple[str, str]] = []
        self.crash_first = crash_first

    def execute(self, db_path: str, sql: str, timeout_s: float | None = None) -> FakeSQLResult:
        self.calls.append((db_path, sql))
        if self.crash_first > 0:
            self.crash_first -= 1
            return FakeSQLResult("worker_crash", [], [], 0, 0.0, "killed")
        limit = self.timeout_s if self.timeout_s is not None else timeout_s
        con = sqlite3.connect(Path(db_path).as_uri() + "?mode=ro", uri=True)
        t0 = time.perf_counter()
        con.set_progress_handler(lambda: int(time.perf_counter() - t0 > limit), 1000)
        try:
            cur = con.execute(sql)
            rows = cur.fetchall()
            cols = [d[0] for d in cur.description or []]
            return FakeSQLResult("ok", cols, rows, len(rows), (time.perf_counter() - t0) * 1e3, "")
        except sqlite3.OperationalError as e:
            if "interrupted" in str(e):
                return FakeSQLResult("timeout", [], [], 0, (time.perf_counter() - t0) * 1e3, "timed out")
            return FakeSQLResult("runtime_error", [], [], 0, 0.0, str(e))
        finally:
            con.close()


@pytest.fixture
def db(tmp_path) -> Path:
    path = tmp_path / "data" / "database" / "tiny" / "tiny.sqlite"
    path.parent.mkdir(parents=True)
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (id INTEGER, x REAL, b BLOB, s TEXT)")
    con.executemany(
        "INSERT INTO t VALUES (?, ?, ?, ?)",
        [(1, 0.1, b"\x00\xff", "a"), (2, 1e300, None, None), (3, -0.0, b"", "\u00e9"), (4, 1 / 3, b"z", "")],
    )
    con.commit()
    con.close()
    return path


def task(db: Path, i: int, sql: str) -> PrivateTask:
    pub = PublicTask(f"tiny/{i:05d}", "tiny", f"q{i}", "", "", str(db))
    return PrivateTask(pub, sql)


GOLDS = [
    "SELECT id, s FROM t ORDER BY id",  # fine
    "SELECT * FROM no_such_table",  # error
    "SELECT id FROM t WHERE id > 100",  # empty
    RECURSIVE,  # timeout (with a tiny timeout)
]


def test_audit_counts_reasons_and_hits_cache(db):
    ex = SqliteExecutor()
    cache = GoldCache(None, executor=ex, timeout_s=0.2)
    tasks = [task(db, i, sql) for i, sql in enumerate(GOLDS)]
    audit = audit_golds(tasks, cache)
    assert audit.n == 4 and audit.scorable == 1
    assert dict(audit.excluded) == {"gold_error": 1, "gold_empty": 1, "gold_timeout": 1}
    assert audit.per_task == {
        "tiny/00000": None,
        "tiny/00001": "gold_error",
        "tiny/00002": "gold_empty",
        "tiny/00003": "gold_timeout",
    }
    assert len(ex.calls) == 4
    again = audit_golds(tasks, cache)
    assert again.to_dict()["excluded"] == audit.to_dict()["excluded"]
    assert len(ex.calls) == 4 and again.cache_hits == 4  # second call: all from the cache
    r = cache.get(db, GOLDS[0])
    assert r.status == "ok" and r.scorable and r.unscorable_reason is None
    assert r.columns == ["id", "s"] and r.rows[0] == (1, "a") and r.row_count == 4
    assert cache.get(db, GOLDS[1]).message.startswith("runtime_error: no such table")
    assert len(ex.calls) == 4
    # a different sql text is a different key; duplicates in one batch execute once
    cache.get_many([(db, GOLDS[0] + " "), (db, GOLDS[0] + " ")])
    assert len(ex.calls) == 5


def test_an_audit_of_100_golds_draws_its_bar_except_inside_no_bars(db, capsys, caplog):
    tasks = [task(db, i, f"SELECT id FROM t WHERE id <> {i}") for i in range(100)]
    caplog.set_level(logging.INFO, logger="sqlrl.tasks.goldcache")
    audit_golds(tasks, GoldCache(None, executor=SqliteExecutor()))
    assert "gold audit: 100%" in capsys.readouterr().err and caplog.messages == []
    with no_bars():  # an experiment's progress line: no bar but a line before and after, unless asked for
        cache = GoldCache(None, executor=SqliteExecutor())
        audit_golds(tasks, cache)
        assert capsys.readouterr().err == ""
        assert caplog.messages[0] == "gold audit: executing 100 golds"
        assert re.fullmatch(r"gold audit: 100 golds executed in \d+\.\d s", caplog.messages[1])
        audit_golds(tasks, cache)  # all cached: nothing executed, nothing said
        audit_golds(tasks[:99], GoldCache(None, executor=SqliteExecutor()))  # under 100 to execute
        assert len(caplog.messages) == 2 and capsys.readouterr().err == ""
        audit_golds(tasks, GoldCache(None, executor=SqliteExecutor()), progress=True)
        assert "gold audit: 100%" in capsys.readouterr().err and len(caplog.messages) == 2
    audit_golds(tasks[:99], GoldCache(None, executor=SqliteExecutor()))
    assert capsys.readouterr().err == ""  # under 100 golds to execute: no bar


def test_audit_rejects_public_tasks(db):
    with pytest.raises(TypeError, match="PrivateTask"):
        audit_golds([task(db, 0, GOLDS[0]).public], GoldCache(None, executor=SqliteExecutor()))


def test_result_reasons():
    assert GoldResult("empty", ["a"], [], 0).unscorable_reason == "gold_empty"
    assert GoldResult("ok", ["a"], [], 0).unscorable_reason == "gold_empty"  # defensive
    assert GoldResult("error", [], [], 0, "x").unscorable_reason == "gold_error"
    assert GoldResult("timeout", [], [], 0).unscorable_reason == "gold_timeout"
    assert GoldResult("ok", ["a"], [(1,)], 1).scorable


def test_disk_cache_round_trip_exact(db, tmp_path):
    cache_dir = tmp_path / "cache"
    ex = SqliteExecutor()
    sql = "SELECT id, x, b, s, NULL AS n, 1.0 AS one FROM t ORDER BY id"
    with GoldCache(cache_dir, executor=ex) as c1:
        first = c1.get(db, sql)
    assert (cache_dir / CACHE_FILE).is_file()
    ex2 = SqliteExecutor()
    with GoldCache(cache_dir, executor=ex2) as c2:
        second = c2.get(db, sql)
    assert ex2.calls == []  # served from disk
    assert second == first
    for r1, r2 in zip(first.rows, second.rows):
        for a, b in zip(r1, r2):
            assert type(a) is type(b)
            if isinstance(a, float):
                assert a.hex() == b.hex()  # bit-exact, including -0.0
    assert second.rows[0][2] == b"\x00\xff" and second.rows[1][2] is None and second.rows[0][4] is None
    assert second.rows[1][1] == 1e300 and second.rows[3][1] == 1 / 3
    assert type(second.rows[0][5]) is float


def test_special_floats_round_trip(tmp_path):
    r = GoldResult("ok", ["v"], [(float("inf"),), (float("-inf"),), (float("nan"),), (5e-324,), (-0.0,)], 5)
    back = GoldResult.from_dict(json.loads(json.dumps(r.to_dict(), allow_nan=False)))
    assert back.rows[0][0] == math.inf and back.rows[1][0] == -math.inf and math.isnan(back.rows[2][0])
    assert back.rows[3][0] == 5e-324 and math.copysign(1.0, back.rows[4][0]) == -1.0


def test_timeout_rerun_only_when_longer_limit(db, tmp_path):
    ex = SqliteExecutor()
    with GoldCache(tmp_path / "c", executor=ex, timeout_s=0.1) as c:
        assert c.get(db, RECURSIVE).status == "timeout"
    with GoldCache(tmp_path / "c", executor=ex, timeout_s=0.05) as c:
        assert c.get(db, RECURSIVE).status == "timeout"
    assert len(ex.calls) == 1  # measured with a longer limit: trusted
    with GoldCache(tmp_path / "c", executor=ex, timeout_s=0.3) as c:
        assert c.get(db, RECURSIVE).status == "timeout"
    assert len(ex.calls) == 2  # shorter limit than ours: measured again


def test_corrupt_cache_is_not_trusted(db, tmp_path):
    cache_dir = tmp_path / "c"
    with GoldCache(cache_dir, executor=SqliteExecutor()) as c:
        c.get(db, GOLDS[0])
    # tamper with an entry's payload: checksum mismatch -> re-executed
    con = sqlite3.connect(cache_dir / CACHE_FILE)
    con.execute("UPDATE gold SET payload = replace(payload, '\"a\"', '\"A\"')")
    con.commit()
    con.close()
    ex = SqliteExecutor()
    with pytest.warns(RuntimeWarning, match="checksum"), GoldCache(cache_dir, executor=ex) as c:
        assert c.get(db, GOLDS[0]).rows[0] == (1, "a")
    assert len(ex.calls) == 1
    # garbage file (e.g. a torn copy): moved aside, never read
    (cache_dir / CACHE_FILE).write_bytes(b"not a database" * 100)
    ex = SqliteExecutor()
    with pytest.warns(RuntimeWarning, match="moved it to"), GoldCache(cache_dir, executor=ex) as c:
        assert c.get(db, GOLDS[0]).status == "ok"
    assert len(ex.calls) == 1
    assert list(cache_dir.glob(f"{CACHE_FILE}.corrupt-*"))


def test_killed_writer_leaves_consistent_cache(db, tmp_path):
    """A process killed mid-run leaves a cache whose entries are all complete."""
    cache_dir = tmp_path / "c"
    code = f"""
import os, sys
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
from test_goldcache import SqliteExecutor
from sqlrl.tasks.goldcache import GoldCache
c = GoldCache({str(cache_dir)!r}, executor=SqliteExecutor())
for i in range(50):
    c.get({str(db)!r}, f"SELECT {{i}} AS v, id FROM t")
os._exit(9)  # no close(), no cleanup
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 9, proc.stderr
    ex = SqliteExecutor()
    with GoldCache(cache_dir, executor=ex) as c:
        for i in range(50):
            assert c.get(db, f"SELECT {i} AS v, id FROM t").rows[0] == (i, 1)
    assert ex.calls == []


def test_worker_crash_is_retried_not_cached(db):
    ex = SqliteExecutor(crash_first=1)
    c = GoldCache(None, executor=ex, retries=2)
    assert c.get(db, GOLDS[0]).status == "ok" and len(ex.calls) == 2
    ex = SqliteExecutor(crash_first=10)
    c = GoldCache(None, executor=ex, retries=1)
    with pytest.raises(GoldCacheError, match="infrastructure"):
        c.get(db, GOLDS[0])
    ex.crash_first = 0
    assert c.get(db, GOLDS[0]).status == "ok"  # the crash was not cached


def test_cache_must_live_outside_database_folder(db):
    with pytest.raises(ValueError, match="policy can reach"):
        GoldCache(db.parent / "cache", executor=SqliteExecutor()).get(db, GOLDS[0])
    with pytest.raises(ValueError, match="policy can reach"):
        GoldCache(db.parent.parent / ".gold", executor=SqliteExecutor()).get(db, GOLDS[0])


def test_default_executor_is_lazy():
    c = GoldCache(None)
    assert c._executor is None  # nothing started until a gold is executed
    c.close()


def test_real_sandbox_if_available(db):
    pytest.importorskip("sqlrl.sql.sandbox")
    with GoldCache(None, timeout_s=0.5, workers=1) as c:
        audit = audit_golds([task(db, i, sql) for i, sql in enumerate(GOLDS)], c)
    assert audit.scorable == 1
    assert dict(audit.excluded) == {"gold_error": 1, "gold_empty": 1, "gold_timeout": 1}


def test_audit_cli_on_embedded(tmp_path):
    pytest.importorskip("sqlrl.sql.sandbox")
    cmd = [sys.executable, "-m", "sqlrl.cli", "data", "audit", "--json", "--cache", str(tmp_path / "gc")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    data = SpiderData(embedded_root())
    assert out["examples"] == len(data.load("train_spider")) and out["databases"] == 8
    assert out["scorable"] + sum(out["excluded"].values()) == out["examples"]
    assert set(out["excluded"]) <= {"gold_error", "gold_empty", "gold_timeout"}
    assert out["fingerprint"] == data.fingerprint("train_spider")
    # second run: everything from the disk cache
    proc2 = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out2 = json.loads(proc2.stdout)
    assert out2["cache_hits"] == out["examples"] and out2["excluded"] == out["excluded"]
    # human-readable table
    proc3 = subprocess.run(
        cmd[:-3] + ["--cache", str(tmp_path / "gc")], capture_output=True, text=True, timeout=300
    )
    assert proc3.returncode == 0 and "scorable" in proc3.stdout and "fingerprint" in proc3.stdout


@pytest.mark.slow
def test_audit_real_spider(tmp_path):
    if not (SPIDER / "train_spider.json").is_file():
        pytest.skip(f"Spider data not found at {SPIDER}")
    pytest.importorskip("sqlrl.sql.sandbox")
    tasks = SpiderData(SPIDER).load("train_spider")
    with GoldCache(tmp_path / "gc") as c:
        audit = audit_golds(tasks, c)
    assert audit.n == 6904
    assert audit.scorable + sum(audit.excluded.values()) == 6904
    # the folder's README documents 3 erroring and 254 empty golds
    assert audit.excluded["gold_error"] == 3 and audit.excluded["gold_empty"] == 254
    assert "gold_unstable" not in audit.excluded  # no Spider train gold reads the clock or random()


def test_resolved_paths_shared_by_calls_and_sql_hashes_remembered(db, tmp_path):
    """`get_many(..., resolved=d)`: the same results as without; each database path is stat'ed once
    for every call sharing `d` (a replaced file is seen from the next dict on); the remembered SQL
    hashes are the sha256 of the text."""
    import hashlib
    import os
    import shutil

    cache = GoldCache(executor=SqliteExecutor())
    items = [(str(db), GOLDS[0]), (str(db), GOLDS[2]), (str(db), GOLDS[0])]
    plain = cache.get_many(items, progress=False)
    memo: dict = {}
    shared = cache.get_many(items, progress=False, resolved=memo)
    assert [r.to_dict() for r in shared] == [r.to_dict() for r in plain]
    assert list(memo) == [str(db)]
    for sql in GOLDS[:3]:
        assert cache._sql_sha(sql) == hashlib.sha256(sql.encode("utf-8")).hexdigest()
    # the file replaced with other bytes: a call sharing the old dict still uses the old resolution,
    # a fresh dict (or none) stats the file again and gets a new database hash, hence a new execution
    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (id INTEGER, x REAL, b BLOB, s TEXT)")
    con.execute("INSERT INTO t VALUES (9, 0, NULL, 'z')")
    con.commit()
    con.close()
    os.remove(db)
    shutil.copy(other, db)
    n = len(cache._executor.calls)
    stale = cache.get_many([(str(db), GOLDS[0])], progress=False, resolved=memo)[0]
    assert stale.rows == plain[0].rows and len(cache._executor.calls) == n
    fresh = cache.get_many([(str(db), GOLDS[0])], progress=False, resolved={})[0]
    assert fresh.rows == [(9, "z")] and len(cache._executor.calls) == n + 1


def _numbers_db(path: Path, n: int) -> Path:
    """A real database whose table t holds x = 1..n."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (x INTEGER PRIMARY KEY, s TEXT)")
    con.execute(
        f"WITH RECURSIVE c(v) AS (SELECT 1 UNION ALL SELECT v + 1 FROM c LIMIT {n}) "
        "INSERT INTO t SELECT v, printf('%.*c', 100, 's') FROM c"
    )
    con.commit()
    con.close()
    return path


def test_gold_over_the_row_cap_is_too_many_rows_with_its_own_reason(tmp_path):
    """One row cap for gold and prediction: a gold over it is unscorable (gold_too_many_rows, its
    own reason, counted by the audit), at the cap it is scorable; the cached verdict follows the cap."""
    db = _numbers_db(tmp_path / "data" / "nums.sqlite", 150)
    over, at_cap = "SELECT x FROM t", "SELECT x FROM t WHERE x <= 100"
    cache_dir = tmp_path / "cache"
    with GoldCache(cache_dir, max_rows=100, workers=1) as gc:
        r = gc.get(db, over)
        assert (r.status, r.rows, r.row_count) == ("too_many_rows", [], 0), r
        assert not r.scorable and r.unscorable_reason == "gold_too_many_rows"
        assert gc.get(db, at_cap).scorable and gc.get(db, at_cap).row_count == 100
        tasks = [
            PrivateTask(PublicTask(f"t/{i}", "nums", "q?", "", "", str(db)), sql)
            for i, sql in enumerate((over, at_cap, over))
        ]
        audit = audit_golds(tasks, gc, progress=False)
        assert audit.scorable == 1 and dict(audit.excluded) == {"gold_too_many_rows": 2}
    with GoldCache(cache_dir, max_rows=200, workers=1) as gc:  # a larger cap measures again
        assert gc.get(db, over).row_count == 150 and gc.executions == 1
    with GoldCache(cache_dir, max_rows=120, workers=1) as gc:  # the 150 rows cached above: over 120
        assert gc.get(db, over).status == "too_many_rows" and gc.executions == 0


def test_gold_over_the_byte_cap_is_too_large_with_its_own_reason(tmp_path):
    db = _numbers_db(tmp_path / "data" / "nums.sqlite", 150)
    with GoldCache(tmp_path / "cache", max_result_bytes=5_000, workers=1) as gc:
        r = gc.get(db, "SELECT s FROM t")  # 150 x 100 characters
        assert (r.status, r.unscorable_reason, r.rows) == ("too_large", "gold_too_large", []), r
        assert gc.get(db, "SELECT s FROM t WHERE x <= 10").scorable
    with GoldCache(tmp_path / "cache", workers=1) as gc:  # the default 8 MiB cap: measured again
        assert gc.get(db, "SELECT s FROM t").row_count == 150


UNSTABLE = [  # (gold, what it reads): random() or the clock
    ("SELECT random()", "random"),
    ("SELECT abs(RANDOM ()) % 2 FROM t", "random"),
    ("SELECT hex(randomblob(4))", "random"),
    ("SELECT id FROM t ORDER BY random() LIMIT 1", "random"),
    ("SELECT date('now')", "clock"),
    ("SELECT strftime('%Y', 'NOW') - 1990", "clock"),
    ("SELECT julianday( 'now' ) - julianday(s) FROM t", "clock"),
    ("SELECT id FROM t WHERE date(s, 'start of month') < date('now', '-1 day')", "clock"),
    ("SELECT CURRENT_TIMESTAMP", "clock"),
    ("SELECT id FROM t WHERE s < current_date", "clock"),
    ("SELECT datetime()", "clock"),
    ("SELECT unixepoch ( )", "clock"),
]
STABLE = [  # date functions on stored values, and the words elsewhere
    "SELECT strftime('%Y', s) FROM t",
    "SELECT date(s), time(s, '+1 hour') FROM t",
    "SELECT id FROM t WHERE s = 'now'",  # a plain string, no date function
    "SELECT id AS random FROM t",
    "SELECT current_dates FROM t",
    "SELECT id, s FROM t ORDER BY id",
]


@pytest.mark.parametrize("sql,what", UNSTABLE)
def test_a_gold_reading_random_or_the_clock_is_unstable(sql, what):
    why = unstable_gold(sql)
    assert why is not None and ("random()" in why if what == "random" else "clock" in why)


@pytest.mark.parametrize("sql", STABLE)
def test_date_functions_on_stored_values_are_stable(sql):
    assert unstable_gold(sql) is None


def test_unstable_golds_are_excluded_with_their_own_reason_never_run_or_cached(db, tmp_path):
    """A gold whose result changes between runs is no answer: excluded as gold_unstable, counted, not
    executed, and nothing of it reaches the disk cache (a later run on another date would read it)."""
    ex = SqliteExecutor()
    golds = [GOLDS[0], "SELECT id FROM t ORDER BY random() LIMIT 1", "SELECT date('now')"]
    with GoldCache(tmp_path / "gc", executor=ex) as cache:
        audit = audit_golds([task(db, i, sql) for i, sql in enumerate(golds)], cache)
        r = cache.get(db, golds[2])
    assert audit.scorable == 1 and dict(audit.excluded) == {"gold_unstable": 2}
    assert audit.per_task["tiny/00001"] == "gold_unstable" and audit.per_task["tiny/00002"] == "gold_unstable"
    assert ex.calls == [(str(db.resolve()), GOLDS[0])]
    assert r.status == "unstable" and not r.scorable and r.unscorable_reason == "gold_unstable"
    assert "clock" in r.message and r.rows == []
    con = sqlite3.connect(tmp_path / "gc" / CACHE_FILE)
    try:
        (n,) = con.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()
        tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        rows = sum(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables)
    finally:
        con.close()
    assert n >= 1 and rows == 1  # only the stable gold
