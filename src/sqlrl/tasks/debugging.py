"""Stateful SQL-debugging tasks (BIRD-Critic / BIRD-RL style): task format, test execution, scoring, builder.

A user describes a problem, shows the schema and their buggy SQL; the agent submits a fixed solution;
hidden test cases (SQL run after the solution) decide success. Standard library only, except the
builder's query mutation (`mutate_query`), which imports sqlglot lazily.

Task format
-----------
`DebugTaskPublic` (the policy may see it): task_id, db_id, category (query | management |
personalization), description, schema, buggy_sql, preprocess_sql (list), db_path.
`DebugTaskPrivate(public, solution_sql, test_cases, clean_up_sql)` is NOT a subclass of the public
type; `ensure_public_debug` rejects it. JSONL (`save_debug_tasks` / `load_debug_tasks`): one object
per line, `{"version": 1, "split": ..., "public": {...}, "solution_sql": [...], "test_cases": [...],
"clean_up_sql": [...]}`; a relative `db_path` is resolved against the JSONL file's folder.

Episode protocol (what the environment / replica pool does)
----------------------------------------------------------
1. `prepare_state(task, dest)`: copy `public.db_path` to a writable `dest`, run `preprocess_sql`.
2. The agent may explore the state; at the end its final SQL is applied with
   `apply_submission(task, dest, sql)`:
   - category `query`: the submission must be ONE SELECT (or WITH ... SELECT). It is executed and its
     result is stored in the table `__submitted(__pos INTEGER, c0, c1, ...)`: `__pos` is the 0-based
     row position, `c<i>` the i-th output column (untyped, values as SQLite returned them).
   - other categories: the statements are executed in order on the state (`executescript`).
3. `score_debug(task, dest)` (or `run_tests`) runs the hidden tests; `clean_up(task, dest)` runs
   `clean_up_sql` if the state file is to be reused.

Test cases
----------
Each test case is one SELECT run on a connection to the state database, with the REFERENCE end state
attached as schema `ref`. The reference end state is built by `run_tests` on a separate temporary
copy of the original database (or taken from a `ReferenceStates`, which builds it once per task):
preprocess SQL, then the reference solution applied with the same `apply_submission` rule (so for query tasks `ref.__reference` holds the gold result with the
`__pos, c0, ...` layout; for other tasks `ref.<table>` is the intended end state). A test PASSES iff
it returns exactly one row holding exactly one value equal to 1; an SQL error, no row, several rows
or any other value is a FAIL. Query tasks have tests: same column count, same multiset of rows
(GROUP BY all columns with counts, EXCEPT both ways), and, only when the gold has ORDER BY, the same
rows at the same positions; the last two also require the column count, so an extra column fails all.

Guaranteed
----------
- Nothing reachable from a `DebugTaskPublic` holds the solution or the tests (plain frozen dataclass
  of strings / tuples of strings; no back reference, no cache keyed on it).
- `run_tests` / `score_debug` work on any writable SQLite file path (the replica pool can pass its
  copies); they never modify `public.db_path` (the reference is built on a temporary copy). The tests
  do write to the state file only through `apply_submission` (called by the caller, not by them).
- Every task emitted by `build_debug_tasks` was validated on fresh temporary copies: the reference
  solution passes every test and the buggy SQL fails at least one (or raises an error); tasks that
  fail validation are dropped and counted by reason.
- `build_debug_tasks` is deterministic: same inputs and seed -> the same tasks in the same order,
  and `save_debug_tasks` writes byte-identical files.
- Train/validation split by database with `sqlrl.tasks.data.split_by_database` (default split seed 0,
  val_fraction 0.1, over the db ids of train_spider.json), the same split as `SpiderData`'s.

Not guaranteed
--------------
- That the description alone pins down the intended solution uniquely (as in Spider, values and
  column choices can be ambiguous); success is defined by the tests only.
- Multiset equality for `personalization` views is approximate: set equality (EXCEPT both ways) plus
  equal row count.
- Floating-point results are compared exactly for query tasks (the reference and the submission run
  on the same SQLite); management updates compare numeric values with a 1e-6 tolerance.
- Time limits: statements are interrupted after `timeout_s` (progress handler), best effort.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CATEGORIES",
    "DEBUG_FORMAT_VERSION",
    "DebugTaskPrivate",
    "DebugReferenceError",
    "DebugTaskPublic",
    "apply_submission",
    "build_debug_tasks",
    "clean_up",
    "debug_demo_root",
    "ensure_public_debug",
    "load_debug_tasks",
    "mutate_query",
    "prepare_state",
    "run_tests",
    "save_debug_tasks",
    "score_debug",
    "validate_task",
]

DEBUG_FORMAT_VERSION = 1
CATEGORIES = ("query", "management", "personalization")
SUBMITTED_TABLE = "__submitted"
REFERENCE_TABLE = "__reference"
MAX_RESULT_ROWS = 100_000


# --------------------------------------------------------------------------------------------- types


@dataclass(frozen=True)
class DebugTaskPublic:
    """Everything the policy may see. Holds no solution and no test case."""

    task_id: str
    db_id: str
    category: str  # query | management | personalization
    description: str
    schema: str
    buggy_sql: str
    preprocess_sql: tuple[str, ...]
    db_path: str

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"category must be one of {CATEGORIES}, got {self.category!r}")
        object.__setattr__(self, "preprocess_sql", tuple(self.preprocess_sql))


@dataclass(frozen=True)
class DebugTaskPrivate:
    """A public debugging task plus its reference solution, hidden tests and clean-up. Not a subclass."""

    public: DebugTaskPublic
    solution_sql: tuple[str, ...]
    test_cases: tuple[str, ...]
    clean_up_sql: tuple[str, ...] = ()
    split: str = ""
    meta: dict = field(default_factory=dict, compare=False)  # builder provenance (e.g. mutation kind)

    def __post_init__(self) -> None:
        for name in ("solution_sql", "test_cases", "clean_up_sql"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def task_id(self) -> str:
        return self.public.task_id

    @property
    def category(self) -> str:
        return self.public.category


def ensure_public_debug(task: Any) -> DebugTaskPublic:
    """Return `task` if it is a DebugTaskPublic; TypeError for a DebugTaskPrivate or anything else."""
    if isinstance(task, DebugTaskPrivate):
        raise TypeError(
            "ensure_public_debug: got a DebugTaskPrivate (it carries the solution and the tests); pass "
            "`task.public` to the policy instead."
        )
    if type(task) is not DebugTaskPublic:
        raise TypeError(f"ensure_public_debug: expected DebugTaskPublic, got {type(task).__qualname__}")
    return task


# ---------------------------------------------------------------------------------------------- JSONL


def _to_record(t: DebugTaskPrivate, db_path: str | None = None) -> dict:
    p = t.public
    pub = {
        "task_id": p.task_id,
        "db_id": p.db_id,
        "category": p.category,
        "description": p.description,
        "schema": p.schema,
        "buggy_sql": p.buggy_sql,
        "preprocess_sql": list(p.preprocess_sql),
        "db_path": p.db_path if db_path is None else db_path,
    }
    return {
        "version": DEBUG_FORMAT_VERSION,
        "split": t.split,
        "public": pub,
        "solution_sql": list(t.solution_sql),
        "test_cases": list(t.test_cases),
        "clean_up_sql": list(t.clean_up_sql),
        "meta": t.meta,
    }


def save_debug_tasks(
    tasks: list[DebugTaskPrivate], path: str | os.PathLike, *, relative_to: str | None = None
):
    """Write tasks as JSONL (sorted keys, UTF-8). With `relative_to`, db paths are stored relative to it."""
    lines = []
    for t in tasks:
        dbp = None
        if relative_to is not None:
            dbp = os.path.relpath(t.public.db_path, relative_to).replace(os.sep, "/")
        lines.append(json.dumps(_to_record(t, dbp), sort_keys=True, ensure_ascii=False))
    Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def load_debug_tasks(path: str | os.PathLike) -> list[DebugTaskPrivate]:
    """Read a JSONL written by `save_debug_tasks`; relative db paths resolve against the file's folder."""
    path = Path(path)
    base = path.resolve().parent
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        rec = json.loads(line)
        if rec.get("version") != DEBUG_FORMAT_VERSION:
            raise ValueError(f"{path}:{i + 1}: unsupported debug task version {rec.get('version')!r}")
        pub = dict(rec["public"])
        if not os.path.isabs(pub["db_path"]):
            pub["db_path"] = str((base / pub["db_path"]).resolve())
        out.append(
            DebugTaskPrivate(
                public=DebugTaskPublic(**pub),
                solution_sql=rec["solution_sql"],
                test_cases=rec["test_cases"],
                clean_up_sql=rec.get("clean_up_sql", []),
                split=rec.get("split", ""),
                meta=rec.get("meta", {}),
            )
        )
    return out


def debug_demo_root() -> Path:
    """The embedded demo slice (debug_tasks.jsonl + copied databases; Spider, CC BY-SA 4.0)."""
    return Path(__file__).resolve().parents[1] / "embedded" / "debug_demo"


def resolve_debug_file(path: str | os.PathLike | None) -> Path:
    """`data.path` of a debug run -> the task file: `embedded` (the demo slice), a folder holding
    `debug_tasks.jsonl`, or a `.jsonl` file (as `envs.DebugEnv` reads it). FileNotFoundError if absent."""
    p = Path(debug_demo_root() if path in ("embedded", "", None) else path)
    file = p / "debug_tasks.jsonl" if p.is_dir() else p
    if not file.is_file():
        raise FileNotFoundError(f"no debugging tasks at {file}; build them with bench/make_debug_tasks.py")
    return file


# ------------------------------------------------------------------------------------ sqlite helpers


def _connect(path: str, timeout_s: float | None, *, read_only: bool = False) -> sqlite3.Connection:
    if read_only:
        con = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True, isolation_level=None)
    else:
        con = sqlite3.connect(path, isolation_level=None)
    con.text_factory = lambda b: b.decode("utf-8", errors="replace")
    if timeout_s is not None:
        deadline = time.monotonic() + timeout_s
        con.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 10_000)
    return con


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _materialize(con: sqlite3.Connection, sql: str, table: str, *, trusted_after_fetch: bool = False) -> int:
    """Run one SELECT and store its result as `table(__pos, c0..)`. Returns the number of columns.
    `trusted_after_fetch`: remove the connection's authorizer once the rows are fetched (the SELECT was
    policy SQL; storing its rows is ours)."""
    cur = con.execute(sql)
    if cur.description is None:
        raise sqlite3.OperationalError("the submission of a query task must be a SELECT returning rows")
    ncol = len(cur.description)
    rows = cur.fetchmany(MAX_RESULT_ROWS + 1)
    cur.close()
    if trusted_after_fetch:
        con.set_authorizer(None)
    if len(rows) > MAX_RESULT_ROWS:
        raise sqlite3.OperationalError(f"result has more than {MAX_RESULT_ROWS} rows")
    cols = ", ".join(["__pos INTEGER"] + [f"c{i}" for i in range(ncol)])
    con.execute(f"DROP TABLE IF EXISTS {_q(table)}")
    con.execute(f"CREATE TABLE {_q(table)} ({cols})")
    ph = ", ".join("?" * (ncol + 1))
    con.execute("BEGIN")
    con.executemany(f"INSERT INTO {_q(table)} VALUES ({ph})", [(i, *r) for i, r in enumerate(rows)])
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
    con = _connect(str(dest), timeout_s)
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
    """Apply a submitted solution to the state (see the module docstring). Returns None or an error message."""
    pub = task.public if isinstance(task, DebugTaskPrivate) else task
    stmts = _as_list(sql)
    if not stmts:
        return "empty submission"
    from sqlrl.sql.guard import write_authorizer

    con = _connect(str(state_db_path), timeout_s)
    try:
        # the submission is policy SQL: the replica pool's authorizer applies to it too (no ATTACH,
        # no transactions, no state-changing pragmas, no denied functions); our own statements after
        # it (materializing a query's result) run without it
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
    con = _connect(str(state_db_path), timeout_s)
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
    con = _connect(str(state_db_path), timeout_s)
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


# ------------------------------------------------------------------------------------ query mutation

MUTATION_KINDS = (
    "wrong_column",
    "wrong_aggregate",
    "drop_condition",
    "comparison",
    "order_direction",
    "limit_off_by_one",
    "drop_distinct",
    "wrong_join_key",
)


def _table_columns(db_path: str) -> dict[str, list[tuple[str, str]]]:
    con = sqlite3.connect(Path(db_path).resolve().as_uri() + "?mode=ro", uri=True)
    con.text_factory = lambda b: b.decode("utf-8", errors="replace")
    try:
        out = {}
        names = [
            r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY rowid")
        ]
        for n in names:
            if n.startswith("sqlite_"):
                continue
            cols = con.execute(f"PRAGMA table_info({_q(n)})").fetchall()
            out[n.lower()] = [(c[1], (c[2] or "").upper()) for c in cols]
        return out
    finally:
        con.close()


def _id_like(col: str) -> bool:
    c = col.lower()
    return c.endswith("id") or "_id" in c or c.endswith("code") or c.endswith("_no")


def _numeric(typ: str) -> bool:
    return any(k in typ for k in ("INT", "REAL", "NUM", "DEC", "FLOA", "DOUB"))


def mutate_query(
    sql: str,
    columns: dict[str, list[tuple[str, str]]],
    rng: random.Random,
    kinds: tuple[str, ...] = MUTATION_KINDS,
) -> tuple[str, str] | None:
    """One plausible bug in a SELECT: returns (buggy_sql, kind) or None when no mutation applies.

    Tries the kinds in an rng-shuffled order; the result parses and differs from the normalized input.
    """
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(sql, read="sqlite")
        base = tree.sql(dialect="sqlite")
    except Exception:
        return None
    if not isinstance(tree, exp.Select):
        return None
    order = list(kinds)
    rng.shuffle(order)
    for kind in order:
        t = tree.copy()
        if not _apply_mutation(t, kind, columns, rng, exp):
            continue
        try:
            out = t.sql(dialect="sqlite")
            sqlglot.parse_one(out, read="sqlite")
        except Exception:
            continue
        if out != base:
            return out, kind
    return None


def _alias_map(t, exp) -> dict[str, str]:
    m = {}
    for tb in t.find_all(exp.Table):
        m[tb.alias_or_name.lower()] = tb.name.lower()
        m[tb.name.lower()] = tb.name.lower()
    return m


def _resolve_table(col, amap, columns, exp) -> str | None:
    if col.table:
        return amap.get(col.table.lower())
    tables = sorted(set(amap.values()))
    owners = [tb for tb in tables if any(c.lower() == col.name.lower() for c, _ in columns.get(tb, []))]
    return owners[0] if len(owners) == 1 else None


def _swap_column(col, columns, amap, rng, exp, prefer_key: bool = False) -> bool:
    tb = _resolve_table(col, amap, columns, exp)
    if tb is None or tb not in columns:
        return False
    mine = [c for c in columns[tb] if c[0].lower() == col.name.lower()]
    if not mine:
        return False
    typ = mine[0][1]
    cands = [c for c, ty in columns[tb] if c.lower() != col.name.lower() and _numeric(ty) == _numeric(typ)]
    if prefer_key:
        keyish = [c for c in cands if "id" in c.lower() or "code" in c.lower() or "num" in c.lower()]
        cands = keyish or cands
    if not cands:
        return False
    new = rng.choice(sorted(cands))
    col.set("this", exp.to_identifier(new, quoted=not new.replace("_", "").isalnum() or " " in new))
    return True


def _apply_mutation(t, kind, columns, rng, exp) -> bool:  # noqa: C901 - a flat dispatch
    amap = _alias_map(t, exp)
    if kind == "wrong_column":
        cols = [
            c
            for c in t.find_all(exp.Column)
            if not isinstance(c.this, exp.Star) and c.find_ancestor(exp.Join) is None
        ]
        rng.shuffle(cols)
        return any(_swap_column(c, columns, amap, rng, exp) for c in cols[:4])
    if kind == "wrong_join_key":
        eqs = [j.args.get("on") for j in t.find_all(exp.Join) if isinstance(j.args.get("on"), exp.EQ)]
        if not eqs:
            return False
        eq = rng.choice(eqs)
        sides = [s for s in (eq.this, eq.expression) if isinstance(s, exp.Column)]
        rng.shuffle(sides)
        return any(_swap_column(c, columns, amap, rng, exp, prefer_key=True) for c in sides)
    if kind == "wrong_aggregate":
        swaps = {exp.Max: exp.Min, exp.Min: exp.Max, exp.Avg: exp.Sum, exp.Sum: exp.Avg}
        aggs = [a for a in t.find_all(exp.Max, exp.Min, exp.Avg, exp.Sum)]
        cnts = [a for a in t.find_all(exp.Count) if not isinstance(a.this, exp.Star) and a.this is not None]
        if not aggs and not cnts:
            return False
        node = rng.choice(aggs + cnts)
        if isinstance(node, exp.Count):
            if isinstance(node.this, exp.Distinct):
                node.set("this", node.this.expressions[0].copy())
            else:
                node.set("this", exp.Distinct(expressions=[node.this.copy()]))
            return True
        node.replace(swaps[type(node)](this=node.this.copy()))
        return True
    if kind == "drop_condition":
        where = t.args.get("where")
        ands = [a for a in t.find_all(exp.And) if a.find_ancestor(exp.Where) is where and where is not None]
        if ands:
            a = rng.choice(ands)
            a.replace((a.this if rng.random() < 0.5 else a.expression).copy())
            return True
        if where is not None and not list(where.find_all(exp.Select)):
            t.set("where", None)
            return True
        return False
    if kind == "comparison":
        swaps = {exp.GT: exp.GTE, exp.GTE: exp.GT, exp.LT: exp.LTE, exp.LTE: exp.LT, exp.EQ: exp.NEQ}
        nodes = [n for n in t.find_all(exp.GT, exp.GTE, exp.LT, exp.LTE) if n.find_ancestor(exp.Join) is None]
        if not nodes:
            nodes = [
                n
                for n in t.find_all(exp.EQ)
                if n.find_ancestor(exp.Where) is not None and not isinstance(n.expression, exp.Column)
            ]
        if not nodes:
            return False
        n = rng.choice(nodes)
        n.replace(swaps[type(n)](this=n.this.copy(), expression=n.expression.copy()))
        return True
    if kind == "order_direction":
        ords = list(t.find_all(exp.Ordered))
        if not ords:
            return False
        o = rng.choice(ords)
        o.set("desc", not o.args.get("desc"))
        return True
    if kind == "limit_off_by_one":
        lim = t.args.get("limit")
        if lim is None or not isinstance(lim.expression, exp.Literal) or not lim.expression.is_int:
            return False
        n = int(lim.expression.this)
        new = n + 1 if (n <= 1 or rng.random() < 0.5) else n - 1
        lim.set("expression", exp.Literal.number(new))
        return True
    if kind == "drop_distinct":
        if t.args.get("distinct") is not None:
            t.set("distinct", None)
            return True
        return False
    return False


# ------------------------------------------------------------------------------------------- builder

_QUERY_TEMPLATES = (
    'I need to answer this question: "{q}" My SQL below runs, but the result is not what I expect. '
    "Can you fix it?",
    'Question from my manager: "{q}" I wrote the query below, but the numbers look wrong. '
    "Please correct the query.",
    'I\'m trying to get: "{q}" The query I have returns the wrong rows. What is wrong with it?',
)


def _fmt_value(v: Any) -> str:
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return repr(v)


@dataclass
class _DbInfo:
    db_id: str
    db_path: str
    schema: str
    columns: dict[str, list[tuple[str, str]]]


def _query_tasks(info: _DbInfo, examples: list[dict], rng: random.Random, n: int, dropped: dict):
    out = []
    idx = list(range(len(examples)))
    rng.shuffle(idx)
    for i in idx:
        if len(out) >= n:
            break
        ex = examples[i]
        gold = ex["query"].strip().rstrip(";")
        m = mutate_query(gold, info.columns, rng)
        if m is None:
            dropped["no_mutation"] = dropped.get("no_mutation", 0) + 1
            continue
        buggy, kind = m
        # reference result shape
        try:
            con = _connect(info.db_path, 5.0, read_only=True)
        except sqlite3.Error:
            continue
        try:
            cur = con.execute(gold)
            ncol = len(cur.description or [])
            cur.fetchall()
        except sqlite3.Error:
            dropped["gold_error"] = dropped.get("gold_error", 0) + 1
            continue
        finally:
            con.close()
        ordered = "order by" in gold.lower()
        desc = rng.choice(_QUERY_TEMPLATES).format(q=ex["question"].strip())
        out.append(
            (
                "query",
                desc,
                buggy,
                [],
                [gold],
                query_test_cases(ncol, ordered),
                [f"DROP TABLE IF EXISTS {SUBMITTED_TABLE}"],
                {"mutation": kind, "source": f"train_spider/{ex['__index']:05d}"},
            )
        )
    return out


def _sample_rows(con, table: str, col: str, rng: random.Random) -> list:
    vals = [
        r[0] for r in con.execute(f"SELECT DISTINCT {_q(col)} FROM {_q(table)} WHERE {_q(col)} IS NOT NULL")
    ]
    vals = sorted(vals, key=lambda v: (type(v).__name__, v))
    return vals


def _management_tasks(info: _DbInfo, rng: random.Random, n: int, dropped: dict):  # noqa: C901
    out = []
    con = sqlite3.connect(Path(info.db_path).resolve().as_uri() + "?mode=ro", uri=True)
    con.text_factory = lambda b: b.decode("utf-8", errors="replace")
    try:
        tables = []
        for tb in sorted(info.columns):
            try:
                cnt = con.execute(f"SELECT count(*) FROM {_q(tb)}").fetchone()[0]
                con.execute(f"SELECT rowid FROM {_q(tb)} LIMIT 1").fetchall()
            except sqlite3.Error:
                continue
            if cnt >= 2:
                tables.append(tb)
        if not tables:
            dropped["no_table"] = dropped.get("no_table", 0) + 1
            return out
        real_names = {
            r[0].lower(): r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        kinds = ["update_scale", "delete_where", "add_column", "create_index", "rename_column"]
        rng.shuffle(kinds)
        attempts = 0
        while len(out) < n and attempts < 4 * n:
            kind = kinds[attempts % len(kinds)]
            attempts += 1
            tb = rng.choice(tables)
            T = real_names.get(tb, tb)
            cols = info.columns[tb]
            num = [c for c, ty in cols if _numeric(ty)]
            txt = [c for c, ty in cols if not _numeric(ty)]
            qT = _q(T)
            task = None
            upd = [c for c in num if not _id_like(c)]
            if kind == "update_scale" and upd and (txt or len(num) > 1):
                target = rng.choice(upd)
                fcols = [c for c in (txt + num) if c != target]
                fcol = rng.choice(fcols)
                vals = _sample_rows(con, T, fcol, rng)
                tvals = [
                    r[0]
                    for r in con.execute(
                        f"SELECT {_q(target)} FROM {qT} WHERE typeof({_q(target)}) IN ('integer','real') LIMIT 1"
                    )
                ]
                if len(vals) < 2 or not tvals:
                    continue
                v = rng.choice(vals)
                pct = rng.choice([5, 10, 15, 20, 25])
                fac = f"{1 + pct / 100:.2f}"
                cond = f"{_q(fcol)} = {_fmt_value(v)}"
                sol = f"UPDATE {qT} SET {_q(target)} = {_q(target)} * {fac} WHERE {cond}"
                bug_kind = rng.choice(["factor", "where"])
                if bug_kind == "factor":
                    buggy = f"UPDATE {qT} SET {_q(target)} = {_q(target)} * {pct / 100:.2f} WHERE {cond}"
                else:
                    buggy = f"UPDATE {qT} SET {_q(target)} = {_q(target)} * {fac} WHERE {_q(fcol)} <> {_fmt_value(v)}"
                close = f"(a.{_q(target)} IS b.{_q(target)} OR abs(a.{_q(target)} - b.{_q(target)}) <= 1e-6)"
                join = f"FROM ref.{qT} b LEFT JOIN main.{qT} a ON a.rowid = b.rowid"
                tests = [
                    f"SELECT NOT EXISTS (SELECT 1 {join} WHERE b.{cond} AND (a.rowid IS NULL OR NOT {close}))",
                    f"SELECT NOT EXISTS (SELECT 1 {join} WHERE (b.{cond}) IS NOT 1 AND (a.rowid IS NULL OR NOT {close}))",
                    f"SELECT (SELECT count(*) FROM main.{qT}) = (SELECT count(*) FROM ref.{qT})",
                ]
                desc = (
                    f"In table {T}, I want to increase {target} by {pct}% for every row whose {fcol} is "
                    f"{_fmt_value(v)}; other rows must stay unchanged. My statement below does not do that."
                )
                task = ("management", desc, buggy, [], [sol], tests, [], {"kind": kind, "bug": bug_kind})
            elif kind == "delete_where" and num:
                col = rng.choice(num)
                vals = [x for x in _sample_rows(con, T, col, rng) if isinstance(x, int | float)]
                if len(vals) < 3:
                    continue
                v = vals[len(vals) // 2]
                sol = f"DELETE FROM {qT} WHERE {_q(col)} > {v!r}"
                bug_kind = rng.choice(["boundary", "direction"])
                op = ">=" if bug_kind == "boundary" else "<"
                buggy = f"DELETE FROM {qT} WHERE {_q(col)} {op} {v!r}"
                tests = [
                    f"SELECT count(*) = 0 FROM main.{qT} WHERE {_q(col)} > {v!r}",
                    f"SELECT NOT EXISTS (SELECT rowid FROM ref.{qT} EXCEPT SELECT rowid FROM main.{qT})",
                    f"SELECT (SELECT count(*) FROM main.{qT}) = (SELECT count(*) FROM ref.{qT})",
                ]
                desc = (
                    f"I need to delete every row of {T} whose {col} is greater than {v!r} and keep all "
                    "other rows. My statement below deletes the wrong rows."
                )
                task = ("management", desc, buggy, [], [sol], tests, [], {"kind": kind, "bug": bug_kind})
            elif kind == "add_column":
                new = rng.choice(["is_active", "priority", "review_flag", "version", "score_bonus"])
                if any(c.lower() == new for c, _ in cols):
                    continue
                d = rng.choice([0, 1, 5, 10])
                sol = f"ALTER TABLE {qT} ADD COLUMN {new} INTEGER DEFAULT {d}"
                others = [x for x in tables if x != tb]
                bug_kind = rng.choice(["default", "table"] if others else ["default"])
                if bug_kind == "default":
                    buggy = f"ALTER TABLE {qT} ADD COLUMN {new} INTEGER"
                else:
                    buggy = f"ALTER TABLE {_q(real_names.get(others[0], others[0]))} ADD COLUMN {new} INTEGER DEFAULT {d}"
                tests = [
                    f"SELECT count(*) = 1 FROM pragma_table_info('{T}') WHERE name = '{new}'",
                    f"SELECT (SELECT count(*) FROM main.{qT} WHERE {new} IS {d}) = (SELECT count(*) FROM ref.{qT})",
                    f"SELECT upper(type) = 'INTEGER' FROM pragma_table_info('{T}') WHERE name = '{new}'",
                ]
                desc = (
                    f"Add an INTEGER column named {new} to the table {T}; every existing and future row "
                    f"should get the default value {d}. My statement below is not right."
                )
                task = ("management", desc, buggy, [], [sol], tests, [], {"kind": kind, "bug": bug_kind})
            elif kind == "create_index" and len(cols) >= 2:
                col = rng.choice([c for c, _ in cols])
                iname = f"idx_{tb}_{col}".lower().replace(" ", "_")
                if not iname.replace("_", "").isalnum():
                    continue
                other = rng.choice([c for c, _ in cols if c != col])
                sol = f"CREATE INDEX {iname} ON {qT} ({_q(col)})"
                bug_kind = rng.choice(["column", "composite"])
                if bug_kind == "column":
                    buggy = f"CREATE INDEX {iname} ON {qT} ({_q(other)})"
                else:
                    buggy = f"CREATE INDEX {iname} ON {qT} ({_q(other)}, {_q(col)})"
                tests = [
                    f"SELECT count(*) = 1 FROM sqlite_master WHERE type = 'index' AND name = '{iname}' "
                    f"AND lower(tbl_name) = '{tb}'",
                    f"SELECT count(*) = 1 FROM pragma_index_info('{iname}')",
                    f"SELECT lower(name) = '{col.lower()}' FROM pragma_index_info('{iname}') WHERE seqno = 0",
                ]
                desc = (
                    f"Lookups on {T} by {col} are slow. I want an index named {iname} on {T}({col}) and "
                    "nothing else. My statement below builds the wrong index."
                )
                task = (
                    "management",
                    desc,
                    buggy,
                    [],
                    [sol],
                    tests,
                    [f"DROP INDEX IF EXISTS {iname}"],
                    {"kind": kind, "bug": bug_kind},
                )
            elif kind == "rename_column" and len(cols) >= 2:
                # only columns no view/trigger/index mentions, to keep ALTER simple
                col, other = rng.sample([c for c, _ in cols], 2)
                new = f"{col}_old".lower().replace(" ", "_")
                if not new.replace("_", "").isalnum() or any(c.lower() == new for c, _ in cols):
                    continue
                sol = f"ALTER TABLE {qT} RENAME COLUMN {_q(col)} TO {new}"
                buggy = f"ALTER TABLE {qT} RENAME COLUMN {_q(other)} TO {new}"
                tests = [
                    f"SELECT count(*) = 1 FROM pragma_table_info('{T}') WHERE name = '{new}'",
                    f"SELECT count(*) = 0 FROM pragma_table_info('{T}') WHERE lower(name) = '{col.lower()}'",
                    f"SELECT count(*) = {len(cols)} FROM pragma_table_info('{T}')",
                    f"SELECT count(*) = 1 FROM pragma_table_info('{T}') WHERE lower(name) = '{other.lower()}'",
                ]
                desc = (
                    f"We are retiring the column {col} of {T}: rename it to {new}, keeping its data. "
                    "My statement below renames the wrong thing."
                )
                task = ("management", desc, buggy, [], [sol], tests, [], {"kind": kind, "bug": "column"})
            if task is not None and "'" not in T:
                out.append(task)
    finally:
        con.close()
    return out


def _personalization_tasks(info: _DbInfo, examples: list[dict], rng: random.Random, n: int, dropped: dict):
    out = []
    idx = list(range(len(examples)))
    rng.shuffle(idx)
    for i in idx:
        if len(out) >= n:
            break
        ex = examples[i]
        gold = ex["query"].strip().rstrip(";")
        m = mutate_query(
            gold, info.columns, rng, kinds=tuple(k for k in MUTATION_KINDS if k != "order_direction")
        )
        if m is None:
            dropped["no_mutation"] = dropped.get("no_mutation", 0) + 1
            continue
        buggy_sel, kind = m
        vname = f"v_{info.db_id}_{i:05d}"
        sol = f"CREATE VIEW {vname} AS {gold}"
        buggy = f"CREATE VIEW {vname} AS {buggy_sel}"
        tests = [
            f"SELECT count(*) = 1 FROM sqlite_master WHERE type = 'view' AND name = '{vname}'",
            f"SELECT (SELECT count(*) FROM main.{vname}) = (SELECT count(*) FROM ref.{vname}) AND NOT EXISTS "
            f"(SELECT * FROM main.{vname} EXCEPT SELECT * FROM ref.{vname}) AND NOT EXISTS "
            f"(SELECT * FROM ref.{vname} EXCEPT SELECT * FROM main.{vname})",
        ]
        desc = (
            f'I want a saved view named {vname} that answers: "{ex["question"].strip()}" so my dashboard '
            "can read it. The view I created below shows the wrong data; please give me the corrected "
            "CREATE VIEW statement."
        )
        out.append(
            (
                "personalization",
                desc,
                buggy,
                [f"DROP VIEW IF EXISTS {vname}"],
                [sol],
                tests,
                [f"DROP VIEW IF EXISTS {vname}"],
                {"mutation": kind, "source": f"train_spider/{ex['__index']:05d}"},
            )
        )
    return out


def build_debug_tasks(
    spider_root: str | os.PathLike,
    *,
    seed: int = 0,
    per_db: int = 6,
    db_ids: list[str] | None = None,
    split_seed: int = 0,
    val_fraction: float = 0.1,
    timeout_s: float = 5.0,
) -> tuple[list[DebugTaskPrivate], dict]:
    """Build and validate debugging tasks from Spider's training databases. Returns (tasks, stats).

    Per database (sorted ids, rng seeded with f"{seed}:{db_id}"): up to ceil(per_db/2) query tasks,
    per_db//3 management tasks and per_db//6 personalization tasks (at least one each when
    per_db >= 3), candidates generated then validated; failing candidates are dropped and counted.
    """
    from sqlrl.tasks.data import schema_text, split_by_database

    root = Path(spider_root).expanduser().resolve()
    src = root / "train_spider.json"
    if not src.is_file():
        src = root / "train.json"
    raw = json.loads(src.read_text(encoding="utf-8"))
    by_db: dict[str, list[dict]] = {}
    for i, ex in enumerate(raw):
        by_db.setdefault(ex["db_id"], []).append({**ex, "__index": i})
    all_ids = sorted(by_db)
    train_ids, val_ids = split_by_database(all_ids, split_seed, val_fraction)
    val_set = set(val_ids)
    chosen = sorted(db_ids) if db_ids is not None else all_ids
    n_q = max(1, (per_db + 1) // 2)
    n_m = max(1, per_db // 3)
    n_p = max(1, per_db // 6) if per_db >= 3 else 0
    tasks: list[DebugTaskPrivate] = []
    dropped: dict[str, int] = {}
    for db_id in chosen:
        db_path = root / "database" / db_id / f"{db_id}.sqlite"
        if not db_path.is_file() or db_id not in by_db:
            dropped["missing_database"] = dropped.get("missing_database", 0) + 1
            continue
        info = _DbInfo(db_id, str(db_path), schema_text(str(db_path)), _table_columns(str(db_path)))
        rng = random.Random(f"{seed}:{db_id}")
        cands = []
        cands += _query_tasks(info, by_db[db_id], rng, n_q, dropped)
        cands += _management_tasks(info, rng, n_m, dropped)
        if n_p:
            cands += _personalization_tasks(info, by_db[db_id], rng, n_p, dropped)
        k = 0
        for cat, desc, buggy, pre, sol, tests, cu, meta in cands:
            pub = DebugTaskPublic(
                task_id=f"debug/{db_id}/{k:03d}",
                db_id=db_id,
                category=cat,
                description=desc,
                schema=info.schema,
                buggy_sql=buggy,
                preprocess_sql=tuple(pre),
                db_path=str(db_path),
            )
            t = DebugTaskPrivate(
                public=pub,
                solution_sql=sol,
                test_cases=tests,
                clean_up_sql=cu,
                split="validation" if db_id in val_set else "train",
                meta=meta,
            )
            reason = validate_task(t, timeout_s=timeout_s)
            if reason:
                key = f"{cat}:{reason}"
                dropped[key] = dropped.get(key, 0) + 1
                continue
            tasks.append(t)
            k += 1
    stats: dict[str, Any] = {
        "version": DEBUG_FORMAT_VERSION,
        "seed": seed,
        "per_db": per_db,
        "split_seed": split_seed,
        "val_fraction": val_fraction,
        "n_databases": len(chosen),
        "n_tasks": len(tasks),
        "per_category": {c: sum(t.category == c for t in tasks) for c in CATEGORIES},
        "per_split": {s: sum(t.split == s for t in tasks) for s in ("train", "validation")},
        "per_split_category": {
            s: {c: sum(t.split == s and t.category == c for t in tasks) for c in CATEGORIES}
            for s in ("train", "validation")
        },
        "dropped": dict(sorted(dropped.items())),
        "per_kind": _count_kinds(tasks),
    }
    return tasks, stats


def _count_kinds(tasks: list[DebugTaskPrivate]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in tasks:
        k = f"{t.category}:{t.meta.get('mutation') or t.meta.get('kind')}"
        out[k] = out.get(k, 0) + 1
    return dict(sorted(out.items()))
