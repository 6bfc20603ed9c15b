"""Damaged databases: named with their problem, their tasks excluded as `database_damaged`, checked once."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from sqlrl.cli.data import cli_main
from sqlrl.tasks import dbcheck
from sqlrl.tasks.data import DataError, SpiderData, embedded_root
from sqlrl.tasks.dbcheck import database_problem
from sqlrl.tasks.goldcache import GoldCache, audit_golds


def make_db(path: Path, rows: int = 300) -> Path:
    """A database of 4096-byte pages: table t with `rows` rows (300 rows: 4 pages, 16384 bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path)
    con.execute("PRAGMA page_size = 4096")
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
    con.executemany("INSERT INTO t VALUES (?, ?)", [(i, f"n{i}" * 5) for i in range(rows)])
    con.commit()
    con.close()
    return path


def make_folder(root: Path, n_dbs: int = 3, per_db: int = 2) -> Path:
    examples = []
    for d in range(n_dbs):
        make_db(root / "database" / f"db{d}" / f"db{d}.sqlite")
        examples += [
            {"db_id": f"db{d}", "question": f"q{q}?", "query": f"SELECT name FROM t WHERE id = {q}"}
            for q in range(per_db)
        ]
    (root / "tables.json").write_text("[]")
    (root / "train_spider.json").write_text(json.dumps(examples))
    return root


def overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_a_healthy_database_passes(tmp_path):
    assert os.path.getsize(make_db(tmp_path / "ok.sqlite")) == 16384
    assert database_problem(tmp_path / "ok.sqlite") is None
    assert database_problem(embedded_root() / "database" / "game_1" / "game_1.sqlite") is None


@pytest.mark.parametrize(
    "damage, expected",
    [
        ("zero", "empty file (0 bytes)"),
        (
            "page",
            "SQLite cannot read it (database disk image is malformed); restore the file from its source",
        ),
        ("text", "not a SQLite database (it starts with b'hello\\n', not b'SQLite format 3\\x00')"),
        ("half", "truncated: 8192 bytes, but its header says 4 pages of 4096 bytes (16384 bytes)"),
        ("header", "truncated: 50 bytes, shorter than the 100-byte SQLite header"),
        ("pagesize", "damaged SQLite header (page size 1000 is not a power of two from 512 to 65536)"),
        ("dir", "is a directory, not a SQLite file"),
        ("missing", "missing: no file at this path"),
        ("no_tables", "holds no tables (an empty SQLite database)"),
    ],
)
def test_each_kind_of_damage_is_named(tmp_path, damage, expected):
    p = make_db(tmp_path / "x.sqlite")
    if damage == "zero":
        p.write_bytes(b"")
    elif damage == "page":  # the 4 KB page 2 (a b-tree page of t) overwritten
        overwrite(p, 4096, b"\xab" * 4096)
    elif damage == "text":
        p.write_text("hello\n")
    elif damage == "half":
        p.write_bytes(p.read_bytes()[:8192])
    elif damage == "header":
        p.write_bytes(p.read_bytes()[:50])
    elif damage == "pagesize":
        overwrite(p, 16, (1000).to_bytes(2, "big"))
    elif damage == "dir":
        p.unlink()
        p.mkdir()
    elif damage == "missing":
        p.unlink()
    elif damage == "no_tables":
        p.unlink()
        con = sqlite3.connect(p)
        con.execute("PRAGMA user_version = 1")  # writes the header page: a valid, table-less file
        con.close()
    assert database_problem(p) == expected


def test_leftover_journal_and_wal_are_named(tmp_path):
    p = make_db(tmp_path / "j.sqlite")
    journal = Path(str(p) + "-journal")
    journal.write_bytes(b"")  # an empty journal is not hot
    assert database_problem(p) is None
    journal.write_bytes(dbcheck._JOURNAL_MAGIC + bytes(504))  # a journal header: hot
    assert database_problem(p).startswith(f"a leftover rollback journal {journal} (512 bytes)")

    w = make_db(tmp_path / "w.sqlite")
    con = sqlite3.connect(w)
    con.execute("PRAGMA journal_mode = WAL")
    con.execute("INSERT INTO t VALUES (1000, 'late')")
    con.commit()
    copy = tmp_path / "copy.sqlite"
    shutil.copy(w, copy)
    shutil.copy(str(w) + "-wal", str(copy) + "-wal")  # what a killed writer leaves
    con.close()
    problem = database_problem(copy)
    assert problem.startswith(f"a leftover write-ahead log {copy}-wal (")
    assert "PRAGMA wal_checkpoint(TRUNCATE)" in problem
    assert database_problem(w) is None  # closed cleanly: no -wal left


def test_an_unreadable_file_is_named(tmp_path, monkeypatch):
    p = make_db(tmp_path / "u.sqlite")

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(dbcheck, "open", denied, raising=False)
    assert database_problem(p) == "cannot be read (Permission denied); check the file's permissions"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file whatever its mode")
def test_an_unreadable_file_is_named_by_mode(tmp_path):
    p = make_db(tmp_path / "m.sqlite")
    p.chmod(0)
    assert database_problem(p) == "cannot be read (Permission denied); check the file's permissions"


def test_check_runs_once_per_database_per_process(tmp_path, monkeypatch):
    root = make_folder(tmp_path / "d", n_dbs=3, per_db=4)
    calls: list[str] = []
    real = dbcheck._check
    monkeypatch.setattr(dbcheck, "_check", lambda path: calls.append(path) or real(path))
    data = SpiderData(root)
    tasks = data.load("train_spider")
    data.fingerprint("train_spider")
    assert data.damaged_databases("train_spider") == {}
    with GoldCache() as cache:
        audit_golds(tasks, cache)
        audit_golds(tasks, cache)
    SpiderData(root).load("train_spider")  # a second folder object: same process, same files
    assert len(tasks) == 12 and sorted(Path(c).parent.name for c in calls) == ["db0", "db1", "db2"]
    overwrite(root / "database" / "db1" / "db1.sqlite", 0, b"junk")  # a changed file is checked again
    assert database_problem(root / "database" / "db1" / "db1.sqlite").startswith("not a SQLite database")
    assert len(calls) == 4


def test_audit_excludes_a_damaged_database_under_its_own_reason(tmp_path):
    root = make_folder(tmp_path / "d", n_dbs=3, per_db=2)
    bad = root / "database" / "db1" / "db1.sqlite"
    bad.write_bytes(b"")
    data = SpiderData(root)
    tasks = data.load("train_spider")
    assert [t.public.schema == "" for t in tasks] == [False, False, True, True, False, False]
    assert data.damaged_databases("train_spider") == {"db1": "empty file (0 bytes)"}
    with GoldCache() as cache:
        audit = audit_golds(tasks, cache)
        assert cache.hits + cache.misses == 4  # db1's 2 golds were never looked up
    assert audit.excluded == {"database_damaged": 2} and audit.scorable == 4
    assert audit.per_task["train_spider/00002"] == "database_damaged"
    assert audit.to_dict()["damaged_databases"] == {str(bad): "empty file (0 bytes)"}


def test_a_non_sqlite_file_no_longer_stops_loading(tmp_path):
    root = make_folder(tmp_path / "d", n_dbs=3, per_db=1)
    (root / "database" / "db0" / "db0.sqlite").write_text("hello\n")
    data = SpiderData(root)
    assert len(data.load("train_spider")) == 3
    before = data.fingerprint("train_spider")
    (root / "database" / "db0" / "db0.sqlite").write_text("hullo\n")
    assert SpiderData(root).fingerprint("train_spider") != before


def test_an_absent_database_still_stops_loading(tmp_path):
    root = make_folder(tmp_path / "d", n_dbs=3, per_db=1)
    shutil.rmtree(root / "database" / "db2")
    with pytest.raises(DataError, match=r"missing from .*db2 \(1 examples\)"):
        SpiderData(root).load("train_spider")


def test_data_audit_names_the_damaged_database_and_exits_2(tmp_path, capsys):
    root = make_folder(tmp_path / "d", n_dbs=3, per_db=2)
    bad = root / "database" / "db2" / "db2.sqlite"
    overwrite(bad, 4096, b"\xab" * 4096)
    assert cli_main(["audit", "--data", str(root)]) == 2
    out, err = capsys.readouterr()
    assert f"  {bad}: SQLite cannot read it (database disk image is malformed)" in out
    assert "  database_damaged  2" in out
    assert err.strip().splitlines()[-1] == (
        "sqlrl data audit: error: 1 damaged database(s) (db2; problems above), 2 tasks excluded; replace "
        "the files, or pass --continue-on-damaged to accept the exclusion"
    )
    assert cli_main(["audit", "--data", str(root), "--continue-on-damaged", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["excluded"] == {"database_damaged": 2} and report["scorable"] == 4
    assert list(report["damaged_databases"]) == [str(bad)]


def test_eval_excludes_a_damaged_database_and_never_scores_its_predictions(tmp_path):
    from sqlrl.agent.loop import Budgets
    from sqlrl.evaluation.runner import evaluate_tasks
    from sqlrl.generation.scripted import ScriptedPolicy
    from sqlrl.sql.sandbox import Sandbox

    root = make_folder(tmp_path / "d", n_dbs=3, per_db=2)
    bad = root / "database" / "db0" / "db0.sqlite"
    bad.write_bytes(bad.read_bytes()[:8192])  # truncated: gold and predictions would read half a table
    tasks = SpiderData(root).load("train_spider")
    gold = {t.public.question: t.gold_sql for t in tasks}

    def answer(text, turn):  # every task answered with its own gold
        return next(f"```sql\n{sql}\n```" for q, sql in gold.items() if q in text)

    with Sandbox(workers=1, timeout_s=5.0) as sb:
        for rollout_all, rolled in ((False, 4), (True, 6)):
            out = evaluate_tasks(
                tasks,
                ScriptedPolicy(answer),
                sb,
                GoldCache(),
                Budgets(),
                progress=False,
                rollout_all=rollout_all,
            )
            assert len(out.trajectories) == rolled
            by = {r["task_id"]: r for r in out.results}
            for tid in ("train_spider/00000", "train_spider/00001"):
                assert by[tid]["reason"] == "database_damaged" and by[tid]["correct"] is None
                assert by[tid]["reward"] is None
            s = out.summary
            assert s["n"] == 4 and s["n_tasks"] == 6 and s["execution_match"] == 1.0
            assert s["excluded"] == {"database_damaged": 2}
            assert list(s["gold_audit"]["damaged_databases"]) == [str(bad)]


def test_training_tasks_leave_out_a_damaged_database(tmp_path):
    from sqlrl import config as C
    from sqlrl.agent.envs import make_env

    root = make_folder(tmp_path / "d", n_dbs=3, per_db=2)
    bad = root / "database" / "db2"
    shutil.rmtree(bad)
    (bad / "db2.sqlite").mkdir(parents=True)  # a folder where the file should be
    cfg = C.from_dict(
        {
            "data": {"path": str(root), "train_split": "train_spider"},
            "run": {"sandbox_workers": 1, "loggers": []},
        }
    )
    env = make_env(cfg, tmp_path / "run")
    assert sorted({t.db_id for t in env.tasks}) == ["db0", "db1"] and len(env.tasks) == 4
    assert env.gold_audit["excluded"] == {"database_damaged": 2}
    assert env.gold_audit["damaged_databases"] == {
        str(bad / "db2.sqlite"): "is a directory, not a SQLite file"
    }
    env.gold_cache.close()


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_database_that_is_a_fifo_or_a_device_is_named_not_read_forever(tmp_path, kind) -> None:
    """A FIFO blocks a reader until a writer comes; /dev/zero never ends. `data audit` (the split's
    fingerprint hashes every database file) names the file and its tasks are excluded; run in a child
    process with a deadline, so a regression fails instead of hanging the suite."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    data = tmp_path / "d"
    shutil.copytree(Path(__file__).resolve().parents[2] / "src/sqlrl/embedded/spider_demo", data)
    db = data / "database/activity_1/activity_1.sqlite"
    db.unlink()
    if kind == "fifo":
        os.mkfifo(db)
    else:
        db.symlink_to("/dev/zero")
    code = (
        "from sqlrl.tasks.data import SpiderData, file_sha256\n"
        f"d = SpiderData({str(data)!r})\n"
        "print(len(d.fingerprint('train_spider')))\n"
        "try:\n"
        f"    file_sha256({str(db)!r})\n"
        "except OSError as e:\n"
        "    print(e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["64", f"{db} is not a regular file"]
