"""A gold with a top-level LIMIT (and OFFSET) but no ORDER BY: which rows it returns is SQLite's choice.

Rule (`execution_match` rule 4d): the prediction matches when it returns as many rows as the gold and
its rows, as a multiset, are rows of the gold's whole result without LIMIT/OFFSET (run once and cached
with the gold): each predicted row its own row of that result, columns in any order. Before, only the
rows the gold happened to return matched. The verdicts below are worked out by hand on this table.
"""

from __future__ import annotations

import pytest

from conftest import ParentOnlySandbox, gold_task, make_name_age_db
from sqlrl.reward.cut import Cut, CutQuery, cut_query
from sqlrl.reward.evaluator import Evaluator
from sqlrl.reward.match import execution_match
from sqlrl.reward.shape import GoldShape
from sqlrl.sql.sandbox import Sandbox
from sqlrl.tasks.goldcache import GoldCache

# rowid order: A 30 | B 30 | C 40 | D 25 | E 40 | F 50
ROWS = [("A", 30), ("B", 30), ("C", 40), ("D", 25), ("E", 40), ("F", 50)]
M, X = "match", "mismatch"

# (gold, prediction, verdict, compare_mode)
CASES = [
    # gold rows A, B; any two distinct names of t match
    ("SELECT name FROM t LIMIT 2", "SELECT name FROM t LIMIT 2", M, "subset"),  # identical rows
    ("SELECT name FROM t LIMIT 2", "SELECT name FROM t WHERE age = 40", M, "subset"),
    ("SELECT name FROM t LIMIT 2", "SELECT name FROM t ORDER BY age DESC LIMIT 2", M, "subset"),
    ("SELECT name FROM t LIMIT 2", "SELECT 'Z' UNION ALL SELECT 'A'", X, "subset"),  # Z is no row of t
    ("SELECT name FROM t LIMIT 2", "SELECT 'A' UNION ALL SELECT 'A'", X, "subset"),  # A is one row
    ("SELECT name FROM t LIMIT 2", "SELECT name FROM t LIMIT 3", X, None),  # row count
    ("SELECT name FROM t LIMIT 2", "SELECT name, age FROM t LIMIT 2", X, None),  # column count
    # gold row C 40 (OFFSET 2)
    ("SELECT name, age FROM t LIMIT 1 OFFSET 2", "SELECT name, age FROM t WHERE name = 'F'", M, "subset"),
    ("SELECT name, age FROM t LIMIT 1 OFFSET 2", "SELECT age, name FROM t LIMIT 1", M, "subset"),  # A 30
    ("SELECT name, age FROM t LIMIT 1 OFFSET 2", "SELECT name, age FROM t LIMIT 1, 1", M, "subset"),
    ("SELECT name, age FROM t LIMIT 1 OFFSET 2", "SELECT 'F', 40", X, "subset"),  # F is 50: no such row
    ("SELECT name, age FROM t LIMIT 1 OFFSET 2", "SELECT name, 99 FROM t LIMIT 1", X, "subset"),
    ("SELECT name, age FROM t LIMIT 2, 1", "SELECT 'E', 40", M, "subset"),  # LIMIT offset, count
    # duplicates count: gold 30, 30, 40; t holds 40 twice and 50 once
    ("SELECT age FROM t LIMIT 3", "SELECT age FROM t WHERE age > 35", M, "subset"),  # 40, 40, 50
    ("SELECT age FROM t LIMIT 3", "SELECT age FROM t ORDER BY age LIMIT 3", M, "subset"),  # 25, 30, 30
    ("SELECT age FROM t LIMIT 3", "SELECT 50 UNION ALL SELECT 50 UNION ALL SELECT 50", X, "subset"),
    # aggregates and compounds: the whole result of the query without its LIMIT
    ("SELECT age, count(*) FROM t GROUP BY age LIMIT 2", "SELECT 40, 2 UNION ALL SELECT 50, 1", M, "subset"),
    ("SELECT age, count(*) FROM t GROUP BY age LIMIT 2", "SELECT 40, 1 UNION ALL SELECT 50, 1", X, "subset"),
    (
        "SELECT name FROM t WHERE age < 35 UNION SELECT name FROM t WHERE age > 45 LIMIT 2",
        "SELECT 'F' UNION ALL SELECT 'D'",
        M,
        "subset",
    ),  # noqa: E501
    (
        "SELECT name FROM t WHERE age < 35 UNION SELECT name FROM t WHERE age > 45 LIMIT 2",
        "SELECT 'C' UNION ALL SELECT 'D'",
        X,
        "subset",
    ),  # noqa: E501
    # a LIMIT past the end: the gold is its whole result, nothing else may stand in
    ("SELECT name FROM t LIMIT 10", "SELECT name FROM t WHERE age > 0", M, "multiset"),
    ("SELECT name FROM t LIMIT 10", "SELECT name FROM t LIMIT 5", X, None),
    # ORDER BY ... LIMIT keeps its own rule: F is the oldest, C is not
    ("SELECT name FROM t ORDER BY age DESC LIMIT 1", "SELECT 'C'", X, "runs"),
    # a LIMIT inside a subquery is no top-level LIMIT: rows compared as returned
    ("SELECT name FROM (SELECT name FROM t LIMIT 2)", "SELECT name FROM t WHERE age = 40", X, "multiset"),
]


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> str:
    return make_name_age_db(tmp_path_factory.mktemp("lim") / "toy" / "toy.sqlite", ROWS)


@pytest.mark.parametrize("path", ["workers", "parent"])
def test_limit_without_order_by(toy, path):
    with Sandbox(workers=1) as sb, GoldCache(executor=sb) as gc:
        ev = Evaluator(sb if path == "workers" else ParentOnlySandbox(sb), gc)
        got = ev.score_many([(pred, gold_task(toy, gold)) for gold, pred, _, _ in CASES])
    wrong = [(g, p, r.status) for (g, p, v, _), r in zip(CASES, got) if r.status != v]
    assert wrong == []
    assert [r.value for r in got] == [1.0 if v == M else 0.0 for _, _, v, _ in CASES]
    modes = [(r.parts["compare_mode"], m) for (*_, m), r in zip(CASES, got) if m is not None]
    assert all(a == b for a, b in modes), modes


def test_whole_result_over_the_caps_gives_no_cut(toy):
    """A whole result over the gold cache's caps (6 rows, cap 5): nothing is relaxed (the rows the gold
    returned are compared as a multiset, a possible false negative), and the gold stays scorable."""
    with Sandbox(workers=1) as sb, GoldCache(executor=sb, max_rows=5) as gc:
        ev = Evaluator(sb, gc)
        gold = "SELECT name FROM t LIMIT 2"
        r1, r2 = ev.score_many(
            [
                ("SELECT name FROM t WHERE age = 40", gold_task(toy, gold)),
                ("SELECT 'B' UNION SELECT 'A'", gold_task(toy, gold)),
            ]
        )
    assert (r1.status, r1.parts["compare_mode"]) == ("mismatch", "multiset")
    assert (r2.status, r2.parts["compare_mode"]) == ("match", "multiset")


@pytest.mark.parametrize(
    "gold,want",
    [
        ("SELECT name FROM t LIMIT 2", CutQuery("SELECT name FROM t", 0, 0, None, True)),
        ("SELECT name FROM t LIMIT 2 OFFSET 3;", CutQuery("SELECT name FROM t", 3, 0, None, True)),
        ("SELECT name FROM t LIMIT 3, 2", CutQuery("SELECT name FROM t", 3, 0, None, True)),
        ("SELECT name FROM t -- all\nLIMIT 2", CutQuery("SELECT name FROM t -- all", 0, 0, None, True)),
        ("SELECT name FROM t LIMIT 2 OFFSET (SELECT 1)", None),  # a non-literal OFFSET
        ("SELECT name FROM t", None),  # no LIMIT
        ("SELECT name FROM (SELECT name FROM t LIMIT 2)", None),  # not top-level
    ],
)
def test_cut_query_without_order_by(gold, want):
    assert cut_query(gold) == want


# ----------------------------------------------------------------- bounded time with a pool of rows


def _float_pool(k: int, n: int) -> list[tuple]:
    return [tuple((i * k + j) / 7 for j in range(k)) for i in range(n)]


@pytest.mark.timeout(30)  # a hang guard (uncharged, it ran past 100 s), not a speed target
def test_pool_matching_is_charged_to_the_budget():
    """Every permutation of 7 float columns fails against a 4,096-row pool: each full check ran an
    exact matching of 64 x 4,096 row comparisons uncharged (5,040 of them: over 100 s here). The
    matching now counts toward `max_work`, so the search stops at its bound."""
    pool = _float_pool(7, 4096)
    gold = pool[:64]
    pred = [(r[0] + 0.01, *r[1:]) for r in pool[100:164]]  # no row of the pool, under any permutation
    shape = GoldShape(order_matters=False, has_limit=True, limit=64)
    m = execution_match(None, gold, None, pred, shape, Cut((64,), ((0, tuple(pool)),)))
    assert (m.match, m.reason) == (False, "permutation_bound")


def test_pool_matching_still_finds_near_rows():
    """Rows within the float tolerance of pool rows (not equal: the exact count fails) still match
    through one matching under the identity permutation (64 x 4,096 = 262,144 row visits)."""
    pool = _float_pool(7, 4096)
    pred = [(r[0] * (1 + 1e-13), *r[1:]) for r in pool[1000:1064]]
    shape = GoldShape(order_matters=False, has_limit=True, limit=64)
    m = execution_match(None, pool[:64], None, pred, shape, Cut((64,), ((0, tuple(pool)),)))
    assert (m.match, m.mode, m.permutation) == (True, "subset", tuple(range(7)))
