"""ReplicaPool: isolation, lazy reset, DDL, crash/timeout, denied statements, template checks, threads."""

from __future__ import annotations

import os
import sqlite3
import threading

import pytest

from sqlrl.sql.replicas import CopyPerRollout, PoolExhausted, ReplicaPool, TemplateChanged, sha256_file


def make_template(path: str, n: int = 200) -> str:
    """A template with `n` rows in `t`, an empty `marks` and a ~400 KiB `pad` table, read-only, at `path`."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    c = sqlite3.connect(path)
    c.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
    c.executemany("INSERT INTO t(id, v) VALUES (?, ?)", [(i, f"row{i}") for i in range(n)])
    c.execute("CREATE TABLE marks(owner TEXT, k INTEGER)")
    c.execute("CREATE TABLE pad(b BLOB)")  # ~400 KiB, so that a small write touches a small fraction
    c.executemany("INSERT INTO pad VALUES (?)", [(bytes([i % 251]) * 100,) for i in range(4000)])
    c.commit()
    c.close()
    os.chmod(path, 0o444)
    return path


@pytest.fixture()
def tpl(tmp_path):
    return make_template(str(tmp_path / "data" / "shop" / "shop.sqlite"))


def _schema(pool: ReplicaPool, tid: str) -> list:
    r = pool.execute(tid, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
    assert r.status == "ok", r
    return r.rows


def test_isolation_and_same_binding(tpl, tmp_path):
    sha = sha256_file(tpl)
    tpl2 = make_template(str(tmp_path / "data" / "other" / "other.sqlite"), n=5)
    with ReplicaPool([tpl, tpl2], tmp_path / "pool", replicas_per_db=2, workers=2) as pool:
        a = pool.lease("A", "shop")
        b = pool.lease("B", "shop")
        assert a.path != b.path and not a.path.startswith(os.path.dirname(tpl))
        assert pool.lease("A", "shop") == a  # same trajectory -> same binding
        with pytest.raises(ValueError):
            pool.lease("A", "other")  # a bound trajectory id cannot switch databases
        assert pool.execute("A", "INSERT INTO marks VALUES ('A', 1)").status == "ok"
        assert pool.execute("B", "INSERT INTO marks VALUES ('B', 2)").status == "ok"
        assert pool.execute("A", "SELECT owner FROM marks").rows == [("A",)]
        assert pool.execute("B", "SELECT owner FROM marks").rows == [("B",)]
        assert pool.execute("A", "UPDATE t SET v = 'x' WHERE id < 10").status == "ok"
        assert pool.execute("B", "SELECT count(*) FROM t WHERE v = 'x'").rows == [(0,)]
        assert pool.release("A") is True and pool.release("B") is True
        with pytest.raises(KeyError):
            pool.execute("A", "SELECT 1")
    assert sha256_file(tpl) == sha


@pytest.mark.parametrize("wal", [True, False])
def test_lazy_reset_counts_bytes(tpl, tmp_path, wal):
    size = os.path.getsize(tpl)
    with ReplicaPool({"shop": tpl}, tmp_path / "pool", replicas_per_db=1, workers=1, wal_reset=wal) as pool:
        pool.lease("t1", "shop")
        assert pool.execute("t1", "SELECT count(*) FROM t").rows == [(200,)]
        assert pool.execute("t1", "SELECT * FROM t WHERE id = 3").rows == [(3, "row3")]
        assert pool.release("t1") is False  # read-only: clean
        assert pool.stats()["bytes_copied"] == size  # the first (lazy) creation only
        for i in range(3):  # clean replica is NOT copied again
            pool.lease(f"r{i}", "shop")
            assert pool.execute(f"r{i}", "SELECT count(*) FROM t").rows == [(200,)]
            assert pool.release(f"r{i}") is False
        assert pool.stats()["bytes_copied"] == size and pool.stats()["resets"] == 1
        pool.lease("w", "shop")
        assert pool.execute("w", "DELETE FROM t WHERE id > 10").status == "ok"
        assert pool.release("w") is True
        s = pool.stats()
        assert s["bytes_copied"] == size and s["dirty_releases"] == 1  # lazy: not yet reset
        assert pool.replica_state("shop")[0]["needs_reset"] is True
        lease = pool.lease("after", "shop")
        # WAL: the -wal file is discarded, the main file was never written; delta: only the differing
        # blocks are rewritten. Either way byte-identical to the clean image (WAL: template except
        # header bytes 18-19, the WAL-mode flag).
        assert sha256_file(lease.path) == pool.replica_sha256["shop"]
        assert (pool.replica_sha256["shop"] == sha256_file(tpl)) is (not wal)
        assert pool.execute("after", "SELECT count(*) FROM t").rows == [(200,)]
        pool.release("after")
        s = pool.stats()
        assert s["resets"] == 2 and s["delta_resets"] == int(not wal) and s["wal_resets"] == int(wal)
        if wal:
            assert s["bytes_copied"] == size and 0 < s["wal_bytes"] < size // 10
            assert s["bytes_read"] == size + 136 + 32  # first copy + -shm and -wal headers checked
        else:
            assert size < s["bytes_copied"] < 2 * size
        assert s["leases"] == 6 and s["clean_releases"] == 5 and s["dirty_releases"] == 1


def test_full_copy_reset(tpl, tmp_path):
    size = os.path.getsize(tpl)
    with ReplicaPool(
        {"shop": tpl}, tmp_path / "pool", replicas_per_db=1, workers=1, delta_reset=False, wal_reset=False
    ) as pool:
        pool.lease("w", "shop")
        assert pool.execute("w", "CREATE TABLE big AS SELECT * FROM t, t AS u").status == "ok"  # file grows
        assert pool.release("w") is True
        lease = pool.lease("after", "shop")
        assert sha256_file(lease.path) == sha256_file(tpl)
        pool.release("after")
        assert pool.stats()["bytes_copied"] == 2 * size and pool.stats()["delta_resets"] == 0


def test_delta_reset_after_growth_truncates(tpl, tmp_path):
    with ReplicaPool(
        {"shop": tpl}, tmp_path / "pool", replicas_per_db=1, workers=1, delta_max_frac=1e9, wal_reset=False
    ) as pool:
        lease = pool.lease("w", "shop")
        assert pool.execute("w", "CREATE TABLE big AS SELECT * FROM t, t AS u").status == "ok"
        assert os.path.getsize(lease.path) > os.path.getsize(tpl)
        assert pool.release("w") is True
        lease = pool.lease("after", "shop")
        assert sha256_file(lease.path) == sha256_file(tpl) and pool.stats()["delta_resets"] == 1
        assert pool.execute("after", "SELECT count(*) FROM sqlite_master WHERE name = 'big'").rows == [(0,)]
        pool.release("after")


def test_conservative_dirty_rules(tpl, tmp_path):
    with ReplicaPool({"shop": tpl}, tmp_path / "pool", replicas_per_db=1, workers=1) as pool:
        pool.lease("a", "shop")
        assert pool.execute("a", "UPDATE t SET v = 'z' WHERE id = -1").status == "ok"  # zero rows
        assert pool.release("a") is True  # cannot prove cheaply: dirty
        pool.lease("b", "shop")
        r = pool.execute("b", "INSERT INTO t(id, v) VALUES (1, 'dup')")  # fails, rolled back
        assert r.status == "runtime_error" and "UNIQUE" in r.message
        assert pool.release("b") is True
        pool.lease("c", "shop")
        assert pool.execute("c", "PRAGMA table_info(t)").status == "ok"
        assert pool.execute("c", "WITH x AS (SELECT 1) SELECT * FROM x").status == "ok"
        assert pool.release("c") is False
        pool.lease("d", "shop")
        assert pool.execute("d", "CREATE TEMP TABLE tmp(a)").status == "ok"  # connection state
        assert pool.release("d") is True
        pool.lease("e", "shop")
        assert pool.execute("e", "SELECT * FROM tmp").status == "runtime_error"  # gone after reset
        assert pool.release("e", crashed=True) is True


def test_ddl_marks_dirty_and_reset_restores_schema(tpl, tmp_path):
    with ReplicaPool({"shop": tpl}, tmp_path / "pool", replicas_per_db=1, workers=1) as pool:
        pool.lease("s", "shop")
        clean = _schema(pool, "s")
        pool.release("s")
        pool.lease("d", "shop")
        for sql in (
            "ALTER TABLE t ADD COLUMN extra INTEGER",
            "ALTER TABLE marks RENAME TO marks2",
            "CREATE TABLE fresh(a, b)",
            "CREATE INDEX ix ON t(v)",
            "CREATE VIEW vv AS SELECT id FROM t",
            "DROP TABLE marks2",
        ):
            r = pool.execute("d", sql)
            assert r.status == "ok", (sql, r)
        assert _schema(pool, "d") != clean
        assert pool.release("d") is True
        pool.lease("n", "shop")
        assert _schema(pool, "n") == clean
        pool.release("n")


def test_timeout_and_crash_release_dirty(tpl, tmp_path):
    forever = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c"
    with ReplicaPool(
        {"shop": tpl}, tmp_path / "pool", replicas_per_db=1, workers=1, timeout_s=0.3, hard_timeout_s=1.5
    ) as pool:
        # soft deadline (progress handler), after a write in the same lease
        pool.lease("a", "shop")
        assert pool.execute("a", "INSERT INTO marks VALUES ('a', 1)").status == "ok"
        assert pool.execute("a", forever).status == "timeout"
        assert pool.release("a") is True
        pool.lease("b", "shop")
        assert pool.execute("b", "SELECT count(*) FROM marks").rows == [(0,)]
        # a read-only statement that timed out still releases dirty
        assert pool.execute("b", forever).status == "timeout"
        assert pool.release("b") is True
        # worker killed under a trajectory: worker_crash, dirty, fresh worker for the next one
        pool.lease("c", "shop")
        assert pool.execute("c", "INSERT INTO marks VALUES ('c', 1)").status == "ok"
        pool.kill_worker("c")
        assert pool.execute("c", "SELECT 1").status == "worker_crash"
        assert pool.release("c") is True
        pool.lease("d", "shop")
        assert pool.execute("d", "SELECT count(*) FROM marks").rows == [(0,)]
        pool.release("d")
        s = pool.stats()
        assert s["timeouts"] == 2 and s["worker_crashes"] == 1
    # watchdog: the progress handler is off, so only the parent's hard limit stops the statement
    with ReplicaPool(
        {"shop": tpl},
        tmp_path / "pool2",
        replicas_per_db=1,
        workers=1,
        timeout_s=0.3,
        hard_timeout_s=1.0,
        progress_ops=0,
    ) as pool:
        pool.lease("h", "shop")
        r = pool.execute("h", forever)
        assert r.status == "timeout" and "killed" in r.message
        assert pool.release("h") is True
        pool.lease("i", "shop")
        assert pool.execute("i", "SELECT count(*) FROM t").rows == [(200,)]
        pool.release("i")


def test_denied_statements_leave_template_unchanged(tpl, tmp_path):
    sha = sha256_file(tpl)
    other = tmp_path / "evil.sqlite"
    vac = tmp_path / "vacuum_into.sqlite"
    with ReplicaPool({"shop": tpl}, tmp_path / "pool", replicas_per_db=1, workers=1) as pool:
        pool.lease("x", "shop")
        denied = [
            f"ATTACH DATABASE '{other}' AS evil",
            f"ATTACH '{tpl}' AS tpl",
            "DETACH DATABASE main",
            "VACUUM",
            f"VACUUM INTO '{vac}'",
            "PRAGMA writable_schema = 1",
            "PRAGMA journal_mode = DELETE",
            "PRAGMA query_only = 0",
            "PRAGMA main.synchronous = FULL",
            "SELECT load_extension('/tmp/x.so')",
            "BEGIN",
            "BEGIN IMMEDIATE",
            "COMMIT",
            "END",
            "ROLLBACK",
            "SAVEPOINT s1",
            "RELEASE s1",
            "PRAGMA wal_checkpoint(TRUNCATE)",
            "PRAGMA wal_autocheckpoint = 1",
            "PRAGMA journal_mode = WAL",
            "PRAGMA cache_spill = 0",
            "ANALYZE",
            "EXPLAIN VACUUM",
            "CREATE VIRTUAL TABLE v USING fts5(a)",
            "SELECT * FROM pragma_database_list",  # table-valued pragma outside the allowlist
        ]
        for sql in denied:
            r = pool.execute("x", sql)
            assert r.status == "forbidden", (sql, r)
        # pragmas with side effects have no table-valued form at all
        assert pool.execute("x", "SELECT * FROM pragma_wal_checkpoint").status == "runtime_error"
        assert pool.execute("x", "SELECT 1; DROP TABLE t").status == "multiple_statements"
        assert pool.execute("x", "   ").status == "empty_sql"
        assert pool.execute("x", "SELECT count(*) FROM t").rows == [(200,)]
        pool.release("x")
    assert sha256_file(tpl) == sha
    assert not other.exists() and not vac.exists()


def test_template_change_detected(tmp_path):
    """Delta / full resets read the template and refuse changed bytes. (WAL resets read no template
    bytes; see test_pool_wal.py::test_wal_reset_ignores_template_change_fallback_detects_it.)"""
    tpl = make_template(str(tmp_path / "data" / "db" / "db.sqlite"))
    with pytest.raises(ValueError, match="data folder"):
        ReplicaPool({"db": tpl}, tmp_path / "data" / "db" / "replicas")
    with ReplicaPool({"db": tpl}, tmp_path / "pool", replicas_per_db=1, workers=1, wal_reset=False) as pool:
        pool.lease("a", "db")
        assert pool.execute("a", "INSERT INTO marks VALUES ('a', 1)").status == "ok"
        pool.release("a")  # dirty: the next lease needs a reset copy
        os.chmod(tpl, 0o644)
        c = sqlite3.connect(tpl)
        c.execute("INSERT INTO t(id, v) VALUES (9999, 'changed')")
        c.commit()
        c.close()
        with pytest.raises(TemplateChanged, match="changed since the pool started"):
            pool.lease("b", "db")
        assert pool.replica_state("db")[0] == {
            "index": 0,
            "worker": 0,
            "available": True,
            "needs_reset": True,
        }
        assert pool.stats()["resets"] == 1  # the failed copy was never installed


def test_exhaustion(tpl, tmp_path):
    with ReplicaPool({"shop": tpl}, tmp_path / "pool", replicas_per_db=1, workers=1) as pool:
        pool.lease("a", "shop")
        with pytest.raises(PoolExhausted, match="all leased"):
            pool.lease("b", "shop", timeout_s=0)
        with pytest.raises(KeyError):
            pool.lease("b", "nope")
        threading.Timer(0.3, pool.release, args=("a",)).start()
        lease = pool.lease("b", "shop", timeout_s=10)  # blocks until "a" is released
        assert lease.replica == 0
        assert pool.stats()["exhausted"] == 1
        pool.release("b")


def test_concurrent_threads_never_interfere(tpl, tmp_path):
    errors: list = []
    with ReplicaPool({"shop": tpl}, tmp_path / "pool", replicas_per_db=4, workers=2) as pool:

        def run(th: int) -> None:
            try:
                for i in range(20):
                    tid = f"th{th}-{i}"
                    pool.lease(tid, "shop", timeout_s=60)
                    if i % 3 == 0:  # some read-only trajectories
                        r = pool.execute(tid, "SELECT count(*) FROM marks")
                        assert r.rows == [(0,)], (tid, r)
                    else:
                        for k in range(2):
                            assert pool.execute(tid, f"INSERT INTO marks VALUES ('{tid}', {k})").ok
                        r = pool.execute(tid, "SELECT DISTINCT owner FROM marks")
                        assert r.rows == [(tid,)], (tid, r)
                    r = pool.execute(tid, "SELECT count(*) FROM t")
                    assert r.rows == [(200,)]
                    pool.release(tid)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=run, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors[:3]
        s = pool.stats()
        assert s["leases"] == 160 and s["active_leases"] == 0
        assert s["dirty_releases"] == 8 * 13 and s["clean_releases"] == 8 * 7


def test_copy_per_rollout_baseline(tpl, tmp_path):
    size = os.path.getsize(tpl)
    with CopyPerRollout({"shop": tpl}, tmp_path / "cpr", replicas_per_db=2, workers=1) as base:
        for i in range(3):
            base.lease(f"t{i}", "shop")
            assert base.execute(f"t{i}", "SELECT count(*) FROM t").rows == [(200,)]
            base.release(f"t{i}")
        assert base.stats()["bytes_copied"] == 3 * size
