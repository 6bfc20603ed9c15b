"""Evaluator de-duplication within a call: identical rewards with and without it on real SQLite
databases, no sharing of non-deterministic SQL or infrastructure failures, nothing kept between calls;
execution_match fast path."""

from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass, field

import pytest

import sqlrl.reward.match as reward_mod
import sqlrl.reward.shape as shape_mod
from sqlrl.reward.evaluator import Evaluator
from sqlrl.reward.match import execution_match
from sqlrl.reward.reproducible import is_deterministic_sql
from sqlrl.reward.shape import gold_shape
from sqlrl.sql.sandbox import Sandbox
from sqlrl.tasks.data import PrivateTask, PublicTask
from sqlrl.tasks.goldcache import GoldCache


@pytest.fixture()
def dbs(tmp_path):
    """Two real databases with the same schema and different contents."""
    paths = []
    for n, seed in (("a", 1), ("b", 2)):
        (tmp_path / n).mkdir()
        path = tmp_path / n / f"{n}.sqlite"
        rng = random.Random(seed)
        con = sqlite3.connect(path)
        con.execute(
            "CREATE TABLE singer (id INTEGER PRIMARY KEY, name TEXT, age INTEGER, country TEXT, score REAL)"
        )
        con.executemany(
            "INSERT INTO singer VALUES (?, ?, ?, ?, ?)",
            [
                (i, f"s{i % 17}", rng.choice([25, 30, 30, 40]), rng.choice(["FR", "US", "DE"]), rng.random())
                for i in range(1, 61)
            ],
        )
        con.execute(
            "CREATE TABLE song (id INTEGER PRIMARY KEY, singer_id INTEGER, title TEXT, sales INTEGER)"
        )
        con.executemany(
            "INSERT INTO song VALUES (?, ?, ?, ?)",
            [(i, rng.randint(1, 60), f"t{i % 9}", rng.randint(0, 5)) for i in range(1, 121)],
        )
        con.commit()
        con.close()
        paths.append(str(path))
    return paths


GOLDS = [
    "SELECT name FROM singer WHERE country = 'US'",
    "SELECT DISTINCT country FROM singer",
    "SELECT country, count(*) FROM singer GROUP BY country",
    "SELECT name, age FROM singer ORDER BY age DESC LIMIT 5",
    "SELECT avg(score) FROM singer",
    "SELECT T1.name, T2.title FROM singer AS T1 JOIN song AS T2 ON T1.id = T2.singer_id WHERE T2.sales > 3",
    "SELECT count(DISTINCT title) FROM song",
]
PREDS = [
    "SELECT name FROM singer WHERE country = 'US'",
    "SELECT name FROM singer WHERE country = 'FR'",
    "SELECT DISTINCT country FROM singer",
    "SELECT country FROM singer",
    "SELECT country FROM singer GROUP BY country",
    "SELECT count(*), country FROM singer GROUP BY country",
    "SELECT name, age FROM singer ORDER BY age DESC LIMIT 5",
    "SELECT age, name FROM singer ORDER BY age DESC, id LIMIT 5",
    "SELECT name, age FROM singer ORDER BY age LIMIT 5",
    "SELECT avg(score) FROM singer",
    "SELECT sum(score) / count(score) FROM singer",
    "SELECT T2.title, T1.name FROM singer AS T1 JOIN song AS T2 ON T1.id = T2.singer_id WHERE T2.sales > 3",
    "SELECT count(title) FROM song",
    "SELECT count(DISTINCT title) FROM song",
    "SELEC name FROM singer",
    "SELECT nope FROM singer",
    "DROP TABLE singer",
    "SELECT 1; SELECT 2",
    "",
    None,
    "SELECT abs(random()) % 1 FROM singer LIMIT 1",
]


def task(db: str, gold: str, k: int = 0) -> PrivateTask:
    return PrivateTask(PublicTask(f"t/{k:05d}", "toy", "q?", "", "", db), gold)


def test_memo_gives_identical_rewards_over_many_pairs(dbs, tmp_path):
    rng = random.Random(0)
    pairs = [(p, task(db, g)) for db in dbs for g in GOLDS for p in PREDS]
    # a GRPO-like stream: the same pairs again and again, shuffled, in batches of varying size
    stream = [pairs[rng.randrange(len(pairs))] for _ in range(3 * len(pairs))]
    with Sandbox(workers=2) as sb, Sandbox(workers=1) as sb_off, GoldCache(tmp_path / "gc") as gc:
        memo = Evaluator(sb, gc)
        plain = Evaluator(sb_off, gc, memo_entries=0)
        got_memo, got_plain = [], []
        pos = 0
        while pos < len(stream):
            n = rng.randint(1, 80)
            batch = stream[pos : pos + n]
            pos += n
            got_memo += memo.score_many(batch)
            got_plain += plain.score_many(batch)
        single = [plain.score(p, t) for p, t in stream[:60]]
        # deterministic predictions compare exactly; the random() one may differ in its row only
        for (p, _), a, b in zip(stream, got_memo, got_plain):
            if p and "random" in p:
                assert a.status == b.status
            else:
                assert a.to_dict() == b.to_dict(), p
        assert [r.to_dict() for r in single] == [r.to_dict() for r in got_plain[:60]]
        assert memo.memo_stats()["duplicate_hits"] > 0  # repeats within a batch were really shared
        assert memo.executions < plain.executions
        assert plain.memo_stats()["duplicate_hits"] == 0


def test_memo_on_equals_off_across_databases_same_sql(dbs, tmp_path):
    # the same SQL text on two databases with different contents must not share a memo entry
    gold = "SELECT name FROM singer WHERE country = 'US'"
    with Sandbox(workers=1) as sb, GoldCache(tmp_path / "gc") as gc:
        ev = Evaluator(sb, gc)
        a = ev.score(gold, task(dbs[0], gold))
        # prediction = gold of db A, scored against db B's gold: runs on db B
        b = ev.score(gold, task(dbs[1], gold))
        assert a.status == b.status == "match"
        x = ev.score("SELECT name FROM singer WHERE country = 'FR'", task(dbs[0], gold))
        y = ev.score("SELECT name FROM singer WHERE country = 'FR'", task(dbs[1], gold))
        assert (
            x.parts["pred_row_count"] != y.parts["pred_row_count"]
            or x.parts["gold_row_count"] != y.parts["gold_row_count"]
        )


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT random()",
        "SELECT RANDOM() FROM t",
        'SELECT "random"() FROM t',
        "SELECT randomblob(4)",
        "SELECT datetime('now')",
        "SELECT date('now')",
        "SELECT date ('2020-01-01')",
        "SELECT date/**/('2020-01-01')",
        "SELECT time()",
        "SELECT julianday('2020-01-01')",
        "SELECT strftime('%Y', 'now')",
        "SELECT current_timestamp",
        "SELECT CURRENT_DATE",
        "SELECT current_time",
        "SELECT unixepoch()",
        "SELECT changes()",
        "SELECT total_changes()",
        "SELECT last_insert_rowid()",
        "SELECT * FROM t ORDER BY random() LIMIT 1",
    ],
)
def test_non_deterministic_sql_detected(sql):
    assert not is_deterministic_sql(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT name FROM singer",
        "SELECT date FROM events WHERE time > 3",  # columns named date / time
        "SELECT random_id FROM t",
        "SELECT count(*) FROM singer WHERE country = 'US' ORDER BY age",
    ],
)
def test_deterministic_sql_accepted(sql):
    assert is_deterministic_sql(sql)


@dataclass(frozen=True)
class FakeResult:
    status: str
    columns: list = field(default_factory=list)
    rows: list = field(default_factory=list)
    row_count: int = 0
    elapsed_ms: float = 0.0
    message: str = ""


class CountingSandbox:
    """Runs SQL on the real database in-process (read-only) and counts the calls; `script` forces
    statuses (or exceptions) for the first calls of a given SQL."""

    def __init__(self, script: dict | None = None):
        self.calls: list[str] = []
        self.script = {k: list(v) for k, v in (script or {}).items()}

    def execute(self, db_path, sql, timeout_s=None):
        self.calls.append(sql)
        forced = self.script.get(sql)
        if forced:
            f = forced.pop(0)
            if isinstance(f, BaseException):
                raise f
            return FakeResult(f, message="forced")
        con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
        try:
            cur = con.execute(sql)
            rows = [tuple(r) for r in cur.fetchall()]
            return FakeResult("ok", [d[0] for d in cur.description or []], rows, len(rows))
        except sqlite3.Error as e:
            return FakeResult("syntax_error" if "syntax" in str(e) else "runtime_error", message=str(e))
        finally:
            con.close()

    def execute_many(self, items):
        return [self.execute(d, s) for d, s in items]


@pytest.fixture()
def gc(tmp_path):
    with GoldCache(tmp_path / "gc") as g:
        yield g


def test_non_deterministic_prediction_is_never_deduplicated(dbs, gc):
    sb = CountingSandbox()
    ev = Evaluator(sb, gc)
    t = task(dbs[0], "SELECT name FROM singer WHERE country = 'US'")
    rnd = "SELECT name FROM singer ORDER BY random() LIMIT 3"
    ev.score_many([(rnd, t)] * 4)  # duplicates in one batch run separately
    assert sb.calls.count(rnd) == 4
    det = "SELECT name FROM singer LIMIT 3"
    out = ev.score_many([(det, t)] * 4)
    assert sb.calls.count(det) == 1 and len({str(r.to_dict()) for r in out}) == 1
    assert ev.memo_stats()["duplicate_hits"] == 3


@pytest.mark.parametrize("failure", ["worker_crash", "timeout", "too_large", RuntimeError("pipe broke")])
def test_infra_errors_and_timeouts_are_not_shared(dbs, gc, failure):
    pred = "SELECT name FROM singer WHERE country = 'US'"
    sb = CountingSandbox({pred: [failure]})
    ev = Evaluator(sb, gc)
    t = task(dbs[0], pred)
    first, second = ev.score_many([(pred, t)] * 2)
    assert first.status in ("infra_error", "timeout", "exec_error")
    assert second.status == "match" and second.value == 1.0  # executed again, and now it works
    assert sb.calls.count(pred) == 2
    out = ev.score_many([(pred, t)] * 3)  # reproducible now: executed once for the three
    assert [r.status for r in out] == ["match"] * 3 and sb.calls.count(pred) == 3


def test_timeout_in_a_batch_is_not_shared_with_its_duplicates(dbs, gc):
    pred = "SELECT name FROM singer WHERE country = 'US'"
    sb = CountingSandbox({pred: ["timeout"]})
    ev = Evaluator(sb, gc)
    out = ev.score_many([(pred, task(dbs[0], pred))] * 3)
    assert [r.status for r in out] == ["timeout", "match", "match"]


def test_repeats_of_a_timed_out_prediction_are_rescored_side_by_side(dbs, gc):
    """Four samples of one prediction that times out every time: the first is scored, then the three
    repeats together in one more sandbox call (not one repeat per call, one after the other)."""
    pred = "SELECT name FROM singer WHERE country = 'US'"

    class Waves(CountingSandbox):
        def __init__(self, script):
            super().__init__(script)
            self.waves: list[int] = []  # items per sandbox call

        def execute(self, db_path, sql, timeout_s=None):
            self.waves.append(1)
            return super().execute(db_path, sql)

        def execute_many(self, items):
            self.waves.append(len(items))
            return [CountingSandbox.execute(self, d, s) for d, s in items]

    sb = Waves({pred: ["timeout"] * 4})
    out = Evaluator(sb, gc).score_many([(pred, task(dbs[0], pred))] * 4)
    assert [r.status for r in out] == ["timeout"] * 4
    assert sb.waves == [1, 3]


def test_transient_runtime_error_not_shared_but_sql_error_is(dbs, gc):
    t = task(dbs[0], "SELECT name FROM singer")
    sb = CountingSandbox()
    ev = Evaluator(sb, gc)
    out = ev.score_many([("SELECT nope FROM singer", t)] * 3)
    assert [r.status for r in out] == ["exec_error"] * 3
    assert sb.calls.count("SELECT nope FROM singer") == 1

    class Flaky(CountingSandbox):
        def execute(self, db_path, sql, timeout_s=None):
            self.calls.append(sql)
            return FakeResult("runtime_error", message="disk I/O error")

    fl = Flaky()
    ev = Evaluator(fl, gc)
    ev.score_many([("SELECT name FROM singer", t)] * 3)
    assert len(fl.calls) == 3


def test_returned_rewards_are_copies(dbs, gc):
    ev = Evaluator(CountingSandbox(), gc)
    t = task(dbs[0], "SELECT name, age FROM singer ORDER BY age LIMIT 3")
    a, b = ev.score_many([("SELECT age, name FROM singer ORDER BY age LIMIT 3", t)] * 2)
    a.parts["permutation"].append(99)
    a.parts["execution_match"] = "edited"
    assert "execution_match" not in b.parts and 99 not in b.parts["permutation"]


def test_nothing_is_kept_between_calls(dbs, gc):
    sb = CountingSandbox()
    ev = Evaluator(sb, gc)
    t = task(dbs[0], "SELECT name FROM singer")
    for _ in range(3):
        ev.score("SELECT name FROM singer", t)
    assert sb.calls == ["SELECT name FROM singer"] * 3
    off = Evaluator(sb, gc, memo_entries=0)
    off.score_many([("SELECT name FROM singer", t)] * 2)
    assert len(sb.calls) == 5 and off.memo_stats()["duplicate_hits"] == 0


# ------------------------------------------------------------------- execution_match fast path


def _rand_rows(rng, n, k, floats):
    vals = [1, 2, 3, "a", "b", None] + ([0.5, 1.25, 1e-12] if floats else [])
    return [tuple(rng.choice(vals) for _ in range(k)) for _ in range(n)]


@pytest.mark.parametrize("seed", range(6))
def test_fast_path_changes_nothing(seed, monkeypatch):
    rng = random.Random(seed)
    golds = [
        "SELECT a, b FROM t",
        "SELECT a, b FROM t ORDER BY a",
        "SELECT a, b FROM t ORDER BY a LIMIT 4",
        "SELECT a, b, c FROM t ORDER BY count(*)",
        "SELECT a FROM t ORDER BY a DESC LIMIT 3 OFFSET 1",
    ]
    cases = []
    for _ in range(300):
        gsql = rng.choice(golds)
        k = 1 if "SELECT a FROM" in gsql else (3 if ", c" in gsql else 2)
        n = rng.randint(0, 8)
        g = _rand_rows(rng, n, k, rng.random() < 0.5)
        kind = rng.random()
        if kind < 0.4:
            p = list(g)
        elif kind < 0.6:
            p = rng.sample(g, len(g))
        elif kind < 0.8:
            p = [tuple(reversed(r)) for r in g]
        else:
            p = _rand_rows(rng, n, k, rng.random() < 0.5)
        cases.append((gsql, g, p))
    # a tolerance chain inside an ORDER BY run: equal rows, but the boundary key check differs
    cases.append(("SELECT a FROM t ORDER BY a LIMIT 3", [(1.0,), (1.0000009,), (1.0000018,)], None))
    cases[-1] = (cases[-1][0], cases[-1][1], list(cases[-1][1]))

    def run():
        out = []
        for gsql, g, p in cases:
            for tol in (True, False):
                m = execution_match(None, g, None, p, gold_shape(gsql), float_tol=tol, tie_relax=tol)
                out.append((m.match, m.reason, m.permutation, m.mode))
        return out

    fast = run()
    monkeypatch.setattr(reward_mod, "_FAST_PATH", False)
    assert run() == fast


def test_evaluator_fast_paths_change_no_reward(dbs, tmp_path, monkeypatch):
    """Every reward (parts included: test-suite match, permutation, modes) is the same with the
    fast paths on (scored in the sandbox workers, as in training) and with them off. The slow side is
    scored in this process (a sandbox without `execute_scored`), where the switches below apply: the
    workers import their own copy of the module, which a monkeypatch here would not reach."""

    class ParentSide:  # the sandbox minus `execute_scored`: the Evaluator scores in this process
        def __init__(self, sb):
            self.execute, self.execute_many = sb.execute, sb.execute_many

    pairs = [(p, task(db, g)) for db in dbs for g in GOLDS for p in PREDS if not (p and "random" in p)]
    with Sandbox(workers=2) as sb, GoldCache(tmp_path / "gc") as gc:
        fast = [r.to_dict() for r in Evaluator(sb, gc, memo_entries=0).score_many(pairs)]
        monkeypatch.setattr(reward_mod, "_FAST_PATH", False)
        monkeypatch.setattr(shape_mod, "_remove_distinct_fast", lambda sql: None)
        shape_mod.remove_distinct.cache_clear()
        try:
            slow = [r.to_dict() for r in Evaluator(ParentSide(sb), gc, memo_entries=0).score_many(pairs)]
        finally:
            shape_mod.remove_distinct.cache_clear()
    assert slow == fast
    assert sum(r["parts"].get("test_suite_match") == 1.0 for r in fast) >= len(dbs) * len(GOLDS)


class _BarrierGoldCache:
    """A real GoldCache that records, per thread, the `resolved` dict each `get_many` call gets, and
    holds each thread's first call at a barrier, so that both threads have started a `score_many`
    before either looks up its gold variants."""

    def __init__(self, gc, barrier):
        self.gc, self.barrier, self.seen = gc, barrier, {}

    def get_many(self, items, progress=False, resolved=None):
        import threading

        name = threading.current_thread().name
        first = name not in self.seen
        self.seen.setdefault(name, []).append(resolved)
        if first:
            self.barrier.wait(timeout=30)
        return self.gc.get_many(items, progress=progress, resolved=resolved)

    def get(self, db_path, sql):
        return self.gc.get(db_path, sql)


def test_evaluator_shared_by_threads_keeps_each_calls_state_apart(dbs, gc):
    # veRL's reward workers and Agent Lightning's runners share one Evaluator across threads: a call's
    # resolved-path dict must stay its own (before, a second thread's call replaced the first's), and
    # the execution counter must add up
    import threading

    gold = "SELECT DISTINCT country FROM singer"  # has a DISTINCT-free variant: a second look-up
    preds = ["SELECT DISTINCT country FROM singer", "SELECT country FROM singer", "SELECT nope FROM singer"]
    barrier = threading.Barrier(2)
    shared = Evaluator(CountingSandbox(), _BarrierGoldCache(gc, barrier))
    out: dict = {}

    def work(k):
        out[k] = shared.score_many([(p, task(dbs[k], gold)) for p in preds])

    threads = [threading.Thread(target=work, args=(k,), name=f"scorer{k}") for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    serial = Evaluator(CountingSandbox(), gc)
    for k in range(2):
        want = serial.score_many([(p, task(dbs[k], gold)) for p in preds])
        assert [r.to_dict() for r in out[k]] == [r.to_dict() for r in want]
    seen = shared.gold_cache.seen
    assert sorted(seen) == ["scorer0", "scorer1"]
    for calls in seen.values():
        assert len(calls) >= 2 and all(c is calls[0] for c in calls)  # one dict per call, start to end
    assert seen["scorer0"][0] is not seen["scorer1"][0]
    assert shared.memo_stats()["executions"] == serial.memo_stats()["executions"]


def test_evaluator_with_real_sandbox_shared_by_threads(dbs, gc):
    # the whole stack under concurrent calls: the sandbox hands its idle workers to whichever call
    # takes them, the gold cache locks; every thread gets exactly the serial rewards
    import threading

    pairs = [
        (p, task(db, g)) for db in dbs for g in GOLDS[:4] for p in PREDS if p is None or "random" not in p
    ]
    with Sandbox(workers=2) as sb:
        shared = Evaluator(sb, gc)
        want = [r.to_dict() for r in Evaluator(sb, gc).score_many(pairs)]
        got: dict = {}

        def work(k):
            got[k] = [r.to_dict() for r in shared.score_many(pairs[k::3])]

        threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    for k in range(3):
        assert got[k] == want[k::3]
