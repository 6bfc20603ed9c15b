"""`score_in_two_passes`: a short first statement limit, then the items that hit it again under the
full limit, each in a chunk of its own; the verdicts are those of one pass under the full limit."""

from __future__ import annotations

import sqlite3

import pytest

import sqlrl.reward.scoring as scoring_mod
from sqlrl.reward.evaluator import Evaluator
from sqlrl.reward.scoring import PROBE_FRACTION, score_in_two_passes
from sqlrl.sql.result import failure
from sqlrl.sql.sandbox import Sandbox
from sqlrl.tasks.data import PrivateTask, PublicTask
from sqlrl.tasks.goldcache import GoldCache

TIMEOUT = ("0.0", "timeout", {}, False, 1, 200.0)


class Scripted:
    """An `execute_scored` that answers from a script and records every call."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls: list[dict] = []

    def __call__(self, items, refs, scorer, options=None, timeout_s=None, spread=False):
        self.calls.append({"items": list(items), "timeout_s": timeout_s, "spread": spread})
        return self.answers.pop(0)


def test_only_distinct_items_that_hit_the_short_limit_run_again_side_by_side():
    items = [("a.db", f"q{k}", (7,), None) for k in range(5)]
    items[2] = items[1]  # a repeat of a slow item: rerun once, its answer given to both
    fast = (1.0, "match", {}, True, 1, 3.0)
    watchdog = failure("timeout", "hard limit")  # past the hard limit: never rerun
    again = [(0.0, "mismatch", {}, True, 1, 400.0), (0.0, "timeout", {}, False, 1, 1000.0)]
    ex = Scripted([fast, TIMEOUT, TIMEOUT, TIMEOUT, watchdog], again)
    got, extra = score_in_two_passes(ex, items, {7: (1, "gold")}, "m:f", {"kind": "execution"}, 1.0)
    first, second = ex.calls
    assert first["timeout_s"] == pytest.approx(PROBE_FRACTION * 1.0) and not first["spread"]
    assert first["items"] == items
    assert second == {"items": [items[1], items[3]], "timeout_s": 1.0, "spread": True}
    counted = [(*a[:4], 2, a[5]) for a in again]  # statements: the first pass's and the second's
    assert got == [fast, counted[0], counted[0], counted[1], watchdog] and extra == {}


def test_repeats_of_a_slow_item_run_in_its_second_pass_side_by_side():
    """Item 1 has 2 repeats wanted, item 0 (fast) 5: only the slow one's repeats run, in the same
    second pass as itself, and come back apart from its own answer."""
    items = [("a.db", "fast", (), None), ("a.db", "slow", (), None)]
    fast = (1.0, "match", {}, True, 1, 3.0)
    answers = [(0.0, "timeout", {}, False, 1, float(ms)) for ms in (1000, 1001, 1002)]
    ex = Scripted([fast, TIMEOUT], answers)
    got, extra = score_in_two_passes(ex, items, {}, "m:f", None, 1.0, [5, 2])
    assert ex.calls[1] == {"items": [items[1]] * 3, "timeout_s": 1.0, "spread": True}
    assert got == [fast, (*answers[0][:4], 2, 1000.0)] and extra == {1: answers[1:]}


def test_no_second_pass_when_nothing_is_slow():
    fast = (1.0, "match", {}, True, 1, 3.0)
    ex = Scripted([fast, fast])
    assert score_in_two_passes(ex, [("a", "x", (), None)] * 2, {}, "m:f", None, 5.0) == ([fast, fast], {})
    assert len(ex.calls) == 1


SLOW = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
FINITE = (
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 20000) SELECT count(*) FROM c"
)


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "toy" / "toy.sqlite"
    path.parent.mkdir()
    con = sqlite3.connect(path)
    con.executescript("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (20000), (3);")
    con.commit()
    con.close()
    return str(path)


def test_real_sandbox_verdicts_equal_one_pass(db, tmp_path, monkeypatch):
    """With a first limit so short that every statement with a loop hits it, the finite recursion still
    matches (second pass under the full limit) and the endless one is `timeout`, exactly as with one
    pass under the full limit (the first limit equal to it)."""

    def pub(k):
        return PublicTask(f"t/{k}", "toy", "q?", "", "", db)

    pairs = [
        (FINITE, PrivateTask(pub(0), "SELECT max(x) FROM t")),
        (FINITE, PrivateTask(pub(1), "SELECT max(x) FROM t")),
        (SLOW, PrivateTask(pub(2), "SELECT max(x) FROM t")),
        ("SELECT min(x) FROM t", PrivateTask(pub(3), "SELECT min(x) FROM t")),
        (FINITE + " WHERE 0", PrivateTask(pub(4), "SELECT max(x) FROM t")),
    ]
    calls: list[tuple] = []
    with Sandbox(workers=2, progress_ops=100) as sb, GoldCache(tmp_path / "gc") as gc:
        real = sb.execute_scored

        def spy(items, refs, scorer, options=None, timeout_s=None, spread=False):
            calls.append((len(items), timeout_s, spread))
            return real(items, refs, scorer, options, timeout_s=timeout_s, spread=spread)

        sb.execute_scored = spy
        monkeypatch.setattr(scoring_mod, "PROBE_FRACTION", 1e-6)
        two = [r.to_dict() for r in Evaluator(sb, gc, timeout_s=0.5).score_many(pairs)]
        assert calls[0] == (4, pytest.approx(0.5e-6), False)  # the two equal pairs are scored once
        assert calls[1][1:] == (0.5, True) and calls[1][0] >= 2  # the finite one (once) and the endless one
        monkeypatch.setattr(scoring_mod, "PROBE_FRACTION", 1.0)
        calls.clear()
        one = [r.to_dict() for r in Evaluator(sb, gc, timeout_s=0.5).score_many(pairs)]
        assert calls == [(4, 0.5, False)]  # a first limit not below the full one: one pass
    assert two == one
    assert [r["status"] for r in two] == ["match", "match", "timeout", "match", "mismatch"]


def test_identical_timed_out_predictions_are_scored_in_one_call(db, tmp_path):
    """Three identical endless predictions of one task: a timeout is not reproducible, so each gets a
    run of its own, but all three in the second pass of the one call (never a later call)."""
    pairs = [(SLOW, PrivateTask(PublicTask("t/0", "toy", "q?", "", "", db), "SELECT max(x) FROM t"))] * 3
    calls: list[tuple] = []
    with Sandbox(workers=3) as sb, GoldCache(tmp_path / "gc") as gc:
        real = sb.execute_scored

        def spy(items, refs, scorer, options=None, timeout_s=None, spread=False):
            calls.append((len(items), timeout_s, spread))
            return real(items, refs, scorer, options, timeout_s=timeout_s, spread=spread)

        sb.execute_scored = spy
        ev = Evaluator(sb, gc, timeout_s=0.5)
        got = ev.score_many(pairs)
        assert calls == [(1, pytest.approx(0.5 * PROBE_FRACTION), False), (3, 0.5, True)]
        assert ev.memo_stats() == {"duplicate_hits": 0, "executions": 4}
    assert [r.status for r in got] == ["timeout"] * 3
