"""Execute each gold SQL once, cache the result, and say which golds cannot be scored and why.

`GoldCache.get(db_path, sql)` runs the gold through the sandbox (or any object with the same
`execute(db_path, sql, timeout_s=None)`) with a generous timeout (60 s by default) and caches the
`GoldResult` under (sha256 of the database file, sha256 of the exact SQL text), in memory and
optionally in one SQLite file, `gold_cache.v1.sqlite`, in `cache_dir`. Statuses: `ok` (at least one
row), `empty`, `timeout`, `too_many_rows` / `too_large` (over the caps a prediction has,
`sqlrl.sql.result.MAX_ROWS` / `MAX_RESULT_BYTES`: unscorable, never a mismatch), `error` (anything else
the sandbox reports), `unstable` (not run: the gold calls random() or reads the clock, so its result is
not a fixed answer: `unstable_gold`); `scorable` is ok with rows.

What is covered:
- a gold runs at most once per (database bytes, SQL text) per cache; a cached `timeout` is trusted
  only if measured with a timeout at least as long as the current one; `worker_crash` is retried,
  never cached;
- every disk write is one SQLite transaction; each entry stores its payload's sha256, and an entry
  failing it is re-executed; a file SQLite cannot open or that fails `PRAGMA quick_check` is moved
  aside to `*.corrupt-<time>` with a warning: nothing corrupt is silently trusted;
- values round-trip exactly (floats via `repr`, bytes as hex); rows come back as tuples;
- `get` refuses (ValueError) a cache inside a database's folder, so the policy cannot read golds.

What is not:
- the SQL text is hashed exactly as given: whitespace changes are a different key;
- concurrent writers are serialized by SQLite locking (busy timeout 30 s); on network file systems
  without working locks, use one cache folder per process.
"""

from __future__ import annotations

import hashlib
import json
import logging
import marshal
import os
import re
import sqlite3
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlrl.sql.engine import seconds
from sqlrl.sql.result import MAX_RESULT_BYTES, MAX_ROWS
from sqlrl.tasks.data import file_sha256
from sqlrl.tasks.goldaudit import GoldAudit, audit_golds, no_bars

log = logging.getLogger(__name__)

__all__ = [
    "GoldAudit",
    "GoldCache",
    "GoldCacheError",
    "GoldResult",
    "audit_golds",
    "no_bars",
    "decode_value",
    "encode_value",
]

CACHE_FILE = "gold_cache.v1.sqlite"
DEFAULT_TIMEOUT_S = 60.0
PROGRESS_MIN_TASKS = 100
_SQL_SHAS_MAX = 65536

_REASONS = {s: "gold_" + s for s in ("error", "timeout", "empty", "too_many_rows", "too_large", "unstable")}
_RANDOM = re.compile(r"\brandom(?:blob)?\s*\(", re.I)
# the clock: CURRENT_DATE/TIME/TIMESTAMP, a date function given 'now' (its arguments up to the literal
# hold no parenthesis) or called with no argument
_CLOCK = re.compile(
    r"\bcurrent_(?:date|time|timestamp)\b"
    r"|\b(?:date|time|datetime|julianday|strftime|unixepoch|timediff)\s*\((?:[^()']|'[^']*')*?'now'"
    r"|\b(?:date|time|datetime|julianday|unixepoch)\s*\(\s*\)",
    re.I,
)


@lru_cache(maxsize=65536)
def unstable_gold(sql: str) -> str | None:
    """Why a gold's result is not a fixed answer (it calls random() or reads the clock), or None. Such a
    gold is `unstable`, unscorable: its cached result would be compared with a prediction run at
    another time. A string literal holding such text counts too (a needless exclusion, never a wrong
    score); no Spider train gold matches. Remembered per text: every `get_many` asks, every step. Not
    `reward.reproducible.is_deterministic_sql`, which also flags date functions of stored values
    (`strftime('%Y', col)`: a safe cache miss there, a wrongly excluded task here)."""
    if _RANDOM.search(sql):
        return "the gold calls random(): its result changes from run to run"
    if _CLOCK.search(sql):
        return "the gold reads the clock ('now', CURRENT_DATE, ...): its result changes with the date"
    return None


class GoldCacheError(RuntimeError):
    """Infrastructure failure while executing a gold (not a property of the gold itself)."""


# ------------------------------------------------------------------------------------------ values


def encode_value(v: Any) -> Any:
    """JSON-safe, exactly reversible encoding of one SQLite value."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool):  # never produced by sqlite3, but keep it from turning into an int
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return {"f": repr(v)}
    if isinstance(v, bytes | bytearray | memoryview):
        return {"b": bytes(v).hex()}
    raise TypeError(f"cannot cache a value of type {type(v).__name__}")


def decode_value(v: Any) -> Any:
    if isinstance(v, dict):
        if "f" in v:
            return float(v["f"])
        if "b" in v:
            return bytes.fromhex(v["b"])
        raise ValueError(f"unknown encoded value {v!r}")
    return v


# ------------------------------------------------------------------------------------------ result


@dataclass(frozen=True)
class GoldResult:
    status: str  # ok | error | timeout | empty | too_many_rows | too_large | unstable
    columns: list[str]
    rows: list[tuple]
    row_count: int
    message: str = ""
    elapsed_ms: float = 0.0
    caps: tuple[int, int] = (0, 0)  # (max_rows, max_result_bytes) a too_many_rows / too_large was found under

    @property
    def scorable(self) -> bool:
        return self.status == "ok" and self.row_count > 0

    @property
    def unscorable_reason(self) -> str | None:
        """None when scorable, else gold_error | gold_timeout | gold_empty | gold_too_many_rows |
        gold_too_large | gold_unstable."""
        if self.scorable:
            return None
        return _REASONS.get(self.status, "gold_empty" if self.status == "ok" else "gold_error")

    def to_dict(self) -> dict:
        return {
            "status": self.status,
            "columns": list(self.columns),
            "rows": [[encode_value(v) for v in r] for r in self.rows],
            "row_count": self.row_count,
            "message": self.message,
            "elapsed_ms": self.elapsed_ms,
            **({"caps": list(self.caps)} if self.caps != (0, 0) else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> GoldResult:
        return cls(
            status=d["status"],
            columns=list(d["columns"]),
            rows=[tuple(decode_value(v) for v in r) for r in d["rows"]],
            row_count=int(d["row_count"]),
            message=d.get("message", ""),
            elapsed_ms=float(d.get("elapsed_ms", 0.0)),
            caps=(int(d["caps"][0]), int(d["caps"][1])) if "caps" in d else (0, 0),
        )


def _from_sql_result(res: Any, caps: tuple[int, int] = (0, 0)) -> GoldResult:
    status = getattr(res, "status", None)
    columns = list(getattr(res, "columns", None) or [])
    rows = [tuple(r) for r in (getattr(res, "rows", None) or [])]
    row_count = int(getattr(res, "row_count", len(rows)) or 0)
    message = str(getattr(res, "message", "") or "")
    elapsed = float(getattr(res, "elapsed_ms", 0.0) or 0.0)
    if status == "ok":
        return GoldResult("ok" if row_count > 0 else "empty", columns, rows, row_count, message, elapsed)
    if status == "timeout":
        return GoldResult("timeout", columns, [], 0, message or "timeout", elapsed)
    if status in ("too_many_rows", "too_large"):  # the rows kept up to the cap are not a result
        return GoldResult(status, [], [], 0, f"{status}: {message}".strip(), elapsed, caps)
    return GoldResult("error", [], [], 0, f"{status}: {message}".strip(), elapsed)


def _checksum(payload: str) -> str:
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


# ------------------------------------------------------------------------------------------- cache


class GoldCache:
    """Gold results cached by (db sha256, sql sha256); memory in front of an optional SQLite file.

    `executor`: an object with `execute(db_path, sql, timeout_s=None)` returning a sandbox
    `SQLResult`-like object; by default a `sqlrl.sql.sandbox.Sandbox(workers=workers, timeout_s=timeout_s,
    ...)` is built on first use and closed by `close()`. Use as a context manager.
    `max_rows` / `max_result_bytes`: the caps of a scorable gold, those of the predictions' sandbox
    (default `sqlrl.sql.result.MAX_ROWS` / `MAX_RESULT_BYTES`); a gold over them is `too_many_rows` /
    `too_large`, whatever cached it before.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike | None = None,
        *,
        executor: Any = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        workers: int = 2,
        retries: int = 2,
        max_rows: int = MAX_ROWS,
        max_result_bytes: int = MAX_RESULT_BYTES,
    ):
        self.cache_dir = Path(cache_dir).expanduser().resolve() if cache_dir is not None else None
        self.timeout_s = seconds(timeout_s, "GoldCache: timeout_s")  # NaN / inf would never stop a gold
        self.workers = int(workers)
        self.retries = int(retries)
        self.max_rows = int(max_rows)
        self.max_result_bytes = int(max_result_bytes)
        self._caps = (self.max_rows, self.max_result_bytes)
        self._executor = executor
        self._own_executor = executor is None
        self._mem: dict[tuple[str, str], tuple[GoldResult, float]] = {}
        self._lock = threading.RLock()
        self._db: sqlite3.Connection | None = None
        self._checked_dirs: set[Path] = set()
        self._resolved: dict[str, tuple[tuple, tuple[str, str]]] = {}  # given path -> (stat, result)
        self._sql_shas: dict[str, str] = {}  # SQL text -> its sha256 (bounded, see `_sql_sha`)
        self.hits = 0
        self.misses = 0
        self.executions = 0
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            self._db = self._open_disk()

    # ---- lifecycle

    def __enter__(self) -> GoldCache:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
            if self._own_executor and self._executor is not None:
                close = getattr(self._executor, "close", None)
                if close is not None:
                    close()
                self._executor = None

    @property
    def path(self) -> Path | None:
        return self.cache_dir / CACHE_FILE if self.cache_dir is not None else None

    @property
    def executor(self) -> Any:
        if self._executor is None:
            self._executor = self._make_sandbox()
        return self._executor

    def _make_sandbox(self) -> Any:
        import inspect

        from sqlrl.sql.sandbox import Sandbox

        kwargs: dict[str, Any] = {"workers": self.workers, "timeout_s": self.timeout_s}
        try:
            params = inspect.signature(Sandbox).parameters
        except (TypeError, ValueError):
            params = {}
        # a gold is scorable within the caps a prediction has
        if "max_rows" in params:
            kwargs["max_rows"] = self.max_rows
        if "max_result_bytes" in params:
            kwargs["max_result_bytes"] = self.max_result_bytes
        if "hard_timeout_s" in params:
            kwargs["hard_timeout_s"] = self.timeout_s + 30.0
        return Sandbox(**kwargs)

    # ---- disk

    def _open_disk(self) -> sqlite3.Connection:
        path = self.path
        assert path is not None
        try:
            con = self._connect(path)
        except sqlite3.DatabaseError as e:
            self._move_aside(path, str(e))
            con = self._connect(path)
        return con

    def _connect(self, path: Path) -> sqlite3.Connection:
        con = sqlite3.connect(str(path), timeout=30.0, check_same_thread=False, isolation_level=None)
        try:
            con.execute("PRAGMA busy_timeout = 30000")
            ok = con.execute("PRAGMA quick_check").fetchone()
            if not ok or ok[0] != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {ok}")
            con.execute(
                "CREATE TABLE IF NOT EXISTS gold ("
                " db_sha TEXT NOT NULL, sql_sha TEXT NOT NULL, timeout_s REAL NOT NULL,"
                " payload TEXT NOT NULL, checksum TEXT NOT NULL, created REAL NOT NULL,"
                " PRIMARY KEY (db_sha, sql_sha))"
            )
        except sqlite3.DatabaseError:
            con.close()
            raise
        return con

    def _move_aside(self, path: Path, why: str) -> None:
        bad = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        for suffix in ("", "-journal", "-wal", "-shm"):
            p = Path(str(path) + suffix)
            if p.exists():
                os.replace(p, Path(str(bad) + suffix))
        msg = f"gold cache {path} is unreadable ({why}); moved it to {bad} and starting an empty cache"
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
        log.warning(f"sqlrl: warning: {msg}")

    def _disk_get(self, key: tuple[str, str]) -> tuple[GoldResult, float] | None:
        if self._db is None:
            return None
        row = self._db.execute(
            "SELECT timeout_s, payload, checksum FROM gold WHERE db_sha = ? AND sql_sha = ?", key
        ).fetchone()
        if row is None:
            return None
        timeout_s, payload, checksum = row
        if _checksum(payload) != checksum:
            warnings.warn(
                f"gold cache entry {key} fails its checksum; re-executing", RuntimeWarning, stacklevel=3
            )
            return None
        try:
            return GoldResult.from_dict(json.loads(payload)), float(timeout_s)
        except (ValueError, KeyError, TypeError) as e:
            warnings.warn(
                f"gold cache entry {key} is malformed ({e}); re-executing", RuntimeWarning, stacklevel=3
            )
            return None

    def _disk_put_many(self, entries: list[tuple[tuple[str, str], GoldResult, float]]) -> None:
        if self._db is None or not entries:
            return
        now = time.time()
        data = []
        for key, result, timeout_s in entries:
            payload = json.dumps(result.to_dict(), ensure_ascii=False, allow_nan=False)
            data.append((key[0], key[1], timeout_s, payload, _checksum(payload), now))
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.executemany("INSERT OR REPLACE INTO gold VALUES (?, ?, ?, ?, ?, ?)", data)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    # ---- lookups

    def _check_location(self, db_path: Path) -> None:
        if self.cache_dir is None:
            return
        folder = db_path.parent
        if folder in self._checked_dirs:
            return
        guarded = [folder]
        if folder.parent.name in ("database", "test_database"):
            guarded.append(folder.parent)
        for g in guarded:
            if self.cache_dir == g or g in self.cache_dir.parents:
                raise ValueError(
                    f"gold cache folder {self.cache_dir} is inside {g}, which the policy can reach; "
                    "put the cache outside the data folder (e.g. ~/.cache/sqlrl/gold)"
                )
        self._checked_dirs.add(folder)

    def key(self, db_path: str | os.PathLike, sql: str) -> tuple[str, str]:
        return file_sha256(db_path), hashlib.sha256(sql.encode("utf-8", "surrogatepass")).hexdigest()

    def _lookup(self, key: tuple[str, str]) -> GoldResult | None:
        hit = self._mem.get(key)
        if hit is None:
            hit = self._disk_get(key)
            if hit is not None:
                hit = (self._capped(hit[0]), hit[1])
                self._mem[key] = hit
        if hit is None:
            return None
        result, measured_timeout = hit
        if result.status == "timeout" and measured_timeout < self.timeout_s:
            return None  # timed out under a shorter limit than ours: measure again
        if result.status == "too_many_rows" and result.caps[0] < self.max_rows:
            return None  # over a smaller row cap than ours: measure again
        if result.status == "too_large" and result.caps[1] < self.max_result_bytes:
            return None
        if result.status == "error" and result.message.startswith(("too_many_rows:", "too_large:")):
            return None  # a cap failure cached without its caps: measure again
        return result

    def _capped(self, result: GoldResult) -> GoldResult:
        """`result` under this cache's caps: an ok result over them becomes too_many_rows / too_large."""
        if result.status != "ok":
            return result
        if result.row_count > self.max_rows:
            msg = f"too_many_rows: more than {self.max_rows} rows (the cap of a prediction)"
            return GoldResult("too_many_rows", [], [], 0, msg, result.elapsed_ms, self._caps)
        size = len(marshal.dumps(result.columns)) + len(marshal.dumps(result.rows))
        if size > self.max_result_bytes:
            msg = f"too_large: result of {size} bytes, over {self.max_result_bytes} (the cap of a prediction)"
            return GoldResult("too_large", [], [], 0, msg, result.elapsed_ms, self._caps)
        return result

    def _execute_one(self, db_path: str, sql: str) -> GoldResult:
        last = ""
        for _ in range(self.retries + 1):
            res = self.executor.execute(db_path, sql, timeout_s=self.timeout_s)
            self.executions += 1
            if getattr(res, "status", None) != "worker_crash":
                return self._capped(_from_sql_result(res, self._caps))
            last = str(getattr(res, "message", ""))
        raise GoldCacheError(
            f"the sandbox worker crashed {self.retries + 1} times running a gold on {db_path} ({last}); "
            "this is an infrastructure failure, not a property of the gold"
        )

    def _resolve(self, given: str) -> tuple[str, str]:
        """(resolved path, file sha256) of a database path. Remembered per given path while one
        `os.stat` of it (symlinks followed) shows the same file (device, inode, size, mtime): path
        resolution and the location check cost more than the rest of a warm look-up."""
        try:
            st = os.stat(given)
            stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            stamp = None
        hit = self._resolved.get(given)
        if hit is not None and stamp is not None and hit[0] == stamp:
            return hit[1]
        p = Path(given).resolve()
        if not p.is_file():
            raise FileNotFoundError(f"gold cache: no database file at {p}")
        self._check_location(p)
        out = (str(p), file_sha256(p))
        if stamp is not None:
            self._resolved[given] = (stamp, out)
        return out

    def get(self, db_path: str | os.PathLike, sql: str) -> GoldResult:
        """The gold's result, executing it only when no trusted cached result exists."""
        return self.get_many([(db_path, sql)], progress=False)[0]

    def _sql_sha(self, sql: str) -> str:
        """sha256 of the SQL text (remembered: a GRPO group's gold is looked up every step)."""
        h = self._sql_shas.get(sql)
        if h is None:
            if len(self._sql_shas) >= _SQL_SHAS_MAX:
                self._sql_shas.clear()
            h = self._sql_shas[sql] = hashlib.sha256(sql.encode("utf-8", "surrogatepass")).hexdigest()
        return h

    def get_many(
        self,
        items: list[tuple[str | os.PathLike, str]],
        *,
        progress: bool | None = None,
        desc: str = "gold",
        resolved: dict | None = None,
        log_long: bool = False,
    ) -> list[GoldResult]:
        """`get` for many (db_path, sql) pairs; misses run in parallel when the sandbox is our own.
        Each database path is resolved (one `os.stat`, see `_resolve`) once per call; `resolved`, a
        dict the caller passes to several calls (e.g. `Evaluator.score_many`'s look-ups of golds and
        of their variants), makes that once for all of them: a file replaced between those calls is
        then noticed only from the next dict on. `log_long`: with no bar, one log line before and one after
        executing at least PROGRESS_MIN_TASKS golds (a long audit under another progress line)."""
        with self._lock:
            keys = []
            paths: list[str] = []
            # given path -> (resolved path, file sha256), this call (or the caller's calls)
            dbs: dict[str, tuple[str, str]] = {} if resolved is None else resolved
            for db_path, sql in items:
                given = os.fspath(db_path)
                if given not in dbs:
                    dbs[given] = self._resolve(given)
                resolved_path, db_sha = dbs[given]
                paths.append(resolved_path)
                keys.append((db_sha, self._sql_sha(sql)))
            results: dict[tuple[str, str], GoldResult] = {}
            todo: dict[tuple[str, str], tuple[str, str]] = {}
            for (_, sql), path, key in zip(items, paths, keys):
                if key in results or key in todo:
                    continue
                why = unstable_gold(sql)
                if why is not None:  # not run, not cached: no result of it is the answer
                    results[key] = GoldResult("unstable", [], [], 0, why)
                    continue
                hit = self._lookup(key)
                if hit is not None:
                    results[key] = hit
                else:
                    todo[key] = (path, sql)
            self.hits += len(items) - len(todo)
            self.misses += len(todo)
            if progress is None:
                progress = len(todo) >= PROGRESS_MIN_TASKS
            long_run = log_long and not progress and len(todo) >= PROGRESS_MIN_TASKS
            if long_run:
                log.info(f"{desc}: executing {len(todo)} golds")
            t0 = time.perf_counter()
            self._run(todo, results, progress, desc)
            if long_run:
                log.info(f"{desc}: {len(todo)} golds executed in {time.perf_counter() - t0:.1f} s")
            return [results[k] for k in keys]

    def _run(
        self,
        todo: dict[tuple[str, str], tuple[str, str]],
        results: dict[tuple[str, str], GoldResult],
        progress: bool,
        desc: str,
    ) -> None:
        if not todo:
            return
        bar = None
        if progress:
            from tqdm import tqdm

            tty = sys.stderr.isatty()
            bar = tqdm(
                total=len(todo),
                desc=desc,
                unit="sql",
                file=sys.stderr,
                dynamic_ncols=True,
                mininterval=0.1 if tty else 5.0,
            )
        try:
            pending = list(todo.items())
            executor = self.executor
            batch = getattr(executor, "execute_many", None) if self._own_executor else None
            # one disk transaction per chunk: a commit (fsync) per gold would dominate the run time
            chunk = max(32, 8 * self.workers)
            for start in range(0, len(pending), chunk):
                part = pending[start : start + chunk]
                done: list[tuple[tuple[str, str], GoldResult]] = []
                try:
                    if batch is not None:
                        raw = batch([v for _, v in part])
                        self.executions += len(part)
                        for (key, (db, sql)), res in zip(part, raw):
                            if getattr(res, "status", None) == "worker_crash":
                                done.append((key, self._execute_one(db, sql)))
                            else:
                                done.append((key, self._capped(_from_sql_result(res, self._caps))))
                    else:
                        for key, (db, sql) in part:
                            done.append((key, self._execute_one(db, sql)))
                finally:  # keep what finished even when a later gold raises
                    for key, result in done:
                        results[key] = result
                        self._mem[key] = (result, self.timeout_s)
                    self._disk_put_many([(key, result, self.timeout_s) for key, result in done])
                if bar is not None:
                    bar.update(len(part))
        finally:
            if bar is not None:
                bar.close()
