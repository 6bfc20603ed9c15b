"""A debugging task's submission runs in the scoring process: it gets the sandbox's value and result caps.

`apply_submission` ran policy SQL on a plain connection (SQLite's own 1 GB value limit) and fetched
up to 100,000 rows of a query's result with no byte cap, in the process that scores (the trainer):
a result of 100 rows of 4 MB was stored whole (400 MB read into memory first). Now no value may be
longer than `MAX_VALUE_BYTES`, and a query's result over the sandbox's caps is an SQL error.
"""

from __future__ import annotations

import pytest

from sqlrl.tasks import debug_episode as de
from sqlrl.tasks.debug_episode import apply_submission, prepare_state
from sqlrl.tasks.debugging import DebugTaskPrivate, DebugTaskPublic


def _task(db: str, category: str) -> DebugTaskPrivate:
    query = category == "query"
    pub = DebugTaskPublic(
        task_id="t/0",
        db_id="tiny",
        category=category,
        description="the rows of t by a" if query else "double b where a = 1",
        schema="CREATE TABLE t (a INTEGER, b REAL);",
        buggy_sql="SELECT a, b FROM t" if query else "UPDATE t SET b = b * 2",
        preprocess_sql=(),
        db_path=db,
    )
    if query:
        return DebugTaskPrivate(pub, ["SELECT a, b FROM t ORDER BY a"], de.query_test_cases(2, True), [])
    tests = ["SELECT (SELECT b FROM t WHERE a = 1) = 3.0"]
    return DebugTaskPrivate(pub, ["UPDATE t SET b = b * 2 WHERE a = 1"], tests, [])


ROWS_100 = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 100) "

# (category, submission, what the error says)
OVER = [
    ("query", ROWS_100 + "SELECT printf('%.*c', 4000000, 'x'), i FROM r", "result larger than 8388608 bytes"),
    ("query", "SELECT zeroblob(5000000), 1", "string or blob too big"),
    ("management", "UPDATE t SET b = zeroblob(5000000) WHERE a = 1", "string or blob too big"),
    ("query", ROWS_100.replace("100", "100001") + "SELECT i, i FROM r", "more than 100000 rows"),
]


@pytest.mark.parametrize("category,sql,says", OVER)
def test_submission_over_the_caps_is_an_error(tmp_path, tiny_db, category, sql, says):
    task = _task(tiny_db, category)
    state = str(tmp_path / "s.sqlite")
    prepare_state(task, state)
    err = apply_submission(task, state, sql)
    assert err is not None and says in err, err
    assert de.run_episode_offline(task, [sql])["status"] == "exec_error"


@pytest.mark.parametrize("category", ["query", "management"])
def test_solutions_under_the_caps_still_solve(tiny_db, category):
    task = _task(tiny_db, category)
    assert de.run_episode_offline(task, list(task.solution_sql))["status"] == "solved"
    # values of 2,000,000 bytes (3 rows: 6 MB, under both caps) are no error, only a wrong answer
    assert (
        de.run_episode_offline(task, ["SELECT a, zeroblob(2000000) FROM t ORDER BY a"])["status"]
        != "exec_error"
    )
