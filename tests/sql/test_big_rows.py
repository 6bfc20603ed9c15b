"""Results made of a few very large rows stop at the byte cap, not at a worker's memory limit.

A chunk of 64 rows was fetched before its size was measured, so rows of two 4 MB values each put
512 MB of values (and as much again for their measure) in the worker before `too_large` could
trigger: under a 1 GiB memory limit the statement ended in a MemoryError ("memory limit exceeded").
Now a fetch holds at most `FETCH_VALUE_BYTES` of values even when every value is as long as SQLite
lets it be, and no value may be longer than the byte cap (`value_limit`).
"""

from __future__ import annotations

import sqlite3

import pytest

from sqlrl.sql.engine import FETCH_VALUE_BYTES, chunk_rows, fits_caps, value_limit
from sqlrl.sql.sandbox import Sandbox

MB4 = 4_000_000
TEXT = f"printf('%.*c', {MB4}, 'x')"
BLOB = f"zeroblob({MB4})"


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("big") / "d.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (x INTEGER)")
    con.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(100)])
    con.commit()
    con.close()
    return str(path)


@pytest.fixture(scope="module")
def small_sandbox():
    # 1 GiB of address space: the 64-row chunk of the old fetch (512 MB of values) did not fit
    with Sandbox(workers=1, timeout_s=30, memory_limit_bytes=2**30) as sb:
        yield sb


# (SQL, rows kept): each row holds 2 values of 4,000,000 bytes; the 8 MiB cap (8,388,608) holds one
# such row (8,000,000 bytes plus a few of marshal framing) and not two
HUGE_ROWS = [
    (f"SELECT {TEXT} AS a, {TEXT} AS b FROM t", 1),
    (f"SELECT {BLOB} AS a, {BLOB} AS b FROM t", 1),
    (f"SELECT {TEXT} AS a, {BLOB} AS b FROM t WHERE x >= 50", 1),
    # one value per row: two rows fit (8,000,0xx bytes), the third does not
    (f"SELECT {TEXT} FROM t", 2),
]


@pytest.mark.parametrize("sql,kept", HUGE_ROWS)
def test_few_huge_rows_stop_at_the_byte_cap(small_sandbox, db, sql, kept):
    r = small_sandbox.execute(db, sql)
    assert r.status == "too_large"
    assert r.message.startswith("result larger than 8388608 bytes"), r.message
    assert r.row_count == kept
    assert all(len(v) == MB4 for row in r.rows for v in row)
    assert small_sandbox.execute(db, "SELECT count(*) FROM t").rows == [(100,)]  # the worker goes on
    assert small_sandbox.crashes == 0 and small_sandbox.kills == 0


def test_no_value_longer_than_the_byte_cap(db):
    """SQLite refuses to build a value longer than the byte cap (it could never be returned)."""
    with Sandbox(workers=1, max_result_bytes=2**20, max_value_bytes=4 * 2**20) as sb:
        r = sb.execute(db, "SELECT zeroblob(2000000)")
        assert (r.status, r.message) == ("too_large", "string or blob too big")
        assert sb.execute(db, "SELECT length(zeroblob(1000000))").rows == [(1_000_000,)]


@pytest.mark.parametrize(
    "n_cols,value_bytes,want",
    [
        (1, 4 * 2**20, 64),  # 256 MiB / 4 MiB
        (3, 4 * 2**20, 21),  # 256 / 12 = 21.3
        (64, 4 * 2**20, 1),  # 256 / 256
        (100, 4 * 2**20, 1),  # one row is over the budget: still one row at a time
        (0, 4 * 2**20, 64),  # no column named: counted as one
        (2, 10, 16384),  # tiny values: the largest chunk
    ],
)
def test_chunk_rows(n_cols, value_bytes, want):
    assert FETCH_VALUE_BYTES == 256 * 2**20
    assert chunk_rows(n_cols, value_bytes) == want


def test_value_limit():
    assert value_limit({"max_value_bytes": 4 * 2**20, "max_result_bytes": 8 * 2**20}) == 4 * 2**20
    assert value_limit({"max_value_bytes": 4 * 2**20, "max_result_bytes": 2**20}) == 2**20
    assert value_limit({"max_value_bytes": 0, "max_result_bytes": 0}) == 1


def test_fits_caps_measures_in_the_sandbox_chunks(small_sandbox, db):
    """`fits_caps` gives the sandbox's verdict on the same result: one row of 4,000,000 bytes fits 8 MiB,
    two do not, and a cap of exactly the first row's measure keeps it."""
    one = small_sandbox.execute(db, f"SELECT {TEXT} AS a FROM t LIMIT 2")
    assert one.status == "ok" and one.row_count == 2
    rows = one.rows
    assert fits_caps(["a"], rows, 100, 8 * 2**20) == "ok"
    three = rows + [("y" * MB4,)]  # distinct objects, as a fetch gives them
    assert fits_caps(["a"], three, 100, 8 * 2**20) == "too_large"
    assert fits_caps(["a"], rows, 1, 8 * 2**20) == "too_many_rows"
