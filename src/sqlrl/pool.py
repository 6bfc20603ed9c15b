"""A pool of writable per-trajectory SQLite replicas with lazy reset (stateful SQL-debugging tasks).

`ReplicaPool(templates, root_dir, replicas_per_db=4, workers=2, timeout_s=5.0, ...)` keeps, for every
template database, a fixed set of replica files under `root_dir` (never inside a template's folder),
partitioned across a few persistent worker processes (multiprocessing, *spawn*). Each replica has an
`available` and a `needs_reset` flag. `lease(trajectory_id, db_id)` binds a trajectory to one
(worker, db, replica) for its whole life; the replica is copied from its clean template just before
it is handed out, and only if it `needs_reset` (a never-used replica needs one). `release()` makes it
available again and marks it dirty when anything may have changed. A clean replica is never copied
again. `CopyPerRollout` has the same interface but copies the template on every lease (the baseline).

Reset: the first creation of a replica is a full copy (to `<replica>.tmp`, then an atomic rename). A
dirty replica is reset *in place* by default (`delta_reset=True`): one read pass over template and
replica collects the `delta_block`-byte blocks that differ and hashes the template; only when the hash
equals the recorded sha256 are those blocks written and the file truncated to the template's length,
after which the replica is byte-identical to the template. When more than `delta_max_frac` (25%)
differs, or the replica file is missing, a full copy is made instead. Both need no open connection on
the replica: a dirty release closes the worker's connection before anything is reset.
`stats()`: leases, resets, delta_resets, bytes_copied (bytes WRITTEN into replicas by resets),
bytes_read (template + replica bytes read by resets), dirty_releases, clean_releases, timeouts,
worker_crashes, exhausted, active_leases, replicas.

Dirty detection (release marks the replica dirty, hence reset before its next lease, when ANY holds):
1. the authorizer of the replica's connection allowed a writing action (INSERT, UPDATE, DELETE, any
   CREATE / DROP incl. TEMP objects, ALTER TABLE, REINDEX) while the statement was *compiled*. Every statement
   on a replica is compiled on that one connection (the only connection to the file), so a statement
   that can change data or schema cannot run without setting the flag. This is deliberately
   conservative: an UPDATE matching no row, a write that failed (constraint error, rolled back) or
   was interrupted counts as dirty, because we cannot prove cheaply that nothing changed (so does a
   SELECT over a table-valued function such as `json_each`: SQLite authorizes an internal UPDATE of
   the schema table when it builds the eponymous virtual table);
2. `total_changes()` of the connection grew;
3. any call of the lease ended in `timeout` or `worker_crash`, or `release(..., crashed=True)`;
4. the replica file's (size, mtime_ns, inode) differs from what it was right after the reset, or a
   `-journal` / `-wal` file lies next to it (belt and braces; cannot prove cleanliness on its own).
A replica is released clean only when none of them holds: then only SELECT/READ/FUNCTION/RECURSIVE
and read-only schema pragmas were compiled on the replica during the lease, which cannot change it.
`PRAGMA data_version` is not used: it only reports commits by *other* connections.

Execution (`execute(trajectory_id, sql)` -> `sqlrl.sandbox.SQLResult`), outermost layer first:
- parent pre-check (tokenizer aware, `sqlrl.sandbox.split_statements` logic): one statement per call
  (`multiple_statements`), empty -> `empty_sql`, too long -> `too_large`; statements starting with
  ATTACH, DETACH, VACUUM (incl. VACUUM INTO), BEGIN, COMMIT, END, ROLLBACK, SAVEPOINT, RELEASE,
  ANALYZE -> `forbidden`; EXPLAIN only in front of SELECT / WITH / VALUES;
- the worker's connection to the leased replica (`mode=rw`, so it never creates a file) has
  `journal_mode=MEMORY`, `synchronous=OFF` (replicas are disposable: a crash mid-write marks the
  replica dirty and the reset replaces the file), `trusted_schema=0`, `temp_store=MEMORY`, set before
  the authorizer; SQLITE_LIMIT_ATTACHED=0 and the other limits of the sandbox;
- an authorizer ALLOWLIST: reads, the write actions listed above, functions except the sandbox's deny
  list (`load_extension`, `readfile`, `writefile`, ...; SQLite's internal `sqlite_rename_*` helpers
  are allowed because ALTER TABLE calls them and user SQL cannot), the read-only schema pragmas of
  the sandbox. Everything else is denied -> `forbidden`: ATTACH/DETACH (also what VACUUM does
  internally), transactions and savepoints (each statement autocommits, so no transaction ever spans
  two calls or two trajectories), every other PRAGMA (journal_mode, writable_schema, query_only, ...),
  virtual tables, ANALYZE;
- a progress-handler deadline (`timeout_s`) -> `timeout`; a parent watchdog (`hard_timeout_s`, default
  2 * timeout_s + 1) kills and respawns a worker that does not answer -> `timeout`; a worker that
  died -> `worker_crash`; either way the replica is marked dirty;
- row / byte caps as in the sandbox (`too_many_rows`, `too_large`).

Guaranteed: a template file is only ever read (opened read-only for hashing/copying); replicas live
under `root_dir`, which may not be, or lie inside, a template's folder; a reset writes nothing into
the replica (full copy: installs nothing) unless the sha256 of the template bytes it read equals the
sha256 recorded at start, else `TemplateChanged` is raised and the replica stays unusable (needs_reset)
until the template is restored; one
trajectory id maps to one replica until released, and a replica is leased to at most one trajectory
at a time, so concurrent trajectories never see each other's writes; a replica released dirty (per
the rules above) is reset before it is handed out again; a released-clean replica's file is unchanged.
Not guaranteed: a worker killed for one trajectory's hung statement also drops the *connections* of
the other replicas it owns: their TEMP objects (already counted as dirty) vanish mid-lease, files
are unaffected. Memory limits are per worker, not per call. Templates are trusted files, the SQL is
not. Non-deterministic SQL stays non-deterministic. A template changed and restored between two
checks is not noticed (only the bytes actually copied are verified). Threads may share the pool;
calls for replicas owned by the same worker are serialised.
"""

from __future__ import annotations

import atexit
import hashlib
import marshal
import multiprocessing
import os
import re
import sqlite3
import sys
import threading
import time
import types
import urllib.parse
import weakref
from dataclasses import dataclass
from typing import Any

from sqlrl.artifacts import sha256_file
from sqlrl.sandbox import (
    _DENY_FUNCTIONS,
    _START_LOCK,
    SQLResult,
    _classify,
    _Deadline,
    _limit,
    _result,
    _run,
    _setup_process,
)
from sqlrl.sandbox import _precheck as _sandbox_precheck

__all__ = ["CopyPerRollout", "Lease", "PoolExhausted", "ReplicaPool", "TemplateChanged", "sha256_file"]


class PoolExhausted(RuntimeError):
    """No replica of the database became available within the lease timeout."""


class TemplateChanged(RuntimeError):
    """A template's bytes no longer match the sha256 recorded when the pool started."""


@dataclass(frozen=True)
class Lease:
    trajectory_id: str
    db_id: str
    worker: int
    replica: int
    path: str


# --------------------------------------------------------------------------------------------------
# Pre-check (parent)

_FORBIDDEN_START = frozenset(
    "ATTACH DETACH VACUUM BEGIN COMMIT END ROLLBACK SAVEPOINT RELEASE ANALYZE".split()
)


def _precheck(sql: Any, max_sql_chars: int) -> SQLResult | str:
    """The sandbox's statement check, with the pool's own list of forbidden statement starts."""
    return _sandbox_precheck(sql, max_sql_chars, forbidden_start=_FORBIDDEN_START, context="on a replica")


# --------------------------------------------------------------------------------------------------
# Worker side

_POOL_DENY_FUNCTIONS = frozenset(
    f
    for f in _DENY_FUNCTIONS
    if not f.startswith(("sqlite_rename_", "sqlite_drop_column"))  # internal-only, used by ALTER TABLE
)
_ALLOWED_PRAGMAS = frozenset(
    ("table_info", "table_xinfo", "index_list", "index_info", "index_xinfo", "foreign_key_list")
)
_READ_ACTIONS = frozenset((sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE))
_WRITE_ACTIONS = frozenset(
    getattr(sqlite3, n)
    for n in (
        "SQLITE_INSERT",
        "SQLITE_UPDATE",
        "SQLITE_DELETE",
        "SQLITE_CREATE_INDEX",
        "SQLITE_CREATE_TABLE",
        "SQLITE_CREATE_TEMP_INDEX",
        "SQLITE_CREATE_TEMP_TABLE",
        "SQLITE_CREATE_TEMP_TRIGGER",
        "SQLITE_CREATE_TEMP_VIEW",
        "SQLITE_CREATE_TRIGGER",
        "SQLITE_CREATE_VIEW",
        "SQLITE_DROP_INDEX",
        "SQLITE_DROP_TABLE",
        "SQLITE_DROP_TEMP_INDEX",
        "SQLITE_DROP_TEMP_TABLE",
        "SQLITE_DROP_TEMP_TRIGGER",
        "SQLITE_DROP_TEMP_VIEW",
        "SQLITE_DROP_TRIGGER",
        "SQLITE_DROP_VIEW",
        "SQLITE_ALTER_TABLE",
        "SQLITE_REINDEX",  # CREATE INDEX authorizes it internally
    )
)
_OK, _DENY = sqlite3.SQLITE_OK, sqlite3.SQLITE_DENY
_A_FUNCTION, _A_PRAGMA = sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_PRAGMA


def _check_template(rep: Any, src: str, got: str, want: str) -> None:
    """Nothing is written into a replica from a template whose bytes changed since the pool started."""
    if got != want:
        raise TemplateChanged(
            f"template of {rep.db_id!r} ({src}) changed since the pool started: sha256 "
            f"{got} != recorded {want}; refusing to reset replica {rep.index}"
        )


def _remove_sidecars(path: str) -> None:
    for s in ("-journal", "-wal", "-shm"):
        try:
            os.remove(path + s)
        except FileNotFoundError:
            pass


class _Conn:
    __slots__ = ("conn", "wrote")

    def __init__(self) -> None:
        self.conn: sqlite3.Connection | None = None
        self.wrote = False


def _open_replica(path: str, cfg: dict, deadline: _Deadline) -> _Conn:
    uri = "file:" + urllib.parse.quote(path) + "?mode=rw"
    box = _Conn()
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    try:
        for pragma in ("journal_mode=MEMORY", "synchronous=OFF", "trusted_schema=0", "temp_store=MEMORY"):
            conn.execute("PRAGMA " + pragma).fetchall()
        _limit(conn, cfg, deadline, trigger_depth=10)

        def authorizer(action: int, arg1: Any, arg2: Any, dbname: Any, source: Any) -> int:
            if action in _READ_ACTIONS:
                return _OK
            if action == _A_FUNCTION:
                return _DENY if (arg2 or "").lower() in _POOL_DENY_FUNCTIONS else _OK
            if action == _A_PRAGMA:
                return _OK if (arg1 or "").lower() in _ALLOWED_PRAGMAS else _DENY
            if action in _WRITE_ACTIONS:
                box.wrote = True  # sticky for the life of the connection (closed on a dirty release)
                return _OK
            return _DENY

        conn.set_authorizer(authorizer)
    except BaseException:
        conn.close()
        raise
    box.conn = conn
    return box


def _exec(conns: dict, cfg: dict, deadline: _Deadline, path: str, sql: str, timeout_s: float) -> tuple:
    """-> (status, cols, rows, n, ms, msg, wrote, total_changes)."""
    t0 = time.perf_counter()
    deadline.t = time.monotonic() + timeout_s
    box = conns.get(path)
    try:
        if box is None:
            box = conns[path] = _open_replica(path, cfg, deadline)
    except Exception as e:  # noqa: BLE001
        return (
            "runtime_error",
            [],
            [],
            0,
            (time.perf_counter() - t0) * 1e3,
            f"cannot open replica: {e}",
            1,
            0,
        )
    conn = box.conn
    try:
        status, cols, rows, msg = _run(conn, sql, cfg, deadline)
        out = (status, cols, rows, len(rows), (time.perf_counter() - t0) * 1e3, msg)
    except Exception as e:  # noqa: BLE001
        st, msg = _classify(e, timeout_s)
        if st == "forbidden":
            msg = f"{e} (replica pool: ATTACH/DETACH/VACUUM, transactions, pragmas and extensions are denied)"
        out = (st, [], [], 0, (time.perf_counter() - t0) * 1e3, msg)
    return out + (int(box.wrote), conn.total_changes)


def _pool_worker_main(pipe: Any, cfg: dict) -> None:
    """Requests (marshal): ("exec", path, sql, timeout_s) -> result tuple; ("close", path) -> ("ok",)."""
    _setup_process(cfg)
    conns: dict[str, _Conn] = {}
    deadline = _Deadline()
    try:
        pipe.send_bytes(marshal.dumps(("ready",)))
    except (EOFError, OSError):
        return
    while True:
        try:
            req = marshal.loads(pipe.recv_bytes())
        except (EOFError, OSError):
            return
        op = req[0]
        if op == "exec":
            out = _exec(conns, cfg, deadline, req[1], req[2], req[3])
        elif op == "close":
            box = conns.pop(req[1], None)
            if box is not None and box.conn is not None:
                try:
                    box.conn.close()
                except Exception:  # noqa: BLE001
                    pass
            out = ("ok",)
        else:
            out = ("runtime_error", f"unknown op {op!r}")
        try:
            pipe.send_bytes(marshal.dumps(out))
        except (EOFError, OSError):
            return


# --------------------------------------------------------------------------------------------------
# Parent side

_STARTUP_LIMIT_S = 120.0


class _WorkerDied(Exception):
    pass


class _WorkerHung(Exception):
    pass


class _PoolWorker:
    """One worker process and its pipe; `lock` serialises requests."""

    def __init__(self, ctx: Any, cfg: dict, index: int) -> None:
        self.ctx, self.cfg, self.index = ctx, cfg, index
        self.lock = threading.Lock()
        self.proc: Any = None
        self.pipe: Any = None
        self.ready = False
        self.start()

    def start(self) -> None:
        parent, child = self.ctx.Pipe(duplex=True)
        proc = self.ctx.Process(
            target=_pool_worker_main,
            args=(child, self.cfg),
            daemon=True,
            name=f"sqlrl-pool-worker-{self.index}",
        )
        with _START_LOCK:  # bare __main__ during start(): the caller's script is not re-imported
            main = sys.modules.get("__main__")
            sys.modules["__main__"] = types.ModuleType("__main__")
            try:
                proc.start()
            finally:
                if main is not None:
                    sys.modules["__main__"] = main
        child.close()
        self.proc, self.pipe, self.ready = proc, parent, False

    def kill(self) -> None:
        proc, pipe = self.proc, self.pipe
        self.proc = self.pipe = None
        self.ready = False
        if proc is not None:
            try:
                proc.kill()
                proc.join(5)
                proc.close()
            except Exception:  # noqa: BLE001
                pass
        if pipe is not None:
            try:
                pipe.close()
            except Exception:  # noqa: BLE001
                pass

    def respawn(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.pipe is not None:
            try:
                self.pipe.close()
            except Exception:  # noqa: BLE001
                pass
            self.pipe = None
        if self.proc is not None:
            try:
                self.proc.join(1.0)
            except Exception:  # noqa: BLE001
                pass
        self.kill()

    def _wait_ready(self) -> None:
        if self.proc is None:
            self.start()
        if self.ready:
            return
        if not self.pipe.poll(_STARTUP_LIMIT_S):
            raise _WorkerHung("worker did not start")
        try:
            self.pipe.recv_bytes()
        except (EOFError, OSError) as e:
            raise _WorkerDied(str(e)) from e
        self.ready = True

    def call(self, req: tuple, hard_limit_s: float) -> tuple:
        """Send one request and wait at most `hard_limit_s` (after the worker is up). Caller holds lock.
        Raises _WorkerHung (worker killed and respawned) or _WorkerDied (respawned)."""
        try:
            self._wait_ready()
            self.pipe.send_bytes(marshal.dumps(req))
            if not self.pipe.poll(hard_limit_s):
                raise _WorkerHung()
            return marshal.loads(self.pipe.recv_bytes())
        except _WorkerHung:
            self.respawn()
            raise
        except (EOFError, OSError, _WorkerDied) as e:
            code = self.proc.exitcode if self.proc is not None else None
            self.respawn()
            raise _WorkerDied(f"exit code {code}") from e


@dataclass
class _Replica:
    db_id: str
    index: int
    path: str
    worker: int
    available: bool = True
    needs_reset: bool = True  # the file does not exist yet
    dirty: bool = False  # something in the current lease may have changed it
    open_in_worker: bool = False
    sig: tuple | None = None  # (size, mtime_ns, inode) right after the reset
    base_changes: int = 0


_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for p in list(_LIVE):
        try:
            p.close()
        except Exception:  # noqa: BLE001
            pass


def _safe_name(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", s) or "_"


def _inside(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


class ReplicaPool:
    """Writable per-trajectory replicas with lazy reset. See the module docstring.

    templates: {db_id: template path} or a list of paths (db_id = file stem).
    root_dir: where replica files live (created; must not be or lie inside a template's folder).
    replicas_per_db: fixed replicas per template. workers: worker processes (replicas round-robin).
    timeout_s: soft per-statement deadline; hard_timeout_s: watchdog limit (default 2 * timeout_s + 1).
    lease_timeout_s: how long `lease` waits for a free replica before raising `PoolExhausted`.
    max_rows / max_result_bytes / max_value_bytes / max_sql_chars / heap_limit_bytes /
    memory_limit_bytes / progress_ops: as in `sqlrl.sandbox.Sandbox`.
    remove_files: delete the replica files this pool created on `close()`.
    delta_reset: reset a dirty replica in place, rewriting only the `delta_block`-byte blocks that differ
        from the template (full copy when more than `delta_max_frac` differs or the file is missing).
    """

    _always_reset = False  # CopyPerRollout: copy on every lease

    def __init__(
        self,
        templates: dict[str, str | os.PathLike] | list[str | os.PathLike],
        root_dir: str | os.PathLike,
        *,
        replicas_per_db: int = 4,
        workers: int = 2,
        timeout_s: float = 5.0,
        hard_timeout_s: float | None = None,
        lease_timeout_s: float = 30.0,
        max_rows: int = 100_000,
        max_result_bytes: int = 8 * 2**20,
        max_value_bytes: int = 4 * 2**20,
        max_sql_chars: int = 1_000_000,
        heap_limit_bytes: int = 512 * 2**20,
        memory_limit_bytes: int | None = 2 * 2**30,
        progress_ops: int = 10_000,
        remove_files: bool = True,
        delta_reset: bool = True,
        delta_block: int = 4096,
        delta_max_frac: float = 0.25,
    ) -> None:
        if replicas_per_db < 1 or workers < 1:
            raise ValueError("replicas_per_db and workers must be >= 1")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        if not isinstance(templates, dict):
            tl = [os.fspath(p) for p in templates]
            templates = {os.path.splitext(os.path.basename(p))[0]: p for p in tl}
            if len(templates) != len(tl):
                raise ValueError("template file stems must be unique (pass a dict to name them)")
        if not templates:
            raise ValueError("no templates")
        self.timeout_s = float(timeout_s)
        self.hard_timeout_s = float(hard_timeout_s) if hard_timeout_s else 2.0 * self.timeout_s + 1.0
        if self.hard_timeout_s < self.timeout_s:
            raise ValueError("hard_timeout_s must be >= timeout_s")
        self.lease_timeout_s = float(lease_timeout_s)
        self.max_sql_chars = int(max_sql_chars)
        self.remove_files = bool(remove_files)
        self.delta_reset = bool(delta_reset)
        self.delta_block = max(512, int(delta_block))
        self.delta_max_frac = float(delta_max_frac)
        self.root_dir = os.path.realpath(os.fspath(root_dir))
        self.templates: dict[str, str] = {}
        self.template_sha256: dict[str, str] = {}
        self.template_size: dict[str, int] = {}
        for db_id, p in templates.items():
            path = os.path.realpath(os.fspath(p))
            if not os.path.isfile(path):
                raise FileNotFoundError(f"template for {db_id!r} not found: {path}")
            if _inside(self.root_dir, os.path.dirname(path)):
                raise ValueError(
                    f"root_dir {self.root_dir} lies inside the folder of template {path}: "
                    "replicas must never be written into the data folder"
                )
            self.templates[str(db_id)] = path
            self.template_sha256[str(db_id)] = sha256_file(path)
            self.template_size[str(db_id)] = os.path.getsize(path)
        os.makedirs(self.root_dir, exist_ok=True)
        template_paths = set(self.templates.values())
        self._cfg = {
            "max_rows": int(max_rows),
            "max_result_bytes": int(max_result_bytes),
            "max_value_bytes": int(max_value_bytes),
            "max_sql_chars": self.max_sql_chars,
            "heap_limit_bytes": int(heap_limit_bytes) if heap_limit_bytes else 0,
            "memory_limit_bytes": int(memory_limit_bytes) if memory_limit_bytes else 0,
            "progress_ops": int(progress_ops),
        }
        self._cond = threading.Condition()
        self._closed = False
        self._replicas: dict[str, list[_Replica]] = {}
        k = 0
        for db_id in self.templates:
            d = os.path.join(self.root_dir, _safe_name(db_id))
            reps = []
            for i in range(int(replicas_per_db)):
                reps.append(_Replica(db_id, i, os.path.join(d, f"replica_{i:03d}.sqlite"), k % workers))
                k += 1
            self._replicas[db_id] = reps
            if any(os.path.realpath(r.path) in template_paths for r in reps):
                raise ValueError(f"a replica path of {db_id!r} would overwrite a template")
        self._bindings: dict[str, tuple[Lease, _Replica]] = {}
        self._pending: set[str] = set()
        self._active_per_worker = [0] * int(workers)
        self._stats = dict(
            leases=0,
            resets=0,
            bytes_copied=0,
            bytes_read=0,
            delta_resets=0,
            dirty_releases=0,
            clean_releases=0,
            timeouts=0,
            worker_crashes=0,
            exhausted=0,
        )
        ctx = multiprocessing.get_context("spawn")
        self._workers = [_PoolWorker(ctx, self._cfg, i) for i in range(int(workers))]
        _LIVE.add(self)

    # ---- public API

    def lease(self, trajectory_id: str, db_id: str, *, timeout_s: float | None = None) -> Lease:
        """Bind `trajectory_id` to a replica of `db_id` (the same binding while it is held)."""
        self._check_open()
        wait = self.lease_timeout_s if timeout_s is None else float(timeout_s)
        if db_id not in self._replicas:
            raise KeyError(f"unknown db_id {db_id!r}")
        deadline = time.monotonic() + max(0.0, wait)
        with self._cond:
            while True:
                b = self._bindings.get(trajectory_id)
                if b is not None:
                    if b[0].db_id != db_id:
                        raise ValueError(
                            f"trajectory {trajectory_id!r} already holds a replica of {b[0].db_id!r}, not {db_id!r}"
                        )
                    return b[0]
                if trajectory_id not in self._pending:
                    rep = self._pick(db_id)
                    if rep is not None:
                        break
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    self._stats["exhausted"] += 1
                    raise PoolExhausted(
                        f"no replica of {db_id!r} became available within {wait:g} s "
                        f"({len(self._replicas[db_id])} replicas, all leased)"
                    )
                self._cond.wait(left)
            rep.available = False
            self._pending.add(trajectory_id)
            reset = rep.needs_reset or self._always_reset
        try:
            if reset:
                self._reset(rep)
        except BaseException:
            with self._cond:
                rep.available = True
                rep.needs_reset = True
                self._pending.discard(trajectory_id)
                self._cond.notify_all()
            raise
        lease = Lease(trajectory_id, db_id, rep.worker, rep.index, rep.path)
        with self._cond:
            rep.dirty = False
            self._pending.discard(trajectory_id)
            self._bindings[trajectory_id] = (lease, rep)
            self._active_per_worker[rep.worker] += 1
            self._stats["leases"] += 1
            self._cond.notify_all()
        return lease

    def release(self, trajectory_id: str, *, crashed: bool = False) -> bool:
        """Make the trajectory's replica available again. Returns True when it was released dirty."""
        with self._cond:
            b = self._bindings.pop(trajectory_id, None)
            if b is None:
                raise KeyError(f"trajectory {trajectory_id!r} holds no lease")
            _, rep = b
            self._active_per_worker[rep.worker] -= 1
        dirty = bool(crashed or rep.dirty or self._always_reset or self._file_changed(rep))
        if dirty and rep.open_in_worker and not self._closed:
            w = self._workers[rep.worker]
            with w.lock:
                try:
                    w.call(("close", rep.path), self.hard_timeout_s)
                except (_WorkerHung, _WorkerDied):
                    self._worker_lost(rep.worker)
            rep.open_in_worker = False
        with self._cond:
            if dirty:
                rep.needs_reset = True
                self._stats["dirty_releases"] += 1
            else:
                self._stats["clean_releases"] += 1
            rep.dirty = False
            rep.available = True
            self._cond.notify_all()
        return dirty

    def execute(self, trajectory_id: str, sql: str, timeout_s: float | None = None) -> SQLResult:
        """Run one statement on the trajectory's replica. Never raises for anything the SQL does
        (KeyError when the trajectory holds no lease)."""
        self._check_open()
        b = self._bindings.get(trajectory_id)
        if b is None:
            raise KeyError(f"trajectory {trajectory_id!r} holds no lease")
        rep = b[1]
        pre = _precheck(sql, self.max_sql_chars)
        if isinstance(pre, SQLResult):
            return pre
        t = self.timeout_s if timeout_s is None else float(timeout_s)
        hard = max(self.hard_timeout_s, t + (self.hard_timeout_s - self.timeout_s))
        w = self._workers[rep.worker]
        t0 = time.monotonic()
        with w.lock:
            try:
                st, cols, rows, n, ms, msg, wrote, changes = w.call(("exec", rep.path, pre, t), hard)
            except _WorkerHung:
                rep.dirty = True
                self._worker_lost(rep.worker)
                self._stats["timeouts"] += 1
                return _result(
                    "timeout",
                    f"statement exceeded the hard time limit of {hard:g} s; the worker was killed",
                    (time.monotonic() - t0) * 1e3,
                )
            except _WorkerDied as e:
                rep.dirty = True
                self._worker_lost(rep.worker)
                self._stats["worker_crashes"] += 1
                return _result(
                    "worker_crash", f"pool worker died ({e}); it was restarted", (time.monotonic() - t0) * 1e3
                )
        if not rep.open_in_worker:
            rep.open_in_worker = True
            rep.base_changes = 0
        if wrote or changes > rep.base_changes or st == "timeout":
            rep.dirty = True
        if st == "timeout":
            self._stats["timeouts"] += 1
        return SQLResult(st, cols, rows, n, ms, msg)

    def wait_ready(self) -> None:
        """Block until every worker process has started (otherwise the first call per worker waits)."""
        for w in self._workers:
            with w.lock:
                try:
                    w._wait_ready()
                except (_WorkerHung, _WorkerDied):
                    w.respawn()

    def kill_worker(self, trajectory_id: str) -> None:
        """Testing/ops hook: kill the worker owning the trajectory's replica (SIGKILL, no respawn yet)."""
        rep = self._bindings[trajectory_id][1]
        w = self._workers[rep.worker]
        with w.lock:
            if w.proc is not None:
                w.proc.kill()
                w.proc.join(5)

    def stats(self) -> dict:
        with self._cond:
            s = dict(self._stats)
            s["active_leases"] = len(self._bindings)
            s["replicas"] = sum(len(r) for r in self._replicas.values())
        return s

    def replica_state(self, db_id: str) -> list[dict]:
        with self._cond:
            return [
                {"index": r.index, "worker": r.worker, "available": r.available, "needs_reset": r.needs_reset}
                for r in self._replicas[db_id]
            ]

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        for w in self._workers:
            with w.lock:
                w.stop()
        if self.remove_files:
            for reps in self._replicas.values():
                for r in reps:
                    for suffix in ("", "-journal", "-wal", "-shm", ".tmp"):
                        try:
                            os.remove(r.path + suffix)
                        except OSError:
                            pass
                try:
                    os.rmdir(os.path.dirname(reps[0].path))
                except OSError:
                    pass
        _LIVE.discard(self)

    def __enter__(self) -> ReplicaPool:
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
            raise RuntimeError("ReplicaPool is closed")

    def _pick(self, db_id: str) -> _Replica | None:
        """Prefer a clean replica, then the least busy worker. Caller holds the condition."""
        free = [r for r in self._replicas[db_id] if r.available]
        if not free:
            return None
        return min(free, key=lambda r: (r.needs_reset, self._active_per_worker[r.worker], r.index))

    def _worker_lost(self, worker: int) -> None:
        """The worker was respawned: none of its replicas has an open connection any more."""
        for reps in self._replicas.values():
            for r in reps:
                if r.worker == worker:
                    r.open_in_worker = False

    def _file_changed(self, rep: _Replica) -> bool:
        try:
            st = os.stat(rep.path)
        except OSError:
            return True
        if rep.sig != (st.st_size, st.st_mtime_ns, st.st_ino):
            return True
        return any(os.path.exists(rep.path + s) for s in ("-journal", "-wal"))

    def _reset(self, rep: _Replica) -> None:
        """Copy the template over the replica; installed only if the copied bytes hash to the recorded
        sha256. The replica has no open connection (closed on the dirty release / never opened)."""
        src = self.templates[rep.db_id]
        want = self.template_sha256[rep.db_id]
        if rep.open_in_worker:  # defensive: never replace a file under an open connection
            w = self._workers[rep.worker]
            with w.lock:
                try:
                    w.call(("close", rep.path), self.hard_timeout_s)
                except (_WorkerHung, _WorkerDied):
                    self._worker_lost(rep.worker)
            rep.open_in_worker = False
        if (
            self.delta_reset
            and not self._always_reset
            and rep.sig is not None
            and self._delta(rep, src, want)
        ):
            return
        os.makedirs(os.path.dirname(rep.path), exist_ok=True)
        tmp = rep.path + ".tmp"
        h = hashlib.sha256()
        n = 0
        try:
            with open(src, "rb") as fi, open(tmp, "wb") as fo:
                while b := fi.read(1 << 20):
                    h.update(b)
                    fo.write(b)
                    n += len(b)
            _check_template(rep, src, h.hexdigest(), want)
            _remove_sidecars(rep.path)
            os.replace(tmp, rep.path)
        except BaseException:
            try:
                os.remove(tmp)
            except OSError:
                pass
            raise
        self._reset_done(rep, written=n, read=n, delta=False)

    def _reset_done(self, rep: _Replica, *, written: int, read: int, delta: bool) -> None:
        st = os.stat(rep.path)
        with self._cond:
            rep.sig = (st.st_size, st.st_mtime_ns, st.st_ino)
            rep.needs_reset = False
            rep.open_in_worker = False
            self._stats["resets"] += 1
            self._stats["delta_resets"] += int(delta)
            self._stats["bytes_copied"] += written
            self._stats["bytes_read"] += read

    def _delta(self, rep: _Replica, src: str, want: str) -> bool:
        """Reset in place by rewriting only the blocks that differ from the template. One read pass over
        both files collects the differing template blocks and hashes the template; nothing is written
        unless the hash equals the recorded sha256 (else TemplateChanged). Afterwards the replica is
        byte-identical to the template. Returns False (caller does a full copy) when the replica is
        missing or more than `delta_max_frac` of it differs."""
        blk = self.delta_block
        try:
            fr = open(rep.path, "r+b")
        except OSError:
            return False
        with fr, open(src, "rb") as ft:
            h = hashlib.sha256()
            diffs: list[tuple[int, bytes]] = []
            pos = nread = ndiff = 0
            limit = self.delta_max_frac * self.template_size[rep.db_id]
            while a := ft.read(1 << 20):
                b = fr.read(len(a))
                h.update(a)
                nread += len(a) + len(b)
                if a != b:
                    for off in range(0, len(a), blk):
                        if a[off : off + blk] != b[off : off + blk]:
                            diffs.append((pos + off, a[off : off + blk]))
                            ndiff += len(diffs[-1][1])
                    if ndiff > limit:
                        return False
                pos += len(a)
            nread += len(fr.read())  # replica longer than the template: its tail goes
            _check_template(rep, src, h.hexdigest(), want)
            _remove_sidecars(rep.path)
            for off, data in diffs:
                fr.seek(off)
                fr.write(data)
            fr.truncate(pos)
        self._reset_done(rep, written=ndiff, read=nread, delta=True)
        return True


class CopyPerRollout(ReplicaPool):
    """Baseline with the same interface: every lease copies the template afresh (and every release
    drops the replica's connection), whether or not the previous trajectory wrote anything."""

    _always_reset = True
