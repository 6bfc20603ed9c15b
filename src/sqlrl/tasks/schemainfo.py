"""What a prompt may show of a database besides its CREATE statements: example values, names, foreign keys.

`schema_info(db_path, sample_values)` reads a database once per process (cached per file path, mtime,
size and `sample_values`) and returns its `SchemaUnit`s: one per table or view, in file order
(`sqlite_master` rowid order of the table or view), each with its statement text, column names,
foreign-key partners and the example values shown. `file_order_text` joins every statement in
`sqlite_master` rowid order, as `sqlrl.tasks.data.schema_text` does, which it equals when
`sample_values` is 0.

Example values (`sample_values = N > 0`): after each table's CREATE statement, a comment with, per
column, up to N distinct non-NULL values: the N most frequent, ties by SQLite's ascending value order
(`GROUP BY col ORDER BY COUNT(*) DESC, col`), counted over the table's first `SAMPLE_ROWS` (10,000)
rows in storage order (rowid, or primary key for WITHOUT ROWID; `NOT INDEXED`); a table with more rows
says so in its comment. Most frequent: the values a question filters on are the categorical ones (a
status, 'F'/'M'); for a key column every count is 1 and the smallest values show. Strings longer than
30 characters are cut to 27 and `...`, newlines become spaces, quotes are doubled (SQL literal form);
blobs show as `X'..'` with at most 8 bytes. The values come from the database file the policy may
query anyway, never from a gold query. Cost: at most SAMPLE_ROWS rows read per column, whatever the
table's size, once per database and process (`bench/bench_big_db.py`).

What is not covered: a column whose values all fail to decode is shown as SQLite returns it (UTF-8
errors replaced); virtual tables whose module is not loaded show why their values are unavailable.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlrl.tasks.data import DataError

__all__ = ["SchemaInfo", "SchemaUnit", "render_example", "schema_info"]

VALUE_CHARS = 30
SAMPLE_ROWS = 10_000  # rows per table the example values are counted over


@dataclass(frozen=True)
class SchemaUnit:
    """A table or view with its own statements (its CREATE, then its indexes and triggers)."""

    kind: str  # "table" | "view"
    name: str
    index: int  # position among the units, in file order
    text: str  # statements joined by a blank line; a table's example-values comment follows its CREATE
    columns: tuple[str, ...]
    partners: tuple[str, ...]  # names of units linked to this one by a foreign key, either direction, sorted
    values: tuple[str, ...]  # example values as rendered in `text` (empty when none are shown)


@dataclass(frozen=True)
class SchemaInfo:
    units: tuple[SchemaUnit, ...]
    file_order_text: str  # every statement in sqlite_master rowid order (schema_text's text, plus values)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def render_example(v: Any) -> str:
    """One example value as shown: SQL literal form, long strings cut, blobs shortened."""
    if isinstance(v, bytes):
        return "X'" + v[:8].hex() + ("...'" if len(v) > 8 else "'")
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        s = v.replace("\r", " ").replace("\n", " ")
        s = s if len(s) <= VALUE_CHARS else s[: VALUE_CHARS - 3] + "..."
        return "'" + s.replace("'", "''") + "'"
    return str(v)


def _values_comment(con: sqlite3.Connection, table: str, columns: list[str], n: int) -> tuple[str, list[str]]:
    """(the comment after a table's CREATE, every value rendered in it)."""
    q = _quote(table)
    try:
        if con.execute(f"SELECT 1 FROM {q} LIMIT 1").fetchone() is None:
            return f"/* {table} has no rows */", []
        lines, shown = [], []
        m = int(SAMPLE_ROWS)
        more = con.execute(f"SELECT 1 FROM {q} LIMIT 1 OFFSET {m}").fetchone() is not None
        for col in columns:
            c = _quote(col)
            rows = con.execute(
                f"SELECT {c} FROM (SELECT {c} FROM {q} NOT INDEXED LIMIT {m}) WHERE {c} IS NOT NULL "
                f"GROUP BY {c} ORDER BY COUNT(*) DESC, {c} LIMIT {int(n)}"
            ).fetchall()
            vals = [render_example(r[0]) for r in rows]
            shown += vals
            lines.append(f"  {col}: {', '.join(vals) if vals else '(only NULL)'}")
    except sqlite3.Error as e:  # e.g. a virtual table whose module is not loaded
        return f"/* example values of {table} unavailable: {e} */", []
    among = f" among its first {m} rows" if more else ""
    head = f"/* example values of {table} (up to {n} per column, most frequent first{among}):"
    return "\n".join([head, *lines, "*/"]), shown


def _read(db_path: str, n: int) -> SchemaInfo:
    uri = Path(db_path).resolve().as_uri() + "?mode=ro"
    con = sqlite3.connect(uri, uri=True)
    con.text_factory = lambda b: b.decode("utf-8", errors="replace")
    try:
        return _units(con, n)
    except sqlite3.DatabaseError as e:
        raise DataError(f"schema_info: cannot read {db_path} as SQLite ({e}); re-download the file") from e
    finally:
        con.close()


def _units(con: sqlite3.Connection, n: int) -> SchemaInfo:
    entries = con.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master "
        "WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY rowid"
    ).fetchall()
    texts: list[str] = []
    own: dict[str, dict] = {}  # lower-case unit name -> fields
    for typ, name, tbl, sql in entries:
        text = sql.rstrip().rstrip(";").rstrip() + ";"
        if typ in ("table", "view"):
            try:
                cols = [r[1] for r in con.execute(f"PRAGMA table_info({_quote(name)})").fetchall()]
                refs = [r[2] for r in con.execute(f"PRAGMA foreign_key_list({_quote(name)})").fetchall()]
            except sqlite3.Error:
                cols, refs = [], []
            shown: list[str] = []
            if n and typ == "table":
                comment, shown = _values_comment(con, name, cols, n)
                text += "\n" + comment
            own[name.lower()] = {
                "kind": typ,
                "name": name,
                "texts": [text],
                "cols": cols,
                "refs": refs,
                "vals": shown,
            }
        elif tbl is not None and tbl.lower() in own:
            own[tbl.lower()]["texts"].append(text)
        texts.append(text)
    partners: dict[str, set[str]] = {k: set() for k in own}
    for k, u in own.items():
        for ref in u["refs"]:
            r = str(ref).lower()
            if r in own and r != k:
                partners[k].add(own[r]["name"])
                partners[r].add(u["name"])
    units = tuple(
        SchemaUnit(
            kind=u["kind"],
            name=u["name"],
            index=i,
            text="\n\n".join(u["texts"]),
            columns=tuple(u["cols"]),
            partners=tuple(sorted(partners[k])),
            values=tuple(u["vals"]),
        )
        for i, (k, u) in enumerate(own.items())
    )
    return SchemaInfo(units=units, file_order_text="\n\n".join(texts))


_CACHE: dict[tuple[str, int, int, int, int], SchemaInfo] = {}
_LOCK = threading.Lock()


def schema_info(db_path: str | os.PathLike, sample_values: int = 0) -> SchemaInfo:
    """The database's `SchemaInfo` with `sample_values` example values per column (0 = none), cached."""
    if sample_values < 0:
        raise ValueError(f"sample_values = {sample_values} must be >= 0 (0 = no example values)")
    real = os.path.realpath(db_path)
    if not os.path.isfile(real):
        raise DataError(f"schema_info: no database file at {db_path}; check the task's db_path")
    st = os.stat(real)
    key = (real, st.st_mtime_ns, st.st_size, int(sample_values), int(SAMPLE_ROWS))
    with _LOCK:
        hit = _CACHE.get(key)
    if hit is None:
        hit = _read(real, int(sample_values))
        with _LOCK:
            _CACHE[key] = hit
    return hit
