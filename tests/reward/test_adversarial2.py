"""Adversarial cases against the reward and the sandbox, tried as an attacker and a careless user would.

Each table lists cases with the verdict worked out by hand; the databases are real SQLite files (a
toy one here, the shared Spider ones where present). Cases tried that already held on main are in
`HELD` (kept so that they keep holding); the others each failed on main before their fix.
"""

from __future__ import annotations

import marshal
import sqlite3
from pathlib import Path

import pytest

from conftest import gold_task, make_name_age_db, score_statuses
from sqlrl.reward import cut as cut_module
from sqlrl.reward.evaluator import Evaluator
from sqlrl.sql.engine import fits_caps
from sqlrl.sql.sandbox import Sandbox
from sqlrl.tasks.goldcache import GoldCache

SPIDER = Path(__file__).resolve().parents[3] / "shared" / "data" / "spider" / "database"
needs_spider = pytest.mark.skipif(not (SPIDER / "department_management").is_dir(), reason="no Spider data")

# ordered by age DESC: F 50 | C 40, E 40 | A 30, B 30 | D 25
ROWS = [("A", 30), ("B", 30), ("C", 40), ("D", 25), ("E", 40), ("F", 50)]


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> str:
    return make_name_age_db(tmp_path_factory.mktemp("adv2") / "toy" / "toy.sqlite", ROWS)


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(workers=1) as sb:
        yield sb


def _score(sandbox, db: str, gold_sql: str, preds: list[str], gold_cache=None) -> list:
    return score_statuses(sandbox, db, gold_sql, preds, gold_cache=gold_cache)


MATCH, MISMATCH = ("match", 1.0), ("mismatch", 0.0)

# --------------------------------------------------------------------------- the LIMIT cut and comments

# A line comment in the gold must not swallow the keys or the LIMIT the cut's full query inserts:
# (gold, (columns, rows) of its cut query on the toy table with no tie rows past the window, so the
# inserted LIMIT is the gold's offset + count)
COMMENTED_GOLDS = [
    # the key (age) is not an output column: it is inserted before FROM, after the comment
    ("SELECT name -- who\nFROM t ORDER BY age DESC LIMIT 1", (2, 1)),
    # the LIMIT is appended after a comment that ends the text before it
    ("SELECT name, age FROM t ORDER BY age DESC -- oldest first\nLIMIT 1", (2, 1)),
    ("SELECT name FROM t ORDER BY age DESC -- oldest first\nLIMIT 2", (2, 2)),
    ("SELECT name FROM t ORDER BY age DESC -- oldest first\nLIMIT 2 OFFSET 1", (2, 3)),
    ("SELECT name FROM t ORDER BY age /* c */ DESC LIMIT 1", (2, 1)),  # block comment: held on main
    ("SELECT name, age FROM t WHERE name <> '--' ORDER BY age LIMIT 3", (2, 3)),  # held on main
]


@pytest.mark.parametrize("gold,want", COMMENTED_GOLDS)
def test_cut_query_survives_line_comments(toy, gold, want):
    q = cut_module._cut_query(gold, 0)
    assert q is not None and q.limit is not None
    con = sqlite3.connect(toy)
    rows = con.execute(q.sql).fetchall()
    con.close()
    assert (len(rows[0]), len(rows)) == want


def test_tie_at_the_cut_is_relaxed_with_a_commented_gold(toy, sandbox):
    # C and E tie at 40 behind F 50: with LIMIT 2 either may stand second
    gold = "SELECT name -- who\nFROM t ORDER BY age DESC LIMIT 2"
    preds = [
        "SELECT 'F' UNION ALL SELECT 'C'",
        "SELECT 'F' UNION ALL SELECT 'E'",
        "SELECT 'F' UNION ALL SELECT 'A'",
    ]
    assert _score(sandbox, toy, gold, preds) == [MATCH, MATCH, MISMATCH]


@needs_spider
def test_tie_with_a_commented_gold_on_spider(sandbox):
    # head: K. J. Choi and Billy Mayfair are both 69, the oldest
    db = str(SPIDER / "department_management" / "department_management.sqlite")
    gold = "SELECT name -- the oldest head\nFROM head ORDER BY age DESC LIMIT 1"
    preds = ["SELECT 'K. J. Choi'", "SELECT 'Billy Mayfair'", "SELECT 'Sergio García'"]
    assert _score(sandbox, db, gold, preds) == [MATCH, MATCH, MISMATCH]


# --------------------------------------------------------------------------- caps: gold vs prediction


def _exact_size(columns: list, rows: list) -> int:
    """The smallest byte cap under which the sandbox returns a result whole: the marshalled names plus
    each marshalled row (near the cap the sandbox measures row by row)."""
    return len(marshal.dumps(columns)) + sum(len(marshal.dumps(r)) for r in rows)


@pytest.mark.parametrize("slack,want", [(0, MATCH), (1, MATCH), (-1, ("gold_unscorable", None))])
def test_gold_over_the_sandbox_byte_cap_is_unscorable(toy, slack, want):
    # the gold cache keeps results up to 8 MiB; a sandbox capped lower must not score a gold it could
    # never return whole as a mismatch (an identical prediction was exec_error / too_large, 0)
    gold = "SELECT name, age FROM t"
    size = _exact_size(["name", "age"], ROWS)
    with Sandbox(workers=1, max_result_bytes=size + slack) as sb, GoldCache(workers=1) as gc:
        got = Evaluator(sb, gc).score_many([(gold, gold_task(toy, gold))])[0]
    assert (got.status, got.value) == want
    if got.status == "gold_unscorable":
        assert got.parts["reason"] == "gold_too_large"


@needs_spider
def test_spider_gold_over_a_lower_byte_cap(sandbox):
    # takes: 30,000 rows, about 0.9 MB marshalled; a prediction sandbox capped at 200 KB
    db = str(SPIDER / "college_2" / "college_2.sqlite")
    gold = "SELECT * FROM takes"
    with Sandbox(workers=1, max_result_bytes=200_000) as sb, GoldCache(workers=1) as gc:
        got = Evaluator(sb, gc).score(gold, gold_task(db, gold))
    assert (got.status, got.value, got.parts["reason"]) == ("gold_unscorable", None, "gold_too_large")


@pytest.mark.parametrize(
    "columns,rows,max_rows,max_bytes,want",
    [
        (["a"], [(1,), (2,)], 2, 10**6, "ok"),
        (["a"], [(1,), (2,)], 1, 10**6, "too_many_rows"),
        # names 8 bytes (list header 5, "a" 3), each row 7 (tuple header 2, int 5): 22 fits, 21 does not
        (["a"], [(1,), (2,)], 2, 22, "ok"),
        (["a"], [(1,), (2,)], 2, 21, "too_large"),
        (["x" * 100], [], 0, 50, "too_large"),  # the names alone
        ([], [], 0, 10, "ok"),
    ],
)
def test_fits_caps(columns, rows, max_rows, max_bytes, want):
    assert fits_caps(columns, rows, max_rows, max_bytes) == want


# --------------------------------------------------------------------------- ties on a key not in the output

# ORDER BY a key that is not an output column, no LIMIT: rows tied on the key may come in any order
# (toy, by age DESC: F 50 | C 40, E 40 | A 30, B 30 | D 25), and nothing else is relaxed.
UNSEEN_KEY_CASES = [
    ("SELECT name FROM t ORDER BY age DESC", "SELECT name FROM t ORDER BY age DESC, name DESC", MATCH),
    ("SELECT name FROM t ORDER BY age DESC", "SELECT name FROM t ORDER BY age DESC, name ASC", MATCH),
    ("SELECT name FROM t ORDER BY age DESC", "VALUES ('F'), ('E'), ('C'), ('B'), ('A'), ('D')", MATCH),
    ("SELECT name FROM t ORDER BY age DESC", "VALUES ('F'), ('E'), ('A'), ('C'), ('B'), ('D')", MISMATCH),
    ("SELECT name FROM t ORDER BY age DESC", "SELECT name FROM t ORDER BY age ASC", MISMATCH),
    ("SELECT name FROM t ORDER BY age DESC", "SELECT name FROM t ORDER BY name", MISMATCH),
    ("SELECT name FROM t ORDER BY age DESC", "SELECT name FROM t", MISMATCH),  # insertion order A..F
    ("SELECT name FROM t ORDER BY age DESC", "VALUES ('F'), ('E'), ('C'), ('B'), ('A')", MISMATCH),
    ("SELECT name FROM t ORDER BY age DESC", "VALUES ('F'), ('E'), ('C'), ('B'), ('A'), ('A')", MISMATCH),
    # two keys, the second breaking no tie here: (age DESC, name) is already a total order
    (
        "SELECT name FROM t ORDER BY age DESC, name",
        "SELECT name FROM t ORDER BY age DESC, name DESC",
        MISMATCH,
    ),
    # the same gold with a trailing semicolon and a line comment
    (
        "SELECT name -- who\nFROM t ORDER BY age DESC;",
        "SELECT name FROM t ORDER BY age DESC, name DESC",
        MATCH,
    ),
]


@pytest.mark.parametrize("gold,pred,want", UNSEEN_KEY_CASES)
def test_ties_on_a_key_not_in_the_output(toy, sandbox, gold, pred, want):
    assert _score(sandbox, toy, gold, [pred])[0] == want


@needs_spider
def test_ties_on_a_key_not_in_the_output_on_spider(sandbox):
    # head, by age DESC: K. J. Choi and Billy Mayfair both 69; Tiger Woods and Franklin Langham both 67
    db = str(SPIDER / "department_management" / "department_management.sqlite")
    gold = "SELECT name FROM head ORDER BY age DESC"
    preds = [
        "SELECT name FROM head ORDER BY age DESC, name ASC",
        "SELECT name FROM head ORDER BY age DESC, name DESC",
        "SELECT name FROM head ORDER BY age ASC",
        "SELECT name FROM head ORDER BY age DESC, name LIMIT 9",
    ]
    assert _score(sandbox, db, gold, preds) == [MATCH, MATCH, MISMATCH, MISMATCH]


# --------------------------------------------------------------------------- cases that held on main

EXEC_ERROR, UNSCORABLE = ("exec_error", 0.0), ("gold_unscorable", None)
# department_management.head, by age: 69 K. J. Choi, Billy Mayfair | 68 Sergio García | 67 Tiger Woods,
# Franklin Langham | 56 | 53 | 52 | 50 | 43; born_state: 4 California, 2 Alabama, 2 Connecticut, ...
HELD = [
    # ORDER BY: direction, subqueries, compound, ORDER BY <n>, LIMIT/OFFSET, ties at the cut
    ("SELECT name FROM head ORDER BY age DESC", "SELECT name FROM head ORDER BY age ASC", MISMATCH),
    ("SELECT name FROM (SELECT name FROM head ORDER BY age)", "SELECT name FROM head ORDER BY name", MATCH),
    (
        "SELECT name FROM head WHERE age > 60 UNION SELECT name FROM head WHERE age < 45 ORDER BY name",
        "SELECT name FROM head WHERE age > 60 UNION SELECT name FROM head WHERE age < 45 ORDER BY name DESC",
        MISMATCH,
    ),
    (
        "SELECT name FROM head WHERE age > 60 UNION SELECT name FROM head WHERE age < 45 ORDER BY name",
        "SELECT name FROM head WHERE age > 60 OR age < 45 ORDER BY name",
        MATCH,
    ),
    (
        "SELECT name, age FROM head ORDER BY 2 DESC LIMIT 3",
        "SELECT name, age FROM head ORDER BY age DESC, name LIMIT 3",
        MATCH,
    ),
    ("SELECT name, age FROM head ORDER BY 2 DESC LIMIT 1", "SELECT 'Sergio García', 68.0", MISMATCH),
    ("SELECT name, age FROM head ORDER BY 2 DESC LIMIT 1", "SELECT 'Billy Mayfair', 69", MATCH),
    (
        "SELECT name FROM head ORDER BY age DESC LIMIT 1",
        "SELECT name FROM head ORDER BY age DESC LIMIT 1 OFFSET 2",
        MISMATCH,
    ),
    (
        "SELECT name FROM head ORDER BY age DESC LIMIT 2",
        "SELECT name FROM head ORDER BY age DESC LIMIT 1, 2",
        MISMATCH,
    ),
    ("SELECT name FROM head ORDER BY age DESC LIMIT 2", "SELECT name FROM head WHERE age = 69", MATCH),
    (
        "SELECT name FROM head ORDER BY age DESC LIMIT 1",
        "SELECT name FROM head ORDER BY age DESC LIMIT 0",
        MISMATCH,
    ),
    (
        "SELECT name FROM head ORDER BY age DESC LIMIT 1",
        "SELECT name FROM head ORDER BY age DESC LIMIT 1 OFFSET 100",
        MISMATCH,
    ),
    (
        "SELECT name FROM head ORDER BY name COLLATE NOCASE",
        "SELECT name FROM head ORDER BY name DESC",
        MISMATCH,
    ),
    (
        "SELECT name FROM head ORDER BY name COLLATE NOCASE",
        "SELECT name FROM head ORDER BY lower(name)",
        MATCH,
    ),
    # multisets, DISTINCT, columns
    ("SELECT born_state FROM head", "SELECT DISTINCT born_state FROM head", MISMATCH),
    ("SELECT DISTINCT born_state FROM head", "SELECT born_state FROM head", MISMATCH),
    (
        "SELECT born_state, count(*) FROM head GROUP BY born_state",
        "SELECT DISTINCT born_state, 1 FROM head",
        MISMATCH,
    ),
    (
        "SELECT name FROM head WHERE age = 67",
        "SELECT name FROM head WHERE age = 67 UNION ALL SELECT name FROM head WHERE age = 67",
        MISMATCH,
    ),
    ("SELECT name, age FROM head", "SELECT name FROM head", MISMATCH),
    ("SELECT name, age FROM head", "SELECT age, name FROM head", MATCH),
    # NULL, '', 0, types
    ("SELECT count(*) FROM head WHERE age > 100", "SELECT NULL", MISMATCH),
    ("SELECT max(age) FROM head WHERE age > 100", "SELECT name FROM head WHERE age > 100", MISMATCH),
    ("SELECT max(age) FROM head WHERE age > 100", "SELECT NULL", MATCH),
    ("SELECT max(age) FROM head WHERE age > 100", "SELECT ''", MISMATCH),
    ("SELECT max(age) FROM head WHERE age > 100", "SELECT 0", MISMATCH),
    ("SELECT count(*) FROM head", "SELECT '10'", MISMATCH),
    ("SELECT count(*) FROM head", "SELECT 10.0", MATCH),
    ("SELECT count(*) FROM head", "SELECT count(*) + 1 FROM head", MISMATCH),
    ("SELECT 1 / 0", "SELECT 0", MISMATCH),
    ("SELECT 1 / 0", "SELECT NULL", MATCH),
    ("SELECT x'00'", "SELECT 0", MISMATCH),
    ("SELECT x'41'", "SELECT 'A'", MISMATCH),
    ("SELECT -0.0", "SELECT 0", MATCH),
    # numbers: integers exact, tolerance for non-integral floats only (rel 1e-12, abs 1e-9)
    ("SELECT 9007199254740993", "SELECT 9007199254740992.0", MISMATCH),
    ("SELECT 9223372036854775807", "SELECT 9223372036854775806", MISMATCH),
    ("SELECT 1e308 * 10", "SELECT 9e999", MATCH),  # both +inf
    ("SELECT 1e308 * 10", "SELECT 'inf'", MISMATCH),
    ("SELECT -1e308 * 10", "SELECT 1e308 * 10", MISMATCH),
    ("SELECT 0.1", "SELECT 0.1000002", MISMATCH),
    ("SELECT 0.1", "SELECT 0.1000000000001", MATCH),
    ("SELECT 1e-12", "SELECT 0", MATCH),  # |1e-12 - 0| < abs_tol 1e-9
    ("SELECT 0.5", "SELECT 1", MISMATCH),
    ("SELECT 2.5", "SELECT 2", MISMATCH),
    ("SELECT avg(age) FROM head", "SELECT avg(age) + 0.0001 FROM head", MISMATCH),
    ("SELECT avg(age) FROM head", "SELECT sum(age) / 10.0 FROM head", MATCH),
    # text: exact (case, trailing space, Unicode normalisation)
    (
        "SELECT name FROM head WHERE name = 'Tiger Woods'",
        "SELECT upper(name) FROM head WHERE name = 'Tiger Woods'",
        MISMATCH,
    ),
    (
        "SELECT name FROM head WHERE name = 'Tiger Woods'",
        "SELECT name || ' ' FROM head WHERE name = 'Tiger Woods'",
        MISMATCH,
    ),
    ("SELECT '\u00e9'", "SELECT 'e\u0301'", MISMATCH),
    # gold failures are excluded, never a mismatch
    ("SELECT name FROM nosuch", "SELECT name FROM head", UNSCORABLE),
    ("SELECT name FROM head WHERE 0", "SELECT name FROM head", UNSCORABLE),
    ("SELECT name FROM head ORDER BY age LIMIT 0", "SELECT name FROM head", UNSCORABLE),
    # statements, comments, side effects, denied features, odd text
    ("SELECT name FROM head", "SELECT name FROM head; DROP TABLE head", EXEC_ERROR),
    ("SELECT name FROM head", "SELECT name FROM head; -- ; SELECT 1", MATCH),
    ("SELECT name FROM head", "SELECT name FROM head /* ; SELECT 1 */ ;", MATCH),
    ("SELECT name FROM head", "PRAGMA reverse_unordered_selects = 1", EXEC_ERROR),
    ("SELECT name FROM head", "CREATE TEMP VIEW v AS SELECT name FROM head", EXEC_ERROR),
    ("SELECT name FROM head", "ATTACH ':memory:' AS m", EXEC_ERROR),
    ("SELECT name FROM head", "SELECT value FROM json_each('[1]')", EXEC_ERROR),
    ("SELECT name FROM head", "SELECT load_extension('x')", EXEC_ERROR),
    ("SELECT name FROM head", "WITH x AS (SELECT 1) DELETE FROM head", EXEC_ERROR),
    ("SELECT name FROM head", "SELECT name FROM head WHERE name = '\ud800'", EXEC_ERROR),
    ("SELECT name FROM head", "SELECT name FROM head\x00", EXEC_ERROR),
    ("SELECT name FROM head", "\ufeffSELECT name FROM head", MATCH),
]


@needs_spider
@pytest.mark.parametrize("gold,pred,want", HELD)
def test_held_on_spider(sandbox, gold, pred, want):
    db = str(SPIDER / "department_management" / "department_management.sqlite")
    assert _score(sandbox, db, gold, [pred])[0] == want


# --------------------------------------------------------------------------- a gold Python cannot encode


@pytest.mark.parametrize("cache_dir", [False, True])
def test_gold_with_a_lone_surrogate_is_a_gold_error(toy, sandbox, tmp_path, cache_dir):
    # the gold cache's key hashed the SQL as strict UTF-8 and raised: infra_error for every prediction;
    # the gold is a bad gold (SQLite cannot run it), excluded as gold_error
    gold = "SELECT name FROM t WHERE name = '\ud800'"
    with GoldCache(tmp_path / "gc" if cache_dir else None, executor=sandbox) as gc:
        got = Evaluator(sandbox, gc).score_many([("SELECT name FROM t", gold_task(toy, gold))])[0]
    assert (got.status, got.value, got.parts.get("reason")) == ("gold_unscorable", None, "gold_error")
