"""Tests for sqlrl.tasks.schemainfo: example values (hand-checked text), units, foreign keys, cache."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sqlrl.tasks import schemainfo
from sqlrl.tasks.data import DataError, schema_text
from sqlrl.tasks.schemainfo import render_example, schema_info

DDL = [
    "CREATE TABLE dept (id INTEGER PRIMARY KEY, name TEXT)",
    "CREATE TABLE emp (id INTEGER PRIMARY KEY, name TEXT, dept_id INTEGER REFERENCES dept(id), note TEXT)",
    "CREATE INDEX emp_dept ON emp(dept_id)",
    "CREATE TABLE empty_t (x INTEGER)",
]


@pytest.fixture()
def staff_db(tmp_path: Path) -> str:
    path = tmp_path / "staff.sqlite"
    con = sqlite3.connect(path)
    for stmt in DDL:
        con.execute(stmt)
    con.executemany("INSERT INTO dept VALUES (?, ?)", [(1, "Sales"), (2, "R&D"), (3, "Ops")])
    long_note = "it's a very long note that goes past thirty characters"
    con.executemany(
        "INSERT INTO emp VALUES (?, ?, ?, ?)",
        [(1, "Ann", 1, None), (2, "Bob", 1, None), (3, "Cy", 2, None), (4, "Di", 1, long_note)],
    )
    con.commit()
    con.close()
    return str(path)


def test_example_values_text_is_hand_checked(staff_db):
    # most frequent first, ties by ascending value: dept names all occur once -> 'Ops' < 'R&D' < 'Sales';
    # emp.dept_id: 1 occurs 3 times, 2 once; the note is cut to 27 characters + "..." and its quote doubled
    want = (
        DDL[0] + ";\n"
        "/* example values of dept (up to 2 per column, most frequent first):\n"
        "  id: 1, 2\n"
        "  name: 'Ops', 'R&D'\n"
        "*/\n\n" + DDL[1] + ";\n"
        "/* example values of emp (up to 2 per column, most frequent first):\n"
        "  id: 1, 2\n"
        "  name: 'Ann', 'Bob'\n"
        "  dept_id: 1, 2\n"
        "  note: 'it''s a very long note that ...'\n"
        "*/\n\n" + DDL[2] + ";\n\n" + DDL[3] + ";\n"
        "/* empty_t has no rows */"
    )
    assert schema_info(staff_db, 2).file_order_text == want


def test_without_values_it_is_schema_text(staff_db):
    assert schema_info(staff_db, 0).file_order_text == schema_text(staff_db)


def test_units_group_indexes_and_link_foreign_keys_both_ways(staff_db):
    units = schema_info(staff_db, 1).units
    assert [(u.name, u.kind, u.index) for u in units] == [
        ("dept", "table", 0),
        ("emp", "table", 1),
        ("empty_t", "table", 2),
    ]
    emp = units[1]
    assert emp.text.startswith(DDL[1] + ";\n/* example values of emp") and emp.text.endswith(DDL[2] + ";")
    assert emp.columns == ("id", "name", "dept_id", "note")
    assert [u.partners for u in units] == [("emp",), ("dept",), ()]
    assert units[0].values == ("1", "'Ops'")
    assert schema_info(staff_db, 0).units[0].values == ()


def test_only_null_column_and_value_rendering(tmp_path):
    path = tmp_path / "n.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (a INTEGER, b TEXT)")
    con.execute("INSERT INTO t VALUES (NULL, 'x\ny')")
    con.commit()
    con.close()
    assert schema_info(path, 3).units[0].text.splitlines()[-3:] == ["  a: (only NULL)", "  b: 'x y'", "*/"]
    assert render_example(b"\x00\x01") == "X'0001'"
    assert render_example(bytes(range(10))) == "X'0001020304050607...'"
    assert render_example(2.5) == "2.5"


def test_cache_follows_the_file(staff_db):
    first = schema_info(staff_db, 1)
    assert schema_info(staff_db, 1) is first  # computed once per database
    con = sqlite3.connect(staff_db)
    con.execute("INSERT INTO dept VALUES (0, 'Admin')")
    con.commit()
    con.close()
    assert "name: 'Admin'" in schema_info(staff_db, 1).units[0].text  # a changed file is read again


def test_errors(tmp_path):
    with pytest.raises(DataError, match="no database file"):
        schema_info(tmp_path / "missing.sqlite", 1)
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a database at all" * 10)
    with pytest.raises(DataError, match="cannot read"):
        schema_info(bad, 1)
    with pytest.raises(ValueError, match=">= 0"):
        schema_info(bad, -1)


def _table_db(path: Path, values: list[str]) -> str:
    """One table t(id, s) with an index on s, `values` in rowid order."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, s TEXT)")
    con.execute("CREATE INDEX t_s ON t(s)")
    con.executemany("INSERT INTO t (s) VALUES (?)", [(v,) for v in values])
    con.commit()
    con.close()
    return str(path)


def test_example_values_are_counted_over_the_first_sample_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(schemainfo, "SAMPLE_ROWS", 100, raising=False)
    # rowids 1-60 'zeta', 61-1000 'alpha': over the whole table 'alpha' leads (940 vs 60); over the first
    # 100 rowids 'zeta' leads (60 vs 40). The index on s must not decide which rows are read (its first
    # 100 entries are all 'alpha').
    db = _table_db(tmp_path / "skew.sqlite", ["zeta"] * 60 + ["alpha"] * 940)
    text = schema_info(db, 2).units[0].text
    assert (
        "/* example values of t (up to 2 per column, most frequent first among its first 100 rows):" in text
    )
    assert "  s: 'zeta', 'alpha'" in text
    exact = _table_db(tmp_path / "exact.sqlite", ["zeta"] * 60 + ["alpha"] * 40)  # exactly 100 rows
    assert "(up to 2 per column, most frequent first):" in schema_info(exact, 2).units[0].text


def _vm_steps(db: str, n: int) -> int:
    """SQLite VM progress callbacks (one per 100 instructions) while the example values of t are read."""
    steps = [0]

    def tick() -> int:
        steps[0] += 1
        return 0

    con = sqlite3.connect(db)
    con.set_progress_handler(tick, 100)
    try:
        schemainfo._values_comment(con, "t", ["id", "s"], n)
    finally:
        con.close()
    return steps[0]


def test_example_values_read_a_bounded_number_of_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(schemainfo, "SAMPLE_ROWS", 100, raising=False)
    small = _table_db(tmp_path / "small.sqlite", [f"v{i % 7}" for i in range(200)])
    big = _table_db(tmp_path / "big.sqlite", [f"v{i % 7}" for i in range(20_000)])
    # 100 times the rows, the same work: each column's values are counted over the first 100 rows only
    # (a full GROUP BY would take about 100 times the VM steps)
    assert _vm_steps(big, 3) <= 1.2 * _vm_steps(small, 3)
