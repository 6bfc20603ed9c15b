"""The LIMIT/OFFSET cut: only rows of the gold's full ordered result that tie with the cut may stand in.

Databases are real SQLite files; the expected verdicts are worked out by hand from their rows."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from conftest import gold_task
from sqlrl.reward import cut as cut_module
from sqlrl.reward.cut import Cut, CutQuery, build_cut, cut_query, fetch_cuts
from sqlrl.reward.evaluator import Evaluator
from sqlrl.sql.sandbox import Sandbox
from sqlrl.tasks.goldcache import GoldCache

SPIDER = Path(__file__).resolve().parents[3] / "shared" / "data" / "spider" / "database"

# full order by age: D 25 | A 30, B 30 | C 40, E 40, G 40 | F 50
ROWS = [("A", 30, "X"), ("B", 30, "Y"), ("C", 40, "Z"), ("D", 25, "W"), ("E", 40, "V"), ("F", 50, "U")]
ROWS.append(("G", 40, "T"))


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("cut") / "toy" / "toy.sqlite"
    path.parent.mkdir()
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (name TEXT, age INTEGER, city TEXT)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", ROWS)
    con.commit()
    con.close()
    return str(path)


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(workers=1) as sb:
        yield sb


def _score(sandbox, db: str, gold_sql: str, preds: list[str], in_workers: bool = True) -> list:
    class ParentSide:  # no execute_scored: the parent-side scoring path
        def __init__(self, sb):
            self.sb = sb

        def execute(self, db_path, sql, timeout_s=None):
            return self.sb.execute(db_path, sql, timeout_s)

    with GoldCache(executor=sandbox) as gc:
        ev = Evaluator(sandbox if in_workers else ParentSide(sandbox), gc)
        return [(r.status, r.value) for r in ev.score_many([(p, gold_task(db, gold_sql)) for p in preds])]


MATCH, MISMATCH = ("match", 1.0), ("mismatch", 0.0)

CASES = [
    # (gold, prediction, verdict)
    # LIMIT 2 cuts the 40s (C, E, G): F, then any one of them
    ("SELECT name, age FROM t ORDER BY age DESC LIMIT 2", "SELECT 'F', 50 UNION ALL SELECT 'G', 40", MATCH),
    (
        "SELECT name, age FROM t ORDER BY age DESC LIMIT 2",
        "SELECT 'F', 50 UNION ALL SELECT 'Q', 40",
        MISMATCH,
    ),
    (
        "SELECT name, age FROM t ORDER BY age DESC LIMIT 2",
        "SELECT 'F', 50 UNION ALL SELECT 'A', 40",
        MISMATCH,
    ),
    (
        "SELECT name, age FROM t ORDER BY age DESC LIMIT 2",
        "SELECT 'C', 40 UNION ALL SELECT 'F', 50",
        MISMATCH,
    ),
    (
        "SELECT name, age FROM t ORDER BY age DESC LIMIT 2",
        "SELECT 'E', 40 UNION ALL SELECT 'G', 40",
        MISMATCH,
    ),
    # F has no tie: only F itself
    ("SELECT name, age FROM t ORDER BY age DESC LIMIT 1", "SELECT 'F', 50", MATCH),
    ("SELECT name, age FROM t ORDER BY age DESC LIMIT 1", "SELECT 'G', 50", MISMATCH),
    # a tied real row may stand in once, not twice
    (
        "SELECT name, age FROM t WHERE age >= 40 ORDER BY age LIMIT 2",
        "SELECT 'G', 40 UNION ALL SELECT 'E', 40",
        MATCH,
    ),
    (
        "SELECT name, age FROM t WHERE age >= 40 ORDER BY age LIMIT 2",
        "SELECT 'C', 40 UNION ALL SELECT 'C', 40",
        MISMATCH,
    ),
    # OFFSET 1 starts inside the 30s (A, B): either one
    ("SELECT name, age FROM t ORDER BY age LIMIT 1 OFFSET 1", "SELECT 'B', 30", MATCH),
    ("SELECT name, age FROM t ORDER BY age LIMIT 1 OFFSET 1", "SELECT 'Z', 30", MISMATCH),
    ("SELECT name, age FROM t ORDER BY age LIMIT 1 OFFSET 1", "SELECT 'D', 25", MISMATCH),
    # LIMIT 1, 2 = OFFSET 1 LIMIT 2: exactly A and B (no tie crosses either cut)
    ("SELECT name, age FROM t ORDER BY age LIMIT 1, 2", "SELECT 'B', 30 UNION ALL SELECT 'A', 30", MATCH),
    ("SELECT name, age FROM t ORDER BY age LIMIT 1, 2", "SELECT 'A', 30 UNION ALL SELECT 'Q', 30", MISMATCH),
    # the sort key is not an output column: decided from the full result too
    ("SELECT name FROM t ORDER BY age DESC LIMIT 2", "SELECT 'F' UNION ALL SELECT 'E'", MATCH),
    ("SELECT name FROM t ORDER BY age DESC LIMIT 2", "SELECT 'F' UNION ALL SELECT 'A'", MISMATCH),
    ("SELECT name FROM t ORDER BY age DESC LIMIT 2", "SELECT 'E' UNION ALL SELECT 'F'", MISMATCH),
    ("SELECT city FROM t GROUP BY city ORDER BY count(*) DESC LIMIT 1", "SELECT 'V'", MATCH),
    ("SELECT city FROM t GROUP BY city ORDER BY count(*) DESC LIMIT 1", "SELECT 'Atlantis'", MISMATCH),
    # the other columns of a tied row must be that row's
    (
        "SELECT name, age, city FROM t ORDER BY age LIMIT 2",
        "SELECT 'D', 25, 'W' UNION ALL SELECT 'B', 30, 'Y'",
        MATCH,
    ),
    (
        "SELECT name, age, city FROM t ORDER BY age LIMIT 2",
        "SELECT 'D', 25, 'W' UNION ALL SELECT 'B', 30, 'X'",
        MISMATCH,
    ),
    # column order is free, as everywhere
    ("SELECT name, age FROM t ORDER BY age DESC LIMIT 2", "SELECT 50, 'F' UNION ALL SELECT 40, 'E'", MATCH),
]


@pytest.mark.parametrize("in_workers", [True, False], ids=["workers", "parent"])
def test_cut_verdicts(toy, sandbox, in_workers):
    got = [_score(sandbox, toy, g, [p], in_workers)[0] for g, p, _ in CASES]
    want = [v for _, _, v in CASES]
    bad = [(g, p, w, x) for (g, p, _), w, x in zip(CASES, want, got) if w != x]
    assert not bad


def test_gold_always_matches_itself(toy, sandbox):
    golds = list(dict.fromkeys(g for g, _, _ in CASES))
    assert _score(sandbox, toy, golds[0], [golds[0]]) == [MATCH]
    for g in golds:
        assert _score(sandbox, toy, g, [g]) == [MATCH], g


def test_full_result_failure_is_infrastructure(toy, sandbox):
    class Failing(GoldCache):
        def get_many(self, items, **kw):
            if any(
                sql.endswith(f"LIMIT {1 + cut_module.CUT_TIE_ROWS}") for _, sql in items
            ):  # the full result
                raise OSError("disk gone")
            return super().get_many(items, **kw)

    with Failing(executor=sandbox) as gc:
        r = Evaluator(sandbox, gc).score(
            "SELECT 'F', 50", gold_task(toy, "SELECT name, age FROM t ORDER BY age DESC LIMIT 1")
        )
    assert (r.status, r.value) == ("infra_error", None)
    assert "full ordered result" in r.parts["error"]


needs_spider = pytest.mark.skipif(not (SPIDER / "store_1").is_dir(), reason="no shared Spider data")


@needs_spider
def test_issue_examples_on_spider(sandbox):
    store = str(SPIDER / "store_1" / "store_1.sqlite")
    gold = (
        'SELECT billing_state, COUNT(*) FROM invoices WHERE billing_country = "USA" '
        "GROUP BY billing_state ORDER BY COUNT(*) DESC LIMIT 1;"
    )
    city = gold.replace("SELECT billing_state", "SELECT billing_city").rstrip(";")
    assert _score(sandbox, store, gold, [city, gold]) == [MISMATCH, MATCH]
    bike = str(SPIDER / "bike_1" / "bike_1.sqlite")
    gold = "SELECT name, lat, city FROM station ORDER BY lat LIMIT 1"
    fake = "SELECT 'no such station', min(lat), 'Atlantis' FROM station"
    assert _score(sandbox, bike, gold, [fake, gold]) == [MISMATCH, MATCH]


@pytest.mark.parametrize(
    "gold,want",
    [
        # LIMIT offset + n + 10,000 (CUT_TIE_ROWS): 0 + 3 + 10,000; LIMIT 1, 2 is OFFSET 1 LIMIT 2
        (
            "SELECT a, b FROM t ORDER BY b LIMIT 3",
            CutQuery("SELECT a, b FROM t ORDER BY b LIMIT 10003", 0, 0, 10003),
        ),
        (
            "SELECT a, b FROM t ORDER BY b LIMIT 1, 2;",
            CutQuery("SELECT a, b FROM t ORDER BY b LIMIT 10003", 1, 0, 10003),
        ),
        (
            "SELECT a FROM t WHERE x IN (SELECT y FROM u ORDER BY z LIMIT 3) ORDER BY b DESC NULLS LAST, "
            "c COLLATE NOCASE ASC LIMIT 1 OFFSET 2",
            CutQuery(
                "SELECT a, b AS sqlrl_cut_key_0, c COLLATE NOCASE AS sqlrl_cut_key_1 FROM t WHERE x IN "
                "(SELECT y FROM u ORDER BY z LIMIT 3) ORDER BY b DESC NULLS LAST, c COLLATE NOCASE ASC LIMIT 10003",
                2,
                2,
                10003,
            ),
        ),
        (
            "SELECT a FROM t ORDER BY count(*) DESC LIMIT 1",
            CutQuery(
                "SELECT a, count(*) AS sqlrl_cut_key_0 FROM t ORDER BY count(*) DESC LIMIT 10001", 0, 1, 10001
            ),
        ),
        # no LIMIT/OFFSET, the key not an output column: the whole gold with its key, for the ties
        ("SELECT a FROM t ORDER BY b", CutQuery("SELECT a, b AS sqlrl_cut_key_0 FROM t ORDER BY b", 0, 1)),
        ("SELECT a, b FROM t ORDER BY b", None),  # no LIMIT/OFFSET, the key an output column
        # no ORDER BY: the whole result, any rows of which may stand in (rule 4d)
        ("SELECT a FROM t LIMIT 3", CutQuery("SELECT a FROM t", 0, 0, None, True)),
        ("SELECT DISTINCT a FROM t ORDER BY b LIMIT 1", None),  # a hidden key would change DISTINCT
        (
            "SELECT a FROM t UNION SELECT a FROM u ORDER BY 1 LIMIT 1",
            CutQuery("SELECT a FROM t UNION SELECT a FROM u ORDER BY 1 LIMIT 10001", 0, 0, 10001),
        ),
        # a LIMIT that is not a literal: no LIMIT on the full query (bounded by the caps only)
        ("SELECT a, b FROM t ORDER BY b LIMIT 1 + 1", CutQuery("SELECT a, b FROM t ORDER BY b", 0, 0)),
        ("SELECT a FROM t ORDER BY b LIMIT 1 OFFSET (SELECT 1)", None),  # non-literal offset
    ],
)
def test_cut_query(gold, want):
    assert cut_query(gold) == want


def test_build_cut_pools_and_refusals():
    q = CutQuery("", 1, 0)
    full = [(1, "a"), (2, "b"), (2, "c"), (3, "d"), (4, "e"), (4, "f"), (4, "g")]
    # window rows 1..4: (2,b) (2,c) | (3,d) | (4,e): nothing above the window ties with the first run;
    # the last run ties with (4,f) and (4,g) below it
    cut = build_cut([(2, "b"), (2, "c"), (3, "d"), (4, "e")], full, 2, q, (0,))
    assert cut == Cut((2, 1, 1), ((2, ((4, "e"), (4, "f"), (4, "g"))),))
    # offset 2 starts inside the 2s: the first run's pool holds (2,b) too
    cut = build_cut([(2, "c"), (3, "d")], full, 2, CutQuery("", 2, 0), (0,))
    assert cut == Cut((1, 1), ((0, ((2, "b"), (2, "c"))),))
    # a gold row the full result does not hold at that place: no cut
    assert build_cut([(2, "c"), (3, "x")], full, 2, CutQuery("", 2, 0), (0,)) is None
    assert build_cut([(9, "z")], full, 2, CutQuery("", 7, 0), (0,)) is None  # window past the end


@pytest.fixture(scope="module")
def long_db(tmp_path_factory) -> str:
    """t(k, v): k = 1, 2, then 3 four times, then 4 .. 299 (302 rows); u(k): 1, 2, then 3 twelve times,
    then 4 .. 99."""
    path = tmp_path_factory.mktemp("cutlong") / "long" / "long.sqlite"
    path.parent.mkdir()
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (k INTEGER, v TEXT)")
    con.executemany(
        "INSERT INTO t VALUES (?, ?)",
        [(k, f"v{i}") for i, k in enumerate([1, 2, 3, 3, 3, 3, *range(4, 300)])],
    )
    con.execute("CREATE TABLE u (k INTEGER, v TEXT)")
    con.executemany(
        "INSERT INTO u VALUES (?, ?)",
        [(k, f"u{i}") for i, k in enumerate([1, 2] + [3] * 12 + list(range(4, 100)))],
    )
    con.commit()
    con.close()
    return str(path)


def _cuts(sandbox, db: str, gold_sql: str, max_rows: int) -> tuple:
    """(the Cut fetch_cuts gives for the gold, rows of the full-result fetch) under the cache's row cap."""
    with GoldCache(executor=sandbox, max_rows=max_rows) as gc:
        gold = gc.get(db, gold_sql)
        fetched = []

        def fetch(items):
            fetched.extend(gc.get_many(items))
            return fetched[-len(items) :]

        cut = fetch_cuts({(db, gold_sql): gold}, fetch)[(db, gold_sql)]
        return cut, [f.row_count for f in fetched]


def test_full_result_fetch_stops_past_the_window(long_db, sandbox, monkeypatch):
    monkeypatch.setattr(cut_module, "CUT_TIE_ROWS", 5, raising=False)
    # 302 rows, over the cache's 50-row cap: the fetch reads offset 0 + LIMIT 3 + 5 = 8 rows
    # (1, 2, 3, 3, 3, 3, 4, 5); the last window row (3, v2) ties with (3, v3), (3, v4), (3, v5)
    gold = "SELECT k, v FROM t ORDER BY k LIMIT 3"
    cut, fetched = _cuts(sandbox, long_db, gold, max_rows=50)
    assert fetched == [8]
    assert cut == Cut((1, 1, 1), ((2, ((3, "v2"), (3, "v3"), (3, "v4"), (3, "v5"))),))
    # u: the 8 rows fetched are 1, 2 and six of the twelve 3s: the last run's pool would be incomplete
    cut, fetched = _cuts(sandbox, long_db, "SELECT k, v FROM u ORDER BY k LIMIT 3", max_rows=50)
    assert (cut, fetched) == (None, [8])


def test_build_cut_refuses_a_fetch_cut_inside_the_last_ties():
    full = [(1, "a"), (2, "b"), (2, "c")]  # all 3 rows the LIMIT 3 allowed: more 2s may follow
    assert build_cut([(1, "a"), (2, "b")], full, 2, CutQuery("", 0, 0, 3), (0,)) is None
    # the same rows when the fetch was not cut (no LIMIT, or fewer rows than it): the pool is whole
    want = Cut((1, 1), ((1, ((2, "b"), (2, "c"))),))
    assert build_cut([(1, "a"), (2, "b")], full, 2, CutQuery("", 0, 0), (0,)) == want
    assert build_cut([(1, "a"), (2, "b")], full, 2, CutQuery("", 0, 0, 4), (0,)) == want
