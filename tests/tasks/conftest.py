"""Fixtures of the debugging-task tests: a tiny real SQLite database."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest


@pytest.fixture()
def tiny_db(tmp_path: Path) -> str:
    """t(a INTEGER, b REAL) with rows (1, 1.5), (2, 2.0), (3, 4.0)."""
    p = tmp_path / "tiny.sqlite"
    con = sqlite3.connect(p)
    con.executescript(
        "CREATE TABLE t (a INTEGER, b REAL); INSERT INTO t VALUES (1, 1.5), (2, 2.0), (3, 4.0);"
    )
    con.commit()
    con.close()
    return str(p)
