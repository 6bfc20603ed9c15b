"""Running one statement on a hardened SQLite connection inside a worker (sandbox and replica pool).

Covered:
- `set_limits`: `Connection.setlimit` LENGTH (`value_limit`: `max_value_bytes`, at most the byte
  cap), SQL_LENGTH, ATTACHED=0, EXPR_DEPTH, COMPOUND_SELECT, FUNCTION_ARG, LIKE_PATTERN_LENGTH,
  VARIABLE_NUMBER, TRIGGER_DEPTH, WORKER_THREADS=0, and a progress handler every `progress_ops` VM instructions that stops the
  statement at its soft deadline -> `timeout`.
- `run_one` (sandbox): a cached connection per file (LRU, keyed by path, inode, size and mtime),
  opened `file:PATH?mode=ro&immutable=1` with `query_only=1`, `trusted_schema=0`,
  `temp_store=MEMORY` set before `read_only_authorizer` is installed.
- `seconds`: every time limit is a finite number of seconds > 0 (NaN or infinity is a ValueError);
  `time_limits`: a pool's statement and hard limits.
- `fetch_result` / `fetch_rows`: growing `fetchmany` chunks of at most `chunk_rows` rows (with every
  value at the length limit, one chunk holds at most `FETCH_VALUE_BYTES`: a result of a few huge rows
  is measured against the byte cap long before the worker's memory limit); more than `max_rows` rows ->
  `too_many_rows` (the first `max_rows` kept), more than `max_result_bytes` (marshalled size of the
  column names plus the rows) -> `too_large` (rows that fitted kept; no columns when the names alone
  exceed it). SQLITE_TOOBIG and memory exhaustion also give `too_large`.
- Text that is not valid UTF-8 is decoded with `bytes.decode("utf-8", "replace")`: a statement is run
  with the C fast path first and re-run with the replacing decoder only when that fails.
Not covered: calls that never return to the VM (one huge function call) ignore the soft deadline;
the parent's watchdog (`sqlrl.sql.workers`) handles those. `immutable=1` trusts the file not to
change while open: a file rewritten in place with the same size and mtime can give stale reads.
"""

from __future__ import annotations

import marshal
import math
import os
import sqlite3
import time
import urllib.parse
from collections import OrderedDict

from sqlrl.sql.guard import read_only_authorizer
from sqlrl.sql.result import MAX_VALUE_BYTES


def _decode_replace(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def seconds(value: object, what: str) -> float:
    """`value` as a time limit: a finite number of seconds above 0, else ValueError naming `what`
    (NaN and infinity would switch the soft deadline and the watchdog off)."""
    try:
        t = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        t = math.nan
    if isinstance(value, bool) or not (math.isfinite(t) and t > 0):
        raise ValueError(f"{what} must be a finite number of seconds > 0, got {value!r}; pass e.g. 5")
    return t


def time_limits(timeout_s: object, hard_timeout_s: object, who: str) -> tuple[float, float]:
    """(statement limit, hard kill limit) of a worker pool: both finite seconds > 0 (`seconds`), the hard
    one by default 2 x the statement limit + 1 s, never below it (ValueError naming `who`)."""
    t = seconds(timeout_s, f"{who}: timeout_s")
    hard = seconds(hard_timeout_s, f"{who}: hard_timeout_s") if hard_timeout_s else 2.0 * t + 1.0
    if hard < t:
        raise ValueError("hard_timeout_s must be >= timeout_s")
    return t, hard


class Deadline:
    """The wall-clock deadline (time.monotonic) of the statement a connection is running."""

    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t = 0.0


def value_limit(cfg: dict) -> int:
    """SQLITE_LIMIT_LENGTH of a policy connection: `max_value_bytes`, never above `max_result_bytes` (a
    longer value could never be returned, so SQLite refuses to build it), at least 1."""
    return max(1, min(int(cfg["max_value_bytes"]), int(cfg["max_result_bytes"])))


def set_limits(conn: sqlite3.Connection, cfg: dict, deadline: Deadline, *, trigger_depth: int) -> None:
    """`setlimit`s and the progress-handler deadline of a policy connection (sandbox and replica pool)."""
    limits = {
        sqlite3.SQLITE_LIMIT_LENGTH: value_limit(cfg),
        sqlite3.SQLITE_LIMIT_SQL_LENGTH: max(1000, cfg["max_sql_chars"] * 4),
        sqlite3.SQLITE_LIMIT_ATTACHED: 0,
        sqlite3.SQLITE_LIMIT_EXPR_DEPTH: 1000,
        sqlite3.SQLITE_LIMIT_COMPOUND_SELECT: 200,
        sqlite3.SQLITE_LIMIT_FUNCTION_ARG: 100,
        sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH: 10_000,
        sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER: 100,
        sqlite3.SQLITE_LIMIT_TRIGGER_DEPTH: trigger_depth,
        sqlite3.SQLITE_LIMIT_WORKER_THREADS: 0,
    }
    for k, v in limits.items():
        conn.setlimit(k, int(v))

    def progress() -> bool:
        return time.monotonic() > deadline.t

    if cfg["progress_ops"] > 0:
        conn.set_progress_handler(progress, int(cfg["progress_ops"]))


def run_statement(
    conn: sqlite3.Connection, sql: str, cfg: dict, deadline: Deadline
) -> tuple[str, list, list, str]:
    """Execute one statement and fetch under the caps -> (status, columns, rows, message). Invalid UTF-8
    text re-runs the statement with the deterministic replacing decoder (same deadline). SQLite errors
    propagate to the caller, which classifies them."""
    cur = None
    try:
        try:
            cur = conn.execute(sql)
            status, cols, rows, msg = fetch_result(cur, cfg, deadline)
        except sqlite3.OperationalError as e:
            if not str(e).startswith("Could not decode to UTF-8"):
                raise
            if cur is not None:
                cur.close()
            conn.text_factory = _decode_replace
            try:
                cur = conn.execute(sql)
                status, cols, rows, msg = fetch_result(cur, cfg, deadline)
            finally:
                conn.text_factory = str
        return status, cols, rows, msg
    finally:
        if cur is not None:
            try:
                cur.close()
            except Exception:  # noqa: BLE001
                pass


def _open_read_only(path: str, cfg: dict, deadline: Deadline) -> sqlite3.Connection:
    uri = "file:" + urllib.parse.quote(os.fsencode(path)) + "?mode=ro&immutable=1"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    try:
        # settings first: once the authorizer is installed no PRAGMA like these can run
        for pragma in ("query_only=1", "trusted_schema=0", "temp_store=MEMORY"):
            conn.execute("PRAGMA " + pragma).fetchall()
        set_limits(conn, cfg, deadline, trigger_depth=1)
        conn.set_authorizer(read_only_authorizer)
    except BaseException:
        conn.close()
        raise
    return conn


MAX_MESSAGE_CHARS = 1000


def classify_error(e: BaseException, timeout_s: float) -> tuple[str, str]:
    """(status, message) of a failed statement; the message is cut at `MAX_MESSAGE_CHARS` characters
    (SQLite quotes the offending token, which can be as long as the SQL text)."""
    status, msg = _classify(e, timeout_s)
    if len(msg) > MAX_MESSAGE_CHARS:
        msg = msg[: MAX_MESSAGE_CHARS - 30] + f"... ({len(msg)} characters in all)"
    return status, msg


def _classify(e: BaseException, timeout_s: float) -> tuple[str, str]:
    if isinstance(e, MemoryError):
        return "too_large", "memory limit exceeded"
    msg = str(e)
    name = getattr(e, "sqlite_errorname", None) or ""
    if name == "SQLITE_INTERRUPT" or msg == "interrupted":
        return "timeout", f"statement exceeded the time limit of {timeout_s:g} s"
    if name == "SQLITE_AUTH" or msg.startswith(("not authorized", "authorization denied")):
        return "forbidden", f"{msg} (read-only sandbox: only SELECT statements are allowed)"
    if msg.startswith("vtable constructor failed"):
        # a virtual table (json_each, json_tree, ...) whose schema declaration the authorizer denied
        return "forbidden", f"{msg} (virtual tables such as json_each / json_tree are not allowed)"
    if name.startswith("SQLITE_READONLY") or "readonly database" in msg:
        return "forbidden", msg
    if name == "SQLITE_TOOBIG" or msg in ("string or blob too big", "statement too long"):
        return "too_large", msg
    if name == "SQLITE_NOMEM" or msg == "out of memory":
        return "too_large", "memory limit exceeded"
    if isinstance(e, sqlite3.ProgrammingError | sqlite3.Warning) and "one statement at a time" in msg:
        return "multiple_statements", msg
    if msg.endswith("syntax error") or msg.startswith("unrecognized token") or msg == "incomplete input":
        return "syntax_error", msg
    return "runtime_error", (msg or type(e).__name__)[:1000]


def fetch_result(cur: sqlite3.Cursor, cfg: dict, deadline: Deadline) -> tuple[str, list, list, str]:
    """(status, columns, rows, message) under the caps: the column names count toward
    `max_result_bytes` with the rows; names alone over it -> `too_large` with no columns and no rows."""
    cols = [d[0] for d in cur.description] if cur.description else []
    head = len(marshal.dumps(cols))
    max_bytes = cfg["max_result_bytes"]
    if head > max_bytes:
        msg = f"result larger than {max_bytes} bytes: the column names alone take {head}; 0 rows kept"
        return "too_large", [], [], msg
    chunk = chunk_rows(len(cols), value_limit(cfg))
    status, rows, msg = fetch_rows(cur, cfg, deadline, used=head, max_chunk=chunk)
    return status, cols, rows, msg


# the string/blob bytes one `fetchmany` may bring into a worker when every value is as long as SQLite
# lets it be (`value_limit`): a result of a few huge rows is measured against the byte cap after at most
# this much, never after a chunk that fills the worker's memory limit
FETCH_VALUE_BYTES = 256 * 2**20
_MAX_CHUNK = 16384


def chunk_rows(n_cols: int, value_bytes: int) -> int:
    """Rows per `fetchmany` of a result with `n_cols` columns whose values are at most `value_bytes`
    long: at most `FETCH_VALUE_BYTES` of values in all, at least 1 row, at most `_MAX_CHUNK`."""
    worst_row = max(1, n_cols) * max(1, int(value_bytes))
    return max(1, min(_MAX_CHUNK, FETCH_VALUE_BYTES // worst_row))


def fetch_rows(
    cur: sqlite3.Cursor, cfg: dict, deadline: Deadline, used: int = 0, max_chunk: int = _MAX_CHUNK
) -> tuple[str, list, str]:
    """All rows up to the caps, fetched `max_chunk` rows at most at a time. Result size = `used` (the
    column names' bytes) + bytes of the rows serialised with `marshal` (what is sent)."""
    max_rows = cfg["max_rows"]
    max_bytes = cfg["max_result_bytes"]
    rows: list[tuple] = []
    nbytes = used
    chunk = min(64, max_chunk)
    dumps = marshal.dumps
    while True:
        want = min(chunk, max_rows + 1 - len(rows))
        part = cur.fetchmany(want)
        if not part:
            return "ok", rows, ""
        size = len(dumps(part))
        if len(part) < want and nbytes + size <= max_bytes and len(rows) + len(part) <= max_rows:
            # fewer rows than asked for: the cursor is exhausted (the next fetchmany would return
            # nothing), and this last part is within both caps
            rows.extend(part)
            if time.monotonic() > deadline.t:
                raise sqlite3.OperationalError("interrupted")
            return "ok", rows, ""
        if nbytes + size > max_bytes or len(rows) + len(part) > max_rows:
            for row in part:  # slow path near a cap: row by row
                nbytes += len(dumps(row))
                if nbytes > max_bytes:
                    return "too_large", rows, f"result larger than {max_bytes} bytes; {len(rows)} rows kept"
                if len(rows) >= max_rows:
                    return "too_many_rows", rows, f"more than {max_rows} rows; the first {max_rows} are kept"
                rows.append(row)
        else:
            nbytes += size
            rows.extend(part)
        if time.monotonic() > deadline.t:
            raise sqlite3.OperationalError("interrupted")
        # grow the chunk, but never fetch (much) more than the byte budget left
        per_row = max(1, size // len(part))
        chunk = max(1, min(chunk * 4, max_chunk, (max_bytes - nbytes) // per_row + 1))


class _ListCursor:
    """A cursor over rows already fetched (what `fits_caps` replays `fetch_rows` on)."""

    def __init__(self, rows: list) -> None:
        self.rows, self.at = rows, 0

    def fetchmany(self, n: int) -> list:
        part = self.rows[self.at : self.at + n]
        self.at += len(part)
        return part


def fits_caps(
    columns: list, rows: list, max_rows: int, max_result_bytes: int, max_value_bytes: int = MAX_VALUE_BYTES
) -> str:
    """The status ("ok", "too_many_rows" or "too_large") that `fetch_result` gives a statement returning
    exactly `columns` and `rows` under these caps: the same code measures (in the same chunks), so a
    result that fits here fits when a statement returns it (a gold cached under larger caps, checked
    against a prediction's)."""
    cols = list(columns or [])
    head = len(marshal.dumps(cols))
    if head > max_result_bytes:
        return "too_large"
    deadline = Deadline()
    deadline.t = float("inf")
    cfg = {
        "max_rows": int(max_rows),
        "max_result_bytes": int(max_result_bytes),
        "max_value_bytes": max_value_bytes,
    }
    listed = [tuple(r) for r in rows]
    n_cols = len(cols) if cols else (len(listed[0]) if listed else 0)
    chunk = chunk_rows(n_cols, value_limit(cfg))
    return fetch_rows(_ListCursor(listed), cfg, deadline, used=head, max_chunk=chunk)[0]


def run_one(
    conns: OrderedDict,
    cfg: dict,
    deadline: Deadline,
    db_path: str,
    sql: str,
    timeout_s: float,
    stats: dict | None = None,
):
    """`stats`: {db_path: cache key} of the files already stat'ed in this scoring batch (the file is
    then stat'ed once per batch, not once per statement); None: stat every time."""
    t0 = time.perf_counter()
    deadline.t = time.monotonic() + timeout_s
    try:
        key = stats.get(db_path) if stats is not None else None
        if key is None:
            st = os.stat(db_path)
            key = (db_path, st.st_ino, st.st_size, st.st_mtime_ns)
            if stats is not None:
                stats[db_path] = key
        conn = conns.get(db_path)
        if conn is not None and conn[0] == key:
            conns.move_to_end(db_path)
            conn = conn[1]
        else:
            if conn is not None:
                conns.pop(db_path)[1].close()
            conn = _open_read_only(db_path, cfg, deadline)
            conns[db_path] = (key, conn)
            while len(conns) > cfg["max_connections"]:
                conns.popitem(last=False)[1][1].close()
    except FileNotFoundError:
        return ("runtime_error", [], [], 0, 0.0, f"unable to open database file: {db_path}")
    except Exception as e:  # noqa: BLE001
        st_, msg = classify_error(e, timeout_s)
        return (st_, [], [], 0, (time.perf_counter() - t0) * 1e3, msg)
    try:
        status, cols, rows, msg = run_statement(conn, sql, cfg, deadline)
        return (status, cols, rows, len(rows), (time.perf_counter() - t0) * 1e3, msg)
    except Exception as e:  # noqa: BLE001  (MemoryError included)
        st_, msg = classify_error(e, timeout_s)
        return (st_, [], [], 0, (time.perf_counter() - t0) * 1e3, msg)
