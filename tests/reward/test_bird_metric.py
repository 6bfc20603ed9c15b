"""BIRD's official metric (`set(pred) == set(gold)`) beside ours, on both scoring paths."""

from __future__ import annotations

import sqlite3

import pytest

from sqlrl.reward.bird import bird_set_match
from sqlrl.reward.evaluator import Evaluator
from sqlrl.sql.sandbox import Sandbox
from sqlrl.tasks.data import PrivateTask, PublicTask
from sqlrl.tasks.goldcache import GoldCache


def test_set_equality_ignores_order_and_duplicates_but_not_columns():
    assert bird_set_match([(1, "a"), (2, "b")], [[2, "b"], [1, "a"], [1, "a"]])
    assert bird_set_match([(1,)], [(1.0,)])  # Python equality, as BIRD's evaluation.py
    assert not bird_set_match([(1, "a")], [("a", 1)])  # column order matters
    assert not bird_set_match([(1,)], [(1,), (2,)])
    assert bird_set_match([], [])


@pytest.fixture()
def task(tmp_path):
    path = tmp_path / "toy" / "toy.sqlite"
    path.parent.mkdir()
    con = sqlite3.connect(path)
    con.executescript(
        "CREATE TABLE t (id INTEGER, c TEXT);INSERT INTO t VALUES (1, 'FR'), (2, 'US'), (3, 'US'), (4, 'DE');"
    )
    con.commit()
    con.close()
    return PrivateTask(PublicTask("toy/00000", "toy", "q?", "", "", str(path)), "SELECT c FROM t")


CASES = [
    # (prediction, our match, BIRD match)
    ("SELECT c FROM t", 1.0, 1.0),
    ("SELECT DISTINCT c FROM t", 0.0, 1.0),  # duplicates dropped: a multiset differs, a set does not
    ("SELECT c FROM t ORDER BY c DESC", 1.0, 1.0),
    ("SELECT c, id FROM t", 0.0, 0.0),
    ("SELECT nope FROM t", 0.0, 0.0),  # does not execute
]


class ParentSide:
    """The sandbox without `execute_scored`: the Evaluator scores on its parent-side path."""

    def __init__(self, sandbox):
        self._sb = sandbox

    def __getattr__(self, name):
        if name == "execute_scored":
            raise AttributeError(name)
        return getattr(self._sb, name)


@pytest.mark.parametrize("workers", [False, True], ids=["parent", "in-worker"])
def test_bird_match_is_a_reward_part_on_both_scoring_paths(task, tmp_path, workers):
    with Sandbox(workers=1, timeout_s=2.0) as sb, GoldCache(tmp_path / "gc") as gc:
        ev = Evaluator(sb if workers else ParentSide(sb), gc)
        got = ev.score_many([(sql, task) for sql, _, _ in CASES])
    assert [(r.parts["match"], r.parts["bird_match"]) for r in got] == [(m, b) for _, m, b in CASES]
