"""The replica pool's worker side: the writable connection to a leased replica and its WAL pin.

Covered:
- A replica is opened `mode=rw` (never creates a file). WAL mode: a read-only "pin" connection is
  opened first and begins a read transaction while the WAL is empty, holding WAL read-lock 0 until
  the worker closes the replica: no checkpoint by any connection can copy frames into the main file,
  and no close can checkpoint (the pin's SHARED lock denies the EXCLUSIVE lock that needs). The
  writer has `wal_autocheckpoint=0` and must report journal_mode `wal`; rollback mode uses
  `journal_mode=MEMORY`. Both: `synchronous=OFF` (replicas are disposable), `trusted_schema=0`,
  `temp_store=MEMORY`, set before `guard.write_authorizer`; the limits of `engine.set_limits`.
- Each reply to "exec" reports whether a writing action was compiled on the connection (sticky),
  its `total_changes()`, and whether this call opened it (with or without a pin on read-lock 0).
- The worker closes writers before pins, and raises its RLIMIT_NOFILE soft limit (~5 descriptors
  per open replica).
Not covered: POSIX locks are per process, so the pin must live in the worker, which opens the
replica through SQLite only; the worker's connections to other replicas die with it when it is
killed for one trajectory's hung statement.
"""

from __future__ import annotations

import os
import sqlite3
import time
import urllib.parse
from typing import Any

from sqlrl.sql.engine import Deadline, classify_error, run_statement, set_limits
from sqlrl.sql.guard import write_authorizer
from sqlrl.sql.replica_files import wal_size
from sqlrl.sql.workers import serve


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


def _open_pin(path: str) -> tuple[sqlite3.Connection, bool]:
    """Read-only connection in a read transaction. Begun while the WAL is empty, it holds WAL read-lock 0,
    which forbids every checkpoint (by any connection) to copy WAL frames into the main file until it
    ends. Returns (pin, pinned): pinned is False when the WAL was not empty (then the lock is not 0)."""
    before = wal_size(path)
    pin = sqlite3.connect(
        "file:" + urllib.parse.quote(os.fsencode(path)) + "?mode=ro",
        uri=True,
        isolation_level=None,
        check_same_thread=False,
    )
    try:
        pin.execute("BEGIN")
        pin.execute("PRAGMA schema_version").fetchall()  # starts the read; does not load the schema
        pinned = pin.in_transaction and before == 0 and wal_size(path) == 0
    except BaseException:
        pin.close()
        raise
    return pin, pinned


def _open_replica(path: str, cfg: dict, deadline: Deadline) -> tuple[_Conn, bool]:
    """-> (connection box, pinned). Non-WAL pools: pinned is False and unused."""
    uri = "file:" + urllib.parse.quote(os.fsencode(path)) + "?mode=rw"
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
        set_limits(conn, cfg, deadline, trigger_depth=10)

        def wrote() -> None:
            box.wrote = True  # sticky for the life of the connection (closed on a dirty release)

        conn.set_authorizer(write_authorizer(wrote))
    except BaseException:
        box.close()
        raise
    return box, pinned


def _exec(conns: dict, cfg: dict, deadline: Deadline, path: str, sql: str, timeout_s: float) -> tuple:
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
        status, cols, rows, msg = run_statement(conn, sql, cfg, deadline)
        out = (status, cols, rows, len(rows), (time.perf_counter() - t0) * 1e3, msg)
    except Exception as e:  # noqa: BLE001
        st, msg = classify_error(e, timeout_s)
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


def _handle(conns: dict, cfg: dict, deadline: Deadline, req: tuple) -> tuple:
    """("exec", path, sql, timeout_s) -> result tuple (see `_exec`); ("open", path) -> ("ok", opened) or
    ("error", message); ("close", path) -> ("ok",)."""
    op = req[0]
    if op == "exec":
        return _exec(conns, cfg, deadline, req[1], req[2], req[3])
    if op == "open":
        if req[1] in conns:
            return ("ok", 0)
        try:
            box, pinned = _open_replica(req[1], cfg, deadline)
        except Exception as e:  # noqa: BLE001
            return ("error", f"{type(e).__name__}: {e}")
        conns[req[1]] = box
        return ("ok", 2 if pinned else 1)
    if op == "close":
        box = conns.pop(req[1], None)
        if box is not None:
            box.close()
        return ("ok",)
    return ("runtime_error", f"unknown op {op!r}")


def replica_worker_main(conn: Any, cfg: dict, progress: Any) -> None:
    """Worker loop of the replica pool: the requests of `_handle`, one reply each (`workers.serve`)."""
    _raise_nofile()
    conns: dict[str, _Conn] = {}
    deadline = Deadline()
    try:
        serve(conn, progress, lambda req: _handle(conns, cfg, deadline, req))
    finally:  # writers before pins (see _Conn.close), not in the interpreter's arbitrary order
        for box in conns.values():
            box.close()
