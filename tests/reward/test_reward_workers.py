"""Scoring inside the sandbox workers (`Sandbox.execute_scored` + `reward.scoring.score_in_worker`): the same
Reward (value, status, parts) as the parent-side path on a table of cases; a statement hung or a
worker killed in the middle of a chunk affects only its own pair; the gold comes only from the gold
cache and is never executed in a worker."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest

import sqlrl.reward.evaluator as reward_mod
from sqlrl.reward.evaluator import Evaluator
from sqlrl.sql.sandbox import Sandbox, SQLResult
from sqlrl.tasks.data import PrivateTask, PublicTask
from sqlrl.tasks.goldcache import GoldCache

BOMB = "SELECT printf('%.*c', 2000000000, 'x')"
SLOW = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("rw") / "toy" / "toy.sqlite"
    path.parent.mkdir()
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE singer (id INTEGER PRIMARY KEY, name TEXT, age INTEGER, country TEXT, score REAL);
        INSERT INTO singer VALUES (1, 'Ann', 30, 'FR', 1.5), (2, 'Bob', 30, 'US', 2.25),
            (3, 'Cid', 40, 'US', 3.0), (4, 'Dee', 25, 'FR', NULL), (5, 'Eve', 40, 'DE', 0.1),
            (6, 'Fay', NULL, 'US', 0.30000000000000004);
        CREATE TABLE song (id INTEGER PRIMARY KEY, singer_id INTEGER, title TEXT, sales REAL);
        INSERT INTO song VALUES (1, 1, 'a', 10.0), (2, 1, 'b', 5.5), (3, 2, 'c', NULL), (4, 3, 'a', 7.25);
        """
    )
    con.commit()
    con.close()
    return str(path)


def task(db_path: str, gold: str) -> PrivateTask:
    return PrivateTask(PublicTask("t/00000", "toy", "q?", "", "", db_path), gold)


class ParentSide:
    """The same real Sandbox without `execute_scored`: the Evaluator's parent-side path."""

    def __init__(self, sb: Sandbox):
        self.sb = sb

    def execute(self, db_path, sql, timeout_s=None):
        return self.sb.execute(db_path, sql, timeout_s)

    def execute_many(self, items):
        return self.sb.execute_many(items)


class Counting(Sandbox):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.scored = 0

    def execute_scored(self, items, refs, scorer, options=None, **kw):
        self.scored += len(items)
        return super().execute_scored(items, refs, scorer, options, **kw)


# (gold, prediction): ORDER BY, LIMIT ties, column permutation, floats, NULLs, DISTINCT, exec errors,
# forbidden SQL, unscorable gold, no SQL, multiple statements, empty results
CASES = [
    ("SELECT name FROM singer WHERE country = 'US'", "SELECT name FROM singer WHERE country = 'US'"),
    ("SELECT name FROM singer WHERE country = 'US'", "SELECT name FROM singer WHERE country = 'FR'"),
    ("SELECT name FROM singer WHERE country = 'US'", "SELECT name, age FROM singer WHERE country = 'US'"),
    ("SELECT name FROM singer ORDER BY id", "SELECT name FROM singer ORDER BY id DESC"),
    ("SELECT name FROM singer ORDER BY id", "SELECT name FROM singer ORDER BY id"),
    ("SELECT name, age FROM singer ORDER BY age DESC LIMIT 1", "SELECT name, age FROM singer WHERE age = 40"),
    (
        "SELECT name, age FROM singer WHERE age < 40 ORDER BY age DESC LIMIT 1",
        "SELECT name, age FROM singer WHERE age = 30 ORDER BY name DESC LIMIT 1",
    ),
    ("SELECT name, age FROM singer ORDER BY age", "SELECT age, name FROM singer ORDER BY age, id"),
    ("SELECT name, country, age FROM singer", "SELECT country, age, name FROM singer"),
    ("SELECT sum(score) FROM singer", "SELECT sum(score) + 1e-9 FROM singer"),
    ("SELECT avg(score) FROM singer", "SELECT sum(score) / count(score) FROM singer"),
    ("SELECT score FROM singer", "SELECT score * 1.0 FROM singer"),
    ("SELECT age FROM singer", "SELECT age FROM singer WHERE age IS NOT NULL"),
    ("SELECT age, score FROM singer", "SELECT age, score FROM singer ORDER BY score"),
    ("SELECT DISTINCT age FROM singer", "SELECT age FROM singer"),
    ("SELECT age FROM singer", "SELECT DISTINCT age FROM singer"),
    ("SELECT count(DISTINCT country) FROM singer", "SELECT count(country) FROM singer"),
    ("SELECT DISTINCT country FROM singer", "SELECT country FROM singer GROUP BY country"),
    (
        "SELECT DISTINCT country FROM singer ORDER BY country",
        "SELECT DISTINCT country FROM singer ORDER BY 1",
    ),
    (
        "SELECT T1.name, T2.title FROM singer T1 JOIN song T2 ON T1.id = T2.singer_id",
        "SELECT title, name FROM song JOIN singer ON singer.id = song.singer_id",
    ),
    ("SELECT title, sales FROM song", "SELECT title, sales FROM song WHERE sales IS NOT NULL"),
    ("SELECT name FROM singer", "SELEC name FROM singer"),
    ("SELECT name FROM singer", "SELECT nope FROM singer"),
    ("SELECT name FROM singer", "DROP TABLE singer"),
    ("SELECT name FROM singer", "SELECT load_extension('x')"),
    ("SELECT name FROM singer", "SELECT 1; SELECT 2"),
    ("SELECT name FROM singer", "  ;  "),
    ("SELECT name FROM singer", None),
    ("SELECT name FROM singer", "-- only a comment"),
    ("SELECT name FROM singer", "SELECT name FROM singer WHERE 0"),
    ("SELECT name FROM singer", "SELECT abs(-9223372036854775808)"),
    ("SELECT name FROM singer WHERE 0", "SELECT name FROM singer"),  # unscorable gold: empty
    ("SELECT nope FROM singer", "SELECT name FROM singer"),  # unscorable gold: error
    ("SELECT name FROM singer ORDER BY random() LIMIT 2", "SELECT name FROM singer LIMIT 2"),
]


@pytest.mark.parametrize("kind,test_suite", [("execution", True), ("execution", False), ("validity", True)])
def test_worker_scoring_equals_parent_side_scoring(db, tmp_path, kind, test_suite):
    pairs = [(pred, task(db, gold)) for gold, pred in CASES if "random" not in gold]
    with Counting(workers=2) as sb, GoldCache(tmp_path / "gc") as gc:
        workers = Evaluator(sb, gc, kind=kind, test_suite=test_suite).score_many(pairs)
        sent = [
            r for r, (p, _) in zip(workers, pairs) if r.status != "gold_unscorable" and (p or "").strip(" ;")
        ]
        assert sb.scored == len(sent) > 20  # every pair with a scorable gold and some SQL, in the workers
        parent = Evaluator(ParentSide(sb), gc, kind=kind, test_suite=test_suite).score_many(pairs)
        one_by_one = [Evaluator(sb, gc, kind=kind, test_suite=test_suite).score(p, t) for p, t in pairs]
    assert [r.to_dict() for r in workers] == [r.to_dict() for r in parent]
    assert [r.to_dict() for r in one_by_one] == [r.to_dict() for r in parent]
    statuses = {r.status for r in workers}
    assert {"match", "mismatch", "exec_error", "no_sql", "gold_unscorable"} <= statuses
    if kind == "execution" and test_suite:
        ts = [r.parts.get("test_suite_match") for r in workers]
        assert 1.0 in ts and 0.0 in ts


def test_large_gold_and_broken_execute_scored_use_the_parent_side_path(db, tmp_path, monkeypatch):
    pairs = [(pred, task(db, gold)) for gold, pred in CASES[:12]]
    with Counting(workers=1) as sb, GoldCache(tmp_path / "gc") as gc:
        expected = [r.to_dict() for r in Evaluator(ParentSide(sb), gc).score_many(pairs)]
        monkeypatch.setattr(reward_mod, "_WORKER_GOLD_MAX_CELLS", 3)  # golds above 3 cells stay here
        mixed = Evaluator(sb, gc).score_many(pairs)
        assert 0 < sb.scored < len(pairs)
        assert [r.to_dict() for r in mixed] == expected
        monkeypatch.undo()

        class Broken(Sandbox):
            def execute_scored(self, *a, **kw):
                raise RuntimeError("pipe broke")

        with Broken(workers=1) as broken:
            assert [r.to_dict() for r in Evaluator(broken, gc).score_many(pairs)] == expected


def test_gold_comes_only_from_the_gold_cache(db):
    """The gold cache answers with rows the database does not hold: a prediction equal to the gold SQL
    is a mismatch and one that produces the cached rows is a match, so the worker compared with the
    cached result and did not execute the gold; only the predictions (and variants) were executed."""

    gold = "SELECT name FROM singer WHERE country = 'US'"

    class Fabricated:
        def execute(self, db_path, sql, timeout_s=None):
            rows = [("zed",), ("yan",)] if "DISTINCT" not in sql else [("zed",)]
            return SQLResult("ok", ["name"], rows, len(rows))

    with Counting(workers=1) as sb, GoldCache(executor=Fabricated()) as gc:
        ev = Evaluator(sb, gc)
        same_text, cached_rows = ev.score_many(
            [(gold, task(db, gold)), ("SELECT 'yan' UNION SELECT 'zed'", task(db, gold))]
        )
        assert same_text.status == "mismatch" and cached_rows.status == "match"
        assert sb.scored == 2 and ev.executions == 2  # the two predictions, nothing else
        r = ev.score("SELECT DISTINCT name FROM singer", task(db, "SELECT DISTINCT name FROM singer"))
        # the gold variant (DISTINCT removed) is the gold cache's fabricated one too
        assert r.status == "mismatch" and r.parts["test_suite_match"] == 0.0 and ev.executions == 4


def test_hung_statement_mid_chunk_only_times_out_its_own_pair(db, tmp_path):
    gold = "SELECT name FROM singer WHERE country = 'US'"
    preds = [
        gold,
        BOMB,
        "SELECT name FROM singer",
        gold,
        "SELEC",
        "SELECT name FROM singer WHERE country = 'US' ORDER BY 1",
    ]
    pairs = [(p, task(db, gold)) for p in preds]
    with (
        Sandbox(workers=1, timeout_s=0.3, hard_timeout_s=0.8) as sb,
        GoldCache(tmp_path / "gc") as gc,
    ):
        pid = sb._all[0].proc.pid
        t0 = time.monotonic()
        got = Evaluator(sb, gc).score_many(pairs)
        assert time.monotonic() - t0 < 10
        assert sb.kills == 1 and sb._all[0].proc.pid != pid
        expected = Evaluator(ParentSide(sb), gc).score_many([pairs[i] for i in (0, 2, 3, 4, 5)])
    assert [r.status for r in got] == ["match", "timeout", "mismatch", "match", "exec_error", "match"]
    assert got[1].value == 0.0 and "killed" in got[1].parts["message"]
    assert [got[i].to_dict() for i in (0, 2, 3, 4, 5)] == [r.to_dict() for r in expected]


def test_hung_variant_gives_the_parent_side_result(db, tmp_path):
    """The prediction runs fast with DISTINCT; its DISTINCT-free variant (the test-suite metric) hangs
    inside one function call. The pair is re-run on the fresh worker with the variant answered as
    timed out: same Reward as the parent-side path (match, test_suite_match 0.0, pred_variant_timeout)."""
    gold = "SELECT 'x'"  # printf('%.*c', 0, 'x') is 'x'
    pred = "SELECT printf('%.*c', ((SELECT count(DISTINCT age) FROM singer) - 3) * 2000000000, 'x')"
    pairs = [("SELECT 1", task(db, "SELECT 1")), (pred, task(db, gold)), ("SELECT 2", task(db, "SELECT 2"))]
    with (
        Sandbox(workers=1, timeout_s=0.3, hard_timeout_s=0.8) as sb,
        GoldCache(tmp_path / "gc") as gc,
    ):
        got = Evaluator(sb, gc).score_many(pairs)
        assert sb.kills == 1
        expected = Evaluator(ParentSide(sb), gc).score_many(pairs)
        assert sb.kills == 2
    assert [r.to_dict() for r in got] == [r.to_dict() for r in expected]
    assert got[1].status == "match" and got[1].parts["test_suite_match"] == 0.0
    assert got[1].parts["test_suite_reason"] == "pred_variant_timeout"
    assert [got[0].status, got[2].status] == ["match", "match"]


@pytest.mark.parametrize("pipelined_chunks", [False, True])
def test_worker_crash_mid_chunk_is_infra_error_for_its_pair_only(db, tmp_path, request, pipelined_chunks):
    """Killed while scoring the second pair: that pair is infra_error, every other one gets the
    parent-side Reward; with small pipelined chunks too (the killed worker's queued chunk is re-run)."""
    if pipelined_chunks:
        request.getfixturevalue("pipelined")
    gold = "SELECT name FROM singer WHERE country = 'US'"
    preds = ["SELECT name FROM singer", SLOW, gold, "SELEC", gold + " ", "SELECT 1", gold + "  ", "x"]
    pairs = [(p, task(db, gold)) for p in preds]
    with Sandbox(workers=1, timeout_s=5.0, hard_timeout_s=10.0) as sb, GoldCache(tmp_path / "gc") as gc:
        ev = Evaluator(sb, gc)
        ev.score("SELECT 1", task(db, gold))  # worker up
        pid = sb._all[0].proc.pid
        timer = threading.Timer(0.5, os.kill, (pid, signal.SIGKILL))
        timer.start()
        got = ev.score_many(pairs)
        timer.join()
        assert sb.crashes == 1 and sb._all[0].proc.pid != pid
        rest = [0, 2, 3, 4, 5, 6, 7]
        expected = Evaluator(ParentSide(sb), gc).score_many([pairs[i] for i in rest])
    assert got[1].status == "infra_error" and got[1].value is None
    assert got[1].parts["sandbox_status"] == "worker_crash"
    assert [r.status for r in got[:5]] == ["mismatch", "infra_error", "match", "exec_error", "match"]
    assert [got[i].to_dict() for i in rest] == [r.to_dict() for r in expected]


def test_worker_keeps_golds_and_a_respawned_worker_gets_them_again(db, tmp_path):
    gold = "SELECT name FROM singer WHERE country = 'US'"
    with Sandbox(workers=1, timeout_s=0.3, hard_timeout_s=0.8) as sb, GoldCache(tmp_path / "gc") as gc:
        ev = Evaluator(sb, gc)
        assert ev.score(gold, task(db, gold)).status == "match"
        w = sb._all[0]
        held = dict(w.refs)
        assert len(held) == 1
        assert ev.score("SELECT name FROM singer", task(db, gold)).status == "mismatch"
        assert dict(w.refs) == held  # shipped once, kept
        assert ev.score(BOMB, task(db, gold)).status == "timeout"
        assert ev.score(gold, task(db, gold)).status == "match"  # the fresh worker got the gold again
        assert dict(w.refs) == held


@pytest.fixture
def pipelined(monkeypatch):
    """Small chunks, two in flight per worker (the second waits in the worker's pipe): what a large
    call gets, forced on the small calls of these tests."""
    import sqlrl.sql.sandbox as sandbox_mod

    monkeypatch.setattr(sandbox_mod, "_SCORE_MIN_CHUNK", 1)
    monkeypatch.setattr(sandbox_mod, "_SCORE_CHUNKS_PER_WORKER", 4)
    assert sandbox_mod._SCORE_DEPTH >= 2


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("where", [0, 1, 3, 6, 9])
def test_pipelined_chunks_hung_statement_only_times_out_its_own_pair(db, tmp_path, pipelined, workers, where):
    """A statement hanging in the chunk a worker runs, or in the one queued behind it: only its own
    pair times out (after the hard limit, counted from when the worker could start it), every other
    pair gets the parent-side Reward, and the queued items are re-run on the fresh worker."""
    gold = "SELECT name FROM singer WHERE country = 'US'"
    others = [gold, "SELECT name FROM singer", "SELEC", "SELECT DISTINCT name FROM singer WHERE age > 20"]
    preds = [others[i % len(others)] + " " * i for i in range(10)]
    preds[where] = BOMB
    pairs = [(p, task(db, gold)) for p in preds]
    with (
        Sandbox(workers=workers, timeout_s=0.3, hard_timeout_s=0.8) as sb,
        GoldCache(tmp_path / "gc") as gc,
    ):
        t0 = time.monotonic()
        got = Evaluator(sb, gc).score_many(pairs)
        assert time.monotonic() - t0 < 10
        assert sb.kills == 1 and sb.crashes == 0
        rest = [i for i in range(10) if i != where]
        expected = Evaluator(ParentSide(sb), gc).score_many([pairs[i] for i in rest])
    assert got[where].status == "timeout" and "killed" in got[where].parts["message"]
    assert [got[i].to_dict() for i in rest] == [r.to_dict() for r in expected]


def test_pipelined_chunks_equal_parent_side_scoring(db, tmp_path, pipelined):
    pairs = [(pred, task(db, gold)) for gold, pred in CASES if "random" not in gold]
    with Counting(workers=2) as sb, GoldCache(tmp_path / "gc") as gc:
        workers = Evaluator(sb, gc).score_many(pairs)
        assert sb.scored > 20
        parent = Evaluator(ParentSide(sb), gc).score_many(pairs)
    assert [r.to_dict() for r in workers] == [r.to_dict() for r in parent]


def test_one_path_resolution_per_call(db, tmp_path, monkeypatch):
    """score_many resolves (stats) each database path once per call, for the golds and their
    DISTINCT-free variants together."""
    gold = "SELECT DISTINCT name FROM singer"
    with Sandbox(workers=1) as sb, GoldCache(tmp_path / "gc") as gc:
        ev = Evaluator(sb, gc)
        ev.score_many([(gold, task(db, gold))])  # warm
        seen = []
        real = GoldCache._resolve

        def counting(self, given):
            seen.append(given)
            return real(self, given)

        monkeypatch.setattr(GoldCache, "_resolve", counting)
        got = ev.score_many(
            [(gold, task(db, gold)), ("SELECT name FROM singer WHERE age > 30", task(db, gold))]
        )
        assert [r.status for r in got] == ["match", "mismatch"]
        assert got[0].parts["test_suite_match"] == 1.0
        assert seen == [db]


def test_chunk_too_big_for_the_pipe_is_not_queued_behind_a_hung_statement(db, tmp_path, pipelined):
    """A chunk whose message (here: a large gold shipped with it) might not fit in the pipe is not
    queued behind a running chunk: a send that blocks until the worker reads would hold the parent's
    thread, and the watchdog with it, for as long as a hung statement runs."""

    small = "SELECT name FROM singer WHERE country = 'US'"
    big = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 20000) "
        "SELECT 'some text to make it larger ' || x, x FROM c"
    )
    preds = [BOMB, small] + [big + " " * i for i in range(6)]
    pairs = [(p, task(db, small)) for p in preds[:2]] + [(p, task(db, big)) for p in preds[2:]]
    with (
        Sandbox(workers=1, timeout_s=0.3, hard_timeout_s=0.8) as sb,
        GoldCache(tmp_path / "gc", timeout_s=30) as gc,
    ):
        assert gc.get(db, big).row_count == 20000
        assert sb._all[0].sndbuf < 2 * 20000 * 30  # the big gold's message would not fit
        t0 = time.monotonic()
        got = Evaluator(sb, gc).score_many(pairs)
        assert time.monotonic() - t0 < 8
        assert sb.kills == 1
    assert got[0].status == "timeout"
    assert [r.status for r in got[1:]] == ["match"] * 7


def _pid_scorer(run, sql, refs, extra, options):
    """A scorer for `execute_scored` that reports which worker process ran the item."""
    import os

    return (os.getpid(), run(sql)[0])


def test_execute_scored_spreads_one_tasks_samples_over_the_workers(tmp_path):
    """A GRPO step lists its samples task by task; chunks of consecutive items put all samples of one
    task on one worker, where a group of slow queries then runs one after another. Strided chunks give
    each worker part of every group (both groups of 8 reach both workers)."""
    import sys

    path = tmp_path / "d.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (a)")
    con.commit()
    con.close()
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the workers import this module by name
    try:
        with Sandbox(workers=2) as sb:
            items = [(str(path), f"SELECT {g} + {k} FROM t", (), None) for g in range(2) for k in range(8)]
            got = sb.execute_scored(items, {}, "test_reward_workers:_pid_scorer", None)
    finally:
        sys.path.remove(str(Path(__file__).resolve().parent))
    assert [g[1] for g in got] == ["ok"] * 16
    for g in range(2):
        assert len({pid for pid, _ in got[g * 8 : g * 8 + 8]}) == 2, got


def test_exec_ms_reports_the_sandbox_time_of_each_pair_on_both_paths(db, tmp_path):
    """`Reward.exec_ms`: the sandbox's milliseconds on the pair's SQL, from the workers and from the
    parent-side path alike; None where nothing ran; a repeat carries its first occurrence's time; never
    part of equality or `to_dict` (so rewards with different timings still compare equal)."""
    heavy = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 300000) SELECT count(*) FROM c"
    light = "SELECT count(*) FROM singer"
    t = task(db, "SELECT count(*) FROM singer")
    with Sandbox(workers=1) as sb, GoldCache(tmp_path / "gc", workers=1) as gc:
        got = {}
        for name, box in (("workers", sb), ("parent", ParentSide(sb))):
            ev = Evaluator(box, gc)
            got[name] = ev.score_many([(heavy, t), (light, t), (None, t), (light, t), ("SELEC x", t)])
    for name, (h, lt, none, again, bad) in got.items():
        assert h.status == "mismatch" and lt.status == "match" and bad.status == "exec_error", name
        assert h.exec_ms is not None and lt.exec_ms is not None and h.exec_ms > lt.exec_ms >= 0, name
        assert h.exec_ms >= 1.0, name  # 300,000 recursive rows take well over a millisecond
        assert none.status == "no_sql" and none.exec_ms is None, name
        assert again.exec_ms == lt.exec_ms, name  # the repeat was answered from the first pair
        assert bad.exec_ms is not None and bad.exec_ms >= 0, name
        assert "exec_ms" not in h.to_dict()
    assert got["workers"] == got["parent"]  # equality ignores the (different) timings
