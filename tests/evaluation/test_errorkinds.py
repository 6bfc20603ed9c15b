"""The kind of an execution error, from SQLite's message (`sqlrl.evaluation.errorkinds`)."""

from __future__ import annotations

import sqlite3

import pytest

from sqlrl.evaluation.errorkinds import (
    IN_NAMED,
    IN_NONE,
    IN_OTHER,
    NOT_RECORDED,
    error_kind,
    exec_error_kinds,
    failure_message,
    missing_column_place,
    trajectory_messages,
)


@pytest.mark.parametrize(
    "sql,kind",
    [
        ("SELECT nope FROM t", "no such column"),
        ("SELECT t.a FROM t AS x", "no such column"),
        ("SELECT a FROM nope", "no such table"),
        ("SELECT a FROM t JOIN t AS u", "ambiguous column name"),
        ("SELECT a FROM t WHERE", "syntax error"),  # incomplete input
        ("SELECT a FROM t JOIN GROUP BY a", "syntax error"),  # near "GROUP"
        ("SELECT a FROM t WHERE count(a) > 1", "misuse of aggregate"),
        ("SELECT 'a", "syntax error"),  # unrecognized token
        ("SELECT substr() FROM t", "wrong number of arguments to function"),
    ],
)
def test_the_kind_of_real_sqlite_messages(sql, kind):
    con = sqlite3.connect(":memory:")
    con.execute("CREATE TABLE t (a INTEGER)")
    with pytest.raises(sqlite3.Error) as e:
        con.execute(sql)
    assert error_kind(str(e.value)) == kind, str(e.value)


def test_messages_of_other_sqlite_versions_and_unknown_ones():
    assert error_kind("misuse of aggregate: count()") == "misuse of aggregate"  # older SQLite
    assert error_kind("x" * 50 + ": detail") == "x" * 40


def test_failure_message_only_for_non_executable_sql_prefixed_by_a_sandbox_refusal():
    def reward(status, sandbox_status=None, message="m"):
        return {"status": status, "parts": {"sandbox_status": sandbox_status, "message": message}}

    assert failure_message(reward("exec_error", "runtime_error", "no such column: a")) == "no such column: a"
    assert failure_message(reward("exec_error", "syntax_error", "incomplete input")) == "incomplete input"
    assert failure_message(reward("timeout", "timeout", "interrupted")) == "interrupted"
    assert (
        failure_message(reward("exec_error", "too_many_rows", "more than 10 rows"))
        == "too_many_rows: more than 10 rows"
    )
    assert failure_message(reward("mismatch", "ok", "rows differ")) is None  # it executed
    assert failure_message(reward("infra_error", "worker_crash")) is None  # not the prediction's failure
    assert failure_message(reward("no_sql", None, None)) is None and failure_message(None) is None


def test_trajectories_are_read_only_when_a_row_lacks_its_message():
    def unread():
        raise AssertionError("trajectories read although every row has its message")

    rows = [{"task_id": "a", "status": "exec_error", "error": "no such table: x"}, {"status": "match"}]
    assert exec_error_kinds(rows, unread) == {"no such table": 1}


def test_exec_error_kinds_counts_exec_errors_only_most_frequent_first():
    rows = [
        {"task_id": "a", "status": "exec_error", "error": "no such table: x"},
        {"task_id": "b", "status": "exec_error", "error": "no such column: a"},
        {"task_id": "c", "status": "exec_error", "error": "no such column: b"},
        {"task_id": "d", "status": "exec_error"},  # an older folder's row: message from its trajectory
        {"task_id": "e", "status": "exec_error"},  # nowhere
        {"task_id": "f", "status": "timeout", "error": "interrupted"},
        {"task_id": "g", "status": "match"},
    ]
    assert list(exec_error_kinds(rows).items()) == [
        ("no such column", 2),
        (NOT_RECORDED, 2),
        ("no such table", 1),
    ]
    trajectories = [
        {"task_id": "d", "reward": {"status": "exec_error", "parts": {"message": "no such column: z"}}},
        {"task_id": "g", "reward": {"status": "match", "parts": {}}},
    ]
    assert trajectory_messages(trajectories) == {"d": "no such column: z"}
    assert list(exec_error_kinds(rows, lambda: trajectories).items()) == [
        ("no such column", 3),
        ("no such table", 1),
        (NOT_RECORDED, 1),
    ]


_SCHEMA = {"actor": ("Actor_ID", "Name", "Musical_ID", "Duration"), "musical": ("Musical_ID", "Name", "Year")}


@pytest.mark.parametrize(
    "sql,place",
    [
        # qualified by the other table's alias: the column is in a table the query names
        ("SELECT T2.Duration FROM actor AS T1 JOIN musical AS T2 ON T1.Musical_ID = T2.Musical_ID", IN_NAMED),
        # unqualified, from a table the query never joins
        ("SELECT Name FROM actor ORDER BY Year", IN_OTHER),
        # a name no table has (case differs from the schema's: still found or not found the same way)
        ("SELECT T1.Musician_ID FROM musical AS T1", IN_NONE),
        ("SELECT duration FROM musical", IN_OTHER),
        # a quoted table name counts as named; the column's case differs
        ('SELECT m.duration FROM "Actor" AS a JOIN musical AS m ON 1', IN_NAMED),
    ],
)
def test_where_a_missing_column_is_from_real_sqlite_messages(sql, place):
    con = sqlite3.connect(":memory:")
    for table, cols in _SCHEMA.items():
        con.execute(f"CREATE TABLE {table} ({', '.join(cols)})")
    with pytest.raises(sqlite3.Error) as e:
        con.execute(sql)
    assert missing_column_place(str(e.value), sql, _SCHEMA) == place, str(e.value)


def test_missing_column_place_is_none_for_other_messages():
    assert missing_column_place("no such table: x", "SELECT * FROM x", _SCHEMA) is None
    assert missing_column_place("", "", _SCHEMA) is None
    # a table named only inside a string literal counts as named (stated in the docstring)
    assert (
        missing_column_place("no such column: Year", "SELECT Year FROM actor WHERE Name = 'musical'", _SCHEMA)
        == IN_NAMED
    )
