"""Time limits and inputs a careless user gives the sandbox, the gold cache, the Evaluator and the CLI.

A time limit that is NaN or infinite switched both the soft deadline (the progress handler compares
the clock with it) and the parent's watchdog off: `sqlrl sql --timeout nan` with a recursive CTE ran
forever. Every time limit is now a finite number of seconds > 0, else ValueError (exit 2 in the CLI).
A damaged database file given to `sqlrl sql` / `sqlrl reward` is named with its problem (exit 2), not
reported as a SQL error or as an unscorable gold.
"""

from __future__ import annotations

import math
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from sqlrl.reward.evaluator import Evaluator
from sqlrl.sql.engine import seconds
from sqlrl.sql.replicas import ReplicaPool
from sqlrl.sql.sandbox import Sandbox
from sqlrl.tasks.goldcache import GoldCache

BAD = [math.nan, math.inf, -math.inf, 0, -1, "x", None, True]


@pytest.mark.parametrize("value", BAD)
def test_seconds_refuses(value):
    with pytest.raises(ValueError, match="finite number of seconds > 0"):
        seconds(value, "x")


@pytest.mark.parametrize("value,want", [(5, 5.0), (0.25, 0.25), (1e-3, 1e-3)])
def test_seconds_accepts(value, want):
    assert seconds(value, "x") == want


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_constructors_refuse_non_finite_limits(tmp_path, db, value):
    with pytest.raises(ValueError, match="Sandbox: timeout_s"):
        Sandbox(workers=1, timeout_s=value)
    with pytest.raises(ValueError, match="Sandbox: hard_timeout_s"):
        Sandbox(workers=1, timeout_s=1, hard_timeout_s=value)
    with pytest.raises(ValueError, match="GoldCache: timeout_s"):
        GoldCache(timeout_s=value)
    with pytest.raises(ValueError, match="Evaluator: timeout_s"):
        Evaluator(object(), object(), timeout_s=value)
    with pytest.raises(ValueError, match="ReplicaPool: timeout_s"):
        ReplicaPool({"d": db}, tmp_path / "pool", workers=1, timeout_s=value)


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("lim") / "d.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (x INTEGER)")
    con.execute("INSERT INTO t VALUES (1)")
    con.commit()
    con.close()
    return str(path)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_per_call_limits_refused_before_any_work(db, value):
    with Sandbox(workers=1, timeout_s=1) as sb:
        with pytest.raises(ValueError, match="timeout_s"):
            sb.execute(
                db,
                "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT max(x) FROM r",
                value,
            )
        with pytest.raises(ValueError, match="timeout_s"):
            sb.execute_scored(
                [(db, "SELECT 1", (), None)], {}, "sqlrl.reward.scoring:score_in_worker", None, value
            )
        assert sb.execute(db, "SELECT x FROM t").rows == [(1,)]  # the sandbox still works


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sqlrl.cli", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "args,says",
    [
        (["--timeout", "nan"], "--timeout must be a finite number"),
        (["--timeout", "inf"], "--timeout must be a finite number"),
        (["--max-rows", "-1"], "--max-rows and --show-rows must be >= 0"),
        (["--show-rows", "-1"], "--max-rows and --show-rows must be >= 0"),
    ],
)
def test_sql_cli_refuses_bad_limits(db, args, says):
    p = _cli("sql", "--db", db, *args, "SELECT 1")
    assert p.returncode == 2 and says in p.stderr


@pytest.mark.parametrize(
    "content,says",
    [
        (b"", "empty file"),
        (b"hello\n", "not a SQLite database"),
    ],
)
def test_cli_names_a_damaged_database(tmp_path, content, says):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(content)
    for cmd in (
        ["sql", "--db", str(bad), "SELECT 1"],
        ["reward", "--db", str(bad), "--gold", "SELECT 1", "--pred", "SELECT 1"],
    ):
        p = _cli(*cmd)
        assert p.returncode == 2, (cmd, p.stdout, p.stderr)
        assert f"database {bad} is damaged: {says}" in p.stderr


def test_cli_names_a_truncated_database(tmp_path, db):
    bad = tmp_path / "cut.sqlite"
    data = Path(db).read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    p = _cli("reward", "--db", str(bad), "--gold", "SELECT x FROM t", "--pred", "SELECT x FROM t")
    assert p.returncode == 2 and "is damaged: truncated" in p.stderr


@pytest.mark.parametrize("cap", ["max_rows", "max_result_bytes", "max_value_bytes", "max_sql_chars"])
def test_sandbox_refuses_negative_caps(cap):
    # max_rows=-1 gave "more than -1 rows; the first -1 are kept" for every statement
    with pytest.raises(ValueError, match="must be >= 0"):
        Sandbox(workers=1, **{cap: -1})


def test_reward_cli_says_why_a_gold_is_excluded(db):
    p = _cli("reward", "--db", db, "--gold", "SELEC x FROM t", "--pred", "SELECT x FROM t", "--json")
    assert p.returncode == 0 and '"gold_unscorable"' in p.stdout
    assert 'the gold is excluded (gold_error): syntax_error: near "SELEC": syntax error' in p.stderr
    p = _cli("reward", "--db", db, "--gold", "SELECT x FROM t WHERE 0", "--pred", "SELECT x FROM t", "--json")
    assert "the gold is excluded (gold_empty): no rows" in p.stderr
