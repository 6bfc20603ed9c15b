"""One check of a SQLite database file before its tasks are used: `database_problem(path)`.

What is checked, in order (the first failure is the answer): the path exists and is a regular file
(not a directory); it is readable and not empty; its first 100 bytes are a SQLite header (the magic
`SQLite format 3\\0`, a page size that is a power of two from 512 to 65536); the file is as long as
the header's page count times the page size (when the header's count is valid, else a whole number
of pages); no non-empty hot rollback journal (`-journal` with a journal header) or write-ahead log
(`-wal` with a WAL header) lies next to it (the sandbox opens files `immutable=1`, so it would read
the main file without them); SQLite opens it read-only and immutable, `PRAGMA quick_check(5)` says
`ok` (every page of every table and index is read and its b-tree structure checked: measured about
0.4 s for a 200 MB file with a warm page cache, 1.2-1.4 times the sha256 of the same file that the
fingerprint reads, `bench/dbcheck_speed.py`; 1.0-1.7 s, 1.6-2.0 times, for a 613 MB file of 5.5M rows,
`bench/bench_big_db.py`); it has at least one table.

The result is remembered per process per (real path, device, inode, size, mtime_ns) and the sizes of
the `-journal` / `-wal` files, so each database is checked once per process however many tasks use
it; the first time a problem is found it is logged as a warning naming the file.

What is not checked: that the data are the intended data (the fingerprint's sha256 covers that), and
what `quick_check` skips (UNIQUE / NOT NULL / CHECK constraints and that indexes match their tables).
Tasks of a damaged database are excluded under `DAMAGED_REASON` (`sqlrl.tasks.goldcache.audit_golds`).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import threading
import urllib.parse

log = logging.getLogger(__name__)

__all__ = ["DAMAGED_REASON", "database_problem"]

DAMAGED_REASON = "database_damaged"
_MAGIC = b"SQLite format 3\x00"
_JOURNAL_MAGIC = bytes.fromhex("d9d505f920a163d7")
_WAL_MAGICS = (bytes.fromhex("377f0682"), bytes.fromhex("377f0683"))
_CACHE: dict[tuple, str | None] = {}
_LOCK = threading.Lock()


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def _head(path: str, n: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


def _leftover(path: str) -> str | None:
    journal, wal = path + "-journal", path + "-wal"
    if _size(journal) > 0 and _head(journal, 8) == _JOURNAL_MAGIC:
        return (
            f"a leftover rollback journal {journal} ({_size(journal)} bytes) says a write was interrupted, "
            "so the file may be half-written; re-download the database, or open it once writable with "
            f"`sqlite3 {path} 'PRAGMA quick_check'` to roll the journal back"
        )
    if _size(wal) >= 32 and _head(wal, 4) in _WAL_MAGICS:
        return (
            f"a leftover write-ahead log {wal} ({_size(wal)} bytes) holds changes the read-only sandbox "
            f"would not see; fold them in with `sqlite3 {path} 'PRAGMA wal_checkpoint(TRUNCATE)'`, or "
            "delete the -wal file if the .sqlite file alone is the intended copy"
        )
    return None


def _header_problem(head: bytes, size: int) -> str | None:
    if head[:16] != _MAGIC[: len(head)]:
        return f"not a SQLite database (it starts with {head[:16]!r}, not {_MAGIC!r})"
    if len(head) < 100:
        return f"truncated: {size} bytes, shorter than the 100-byte SQLite header"
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    if page < 512 or page > 65536 or page & (page - 1):
        return f"damaged SQLite header (page size {page} is not a power of two from 512 to 65536)"
    pages = int.from_bytes(head[28:32], "big")
    if pages > 0 and head[92:96] == head[24:28]:  # the header's page count is valid
        if size < pages * page:
            return (
                f"truncated: {size} bytes, but its header says {pages} pages of {page} bytes "
                f"({pages * page} bytes)"
            )
    elif size % page:
        return f"truncated: {size} bytes is not a whole number of {page}-byte pages"
    return None


def _sqlite_problem(path: str) -> str | None:
    uri = "file:" + urllib.parse.quote(os.fsencode(path)) + "?mode=ro&immutable=1"
    try:
        con = sqlite3.connect(uri, uri=True, isolation_level=None)
    except sqlite3.Error as e:
        return f"SQLite cannot open it ({e}); restore the file from its source"
    try:
        rows = [r[0] for r in con.execute("PRAGMA quick_check(5)").fetchall()]
        if rows != ["ok"]:
            return "fails PRAGMA quick_check (" + "; ".join(str(r) for r in rows) + "); restore the file"
        n = con.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]
        if n == 0:
            return "holds no tables (an empty SQLite database)"
    except sqlite3.Error as e:
        return f"SQLite cannot read it ({e}); restore the file from its source"
    finally:
        con.close()
    return None


def _check(path: str) -> str | None:
    """The problem of the file at `path` (already resolved), or None; uncached."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "missing: no file at this path"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if stat.S_ISDIR(st.st_mode):
        return "is a directory, not a SQLite file"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_size == 0:
        return "empty file (0 bytes)"
    try:
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError as e:
        return f"cannot be read ({e.strerror or e}); check the file's permissions"
    return _header_problem(head, st.st_size) or _leftover(path) or _sqlite_problem(path)


def _stamp(real: str) -> tuple:
    try:
        st = os.stat(real)
        main: tuple = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
    except OSError as e:
        main = ("error", type(e).__name__)
    return (real, main, _size(real + "-journal"), _size(real + "-wal"))


def database_problem(path: str | os.PathLike) -> str | None:
    """None when the database at `path` passes the checks in this module's docstring, else a one-line
    description of the problem and how to fix it. Checked once per process per file state."""
    real = os.path.realpath(path)
    key = _stamp(real)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    problem = _check(real)
    with _LOCK:
        first = key not in _CACHE
        _CACHE[key] = problem
    if problem is not None and first:
        log.warning(
            f"sqlrl: warning: database {real} is damaged: {problem}; its tasks are excluded as {DAMAGED_REASON}"
        )
    return problem
