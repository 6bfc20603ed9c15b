"""Adversarial tests for ReplicaPool's WAL-discard reset: policy SQL, scorer-side SQL (no authorizer, as in
`debugtasks.apply_submission`), lifecycle misuse and file tampering. Each test checks that the replica
handed out after a reset is the clean image (`replica_sha256`) with the template's `iterdump()`."""

from __future__ import annotations

import os
import sqlite3
import threading

import pytest
from test_pool import make_template
from test_pool_wal import dump_db  # integrity check + iterdump through a read-only connection

from sqlrl.sql.replicas import ReplicaPool, sha256_file


@pytest.fixture()
def tpl(tmp_path):
    return make_template(str(tmp_path / "data" / "shop" / "shop.sqlite"))


def _pool(tpl, tmp_path, **kw):
    args = dict(replicas_per_db=1, workers=1, timeout_s=1.0, hard_timeout_s=3.0)
    args.update(kw)
    return ReplicaPool({"shop": tpl}, tmp_path / "pool", **args)


def _assert_clean(pool, tid, clean_dump):
    """Lease `tid`; its replica must be the clean image, see the template's content, and stay clean."""
    lease = pool.lease(tid, "shop")
    assert sha256_file(lease.path) == pool.replica_sha256["shop"], tid
    assert dump_db(lease.path) == clean_dump, tid
    assert pool.execute(tid, "SELECT count(*) FROM marks").rows == [(0,)]
    assert pool.execute(tid, "SELECT count(*) FROM sqlite_master").rows == [(3,)]
    return lease


# ---------------------------------------------------------------------------------------------- policy SQL

DENIED = [
    "SELECT * FROM pragma_wal_checkpoint",
    "SELECT * FROM pragma_wal_checkpoint('TRUNCATE')",
    "SELECT * FROM pragma_journal_mode('DELETE')",
    "SELECT * FROM pragma_journal_mode",
    "SELECT * FROM pragma_wal_autocheckpoint(1)",
    "PRAGMA main.wal_checkpoint(TRUNCATE)",
    'PRAGMA "wal_checkpoint"',
    "PRAGMA main.journal_mode = DELETE",
    "pragma Journal_Mode=off",
    "PRAGMA temp.journal_mode = DELETE",
    "PRAGMA locking_mode = EXCLUSIVE",
    "PRAGMA writable_schema = 1",
    "PRAGMA main.page_size = 512",
    "VACUUM",
    "/* x */ VACUUM",
    "  vacuum main",
    "VACUUM INTO '/tmp/x.sqlite'",
    "ATTACH 'file:x?nolock=1' AS x",
    "BEGIN IMMEDIATE",
    "SAVEPOINT s",
    "CREATE VIRTUAL TABLE v USING fts5(a)",
    "SELECT load_extension('x')",
    "SELECT * FROM sqlite_dbpage",
    "UPDATE sqlite_dbpage SET data = zeroblob(4096) WHERE pgno = 1",
]


def test_denied_checkpoint_and_journal_mode_sql(tpl, tmp_path):
    clean = dump_db(tpl)
    with _pool(tpl, tmp_path) as pool:
        lease = pool.lease("a", "shop")
        assert pool.execute("a", "INSERT INTO marks VALUES ('a', 1)").status == "ok"
        for sql in DENIED:
            r = pool.execute("a", sql)
            assert r.status in ("forbidden", "runtime_error"), (sql, r)
            assert sha256_file(lease.path) == pool.replica_sha256["shop"], sql
        assert pool.execute("a", "SELECT count(*) FROM marks").rows == [(1,)]
        assert pool.release("a") is True
        _assert_clean(pool, "b", clean)
        pool.release("b")
        assert pool.stats()["wal_resets"] == 1 and pool.stats()["delta_resets"] == 0


WRITES = [
    "INSERT INTO marks VALUES ('r', 1) RETURNING owner, k",
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 500) "
    "INSERT INTO marks SELECT 'cte', x FROM c",
    "REINDEX",
    "CREATE TEMP TABLE tt AS SELECT * FROM t",
    "ALTER TABLE t RENAME TO t_renamed",
    "ALTER TABLE t_renamed RENAME TO t",
    "ALTER TABLE t RENAME COLUMN v TO w",
    "ALTER TABLE t ADD COLUMN z",
    "ALTER TABLE t DROP COLUMN z",
    "DROP TABLE marks",
    "CREATE TABLE marks(owner TEXT, k INTEGER)",
    "DROP TABLE pad",
    "CREATE TABLE huge AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 3000) "
    "SELECT x, randomblob(3000) AS b FROM c",  # ~9 MB: far past the page cache and 1000 WAL pages
    "DELETE FROM huge",
    "INSERT INTO t VALUES (100000, 'fires the triggers')",
]


def test_policy_writes_and_triggers_do_not_survive(tpl, tmp_path):
    clean = dump_db(tpl)
    with _pool(tpl, tmp_path, timeout_s=5.0, hard_timeout_s=10.0) as pool:
        for rnd in range(2):
            lease = _assert_clean(pool, f"w{rnd}", clean)
            # the pool's one-statement check rejects CREATE TRIGGER (its body has ';'); the scorer's
            # connection (apply_submission: executescript, no authorizer) can create one
            c = sqlite3.connect(lease.path, isolation_level=None, timeout=0.2)
            c.executescript(
                "CREATE TRIGGER tr AFTER INSERT ON t BEGIN INSERT INTO marks VALUES ('trig', new.id); END;"
                "CREATE TEMP TRIGGER ttr AFTER INSERT ON main.t BEGIN INSERT INTO marks VALUES ('x', 1); END;"
            )
            c.close()
            for sql in WRITES:
                r = pool.execute(f"w{rnd}", sql)
                assert r.status == "ok", (sql, r)
            assert sha256_file(lease.path) == pool.replica_sha256["shop"]
            # the scorer's own connection (no authorizer): the persistent trigger fires on its writes
            c = sqlite3.connect(lease.path, isolation_level=None, timeout=0.2)
            try:
                c.execute("INSERT INTO t VALUES (100001, 'scorer')")
                assert c.execute("SELECT count(*) FROM marks WHERE owner = 'trig'").fetchone() == (2,)
            finally:
                c.close()
            assert pool.release(f"w{rnd}") is True
        _assert_clean(pool, "end", clean)
        pool.release("end")
        s = pool.stats()
        assert s["wal_resets"] == 2 and s["delta_resets"] == 0, s


def test_clean_release_only_when_nothing_changed(tpl, tmp_path):
    """Reads keep the replica (and its worker connection) for the next trajectory: nothing of the
    previous one must be visible; a scorer write without crashed=True is still detected (non-empty WAL)."""
    clean = dump_db(tpl)
    with _pool(tpl, tmp_path) as pool:
        lease = _assert_clean(pool, "r", clean)
        for sql in (
            "SELECT * FROM pragma_table_info('t')",
            "SELECT last_insert_rowid(), changes(), total_changes()",
            "SELECT * FROM t WHERE id IN (SELECT value FROM json_each('[1,2]'))",
        ):
            assert pool.execute("r", sql).status == "ok", sql
        c = sqlite3.connect(lease.path, isolation_level=None, timeout=0.2)
        c.execute("UPDATE t SET v = 'scorer' WHERE id = 1")
        c.close()
        assert pool.release("r") is True  # json_each (internal UPDATE) and the scorer's WAL frames
        lease = _assert_clean(pool, "r2", clean)
        assert pool.execute("r2", "SELECT last_insert_rowid(), changes()").rows == [(0, 0)]
        assert pool.release("r2") is False
        lease = _assert_clean(pool, "r3", clean)  # no reset, same connection
        assert pool.release("r3") is False
        assert pool.stats()["resets"] == 2


# ------------------------------------------------------------------------------ scorer SQL (no authorizer)

SCORER_ATTACKS = {
    "checkpoints": [
        "PRAGMA wal_checkpoint(TRUNCATE)",
        "PRAGMA wal_checkpoint(RESTART)",
        "PRAGMA wal_checkpoint(FULL)",
        "PRAGMA wal_checkpoint(PASSIVE)",
        "SELECT * FROM pragma_wal_checkpoint('TRUNCATE')",
    ],
    "journal_mode": [
        "PRAGMA journal_mode=DELETE",
        "PRAGMA journal_mode=OFF",
        "PRAGMA journal_mode=MEMORY",
        "PRAGMA journal_mode=TRUNCATE",
    ],
    "vacuum": ["VACUUM"],
    "locking_mode": ["PRAGMA locking_mode=EXCLUSIVE", "INSERT INTO marks VALUES ('lm', 1)"],
    "autocheckpoint": [
        "PRAGMA wal_autocheckpoint=1",
        "PRAGMA journal_size_limit=0",
        "CREATE TABLE z AS SELECT randomblob(5000000) AS b",
        "INSERT INTO marks VALUES ('ac', 1)",
    ],
    "attach_self": ["ATTACH '{path}' AS me", "INSERT INTO me.marks VALUES ('me', 1)"],
    "attach_nolock": [
        "ATTACH 'file:{path}?nolock=1' AS nl",
        "INSERT INTO nl.marks VALUES ('nl', 1)",
        "PRAGMA nl.wal_checkpoint(TRUNCATE)",
    ],
    "writable_schema": [
        "PRAGMA writable_schema=ON",
        "UPDATE sqlite_master SET sql = sql WHERE name = 't'",
    ],
}


@pytest.mark.parametrize("name", sorted(SCORER_ATTACKS))
def test_scorer_side_sql_cannot_write_main_file_unnoticed(tpl, tmp_path, name):
    """`apply_submission` runs the submitted SQL on `lease.path` with no authorizer. Whatever it manages to
    do, the next trajectory must get the clean image."""
    clean = dump_db(tpl)
    with _pool(tpl, tmp_path) as pool:
        lease = _assert_clean(pool, "a", clean)
        assert pool.execute("a", "INSERT INTO marks VALUES ('a', 1)").status == "ok"
        c = sqlite3.connect(lease.path, isolation_level=None, timeout=0.2)
        results = []
        try:
            c.execute("INSERT INTO marks VALUES ('scorer', 1)")
            for sql in SCORER_ATTACKS[name]:
                try:
                    results.append((sql, c.execute(sql.format(path=lease.path)).fetchall()))
                except sqlite3.Error as e:
                    results.append((sql, f"{type(e).__name__}: {e}"))
        finally:
            c.close()
        print(name, results, "main file untouched:", sha256_file(lease.path) == pool.replica_sha256["shop"])
        pool.release("a", crashed=True)
        _assert_clean(pool, "b", clean)
        pool.release("b")
        print(pool.stats())


# --------------------------------------------------------------------------------------- lifecycle misuse


def test_unclosed_scorer_connection_across_release(tpl, tmp_path):
    """A caller that forgets to close its own connection to `lease.path` before `release()` (documented as
    forbidden). SQLite keeps one wal-index (-shm mapping) per database inode and process: the stale
    connection's mapping of the deleted -shm must not leak into the next trajectory's view, and the stale
    connection must not be able to checkpoint its old WAL into the next trajectory's main file."""
    clean = dump_db(tpl)
    with _pool(tpl, tmp_path) as pool:
        lease = _assert_clean(pool, "a", clean)
        assert pool.execute("a", "INSERT INTO marks VALUES ('a', 1)").status == "ok"
        stale = sqlite3.connect(lease.path, isolation_level=None, timeout=0.2)
        stale.execute("UPDATE t SET v = 'stale'")  # maps the -shm in this process
        assert stale.execute("SELECT count(*) FROM marks").fetchone() == (1,)
        pool.release("a", crashed=True)  # forgot stale.close()
        try:
            lease = _assert_clean(pool, "b", clean)
            s = pool.stats()  # the -shm was still mapped: neither WAL discard nor delta, a new inode
            assert s["resets"] == 2 and s["wal_resets"] == 0 and s["delta_resets"] == 0, s
            assert pool.execute("b", "INSERT INTO marks VALUES ('b', 1)").status == "ok"
            # a fresh scorer connection for b in the same process
            c = sqlite3.connect(lease.path, isolation_level=None, timeout=0.2)
            try:
                assert c.execute("SELECT owner FROM marks").fetchall() == [("b",)]
                assert c.execute("SELECT count(*) FROM t WHERE v = 'stale'").fetchone() == (0,)
            finally:
                c.close()
            # the stale connection checkpoints its old WAL
            try:
                stale.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            except sqlite3.Error:
                pass
            assert pool.execute("b", "SELECT owner FROM marks").rows == [("b",)]
            assert pool.execute("b", "SELECT count(*) FROM t WHERE v = 'stale'").rows == [(0,)]
        finally:
            stale.close()
        pool.release("b", crashed=True)
        _assert_clean(pool, "c", clean)
        pool.release("c")


@pytest.mark.parametrize("how", ["rm_wal", "rm_shm", "replace_shm", "touch_main", "journal", "release_twice"])
def test_file_tampering_between_release_and_reset(tpl, tmp_path, how):
    clean = dump_db(tpl)
    with _pool(tpl, tmp_path) as pool:
        lease = _assert_clean(pool, "a", clean)
        assert pool.execute("a", "INSERT INTO marks VALUES ('a', 1)").status == "ok"
        assert pool.release("a") is True
        p = lease.path
        if how == "rm_wal":
            os.remove(p + "-wal")
        elif how == "rm_shm":
            os.remove(p + "-shm")
        elif how == "replace_shm":
            with open(p + "-shm", "wb") as f:
                f.write(bytes(32768))
        elif how == "touch_main":
            os.utime(p, ns=(0, 0))
        elif how == "journal":
            open(p + "-journal", "wb").close()
        elif how == "release_twice":
            with pytest.raises(KeyError):
                pool.release("a")
        _assert_clean(pool, "b", clean)
        pool.release("b")
        s = pool.stats()
        assert s["resets"] == 2, s
        if how not in ("release_twice", "rm_wal"):  # must not trust the WAL discard
            assert s["wal_resets"] == 0, s
    with pytest.raises(RuntimeError, match="closed"):
        pool.lease("z", "shop")


def test_concurrent_writers_one_template(tpl, tmp_path):
    clean = dump_db(tpl)
    errors: list = []
    with _pool(tpl, tmp_path, replicas_per_db=4, workers=2, timeout_s=5.0, hard_timeout_s=10.0) as pool:

        def run(n: int) -> None:
            try:
                for rnd in range(3):
                    tid = f"t{n}-{rnd}"
                    pool.lease(tid, "shop")
                    assert pool.execute(tid, "SELECT count(*) FROM marks").rows == [(0,)], tid
                    for k in range(5):
                        assert pool.execute(tid, f"INSERT INTO marks VALUES ('{tid}', {k})").status == "ok"
                    assert pool.execute(tid, f"UPDATE t SET v = '{tid}' || v").status == "ok"
                    r = pool.execute(tid, "SELECT DISTINCT owner FROM marks")
                    assert r.rows == [(tid,)], (tid, r.rows)
                    assert pool.execute(tid, f"SELECT count(*) FROM t WHERE v LIKE '{tid}%'").rows == [(200,)]
                    assert pool.release(tid) is True
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=run, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        for i in range(4):
            _assert_clean(pool, f"end{i}", clean)
        for i in range(4):
            pool.release(f"end{i}")
