"""The one pool of watched worker processes under `Sandbox` and `ReplicaPool`.

A `Worker` is a process (multiprocessing, *spawn*), a duplex pipe carrying marshalled messages and
a shared progress slot [start time (time.monotonic), item, statement] that the process updates
before each item. A `WorkerPool` holds the workers and the watchdog: a call that runs past its
hard wall-clock limit gets its worker killed and respawned (`timeout`), a worker found dead is
respawned (`worker_crash`), and the next call works on a fresh worker.

Covered:
- `Worker.call` / `serve`: one request, one reply, at most `hard_limit_s` after the worker is up;
  raises `WorkerHung` / `WorkerDied` after respawning the worker (the replica pool).
- `WorkerPool.run_batch` / `serve_batches`: a list of statements, answers streamed back in order,
  each statement watched on its own; unanswered statements are re-run on the fresh worker (the
  sandbox).
- `WorkerPool.watch` / `replace`: the same watchdog rules for the pipelined scoring driver.
- A process starts with a bare `__main__` module in place (only inside `Process.start()`), so the
  caller's script is not re-imported and needs no `if __name__ == "__main__"` guard; it ignores
  SIGINT, sets `RLIMIT_AS` and SQLite's heap limits, imports `cfg["preload"]`, then marks itself up.
- `close_at_exit`: owners registered there are closed when the interpreter exits.
Not covered: another thread looking up `sys.modules["__main__"]` during a start sees the bare module.
Memory limits are per worker process, not per call. A worker is used by one thread at a time.
"""

from __future__ import annotations

import atexit
import importlib
import marshal
import multiprocessing
import os
import queue
import sqlite3
import sys
import threading
import time
import types
import weakref
from collections import OrderedDict
from typing import Any

from sqlrl.sql.result import SQLResult, failure

STARTING, IDLE = -2.0, -1.0  # progress[1] while the process starts up / before it takes a request
STARTUP_LIMIT_S = 120.0
_FLUSH_S = 0.02  # serve_batches sends buffered results at least this often (and at the end of a batch)
_START_LOCK = threading.Lock()


class WorkerDied(Exception):
    """The worker process died (it has been respawned)."""


class WorkerHung(Exception):
    """The worker did not answer within the hard limit (it has been killed and respawned)."""


# --------------------------------------------------------------------------------------------------
# Child side


def setup_process(cfg: dict) -> None:
    """Worker process set-up: ignore SIGINT, `RLIMIT_AS`, SQLite's process-wide heap limits."""
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


def mark_ready(progress: Any) -> None:
    """Called by a worker's main loop once it can take requests (`Worker.wait_ready` waits for it)."""
    progress[2] = 0.0
    progress[1] = IDLE


def _entry(conn: Any, cfg: dict, progress: Any, main: Any) -> None:
    """Process target: set up, import the preload modules, run `main(conn, cfg, progress)`."""
    setup_process(cfg)
    for name in cfg.get("preload") or ():
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a request that needs it reports the error
            pass
    main(conn, cfg, progress)


# --------------------------------------------------------------------------------------------------
# Parent side


class Worker:
    """One worker process running `main`, its pipe (`conn`) and its shared progress slot."""

    def __init__(self, ctx: Any, cfg: dict, main: Any, name: str) -> None:
        self.ctx, self.cfg, self.main, self.name = ctx, cfg, main, name
        self.lock = threading.Lock()  # for callers that share one worker between threads
        self.progress = ctx.RawArray("d", 3)
        self.proc: Any = None
        self.conn: Any = None
        self.started_at = 0.0
        self.sndbuf = 0  # the OS send buffer of `conn` (bytes), see `_send_buffer`
        self.refs: OrderedDict = OrderedDict()  # scoring reference key -> weight, held by the process
        self.ref_weight = 0
        self.start()

    def start(self) -> None:
        parent, child = self.ctx.Pipe(duplex=True)
        self.progress[0] = 0.0
        self.progress[1] = STARTING
        self.progress[2] = 0.0
        self.refs = OrderedDict()  # a fresh process holds none
        self.ref_weight = 0
        proc = self.ctx.Process(
            target=_entry, args=(child, self.cfg, self.progress, self.main), daemon=True, name=self.name
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
        """Send a request, first respawning a worker that died while idle. False when it failed."""
        try:
            if self.proc is None or not self.proc.is_alive():
                self.respawn()
            if self.progress[1] != STARTING:
                self.progress[1] = IDLE
            self.conn.send_bytes(data)
            return True
        except (OSError, EOFError, ValueError):
            return False

    def wait_ready(self) -> None:
        """Block until the process is up (`mark_ready`). WorkerDied / WorkerHung (not respawned)."""
        if self.proc is None:
            self.start()
        while self.progress[1] == STARTING:
            self.proc.join(0.002)
            if self.proc.exitcode is not None:
                raise WorkerDied(f"exit code {self.proc.exitcode}")
            if time.monotonic() - self.started_at > STARTUP_LIMIT_S:
                raise WorkerHung("worker did not start")

    def call(self, req: Any, hard_limit_s: float) -> Any:
        """Send one request and wait at most `hard_limit_s` (after the worker is up) for its reply. A dead
        worker is not replaced silently: raises WorkerHung (killed and respawned) or WorkerDied
        (respawned). The caller serialises calls (`lock`)."""
        try:
            self.wait_ready()
            self.conn.send_bytes(marshal.dumps(req))
            if not self.conn.poll(hard_limit_s):
                raise WorkerHung()
            return marshal.loads(self.conn.recv_bytes())
        except WorkerHung:
            self.respawn()
            raise
        except (EOFError, OSError, WorkerDied) as e:
            code = self.proc.exitcode if self.proc is not None else None
            self.respawn()
            raise WorkerDied(f"exit code {code}") from e


def serve(conn: Any, progress: Any, handle: Any) -> None:
    """Child side of `Worker.call`: answer each marshalled request with `handle(request)` until EOF."""
    mark_ready(progress)
    while True:
        try:
            req = marshal.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        progress[0] = time.monotonic()
        progress[1] = 0.0
        out = handle(req)
        try:
            conn.send_bytes(marshal.dumps(out))
        except (EOFError, OSError):
            return


def serve_batches(conn: Any, progress: Any, run: Any, other: Any = None) -> None:
    """Child side of `WorkerPool.run_batch`: receive a marshalled batch [(db_path, sql, timeout_s), ...]
    and answer with marshalled lists of `run(db_path, sql, timeout_s)` result tuples, in order, sent
    at least every `_FLUSH_S` and at the end of the batch. Before item k starts, `progress` gets
    [start time (time.monotonic), k]: that is what the parent's watchdog reads. A batch that is a
    tuple goes to `other(batch)` instead, which returns False when the pipe is gone."""
    mark_ready(progress)
    monotonic = time.monotonic
    while True:
        try:
            batch = marshal.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        if type(batch) is tuple:
            if not other(batch):
                return
            continue
        buf: list = []
        last = monotonic()
        n = len(batch)
        for k, (db_path, sql, timeout_s) in enumerate(batch):
            progress[0] = monotonic()  # start first, index second: the parent reads them the other way
            progress[1] = float(k)
            buf.append(run(db_path, sql, timeout_s))
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


class _Locked:
    """Thread-safe iterator wrapper."""

    def __init__(self, it: Any, lock: threading.Lock) -> None:
        self.it, self.lock = it, lock

    def __iter__(self) -> _Locked:
        return self

    def __next__(self) -> Any:
        with self.lock:
            return next(self.it)


class WorkerPool:
    """`n` workers running `main`, an idle queue, the watchdog and its counters.

    name: the processes' name, or a function of the worker index giving it.
    timeout_s / hard_timeout_s: the soft limit per statement and the parent's wall-clock limit; a call
    with another soft limit keeps the margin (`hard_limit`). `kills`: watchdog kills (timeouts);
    `crashes`: workers that died on their own.
    """

    def __init__(
        self, n: int, cfg: dict, main: Any, name: Any, timeout_s: float, hard_timeout_s: float
    ) -> None:
        self.ctx = multiprocessing.get_context("spawn")
        self.timeout_s, self.hard_timeout_s = timeout_s, hard_timeout_s
        self.closed = False
        self.kills = 0
        self.crashes = 0
        self._lock = threading.Lock()
        self.idle: queue.Queue[Worker] = queue.Queue()
        self.workers = [Worker(self.ctx, cfg, main, name(i) if callable(name) else name) for i in range(n)]
        for w in self.workers:
            self.idle.put(w)

    def close(self) -> bool:
        """Stop every worker. False when the pool was closed already."""
        with self._lock:
            if self.closed:
                return False
            self.closed = True
        for w in self.workers:
            with w.lock:
                w.stop()
        return True

    def hard_limit(self, timeout_s: float) -> float:
        return max(self.hard_timeout_s, timeout_s + (self.hard_timeout_s - self.timeout_s))

    def watch(self, w: Worker, k: float, p0: float, pending: list, got: int, sent_at: float) -> tuple:
        """The watchdog's view of worker `w`, whose progress slots read item `k` started at `p0` (one
        snapshot, read by the caller in that order), with `got` of its
        `pending` items (4th field: timeout_s) answered: (index of the item being watched, when its
        clock started, the hard deadline, a cap on the next wait or None). A starting worker is
        re-checked every 20 ms (the first item's clock starts when it is up); an idle one, or one that
        has not yet reached item `got`, is timed from when the batch was sent."""
        if k == STARTING:
            return got, p0, w.started_at + STARTUP_LIMIT_S, 0.02
        if k == IDLE or k < got:
            return got, sent_at, sent_at + self.hard_limit(pending[got][3]), None
        kk = int(k)
        return kk, p0, p0 + self.hard_limit(pending[kk][3]), None

    def replace(self, w: Worker, status: str, timeout_s: float) -> str:
        """Respawn `w` after the watchdog killed it (`status` "timeout") or found it dead ("worker_crash"),
        count it, and return the message for the statement it was running."""
        code = w.proc.exitcode if w.proc is not None else None
        w.respawn()
        if status == "timeout":
            self.kills += 1
            limit = self.hard_limit(timeout_s)
            return f"statement exceeded the hard time limit of {limit:g} s; the worker was killed"
        self.crashes += 1
        return f"sandbox worker died (exit code {code}); the worker was restarted"

    def run_chunks(self, chunks: list, results: list) -> None:
        """Run every chunk with `run_batch` on as many idle workers as there are chunks (threads)."""
        if len(chunks) == 1:
            self._run_chunks(chunks, iter(range(1)), results)
            return
        nxt = _Locked(iter(range(len(chunks))), threading.Lock())
        threads = [
            threading.Thread(target=self._run_chunks, args=(chunks, nxt, results), daemon=True)
            for _ in range(min(len(self.workers), len(chunks)) - 1)
        ]
        for th in threads:
            th.start()
        self._run_chunks(chunks, nxt, results)
        for th in threads:
            th.join()

    def _run_chunks(self, chunks: list, nxt: Any, results: list) -> None:
        w = None
        try:
            for k in nxt:
                if self.closed:
                    return
                if w is None:
                    w = self.idle.get()
                self.run_batch(w, chunks[k], results)
        finally:
            if w is not None:
                self.idle.put(w)

    def run_batch(self, w: Worker, batch: list, results: list) -> None:
        """Run `batch` [(index, db, sql, timeout)] on worker `w`, filling `results`. The watchdog reads
        the worker's shared progress slot: the item it is running and since when. An item running past
        its hard limit gets `timeout` (worker killed and respawned); an item during which the worker
        died gets `worker_crash`; finished-but-unsent items and the rest are re-run on the new worker."""
        pending = list(batch)
        send_failures = 0
        while pending:
            if self.closed:
                return
            payload = marshal.dumps([(db, sql, t) for _, db, sql, t in pending])
            if not w.send(payload):
                send_failures += 1
                w.respawn()
                if send_failures < 2:
                    continue  # the worker died while idle: not this item's fault, try a fresh one
                i = pending.pop(0)[0]
                results[i] = failure("worker_crash", "could not send the statement to a sandbox worker")
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
                kk, started, deadline, wait_cap = self.watch(w, k, p0, pending, got, sent_at)
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
                    if k == STARTING:
                        failed = ("worker_crash", got, time.monotonic() - sent_at)
                    else:
                        failed = ("timeout", kk, time.monotonic() - started)
                    break
            if failed is None:
                pending = []
                continue
            if self.closed:  # close() pulled the worker away: leave the rest unfilled
                return
            status, kk, elapsed = failed
            msg = self.replace(w, status, pending[kk][3])
            results[pending[kk][0]] = failure(status, msg, max(0.0, elapsed) * 1e3)
            pending = pending[got:kk] + pending[kk + 1 :]


_LIVE: weakref.WeakSet = weakref.WeakSet()


def close_at_exit(owner: Any) -> None:
    """Register `owner` (anything with `close()`) to be closed when the interpreter exits."""
    _LIVE.add(owner)


def forget_at_exit(owner: Any) -> None:
    """Undo `close_at_exit` (the owner was closed)."""
    _LIVE.discard(owner)


@atexit.register
def _close_all() -> None:
    for owner in list(_LIVE):
        try:
            owner.close()
        except Exception:  # noqa: BLE001
            pass
