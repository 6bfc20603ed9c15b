"""A pool of writable per-trajectory SQLite replicas with lazy reset (stateful SQL-debugging tasks).

`ReplicaPool(templates, root_dir, replicas_per_db=4, workers=2, timeout_s=5.0, ...)` keeps, for every
template database, a fixed set of replica files under `root_dir` (never inside a template's folder),
partitioned across a few persistent worker processes (multiprocessing, *spawn*). Each replica has an
`available` and a `needs_reset` flag. `lease(trajectory_id, db_id)` binds a trajectory to one
(worker, db, replica) for its whole life; the replica is reset just before it is handed out, and only if
it `needs_reset` (a never-used replica needs one). `release()` makes it available again and marks it
dirty when anything may have changed. A clean replica is never reset. `CopyPerRollout` has the same
interface but copies the template on every lease (the baseline).

Replicas in WAL mode, reset by discarding the WAL (default, `wal_reset=True`)
----------------------------------------------------------------------------
A replica's main file is the template with header bytes 18-19 (file format write/read version) set to
2, which makes EVERY connection to it (the worker's, and a scorer's own connection, e.g.
`debugtasks.apply_submission` / `score_debug` on `lease.path`) use WAL mode. `replica_sha256[db_id]`
is the sha256 of that clean image. Each statement autocommits as before, but SQLite appends the
changed pages to `<replica>-wal` instead of writing the main file, so SQLite itself tracks the dirty
pages, other connections see the committed state, and an interrupted statement is rolled back by
SQLite without touching the earlier statements' commits. The main file is written only by a
checkpoint, and no checkpoint can happen while a lease is open:
- the worker's connection has `wal_autocheckpoint=0`; checkpoint / journal_mode pragmas are denied by
  the authorizer;
- right after each reset the worker opens the replica (eagerly, from `lease()`, before anything else
  can touch it) with a read-only "pin" connection first, and begins a read transaction on it while the
  WAL is empty: it holds WAL read-lock 0 until the worker closes the replica. A checkpoint by ANY
  connection (the scorer's autocheckpoint past 1000 pages, its `PRAGMA wal_checkpoint`) needs read-lock 0
  exclusively and gets SQLITE_BUSY; a close can checkpoint only with an EXCLUSIVE lock on the main file,
  which the pin's SHARED lock denies; the pin is closed last (after the writer) and, being read-only,
  never checkpoints. (The pin lives in the worker because POSIX locks are per process: any close of any
  descriptor of the file in the same process would drop them; the worker opens the replica through
  SQLite only.)
A dirty release closes the worker's connections (writer, then pin); the lazy reset then deletes
`-wal` and `-shm` (0 bytes written, at most 136 + 32 header bytes read) after checking: the pin was held since the last
reset (`pin_ok`: every open of the replica began its pin on an empty WAL, and the worker was never
lost - a killed / respawned worker clears it for all its replicas), the main file's (size, mtime_ns,
inode) is unchanged, no `-journal`, `-wal` and `-shm` exist and record no checkpoint (wal-index
nBackfill == nBackfillAttempted == 0 - the latter is set before a checkpoint writes any page; WAL header
checkpoint sequence 0 and salts equal to the wal-index ones). When any check fails, the fallback
below runs; it never trusts the main file.
Why not one transaction per lease, rolled back at release (the same dirty pages, in the rollback
journal): its changes would be uncommitted, so the scorer's own connection would not see them and could
not write (`database is locked`; checked), and an interrupted statement can make SQLite roll back the
whole transaction. WAL keeps per-statement autocommit and makes the discard safe instead.

Fallback / `wal_reset=False` reset: the first creation of a replica is a full copy (to `<replica>.tmp`,
then an atomic rename). Otherwise, by default (`delta_reset=True`), the replica is reset *in place*:
one read pass over template and replica collects the `delta_block`-byte blocks that differ from the
clean image and hashes the template; only when the hash equals the recorded sha256 are those blocks
written and the file truncated to the template's length. When more than `delta_max_frac` (25%)
differs, or the replica file is missing, a full copy is made instead. Sidecar files are removed first.
With `wal_reset=False` the replicas stay in rollback mode (`journal_mode=MEMORY`, the main file is
written by every commit) and every dirty release costs a delta / full reset, as before.
`stats()`: leases, resets, delta_resets, wal_resets, wal_bytes (size of the WAL files discarded = what
SQLite wrote into them), bytes_copied (bytes WRITTEN into replicas by resets), bytes_read (template +
replica bytes read by resets; WAL resets: the 136 + 32 header bytes checked), dirty_releases,
clean_releases, timeouts, worker_crashes, exhausted, active_leases, replicas.

Dirty detection (release marks the replica dirty, hence reset before its next lease, when ANY holds):
1. the authorizer of the replica's connection allowed a writing action (INSERT, UPDATE, DELETE, any
   CREATE / DROP incl. TEMP objects, ALTER TABLE, REINDEX) while the statement was *compiled*. Every statement
   run through the pool is compiled on that one connection, so a statement that can change data or
   schema cannot run without setting the flag (a caller writing through its own connection to
   `lease.path` must say so: `release(..., crashed=True)`, as debugagent does). This is deliberately
   conservative: an UPDATE matching no row, a write that failed (constraint error, rolled back) or
   was interrupted counts as dirty, because we cannot prove cheaply that nothing changed (so does a
   SELECT over a table-valued function such as `json_each`: SQLite authorizes an internal UPDATE of
   the schema table when it builds the eponymous virtual table);
2. `total_changes()` of the connection grew;
3. any call of the lease ended in `timeout` or `worker_crash`, or `release(..., crashed=True)`;
4. the replica file's (size, mtime_ns, inode) differs from what it was right after the reset, or a
   `-journal` file lies next to it, or a non-empty `-wal` (rollback mode: any `-wal`) (belt and braces;
   cannot prove cleanliness on its own).
A replica is released clean only when none of them holds: then only SELECT/READ/FUNCTION/RECURSIVE
and read-only schema pragmas were compiled on the replica during the lease, which cannot change it.
`PRAGMA data_version` is not used: it only reports commits by *other* connections.

Execution (`execute(trajectory_id, sql)` -> `sqlrl.sql.sandbox.SQLResult`), outermost layer first:
- parent pre-check (tokenizer aware, `sqlrl.sql.sandbox.split_statements` logic): one statement per call
  (`multiple_statements`), empty -> `empty_sql`, too long -> `too_large`; statements starting with
  ATTACH, DETACH, VACUUM (incl. VACUUM INTO), BEGIN, COMMIT, END, ROLLBACK, SAVEPOINT, RELEASE,
  ANALYZE -> `forbidden`; EXPLAIN only in front of SELECT / WITH / VALUES;
- the worker's connection to the leased replica (`mode=rw`, so it never creates a file) has, in WAL
  mode, `wal_autocheckpoint=0` (it must report journal_mode `wal`, else the open fails -> dirty), in
  rollback mode `journal_mode=MEMORY`; and `synchronous=OFF` (replicas are disposable: a crash mid-write
  marks the replica dirty and the reset replaces the file / the WAL), `trusted_schema=0`,
  `temp_store=MEMORY`, set before the authorizer; SQLITE_LIMIT_ATTACHED=0 and the other limits of the
  sandbox;
- an authorizer ALLOWLIST: reads, the write actions listed above, functions except the sandbox's deny
  list (`load_extension`, `readfile`, `writefile`, ...; SQLite's internal `sqlite_rename_*` helpers
  are allowed because ALTER TABLE calls them and user SQL cannot), the read-only schema pragmas of
  the sandbox. Everything else is denied -> `forbidden`: ATTACH/DETACH (also what VACUUM does
  internally), transactions and savepoints (each statement autocommits, so no transaction ever spans
  two calls or two trajectories), every other PRAGMA (journal_mode, wal_checkpoint, wal_autocheckpoint,
  cache_spill, writable_schema, query_only, ...),
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
the rules above) is reset before it is handed out again; a released-clean replica's file is unchanged;
WAL mode: a WAL reset happens only when the checks listed above pass, otherwise the verified delta /
full reset runs (tested: scorer connections writing past the autocheckpoint threshold and asking for
checkpoints, workers killed mid-lease and mid-write, checkpoints forced while unpinned).
Not guaranteed: a worker killed for one trajectory's hung statement also drops the *connections* of
the other replicas it owns: their TEMP objects (already counted as dirty) vanish mid-lease, files
are unaffected (WAL mode: the committed statements of every lease survive in its WAL, a killed
statement's uncommitted frames are ignored; the next reset of each of that worker's replicas is a
delta / full one, since their pins died). Memory limits are per worker, not per call. Templates are
trusted files, the SQL is not. Non-deterministic SQL stays non-deterministic. A template changed and
restored between two checks is not noticed (only the bytes actually copied are verified); a WAL reset
reads no template bytes, so a template changed after its replica was copied is noticed only by the
next delta / full reset (the replica keeps the content verified when it was copied). Callers that open
`lease.path` themselves must do so through SQLite (the lease's state is in `-wal`; a raw copy of the
main file misses it), must not delete the sidecar files, and must close their connections before
`release()` (Linux: a connection still holding the `-shm` mapped at reset time is detected through
an OFD lock on its DMS byte, and the reset is then a full copy to a new inode, which isolates it; a
connection that never read is not detected, and a stale one closed later may unlink the then-current
lease's `-wal`/`-shm` names). The WAL is never checkpointed or restarted during a lease: it grows with what the lease
writes (disk, not memory) until the reset deletes it. WAL mode needs shared memory (`-shm`, mmap) and
POSIX locks that work between processes: `root_dir` must be on a local filesystem, not NFS / SMB
(`wal_reset=False` otherwise). Each open replica costs a worker ~5 file descriptors (the worker raises
its RLIMIT_NOFILE soft limit) and a 32 KiB `-shm` file. Threads may share the pool; calls for replicas
owned by the same worker are serialised.
"""

from __future__ import annotations

import atexit
import hashlib
import marshal
import multiprocessing
import os
import re
import sqlite3
import struct
import sys
import threading
import time
import types
import urllib.parse
import weakref
from dataclasses import dataclass
from typing import Any

from sqlrl.artifacts import sha256_file

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None  # type: ignore[assignment]
from sqlrl.sql.sandbox import (
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
from sqlrl.sql.sandbox import _precheck as _sandbox_precheck

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


_SQLITE_MAGIC = b"SQLite format 3\x00"


def _wal_image(head: bytes) -> bytes:
    """The first chunk of a template as a WAL-mode replica stores it: header bytes 18 and 19 (file format
    write/read version) = 2, which makes every connection open the file in WAL mode. Nothing else differs."""
    if len(head) >= 100 and head.startswith(_SQLITE_MAGIC) and head[18:20] != b"\x02\x02":
        return head[:18] + b"\x02\x02" + head[20:]
    return head


_SHM_DMS = 128  # unix VFS: byte of the -shm every connection with the wal-index mapped holds read-locked


def _shm_in_use(path: str) -> bool:
    """True when some connection, in any process INCLUDING this one, still has the replica's wal-index
    mapped (SQLite's unix VFS holds a POSIX read lock on the -shm's DMS byte for as long as it does).
    An open-file-description lock conflicts with POSIX locks even when this process holds them, unlike
    F_GETLK / F_SETLK. Such a connection (a caller that did not close its own connection before
    release) keeps the per-inode wal-index of the old -shm: a WAL discard or an in-place delta would
    keep the inode and let it be shared by the next trajectory's connections in that process, or let
    the stale connection checkpoint its old WAL into the next lease's main file. False where OFD locks
    are not available (non-Linux): the check is skipped."""
    ofd = getattr(fcntl, "F_OFD_SETLK", None) if fcntl is not None else None
    if ofd is None:
        return False
    try:
        fd = os.open(path + "-shm", os.O_RDWR)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.fcntl(fd, ofd, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, _SHM_DMS, 1, 0))
        return False
    except OSError:
        return True
    finally:
        os.close(fd)  # releases the OFD lock


def _wal_size(path: str) -> int:
    try:
        return os.path.getsize(path + "-wal")
    except OSError:
        return 0


class _Conn:
    __slots__ = ("conn", "pin", "wrote")

    def __init__(self) -> None:
        self.conn: sqlite3.Connection | None = None
        self.pin: sqlite3.Connection | None = None  # WAL mode: read-only connection holding WAL read-lock 0
        self.wrote = False

    def close(self) -> None:
        """The writer first, the read-only pin last: while the pin is open nobody can take the exclusive
        lock a checkpoint-on-close needs, and a read-only connection never checkpoints."""
        for c in (self.conn, self.pin):
            if c is not None:
                try:
                    c.close()
                except Exception:  # noqa: BLE001
                    pass
        self.conn = self.pin = None


def write_authorizer(on_write=None):
    """The authorizer for policy SQL on a writable replica (also used by `debugtasks.apply_submission`
    for a submitted solution): reads, the write actions of `_WRITE_ACTIONS` (calling `on_write()` when
    one is compiled), functions except `_POOL_DENY_FUNCTIONS`, the read-only pragmas of
    `_ALLOWED_PRAGMAS`; everything else (ATTACH / DETACH, transactions and savepoints, other pragmas,
    virtual tables, ANALYZE, VACUUM's internal ATTACH) is denied."""

    def authorizer(action: int, arg1: Any, arg2: Any, dbname: Any, source: Any) -> int:
        if action in _READ_ACTIONS:
            return _OK
        if action == _A_FUNCTION:
            return _DENY if (arg2 or "").lower() in _POOL_DENY_FUNCTIONS else _OK
        if action == _A_PRAGMA:
            return _OK if (arg1 or "").lower() in _ALLOWED_PRAGMAS else _DENY
        if action in _WRITE_ACTIONS:
            if on_write is not None:
                on_write()
            return _OK
        return _DENY

    return authorizer


def _open_pin(path: str) -> tuple[sqlite3.Connection, bool]:
    """Read-only connection in a read transaction. Begun while the WAL is empty, it holds WAL read-lock 0,
    which forbids every checkpoint (by any connection) to copy WAL frames into the main file until it
    ends. Returns (pin, pinned): pinned is False when the WAL was not empty (then the lock is not 0)."""
    before = _wal_size(path)
    pin = sqlite3.connect(
        "file:" + urllib.parse.quote(path) + "?mode=ro",
        uri=True,
        isolation_level=None,
        check_same_thread=False,
    )
    try:
        pin.execute("BEGIN")
        pin.execute("PRAGMA schema_version").fetchall()  # starts the read; does not load the schema
        pinned = pin.in_transaction and before == 0 and _wal_size(path) == 0
    except BaseException:
        pin.close()
        raise
    return pin, pinned


def _open_replica(path: str, cfg: dict, deadline: _Deadline) -> tuple[_Conn, bool]:
    """-> (connection box, pinned). Non-WAL pools: pinned is False and unused."""
    uri = "file:" + urllib.parse.quote(path) + "?mode=rw"
    box = _Conn()
    wal = bool(cfg.get("wal"))
    pinned = False
    try:
        if wal:
            box.pin, pinned = _open_pin(path)
        conn = box.conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        if wal:
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.OperationalError(f"replica is not in WAL mode (journal_mode={mode})")
            pragmas: tuple[str, ...] = ("wal_autocheckpoint=0", "synchronous=OFF")
        else:
            pragmas = ("journal_mode=MEMORY", "synchronous=OFF")
        for pragma in pragmas + ("trusted_schema=0", "temp_store=MEMORY"):
            conn.execute("PRAGMA " + pragma).fetchall()
        _limit(conn, cfg, deadline, trigger_depth=10)

        def wrote() -> None:
            box.wrote = True  # sticky for the life of the connection (closed on a dirty release)

        conn.set_authorizer(write_authorizer(wrote))
    except BaseException:
        box.close()
        raise
    return box, pinned


def _exec(conns: dict, cfg: dict, deadline: _Deadline, path: str, sql: str, timeout_s: float) -> tuple:
    """-> (status, cols, rows, n, ms, msg, wrote, total_changes, opened). opened: 0 the connection was
    already open, 1 opened by this call without a WAL pin, 2 opened with the pin on read-lock 0."""
    t0 = time.perf_counter()
    deadline.t = time.monotonic() + timeout_s
    box = conns.get(path)
    opened = 0
    try:
        if box is None:
            box, pinned = _open_replica(path, cfg, deadline)
            conns[path] = box
            opened = 2 if pinned else 1
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
            1,
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
    return out + (int(box.wrote), conn.total_changes, opened)


def _raise_nofile() -> None:
    """WAL mode keeps ~5 descriptors per open replica (writer + pin: db and WAL each, shared -shm)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, ValueError, OSError):
        pass


def _pool_worker_main(pipe: Any, cfg: dict) -> None:
    """Requests (marshal): ("exec", path, sql, timeout_s) -> result tuple; ("open", path) -> ("ok", opened)
    or ("error", message); ("close", path) -> ("ok",)."""
    _setup_process(cfg)
    _raise_nofile()
    conns: dict[str, _Conn] = {}
    deadline = _Deadline()
    try:
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
            elif op == "open":
                if req[1] in conns:
                    out = ("ok", 0)
                else:
                    try:
                        box, pinned = _open_replica(req[1], cfg, deadline)
                        conns[req[1]] = box
                        out = ("ok", 2 if pinned else 1)
                    except Exception as e:  # noqa: BLE001
                        out = ("error", f"{type(e).__name__}: {e}")
            elif op == "close":
                box = conns.pop(req[1], None)
                if box is not None:
                    box.close()
                out = ("ok",)
            else:
                out = ("runtime_error", f"unknown op {op!r}")
            try:
                pipe.send_bytes(marshal.dumps(out))
            except (EOFError, OSError):
                return
    finally:  # writers before pins (see _Conn.close), not in the interpreter's arbitrary order
        for box in conns.values():
            box.close()


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
    pin_ok: bool = False  # WAL mode: a pin held the main file unwritable since the last reset


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
        max_value_bytes: int = 4 * 2**20,
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
            ht, hr, n = hashlib.sha256(), hashlib.sha256(), 0
            with open(path, "rb") as f:
                while b := f.read(1 << 20):
                    ht.update(b)
                    hr.update(_wal_image(b) if n == 0 and self.wal_reset else b)
                    n += len(b)
            self.template_sha256[str(db_id)] = ht.hexdigest()
            self.replica_sha256[str(db_id)] = hr.hexdigest()
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
        t = self.timeout_s if timeout_s is None else float(timeout_s)
        hard = max(self.hard_timeout_s, t + (self.hard_timeout_s - self.timeout_s))
        w = self._workers[rep.worker]
        t0 = time.monotonic()
        with w.lock:
            try:
                st, cols, rows, n, ms, msg, wrote, changes, opened = w.call(("exec", rep.path, pre, t), hard)
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
                    r.pin_ok = False  # its pins died with it: main files no longer provably untouched

    def _file_changed(self, rep: _Replica) -> bool:
        try:
            st = os.stat(rep.path)
        except OSError:
            return True
        if rep.sig != (st.st_size, st.st_mtime_ns, st.st_ino):
            return True
        if self.wal_reset:  # a -wal file with anything in it holds committed (or spilled) pages
            return os.path.exists(rep.path + "-journal") or _wal_size(rep.path) > 0
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
            except (_WorkerHung, _WorkerDied):
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
            except (_WorkerHung, _WorkerDied):
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
        stale = self.wal_reset and rep.sig is not None and _shm_in_use(rep.path)
        if self.wal_reset and rep.sig is not None and not stale and self._wal_discard(rep):
            return
        if (
            not stale
            and self.delta_reset
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
                    fo.write(_wal_image(b) if n == 0 and self.wal_reset else b)
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

    def _wal_discard(self, rep: _Replica) -> bool:
        """WAL-mode reset: delete `-wal` and `-shm`, leaving the main file, which SQLite never wrote.

        Only when all of these hold (else False: the caller falls back to delta / full copy):
        - `pin_ok`: since the last reset, every open of the replica by its worker began the read-only pin
          on an empty WAL (WAL read-lock 0, held until the writer was closed), and the worker was never
          lost. While it is held no checkpoint can copy frames into the main file (walCheckpoint needs
          read-lock 0 exclusively; the worker's own checkpoints are off and their pragmas denied) and no
          close can checkpoint (that needs an EXCLUSIVE lock on the main file, which the pin's SHARED
          lock blocks; the pin is read-only and never checkpoints);
        - the main file's (size, mtime_ns, inode) is what it was right after the last reset, and there is
          no `-journal`;
        - `-wal` and `-shm` exist (the pin created them) and record no checkpoint: wal-index nBackfill ==
          nBackfillAttempted == 0 (the latter is set BEFORE a checkpoint writes a page), and, when the
          WAL has a header, its checkpoint sequence number is 0 and its salts equal the wal-index ones
          (a WAL restart after a full backfill changes them).
        """
        if not rep.pin_ok or os.path.exists(rep.path + "-journal"):
            return False
        try:
            st = os.stat(rep.path)
            if rep.sig != (st.st_size, st.st_mtime_ns, st.st_ino):
                return False
            with open(rep.path + "-shm", "rb") as f:
                shm = f.read(136)
            wal_n = os.path.getsize(rep.path + "-wal")
            hdr = b""
            if wal_n:
                with open(rep.path + "-wal", "rb") as f:
                    hdr = f.read(32)
        except OSError:
            return False
        nread = len(shm) + len(hdr)
        if len(shm) < 136:
            return False
        n_backfill, n_attempted = struct.unpack_from("=I", shm, 96)[0], struct.unpack_from("=I", shm, 128)[0]
        if n_backfill or n_attempted:
            return False
        if wal_n:
            if len(hdr) < 32 or struct.unpack_from(">I", hdr, 12)[0] != 0 or hdr[16:24] != shm[32:40]:
                return False
        try:
            for s in ("-wal", "-shm"):
                os.remove(rep.path + s)
        except OSError:
            # half-removed: the delta / full reset that follows removes the rest and verifies the bytes
            return False
        self._reset_done(rep, written=0, read=nread, kind="wal", wal=wal_n)
        return True

    def _delta(self, rep: _Replica, src: str, want: str) -> bool:
        """Reset in place by rewriting only the blocks that differ from the template. One read pass over
        both files collects the differing template blocks and hashes the template; nothing is written
        unless the hash equals the recorded sha256 (else TemplateChanged). Afterwards the replica is
        byte-identical to the template (WAL mode: to the template with header bytes 18-19 = 2). Returns
        False (caller does a full copy) when the replica is missing or more than `delta_max_frac` of it
        differs."""
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
                h.update(a)
                if pos == 0 and self.wal_reset:
                    a = _wal_image(a)
                b = fr.read(len(a))
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
        self._reset_done(rep, written=ndiff, read=nread, kind="delta")
        return True


class CopyPerRollout(ReplicaPool):
    """Baseline with the same interface: every lease copies the template afresh (and every release
    drops the replica's connection), whether or not the previous trajectory wrote anything."""

    _always_reset = True
