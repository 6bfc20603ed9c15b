"""A pool of writable per-trajectory SQLite replicas with lazy reset (stateful SQL-debugging tasks).

`ReplicaPool(templates, root_dir, ...)` keeps, for every template, a fixed set of replica files under
`root_dir`, partitioned across a few worker processes (`sqlrl.sql.workers`). `lease(trajectory_id,
db_id)` binds a trajectory to one replica for its whole life, resetting it first only if it
`needs_reset`; `release()` marks it dirty when anything may have changed: a writing action was
compiled on its connection (`guard.write_authorizer`; conservative: a failed or no-op write counts),
`total_changes()` grew, a call ended in `timeout` / `worker_crash`, `release(crashed=True)`, or the
file's (size, mtime_ns, inode), a `-journal` or a non-empty `-wal` says so. Resets (`replica_files`):
discard the WAL (default, `wal_reset=True`), else rewrite the differing blocks (`delta_reset=True`),
else copy. `execute` runs one statement: the pre-check of `guard` with `POOL_FORBIDDEN_START`, then
the replica's connection (`replica_worker`). `CopyPerRollout` copies on every lease (the baseline).

Covered: a template is only ever read; replicas live under `root_dir`, which may not be, or lie
inside, a template's folder; no reset writes into a replica unless the template bytes it read hash
to the sha256 recorded at start (else `TemplateChanged`); one replica per trajectory at a time, so
concurrent trajectories never see each other's writes; a replica released dirty is reset before
its next lease; a released-clean replica's file is unchanged. Statements autocommit; transactions,
ATTACH, VACUUM and other pragmas are `forbidden`.
Not covered: a worker killed for one trajectory's hung statement drops the connections (and TEMP
objects) of the other replicas it owns. Callers that open `lease.path` themselves must use SQLite,
must not delete sidecar files, must close their connections before `release()`, and must say
`crashed=True` when they wrote. The WAL grows until the reset. `root_dir` must be a local
filesystem for WAL mode. Memory limits are per worker; templates are trusted, the SQL is not.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlrl.artifacts import sha256_file
from sqlrl.sql.engine import seconds, time_limits
from sqlrl.sql.guard import POOL_FORBIDDEN_START, check_statement
from sqlrl.sql.replica_files import (
    TemplateChanged,
    delta_reset,
    full_copy,
    hash_template,
    shm_in_use,
    wal_discard,
    wal_size,
)
from sqlrl.sql.replica_worker import replica_worker_main
from sqlrl.sql.result import MAX_VALUE_BYTES, SQLResult, failure
from sqlrl.sql.workers import WorkerDied, WorkerHung, WorkerPool, close_at_exit, forget_at_exit

__all__ = ["CopyPerRollout", "Lease", "PoolExhausted", "ReplicaPool", "TemplateChanged", "sha256_file"]


class PoolExhausted(RuntimeError):
    """No replica of the database became available within the lease timeout."""


@dataclass(frozen=True)
class Lease:
    trajectory_id: str
    db_id: str
    worker: int
    replica: int
    path: str


def _precheck(sql: Any, max_sql_chars: int) -> SQLResult | str:
    """The sandbox's statement check, with the pool's own list of forbidden statement starts."""
    return check_statement(sql, max_sql_chars, forbidden_start=POOL_FORBIDDEN_START, context="on a replica")


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
    pin_ok: bool = False  # WAL mode: a pin held the main file unwritable since the last reset


def _safe_name(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", s) or "_"


def _inside(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


class ReplicaPool:
    """Writable per-trajectory replicas with lazy reset (see the module docstring).

    templates: {db_id: template path} or a list of paths (db_id = file stem).
    root_dir: where replica files live (created; must not be or lie inside a template's folder).
    replicas_per_db: fixed replicas per template. workers: worker processes (replicas round-robin).
    timeout_s: soft per-statement deadline; hard_timeout_s: watchdog limit (default 2 * timeout_s + 1).
    lease_timeout_s: how long `lease` waits for a free replica before raising `PoolExhausted`.
    max_rows / max_result_bytes / max_value_bytes / max_sql_chars / heap_limit_bytes /
    memory_limit_bytes / progress_ops: as in `sqlrl.sql.sandbox.Sandbox`.
    remove_files: delete the replica files this pool created on `close()`.
    wal_reset: keep replicas in WAL mode and reset a dirty one by discarding its `-wal`/`-shm` files
        (see the module docstring); the fallback, and the only reset when False, is the delta / full copy.
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
        max_value_bytes: int = MAX_VALUE_BYTES,
        max_sql_chars: int = 1_000_000,
        heap_limit_bytes: int = 512 * 2**20,
        memory_limit_bytes: int | None = 2 * 2**30,
        progress_ops: int = 10_000,
        remove_files: bool = True,
        wal_reset: bool = True,
        delta_reset: bool = True,
        delta_block: int = 4096,
        delta_max_frac: float = 0.25,
    ) -> None:
        if replicas_per_db < 1 or workers < 1:
            raise ValueError("replicas_per_db and workers must be >= 1")
        if not isinstance(templates, dict):
            tl = [os.fspath(p) for p in templates]
            templates = {os.path.splitext(os.path.basename(p))[0]: p for p in tl}
            if len(templates) != len(tl):
                raise ValueError("template file stems must be unique (pass a dict to name them)")
        if not templates:
            raise ValueError("no templates")
        self.timeout_s, self.hard_timeout_s = time_limits(timeout_s, hard_timeout_s, "ReplicaPool")
        self.lease_timeout_s = float(lease_timeout_s)
        self.max_sql_chars = int(max_sql_chars)
        self.remove_files = bool(remove_files)
        self.wal_reset = bool(wal_reset) and not self._always_reset
        self.delta_reset = bool(delta_reset)
        self.delta_block = max(512, int(delta_block))
        self.delta_max_frac = float(delta_max_frac)
        self.root_dir = os.path.realpath(os.fspath(root_dir))
        self.templates: dict[str, str] = {}
        self.template_sha256: dict[str, str] = {}
        self.template_size: dict[str, int] = {}
        self.replica_sha256: dict[str, str] = {}  # of a clean replica (WAL mode: header bytes 18-19 = 2)
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
            sha_t, sha_r, n = hash_template(path, self.wal_reset)
            self.template_sha256[str(db_id)] = sha_t
            self.replica_sha256[str(db_id)] = sha_r
            self.template_size[str(db_id)] = n
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
            "wal": self.wal_reset,
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
            wal_resets=0,
            wal_bytes=0,
            dirty_releases=0,
            clean_releases=0,
            timeouts=0,
            worker_crashes=0,
            exhausted=0,
        )
        self._pool = WorkerPool(
            int(workers),
            self._cfg,
            replica_worker_main,
            lambda i: f"sqlrl-pool-worker-{i}",
            self.timeout_s,
            self.hard_timeout_s,
        )
        self._workers = self._pool.workers
        close_at_exit(self)

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
            if self.wal_reset and not rep.open_in_worker:
                self._open_in_worker(rep)
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
            self._close_in_worker(rep)  # writer, then pin: the WAL stays for the lazy reset to discard
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
        t = self.timeout_s if timeout_s is None else seconds(timeout_s, "ReplicaPool.execute: timeout_s")
        hard = self._pool.hard_limit(t)
        w = self._workers[rep.worker]
        t0 = time.monotonic()
        with w.lock:
            try:
                st, cols, rows, n, ms, msg, wrote, changes, opened = w.call(("exec", rep.path, pre, t), hard)
            except WorkerHung:
                rep.dirty = True
                self._worker_lost(rep.worker)
                self._stats["timeouts"] += 1
                return failure(
                    "timeout",
                    f"statement exceeded the hard time limit of {hard:g} s; the worker was killed",
                    (time.monotonic() - t0) * 1e3,
                )
            except WorkerDied as e:
                rep.dirty = True
                self._worker_lost(rep.worker)
                self._stats["worker_crashes"] += 1
                return failure(
                    "worker_crash", f"pool worker died ({e}); it was restarted", (time.monotonic() - t0) * 1e3
                )
        if opened or not rep.open_in_worker:
            rep.open_in_worker = True
            rep.base_changes = 0
            if opened != 2:
                rep.pin_ok = False
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
                    w.wait_ready()
                except (WorkerHung, WorkerDied):
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
        """leases, resets, delta_resets, wal_resets, wal_bytes (size of the WAL files discarded = what
        SQLite wrote into them), bytes_copied (bytes written into replicas by resets), bytes_read
        (template + replica bytes read by resets; WAL resets: the header bytes checked),
        dirty_releases, clean_releases, timeouts, worker_crashes, exhausted, active_leases, replicas."""
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
        self._pool.close()
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
        forget_at_exit(self)

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
                    r.pin_ok = False  # its pins died with it: main files no longer provably untouched

    def _file_changed(self, rep: _Replica) -> bool:
        try:
            st = os.stat(rep.path)
        except OSError:
            return True
        if rep.sig != (st.st_size, st.st_mtime_ns, st.st_ino):
            return True
        if self.wal_reset:  # a -wal file with anything in it holds committed (or spilled) pages
            return os.path.exists(rep.path + "-journal") or wal_size(rep.path) > 0
        return any(os.path.exists(rep.path + s) for s in ("-journal", "-wal"))

    def _open_in_worker(self, rep: _Replica) -> None:
        """WAL mode, right after a reset: the worker opens the replica (pin first) before anything else can
        touch it, so that the pin exists even if the trajectory never runs a statement through the pool
        (a scorer writing through its own connection would otherwise be the last connection, whose close
        checkpoints into the main file). Failure only costs the fast reset next time."""
        w = self._workers[rep.worker]
        with w.lock:
            try:
                out = w.call(("open", rep.path), self.hard_timeout_s)
            except (WorkerHung, WorkerDied):
                self._worker_lost(rep.worker)
                return
        if out[0] == "ok":
            if out[1]:
                rep.open_in_worker = True
                rep.base_changes = 0
                if out[1] != 2:
                    rep.pin_ok = False
        else:
            rep.pin_ok = False

    def _close_in_worker(self, rep: _Replica) -> None:
        w = self._workers[rep.worker]
        with w.lock:
            try:
                w.call(("close", rep.path), self.hard_timeout_s)
            except (WorkerHung, WorkerDied):
                self._worker_lost(rep.worker)
        rep.open_in_worker = False

    def _reset(self, rep: _Replica) -> None:
        """Make the replica clean: discard its WAL (WAL mode, when provably enough), else rewrite the blocks
        that differ (delta), else copy the template. The latter two install nothing unless the template
        bytes read hash to the recorded sha256. The replica has no open connection (closed on the dirty
        release / never opened)."""
        src = self.templates[rep.db_id]
        want = self.template_sha256[rep.db_id]
        if rep.open_in_worker:  # defensive: never replace a file under an open connection
            self._close_in_worker(rep)
        # a connection still open on the replica (caller misuse): only a new inode isolates it
        stale = self.wal_reset and rep.sig is not None and shm_in_use(rep.path)
        if self.wal_reset and rep.sig is not None and not stale:
            got = wal_discard(rep)
            if got is not None:
                self._reset_done(rep, written=0, read=got[0], kind="wal", wal=got[1])
                return
        if not stale and self.delta_reset and not self._always_reset and rep.sig is not None:
            limit = self.delta_max_frac * self.template_size[rep.db_id]
            got = delta_reset(rep, src, want, block=self.delta_block, max_bytes=limit, wal=self.wal_reset)
            if got is not None:
                self._reset_done(rep, written=got[0], read=got[1], kind="delta")
                return
        n = full_copy(rep, src, want, self.wal_reset)
        self._reset_done(rep, written=n, read=n, kind="full")

    def _reset_done(self, rep: _Replica, *, written: int, read: int, kind: str, wal: int = 0) -> None:
        st = os.stat(rep.path)
        with self._cond:
            rep.sig = (st.st_size, st.st_mtime_ns, st.st_ino)
            rep.needs_reset = False
            rep.open_in_worker = False
            rep.pin_ok = True  # no -wal / -shm and no connection: nothing can have been checkpointed yet
            self._stats["resets"] += 1
            self._stats["delta_resets"] += int(kind == "delta")
            self._stats["wal_resets"] += int(kind == "wal")
            self._stats["wal_bytes"] += wal
            self._stats["bytes_copied"] += written
            self._stats["bytes_read"] += read


class CopyPerRollout(ReplicaPool):
    """Baseline with the same interface: every lease copies the template afresh (and every release
    drops the replica's connection), whether or not the previous trajectory wrote anything."""

    _always_reset = True
