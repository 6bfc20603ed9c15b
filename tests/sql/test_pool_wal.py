"""ReplicaPool in WAL mode (the default): the main replica file is never written during a lease, a dirty
replica is reset by discarding its -wal/-shm files, and every case the pool cannot prove falls back to the
delta / full reset. Byte-level checks: sha256 of the main file == `pool.replica_sha256` (the template with
header bytes 18-19 = 2); logical checks: `iterdump()` of the replica == of the template."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import pytest
from test_pool import make_template  # the same 200-row shop template with a ~400 KiB pad table

from sqlrl.sql.replicas import ReplicaPool, TemplateChanged, sha256_file

FOREVER_INSERT = (
    "INSERT INTO marks SELECT 'loop', x FROM "
    "(WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c)"
)


@pytest.fixture()
def tpl(tmp_path):
    return make_template(str(tmp_path / "data" / "shop" / "shop.sqlite"))


def dump_db(path: str) -> list[str]:
    """Logical content through a read-only connection (the test process holds no other connection)."""
    c = sqlite3.connect("file:" + path + "?mode=ro", uri=True)
    try:
        assert c.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        return list(c.iterdump())
    finally:
        c.close()


def _wal_size(path: str) -> int:
    return os.path.getsize(path + "-wal") if os.path.exists(path + "-wal") else 0


def test_many_leases_end_byte_identical(tpl, tmp_path):
    """Writes, DDL, a large write (spills past the page cache), an interrupted write, INSERT OR ROLLBACK
    and a killed worker: after each lease the next one starts on a replica whose main file is the clean
    image and whose content equals the template's."""
    clean_dump = dump_db(tpl)
    big = "CREATE TABLE big AS SELECT a.id, a.v, p.b FROM t AS a, pad AS p WHERE p.rowid <= 200"  # ~4.5 MB
    scenarios = {
        "dml": [
            "INSERT INTO marks VALUES ('a', 1)",
            "UPDATE t SET v = 'x' WHERE id < 50",
            "DELETE FROM pad WHERE rowid % 3 = 0",
        ],
        "ddl": [
            "CREATE TABLE fresh(a, b)",
            "INSERT INTO fresh VALUES (1, 2)",
            "ALTER TABLE t ADD COLUMN extra INTEGER DEFAULT 7",
            "ALTER TABLE marks RENAME TO marks2",
            "CREATE INDEX ix ON t(v)",
            "CREATE VIEW vv AS SELECT id FROM t",
            "DROP TABLE marks2",
            "DROP TABLE pad",
        ],
        "big": [big, "UPDATE big SET v = v || '!'"],
        "interrupted": [
            "INSERT INTO marks VALUES ('i', 1)",
            FOREVER_INSERT,
            "INSERT OR ROLLBACK INTO t VALUES (1, 'd')",
        ],
        "crash": ["INSERT INTO marks VALUES ('c', 1)", "KILL"],
    }
    with ReplicaPool(
        {"shop": tpl}, tmp_path / "pool", replicas_per_db=1, workers=1, timeout_s=0.5, hard_timeout_s=3.0
    ) as pool:
        image = pool.replica_sha256["shop"]
        for rnd in range(2):
            for name, stmts in scenarios.items():
                tid = f"{name}-{rnd}"
                lease = pool.lease(tid, "shop")
                assert sha256_file(lease.path) == image and dump_db(lease.path) == clean_dump, tid
                for sql in stmts:
                    if sql == "KILL":
                        pool.kill_worker(tid)
                        assert pool.execute(tid, "SELECT 1").status == "worker_crash"
                        # the committed write survived the kill (it is in the WAL)
                        assert pool.execute(tid, "SELECT owner FROM marks").rows == [("c",)]
                        continue
                    r = pool.execute(tid, sql)
                    if sql == FOREVER_INSERT:
                        assert r.status == "timeout", r
                    elif sql.startswith("INSERT OR ROLLBACK"):
                        assert r.status == "runtime_error" and "UNIQUE" in r.message, r
                    else:
                        assert r.status == "ok", (sql, r)
                if name == "interrupted":  # the earlier write stays, the interrupted one left nothing
                    assert pool.execute(tid, "SELECT owner, count(*) FROM marks GROUP BY 1").rows == [
                        ("i", 1)
                    ]
                if name == "big":
                    assert pool.execute(tid, "SELECT count(*) FROM big").rows == [(40000,)]
                    assert _wal_size(lease.path) > 4 * 2**20
                # during the lease, the trajectory's state lives in the -wal file only
                assert sha256_file(lease.path) == image, tid
                assert _wal_size(lease.path) > 0, tid
                assert pool.release(tid) is True
        lease = pool.lease("final", "shop")
        assert sha256_file(lease.path) == image and dump_db(lease.path) == clean_dump
        assert not os.path.exists(lease.path + "-journal")
        pool.release("final")
        s = pool.stats()
    # 1 creation; per round 4 WAL resets and 1 delta fallback (the killed worker took its pin along)
    assert s["resets"] == 11 and s["wal_resets"] == 8 and s["delta_resets"] == 2, s
    assert s["bytes_copied"] < 1.1 * os.path.getsize(tpl), s  # the creation + two small deltas
    assert s["wal_bytes"] > 8 * 2**20  # what SQLite wrote into the discarded WAL files


def test_scorer_connection_sees_state_and_cannot_checkpoint(tpl, tmp_path):
    """debugtasks scores on `lease.path` through its own connection in the parent: it sees the committed
    state, may write (even past the autocheckpoint threshold, or ask for a checkpoint), and still the
    main file is untouched, so a crashed=True release is a WAL reset."""
    big = "CREATE TABLE sc AS SELECT p.b FROM t AS a, pad AS p WHERE p.rowid <= 250"  # >1000 pages of WAL
    with ReplicaPool({"shop": tpl}, tmp_path / "pool", replicas_per_db=1, workers=1) as pool:
        image = pool.replica_sha256["shop"]
        for tid, via_pool in (("s1", True), ("s2", False)):  # s2: no statement through the pool at all
            lease = pool.lease(tid, "shop")
            if via_pool:
                assert pool.execute(tid, "INSERT INTO marks VALUES ('s1', 1)").status == "ok"
            c = sqlite3.connect(lease.path, isolation_level=None, timeout=0.2)
            try:
                want = [("s1",)] if via_pool else []
                assert c.execute("SELECT owner FROM marks").fetchall() == want
                c.execute(big)
                c.execute("INSERT INTO marks VALUES ('scorer', 2)")
                busy = c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                assert busy[0] == 1  # SQLITE_BUSY: the worker's pin holds WAL read-lock 0
                with pytest.raises(sqlite3.OperationalError, match="locked"):
                    c.execute("PRAGMA journal_mode=DELETE")
            finally:
                c.close()  # not the last connection: no checkpoint-on-close
            assert sha256_file(lease.path) == image
            if via_pool:  # and the worker's connection sees the scorer's writes
                assert pool.execute(tid, "SELECT count(*) FROM marks").rows == [(2,)]
            assert pool.release(tid, crashed=True) is True
        lease = pool.lease("n", "shop")
        assert pool.execute("n", "SELECT count(*) FROM sqlite_master WHERE name = 'sc'").rows == [(0,)]
        assert pool.execute("n", "SELECT count(*) FROM marks").rows == [(0,)]
        assert sha256_file(lease.path) == image
        pool.release("n")
        s = pool.stats()
        assert s["wal_resets"] == 2 and s["delta_resets"] == 0 and s["resets"] == 3


_CHECKPOINT_AND_EXIT = """
import os, sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("INSERT INTO marks VALUES ('evil', 1)")
c.execute("UPDATE t SET v = 'evil'")
if sys.argv[2] == "passive":
    print(c.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone())
    os._exit(0)  # no close: -wal and -shm stay, with nBackfill > 0
c.close()  # last connection: checkpoints into the main file and deletes -wal / -shm
"""


@pytest.mark.parametrize("how", ["passive", "close"])
def test_unpinned_checkpoint_is_detected(tpl, tmp_path, how):
    """If the pin is gone (worker killed), another connection may checkpoint into the main file. Even when
    the pool's own bookkeeping is forced to believe otherwise (white-box: pin_ok and the file signature
    are overwritten), the -wal / -shm checks refuse the WAL reset and the delta reset restores the bytes."""
    with ReplicaPool({"shop": tpl}, tmp_path / "pool", replicas_per_db=1, workers=1) as pool:
        image = pool.replica_sha256["shop"]
        lease = pool.lease("a", "shop")
        assert pool.execute("a", "INSERT INTO marks VALUES ('a', 1)").status == "ok"
        pool.kill_worker("a")
        assert pool.execute("a", "SELECT 1").status == "worker_crash"
        subprocess.run([sys.executable, "-c", _CHECKPOINT_AND_EXIT, lease.path, how], check=True, timeout=60)
        assert sha256_file(lease.path) != image  # the main file WAS written
        rep = pool._bindings["a"][1]
        assert rep.pin_ok is False  # the pool knows the pin died ...
        rep.pin_ok = True  # ... pretend it does not, and that the signature still matches
        st = os.stat(lease.path)
        rep.sig = (st.st_size, st.st_mtime_ns, st.st_ino)
        pool.release("a", crashed=True)
        lease = pool.lease("b", "shop")
        s = pool.stats()
        assert s["wal_resets"] == 0 and s["delta_resets"] == 1, s
        assert sha256_file(lease.path) == image
        assert pool.execute("b", "SELECT count(*) FROM marks").rows == [(0,)]
        assert pool.execute("b", "SELECT count(*) FROM t WHERE v = 'evil'").rows == [(0,)]
        pool.release("b")


def test_watchdog_kill_mid_write(tpl, tmp_path):
    """A write killed by the watchdog (no progress handler) leaves uncommitted frames in the WAL: the
    trajectory continues on its committed state, and the release falls back to a verified delta reset."""
    with ReplicaPool(
        {"shop": tpl},
        tmp_path / "pool",
        replicas_per_db=1,
        workers=1,
        timeout_s=0.3,
        hard_timeout_s=1.0,
        progress_ops=0,
    ) as pool:
        image = pool.replica_sha256["shop"]
        lease = pool.lease("k", "shop")
        assert pool.execute("k", "INSERT INTO marks VALUES ('k', 1)").status == "ok"
        r = pool.execute("k", FOREVER_INSERT)
        assert r.status == "timeout" and "killed" in r.message
        assert pool.execute("k", "SELECT owner, count(*) FROM marks GROUP BY 1").rows == [("k", 1)]
        assert sha256_file(lease.path) == image
        assert pool.release("k") is True
        lease = pool.lease("n", "shop")
        assert sha256_file(lease.path) == image and dump_db(lease.path) == dump_db(tpl)
        pool.release("n")
        s = pool.stats()
        assert s["delta_resets"] == 1 and s["wal_resets"] == 0 and s["timeouts"] == 1


def test_wal_reset_ignores_template_change_fallback_detects_it(tmp_path):
    """A WAL reset reads no template bytes: replicas keep the content verified when they were copied. A
    fallback (delta / full) reset reads the template and refuses changed bytes, as before."""
    tpl = make_template(str(tmp_path / "data" / "db" / "db.sqlite"))
    with ReplicaPool({"db": tpl}, tmp_path / "pool", replicas_per_db=1, workers=1) as pool:
        pool.lease("a", "db")
        assert pool.execute("a", "INSERT INTO marks VALUES ('a', 1)").status == "ok"
        pool.release("a")
        os.chmod(tpl, 0o644)
        c = sqlite3.connect(tpl)
        c.execute("INSERT INTO t(id, v) VALUES (9999, 'changed')")
        c.commit()
        c.close()
        pool.lease("b", "db")  # WAL reset: fine, and the replica still holds the verified content
        assert pool.execute("b", "SELECT count(*) FROM t").rows == [(200,)]
        assert pool.execute("b", "INSERT INTO marks VALUES ('b', 1)").status == "ok"
        pool.kill_worker("b")
        assert pool.execute("b", "SELECT 1").status == "worker_crash"
        pool.release("b")
        with pytest.raises(TemplateChanged, match="changed since the pool started"):
            pool.lease("c", "db")  # the fallback delta reset reads the changed template
        assert pool.replica_state("db")[0]["needs_reset"] is True
