"""Scoring final SQL against a task's gold: `Evaluator.score` / `score_many` give a `Reward`.

What is covered:
- statuses: gold unscorable -> `gold_unscorable`, value None (decided before looking at the
  prediction, so every arm is scored on the same tasks; a gold over the sandbox's `max_rows` is
  `gold_too_many_rows`); no/empty SQL (or sandbox `empty_sql`) -> `no_sql`, 0; sandbox syntax_error /
  forbidden / multiple_statements / runtime_error / too_many_rows / too_large -> `exec_error`, 0
  (parts["sandbox_status"] says which); timeout -> `timeout`, 0; worker_crash, an unknown sandbox
  status, or an exception from the sandbox or the gold cache -> `infra_error`, value None (excluded,
  never 0 or 1); ok -> `match` 1.0 or `mismatch` 0.0 by `execution_match`, with
  parts["test_suite_match"] from `test_suite_result_eq` (0 without a DISTINCT-free variant of the
  prediction, `sqlrl.reward.shape.distinct_free`);
- `kind="validity"`: 1.0 when the SQL executes with status ok (status still says match/mismatch),
  0 otherwise; the other statuses as above;
- `score_many` gives exactly what `score` gives on each pair; a deterministic pair repeated within
  one call is scored once when every execution behind it is reproducible (same rewards either way);
- `Reward.exec_ms`: the sandbox's milliseconds on the pair's SQL in that call (a diagnostic);
- `timeout_s`: a per-statement limit on the predictions (and variants; never the cached gold) in
  place of the sandbox's; a prediction still running at it is `timeout`, 0 (GRPO training passes
  `grpo.score_timeout_s`, 1 s); the repeats of a prediction cut at it get copies (see `Evaluator`).

What is not:
- the gold SQL is never executed here, nor on a connection the policy touched: gold results come
  from `GoldCache` (executed once, cached); workers get the gold's result, never its SQL;
- nothing is kept between calls.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from sqlrl.reward.cut import Cut, fetch_cuts
from sqlrl.reward.match import Reward, execution_match
from sqlrl.reward.pairs import (
    TOO_LONG,
    InfraFailure,
    copy_reward,
    gold_scorable,
    memoizable,
    takes_resolved,
    test_suite_pending,
)
from sqlrl.reward.refs import cells, ref_key
from sqlrl.reward.reproducible import is_deterministic_sql
from sqlrl.reward.scoring import (
    EXEC_ERROR_STATUSES,
    PERMUTATION_NOTE,
    elapsed_ms,
    fail_parts,
    match_parts,
    worker_reward,
)
from sqlrl.reward.shape import GoldShape, distinct_free, gold_shape, remove_distinct
from sqlrl.sql.engine import seconds
from sqlrl.sql.sandbox import execute_each
from sqlrl.tasks.data import PublicTask

__all__ = ["Evaluator"]

# Golds whose result has more cells (rows x columns) than this are scored in the parent (their rows
# would be shipped to, and held by, every worker); everything else is scored by `score_in_worker`.
_WORKER_GOLD_MAX_CELLS = 200_000
_SCORER = "sqlrl.reward.scoring:score_in_worker"


@dataclass
class _Pair:
    i: int  # position in the score_many input
    db_path: str
    gold_sql: str
    gold: Any
    sql: str
    key: tuple | None  # (db_path, gold SQL, prediction) of a deterministic prediction; None otherwise
    cut: Cut | None = None  # the gold's LIMIT/OFFSET cut (`sqlrl.reward.cut`), when it has one


class Evaluator:
    """Scores a final SQL for a PrivateTask. kind="execution" (match) or "validity" (executes).

    Where the scoring runs: with a `sqlrl.sql.sandbox.Sandbox` (anything with `execute_scored`) every pair
    is scored inside the sandbox workers (`score_in_worker`): the prediction and its DISTINCT-free
    variant run there and are compared there with the gold result, which the worker gets from the gold
    cache through the parent (shipped once per worker and kept there); one round trip per chunk of
    pairs, and only the verdict (value, status, parts) comes back. The gold is never executed in a
    worker, on a connection the policy's SQL touched or anywhere else but the gold cache. Golds larger
    than `_WORKER_GOLD_MAX_CELLS` cells, and any other sandbox (only `execute` / `execute_many`), use the
    parent-side path: the predictions' results come back and are compared here. Both paths give the
    same Reward (value, status, parts), as tests/reward/test_reward_workers.py checks.

    De-duplication within one call (on by default, `memo_entries=0` turns it off; rewards are identical
    either way): a deterministic prediction (`is_deterministic_sql`) repeated for the same database
    path and gold within one `score_many` call is scored once, and the repeats get copies of its reward
    when every execution behind it is reproducible (`memoizable`: ok, syntax_error, forbidden,
    multiple_statements, too_many_rows, runtime errors other than I/O/memory/locks; never timeout,
    too_large, worker_crash or an exception); otherwise the repeats are scored on their own, all of
    them in one more sandbox call. One exception, under a training deadline (`timeout_s` given): the
    repeats of a prediction cut at it get copies of its `timeout`. They would run the same statement
    to the same deadline, so scoring them again costs one more deadline per step and can differ only
    by timing noise, which would give identical GRPO samples different rewards. Non-deterministic SQL
    (random(), the clock, ...) is scored every time. Nothing is kept between calls.

    Threads may share one Evaluator (veRL's reward workers, Agent Lightning's runners): a call's state
    lives in the calling thread and the counters (`memo_stats`) are updated under a lock. `Sandbox`
    hands its idle workers to whichever concurrent call takes them and `GoldCache` locks, so the whole
    stack gives each thread the rewards a serial call would (tests/reward/test_reward_memo.py).
    """

    def __init__(
        self,
        sandbox: Any,
        gold_cache: Any,
        kind: str = "execution",
        *,
        test_suite: bool = True,
        memo_entries: int = 50_000,
        timeout_s: float | None = None,
    ):
        if kind not in ("execution", "validity"):
            raise ValueError(f"Evaluator: kind must be 'execution' or 'validity', got {kind!r}")
        self.sandbox = sandbox
        self.gold_cache = gold_cache
        self.kind = kind
        self.test_suite = test_suite
        # predictions' limit (None: the sandbox's); NaN or infinity would switch the deadline off
        self.timeout_s = seconds(timeout_s, "Evaluator: timeout_s") if timeout_s is not None else None
        self.dedup = int(memo_entries) > 0
        self.executions = 0  # statements sent to the sandbox (predictions and variants)
        self.duplicate_hits = 0  # pairs answered with a copy of an identical pair's reward
        self._count_lock = threading.Lock()  # the counters above, when threads share this Evaluator
        # per thread: the current call's resolved database paths (`_gold_many`), so that threads sharing
        # one Evaluator (veRL's reward workers, Agent Lightning runners) never see each other's calls
        self._call = threading.local()

    @property
    def _resolved(self) -> dict | None:
        return getattr(self._call, "resolved", None)

    @_resolved.setter
    def _resolved(self, value: dict | None) -> None:
        self._call.resolved = value

    def _count(self, executions: int = 0, duplicate_hits: int = 0) -> None:
        with self._count_lock:
            self.executions += executions
            self.duplicate_hits += duplicate_hits

    def memo_stats(self) -> dict:
        with self._count_lock:
            return {"duplicate_hits": self.duplicate_hits, "executions": self.executions}

    @staticmethod
    def _check_task(task: Any) -> tuple[str, str]:
        if isinstance(task, PublicTask):
            raise TypeError("Evaluator.score: got a PublicTask, which has no gold SQL; pass the PrivateTask")
        gold_sql = getattr(task, "gold_sql", None)
        public = getattr(task, "public", None)
        db_path = getattr(public, "db_path", None)
        if not isinstance(gold_sql, str) or not isinstance(db_path, str):
            raise TypeError(
                f"Evaluator.score: expected a PrivateTask (with .public.db_path and .gold_sql), "
                f"got {type(task).__module__}.{type(task).__qualname__}"
            )
        return db_path, gold_sql

    def prefetch(self, tasks: list) -> None:
        """Fetch into the gold cache the gold results of `tasks` (PrivateTasks) and the full ordered
        results behind their LIMIT cuts, so that scoring them later pays for predictions only (the
        trainer runs this beside generation). Nothing is scored; what fails here, scoring meets again
        and reports per pair. With a sandbox that has `warm` (`Sandbox.warm`), its idle workers also
        open the tasks' databases, so scoring pays for no connection set-up either."""
        self._resolved = None
        wanted = list(dict.fromkeys(self._check_task(t) for t in tasks))
        caps = self._caps()
        golds = zip(wanted, self._gold_results(wanted))
        fetch_cuts({k: g for k, g in golds if gold_scorable(g, *caps)[0]}, self._gold_results)
        warm = getattr(self.sandbox, "warm", None)
        if warm is not None:
            warm(list(dict.fromkeys(db for db, _ in wanted)))

    def _caps(self) -> tuple:
        """(row cap, byte cap or None, value limit or None) of a prediction (`gold_scorable`)."""
        sb = self.sandbox
        return getattr(sb, "max_rows", None), self._byte_cap(), getattr(sb, "max_value_bytes", None)

    def _byte_cap(self) -> int | None:
        """The sandbox's byte cap when a gold may be over it: below the gold cache's, or the cache's unknown."""
        mine = getattr(self.sandbox, "max_result_bytes", None)
        theirs = getattr(self.gold_cache, "max_result_bytes", None)
        return mine if isinstance(mine, int) and not (isinstance(theirs, int) and theirs <= mine) else None

    def score(self, final_sql: str | None, task: Any) -> Reward:
        return self.score_many([(final_sql, task)])[0]

    def _execute_batch(self, items: list[tuple[str, str]]) -> list[Any]:
        """Run predictions (and prediction variants) through the sandbox, in parallel when it has
        `execute_many`; an exception becomes that item's `InfraFailure` (scored as infra_error)."""
        self._count(executions=len(items))
        return execute_each(
            self.sandbox, items, lambda e: InfraFailure(f"sandbox: {type(e).__name__}: {e}"), self.timeout_s
        )

    def _execute_pending(self, pending: list[_Pair], want_ts: bool) -> tuple[list[Any], list[Any]]:
        """Parent-side path: the predictions in one batch, then the DISTINCT-free variants of those
        that executed in another (None where there is no variant)."""
        preds = self._execute_batch([(p.db_path, p.sql) for p in pending])
        variants: list[Any] = [None] * len(pending)
        if want_ts:
            todo: list[tuple[int, tuple[str, str]]] = []
            for n, (p, res) in enumerate(zip(pending, preds)):
                if isinstance(res, InfraFailure) or getattr(res, "status", None) != "ok":
                    continue
                v_sql = distinct_free(p.sql)
                if v_sql is None:
                    variants[n] = TOO_LONG
                elif v_sql != p.sql:
                    todo.append((n, (p.db_path, v_sql)))
            for (n, _), res in zip(todo, self._execute_batch([x for _, x in todo])):
                variants[n] = res
        return preds, variants

    def score_many(self, items: list[tuple[str | None, Any]]) -> list[Reward]:
        """Score (final_sql, PrivateTask) pairs; same result as `score` on each. With a Sandbox the
        pairs are scored inside its workers in parallel, one round trip per chunk (see the class
        docstring); otherwise the predictions run through `sandbox.execute_many` in one batch and one
        batch of DISTINCT-free variants. A repeat of a deterministic pair in the same call is scored
        once."""
        return self._score_many(items, self.dedup)

    def _score_many(self, items: list[tuple[str | None, Any]], dedup: bool) -> list[Reward]:
        """`score_many`; `dedup`: score a repeat of a deterministic pair once (see the class docstring)."""
        checked = [self._check_task(task) for _, task in items]  # TypeError before any work
        base: dict[str, Any] = {"kind": self.kind}
        want_ts = self.kind == "execution" and self.test_suite
        out: list[Reward | None] = [None] * len(items)
        pending: list[_Pair] = []
        # one batched cache look-up (one path resolution and file hash per database, not per pair);
        # if it fails, fall back to per-pair look-ups so one bad gold only affects its own pair
        fetched = None
        # database paths resolved once for this call's look-ups (golds, then their variants)
        self._resolved = {} if takes_resolved(self.gold_cache) else None
        if hasattr(self.gold_cache, "get_many"):
            try:
                uniq = list(dict.fromkeys(checked))  # a GRPO group shares its gold: look it up once
                got = dict(zip(uniq, self._gold_many(uniq)))
                fetched = [got[c] for c in checked]
            except Exception:
                fetched = None
        first: dict[tuple, int] = {}  # key -> position of each deterministic pair pending in this call
        dups: list[tuple[int, tuple]] = []  # (position, key) of repeats of a pending pair
        # gold_scorable per gold object: `fetched` holds them all, so an id stays theirs in this call
        verdicts: dict[int, tuple[bool, str | None]] = {}
        caps = self._caps()  # a prediction's caps
        for i, ((final_sql, _), (db_path, gold_sql)) in enumerate(zip(items, checked)):
            try:
                gold = fetched[i] if fetched is not None else self.gold_cache.get(db_path, gold_sql)
            except Exception as e:  # infrastructure: never a wrong answer
                out[i] = Reward(
                    None, "infra_error", {**base, "error": f"gold_cache: {type(e).__name__}: {e}"}
                )
                continue
            if fetched is not None:
                hit = verdicts.get(id(gold))
                if hit is None:
                    hit = verdicts[id(gold)] = gold_scorable(gold, *caps)
                scorable, why = hit
            else:
                scorable, why = gold_scorable(gold, *caps)
            if not scorable:
                out[i] = Reward(None, "gold_unscorable", {**base, "reason": why or "gold_unscorable"})
            elif final_sql is None or not final_sql.strip().strip(";").strip():
                out[i] = Reward(0.0, "no_sql", fail_parts(base, want_ts))
            else:
                key = None
                if dedup and is_deterministic_sql(final_sql):
                    key = (db_path, gold_sql, final_sql)
                    if key in first:
                        dups.append((i, key))
                        continue
                    first[key] = i
                pending.append(_Pair(i, db_path, gold_sql, gold, final_sql, key))

        reusable: dict[tuple, Reward] = {}  # key -> reward whose every execution was reproducible
        pending = self._with_cuts(pending, out, base)
        if pending:
            rest = self._score_in_workers(pending, out, base, want_ts, reusable)
            if rest:
                preds, variants = self._execute_pending(rest, want_ts)
                self._finish_pending(rest, preds, variants, out, base, want_ts, reusable)
        # repeats of a pair scored in this call: a copy of its reward when every execution behind it
        # was reproducible (or, under a training deadline, a timeout), otherwise scored again on
        # their own, in one more call
        redo, hits = [], 0
        for i, key in dups:
            r = reusable.get(key)
            if r is not None:
                out[i], hits = copy_reward(r), hits + 1
            elif self.timeout_s is not None and getattr(out[first[key]], "status", None) == "timeout":
                out[i], hits = copy_reward(out[first[key]]), hits + 1
            else:
                redo.append(i)
        if hits:
            self._count(duplicate_hits=hits)
        if redo:  # all in one call, side by side (not one repeat per call, one after the other)
            for i, r in zip(redo, self._score_many([items[i] for i in redo], False)):
                out[i] = r
        return out  # type: ignore[return-value]

    def _with_cuts(self, pending: list[_Pair], out: list, base: dict) -> list[_Pair]:
        """The pending pairs with their gold's cut; a pair whose gold's full result could not be
        fetched (infrastructure) gets `infra_error` in `out` and is dropped."""
        if not pending:
            return pending
        cuts = fetch_cuts({(p.db_path, p.gold_sql): p.gold for p in pending}, self._gold_results)
        kept = []
        for p in pending:
            cut = cuts.get((p.db_path, p.gold_sql))
            if isinstance(cut, BaseException):
                err = f"gold_cache (full ordered result): {type(cut).__name__}: {cut}"
                out[p.i] = Reward(None, "infra_error", {**base, "error": err})
                continue
            p.cut = cut
            kept.append(p)
        return kept

    def _score_in_workers(
        self,
        pending: list[_Pair],
        out: list,
        base: dict,
        want_ts: bool,
        reusable: dict,
    ) -> list[_Pair]:
        """Score the pending pairs inside the sandbox workers (`Sandbox.execute_scored` with
        `score_in_worker`): one round trip per chunk, the prediction, its DISTINCT-free variant and
        both comparisons in the worker, golds shipped from the gold cache (never executed there).
        Returns the pairs left to the parent-side path: all of them when the sandbox has no
        `execute_scored` or the call fails, and those whose gold is too large to ship."""
        run = getattr(self.sandbox, "execute_scored", None)
        if run is None:
            return pending
        variants: dict[tuple[str, str], Any] = {}
        if want_ts:
            wanted = list(
                dict.fromkeys(
                    (p.db_path, v)
                    for p in pending
                    if (v := remove_distinct(p.gold_sql)) != p.gold_sql
                    and cells(p.gold) <= _WORKER_GOLD_MAX_CELLS
                )
            )
            variants = dict(zip(wanted, self._gold_results(wanted)))
        items: list[tuple] = []
        refs: dict[int, tuple[int, Any]] = {}
        sent: list[_Pair] = []
        rest: list[_Pair] = []
        # (ref keys, extra) of each distinct (gold object, gold SQL, database) in this call, or None
        # when that gold goes to the parent-side path: a GRPO group shares one gold, worked out once
        per_gold: dict[tuple, tuple | None] = {}
        for p in pending:
            gold = p.gold
            gid = (id(gold), p.gold_sql, p.db_path)  # `pending` holds the objects: ids stay valid
            if gid in per_gold:
                hit = per_gold[gid]
            else:
                hit = per_gold[gid] = self._gold_refs(p, gold, refs, variants, want_ts)
            if hit is None:
                rest.append(p)
                continue
            items.append((p.db_path, p.sql, *hit))
            sent.append(p)
        if not items:
            return rest
        try:
            opts = {"kind": self.kind, "ts": want_ts}
            if self.timeout_s is None:
                got = run(items, refs, _SCORER, opts)
            else:
                got = run(items, refs, _SCORER, opts, timeout_s=self.timeout_s)
            if len(got) != len(items):
                raise RuntimeError("execute_scored: wrong number of results")
        except Exception:  # noqa: BLE001 - the parent-side path has its own per-pair failure handling
            return pending
        executions = 0
        for p, g in zip(sent, got):
            r, memo_ok, n = worker_reward(g, base, want_ts)
            executions += n
            out[p.i] = r
            if memo_ok and p.key is not None:
                reusable[p.key] = r
        self._count(executions=executions)
        return rest

    def _finish_pending(
        self,
        chunk: list[_Pair],
        preds: list[Any],
        variants: list[Any],
        out: list,
        base: dict,
        want_ts: bool,
        reusable: dict,
    ) -> None:
        executed: list[tuple[_Pair, Any, Any, GoldShape, dict]] = []
        for p, res, vres in zip(chunk, preds, variants):
            i = p.i
            if isinstance(res, InfraFailure):
                out[i] = Reward(None, "infra_error", {**base, "error": res.error})
                continue
            st = getattr(res, "status", None)
            msg = str(getattr(res, "message", "") or "")[:500]
            fail = fail_parts(base, want_ts)
            ms = elapsed_ms(res, vres)
            if st != "ok":
                if st == "empty_sql":
                    out[i] = Reward(0.0, "no_sql", {**fail, "sandbox_status": st}, ms)
                elif st in EXEC_ERROR_STATUSES:
                    out[i] = Reward(0.0, "exec_error", {**fail, "sandbox_status": st, "message": msg}, ms)
                elif st == "timeout":
                    out[i] = Reward(0.0, "timeout", {**fail, "sandbox_status": st, "message": msg}, ms)
                else:
                    out[i] = Reward(None, "infra_error", {**base, "sandbox_status": st, "message": msg})
                if p.key is not None and out[i].status in ("no_sql", "exec_error") and memoizable(res):
                    reusable[p.key] = out[i]
                continue
            gold = p.gold
            shape = gold_shape(p.gold_sql)
            m = execution_match(gold.columns, gold.rows, res.columns, res.rows, shape, p.cut)
            parts = match_parts(base, m, shape, gold.rows, res.rows)
            if m.reason == "permutation_bound":
                parts["note"] = PERMUTATION_NOTE
            value = 1.0 if (m.match or self.kind == "validity") else 0.0
            out[i] = Reward(value, "match" if m.match else "mismatch", parts, ms)
            # identical rows found by execution_match's fast path (tries == 0 with rows: the search
            # always charges at least one try): the test-suite comparison of the same two results
            # takes its own fast path to a match (exact equality implies it; its budget is smaller)
            same = m.match and m.tries == 0 and len(gold.rows) > 0
            executed.append((p, res, vres, shape, parts, same))
        if want_ts:
            self._test_suite_pending(executed)
        for p, _, vres, _, parts, _ in executed:
            if p.key is None:
                continue
            if vres is not None and not memoizable(vres):
                continue
            if str(parts.get("test_suite_reason", "")).startswith("gold_variant_infra"):
                continue
            reusable[p.key] = out[p.i]

    @staticmethod
    def _gold_refs(p: _Pair, gold: Any, refs: dict, variants: dict, want_ts: bool) -> tuple | None:
        """(ref keys, extra) for the worker items of pairs with this gold, registering the payloads in
        `refs`; None when a payload is too large to ship (the parent-side path scores those pairs)."""
        weight = cells(gold) + (p.cut.cells() if p.cut is not None else 0)
        if weight > _WORKER_GOLD_MAX_CELLS:
            return None
        gk = ref_key(gold, p.gold_sql)
        if gk not in refs:
            sh = gold_shape(p.gold_sql)
            shape_t = (sh.order_matters, sh.key_columns, sh.has_limit, sh.limit, sh.has_offset, sh.parsed)
            cut_t = (p.cut.runs, p.cut.pools) if p.cut is not None else None
            refs[gk] = (weight, (gold.columns, gold.rows, shape_t, cut_t))
        if want_ts:
            v_sql = remove_distinct(p.gold_sql)
            if v_sql != p.gold_sql:
                g_var = variants[(p.db_path, v_sql)]
                if isinstance(g_var, BaseException):
                    return (gk,), f"gold_variant_infra: {type(g_var).__name__}"
                v_weight = cells(g_var)
                if v_weight > _WORKER_GOLD_MAX_CELLS:
                    return None
                vk = ref_key(g_var, "")
                if vk not in refs:
                    v_status = getattr(g_var, "status", "unknown")
                    refs[vk] = (v_weight, (v_status, g_var.columns, g_var.rows))
                return (gk, vk), None
        return (gk,), None

    def _gold_many(self, items: list[tuple[str, str]]) -> list[Any]:
        """`gold_cache.get_many`, with this call's resolved database paths where it takes them."""
        resolved = self._resolved
        if resolved is not None:
            return self.gold_cache.get_many(items, progress=False, resolved=resolved)
        return self.gold_cache.get_many(items, progress=False)

    def _gold_results(self, wanted: list[tuple[str, str]]) -> list[Any]:
        """Gold-cache results (or the exception) for (database, SQL) items, batched: the golds'
        DISTINCT-free variants and full ordered results."""
        if not wanted:
            return []
        if hasattr(self.gold_cache, "get_many"):
            try:
                got = list(self._gold_many(wanted))
                if len(got) == len(wanted):
                    return got
            except Exception:
                pass  # one pair at a time, so an exception only affects its own pair
        out: list[Any] = []
        for db_path, sql in wanted:
            try:
                out.append(self.gold_cache.get(db_path, sql))
            except Exception as e:
                out.append(e)
        return out

    def _test_suite_pending(self, executed: list) -> None:
        """Fill parts["test_suite_match"] (and "test_suite_reason") in place; see the module docstring."""
        test_suite_pending(executed, self._gold_results)
