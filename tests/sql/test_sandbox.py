"""Tests for sqlrl.sql.sandbox: statuses, hardening (every attack leaves every file byte-identical and the
sandbox healthy), the watchdog, parallel / threaded use, results, rendering and the CLI."""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sqlrl.sql.guard import precheck, split_statements
from sqlrl.sql.result import STATUSES, SQLResult
from sqlrl.sql.sandbox import Sandbox

SPIDER_DB_DIR = Path("/work/shared/data/spider/database")
TIMEOUT_S = 0.5
HARD_S = 1.5


# ---------------------------------------------------------------- fixtures


def _make_small_db(path: Path) -> None:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE singer (id INTEGER PRIMARY KEY, name TEXT, age INT, photo BLOB, score REAL)")
    con.executemany(
        "INSERT INTO singer VALUES (?, ?, ?, ?, ?)",
        [(i, f"name {i}", 20 + i % 50, bytes([i % 256, 0, 255]), i / 3) for i in range(1, 201)],
    )
    con.execute("CREATE TABLE bad (id INTEGER, t TEXT)")
    con.execute("INSERT INTO bad VALUES (1, CAST(x'61ff62' AS TEXT)), (2, 'fine')")
    con.execute("CREATE INDEX singer_age ON singer(age)")
    con.commit()
    con.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("sbx")
    small = d / "small.sqlite"
    _make_small_db(small)
    out = {"small": small}
    if SPIDER_DB_DIR.is_dir():
        name = (
            "body_builder"
            if (SPIDER_DB_DIR / "body_builder").is_dir()
            else sorted(os.listdir(SPIDER_DB_DIR))[0]
        )
        spider = d / f"{name}.sqlite"
        shutil.copyfile(SPIDER_DB_DIR / name / f"{name}.sqlite", spider)
        os.chmod(spider, 0o644)
        out["spider"] = spider
    gold = d / "gold_cache.sqlite"  # stands in for the gold cache: must never be reachable
    con = sqlite3.connect(gold)
    con.execute("CREATE TABLE gold (key TEXT, sql TEXT)")
    con.execute("INSERT INTO gold VALUES ('k', 'SELECT secret')")
    con.commit()
    con.close()
    out["gold"] = gold
    return out


@pytest.fixture(scope="module")
def sb():
    with Sandbox(workers=2, timeout_s=TIMEOUT_S, hard_timeout_s=HARD_S, max_rows=5000) as s:
        yield s


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _snapshot(d: Path) -> dict[str, str]:
    return {p.name: _sha(p) for p in sorted(d.iterdir()) if p.is_file()}


def _first_table(db: Path) -> str:
    """The table with the most rows (a real table of the database under attack)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        return max(names, key=lambda n: con.execute(f'SELECT count(*) FROM "{n}"').fetchone()[0])
    finally:
        con.close()


def _healthy(sb: Sandbox, db: Path) -> None:
    r = sb.execute(db, "SELECT count(*) FROM sqlite_master")
    assert r.status == "ok", r
    assert r.rows[0][0] >= 1


# ---------------------------------------------------------------- attacks

NEST = 500
ATTACKS: list[tuple[str, str, set[str]]] = [
    ("drop", "DROP TABLE {t}", {"forbidden"}),
    ("delete", "DELETE FROM {t}", {"forbidden"}),
    ("update", "UPDATE {t} SET rowid = rowid + 1000", {"forbidden"}),
    ("insert_returning", "INSERT INTO {t} DEFAULT VALUES RETURNING *", {"forbidden"}),
    ("cte_delete", "WITH x AS (SELECT 1) DELETE FROM {t}", {"forbidden"}),  # past the keyword check
    ("replace", "REPLACE INTO {t} DEFAULT VALUES", {"forbidden"}),
    ("alter", "ALTER TABLE {t} RENAME TO zzz", {"forbidden"}),
    ("create_index", "CREATE INDEX ix_evil ON {t}(rowid)", {"forbidden"}),
    ("multi", "SELECT 1; DROP TABLE {t}", {"multiple_statements"}),
    ("multi_comment", "SELECT 1 /* x */ ; -- y\n DELETE FROM {t};", {"multiple_statements"}),
    ("temp_shadow", "CREATE TEMP TABLE {t} (x)", {"forbidden"}),
    ("temp_view", "CREATE TEMP VIEW v AS SELECT 1", {"forbidden"}),
    ("attach_gold", "ATTACH '{gold}' AS g", {"forbidden"}),
    ("attach_new", "ATTACH '{dir}/new_file.sqlite' AS n", {"forbidden"}),
    ("attach_memory", "ATTACH ':memory:' AS m", {"forbidden"}),
    ("vacuum_into", "VACUUM INTO '{dir}/vacuumed.sqlite'", {"forbidden"}),
    ("vacuum", "VACUUM", {"forbidden"}),
    ("explain_vacuum", "EXPLAIN VACUUM INTO '{dir}/v2.sqlite'", {"forbidden"}),
    ("reindex", "REINDEX", {"forbidden"}),
    ("analyze", "ANALYZE", {"forbidden"}),
    ("query_only", "PRAGMA query_only=0", {"forbidden"}),
    ("writable_schema", "PRAGMA writable_schema=1", {"forbidden"}),
    ("journal_mode", "PRAGMA journal_mode=WAL", {"forbidden"}),
    ("journal_delete", "PRAGMA journal_mode=DELETE", {"forbidden"}),
    ("pragma_vtab", "SELECT * FROM pragma_journal_mode('wal')", {"forbidden"}),
    ("pragma_vtab_qo", "SELECT * FROM pragma_query_only(0)", {"forbidden"}),
    ("begin", "BEGIN", {"forbidden"}),
    ("begin_immediate", "BEGIN IMMEDIATE", {"forbidden"}),
    ("commit", "COMMIT", {"forbidden"}),
    ("rollback", "ROLLBACK", {"forbidden"}),
    ("savepoint", "SAVEPOINT s1", {"forbidden"}),
    ("release", "RELEASE s1", {"forbidden"}),
    ("json_each", "SELECT * FROM json_each('[1, 2]')", {"forbidden"}),
    ("json_tree", "SELECT key, value FROM json_tree('{{\"a\": [1]}}')", {"forbidden"}),
    ("json_each_join", "SELECT count(*) FROM {t}, json_each('[1]')", {"forbidden"}),
    ("json_each_cte", "WITH j AS (SELECT value FROM json_tree('[1]')) SELECT * FROM j", {"forbidden"}),
    ("load_extension", "SELECT load_extension('{dir}/evil')", {"forbidden"}),
    ("writefile", "SELECT writefile('{dir}/w.txt', 'x')", {"forbidden", "runtime_error"}),
    ("readfile", "SELECT readfile('{gold}')", {"forbidden", "runtime_error"}),
    ("zeroblob", "SELECT zeroblob(2000000000)", {"too_large"}),
    ("randomblob", "SELECT randomblob(1e9)", {"too_large"}),
    ("randomblob_len", "SELECT length(randomblob(1e9))", {"too_large"}),
    ("printf_bomb", "SELECT printf('%.*c', 2000000000, 'x')", {"timeout", "too_large"}),
    (
        "recursive_cte",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
        {"timeout"},
    ),
    ("cross_join_rows", "SELECT * FROM {t} a, {t} b, {t} c, {t} d, {t} e, {t} f", {"too_many_rows"}),
    (
        "cross_join_millions",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 2000) SELECT * FROM c a, c b",
        {"too_many_rows"},
    ),
    (
        "cross_join_count",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 3000) "
        "SELECT count(*) FROM c a, c b, c d",
        {"timeout"},
    ),
    ("nested_parens", "SELECT " + "(" * NEST + "1" + ")" * NEST, {"runtime_error", "syntax_error"}),
    (
        "nested_subqueries",
        "SELECT * FROM " + "(SELECT * FROM " * NEST + "{t}" + ")" * NEST,
        {"runtime_error", "syntax_error"},
    ),
    ("nested_scalar", "SELECT " + "(SELECT " * NEST + "1" + ")" * NEST, {"runtime_error", "syntax_error"}),
    ("expr_60k", "SELECT " + "+".join(["1"] * 60_000), {"runtime_error"}),
    (
        "result_10mb",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 10) "
        "SELECT x, printf('%.*c', 1000000, 'y') FROM c",
        {"too_large"},
    ),
]


@pytest.mark.parametrize("which", ["small", "spider"])
@pytest.mark.parametrize("name,sql,expected", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_leaves_files_untouched(sb, files, which, name, sql, expected):
    if which not in files:
        pytest.skip("Spider data not available")
    db = files[which]
    d = db.parent
    before = _snapshot(d)
    q = sql.format(t=_first_table(db), gold=files["gold"], dir=d)
    res = sb.execute(db, q)
    assert res.status in expected, (name, res)
    assert res.status != "ok"
    assert _snapshot(d) == before, f"{name}: a file changed or appeared"
    _healthy(sb, db)


def test_invalid_utf8_is_decoded_deterministically(sb, files):
    r1 = sb.execute(files["small"], "SELECT id, t FROM bad ORDER BY id")
    r2 = sb.execute(files["small"], "SELECT id, t FROM bad ORDER BY id")
    assert r1.status == "ok", r1
    assert r1.rows == [(1, "a\ufffdb"), (2, "fine")]
    assert r1.rows == r2.rows
    # and the fast path is back afterwards
    assert sb.execute(files["small"], "SELECT name FROM singer WHERE id = 1").rows == [("name 1",)]


def test_schema_inspection_allowed(sb, files):
    r = sb.execute(files["small"], "SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name")
    assert r.status == "ok" and [x[0] for x in r.rows] == ["bad", "singer"]
    r = sb.execute(files["small"], "PRAGMA table_info(singer)")
    assert r.status == "ok" and [x[1] for x in r.rows] == ["id", "name", "age", "photo", "score"]
    assert sb.execute(files["small"], "PRAGMA index_list(singer)").status == "ok"
    assert sb.execute(files["small"], "PRAGMA foreign_key_list(singer)").status == "ok"
    r = sb.execute(files["small"], "EXPLAIN QUERY PLAN SELECT * FROM singer WHERE age = 3")
    assert r.status == "ok"


# ---------------------------------------------------------------- statuses


def test_ok_result_shape(sb, files):
    r = sb.execute(
        files["small"], "SELECT id, name, photo, score, NULL AS n FROM singer WHERE id <= 2 ORDER BY id"
    )
    assert r.status == "ok" and r.message == ""
    assert r.columns == ["id", "name", "photo", "score", "n"]
    assert r.rows == [
        (1, "name 1", b"\x01\x00\xff", 1 / 3, None),
        (2, "name 2", b"\x02\x00\xff", 2 / 3, None),
    ]
    assert r.row_count == 2 and r.elapsed_ms >= 0
    assert all(isinstance(row, tuple) for row in r.rows)


@pytest.mark.parametrize(
    "sql,status",
    [
        ("", "empty_sql"),
        ("   \n\t", "empty_sql"),
        ("-- just a comment", "empty_sql"),
        (";;", "empty_sql"),
        ("/* c */ ;", "empty_sql"),
        ("SELECT 1;", "ok"),
        ("SELECT 1 ; -- trailing comment", "ok"),
        ("SELECT 1 /* ; */ ;;  ", "ok"),
        ("SELECT 'a;b', \"x;y\" FROM singer LIMIT 1", "ok"),
        ("SELECT 1; SELECT 2", "multiple_statements"),
        ("SELEC 1", "syntax_error"),
        ("SELECT FROM WHERE", "syntax_error"),
        ("SELECT 'unterminated", "syntax_error"),
        ("SELECT nosuch FROM singer", "runtime_error"),
        ("SELECT * FROM nosuch", "runtime_error"),
        ("SELECT abs(-9223372036854775808)", "runtime_error"),
    ],
)
def test_statuses(sb, files, sql, status):
    r = sb.execute(files["small"], sql)
    assert r.status == status, r
    assert r.status in STATUSES
    if status != "ok":
        assert r.message and r.rows == [] and r.row_count == 0


def test_too_many_rows_keeps_the_cap(files):
    with Sandbox(workers=1, max_rows=7) as s:
        r = s.execute(files["small"], "SELECT id FROM singer ORDER BY id")
        assert r.status == "too_many_rows"
        assert r.rows == [(i,) for i in range(1, 8)] and r.row_count == 7
        assert s.execute(files["small"], "SELECT id FROM singer WHERE id <= 7").status == "ok"


def test_too_large_keeps_rows_that_fit(files):
    with Sandbox(workers=1, max_result_bytes=2000) as s:
        r = s.execute(files["small"], "SELECT name FROM singer ORDER BY id")
        assert r.status == "too_large" and 0 < r.row_count < 200
        assert r.rows == [(f"name {i}",) for i in range(1, r.row_count + 1)]


def _named_columns(name_len: int, ncols: int, value_len: int = 0) -> str:
    """One row of `ncols` columns, all named with the same `name_len` characters, each value a
    string of `value_len` characters (the integer 1 when 0); the SQL text stays short."""
    val = f"printf('%.*c', {value_len}, 'v')" if value_len else "1"
    return f'WITH t AS (SELECT {val} AS "{"c" * name_len}") SELECT ' + ", ".join(["t.*"] * ncols) + " FROM t"


def test_column_names_count_toward_the_output_cap(files):
    """The 8 MiB cap covers the column names as well as the rows. Its own sandbox with a 5 s statement
    limit: building 59.5 MB of names can pass the shared fixture's 0.5 s on a loaded 2-core machine, and
    the subject here is the byte cap, not the clock."""
    with Sandbox(workers=1, timeout_s=5.0, hard_timeout_s=10.0, max_rows=5000) as sb:
        _column_name_caps(sb, files)


def _column_name_caps(sb, files):
    sql = _named_columns(30_000, 1984)  # 59.5 MB of names from 40 KB of SQL
    assert len(sql) < 40_000
    r = sb.execute(files["small"], sql)
    assert r.status == "too_large", (r.status, len(r.columns))
    assert r.columns == [] and r.rows == [] and "column names" in r.message
    assert len(pickle.dumps(r)) < 10_000  # nothing of the 59.5 MB comes back
    # names that fit (200 x 30,000 = 6.0 MB) plus one row of 200 x 15,000 = 3.0 MB: over 8 MiB together
    r = sb.execute(files["small"], _named_columns(30_000, 200, 15_000))
    assert r.status == "too_large" and r.rows == [], (r.status, r.row_count)
    assert len(pickle.dumps(r)) < 8 * 2**20
    # names plus row within the cap (3.0 MB + 1.5 MB): ok, everything returned
    r = sb.execute(files["small"], _named_columns(30_000, 100, 15_000))
    assert r.status == "ok" and len(r.columns) == 100 and r.rows == [("v" * 15_000,) * 100]


def test_error_messages_are_capped(sb, files):
    """SQLite quotes the offending token in its message: a 900,000-character one stays out."""
    big = "a" * 900_000
    for sql, status in (
        (f'SELECT 1 FROM singer s "{big}"', "syntax_error"),
        (f'SELECT 1 FROM "{big}"', "runtime_error"),
    ):
        r = sb.execute(files["small"], sql)
        assert r.status == status and 0 < len(r.message) <= 1000, (r.status, len(r.message))


def test_missing_database_is_runtime_error_and_creates_nothing(sb, tmp_path):
    p = tmp_path / "nope.sqlite"
    r = sb.execute(p, "SELECT 1")
    assert r.status == "runtime_error" and "unable to open" in r.message
    assert not p.exists()


def test_per_call_timeout(sb, files):
    q = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    t0 = time.monotonic()
    r = sb.execute(files["small"], q, timeout_s=0.1)
    assert r.status == "timeout" and time.monotonic() - t0 < TIMEOUT_S
    assert r.rows == []


def test_changed_file_is_reopened(sb, tmp_path):
    db = tmp_path / "changing.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE t (x)")
    con.execute("INSERT INTO t VALUES (1)")
    con.commit()
    con.close()
    assert sb.execute_many([(db, "SELECT count(*) FROM t")] * 4)[0].rows == [(1,)]
    db.unlink()
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE t (x)")
    con.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(500)])
    con.commit()
    con.close()
    assert all(r.rows == [(500,)] for r in sb.execute_many([(db, "SELECT count(*) FROM t")] * 4))


# ---------------------------------------------------------------- watchdog, crashes, concurrency


def test_watchdog_kills_and_respawns(files):
    # progress_ops=0: no in-SQLite deadline at all, so only the parent's watchdog can stop this
    with Sandbox(workers=1, timeout_s=0.3, hard_timeout_s=0.8, progress_ops=0) as s:
        pid = s._all[0].proc.pid
        q = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
        t0 = time.monotonic()
        r = s.execute(files["small"], q)
        assert r.status == "timeout" and "killed" in r.message
        assert time.monotonic() - t0 < 5
        assert s.kills == 1 and s._all[0].proc.pid != pid
        assert s.execute(files["small"], "SELECT 42").rows == [(42,)]


def test_watchdog_in_a_batch_reruns_the_others(files):
    with Sandbox(workers=1, timeout_s=0.3, hard_timeout_s=0.8, progress_ops=0) as s:
        bomb = "SELECT printf('%.*c', 2000000000, 'x')"
        items = [(files["small"], f"SELECT {i}") for i in range(5)]
        items.insert(2, (files["small"], bomb))
        res = s.execute_many(items)
        assert [r.status for r in res] == ["ok", "ok", "timeout", "ok", "ok", "ok"]
        assert [r.rows[0][0] for r in res if r.status == "ok"] == [0, 1, 2, 3, 4]


def test_worker_crash_is_reported_and_recovered(files):
    with Sandbox(workers=1, timeout_s=5.0, hard_timeout_s=10.0) as s:
        assert s.execute(files["small"], "SELECT 1").status == "ok"
        pid = s._all[0].proc.pid
        q = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
        timer = threading.Timer(0.5, os.kill, (pid, signal.SIGKILL))
        timer.start()
        r = s.execute(files["small"], q)
        timer.join()
        assert r.status == "worker_crash", r
        assert s.execute(files["small"], "SELECT 2").rows == [(2,)]
        # a worker that dies while idle costs nothing: the next call just works
        os.kill(s._all[0].proc.pid, signal.SIGKILL)
        time.sleep(0.2)
        assert s.execute(files["small"], "SELECT 3").rows == [(3,)]


def test_execute_many_in_order_and_parallel(sb, files):
    items = []
    for i in range(300):
        if i % 50 == 7:
            items.append((files["small"], "DROP TABLE singer"))
        elif i % 50 == 9:
            items.append((files["small"], ""))
        else:
            items.append((files["small"], f"SELECT {i}, count(*) FROM singer WHERE id <= {i % 200}"))
    res = sb.execute_many(items)
    assert len(res) == len(items)
    for i, r in enumerate(res):
        if i % 50 == 7:
            assert r.status == "forbidden"
        elif i % 50 == 9:
            assert r.status == "empty_sql"
        else:
            assert r.status == "ok" and r.rows == [(i, min(i % 200, 200))]
    assert sb.execute_many([]) == []


def test_execute_is_thread_safe(sb, files):
    errors: list = []

    def work(k: int) -> None:
        for j in range(25):
            n = (k * 25 + j) % 200 + 1
            r = sb.execute(files["small"], f"SELECT name FROM singer WHERE id = {n}")
            if r.rows != [(f"name {n}",)]:
                errors.append(r)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_close_and_context_manager(files):
    s = Sandbox(workers=2)
    pids = [w.proc.pid for w in s._all]
    assert s.execute(files["small"], "SELECT 1").status == "ok"
    s.close()
    s.close()  # idempotent
    assert all(w.proc is None for w in s._all)
    assert not any(_alive(p) for p in pids)
    with pytest.raises(RuntimeError):
        s.execute(files["small"], "SELECT 1")
    with Sandbox(workers=1) as s2:
        assert s2.execute(files["small"], "SELECT 1").ok
    assert all(w.proc is None for w in s2._all)


def test_workers_cleaned_up_at_interpreter_exit(files, tmp_path):
    code = (
        "from sqlrl.sql.sandbox import Sandbox\n"
        "s = Sandbox(workers=2)\n"
        f"assert s.execute({str(files['small'])!r}, 'SELECT 1').ok\n"
        "print(' '.join(str(w.proc.pid) for w in s._all), flush=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    pids = [int(x) for x in out.stdout.split()]
    deadline = time.monotonic() + 5
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        time.sleep(0.05)
    assert alive == []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_script_without_main_guard_works(files, tmp_path):
    script = tmp_path / "noguard.py"
    script.write_text(
        "from sqlrl.sql.sandbox import Sandbox\n"
        "with Sandbox(workers=1) as s:\n"
        f"    print(s.execute({str(files['small'])!r}, 'SELECT 7').rows)\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[(7,)]", out.stderr


# ---------------------------------------------------------------- results


def test_to_dict_is_json_safe_and_round_trips(sb, files):
    r = sb.execute(files["small"], "SELECT photo, 1e999, -1e999, 'x', NULL, 2.5 FROM singer WHERE id = 1")
    assert r.status == "ok"
    d = r.to_dict()
    assert set(d) >= {"status", "columns", "rows", "row_count", "elapsed_ms", "message"}
    text = json.dumps(d, allow_nan=False)
    back = SQLResult.from_dict(json.loads(text))
    assert back.rows[0][0] == b"\x01\x00\xff"
    assert back.rows[0][1:] == ("Infinity", "-Infinity", "x", None, 2.5)
    assert math.isinf(r.rows[0][1])


def test_render_is_deterministic_and_capped():
    r = SQLResult("ok", ["a", "b"], [(i, f"v\n{i}") for i in range(25)], 25, 3.14, "")
    text = r.render(max_rows=3)
    assert text == "status: ok (25 rows)\na | b\n0 | v\\n0\n1 | v\\n1\n2 | v\\n2\n... 22 more rows"
    assert SQLResult("ok", ["a", "b"], r.rows, 25, 99.0, "").render(max_rows=3) == text  # no timing
    assert len(r.render(max_rows=25, max_chars=50)) <= 50
    e = SQLResult("syntax_error", [], [], 0, 0.1, 'near "SELEC": syntax error')
    assert e.render() == 'status: syntax_error\nerror: near "SELEC": syntax error'
    one = SQLResult("ok", ["x"], [(None,)], 1, 0.0, "").render()
    assert one == "status: ok (1 row)\nx\nNULL"
    cut = SQLResult("too_many_rows", ["x"], [(1,), (2,)], 2, 0.0, "more than 2 rows").render(max_rows=1)
    assert cut.splitlines()[0].startswith("status: too_many_rows") and "... 1 more rows" in cut


def test_precheck_tokenizer():
    assert split_statements("SELECT ';' -- ;\n; /* ; */ ;") == ["SELECT ';'"]
    assert len(split_statements("SELECT 1; SELECT [a;b] FROM `c;d`")) == 2
    assert precheck("SELECT 1") is None
    assert precheck("  with x as (select 1) select * from x") is None
    assert precheck("drop table t").status == "forbidden"
    assert precheck("x" * 20, max_sql_chars=10).status == "too_large"


# ---------------------------------------------------------------- CLI and imports


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sqlrl.cli", "sql", *args], capture_output=True, text=True, timeout=60
    )


def test_cli_json(files):
    out = _cli("--db", str(files["small"]), "--json", "SELECT id, name FROM singer WHERE id = 3")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["status"] == "ok" and d["columns"] == ["id", "name"] and d["rows"] == [[3, "name 3"]]
    assert {"row_count", "elapsed_ms", "message"} <= set(d)


def test_cli_exit_zero_whatever_the_sql_does(files):
    before = _sha(files["small"])
    out = _cli("--db", str(files["small"]), "--json", "--timeout", "0.5", "DROP TABLE singer")
    assert out.returncode == 0 and json.loads(out.stdout)["status"] == "forbidden"
    out = _cli("--db", str(files["small"]), "SELEC 1")
    assert out.returncode == 0 and out.stdout.startswith("status: syntax_error")
    assert _sha(files["small"]) == before


def test_cli_missing_database(tmp_path):
    out = _cli("--db", str(tmp_path / "missing.sqlite"), "SELECT 1")
    assert out.returncode == 2
    assert "no database file" in out.stderr and out.stdout == ""
    assert not (tmp_path / "missing.sqlite").exists()


def test_sandbox_imports_only_stdlib():
    import ast

    import sqlrl.sql.sandbox as mod

    for path in sorted(Path(mod.__file__).parent.glob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        outside = {
            n
            for n in names
            if n.split(".")[0] not in sys.stdlib_module_names
            and n not in ("__future__", "sqlrl.artifacts")
            and not n.startswith("sqlrl.sql.")
        }
        assert not outside, (path.name, outside)
    out = subprocess.run(
        [sys.executable, "-c", "import sys, sqlrl.sql.sandbox; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.strip() == "False"


def test_deal_spreads_consecutive_items_over_chunks():
    """Both execute_many (multi-turn rollouts) and execute_scored (rewards) cut a call with `_deal`: a
    GRPO step of 32 tasks x 8 samples into 32 chunks of 8 (8 workers x 4) holds one sample of every task
    per chunk, so the 8 samples of one task go to 8 chunks."""
    from sqlrl.sql import sandbox as S

    items = [(g, k) for g in range(32) for k in range(8)]
    chunks = S._deal(items, 8)
    assert len(chunks) == 32 and all(len(c) == 8 for c in chunks)
    assert sorted(x for c in chunks for x in c) == sorted(items)  # every item exactly once
    for c in chunks:
        assert len({g for g, _ in c}) == 8  # 8 different tasks per chunk
    for g in range(32):
        assert len({n for n, c in enumerate(chunks) for gg, _ in c if gg == g}) == 8
    odd = S._deal(list(range(10)), 4)  # 3 chunks of at most 4, each item once
    assert odd == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]


def test_scored_run_queues_no_chunk_behind_a_busy_worker_in_the_tail():
    """execute_scored's last chunks (no more left than busy workers) are not queued behind a running
    chunk, where a slow statement would hold them while another worker idles: with two busy workers
    and three chunks left, one is queued (3 > 2) and the last two wait for a free worker."""
    from collections import OrderedDict, deque

    from sqlrl.sql import scoring

    class Conn:
        def __init__(self):
            self.sent = 0

        def send_bytes(self, data):
            self.sent += 1

    class W:
        def __init__(self):
            self.conn, self.refs, self.ref_weight, self.sndbuf = Conn(), OrderedDict(), 0, 1 << 20

    class Pool:
        closed = False

    def chunk(i):
        return [(i, "/x.sqlite", "SELECT 1", 5.0, (), None, None)]

    chunks = deque(chunk(i) for i in range(2, 5))  # three chunks left
    run = scoring._ScoredRun(Pool(), chunks, {}, "m:f", None, [None] * 5, depth=2, ref_budget=1 << 20)
    a, b = W(), W()
    run.state = {w: [chunk(i), 0, 0.0, deque([(1, 100)])] for i, w in enumerate((a, b))}
    run.top_up(a)  # 3 left > 2 busy: one queued behind a's chunk
    assert (a.conn.sent, len(chunks)) == (1, 2)
    run.state[a][3].popleft()  # a's first chunk answered: room for one more, but only 2 left
    run.top_up(a)
    run.top_up(b)
    assert (a.conn.sent, b.conn.sent, len(chunks)) == (1, 0, 2)
    del run.state[b]  # one busy worker: queueing behind it leaves no worker idle
    run.top_up(a)
    assert (a.conn.sent, len(chunks)) == (2, 1)


def test_warm_opens_each_database_in_every_idle_worker(files, tmp_path):
    other = tmp_path / "other.sqlite"
    _make_small_db(other)
    missing = tmp_path / "missing.sqlite"
    before = _sha(files["small"])
    with Sandbox(workers=2, timeout_s=TIMEOUT_S, max_connections=2) as s:
        # 2 databases (one named twice) x 2 workers; a missing file opens nowhere and raises nothing
        assert s.warm([files["small"], other, str(files["small"]), missing]) == 4
        # no more databases than each worker's connection cache holds: the first 2 distinct ones
        assert s.warm([missing, files["small"], other]) == 2
        assert s.warm([]) == 0
        assert s.execute(files["small"], "SELECT count(*) FROM singer").rows == [(200,)]
    assert not missing.exists()
    assert _sha(files["small"]) == before
