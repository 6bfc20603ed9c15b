"""Adversarial cases against the reward, fourth round, scored through `Evaluator.score_many` as training
scores them (a 1 s statement deadline), on a real SQLite file; verdicts worked out by hand. Each case
marked "failed on main" did before its fix.

Sort keys under a collation: `ORDER BY name COLLATE NOCASE` ties 'Ann' and 'ann', which Python's
equality (the runs of `reward/cut.py`) does not; the rows carrying one key may then be non-contiguous
runs ('Ann', 'ann', 'Ann'), and a pool per run let one real row stand in twice.
"""

from __future__ import annotations

import pytest

from conftest import make_name_age_db, score_statuses
from sqlrl.sql.sandbox import Sandbox

# ordered by name COLLATE NOCASE, then by the rowid order SQLite keeps for ties (age here):
# 1 Ann, 2 ann, 3 Ann, 4 Ann (one NOCASE key), 5 Bob
ROWS = [("Ann", 1), ("ann", 2), ("Ann", 3), ("Ann", 4), ("Bob", 5)]
MATCH, MISMATCH = ("match", 1.0), ("mismatch", 0.0)
GOLD = "SELECT age, name FROM (SELECT * FROM t ORDER BY age LIMIT 100) ORDER BY name COLLATE NOCASE"
CASES = [
    (GOLD, MATCH),
    # the same rows, the NOCASE ties in another order: SQL's tie, but ties are Python's equality in the
    # reward (stated in cut.py): a false negative, never a false positive
    ("VALUES (3, 'Ann'), (2, 'ann'), (1, 'Ann'), (4, 'Ann'), (5, 'Bob')", MISMATCH),
    ("VALUES (1, 'Ann'), (2, 'ann'), (3, 'Ann'), (4, 'Ann'), (5, 'Bob')", MATCH),  # the gold's own order
    # row 1 missing, row 3 twice: failed on main (run 0's pool and the last run's pool both took row 3)
    ("VALUES (3, 'Ann'), (2, 'ann'), (3, 'Ann'), (4, 'Ann'), (5, 'Bob')", MISMATCH),
    ("VALUES (4, 'Ann'), (2, 'ann'), (4, 'Ann'), (4, 'Ann'), (5, 'Bob')", MISMATCH),
    # Bob before the ties: the order the gold asks for is broken
    ("VALUES (5, 'Bob'), (1, 'Ann'), (2, 'ann'), (3, 'Ann'), (4, 'Ann')", MISMATCH),
]
# With LIMIT: the first 3 rows by NOCASE name. SQL ties 'Ann' and 'ann'; the reward does not, so no
# tied row may stand in (no cut), and none twice.
GOLD_LIMIT = "SELECT age, name FROM t ORDER BY name COLLATE NOCASE LIMIT 3"
LIMIT_CASES = [
    (GOLD_LIMIT, MATCH),
    (
        "SELECT age, name FROM t ORDER BY name COLLATE NOCASE, age DESC LIMIT 3",
        MISMATCH,
    ),  # stated false negative
    ("VALUES (4, 'Ann'), (4, 'Ann'), (3, 'Ann')", MISMATCH),  # one real row twice
    ("VALUES (1, 'Ann'), (3, 'Ann'), (3, 'Ann')", MISMATCH),
    ("VALUES (5, 'Bob'), (1, 'Ann'), (2, 'ann')", MISMATCH),  # a row past the ties
]


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> str:
    return make_name_age_db(tmp_path_factory.mktemp("adv4") / "toy" / "toy.sqlite", ROWS)


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(workers=1) as sb:
        yield sb


@pytest.mark.parametrize("gold,cases", [(GOLD, CASES), (GOLD_LIMIT, LIMIT_CASES)], ids=["no-limit", "limit"])
def test_collation_ties_never_let_a_row_stand_in_twice(toy, sandbox, gold, cases) -> None:
    got = score_statuses(sandbox, toy, gold, [p for p, _ in cases], timeout_s=1.0)
    assert got == [want for _, want in cases], list(zip([p for p, _ in cases], got))


# The float tolerance at large magnitudes: 1e-9 relative accepted an answer rounded to one decimal once
# values passed about 5e7 (film_rank's avg(Gross_in_dollar) 114827242.38 matched 114827242.4); 1e-12
# (absolute 1e-9 near zero) keeps summation-order noise and rejects one-decimal roundings below 5e10.
BIG = [("X", 114827242.3846154), ("Y", 114827242.3846154), ("Z", 9876543210.25)]
AVG_XY = "SELECT avg(age) FROM t WHERE name IN ('X', 'Y')"
BIG_CASES = [
    (AVG_XY, "SELECT sum(age) / count(*) FROM t WHERE name IN ('Y', 'X')", MATCH),  # noise only
    (AVG_XY, "SELECT 114827242.3846154", MATCH),
    (AVG_XY, "SELECT round(avg(age), 1) FROM t WHERE name IN ('X', 'Y')", MISMATCH),  # failed on main
    (AVG_XY, "SELECT 114827242.38", MISMATCH),  # failed on main
    (AVG_XY, "SELECT 114827242.385", MISMATCH),
    ("SELECT age FROM t WHERE name = 'Z'", "SELECT round(age, 1) FROM t WHERE name = 'Z'", MISMATCH),
    ("SELECT age * 3 FROM t WHERE name = 'Z'", "SELECT age + age + age FROM t WHERE name = 'Z'", MATCH),
]


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> str:
    return make_name_age_db(tmp_path_factory.mktemp("adv4big") / "big" / "big.sqlite", BIG)


@pytest.mark.parametrize("gold,pred,want", BIG_CASES)
def test_large_values_rounded_are_not_within_the_tolerance(big, sandbox, gold, pred, want) -> None:
    assert score_statuses(sandbox, big, gold, [pred], timeout_s=1.0) == [want]
