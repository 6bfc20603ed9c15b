"""Hardened, read-only execution of untrusted (model-written) SQL against SQLite files.

`Sandbox` runs each statement in one of a few persistent worker processes (multiprocessing, *spawn*
context). A worker caches one read-only connection per database file (LRU, keyed by path, inode,
size and mtime). The parent process watches every call with a hard wall-clock limit and kills and
respawns a worker that does not answer in time: the call returns `timeout`, a worker that died for
another reason gives `worker_crash`, and the next call works on a fresh worker.

Layers, outermost first (each one alone would stop the attacks it lists; they are stacked on purpose):

1. A tokenizer-aware pre-check (string literals, quoted identifiers and comments are understood; in
   the parent for `execute` / `execute_many`, in the worker with the same function and statuses for
   the statements of `execute_scored`): empty SQL -> `empty_sql`; more than one statement -> `multiple_statements` (trailing
   semicolons and comments are fine); a statement that starts with a writing or administrative
   keyword (INSERT, UPDATE, DELETE, REPLACE, CREATE, DROP, ALTER, ATTACH, DETACH, BEGIN, COMMIT, END,
   ROLLBACK, SAVEPOINT, RELEASE, VACUUM, REINDEX, ANALYZE) -> `forbidden`; `EXPLAIN` only in front of
   SELECT / WITH / VALUES; SQL longer than `max_sql_chars` -> `too_large`. Only the one statement
   (original text up to its semicolon) is executed.
2. The connection is opened with the URI `file:PATH?mode=ro&immutable=1` (SQLite itself refuses
   every write to the file and takes no locks), plus `PRAGMA query_only=1`, `trusted_schema=0`,
   `temp_store=MEMORY` (no temp files), all set *before* the authorizer is installed.
3. An authorizer ALLOWLIST: SQLITE_SELECT, SQLITE_READ, SQLITE_RECURSIVE, SQLITE_FUNCTION except
   a deny list (`load_extension`, `readfile`, `writefile`, `edit`, `fts3_tokenizer`, ...), and the
   read-only schema pragmas `table_info`, `table_xinfo`, `index_list`, `index_info`, `index_xinfo`,
   `foreign_key_list`. Everything else (writes, DDL incl. TEMP objects, ATTACH, transactions,
   other pragmas, virtual-table construction, hence table-valued functions such as `json_each` and
   `pragma_*()`) is denied -> `forbidden`. Reading `sqlite_master` is allowed.
4. `Connection.setlimit`: LENGTH (`max_value_bytes`), SQL_LENGTH, ATTACHED=0, EXPR_DEPTH,
   COMPOUND_SELECT, FUNCTION_ARG, LIKE_PATTERN_LENGTH, VARIABLE_NUMBER, TRIGGER_DEPTH,
   WORKER_THREADS=0. A process-wide `PRAGMA hard_heap_limit` / `soft_heap_limit` for SQLite's
   allocator and (Linux) `RLIMIT_AS` for the whole worker.
5. A progress handler every `progress_ops` VM instructions stops the statement at the soft
   deadline (`timeout_s`) -> `timeout`. Some calls never return to the VM (e.g.
   `SELECT printf('%.*c', 2000000000, 'x')` loops inside one function call); the parent's watchdog
   (`hard_timeout_s`) kills those workers -> `timeout`.
6. Results are fetched in growing `fetchmany` chunks: more than `max_rows` rows -> `too_many_rows`
   (the first `max_rows` rows are kept); more than `max_result_bytes` (text length in characters +
   blob length + 8 per value) -> `too_large` (rows that fitted are kept). SQLITE_TOOBIG and memory
   exhaustion also give `too_large`.

Text that is not valid UTF-8 is decoded deterministically with `bytes.decode("utf-8", "replace")`
(U+FFFD for each bad sequence). Statements are first run with the C fast path; only when that fails
to decode is the statement re-run with the replacing decoder (same result, same deadline).

`execute_scored` runs a scorer function inside the workers (one message each way per chunk of items,
up to two chunks in flight per worker, few chunks for a small call; the parent drives all workers
from the calling thread): the scorer gets a `run(sql)` that executes one
statement through layers 1-6 exactly as `execute` does, plus reference payloads (e.g. cached gold
results) that the parent ships to each worker once and the worker keeps. The watchdog applies per
statement; an item whose statement hung or whose worker died gets `timeout` / `worker_crash` (or, for
a later statement of the item, is run again with that statement answered by the failure), and the
chunk's other unfinished items are re-run on the fresh worker. `execute_many` and `execute_scored` deal a
call's items to chunks strided (`_deal`), so consecutive items (one task's samples) run on different
workers and a group of slow statements does not queue on one. Workers import the modules in `preload`
(default `sqlrl.reward.match`, standard library only at import) when they start.

Statuses: ok | empty_sql | syntax_error | forbidden | multiple_statements | timeout | too_many_rows |
too_large | runtime_error | worker_crash. `ok` is the only success; `worker_crash` is an
infrastructure failure, never a wrong answer.

Guaranteed: no statement run through the sandbox changes the database file or creates a file
(besides what SQLite needs in memory); a runaway statement costs at most `hard_timeout_s` of wall
time and never takes the caller down; results are deterministic for deterministic SQL.
Not guaranteed: `immutable=1` means SQLite assumes the file does not change while open; the worker
re-opens a file whose inode/size/mtime changed, but a file rewritten in place with the same
size and mtime could give stale or corrupt reads. `execute` / `execute_many` stat the file before
every statement; `execute_scored` stats each database file once per chunk of items (the first time
the chunk uses it), so a file replaced while a chunk runs is noticed only from the next chunk on. Non-deterministic SQL (`random()`, `'now'`) stays
non-deterministic. Memory limits are per worker process, not per call. The sandbox is no defence
against a malicious database *file* (the files are trusted; the SQL is not). `elapsed_ms` is the
worker's execution + fetch time (the parent's wall time for watchdog kills and pre-check results).
Workers are started with a bare `__main__` module in place (only during `Process.start()`), so the
caller's script is not re-imported in them and needs no `if __name__ == "__main__"` guard; another
thread looking up `sys.modules["__main__"]` during those few milliseconds would see the bare module.
Defaults: timeout_s=5, hard_timeout_s=2*timeout_s+1, max_rows=100_000, max_result_bytes=8 MiB,
max_value_bytes=4 MiB, max_sql_chars=1_000_000, heap limit 512 MiB, RLIMIT_AS 2 GiB,
256 cached connections per worker, progress check every 10_000 VM instructions.
"""

from __future__ import annotations

import atexit
import importlib
import marshal
import math
import multiprocessing
import multiprocessing.connection
import os
import queue
import re
import sqlite3
import sys
import threading
import time
import types
import urllib.parse
import weakref
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

STATUSES = (
    "ok",
    "empty_sql",
    "syntax_error",
    "forbidden",
    "multiple_statements",
    "timeout",
    "too_many_rows",
    "too_large",
    "runtime_error",
    "worker_crash",
)

# --------------------------------------------------------------------------------------------------
# Result


def _json_value(v: Any) -> Any:
    if isinstance(v, bytes | bytearray | memoryview):
        return {"$blob_hex": bytes(v).hex()}
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    return v


def _from_json_value(v: Any) -> Any:
    if isinstance(v, dict) and "$blob_hex" in v:
        return bytes.fromhex(v["$blob_hex"])
    return v


def _cell(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, str):
        return v.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    if isinstance(v, bytes):
        h = v[:32].hex()
        return f"x'{h}'" + ("..." if len(v) > 32 else "")
    if isinstance(v, float):
        return repr(v)
    return str(v)


@dataclass(frozen=True)
class SQLResult:
    status: str  # one of STATUSES
    columns: list[str] = field(default_factory=list)
    rows: list[tuple] = field(default_factory=list)  # rows kept (up to the caps)
    row_count: int = 0  # == len(rows)
    elapsed_ms: float = 0.0
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict:
        """JSON-safe dict: blobs become {"$blob_hex": "..."}; inf/nan become "Infinity"/"-Infinity"/"NaN"."""
        return {
            "status": self.status,
            "columns": list(self.columns),
            "rows": [[_json_value(v) for v in r] for r in self.rows],
            "row_count": self.row_count,
            "elapsed_ms": round(self.elapsed_ms, 3) if math.isfinite(self.elapsed_ms) else 0.0,
            "message": self.message,
        }

    @classmethod
    def from_dict(cls, d: dict) -> SQLResult:
        return cls(
            status=d["status"],
            columns=list(d.get("columns", [])),
            rows=[tuple(_from_json_value(v) for v in r) for r in d.get("rows", [])],
            row_count=int(d.get("row_count", 0)),
            elapsed_ms=float(d.get("elapsed_ms", 0.0)),
            message=str(d.get("message", "")),
        )

    def render(self, max_rows: int = 10, max_chars: int = 2000) -> str:
        """Deterministic text for the policy (no timings): status line, header, capped rows, message."""
        n = self.row_count
        plural = "row" if n == 1 else "rows"
        if self.status == "ok":
            lines = [f"status: ok ({n} {plural})"]
        elif self.status in ("too_many_rows", "too_large"):
            lines = [f"status: {self.status} (result cut after {n} {plural})"]
        else:
            lines = [f"status: {self.status}"]
        if self.columns:
            lines.append(" | ".join(_cell(c) for c in self.columns))
            shown = self.rows[: max(0, max_rows)]
            lines.extend(" | ".join(_cell(v) for v in r) for r in shown)
            if n > len(shown):
                lines.append(f"... {n - len(shown)} more rows")
        if self.message:
            lines.append(("error: " if self.status != "ok" else "note: ") + self.message)
        text = "\n".join(lines)
        if len(text) > max_chars:
            tail = "\n... (output truncated)"
            text = text[: max(0, max_chars - len(tail))] + tail
        return text


def _result(status: str, message: str = "", elapsed_ms: float = 0.0) -> SQLResult:
    return SQLResult(status, [], [], 0, elapsed_ms, message)


# --------------------------------------------------------------------------------------------------
# Parent-side pre-check (tokenizer aware)

# strings / quoted identifiers (unterminated ones run to the end), comments, ';', plain runs
_LEX = re.compile(
    r"""'(?:[^']|'')*'?|"(?:[^"]|"")*"?|`(?:[^`]|``)*`?|\[[^\]]*\]?|--[^\n]*|/\*(?:.*?\*/|.*)|;|[^'"`\[;/-]+|[-/]""",
    re.S,
)
_WORD = re.compile(r"\s*([A-Za-z_]+)")
_FORBIDDEN_START = frozenset(
    "INSERT UPDATE DELETE REPLACE CREATE DROP ALTER ATTACH DETACH BEGIN COMMIT END ROLLBACK "
    "SAVEPOINT RELEASE VACUUM REINDEX ANALYZE".split()
)
_READ_START = frozenset(("SELECT", "WITH", "VALUES"))


def _scan(sql: str) -> list[tuple[int, int, str]]:
    """(start, end, text with comments blanked) of each non-empty statement of `sql`."""
    out: list[tuple[int, int, str]] = []
    cur: list[str] = []
    start = 0
    for m in _LEX.finditer(sql):
        tok = m.group()
        c = tok[0]
        if c == ";":
            s = "".join(cur).strip()
            if s:
                out.append((start, m.start(), s))
            cur = []
            start = m.end()
        elif (c == "-" and tok.startswith("--")) or (c == "/" and tok.startswith("/*")):
            cur.append(" ")
        else:
            cur.append(tok)
    s = "".join(cur).strip()
    if s:
        out.append((start, len(sql), s))
    return out


def split_statements(sql: str) -> list[str]:
    """Non-empty statements of `sql` (comments blanked out, string literals and identifiers intact)."""
    return [s for _, _, s in _scan(sql)]


def _precheck_fast_ok(sql: str) -> bool:
    """True when `_scan` is not needed (tests turn this off to compare)."""
    return ";" not in sql and "--" not in sql and "/*" not in sql


def _precheck(
    sql: str,
    max_sql_chars: int,
    forbidden_start: frozenset = _FORBIDDEN_START,
    context: str = "(read-only sandbox)",
) -> SQLResult | str:
    """A result for SQL that must not reach a worker, or the single statement to run (the original
    text up to its terminating semicolon: trailing semicolons and comments are dropped). The replica
    pool (pool.py) uses the same check with its own, shorter `forbidden_start` set."""
    if not isinstance(sql, str):
        return _result("runtime_error", f"SQL must be a string, not {type(sql).__name__}")
    if len(sql) > max_sql_chars:
        return _result("too_large", f"SQL text longer than {max_sql_chars} characters")
    if _precheck_fast_ok(sql):
        # the common case, same answer as `_scan`: without a semicolon there is at most one
        # statement, and without comment openers (even inside a quoted span) nothing is blanked, so
        # its text is the stripped SQL and it runs to the end of the text
        text = sql.strip()
        stmts = [(0, len(sql), text)] if text else []
    else:
        stmts = _scan(sql)
    if not stmts:
        return _result("empty_sql", "no SQL statement")
    if len(stmts) > 1:
        return _result("multiple_statements", f"exactly one statement is allowed, got {len(stmts)}")
    start, end, text = stmts[0]
    m = _WORD.match(text)
    if m:
        word = m.group(1).upper()
        if word == "EXPLAIN":
            rest = text[m.end() :]
            m2 = re.match(r"\s*QUERY\s+PLAN\b", rest, re.I)
            if m2:
                rest = rest[m2.end() :]
            m3 = _WORD.match(rest)
            if not m3 or m3.group(1).upper() not in _READ_START:
                return _result("forbidden", "EXPLAIN is allowed only for SELECT / WITH / VALUES")
        elif word in forbidden_start:
            return _result("forbidden", f"{word} statements are not allowed {context}")
    return sql[start:end]


def precheck(sql: str, max_sql_chars: int = 1_000_000) -> SQLResult | None:
    """A result for SQL that must not reach a worker, or None. Cheap; runs in the caller's process."""
    r = _precheck(sql, max_sql_chars)
    return r if isinstance(r, SQLResult) else None


# --------------------------------------------------------------------------------------------------
# Worker side

_DENY_FUNCTIONS = frozenset(
    (
        "load_extension",
        "readfile",
        "writefile",
        "edit",
        "fts3_tokenizer",
        "fts5",
        "fts5_source_id",
        "sqlar_compress",
        "sqlar_uncompress",
        "zipfile",
        "zipfile_cds",
        "eval",
        "sqlite_dbpage",
        "sqlite_dbdata",
        "sqlite_dbptr",
        "shell_add_schema",
        "shell_escape_crnl",
        "shell_int32",
        "shell_idquote",
        "shell_module_schema",
        "shell_putsnl",
        "lsmode",
        "lsdir",
        "fsdir",
        "sha3_query",
        "sqlite_rename_column",
        "sqlite_rename_table",
        "sqlite_rename_test",
        "sqlite_drop_column",
        "sqlite_rename_quotefix",
    )
)
_ALLOWED_PRAGMAS = frozenset(
    ("table_info", "table_xinfo", "index_list", "index_info", "index_xinfo", "foreign_key_list")
)
_OK = sqlite3.SQLITE_OK
_DENY = sqlite3.SQLITE_DENY
_A_SELECT = sqlite3.SQLITE_SELECT
_A_READ = sqlite3.SQLITE_READ
_A_FUNCTION = sqlite3.SQLITE_FUNCTION
_A_RECURSIVE = sqlite3.SQLITE_RECURSIVE
_A_PRAGMA = sqlite3.SQLITE_PRAGMA


def _authorizer(action: int, arg1: Any, arg2: Any, dbname: Any, source: Any) -> int:
    if action == _A_READ or action == _A_SELECT or action == _A_RECURSIVE:
        return _OK
    if action == _A_FUNCTION:
        return _DENY if (arg2 or "").lower() in _DENY_FUNCTIONS else _OK
    if action == _A_PRAGMA:
        return _OK if (arg1 or "").lower() in _ALLOWED_PRAGMAS else _DENY
    return _DENY


def _decode_replace(b: bytes) -> str:
    return b.decode("utf-8", "replace")


class _Deadline:
    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t = 0.0


def _setup_process(cfg: dict) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    mem = cfg.get("memory_limit_bytes")
    if mem:
        try:
            import resource

            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            want = int(mem) if hard == resource.RLIM_INFINITY else min(int(mem), hard)
            resource.setrlimit(resource.RLIMIT_AS, (want, hard))
        except (ImportError, ValueError, OSError):
            pass
    heap = cfg.get("heap_limit_bytes")
    if heap:
        c = sqlite3.connect(":memory:")
        try:
            c.execute(f"PRAGMA hard_heap_limit={int(heap)}").fetchall()
            c.execute(f"PRAGMA soft_heap_limit={int(heap) // 2}").fetchall()
        finally:
            c.close()


def _limit(conn: sqlite3.Connection, cfg: dict, deadline: _Deadline, *, trigger_depth: int) -> None:
    """`setlimit`s and the progress-handler deadline of a policy connection (sandbox and replica pool)."""
    limits = {
        sqlite3.SQLITE_LIMIT_LENGTH: cfg["max_value_bytes"],
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


def _run(conn: sqlite3.Connection, sql: str, cfg: dict, deadline: _Deadline) -> tuple[str, list, list, str]:
    """Execute one statement and fetch under the caps -> (status, columns, rows, message). Invalid UTF-8
    text re-runs the statement with the deterministic replacing decoder (same deadline). SQLite errors
    propagate to the caller, which classifies them."""
    cur = None
    try:
        try:
            cur = conn.execute(sql)
            cols = [d[0] for d in cur.description] if cur.description else []
            status, rows, msg = _fetch(cur, cfg, deadline)
        except sqlite3.OperationalError as e:
            if not str(e).startswith("Could not decode to UTF-8"):
                raise
            if cur is not None:
                cur.close()
            conn.text_factory = _decode_replace
            try:
                cur = conn.execute(sql)
                cols = [d[0] for d in cur.description] if cur.description else []
                status, rows, msg = _fetch(cur, cfg, deadline)
            finally:
                conn.text_factory = str
        return status, cols, rows, msg
    finally:
        if cur is not None:
            try:
                cur.close()
            except Exception:  # noqa: BLE001
                pass


def _open(path: str, cfg: dict, deadline: _Deadline) -> sqlite3.Connection:
    uri = "file:" + urllib.parse.quote(path) + "?mode=ro&immutable=1"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    try:
        # settings first: once the authorizer is installed no PRAGMA like these can run
        for pragma in ("query_only=1", "trusted_schema=0", "temp_store=MEMORY"):
            conn.execute("PRAGMA " + pragma).fetchall()
        _limit(conn, cfg, deadline, trigger_depth=1)
        conn.set_authorizer(_authorizer)
    except BaseException:
        conn.close()
        raise
    return conn


def _classify(e: BaseException, timeout_s: float) -> tuple[str, str]:
    if isinstance(e, MemoryError):
        return "too_large", "memory limit exceeded"
    msg = str(e)
    name = getattr(e, "sqlite_errorname", None) or ""
    if name == "SQLITE_INTERRUPT" or msg == "interrupted":
        return "timeout", f"statement exceeded the time limit of {timeout_s:g} s"
    if name == "SQLITE_AUTH" or msg.startswith(("not authorized", "authorization denied")):
        return "forbidden", f"{msg} (read-only sandbox: only SELECT statements are allowed)"
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


def _fetch(cur: sqlite3.Cursor, cfg: dict, deadline: _Deadline) -> tuple[str, list, str]:
    """All rows up to the caps. Result size = bytes of the rows serialised with `marshal` (what is sent)."""
    max_rows = cfg["max_rows"]
    max_bytes = cfg["max_result_bytes"]
    rows: list[tuple] = []
    nbytes = 0
    chunk = 64
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
        chunk = max(1, min(chunk * 4, 16384, (max_bytes - nbytes) // per_row + 1))


def _run_one(
    conns: OrderedDict,
    cfg: dict,
    deadline: _Deadline,
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
            conn = _open(db_path, cfg, deadline)
            conns[db_path] = (key, conn)
            while len(conns) > cfg["max_connections"]:
                conns.popitem(last=False)[1][1].close()
    except FileNotFoundError:
        return ("runtime_error", [], [], 0, 0.0, f"unable to open database file: {db_path}")
    except Exception as e:  # noqa: BLE001
        st_, msg = _classify(e, timeout_s)
        return (st_, [], [], 0, (time.perf_counter() - t0) * 1e3, msg)
    try:
        status, cols, rows, msg = _run(conn, sql, cfg, deadline)
        return (status, cols, rows, len(rows), (time.perf_counter() - t0) * 1e3, msg)
    except Exception as e:  # noqa: BLE001  (MemoryError included)
        st_, msg = _classify(e, timeout_s)
        return (st_, [], [], 0, (time.perf_counter() - t0) * 1e3, msg)


_FLUSH_S = 0.02  # a worker sends buffered results at least this often (and at the end of a batch)
_STARTING, _IDLE = -2.0, -1.0  # progress[1] while the worker starts up / before it takes a batch
_SCORE_CHUNKS_PER_WORKER = 4  # execute_scored: chunks per worker (load balance vs round trips)
_SCORE_DEPTH = 2  # execute_scored: chunks in flight per worker (the next one waits in its pipe)
_SCORE_MIN_CHUNK = 16  # execute_scored: fewer chunks per worker rather than chunks smaller than this
# execute_scored: a chunk is queued behind a running one only while everything in flight on that worker
# is at most this many bytes (and a quarter of the pipe's OS send buffer), so the send cannot block
# the parent's thread, and with it the watchdog, until the worker reads; otherwise it waits until the
# worker is idle
_SCORE_TOPUP_BYTES = 32 * 1024


def _worker_main(conn: Any, cfg: dict, progress: Any) -> None:
    """Worker loop: receive a marshalled batch [(db_path, sql, timeout_s), ...] and answer with
    marshalled lists of result tuples, in order; or a scoring batch (a tuple, see `_score_batch`).
    Before item k starts, `progress` (shared memory) gets [start time (time.monotonic), k, statement
    number within the item]: that is what the parent's watchdog reads."""
    _setup_process(cfg)
    conns: OrderedDict = OrderedDict()
    deadline = _Deadline()
    refs: dict = {}  # reference payloads of scoring batches (e.g. cached gold results), by key
    scorers: dict = {}
    for name in cfg.get("preload") or ():
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a scoring batch naming it reports the error per item
            pass
    progress[2] = 0.0
    progress[1] = _IDLE
    monotonic = time.monotonic
    while True:
        try:
            batch = marshal.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        if type(batch) is tuple:
            if not _score_batch(conn, cfg, conns, deadline, progress, refs, scorers, batch):
                return
            continue
        buf: list = []
        last = monotonic()
        n = len(batch)
        for k, (db_path, sql, timeout_s) in enumerate(batch):
            progress[0] = monotonic()  # start first, index second: the parent reads them the other way
            progress[1] = float(k)
            buf.append(_run_one(conns, cfg, deadline, db_path, sql, timeout_s))
            now = monotonic()
            if k == n - 1 or now - last >= _FLUSH_S:
                try:
                    data = marshal.dumps(buf)
                except (ValueError, MemoryError) as e:  # cannot happen for SQLite values; be safe
                    data = marshal.dumps(
                        [("runtime_error", [], [], 0, r[4], f"unserialisable: {e}") for r in buf]
                    )
                try:
                    conn.send_bytes(data)
                except (EOFError, OSError):
                    return
                buf = []
                last = now


def _scorer(scorers: dict, name: str) -> Any:
    fn = scorers.get(name)
    if fn is None:
        module, _, attr = name.partition(":")
        fn = scorers[name] = getattr(importlib.import_module(module), attr)
    return fn


def _score_batch(
    conn: Any,
    cfg: dict,
    conns: OrderedDict,
    deadline: _Deadline,
    progress: Any,
    refs: dict,
    scorers: dict,
    batch: tuple,
) -> bool:
    """One scoring batch ("score", scorer, options, dropped keys, added {key: payload}, items, base): for
    each item (db_path, sql, timeout_s, ref keys, extra, failed) call `scorer(run, sql, [payloads], extra,
    options)`, where `run(sql)` executes one statement exactly as `Sandbox.execute` does (pre-check,
    then the hardened connection) and returns the result tuple (status, columns, rows, row_count,
    elapsed_ms, message). Statement j of item k marks progress [now, base + k, j] (`base`: the item's
    position among the items the parent has in flight on this worker, which may have sent the next
    batch before this one is answered). `failed` is None or
    (j, status, message): statement j is not run and gets that result (the parent's watchdog killed
    the worker there before). Answers one marshalled list of the scorers' return values (an exception
    becomes ("__error__", text)). False when the pipe is gone."""
    _, name, options, drops, adds, items, base = batch
    for key in drops:
        refs.pop(key, None)
    refs.update(adds)
    monotonic = time.monotonic
    max_sql = cfg["max_sql_chars"]
    out: list = []
    stats: dict = {}  # each database file is stat'ed once per batch (see "Not guaranteed")
    for k, (db_path, sql, timeout_s, keys, extra, failed) in enumerate(items):
        progress[0] = monotonic()
        progress[2] = 0.0
        progress[1] = float(base + k)
        count = [0]

        def run(
            stmt: str,
            db_path: str = db_path,
            timeout_s: float = timeout_s,
            failed: Any = failed,
            count: list = count,
        ) -> tuple:
            j = count[0]
            count[0] = j + 1
            if j:
                progress[0] = monotonic()  # each statement has its own time limit
                progress[2] = float(j)
            if failed is not None and failed[0] == j:
                return (failed[1], [], [], 0, 0.0, failed[2])
            pre = _precheck(stmt, max_sql)
            if isinstance(pre, SQLResult):
                return (pre.status, [], [], 0, 0.0, pre.message)
            return _run_one(conns, cfg, deadline, db_path, pre, timeout_s, stats)

        try:
            out.append(_scorer(scorers, name)(run, sql, [refs[x] for x in keys], extra, options))
        except Exception as e:  # noqa: BLE001 (MemoryError included): reported, never a verdict
            out.append(("__error__", f"{type(e).__name__}: {e}"[:1000]))
    try:
        data = marshal.dumps(out)
    except (ValueError, MemoryError) as e:
        data = marshal.dumps([("__error__", f"unserialisable: {e}")] * len(out))
    try:
        conn.send_bytes(data)
    except (EOFError, OSError):
        return False
    return True


# --------------------------------------------------------------------------------------------------
# Parent side

_START_LOCK = threading.Lock()
_STARTUP_LIMIT_S = 120.0
_STRIDED_CHUNKS = True  # `_deal`: strided chunks; False: consecutive items (the code before 2026-12-01)


def _deal(todo: list, size: int) -> list[list]:
    """`todo` cut into ceil(len / size) chunks of at most `size` items each, strided: chunk c holds items
    c, c + n, c + 2n, ... (n chunks), so consecutive items (the samples of one task) land in different
    chunks and hence, with chunks handed to whichever worker is free, on different workers.
    `_STRIDED_CHUNKS = False` gives consecutive items instead (bench/bench_reward_stream.py compares)."""
    n = -(-len(todo) // size)
    if _STRIDED_CHUNKS:
        return [todo[k::n] for k in range(n)]
    return [todo[k : k + size] for k in range(0, len(todo), size)]


class _Worker:
    """One worker process, its pipe and its shared progress slot. Used by one thread at a time."""

    def __init__(self, ctx: Any, cfg: dict) -> None:
        self.ctx = ctx
        self.cfg = cfg
        self.progress = ctx.RawArray("d", 3)
        self.proc: Any = None
        self.conn: Any = None
        self.started_at = 0.0
        self.sndbuf = 0  # the OS send buffer of `conn` (bytes), see `_send_buffer`
        self.refs: OrderedDict = OrderedDict()  # reference payload key -> weight, held by the process
        self.ref_weight = 0
        self.start()

    def start(self) -> None:
        parent, child = self.ctx.Pipe(duplex=True)
        self.progress[0] = 0.0
        self.progress[1] = _STARTING
        self.progress[2] = 0.0
        self.refs = OrderedDict()  # a fresh process holds none
        self.ref_weight = 0
        proc = self.ctx.Process(
            target=_worker_main,
            args=(child, self.cfg, self.progress),
            daemon=True,
            name="sqlrl-sandbox-worker",
        )
        # `spawn` normally re-runs the caller's __main__ script in the child (slow if it imports torch,
        # and broken without an `if __name__ == "__main__"` guard). The worker needs nothing from it,
        # so the child is started while a bare __main__ is in place (only inside Process.start()).
        with _START_LOCK:
            main = sys.modules.get("__main__")
            sys.modules["__main__"] = types.ModuleType("__main__")
            try:
                proc.start()
            finally:
                if main is not None:
                    sys.modules["__main__"] = main
        child.close()
        self.proc, self.conn = proc, parent
        self.sndbuf = _send_buffer(parent)
        self.started_at = time.monotonic()

    def kill(self) -> None:
        proc, conn = self.proc, self.conn
        self.proc = self.conn = None
        if proc is not None:
            try:
                proc.kill()
                proc.join(5)
            except Exception:  # noqa: BLE001
                pass
            try:
                proc.close()
            except Exception:  # noqa: BLE001
                pass
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass

    def respawn(self) -> None:
        self.kill()
        self.start()

    def stop(self, grace_s: float = 1.0) -> None:
        """Graceful: close the pipe (the worker exits on EOF), then kill if still alive."""
        proc, conn = self.proc, self.conn
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass
        self.conn = None
        if proc is not None:
            try:
                proc.join(grace_s)
            except Exception:  # noqa: BLE001
                pass
        self.kill()

    def send(self, data: bytes) -> bool:
        try:
            if self.proc is None or not self.proc.is_alive():
                self.respawn()
            if self.progress[1] != _STARTING:
                self.progress[1] = _IDLE
            self.conn.send_bytes(data)
            return True
        except (OSError, EOFError, ValueError):
            return False


def _send_buffer(conn: Any) -> int:
    """Bytes the OS lets the parent's end of a worker's pipe (a socket pair) hold without a reader
    (SO_SNDBUF); 0 when unknown."""
    try:
        import socket

        s = socket.socket(fileno=os.dup(conn.fileno()))
        try:
            return int(s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))
        finally:
            s.close()
    except (OSError, ValueError, AttributeError):
        return 0


_LIVE: weakref.WeakSet = weakref.WeakSet()
_ABS: dict[str, str] = {}  # absolute path given -> os.path.abspath of it (independent of the cwd)


def _abspath(db_path: str | os.PathLike) -> str:
    p = os.fspath(db_path)
    hit = _ABS.get(p) if isinstance(p, str) else None
    if hit is not None:
        return hit
    out = os.path.abspath(p)
    if isinstance(p, str) and os.path.isabs(p) and len(_ABS) < 65536:
        _ABS[p] = out
    return out


@atexit.register
def _close_all() -> None:
    for sb in list(_LIVE):
        try:
            sb.close()
        except Exception:  # noqa: BLE001
            pass


class Sandbox:
    """Watched worker processes that execute one read-only SQL statement per call.

    workers: worker processes (parallelism of `execute_many`; concurrent `execute` calls share them).
    timeout_s: soft deadline per statement, enforced inside SQLite by the progress handler.
    hard_timeout_s: wall-clock limit per statement in the parent; the worker is killed and respawned
        (default: 2 * timeout_s + 1). With a per-call timeout, the margin above timeout_s is kept.
    max_rows / max_result_bytes: result caps (-> too_many_rows / too_large).
    max_value_bytes: SQLITE_LIMIT_LENGTH (largest string/blob). max_sql_chars: longest SQL text.
    heap_limit_bytes: SQLite hard_heap_limit per worker (soft limit = half).
    memory_limit_bytes: RLIMIT_AS per worker (None: unlimited).
    max_connections: cached read-only connections per worker (LRU).
    progress_ops: VM instructions between deadline checks (0 disables the check: watchdog only).
    preload: modules each worker imports when it starts (the scorers of `execute_scored`; default
        `sqlrl.reward.match`, which imports only the standard library until it parses SQL).
    ref_budget: total weight of the reference payloads (`execute_scored`) a worker keeps (LRU).
    """

    def __init__(
        self,
        workers: int = 2,
        timeout_s: float = 5.0,
        hard_timeout_s: float | None = None,
        max_rows: int = 100_000,
        max_result_bytes: int = 8 * 2**20,
        max_value_bytes: int = 4 * 2**20,
        max_sql_chars: int = 1_000_000,
        heap_limit_bytes: int = 512 * 2**20,
        memory_limit_bytes: int | None = 2 * 2**30,
        max_connections: int = 256,
        progress_ops: int = 10_000,
        chunk_size: int = 32,
        preload: tuple[str, ...] = ("sqlrl.reward.scoring",),
        ref_budget: int = 2_000_000,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        self.workers = int(workers)
        self.timeout_s = float(timeout_s)
        self.hard_timeout_s = float(hard_timeout_s) if hard_timeout_s else 2.0 * self.timeout_s + 1.0
        if self.hard_timeout_s < self.timeout_s:
            raise ValueError("hard_timeout_s must be >= timeout_s")
        self.max_rows = int(max_rows)
        self.max_result_bytes = int(max_result_bytes)
        self.max_sql_chars = int(max_sql_chars)
        self.chunk_size = max(1, int(chunk_size))
        self.ref_budget = max(1, int(ref_budget))
        self._cfg = {
            "max_rows": self.max_rows,
            "max_result_bytes": self.max_result_bytes,
            "max_value_bytes": int(max_value_bytes),
            "max_sql_chars": self.max_sql_chars,
            "heap_limit_bytes": int(heap_limit_bytes) if heap_limit_bytes else 0,
            "memory_limit_bytes": int(memory_limit_bytes) if memory_limit_bytes else 0,
            "max_connections": max(1, int(max_connections)),
            "progress_ops": int(progress_ops),
            "preload": tuple(preload or ()),
        }
        self._ctx = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._closed = False
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: list[_Worker] = []
        self.kills = 0  # watchdog kills (timeouts)
        self.crashes = 0  # workers that died on their own
        for _ in range(self.workers):
            w = _Worker(self._ctx, self._cfg)
            self._all.append(w)
            self._idle.put(w)
        _LIVE.add(self)

    # ---- public API

    def execute(self, db_path: str | os.PathLike, sql: str, timeout_s: float | None = None) -> SQLResult:
        """Run one statement on `db_path`. Thread-safe. Never raises for anything the SQL does."""
        return self.execute_many([(db_path, sql) if timeout_s is None else (db_path, sql, timeout_s)])[0]

    def execute_many(self, items: list[tuple]) -> list[SQLResult]:
        """Run (db_path, sql[, timeout_s]) items in parallel across the workers; results in order."""
        self._check_open()
        results: list[SQLResult | None] = [None] * len(items)
        todo: list[tuple[int, str, str, float]] = []
        for i, item in enumerate(items):
            db_path, sql = item[0], item[1]
            t = float(item[2]) if len(item) > 2 and item[2] is not None else self.timeout_s
            pre = _precheck(sql, self.max_sql_chars)
            if isinstance(pre, SQLResult):
                results[i] = pre
            else:
                todo.append((i, _abspath(db_path), pre, t))
        if todo:
            n_chunks_target = self.workers * 4
            size = max(1, min(self.chunk_size, -(-len(todo) // n_chunks_target)))
            chunks = _deal(todo, size)  # strided: see execute_scored (multi-turn rollouts run here)
            if len(chunks) == 1:
                self._run_chunks(chunks, iter(range(1)), results)
            else:
                counter = iter(range(len(chunks)))
                lock = threading.Lock()
                nxt = _Locked(counter, lock)
                threads = [
                    threading.Thread(target=self._run_chunks, args=(chunks, nxt, results), daemon=True)
                    for _ in range(min(self.workers, len(chunks)) - 1)
                ]
                for th in threads:
                    th.start()
                self._run_chunks(chunks, nxt, results)
                for th in threads:
                    th.join()
        missing = [i for i, r in enumerate(results) if r is None]
        for i in missing:  # only if the sandbox was closed under us
            results[i] = _result("worker_crash", "sandbox closed during the call")
        return results  # type: ignore[return-value]

    def execute_scored(
        self,
        items: list[tuple],
        refs: dict,
        scorer: str,
        options: Any = None,
    ) -> list[Any]:
        """Run a scorer inside the workers, one round trip per chunk of items, results in order.

        items: (db_path, sql, ref keys, extra). For each, the worker calls
        `scorer(run, sql, [payload of each key], extra, options)` (`scorer` is "module:function",
        imported once per worker), where `run(stmt)` executes one statement on `db_path` exactly as
        `execute` would (pre-check, hardened read-only connection, limits, deadline) and returns the
        tuple (status, columns, rows, row_count, elapsed_ms, message). The scorer's return value
        (marshallable) is the item's result; an exception in it gives ("__error__", text).
        refs: {key: (weight, payload)} for every key the items use. A key must always stand for the
        same payload: a worker receives a key's payload once, keeps it (at most `ref_budget` weight
        in all, least recently used dropped) and gets only the key afterwards.
        The watchdog works as in `execute_many`, per statement: a statement running past the hard
        limit gets its worker killed and respawned. If it was an item's first statement, the item's
        result is that `SQLResult` (timeout); for a later statement the item is run again on the new
        worker with that statement answered by the failure result instead of being executed. A
        worker dying gives `worker_crash` the same way. The other unfinished items of the chunk are
        re-run on the fresh worker. Thread-safe; nothing the SQL does makes it raise."""
        self._check_open()
        results: list[Any] = [None] * len(items)
        if not items:
            return results
        t = self.timeout_s
        todo = [(i, _abspath(it[0]), it[1], t, tuple(it[2]), it[3], None) for i, it in enumerate(items)]
        # As many chunks per worker as there are items for chunks of `_SCORE_MIN_CHUNK` (1 to
        # `_SCORE_CHUNKS_PER_WORKER`): every message costs both sides wake-ups, which a small call
        # cannot repay with better balance. Strided, not contiguous: chunk c holds items c, c + n,
        # c + 2n, ... of the n chunks, so the samples of one task (a GRPO group: one database, one gold,
        # often the same slow query shape) are spread over the workers instead of queueing on one. In a
        # real training step 8 samples of one task were correlated subqueries of 2-3 s each: in one
        # contiguous chunk they made that step's scoring take ~20 s on 8 workers
        # (results/2026-12-01-spider-0.5b-single-turn-seed3, step 7 of every arm). The cost: a worker
        # receives the golds of more tasks (each gold payload is shipped once per worker and kept).
        per_worker = max(1, min(_SCORE_CHUNKS_PER_WORKER, len(todo) // (self.workers * _SCORE_MIN_CHUNK)))
        n_chunks = min(len(todo), self.workers * per_worker)
        size = max(1, min(self.chunk_size * 4, -(-len(todo) // n_chunks)))
        chunks = deque(_deal(todo, size))
        self._run_scored(chunks, refs, scorer, options, results)
        for i, r in enumerate(results):
            if r is None:  # only if the sandbox was closed under us
                results[i] = _result("worker_crash", "sandbox closed during the call")
        return results

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for w in self._all:
            w.stop()
        _LIVE.discard(self)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    # ---- internals

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("Sandbox is closed")

    def _hard_limit(self, timeout_s: float) -> float:
        return max(self.hard_timeout_s, timeout_s + (self.hard_timeout_s - self.timeout_s))

    def _watch(self, w: _Worker, k: float, p0: float, pending: list, got: int, sent_at: float) -> tuple:
        """The watchdog's view of worker `w`, whose progress slots read item `k` started at `p0` (one
        snapshot, read by the caller in that order), with `got` of its
        `pending` items (4th field: timeout_s) answered: (index of the item being watched, when its
        clock started, the hard deadline, a cap on the next wait or None). A starting worker is
        re-checked every 20 ms (the first item's clock starts when it is up); an idle one, or one that
        has not yet reached item `got`, is timed from when the batch was sent."""
        if k == _STARTING:
            return got, p0, w.started_at + _STARTUP_LIMIT_S, 0.02
        if k == _IDLE or k < got:
            return got, sent_at, sent_at + self._hard_limit(pending[got][3]), None
        kk = int(k)
        return kk, p0, p0 + self._hard_limit(pending[kk][3]), None

    def _replace_worker(self, w: _Worker, status: str, timeout_s: float) -> str:
        """Respawn `w` after the watchdog killed it (`status` "timeout") or found it dead ("worker_crash"),
        count it, and return the message for the statement it was running."""
        code = w.proc.exitcode if w.proc is not None else None
        w.respawn()
        if status == "timeout":
            self.kills += 1
            limit = self._hard_limit(timeout_s)
            return f"statement exceeded the hard time limit of {limit:g} s; the worker was killed"
        self.crashes += 1
        return f"sandbox worker died (exit code {code}); the worker was restarted"

    def _run_chunks(self, chunks: list, nxt: Any, results: list) -> None:
        w = None
        try:
            for k in nxt:
                if self._closed:
                    return
                if w is None:
                    w = self._idle.get()
                self._run_batch(w, chunks[k], results)
        finally:
            if w is not None:
                self._idle.put(w)

    def _run_batch(self, w: _Worker, batch: list, results: list) -> None:
        """Run `batch` [(index, db, sql, timeout)] on worker `w`, filling `results`. The watchdog reads
        the worker's shared progress slot: the item it is running and since when. An item running past
        its hard limit gets `timeout` (worker killed and respawned); an item during which the worker
        died gets `worker_crash`; finished-but-unsent items and the rest are re-run on the new worker."""
        pending = list(batch)
        send_failures = 0
        while pending:
            if self._closed:
                return
            payload = marshal.dumps([(db, sql, t) for _, db, sql, t in pending])
            if not w.send(payload):
                send_failures += 1
                w.respawn()
                if send_failures < 2:
                    continue  # the worker died while idle: not this item's fault, try a fresh one
                i = pending.pop(0)[0]
                results[i] = _result("worker_crash", "could not send the statement to a sandbox worker")
                self.crashes += 1
                continue
            send_failures = 0
            sent_at = time.monotonic()
            got = 0
            failed: tuple[str, int, float] | None = None  # (status, item index in pending, elapsed_s)
            while got < len(pending):
                k = w.progress[1]
                p0 = w.progress[0]
                now = time.monotonic()
                kk, started, deadline, wait_cap = self._watch(w, k, p0, pending, got, sent_at)
                try:
                    wait = max(0.0, deadline - now)
                    ready = w.conn.poll(wait if wait_cap is None else min(wait, wait_cap))
                    data = w.conn.recv_bytes() if ready else None
                except (EOFError, OSError):
                    ready, data = True, None
                if data is not None:
                    for st, cols, rows, n, ms, msg in marshal.loads(data):
                        results[pending[got][0]] = SQLResult(st, cols, rows, n, ms, msg)
                        got += 1
                    continue
                if ready:  # EOF: the worker died
                    k2 = w.progress[1]
                    kk = int(k2) if k2 >= got else got
                    failed = (
                        "worker_crash",
                        kk,
                        time.monotonic() - (w.progress[0] if k2 >= got else sent_at),
                    )
                    break
                if w.progress[1] == k and time.monotonic() >= deadline:
                    if k == _STARTING:
                        failed = ("worker_crash", got, time.monotonic() - sent_at)
                    else:
                        failed = ("timeout", kk, time.monotonic() - started)
                    break
            if failed is None:
                pending = []
                continue
            if self._closed:  # close() pulled the worker away: leave the rest unfilled
                return
            status, kk, elapsed = failed
            msg = self._replace_worker(w, status, pending[kk][3])
            results[pending[kk][0]] = _result(status, msg, max(0.0, elapsed) * 1e3)
            pending = pending[got:kk] + pending[kk + 1 :]

    def _scored_payload(
        self, w: _Worker, pending: list, refs: dict, scorer: str, options: Any, base: int
    ) -> tuple[bytes, list]:
        """The marshalled batch for `w` and the keys whose payloads it adds (the caller takes them back
        out of `w.refs` if the batch cannot be sent)."""
        need = {k for it in pending for k in it[4]}
        adds = {}
        for k in need:
            if k in w.refs:
                w.refs.move_to_end(k)
            else:
                weight, payload = refs[k]
                adds[k] = payload
                w.refs[k] = weight
                w.ref_weight += weight
        drops = []
        while w.ref_weight > self.ref_budget and len(w.refs) > len(need):
            k = next(iter(w.refs))
            if k in need:  # (only needed keys are left at the old end: stop)
                break
            w.ref_weight -= w.refs.pop(k)
            drops.append(k)
        items = [(db, sql, t, keys, extra, failed) for _, db, sql, t, keys, extra, failed in pending]
        try:
            return marshal.dumps(("score", scorer, options, drops, adds, items, base)), list(adds)
        except BaseException:
            self._unhold(w, list(adds))
            raise

    @staticmethod
    def _unhold(w: _Worker, added: list) -> None:
        """Forget reference payloads that a batch which never reached `w` would have given it. (Keys
        that batch dropped stay forgotten: the worker then holds them unknown to us until it is
        replaced, and would get them again if needed: wasteful, never wrong.)"""
        for k in added:
            weight = w.refs.pop(k, None)
            if weight is not None:
                w.ref_weight -= weight

    def _run_scored(self, chunks: deque, refs: dict, scorer: str, options: Any, results: list) -> None:
        """Drive the chunks over as many idle workers as there are (at least one; waits for it) from
        this one thread: each worker has up to `_SCORE_DEPTH` chunks in flight (the next one waits in
        its pipe while it runs the current one, so it never waits for a round trip) and gets another
        when one is answered. The watchdog of `_run_batch`, per statement (progress [start, item,
        statement]), over the worker's items in flight numbered in the order sent (each batch tells the
        worker the number of its first item): an item the worker has not reached yet is timed from when
        it was sent or the answer before it arrived, whichever is later."""
        ws = [self._idle.get()]
        try:
            while len(ws) < min(self.workers, len(chunks)):
                try:
                    ws.append(self._idle.get_nowait())
                except queue.Empty:
                    break
            # worker -> [items in flight since it was last fed with nothing in flight (answered ones
            # included), items answered, when item `got` was sent or the answer before it arrived,
            # sizes of the batches in flight]
            state: dict[_Worker, list] = {}

            def feed(w: _Worker, pending: list | None) -> None:
                """Send `pending` (or the next chunk) to `w`, which has nothing in flight; retire `w`
                when nothing is left."""
                failures = 0
                while True:
                    if pending is None or not pending:
                        pending = chunks.popleft() if chunks else None
                    if pending is None or self._closed:
                        state.pop(w, None)
                        return
                    # not `w.send`: a worker respawned there would get a payload that assumes
                    # the references the dead one held
                    try:
                        if w.proc is None or not w.proc.is_alive():
                            w.respawn()
                        payload, _ = self._scored_payload(w, pending, refs, scorer, options, 0)
                        if w.progress[1] != _STARTING:
                            w.progress[1] = _IDLE
                        w.conn.send_bytes(payload)
                        sizes = deque([(len(pending), len(payload) + 8)])
                        state[w] = [list(pending), 0, time.monotonic(), sizes]
                        return
                    except (OSError, EOFError, ValueError):
                        pass
                    failures += 1
                    w.respawn()
                    if failures < 2:
                        continue  # the worker died while idle: not this item's fault, try a fresh one
                    results[pending[0][0]] = _result(
                        "worker_crash", "could not send the statement to a sandbox worker"
                    )
                    self.crashes += 1
                    pending = pending[1:]
                    failures = 0

            def top_up(w: _Worker) -> None:
                """Queue further chunks behind those `w` has in flight, up to `_SCORE_DEPTH`, while
                they fit in the pipe's buffer (see `_SCORE_TOPUP_BYTES`)."""
                st = state.get(w)
                room = min(_SCORE_TOPUP_BYTES, w.sndbuf // 4)
                while st is not None and chunks and len(st[3]) < _SCORE_DEPTH and not self._closed:
                    batch = chunks.popleft()
                    added: list = []
                    try:
                        payload, added = self._scored_payload(w, batch, refs, scorer, options, len(st[0]))
                        if len(payload) + 8 + sum(b for _, b in st[3]) > room:
                            self._unhold(w, added)
                            chunks.appendleft(batch)
                            return
                        w.conn.send_bytes(payload)
                    except (OSError, EOFError, ValueError):
                        # the worker died (its pipe reports it to the loop below, which re-runs what it
                        # had in flight) or the batch could not be built: the chunk waits for the next
                        # worker with room
                        self._unhold(w, added)
                        chunks.appendleft(batch)
                        return
                    st[0].extend(batch)
                    st[3].append((len(batch), len(payload) + 8))

            for w in ws:
                feed(w, None)
            for w in ws:
                top_up(w)
            while state:
                if self._closed:
                    return
                now = time.monotonic()
                plan = {}
                wait = None
                for w, (pending, got, sent_at, _) in state.items():
                    k = w.progress[1]
                    p0 = w.progress[0]
                    kk, started, deadline, cap = self._watch(w, k, p0, pending, got, sent_at)
                    plan[w] = (k, p0, started, kk, deadline)
                    left = max(0.0, deadline - now)
                    if cap is not None:
                        left = min(left, cap)
                    wait = left if wait is None else min(wait, left)
                conns = {w.conn: w for w in state}
                try:
                    ready = multiprocessing.connection.wait(list(conns), wait)
                except OSError:
                    ready = list(conns)
                for w in list(state):
                    st = state.get(w)
                    if st is None:
                        continue
                    pending, got, sent_at, sizes = st
                    k, p0, started, kk, deadline = plan[w]
                    failed = None
                    if w.conn in ready:
                        try:
                            data = w.conn.recv_bytes()
                        except (EOFError, OSError):
                            data = None
                        if data is not None:
                            for r in marshal.loads(data):
                                results[pending[got][0]] = r
                                got += 1
                            st[1] = got
                            st[2] = time.monotonic()  # the worker moves on to its next item now
                            sizes.popleft()
                            if sizes:
                                top_up(w)
                            else:
                                feed(w, None)
                                top_up(w)
                            continue
                        k2 = w.progress[1]  # EOF: the worker died
                        kk = int(k2) if k2 >= got else got
                        failed = (
                            "worker_crash",
                            kk,
                            time.monotonic() - (w.progress[0] if k2 >= got else sent_at),
                        )
                    elif w.progress[1] == k and w.progress[0] == p0 and time.monotonic() >= deadline:
                        if k == _STARTING:
                            failed = ("worker_crash", got, time.monotonic() - sent_at)
                        else:
                            failed = ("timeout", kk, time.monotonic() - started)
                    if failed is None:
                        continue
                    if self._closed:
                        return
                    status, kk, elapsed = failed
                    j = int(w.progress[2]) if w.progress[1] == kk else 0  # statement of the item
                    item = pending[kk]
                    msg = self._replace_worker(w, status, item[3])
                    rest = pending[got:kk]
                    if j > 0 and item[6] is None:  # a later statement: run the item again without it
                        rest.append((*item[:6], (j, status, msg)))
                    else:
                        results[item[0]] = _result(status, msg, max(0.0, elapsed) * 1e3)
                    feed(w, rest + pending[kk + 1 :])
                    top_up(w)
        finally:
            for w in ws:
                self._idle.put(w)


class _Locked:
    """Thread-safe iterator wrapper."""

    def __init__(self, it: Any, lock: threading.Lock) -> None:
        self.it, self.lock = it, lock

    def __iter__(self) -> _Locked:
        return self

    def __next__(self) -> Any:
        with self.lock:
            return next(self.it)


# --------------------------------------------------------------------------------------------------
# CLI
