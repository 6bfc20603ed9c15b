"""Repeats of a prediction cut at a statement limit within one `score_many` call: under a training
deadline (`Evaluator(timeout_s=...)`) they get copies of its `timeout` (one deadline per step, equal
rewards for identical GRPO samples); without one (evaluation) they are scored again, in one more call."""

from __future__ import annotations

import sqlite3

import pytest

from sqlrl.reward.evaluator import Evaluator
from sqlrl.sql.sandbox import Sandbox
from sqlrl.tasks.data import PrivateTask, PublicTask
from sqlrl.tasks.goldcache import GoldCache

ENDLESS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "toy" / "toy.sqlite"
    path.parent.mkdir()
    con = sqlite3.connect(path)
    con.executescript("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (7), (3);")
    con.commit()
    con.close()
    return str(path)


def spied(sb: Sandbox, calls: list) -> None:
    real = sb.execute_scored

    def spy(items, refs, scorer, options=None, timeout_s=None):
        calls.append((len(items), timeout_s))
        return real(items, refs, scorer, options, timeout_s=timeout_s)

    sb.execute_scored = spy


def pairs(db: str) -> list:
    task = PrivateTask(PublicTask("t/0", "toy", "q?", "", "", db), "SELECT max(x) FROM t")
    other = PrivateTask(PublicTask("t/1", "toy", "q?", "", "", db), "SELECT min(x) FROM t")
    return [(ENDLESS, task)] * 3 + [("SELECT 3", other)] * 2


def test_under_a_training_deadline_repeats_of_a_timeout_get_copies(db, tmp_path):
    calls: list = []
    with Sandbox(workers=2) as sb, GoldCache(tmp_path / "gc") as gc:
        spied(sb, calls)
        ev = Evaluator(sb, gc, timeout_s=0.3)
        got = ev.score_many(pairs(db))
        assert calls == [(2, 0.3)]  # the endless prediction once, the match once: no second call
        assert ev.memo_stats() == {"duplicate_hits": 3, "executions": 2}
    assert [r.status for r in got] == ["timeout"] * 3 + ["match"] * 2
    assert [r.value for r in got[:3]] == [0.0] * 3
    assert got[1].parts == got[0].parts and got[1].parts is not got[0].parts  # copies, not one object
    assert "time limit of 0.3 s" in got[2].parts["message"]


def test_in_evaluation_repeats_of_a_timeout_are_scored_again_in_one_more_call(db, tmp_path):
    calls: list = []
    with Sandbox(workers=2, timeout_s=0.3) as sb, GoldCache(tmp_path / "gc") as gc:
        spied(sb, calls)
        ev = Evaluator(sb, gc)
        got = ev.score_many(pairs(db))
        assert calls == [(2, None), (2, None)]  # then both repeats together, side by side
        assert ev.memo_stats() == {"duplicate_hits": 1, "executions": 4}
    assert [r.status for r in got] == ["timeout"] * 3 + ["match"] * 2
