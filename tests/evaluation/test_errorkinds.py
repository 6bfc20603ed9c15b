"""The kind of an execution error, from SQLite's message (`sqlrl.evaluation.errorkinds`)."""

from __future__ import annotations

import sqlite3

import pytest

from sqlrl.evaluation.errorkinds import NOT_RECORDED, error_kind, exec_error_kinds


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


def test_exec_error_kinds_counts_exec_errors_only_most_frequent_first():
    rows = [
        {"status": "exec_error", "error": "no such table: x"},
        {"status": "exec_error", "error": "no such column: a"},
        {"status": "exec_error", "error": "no such column: b"},
        {"status": "exec_error"},  # evaluated before results.jsonl held the message
        {"status": "timeout", "error": "interrupted"},
        {"status": "match"},
    ]
    assert list(exec_error_kinds(rows).items()) == [
        ("no such column", 2),
        ("no such table", 1),
        (NOT_RECORDED, 1),
    ]
