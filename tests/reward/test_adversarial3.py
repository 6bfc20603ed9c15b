"""Adversarial cases against the reward, third round: an attacker's and a careless user's predictions
scored through `Evaluator.score_many` as training scores them (a 1 s statement deadline).

Each table lists cases with the verdict worked out by hand; the databases are real SQLite files (a
toy one here, the shared Spider ones where present). Cases that held on main are in `HELD`; the others
each failed on main before their fix.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import make_name_age_db, score_statuses
from sqlrl.reward.cut import cut_query
from sqlrl.reward.match import execution_match
from sqlrl.reward.shape import gold_shape
from sqlrl.sql.sandbox import Sandbox

SPIDER = Path(__file__).resolve().parents[3] / "shared" / "data" / "spider" / "database"
needs_spider = pytest.mark.skipif(not (SPIDER / "bike_1").is_dir(), reason="no Spider data")

# t(name, age) with near-equal non-integral ages: each neighbour within the 1e-6 relative tolerance
# of the next (6e-7 apart), A and C not (1.2e-6 apart); D and E truly tied.
# Ordered by age: A 1 | B 1.0000006 | C 1.0000012 | D 2.5, E 2.5
ROWS = [("A", 1), ("B", 1.0000006), ("C", 1.0000012), ("D", 2.5), ("E", 2.5)]
MATCH, MISMATCH = ("match", 1.0), ("mismatch", 0.0)


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> str:
    return make_name_age_db(tmp_path_factory.mktemp("adv3") / "toy" / "toy.sqlite", ROWS)


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(workers=1) as sb:
        yield sb


def _score(sandbox, db: str, gold_sql: str, preds: list[str]) -> list:
    return score_statuses(sandbox, db, gold_sql, preds, timeout_s=1.0)  # training's statement deadline


# --------------------------------------------------------------------------- ORDER BY ties are exact

# A top-level ORDER BY whose key is an output column, no LIMIT: only rows with EQUAL keys (SQLite's
# tie) may come in any order. Near-equal keys are distinct keys: on main they formed one run through
# the float tolerance, chained from neighbour to neighbour (A-B-C), so any order of A, B, C matched.
GOLD = "SELECT name, age FROM t ORDER BY age"
FLOAT_KEY_CASES = [
    ("SELECT name, age FROM t ORDER BY age", MATCH),
    ("SELECT name, age FROM t ORDER BY age, name DESC", MATCH),  # D, E truly tied
    ("SELECT name, age FROM t ORDER BY round(age, 3), name DESC", MISMATCH),  # C, B, A: failed on main
    ("SELECT name, age FROM t ORDER BY round(age, 3), name = 'B'", MISMATCH),  # A, C, B: failed on main
    ("SELECT name, age FROM t ORDER BY age DESC", MISMATCH),
    # the cells themselves still compare with the tolerance (rule 2): a key within it, in its place
    ("SELECT name, age + 1e-12 FROM t ORDER BY age", MATCH),
]


@pytest.mark.parametrize("pred,want", FLOAT_KEY_CASES)
def test_near_equal_float_keys_are_not_ties(toy, sandbox, pred, want):
    assert _score(sandbox, toy, GOLD, [pred])[0] == want


def test_near_equal_float_keys_are_not_ties_in_execution_match():
    # the same rule on execution_match alone (no cut: keys are output columns, no LIMIT)
    gold = [("A", 1.0), ("B", 1.0000006), ("C", 1.0000012)]
    shape = gold_shape("SELECT name, x FROM t ORDER BY x")
    assert not execution_match(None, gold, None, gold[::-1], shape).match  # matched on main
    assert not execution_match(None, gold, None, [gold[0], gold[2], gold[1]], shape).match  # matched on main
    assert execution_match(None, gold, None, [("A", 1.0000000001), gold[1], gold[2]], shape).match
    tied = [("A", 2.5), ("B", 2.5), ("C", 3.5)]
    assert execution_match(None, tied, None, [tied[1], tied[0], tied[2]], shape).match


@needs_spider
def test_near_equal_latitudes_on_spider(sandbox):
    # bike_1, San Francisco stations by lat: ... 37.7766 (Caltrain 2), 37.776617 (Caltrain),
    # 37.776619 (Market at 10th) ...: three distinct keys 4.5e-7 and 5e-8 apart relatively
    db = str(SPIDER / "bike_1" / "bike_1.sqlite")
    gold = "SELECT name, lat FROM station WHERE city = 'San Francisco' ORDER BY lat"
    preds = [
        "SELECT name, lat FROM station WHERE city = 'San Francisco' ORDER BY lat",
        "SELECT name, lat FROM station WHERE city = 'San Francisco' ORDER BY round(lat, 4), name DESC",
    ]
    assert _score(sandbox, db, gold, preds) == [MATCH, MISMATCH]  # the second matched on main


# --------------------------------------------------------------------------- an ORDER BY below a LIMIT

# A LIMIT without a top-level ORDER BY accepts any rows of the gold's whole result (rule 4d): the rows
# are the engine's choice. Not when an ORDER BY below the LIMIT picks them (a derived table, a CTE, a
# window): on main the youngest (D, 25) matched a gold asking for the oldest (F, 50). Such a gold's
# rows are now compared as returned (a multiset). By age DESC: F 50 | C, E 40 | A, B 30 | D 25.
OLDEST = [("A", 30), ("B", 30), ("C", 40), ("D", 25), ("E", 40), ("F", 50)]
INNER_ORDER_CASES = [
    ("SELECT name FROM (SELECT name FROM t ORDER BY age DESC) LIMIT 1", "SELECT 'F'", MATCH),
    ("SELECT name FROM (SELECT name FROM t ORDER BY age DESC) LIMIT 1", "SELECT 'D'", MISMATCH),
    (
        "SELECT name FROM (SELECT name FROM t ORDER BY age DESC) LIMIT 1",
        "SELECT name FROM t ORDER BY age LIMIT 1",
        MISMATCH,
    ),
    (
        "WITH o AS (SELECT name FROM t ORDER BY age DESC) SELECT name FROM o LIMIT 3",
        "VALUES ('E'), ('C'), ('F')",  # C and E tie at 40, both kept
        MATCH,
    ),
    (
        "WITH o AS (SELECT name FROM t ORDER BY age DESC) SELECT name FROM o LIMIT 3",
        "VALUES ('A'), ('B'), ('D')",
        MISMATCH,
    ),
    ("SELECT name, rank() OVER (ORDER BY age DESC) FROM t LIMIT 1", "SELECT 'F', 1", MATCH),
    ("SELECT name, rank() OVER (ORDER BY age DESC) FROM t LIMIT 1", "SELECT 'D', 6", MISMATCH),
    # held on main: no ORDER BY anywhere, so any two rows of the whole result (rule 4d)
    ("SELECT name FROM t LIMIT 2", "VALUES ('D'), ('F')", MATCH),
    ("SELECT name FROM t LIMIT 2", "VALUES ('D'), ('D')", MISMATCH),
]


@pytest.fixture(scope="module")
def ages(tmp_path_factory) -> str:
    return make_name_age_db(tmp_path_factory.mktemp("adv3b") / "ages" / "ages.sqlite", OLDEST)


@pytest.mark.parametrize("gold,pred,want", INNER_ORDER_CASES)
def test_an_order_by_below_the_limit_picks_the_rows(ages, sandbox, gold, pred, want):
    assert _score(sandbox, ages, gold, [pred])[0] == want


@pytest.mark.parametrize(
    "gold",
    [
        "SELECT name FROM (SELECT name FROM t ORDER BY age DESC) LIMIT 1",
        "WITH o AS (SELECT name FROM t ORDER BY age) SELECT name FROM o LIMIT 2 OFFSET 1",
        "SELECT name, rank() OVER (ORDER BY age) FROM t LIMIT 1",
    ],
)
def test_no_cut_query_under_an_inner_order_by(gold):
    assert cut_query(gold) is None


# --------------------------------------------------------------------------- the float tolerance

# The tolerance is for float rounding noise (a sum in another order, 0.1 + 0.2), 1e-12 relative. On
# main it was 1e-6: a budget sum of 1,077,459.33 matched the integer 1,077,460 (0.67 off: the same
# hole as an off-by-one large integer, with one side non-integral), its rounding and its truncation,
# and two distinct stored latitudes 2e-6 apart matched. Amounts in t.age (REAL values).
MONEY = [("M", 500000.11), ("F", 577459.22), ("A", 37.776619), ("B", 37.776617)]
SUM_MF = "SELECT sum(age) FROM t WHERE name IN ('M', 'F')"  # 1077459.33 (up to rounding noise)
TOLERANCE_CASES = [
    (SUM_MF, "SELECT sum(age) FROM t WHERE name IN ('F', 'M')", MATCH),
    (SUM_MF, "SELECT (SELECT age FROM t WHERE name = 'F') + (SELECT age FROM t WHERE name = 'M')", MATCH),
    (SUM_MF, "SELECT sum(age * 100) / 100 FROM t WHERE name IN ('M', 'F')", MATCH),  # noise only
    (SUM_MF, "SELECT 1077459.33", MATCH),
    (SUM_MF, "SELECT 1077460", MISMATCH),  # matched on main
    (
        SUM_MF,
        "SELECT round(sum(age)) FROM t WHERE name IN ('M', 'F')",
        MISMATCH,
    ),  # 1077459.0: matched on main
    (SUM_MF, "SELECT round(sum(age), 1) FROM t WHERE name IN ('M', 'F')", MISMATCH),  # matched on main
    (SUM_MF, "SELECT CAST(sum(age) AS INTEGER) FROM t WHERE name IN ('M', 'F')", MISMATCH),  # matched on main
    ("SELECT age FROM t WHERE name = 'A'", "SELECT age FROM t WHERE name = 'B'", MISMATCH),  # matched on main
    ("SELECT 0.1", "SELECT 0.10000001", MISMATCH),  # matched on main
    ("SELECT 0.1 + 0.2", "SELECT 0.3", MATCH),
    ("SELECT 1e-12", "SELECT 0", MATCH),  # the absolute tolerance, 1e-9
]


@pytest.fixture(scope="module")
def money(tmp_path_factory) -> str:
    return make_name_age_db(tmp_path_factory.mktemp("adv3c") / "money" / "money.sqlite", MONEY)


@pytest.mark.parametrize("gold,pred,want", TOLERANCE_CASES)
def test_the_tolerance_is_rounding_noise_only(money, sandbox, gold, pred, want):
    assert _score(sandbox, money, gold, [pred])[0] == want


@needs_spider
def test_rounded_large_values_on_spider(sandbox):
    # college_2: the Marketing and Finance budgets sum to 1077459.33; film_rank: the average gross is
    # 114827242.38461539; bike_1: two stations 2e-6 degrees of latitude apart
    budget = "SELECT sum(budget) FROM department WHERE dept_name = 'Marketing' OR dept_name = 'Finance'"
    got = _score(
        sandbox,
        str(SPIDER / "college_2" / "college_2.sqlite"),
        budget,
        [budget.replace("sum(budget)", "round(sum(budget))"), "SELECT 1077460", "SELECT 1077459.33"],
    )
    assert got == [MISMATCH, MISMATCH, MATCH]  # the first two matched on main
    gross = "SELECT avg(Gross_in_dollar) FROM film"
    got = _score(
        sandbox,
        str(SPIDER / "film_rank" / "film_rank.sqlite"),
        gross,
        [
            "SELECT sum(Gross_in_dollar) / count(*) FROM film",  # integer division: 114827242
            "SELECT 114827300",
            "SELECT sum(Gross_in_dollar) * 1.0 / count(*) FROM film",
        ],
    )
    assert got == [MISMATCH, MISMATCH, MATCH]  # the first two matched on main
    lat = "SELECT lat FROM station WHERE name = 'Market at 10th'"
    pred = "SELECT lat FROM station WHERE name = 'San Francisco Caltrain (Townsend at 4th)'"
    assert _score(sandbox, str(SPIDER / "bike_1" / "bike_1.sqlite"), lat, [pred]) == [MISMATCH]  # main: match


# --------------------------------------------------------------------------- positional ORDER BY terms

# `ORDER BY 2` sorts by the second output column. When the keys are not all output columns (a `*`,
# or an unseen key beside it) the cut appended each term's TEXT as a key: the constant 2, so every
# row tied and any rows of the table matched; likewise a bare name that is an output alias read as
# the table's column. Such a term now gives no cut (a strict comparison; ties are not relaxed). t by age DESC: F 50 | C, E 40 | A, B 30 | D 25 (rowid order A..F)
OUTPUT_REF_CASES = [
    ("SELECT * FROM t ORDER BY 2 DESC LIMIT 1", "SELECT * FROM t ORDER BY age DESC LIMIT 1", MATCH),
    ("SELECT * FROM t ORDER BY 2 DESC LIMIT 1", "SELECT * FROM t LIMIT 1", MISMATCH),  # A: matched on main
    ("SELECT * FROM t ORDER BY 2 DESC LIMIT 1", "SELECT 'D', 25", MISMATCH),  # matched on main
    ("SELECT * FROM t ORDER BY (2) DESC LIMIT 1", "SELECT 'D', 25", MISMATCH),  # matched on main
    ("SELECT * FROM t ORDER BY 2 DESC", "SELECT * FROM t ORDER BY age DESC", MATCH),
    ("SELECT * FROM t ORDER BY 2 DESC", "SELECT * FROM t", MISMATCH),  # matched on main
    # name first, then age: A (30) comes first; B (30) is not tied with it on (name, age)
    ("SELECT name FROM t ORDER BY 1, age LIMIT 1", "SELECT 'A'", MATCH),
    ("SELECT name FROM t ORDER BY 1, age LIMIT 1", "SELECT 'B'", MISMATCH),  # matched on main
    # a bare name equal to an output alias sorts by that column (name), not by t.age: A then B
    ("SELECT name AS age, * FROM t ORDER BY age LIMIT 1", "SELECT 'A', 'A', 30", MATCH),
    ("SELECT name AS age, * FROM t ORDER BY age LIMIT 1", "SELECT 'B', 'B', 30", MISMATCH),  # main: match
    # held on main: the keys resolve to output columns, ties at the cut still relaxed (C, E at 40)
    ("SELECT name, age FROM t ORDER BY 2 DESC LIMIT 2", "VALUES ('F', 50), ('E', 40)", MATCH),
    ("SELECT name, age FROM t ORDER BY 2 DESC LIMIT 2", "VALUES ('F', 50), ('A', 30)", MISMATCH),
]


@pytest.mark.parametrize("gold,pred,want", OUTPUT_REF_CASES)
def test_order_by_terms_naming_output_columns(ages, sandbox, gold, pred, want):
    assert _score(sandbox, ages, gold, [pred])[0] == want


@pytest.mark.parametrize(
    "gold,has_cut",
    [
        ("SELECT * FROM t ORDER BY 2 DESC LIMIT 1", False),
        ("SELECT * FROM t ORDER BY (2) LIMIT 1", False),
        ("SELECT * FROM t ORDER BY +2 LIMIT 1", False),
        ("SELECT * FROM t ORDER BY 2 COLLATE NOCASE LIMIT 1", False),
        ("SELECT * FROM t ORDER BY 0x2 LIMIT 1", False),
        ("SELECT name FROM t ORDER BY 1, age LIMIT 1", False),
        ("SELECT * FROM t ORDER BY 2 DESC", False),
        ("SELECT name AS age, * FROM t ORDER BY age LIMIT 1", False),
        ("SELECT name AS age, * FROM t ORDER BY (age) COLLATE NOCASE LIMIT 1", False),
        # not positional: a constant SQLite does not sort by, and keys that resolve
        ("SELECT * FROM t ORDER BY 2.0 LIMIT 1", True),
        ("SELECT * FROM t ORDER BY 2 + 0 LIMIT 1", True),
        ("SELECT * FROM t ORDER BY age LIMIT 1", True),
        ("SELECT name, age FROM t ORDER BY 2 DESC LIMIT 1", True),
        ("SELECT *, name AS n FROM t ORDER BY age LIMIT 1", True),  # age names no alias
        ("SELECT name AS age, * FROM t ORDER BY age + 0 LIMIT 1", True),  # an expression: t.age
    ],
)
def test_cut_query_refuses_terms_naming_output_columns(gold, has_cut):
    assert (cut_query(gold) is not None) is has_cut
