"""Hardened, read-only execution of untrusted (model-written) SQL against SQLite files.

`Sandbox` runs each statement in one of a few persistent worker processes (`sqlrl.sql.workers`),
through these layers, outermost first: the pre-check of `sqlrl.sql.guard` (in the parent for
`execute` / `execute_many`, in the worker for the statements of `execute_scored`); a connection
opened `mode=ro&immutable=1` with `query_only=1`, `trusted_schema=0`, `temp_store=MEMORY`; the
authorizer allowlist of `guard.read_only_authorizer`; SQLite limits, heap limits and RLIMIT_AS; a
progress-handler deadline (`timeout_s`) and the parent's watchdog (`hard_timeout_s`); row and byte
caps (`sqlrl.sql.engine`). `execute_many` and `execute_scored` deal a call's items to chunks strided
(`_deal`), so consecutive items (one task's samples) run on different workers.

Covered: no statement run through the sandbox changes the database file or creates a file; a
runaway statement costs at most `hard_timeout_s` of wall time and never takes the caller down
(`timeout`; a worker that died gives `worker_crash`, and the next call gets a fresh worker); results
are deterministic for deterministic SQL. Statuses: `sqlrl.sql.result.STATUSES`.
Not covered: a file rewritten in place with the same size and mtime can give stale reads
(`execute` / `execute_many` stat the file before every statement, `execute_scored` once per chunk).
Non-deterministic SQL stays non-deterministic. Memory limits are per worker, not per call. The
database *files* are trusted; the SQL is not. `elapsed_ms` is the worker's execution + fetch time
(the parent's wall time for watchdog kills and pre-check results).
Defaults: timeout_s=5, hard_timeout_s=2*timeout_s+1, max_rows=100_000, max_result_bytes=8 MiB,
max_value_bytes=4 MiB, max_sql_chars=1_000_000, heap limit 512 MiB, RLIMIT_AS 2 GiB,
256 cached connections per worker, progress check every 10_000 VM instructions.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import OrderedDict, deque
from typing import Any

from sqlrl.sql.engine import Deadline, run_one, seconds, time_limits
from sqlrl.sql.guard import check_statement
from sqlrl.sql.result import MAX_RESULT_BYTES, MAX_ROWS, MAX_VALUE_BYTES, SQLResult, failure
from sqlrl.sql.scoring import run_scored, score_batch
from sqlrl.sql.workers import WorkerPool, close_at_exit, forget_at_exit, serve_batches

_SCORE_CHUNKS_PER_WORKER = 4  # execute_scored: chunks per worker (load balance vs round trips)
_SCORE_DEPTH = 2  # execute_scored: chunks in flight per worker (the next one waits in its pipe)
_SCORE_MIN_CHUNK = 16  # execute_scored: fewer chunks per worker rather than chunks smaller than this
# `warm`: one statement that opens a database's connection and loads its schema (a read the authorizer
# allows), run on every idle worker
_WARM_SQL = "SELECT count(*) FROM sqlite_master"


def _worker_main(conn: Any, cfg: dict, progress: Any) -> None:
    """Worker loop: statement batches (`workers.serve_batches`, each item run by `engine.run_one`) and
    scoring batches (tuples, `scoring.score_batch`), sharing one connection cache."""
    conns: OrderedDict = OrderedDict()
    deadline = Deadline()
    refs: dict = {}  # reference payloads of scoring batches (e.g. cached gold results), by key
    scorers: dict = {}

    def run(db_path: str, sql: str, timeout_s: float) -> tuple:
        return run_one(conns, cfg, deadline, db_path, sql, timeout_s)

    def other(batch: tuple) -> bool:
        return score_batch(conn, cfg, conns, deadline, progress, refs, scorers, batch)

    serve_batches(conn, progress, run, other)


def _deal(todo: list, size: int) -> list[list]:
    """`todo` cut into ceil(len / size) chunks of at most `size` items each, strided: chunk c holds items
    c, c + n, c + 2n, ... (n chunks), so consecutive items (the samples of one task) land in different
    chunks and hence, with chunks handed to whichever worker is free, on different workers."""
    n = -(-len(todo) // size)
    return [todo[k::n] for k in range(n)]


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


class Sandbox:
    """Watched worker processes that execute one read-only SQL statement per call.

    workers: worker processes (parallelism of `execute_many`; concurrent `execute` calls share them).
    timeout_s: soft deadline per statement, enforced inside SQLite by the progress handler.
    hard_timeout_s: wall-clock limit per statement in the parent; the worker is killed and respawned
        (default: 2 * timeout_s + 1). With a per-call timeout, the margin above timeout_s is kept.
    max_rows / max_result_bytes: result caps (-> too_many_rows / too_large).
    max_value_bytes: SQLITE_LIMIT_LENGTH (largest string/blob; never above max_result_bytes).
    max_sql_chars: longest SQL text.
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
        max_rows: int = MAX_ROWS,
        max_result_bytes: int = MAX_RESULT_BYTES,
        max_value_bytes: int = MAX_VALUE_BYTES,
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
        self.workers = int(workers)
        self.timeout_s, self.hard_timeout_s = time_limits(timeout_s, hard_timeout_s, "Sandbox")
        self.max_rows = int(max_rows)
        self.max_result_bytes = int(max_result_bytes)
        self.max_sql_chars = int(max_sql_chars)
        self.max_value_bytes = int(max_value_bytes)
        if min(self.max_rows, self.max_result_bytes, self.max_sql_chars, self.max_value_bytes) < 0:
            raise ValueError(
                "Sandbox: max_rows, max_result_bytes, max_value_bytes and max_sql_chars must be >= 0"
            )
        self.chunk_size = max(1, int(chunk_size))
        self.ref_budget = max(1, int(ref_budget))
        self._cfg = {
            "max_rows": self.max_rows,
            "max_result_bytes": self.max_result_bytes,
            "max_value_bytes": self.max_value_bytes,
            "max_sql_chars": self.max_sql_chars,
            "heap_limit_bytes": int(heap_limit_bytes) if heap_limit_bytes else 0,
            "memory_limit_bytes": int(memory_limit_bytes) if memory_limit_bytes else 0,
            "max_connections": max(1, int(max_connections)),
            "progress_ops": int(progress_ops),
            "preload": tuple(preload or ()),
        }
        self._pool = WorkerPool(
            self.workers, self._cfg, _worker_main, "sqlrl-sandbox-worker", self.timeout_s, self.hard_timeout_s
        )
        self._all = self._pool.workers
        close_at_exit(self)

    @property
    def kills(self) -> int:
        """Workers the watchdog killed (timeouts)."""
        return self._pool.kills

    @property
    def crashes(self) -> int:
        """Workers that died on their own."""
        return self._pool.crashes

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
            t = (
                seconds(item[2], "Sandbox: a timeout_s")
                if len(item) > 2 and item[2] is not None
                else self.timeout_s
            )
            pre = check_statement(sql, self.max_sql_chars)
            if isinstance(pre, SQLResult):
                results[i] = pre
            else:
                todo.append((i, _abspath(db_path), pre, t))
        if todo:
            n_chunks_target = self.workers * 4
            size = max(1, min(self.chunk_size, -(-len(todo) // n_chunks_target)))
            chunks = _deal(todo, size)  # strided: see execute_scored (multi-turn rollouts run here)
            self._pool.run_chunks(chunks, results)
        missing = [i for i, r in enumerate(results) if r is None]
        for i in missing:  # only if the sandbox was closed under us
            results[i] = failure("worker_crash", "sandbox closed during the call")
        return results  # type: ignore[return-value]

    def execute_scored(
        self,
        items: list[tuple],
        refs: dict,
        scorer: str,
        options: Any = None,
        timeout_s: float | None = None,
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
        re-run on the fresh worker. `timeout_s`: the statements' soft limit for this call (default
        the sandbox's; the hard limit keeps its margin above it). Thread-safe; nothing the SQL does
        makes it raise."""
        self._check_open()
        results: list[Any] = [None] * len(items)
        if not items:
            return results
        t = self.timeout_s if timeout_s is None else seconds(timeout_s, "Sandbox.execute_scored: timeout_s")
        todo = [(i, _abspath(it[0]), it[1], t, tuple(it[2]), it[3], None) for i, it in enumerate(items)]
        # As many chunks per worker as there are items for chunks of `_SCORE_MIN_CHUNK` (1 to
        # `_SCORE_CHUNKS_PER_WORKER`): every message costs both sides wake-ups, which a small call
        # cannot repay with better balance. Strided, not contiguous: chunk c holds items c, c + n,
        # c + 2n, ... of the n chunks, so the samples of one task (a GRPO group: one database, one gold,
        # often the same slow query shape) are spread over the workers instead of queueing on one. The
        # cost: a worker receives the golds of more tasks (each gold payload is shipped once per worker
        # and kept).
        per_worker = max(1, min(_SCORE_CHUNKS_PER_WORKER, len(todo) // (self.workers * _SCORE_MIN_CHUNK)))
        n_chunks = min(len(todo), self.workers * per_worker)
        size = max(1, min(self.chunk_size * 4, -(-len(todo) // n_chunks)))
        chunks = deque(_deal(todo, size))
        run_scored(
            self._pool, chunks, refs, scorer, options, results, depth=_SCORE_DEPTH, ref_budget=self.ref_budget
        )
        for i, r in enumerate(results):
            if r is None:  # only if the sandbox was closed under us
                results[i] = failure("worker_crash", "sandbox closed during the call")
        return results

    def warm(self, db_paths: list) -> int:
        """Open the hardened read-only connection to each database (and load its schema) in every worker
        that is idle now, so that the next statements on them pay neither: `Evaluator.prefetch` calls
        it beside generation. At most `max_connections` databases (the workers' connection cache);
        workers busy with another call are skipped, as are databases that fail to open (their
        statements report it). Returns the number of (worker, database) connections ready."""
        self._check_open()
        paths = list(dict.fromkeys(_abspath(p) for p in db_paths))[: self._cfg["max_connections"]]
        ws: list = []
        while paths and len(ws) < len(self._all):
            try:
                ws.append(self._pool.idle.get_nowait())
            except queue.Empty:
                break
        results: list[list] = [[None] * len(paths) for _ in ws]
        batch = [(i, p, _WARM_SQL, self.timeout_s) for i, p in enumerate(paths)]

        def one(k: int) -> None:
            try:
                self._pool.run_batch(ws[k], batch, results[k])
            finally:
                self._pool.idle.put(ws[k])

        threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(1, len(ws))]
        for th in threads:
            th.start()
        if ws:
            one(0)
        for th in threads:
            th.join()
        return sum(1 for rs in results for r in rs if r is not None and r.status == "ok")

    def close(self) -> None:
        if self._pool.close():
            forget_at_exit(self)

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
        if self._pool.closed:
            raise RuntimeError("Sandbox is closed")


def execute_each(sandbox: Any, items: list, failed: Any, timeout_s: float | None = None) -> list:
    """The results of (db_path, sql) `items` in order, from any sandbox-like object: one `execute_many`
    call when it has one and answers for every item (2+ items), else one `execute` per item, so one bad
    item cannot fail the others; an exception from an item's `execute` becomes `failed(exception)`.
    `timeout_s` (None: the sandbox's own) is passed with every item."""
    if not items:
        return []
    many = getattr(sandbox, "execute_many", None)
    if many is not None and len(items) > 1:
        try:
            out = list(many(items if timeout_s is None else [(db, sql, timeout_s) for db, sql in items]))
            if len(out) == len(items):
                return out
        except Exception:
            pass  # one call per item below
    results: list = []
    for db_path, sql in items:
        try:
            if timeout_s is None:
                results.append(sandbox.execute(db_path, sql))
            else:
                results.append(sandbox.execute(db_path, sql, timeout_s))
        except Exception as e:
            results.append(failed(e))
    return results
