"""A debugging episode's database state, the submission, the hidden tests and the score.

Protocol: `prepare_state(task, dest)` copies `public.db_path` to a writable `dest` and runs
`preprocess_sql`; the agent may explore; `apply_submission(task, dest, sql)` applies the final SQL
(category `query`: ONE SELECT / WITH ... SELECT, its result stored as `__submitted(__pos, c0, c1, ...)`
with `__pos` the 0-based row position; other categories: the statements run in order);
`score_debug` / `run_tests` run the hidden tests; `clean_up` runs `clean_up_sql` to reuse the state.

What is covered:
- each test is one SELECT on the state with the REFERENCE end state attached as `ref`: the original
  database, preprocess SQL, then the reference solution applied by the same `apply_submission` rule
  (`ref.__reference` holds a query task's gold result). A test PASSES iff it returns exactly one row
  holding exactly one value equal to 1; an SQL error, no row, several rows or any other value fails;
- query tasks' tests: same column count, same multiset of rows (GROUP BY all columns with counts,
  EXCEPT both ways) and, only when the gold has ORDER BY, the same rows at the same positions;
- a query's result (submission or reference) is fetched under the sandbox's caps (rows, bytes, no
  value over `MAX_VALUE_BYTES`), in chunks the byte cap can stop; over them it is an SQL error;
- `run_tests` / `score_debug` work on any writable SQLite file and never modify `public.db_path`
  (the reference is built on a temporary copy, or once per task by `ReferenceStates`).

What is not: `personalization` views compare as sets (EXCEPT both ways) plus equal row count, not
multisets; query results compare exactly (same SQLite both sides), management updates' numbers with
a 1e-6 tolerance; statements are interrupted after `timeout_s` (progress handler), best effort.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sqlrl.sql.result import MAX_RESULT_BYTES, MAX_ROWS, MAX_VALUE_BYTES
from sqlrl.tasks.debugging import DebugTaskPrivate, DebugTaskPublic

__all__ = [
    "REFERENCE_TABLE",
    "SUBMITTED_TABLE",
    "DebugReferenceError",
    "ReferenceStates",
    "apply_submission",
    "clean_up",
    "connect",
    "prepare_state",
    "query_test_cases",
    "quote_ident",
    "run_episode_offline",
    "run_tests",
    "score_debug",
    "validate_task",
]

SUBMITTED_TABLE = "__submitted"
REFERENCE_TABLE = "__reference"
MAX_RESULT_ROWS = MAX_ROWS

# ------------------------------------------------------------------------------------ sqlite helpers


def connect(path: str, timeout_s: float | None, *, read_only: bool = False) -> sqlite3.Connection:
    """A connection returning text as UTF-8 (errors replaced), interrupted past `timeout_s` seconds."""
    if read_only:
        con = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True, isolation_level=None)
    else:
        con = sqlite3.connect(path, isolation_level=None)
    con.text_factory = lambda b: b.decode("utf-8", errors="replace")
    if timeout_s is not None:
        deadline = time.monotonic() + timeout_s
        con.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 10_000)
    return con


def quote_ident(name: str) -> str:
    """`name` as a double-quoted SQLite identifier."""
    return '"' + name.replace('"', '""') + '"'


def _materialize(con: sqlite3.Connection, sql: str, table: str, *, trusted_after_fetch: bool = False) -> int:
    """Run one SELECT and store its result as `table(__pos, c0..)`. Returns the number of columns.
    `trusted_after_fetch`: remove the connection's authorizer once the rows are fetched (the SELECT was
    policy SQL; storing its rows is ours)."""
    from sqlrl.sql.engine import Deadline, chunk_rows, fetch_rows

    cur = con.execute(sql)
    if cur.description is None:
        raise sqlite3.OperationalError("the submission of a query task must be a SELECT returning rows")
    ncol = len(cur.description)
    deadline = Deadline()
    deadline.t = float("inf")  # the connection's progress handler keeps the time limit
    caps = {"max_rows": MAX_RESULT_ROWS, "max_result_bytes": MAX_RESULT_BYTES}
    status, rows, msg = fetch_rows(cur, caps, deadline, max_chunk=chunk_rows(ncol, MAX_VALUE_BYTES))
    cur.close()
    if trusted_after_fetch:
        con.set_authorizer(None)
    if status == "too_many_rows":
        raise sqlite3.OperationalError(f"result has more than {MAX_RESULT_ROWS} rows")
    if status != "ok":
        raise sqlite3.OperationalError(msg)
    cols = ", ".join(["__pos INTEGER"] + [f"c{i}" for i in range(ncol)])
    con.execute(f"DROP TABLE IF EXISTS {quote_ident(table)}")
    con.execute(f"CREATE TABLE {quote_ident(table)} ({cols})")
    ph = ", ".join("?" * (ncol + 1))
    con.execute("BEGIN")
    con.executemany(f"INSERT INTO {quote_ident(table)} VALUES ({ph})", [(i, *r) for i, r in enumerate(rows)])
    con.execute("COMMIT")
    return ncol


def _run_statements(con: sqlite3.Connection, stmts: list[str] | tuple[str, ...]) -> None:
    for s in stmts:
        if s.strip():
            con.executescript(s)


def _as_list(sql: str | list[str] | tuple[str, ...] | None) -> list[str]:
    if sql is None:
        return []
    if isinstance(sql, str):
        return [sql] if sql.strip() else []
    return [s for s in sql if isinstance(s, str) and s.strip()]


def prepare_state(
    task: DebugTaskPublic | DebugTaskPrivate, dest: str | os.PathLike, *, timeout_s: float = 10.0
):
    """Copy the task's database to `dest` (writable) and run its preprocess SQL there."""
    pub = task.public if isinstance(task, DebugTaskPrivate) else task
    shutil.copyfile(pub.db_path, dest)
    os.chmod(dest, 0o644)
    con = connect(str(dest), timeout_s)
    try:
        _run_statements(con, pub.preprocess_sql)
    finally:
        con.close()


def apply_submission(
    task: DebugTaskPublic | DebugTaskPrivate,
    state_db_path: str | os.PathLike,
    sql: str | list[str] | tuple[str, ...],
    *,
    timeout_s: float = 10.0,
    _table: str = SUBMITTED_TABLE,
) -> str | None:
    """Apply a submitted solution to the state (see `sqlrl.tasks.debug_episode`). Returns None or an error message."""
    pub = task.public if isinstance(task, DebugTaskPrivate) else task
    stmts = _as_list(sql)
    if not stmts:
        return "empty submission"
    from sqlrl.sql.guard import write_authorizer

    con = connect(str(state_db_path), timeout_s)
    try:
        # the submission is policy SQL: the replica pool's authorizer applies to it too (no ATTACH,
        # no transactions, no state-changing pragmas, no denied functions); our own statements after
        # it (materializing a query's result) run without it. It runs in this process: no value may
        # be longer than the sandbox allows, and a query's result is fetched under its caps
        con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        con.set_authorizer(write_authorizer())
        if pub.category == "query":
            if len(stmts) != 1:
                return "a query task takes exactly one SELECT statement"
            _materialize(con, stmts[0].strip().rstrip(";"), _table, trusted_after_fetch=True)
        else:
            _run_statements(con, stmts)
        return None
    except (sqlite3.Error, ValueError, OverflowError) as e:
        try:
            if con.in_transaction:
                con.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        return f"{type(e).__name__}: {e}"
    finally:
        con.close()


def clean_up(task: DebugTaskPrivate, state_db_path: str | os.PathLike, *, timeout_s: float = 10.0) -> None:
    """Run the task's clean-up SQL on a state (only needed when the state file is reused)."""
    con = connect(str(state_db_path), timeout_s)
    try:
        _run_statements(con, task.clean_up_sql)
    finally:
        con.close()


class DebugReferenceError(RuntimeError):
    """The reference end state could not be built (an infrastructure / task problem, not the agent's)."""


def _build_reference(task: DebugTaskPrivate, dest: str, timeout_s: float) -> None:
    try:
        prepare_state(task, dest, timeout_s=timeout_s)
    except (sqlite3.Error, OSError) as e:
        raise DebugReferenceError(f"preprocess failed: {e}") from e
    err = apply_submission(task, dest, task.solution_sql, timeout_s=timeout_s, _table=REFERENCE_TABLE)
    if err:
        raise DebugReferenceError(f"reference solution failed: {err}")


class ReferenceStates:
    """Reference end states built once per task and reused for every submission of it (a GRPO group
    scores several submissions of one task). `get(task)` builds on first use (thread-safe: one build
    per task, other threads wait for it) and returns the file's path; a task whose reference cannot be
    built raises the same DebugReferenceError for every submission. The files live in one temporary
    folder, removed by `close()` (or leaving the `with` block). The tests only read `ref` (they are
    SELECTs), so one file serves concurrent readers."""

    def __init__(self, timeout_s: float = 10.0):
        self.timeout_s = timeout_s
        self._dir = tempfile.mkdtemp(prefix="sqlrl-debugrefs-")
        self._built: dict[str, str | DebugReferenceError] = {}  # task id -> reference path or its error
        self._locks: dict[str, tuple[threading.Lock, str]] = {}  # task id -> (its build lock, its path)
        self._lock = threading.Lock()
        self.builds = 0

    def get(self, task: DebugTaskPrivate) -> str:
        tid = task.public.task_id
        with self._lock:
            if tid not in self._locks:
                self._locks[tid] = (
                    threading.Lock(),
                    os.path.join(self._dir, f"ref_{len(self._locks):06d}.sqlite"),
                )
            lock, path = self._locks[tid]
        with lock:
            hit = self._built.get(tid)
            if hit is None:
                try:
                    _build_reference(task, path, self.timeout_s)
                    hit = path
                except DebugReferenceError as e:
                    hit = e
                self._built[tid] = hit
                self.builds += 1
        if isinstance(hit, DebugReferenceError):
            raise hit
        return hit

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> ReferenceStates:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def run_tests(
    task: DebugTaskPrivate,
    state_db_path: str | os.PathLike,
    *,
    timeout_s: float = 10.0,
    references: ReferenceStates | None = None,
) -> tuple[int, int, list[dict]]:
    """Run the hidden tests on a state. Returns (passed, total, details); details[i] = {passed, error}.
    The reference end state comes from `references` (built once per task) or, without it, is built
    on a temporary copy for this call.

    Raises DebugReferenceError if the reference end state cannot be built (treated as infra_error).
    """
    if not isinstance(task, DebugTaskPrivate):
        raise TypeError("run_tests needs a DebugTaskPrivate")
    if not Path(state_db_path).is_file():
        raise FileNotFoundError(f"no state database at {state_db_path}")
    if references is not None:
        details = _tests_against(task, state_db_path, references.get(task), timeout_s)
    else:
        with tempfile.TemporaryDirectory(prefix="sqlrl-debugref-") as tmp:
            ref = os.path.join(tmp, "ref.sqlite")
            _build_reference(task, ref, timeout_s)
            details = _tests_against(task, state_db_path, ref, timeout_s)
    passed = sum(d["passed"] for d in details)
    return passed, len(details), details


def _tests_against(
    task: DebugTaskPrivate, state_db_path: str | os.PathLike, ref: str, timeout_s: float
) -> list:
    con = connect(str(state_db_path), timeout_s)
    details = []
    try:
        con.execute("ATTACH DATABASE ? AS ref", (ref,))
        for sql in task.test_cases:
            try:
                rows = con.execute(sql).fetchall()
                ok = len(rows) == 1 and len(rows[0]) == 1 and rows[0][0] == 1 and rows[0][0] is not True
                details.append({"passed": bool(ok), "error": None if ok else f"returned {rows[:3]!r}"})
            except sqlite3.Error as e:
                details.append({"passed": False, "error": f"{type(e).__name__}: {e}"})
        con.execute("DETACH DATABASE ref")
    finally:
        con.close()
    return details


def score_debug(
    task: DebugTaskPrivate,
    state_db_path: str | os.PathLike | None,
    *,
    final_sql: Any = ...,
    apply_error: str | None = None,
    timeout_s: float = 10.0,
    references: ReferenceStates | None = None,
) -> dict:
    """Reward after the trajectory ended: {value, status, passed, total, message}. `references`: see
    `run_tests`.

    `final_sql` (optional): the agent's submission; None / empty -> status no_sql (value 0.0).
    `apply_error`: the message `apply_submission` returned -> status exec_error (value 0.0).
    Otherwise the tests run on `state_db_path` (the state after the submission was applied):
    solved (all pass), partial (some), failed (none); value = passed / total. A missing state file or a
    reference that cannot be built -> infra_error with value None (exclude, never a wrong answer).
    """
    if final_sql is not ... and not _as_list(final_sql):
        return {"value": 0.0, "status": "no_sql", "passed": 0, "total": len(task.test_cases), "message": ""}
    if apply_error:
        return {
            "value": 0.0,
            "status": "exec_error",
            "passed": 0,
            "total": len(task.test_cases),
            "message": apply_error,
        }
    try:
        if state_db_path is None:
            raise FileNotFoundError("no state database")
        passed, total, details = run_tests(task, state_db_path, timeout_s=timeout_s, references=references)
    except (DebugReferenceError, OSError, sqlite3.Error) as e:
        return {"value": None, "status": "infra_error", "passed": 0, "total": 0, "message": str(e)}
    if total == 0:
        return {"value": None, "status": "infra_error", "passed": 0, "total": 0, "message": "no test cases"}
    status = "solved" if passed == total else ("partial" if passed else "failed")
    msg = "; ".join(d["error"] for d in details if d["error"])[:500]
    return {"value": passed / total, "status": status, "passed": passed, "total": total, "message": msg}


def run_episode_offline(
    task: DebugTaskPrivate, sql: Any, *, timeout_s: float = 10.0, references: ReferenceStates | None = None
) -> dict:
    """Score one submission end to end on a fresh temporary copy (prepare, apply, test). For validation,
    evaluation and the debugging agent's scorer; `references` (see `run_tests`) shares reference end
    states between submissions of one task."""
    with tempfile.TemporaryDirectory(prefix="sqlrl-debugstate-") as tmp:
        state = os.path.join(tmp, "state.sqlite")
        try:
            prepare_state(task, state, timeout_s=timeout_s)
        except (sqlite3.Error, OSError) as e:
            return {"value": None, "status": "infra_error", "passed": 0, "total": 0, "message": str(e)}
        if not _as_list(sql):
            return score_debug(task, state, final_sql=sql)
        err = apply_submission(task, state, sql, timeout_s=timeout_s)
        return score_debug(
            task, state, final_sql=sql, apply_error=err, timeout_s=timeout_s, references=references
        )


def validate_task(task: DebugTaskPrivate, *, timeout_s: float = 10.0) -> str | None:
    """None if the reference passes every test and the buggy SQL fails one (or errors); else the reason."""
    ref = run_episode_offline(task, list(task.solution_sql), timeout_s=timeout_s)
    if ref["status"] != "solved":
        return "reference_fails" if ref["status"] != "infra_error" else "reference_error"
    bug = run_episode_offline(task, task.public.buggy_sql, timeout_s=timeout_s)
    if bug["status"] == "solved":
        return "buggy_passes"
    if bug["status"] == "infra_error":
        return "reference_error"
    return None


# ------------------------------------------------------------------------------------- query tests


def query_test_cases(ncol: int, ordered: bool) -> list[str]:
    """Hidden tests of a query task whose reference result has `ncol` columns (see module docstring)."""
    cols = ", ".join(f"c{i}" for i in range(ncol))
    s, r = SUBMITTED_TABLE, f"ref.{REFERENCE_TABLE}"
    shape = f"(SELECT count(*) FROM pragma_table_info('{SUBMITTED_TABLE}')) = {ncol + 1}"
    tests = [
        f"SELECT {shape}",
        f"SELECT {shape} AND (SELECT count(*) FROM {s}) = (SELECT count(*) FROM {r}) AND NOT EXISTS ("
        f"SELECT {cols}, count(*) FROM {s} GROUP BY {cols} EXCEPT SELECT {cols}, count(*) FROM {r} GROUP BY {cols}"
        f") AND NOT EXISTS (SELECT {cols}, count(*) FROM {r} GROUP BY {cols} "
        f"EXCEPT SELECT {cols}, count(*) FROM {s} GROUP BY {cols})",
    ]
    if ordered:
        tests.append(
            f"SELECT {shape} AND (SELECT count(*) FROM {s}) = (SELECT count(*) FROM {r}) AND NOT EXISTS ("
            f"SELECT __pos, {cols} FROM {s} EXCEPT SELECT __pos, {cols} FROM {r})"
        )
    return tests
