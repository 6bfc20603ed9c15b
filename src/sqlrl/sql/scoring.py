"""`Sandbox.execute_scored`: a scorer function run inside the sandbox's workers, driven from one thread.

Covered: the scorer gets a `run(sql)` that executes one statement exactly as `Sandbox.execute` does
(pre-check, hardened read-only connection, limits, deadline), plus reference payloads (e.g. cached
gold results) that the parent ships to each worker once and the worker keeps (least recently used
dropped past `ref_budget`). One message each way per chunk of items, up to `depth` chunks in flight
per worker. The watchdog (`WorkerPool.watch`) applies per statement: an item whose statement hung
or whose worker died gets `timeout` / `worker_crash` (or, for a later statement of the item, is run
again with that statement answered by the failure), and the chunk's other unfinished items are
re-run on the fresh worker. An exception in the scorer becomes ("__error__", text).
Not covered: each database file is stat'ed once per chunk (the first time the chunk uses it), so a
file replaced while a chunk runs is noticed only from the next chunk on.
"""

from __future__ import annotations

import importlib
import marshal
import multiprocessing.connection
import queue
import time
from collections import OrderedDict, deque
from typing import Any

from sqlrl.sql.engine import Deadline, run_one
from sqlrl.sql.guard import check_statement
from sqlrl.sql.result import SQLResult, failure
from sqlrl.sql.workers import IDLE, STARTING, Worker, WorkerPool

# a chunk is queued behind a running one only while everything in flight on that worker is at most
# this many bytes (and a quarter of the pipe's OS send buffer), so the send cannot block the parent's
# thread, and with it the watchdog, until the worker reads; otherwise it waits until the worker is idle
_SCORE_TOPUP_BYTES = 32 * 1024

# --------------------------------------------------------------------------------------------------
# Child side


def _scorer(scorers: dict, name: str) -> Any:
    fn = scorers.get(name)
    if fn is None:
        module, _, attr = name.partition(":")
        fn = scorers[name] = getattr(importlib.import_module(module), attr)
    return fn


def score_batch(
    conn: Any,
    cfg: dict,
    conns: OrderedDict,
    deadline: Deadline,
    progress: Any,
    refs: dict,
    scorers: dict,
    batch: tuple,
) -> bool:
    """Child side of `run_scored`: one scoring batch ("score", scorer, options, dropped keys, added {key: payload}, items, base): for
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
            pre = check_statement(stmt, max_sql)
            if isinstance(pre, SQLResult):
                return (pre.status, [], [], 0, 0.0, pre.message)
            return run_one(conns, cfg, deadline, db_path, pre, timeout_s, stats)

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


def run_scored(
    pool: WorkerPool,
    chunks: deque,
    refs: dict,
    scorer: str,
    options: Any,
    results: list,
    *,
    depth: int,
    ref_budget: int,
) -> None:
    """Drive the chunks over as many idle workers of `pool` as there are (at least one; waits for it)
    from this one thread: each worker has up to `depth` chunks in flight (the next one waits in its
    pipe while it runs the current one, so it never waits for a round trip) and gets another when one
    is answered. The watchdog of `WorkerPool.run_batch`, per statement (progress [start, item,
    statement]), over the worker's items in flight numbered in the order sent (each batch tells the
    worker the number of its first item): an item the worker has not reached yet is timed from when
    it was sent or the answer before it arrived, whichever is later."""
    ws = [pool.idle.get()]
    try:
        while len(ws) < min(len(pool.workers), len(chunks)):
            try:
                ws.append(pool.idle.get_nowait())
            except queue.Empty:
                break
        _ScoredRun(pool, chunks, refs, scorer, options, results, depth, ref_budget).run(ws)
    finally:
        for w in ws:
            pool.idle.put(w)


class _ScoredRun:
    """The state of one `run_scored` call."""

    def __init__(
        self,
        pool: WorkerPool,
        chunks: deque,
        refs: dict,
        scorer: str,
        options: Any,
        results: list,
        depth: int,
        ref_budget: int,
    ) -> None:
        self.pool, self.chunks, self.refs, self.scorer, self.options = pool, chunks, refs, scorer, options
        self.results, self.depth, self.ref_budget = results, depth, ref_budget
        # worker -> [items in flight since it was last fed with nothing in flight (answered ones
        # included), items answered, when item `got` was sent or the answer before it arrived,
        # sizes of the batches in flight]
        self.state: dict[Worker, list] = {}

    def payload(self, w: Worker, pending: list, base: int) -> tuple[bytes, list]:
        """The marshalled batch for `w` and the keys whose payloads it adds (the caller takes them back
        out of `w.refs` if the batch cannot be sent)."""
        need = {k for it in pending for k in it[4]}
        adds = {}
        for k in need:
            if k in w.refs:
                w.refs.move_to_end(k)
            else:
                weight, payload = self.refs[k]
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
            return marshal.dumps(("score", self.scorer, self.options, drops, adds, items, base)), list(adds)
        except BaseException:
            _unhold(w, list(adds))
            raise

    def feed(self, w: Worker, pending: list | None) -> None:
        """Send `pending` (or the next chunk) to `w`, which has nothing in flight; retire `w` when
        nothing is left."""
        failures = 0
        while True:
            if pending is None or not pending:
                pending = self.chunks.popleft() if self.chunks else None
            if pending is None or self.pool.closed:
                self.state.pop(w, None)
                return
            # not `w.send`: a worker respawned there would get a payload that assumes the references
            # the dead one held
            try:
                if w.proc is None or not w.proc.is_alive():
                    w.respawn()
                payload, _ = self.payload(w, pending, 0)
                if w.progress[1] != STARTING:
                    w.progress[1] = IDLE
                w.conn.send_bytes(payload)
                sizes = deque([(len(pending), len(payload) + 8)])
                self.state[w] = [list(pending), 0, time.monotonic(), sizes]
                return
            except (OSError, EOFError, ValueError):
                pass
            failures += 1
            w.respawn()
            if failures < 2:
                continue  # the worker died while idle: not this item's fault, try a fresh one
            self.results[pending[0][0]] = failure(
                "worker_crash", "could not send the statement to a sandbox worker"
            )
            self.pool.crashes += 1
            pending = pending[1:]
            failures = 0

    def top_up(self, w: Worker) -> None:
        """Queue further chunks behind those `w` has in flight, up to `depth`, while they fit in the
        pipe's buffer (see `_SCORE_TOPUP_BYTES`) and, with several workers, while more chunks are left
        than workers are busy: the last ones go to whichever worker is free first, never behind a chunk
        that may hold a slow statement while another worker idles."""
        st = self.state.get(w)
        room = min(_SCORE_TOPUP_BYTES, w.sndbuf // 4)
        chunks = self.chunks
        busy = len(self.state)
        while (
            st is not None
            and chunks
            and len(st[3]) < self.depth
            and not self.pool.closed
            and (busy < 2 or len(chunks) > busy)
        ):
            batch = chunks.popleft()
            added: list = []
            try:
                payload, added = self.payload(w, batch, len(st[0]))
                if len(payload) + 8 + sum(b for _, b in st[3]) > room:
                    _unhold(w, added)
                    chunks.appendleft(batch)
                    return
                w.conn.send_bytes(payload)
            except (OSError, EOFError, ValueError):
                # the worker died (its pipe reports it to the loop below, which re-runs what it had in
                # flight) or the batch could not be built: the chunk waits for the next worker with room
                _unhold(w, added)
                chunks.appendleft(batch)
                return
            st[0].extend(batch)
            st[3].append((len(batch), len(payload) + 8))

    def run(self, ws: list) -> None:
        for w in ws:
            self.feed(w, None)
        for w in ws:
            self.top_up(w)
        while self.state:
            if self.pool.closed:
                return
            now = time.monotonic()
            plan = {}
            wait = None
            for w, (pending, got, sent_at, _) in self.state.items():
                k = w.progress[1]
                p0 = w.progress[0]
                kk, started, deadline, cap = self.pool.watch(w, k, p0, pending, got, sent_at)
                plan[w] = (k, p0, started, kk, deadline)
                left = max(0.0, deadline - now)
                if cap is not None:
                    left = min(left, cap)
                wait = left if wait is None else min(wait, left)
            conns = {w.conn: w for w in self.state}
            try:
                ready = multiprocessing.connection.wait(list(conns), wait)
            except OSError:
                ready = list(conns)
            for w in list(self.state):
                if w in self.state and not self.check(w, w.conn in ready, plan[w]):
                    return

    def check(self, w: Worker, readable: bool, plan: tuple) -> bool:
        """Take `w`'s answer, or act on its death / hang. False when the pool was closed meanwhile."""
        st = self.state[w]
        pending, got, sent_at, sizes = st
        k, p0, started, kk, deadline = plan
        failed = None
        if readable:
            try:
                data = w.conn.recv_bytes()
            except (EOFError, OSError):
                data = None
            if data is not None:
                for r in marshal.loads(data):
                    self.results[pending[got][0]] = r
                    got += 1
                st[1] = got
                st[2] = time.monotonic()  # the worker moves on to its next item now
                sizes.popleft()
                if not sizes:
                    self.feed(w, None)
                self.top_up(w)
                return True
            k2 = w.progress[1]  # EOF: the worker died
            kk = int(k2) if k2 >= got else got
            failed = ("worker_crash", kk, time.monotonic() - (w.progress[0] if k2 >= got else sent_at))
        elif w.progress[1] == k and w.progress[0] == p0 and time.monotonic() >= deadline:
            if k == STARTING:
                failed = ("worker_crash", got, time.monotonic() - sent_at)
            else:
                failed = ("timeout", kk, time.monotonic() - started)
        if failed is None:
            return True
        if self.pool.closed:
            return False
        status, kk, elapsed = failed
        j = int(w.progress[2]) if w.progress[1] == kk else 0  # statement of the item
        item = pending[kk]
        msg = self.pool.replace(w, status, item[3])
        rest = pending[got:kk]
        if j > 0 and item[6] is None:  # a later statement: run the item again without it
            rest.append((*item[:6], (j, status, msg)))
        else:
            self.results[item[0]] = failure(status, msg, max(0.0, elapsed) * 1e3)
        self.feed(w, rest + pending[kk + 1 :])
        self.top_up(w)
        return True


def _unhold(w: Worker, added: list) -> None:
    """Forget reference payloads that a batch which never reached `w` would have given it. (Keys that
    batch dropped stay forgotten: the worker then holds them unknown to us until it is replaced, and
    would get them again if needed: wasteful, never wrong.)"""
    for k in added:
        weight = w.refs.pop(k, None)
        if weight is not None:
            w.ref_weight -= weight
