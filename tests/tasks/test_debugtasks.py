"""Stateful SQL-debugging tasks: types, gold isolation, mutation, validation, scoring, builder determinism.

Real SQLite on temporary copies of small Spider databases (skipped when the shared Spider folder is
absent); everything runs on CPU in well under a minute.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sqlrl.tasks import debug_build as dbuild
from sqlrl.tasks import debug_episode as de
from sqlrl.tasks import debug_mutate as dm
from sqlrl.tasks import debugging as dt
from sqlrl.tasks.debug_build import build_debug_tasks
from sqlrl.tasks.debug_episode import apply_submission, prepare_state, run_tests, score_debug, validate_task
from sqlrl.tasks.debug_mutate import mutate_query
from sqlrl.tasks.debugging import (
    DebugTaskPrivate,
    DebugTaskPublic,
    ensure_public_debug,
    load_debug_tasks,
    save_debug_tasks,
)

SPIDER = Path(__file__).resolve().parents[3] / "shared" / "data" / "spider"
DBS = ["icfp_1", "manufactory_1", "voter_2"]
REPO = Path(__file__).resolve().parents[2]

needs_spider = pytest.mark.skipif(
    not all((SPIDER / "database" / d / f"{d}.sqlite").is_file() for d in DBS), reason="no shared Spider data"
)


@pytest.fixture(scope="module")
def built():
    if not all((SPIDER / "database" / d / f"{d}.sqlite").is_file() for d in DBS):
        pytest.skip("no shared Spider data")
    return build_debug_tasks(SPIDER, seed=0, per_db=6, db_ids=DBS)


def _walk(obj, seen=None):
    """Every value reachable from obj through dataclass fields and containers."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    yield obj
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _walk(getattr(obj, f.name), seen)
    elif isinstance(obj, list | tuple | set):
        for x in obj:
            yield from _walk(x, seen)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(k, seen)
            yield from _walk(v, seen)


def _manual_task(db_path: str) -> DebugTaskPrivate:
    pub = DebugTaskPublic(
        task_id="t/0",
        db_id="x",
        category="management",
        description="double b where a = 1",
        schema="CREATE TABLE t (a INTEGER, b REAL);",
        buggy_sql="UPDATE t SET b = b * 2",
        preprocess_sql=["CREATE TABLE IF NOT EXISTS log (x)"],
        db_path=db_path,
    )
    tests = [
        "SELECT NOT EXISTS (SELECT 1 FROM main.t a JOIN ref.t b ON a.rowid = b.rowid WHERE a.b IS NOT b.b)",
        "SELECT count(*) = 1 FROM sqlite_master WHERE name = 'log'",
        "SELECT (SELECT count(*) FROM t) = 3",
    ]
    return DebugTaskPrivate(pub, ["UPDATE t SET b = b * 2 WHERE a = 1"], tests, ["DROP TABLE IF EXISTS log"])


# ------------------------------------------------------------------------------------------ types


def test_public_private_isolation(tiny_db):
    task = _manual_task(tiny_db)
    assert not isinstance(task, DebugTaskPublic)
    assert ensure_public_debug(task.public) is task.public
    with pytest.raises(TypeError):
        ensure_public_debug(task)
    with pytest.raises(TypeError):
        ensure_public_debug({"task_id": "x"})
    reach = list(_walk(task.public))
    for secret in list(task.solution_sql) + list(task.test_cases):
        assert secret not in reach
        assert all(not (isinstance(v, str) and secret in v) for v in reach)
    with pytest.raises(ValueError):
        dataclasses.replace(task.public, category="other")


def test_jsonl_roundtrip_and_version(tmp_path, tiny_db):
    task = _manual_task(tiny_db)
    path = tmp_path / "x.jsonl"
    save_debug_tasks([task], path)
    rec = json.loads(path.read_text().splitlines()[0])
    assert rec["version"] == dt.DEBUG_FORMAT_VERSION and "split" in rec
    assert load_debug_tasks(path) == [task]
    rec["version"] = 99
    path.write_text(json.dumps(rec) + "\n")
    with pytest.raises(ValueError):
        load_debug_tasks(path)


# ------------------------------------------------------------------------------- tests & scoring


def test_scoring_statuses(tmp_path, tiny_db):
    task = _manual_task(tiny_db)
    assert de.run_episode_offline(task, list(task.solution_sql))["status"] == "solved"
    bug = de.run_episode_offline(task, task.public.buggy_sql)
    assert bug["status"] == "partial" and 0 < bug["value"] < 1 and bug["total"] == 3
    assert de.run_episode_offline(task, "UPDATE nope SET b = 1")["status"] == "exec_error"
    assert de.run_episode_offline(task, "   ")["status"] == "no_sql"
    assert score_debug(task, None, final_sql=None)["status"] == "no_sql"
    infra = score_debug(task, str(tmp_path / "missing.sqlite"))
    assert infra["status"] == "infra_error" and infra["value"] is None
    broken = dataclasses.replace(task, solution_sql=("UPDATE nope SET x = 1",))
    state = str(tmp_path / "s.sqlite")
    prepare_state(broken, state)
    assert score_debug(broken, state)["status"] == "infra_error"
    # the source database is never modified
    import sqlite3

    con = sqlite3.connect(tiny_db)
    assert con.execute("SELECT b FROM t ORDER BY a").fetchall() == [(1.5,), (2.0,), (4.0,)]
    assert con.execute("SELECT count(*) FROM sqlite_master WHERE name = 'log'").fetchone() == (0,)
    con.close()


def test_reference_states_build_once_per_task_and_match_a_fresh_reference(tmp_path, tiny_db):
    import threading

    task = _manual_task(tiny_db)
    subs = [list(task.solution_sql), task.public.buggy_sql, "UPDATE nope SET b = 1", "  "]
    fresh = [de.run_episode_offline(task, s) for s in subs]  # each builds its own reference
    with de.ReferenceStates() as refs:
        shared = [de.run_episode_offline(task, s, references=refs) for s in subs]
        assert refs.builds == 1  # no_sql and exec_error never needed it; the other two shared one
        folder = Path(refs.get(task)).parent
        assert folder.is_dir()
        got: list = []
        threads = [threading.Thread(target=lambda: got.append(refs.get(task))) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert refs.builds == 1 and len(set(got)) == 1
        # a reference that cannot be built: the same infra_error for every submission, built once
        broken = dataclasses.replace(
            task,
            public=dataclasses.replace(task.public, task_id="t/broken"),
            solution_sql=("UPDATE nope SET x = 1",),
        )
        outs = [de.run_episode_offline(broken, list(task.solution_sql), references=refs) for _ in range(3)]
        assert [o["status"] for o in outs] == ["infra_error"] * 3 and refs.builds == 2
        assert "reference solution failed" in outs[0]["message"]
        assert de.run_episode_offline(broken, "  ", references=refs)["status"] == "no_sql"
    assert shared == fresh
    assert [r["status"] for r in shared] == ["solved", "partial", "exec_error", "no_sql"]
    assert not folder.exists()  # removed on leaving the with block


def test_failed_status(tmp_path, tiny_db):
    task = _manual_task(tiny_db)
    state = str(tmp_path / "s.sqlite")
    shutil.copyfile(tiny_db, state)  # no preprocess: the 'log' test fails too
    apply_submission(task, state, "DELETE FROM t WHERE a = 3; UPDATE t SET b = 7")
    res = score_debug(task, state)
    assert res["status"] == "failed" and res["value"] == 0.0 and res["passed"] == 0
    passed, total, details = run_tests(task, state)
    assert (passed, total) == (0, 3) and all(not d["passed"] for d in details)


@pytest.mark.parametrize(
    "attack",
    [
        "ATTACH DATABASE '{evil}' AS e; CREATE TABLE e.x (a)",  # would create a file anywhere
        "BEGIN; UPDATE t SET b = 0; COMMIT",
        "PRAGMA journal_mode = OFF",
        "PRAGMA writable_schema = 1",
        "VACUUM INTO '{evil}'",
        "UPDATE t SET b = 2 * b WHERE a = 1; SELECT load_extension('x')",
    ],
)
def test_a_submission_runs_under_the_replica_authorizer(tmp_path, tiny_db, attack):
    """The submitted solution is policy SQL: ATTACH, transactions, state-changing pragmas, VACUUM INTO and
    denied functions are refused (an error, the task not solved) and no file appears outside the state."""
    import sqlite3

    task = _manual_task(tiny_db)
    state = str(tmp_path / "s.sqlite")
    prepare_state(task, state)
    evil = tmp_path / "evil.sqlite"
    err = apply_submission(task, state, attack.format(evil=evil))
    assert err is not None and ("not authorized" in err or "authorization denied" in err), err
    assert not evil.exists()
    con = sqlite3.connect(state)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    con.close()
    # the same connection rules do not get in the way of a real solution
    assert de.run_episode_offline(task, list(task.solution_sql))["status"] == "solved"


def test_validation_drops_buggy_that_passes(tiny_db):
    task = _manual_task(tiny_db)
    assert validate_task(task) is None
    same = dataclasses.replace(task, public=dataclasses.replace(task.public, buggy_sql=task.solution_sql[0]))
    assert validate_task(same) == "buggy_passes"
    wrong_ref = dataclasses.replace(task, solution_sql=("UPDATE t SET b = 0",), test_cases=("SELECT 0",))
    assert validate_task(wrong_ref) == "reference_fails"


@needs_spider
def test_query_task_protocol_on_spider(tmp_path):
    db = str(SPIDER / "database" / "voter_2" / "voter_2.sqlite")
    gold = "SELECT count(*) FROM student WHERE age > 18"
    pub = DebugTaskPublic("q/0", "voter_2", "query", "d", "s", "SELECT count(*) FROM student", [], db)
    task = DebugTaskPrivate(pub, [gold], de.query_test_cases(1, False), ["DROP TABLE IF EXISTS __submitted"])
    assert validate_task(task) is None
    # an equivalent rewrite passes; a wrong column count fails the shape test
    assert (
        de.run_episode_offline(task, "SELECT count(1) FROM student WHERE NOT age <= 18")["status"] == "solved"
    )
    r = de.run_episode_offline(task, "SELECT count(*), 1 FROM student WHERE age > 18")
    assert r["status"] == "failed"
    assert de.run_episode_offline(task, "DELETE FROM student")["status"] == "exec_error"
    assert de.run_episode_offline(task, "SELECT nope FROM student")["status"] == "exec_error"


# ------------------------------------------------------------------------------------- mutation


@needs_spider
def test_mutations_parse_and_differ():
    import sqlglot

    db = str(SPIDER / "database" / "manufactory_1" / "manufactory_1.sqlite")
    cols = dbuild.table_columns(db)
    golds = [
        "SELECT name FROM products WHERE price > 200 ORDER BY price DESC LIMIT 3",
        "SELECT avg(price), max(price) FROM products",
        "SELECT DISTINCT T2.name FROM products AS T1 JOIN manufacturers AS T2 ON T1.manufacturer = T2.code "
        "WHERE T1.price >= 100 AND T2.revenue < 500",
        "SELECT count(DISTINCT founder) FROM manufacturers",
    ]
    kinds_seen = set()
    for gold in golds:
        base = sqlglot.parse_one(gold, read="sqlite").sql(dialect="sqlite")
        for kind in dm.MUTATION_KINDS:
            m = mutate_query(gold, cols, random.Random(1), kinds=(kind,))
            if m is None:
                continue
            buggy, k = m
            assert k == kind
            sqlglot.parse_one(buggy, read="sqlite")
            assert buggy != base
            kinds_seen.add(k)
    assert kinds_seen == set(dm.MUTATION_KINDS)
    assert mutate_query("not sql at all ((", cols, random.Random(0)) is None


# --------------------------------------------------------------------------------------- builder


def test_builder_categories_and_validity(built):
    tasks, stats = built
    assert {t.category for t in tasks} == set(dt.CATEGORIES)
    assert {t.public.db_id for t in tasks} == set(DBS)
    assert stats["n_tasks"] == len(tasks) and sum(stats["per_category"].values()) == len(tasks)
    assert len({t.task_id for t in tasks}) == len(tasks)
    for t in tasks:
        assert t.split in ("train", "validation")
        assert t.public.buggy_sql.strip() and t.test_cases and t.solution_sql
        assert t.public.buggy_sql not in t.solution_sql
    for t in tasks[:: max(1, len(tasks) // 8)]:  # re-validate a sample independently
        assert validate_task(t) is None


def test_builder_deterministic(tmp_path, built):
    tasks, stats = built
    again, stats2 = build_debug_tasks(SPIDER, seed=0, per_db=6, db_ids=DBS)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    save_debug_tasks(tasks, a)
    save_debug_tasks(again, b)
    assert a.read_bytes() == b.read_bytes() and stats == stats2
    other, _ = build_debug_tasks(SPIDER, seed=1, per_db=6, db_ids=DBS)
    assert [t.public.buggy_sql for t in other] != [t.public.buggy_sql for t in tasks]


def test_split_matches_spiderdata(built):
    from sqlrl.tasks.data import SpiderData

    tasks, _ = built
    val = set(SpiderData(SPIDER).db_ids("validation"))
    for t in tasks:
        assert (t.split == "validation") == (t.public.db_id in val)


@needs_spider
def test_bench_script_byte_identical(tmp_path):
    outs = []
    for name in ("a", "b"):
        out = tmp_path / name
        cmd = [sys.executable, str(REPO / "bench" / "make_debug_tasks.py"), "--spider", str(SPIDER)]
        cmd += ["--out", str(out), "--db", "icfp_1", "--db", "voter_2", "--per-db", "4"]
        cmd += ["--demo-dir", str(tmp_path / f"demo_{name}")]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
        outs.append(out)
    for f in ("debug_tasks.jsonl", "stats.json"):
        assert (outs[0] / f).read_bytes() == (outs[1] / f).read_bytes()
    demo = load_debug_tasks(tmp_path / "demo_a" / "debug_tasks.jsonl")
    assert demo and all(Path(t.public.db_path).is_file() for t in demo)
    assert "CC BY-SA 4.0" in (tmp_path / "demo_a" / "README.md").read_text()
    assert validate_task(demo[0]) is None


def test_embedded_demo_loads():
    path = dt.debug_demo_root() / "debug_tasks.jsonl"
    if not path.is_file():
        pytest.skip("embedded demo not generated")
    tasks = load_debug_tasks(path)
    assert tasks and {t.category for t in tasks} == set(dt.CATEGORIES)
    assert all(Path(t.public.db_path).is_file() for t in tasks)
    assert validate_task(tasks[0]) is None
