"""Tests for sqlrl.reward (match, shape, evaluator): table-driven execution-match rules, Evaluator status mapping, CLI."""

from __future__ import annotations

import importlib.util
import json
import random
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest

from sqlrl.reward.evaluator import Evaluator
from sqlrl.reward.match import Reward, execution_match, test_suite_result_eq, validity_reward
from sqlrl.reward.shape import GoldShape, gold_shape, remove_distinct

HAVE_SANDBOX = importlib.util.find_spec("sqlrl.sql.sandbox") is not None

# ------------------------------------------------------------------------------- execution_match
# (name, gold_sql, gold_rows, pred_rows, expected). Columns are taken from the rows' width.
# Expectations derived by hand from the rules in execution_match's docstring.
NAB = [("A", 30), ("B", 30), ("C", 40)]
CASES = [
    # --- multiset vs order
    ("unordered_swapped", "SELECT a FROM t", [(1,), (2,)], [(2,), (1,)], True),
    ("ordered_swapped", "SELECT a FROM t ORDER BY a", [(1,), (2,)], [(2,), (1,)], False),
    ("ordered_same", "SELECT a FROM t ORDER BY a", [(1,), (2,)], [(1,), (2,)], True),
    ("order_by_desc_swapped", "SELECT a FROM t ORDER BY a DESC", [(2,), (1,)], [(1,), (2,)], False),
    (
        "order_in_subquery_ignored",
        "SELECT a FROM (SELECT a FROM t ORDER BY a)",
        [(1,), (2,)],
        [(2,), (1,)],
        True,
    ),
    (
        "order_in_cte_ignored",
        "WITH c AS (SELECT a FROM t ORDER BY a LIMIT 3) SELECT a FROM c",
        [(1,), (2,)],
        [(2,), (1,)],
        True,
    ),
    (
        "order_in_IN_ignored",
        "SELECT a FROM t WHERE a IN (SELECT b FROM u ORDER BY b LIMIT 2)",
        [(1,), (2,)],
        [(2,), (1,)],
        True,
    ),
    (
        "union_order_counts",
        "SELECT a FROM t UNION SELECT b FROM u ORDER BY a",
        [(1,), (2,)],
        [(2,), (1,)],
        False,
    ),
    ("union_no_order", "SELECT a FROM t UNION SELECT b FROM u", [(1,), (2,)], [(2,), (1,)], True),
    ("limit_without_order_multiset", "SELECT a FROM t LIMIT 2", [(1,), (2,)], [(2,), (1,)], True),
    # --- ties (ORDER BY key is an output column)
    ("ties_any_order", "SELECT name, age FROM t ORDER BY age", NAB, [("B", 30), ("A", 30), ("C", 40)], True),
    (
        "ties_cross_group",
        "SELECT name, age FROM t ORDER BY age",
        NAB,
        [("C", 40), ("A", 30), ("B", 30)],
        False,
    ),
    ("ties_wrong_row", "SELECT name, age FROM t ORDER BY age", NAB, [("A", 30), ("D", 30), ("C", 40)], False),
    (
        "limit_tie_at_cut_other_tied_row",
        "SELECT name, age FROM t ORDER BY age DESC LIMIT 2",
        [("C", 40), ("A", 30)],
        [("C", 40), ("B", 30)],
        False,  # no cut: a tie at the LIMIT/OFFSET cut is not relaxed (tests/reward/test_cut.py)
    ),
    (
        "limit_tie_at_cut_wrong_key",
        "SELECT name, age FROM t ORDER BY age DESC LIMIT 2",
        [("C", 40), ("A", 30)],
        [("C", 40), ("B", 25)],
        False,
    ),
    (
        "limit_tie_non_boundary_run_strict",
        "SELECT name, age FROM t ORDER BY age DESC LIMIT 2",
        [("C", 40), ("A", 30)],
        [("D", 40), ("A", 30)],
        False,
    ),
    (
        "limit_not_reached_no_relax",
        "SELECT name, age FROM t ORDER BY age DESC LIMIT 5",
        [("C", 40), ("A", 30)],
        [("C", 40), ("B", 30)],
        False,
    ),
    (
        "limit_tie_order_still_checked",
        "SELECT name, age FROM t ORDER BY age DESC LIMIT 2",
        [("C", 40), ("A", 30)],
        [("B", 30), ("C", 40)],
        False,
    ),
    (
        "offset_first_and_last_runs_boundary",
        "SELECT name, age FROM t ORDER BY age LIMIT 3 OFFSET 1",
        [("B", 30), ("C", 35), ("D", 40)],
        [("X", 30), ("C", 35), ("Y", 40)],
        False,  # no cut: a tie at the LIMIT/OFFSET cut is not relaxed (tests/reward/test_cut.py)
    ),
    (
        "offset_middle_run_strict",
        "SELECT name, age FROM t ORDER BY age LIMIT 3 OFFSET 1",
        [("B", 30), ("C", 35), ("D", 40)],
        [("X", 30), ("Z", 35), ("Y", 40)],
        False,
    ),
    (
        "order_by_position_tie",
        "SELECT name, age FROM t ORDER BY 2 DESC LIMIT 1",
        [("A", 40)],
        [("B", 40)],
        False,  # no cut: a tie at the LIMIT/OFFSET cut is not relaxed (tests/reward/test_cut.py)
    ),
    (
        "order_by_alias_tie",
        "SELECT name, count(*) AS c FROM t GROUP BY name ORDER BY c DESC LIMIT 1",
        [("A", 3)],
        [("B", 3)],
        False,  # no cut: a tie at the LIMIT/OFFSET cut is not relaxed (tests/reward/test_cut.py)
    ),
    (
        "order_by_alias_wrong_count",
        "SELECT name, count(*) AS c FROM t GROUP BY name ORDER BY c DESC LIMIT 1",
        [("A", 3)],
        [("B", 2)],
        False,
    ),
    (
        "order_by_same_expr_tie_permuted_cols",
        "SELECT name, count(*) FROM t GROUP BY name ORDER BY count(*) DESC LIMIT 1",
        [("A", 3)],
        [(3, "B")],
        False,  # no cut: a tie at the LIMIT/OFFSET cut is not relaxed (tests/reward/test_cut.py)
    ),
    (
        "order_by_hidden_key_strict",
        "SELECT name FROM t GROUP BY name ORDER BY count(*) DESC LIMIT 1",
        [("A",)],
        [("B",)],
        False,
    ),
    (
        "order_by_hidden_key_same",
        "SELECT name FROM t GROUP BY name ORDER BY count(*) DESC LIMIT 1",
        [("A",)],
        [("A",)],
        True,
    ),
    # --- column permutation
    ("perm_cols", "SELECT a, b FROM t", [(1, "x"), (2, "y")], [("x", 1), ("y", 2)], True),
    ("perm_cols_ordered", "SELECT a, b FROM t ORDER BY a", [(1, "x"), (2, "y")], [("x", 1), ("y", 2)], True),
    (
        "perm_cols_ordered_wrong",
        "SELECT a, b FROM t ORDER BY a",
        [(1, "x"), (2, "y")],
        [("y", 2), ("x", 1)],
        False,
    ),
    ("perm_same_colsets_rows_differ", "SELECT a, b FROM t", [(1, 2), (2, 1)], [(1, 1), (2, 2)], False),
    ("perm_ambiguous_groups", "SELECT a, b FROM t", [(1, 2), (2, 1), (1, 1)], [(2, 1), (1, 2), (1, 1)], True),
    (
        "perm_three_cols",
        "SELECT a, b, c FROM t",
        [(1, 1, 2), (1, 2, 1), (3, 3, 3)],
        [(2, 1, 1), (1, 1, 2), (3, 3, 3)],
        True,
    ),
    ("col_count_differs", "SELECT a, b FROM t", [(1, 2)], [(1,)], False),
    # --- multiset with duplicates, DISTINCT not stripped
    ("dup_rows_counted", "SELECT a FROM t", [(1,), (1,), (2,)], [(1,), (2,), (2,)], False),
    ("dup_rows_fewer", "SELECT a FROM t", [(1,), (1,), (2,)], [(1,), (2,)], False),
    ("dup_rows_same", "SELECT a FROM t", [(1,), (1,), (2,)], [(2,), (1,), (1,)], True),
    ("distinct_not_stripped", "SELECT DISTINCT a FROM t", [(1,)], [(1,), (1,)], False),
    # --- values: floats, ints, NULLs, types
    ("float_rel_inside", "SELECT x FROM t", [(1.0,)], [(1.0000000005,)], True),
    ("float_rel_rounded", "SELECT x FROM t", [(1.0,)], [(1.0000005,)], False),
    ("float_rel_outside", "SELECT x FROM t", [(1.0,)], [(1.0000015,)], False),
    ("float_big_inside", "SELECT x FROM t", [(1e12 + 0.5,)], [(1e12 + 0.75,)], True),
    ("float_big_nonintegral_outside", "SELECT x FROM t", [(1e12 + 0.5,)], [(1e12 + 1e5 + 0.5,)], False),
    ("float_big_integral_exact", "SELECT x FROM t", [(1e12,)], [(1e12 + 1e5,)], False),
    ("float_big_outside", "SELECT x FROM t", [(1e12,)], [(1e12 + 2e6,)], False),
    ("float_abs_inside", "SELECT x FROM t", [(0.0,)], [(5e-10,)], True),
    ("float_abs_outside", "SELECT x FROM t", [(0.0,)], [(2e-9,)], False),
    ("float_sum_repr", "SELECT x FROM t", [(0.3,)], [(0.1 + 0.2,)], True),
    ("int_vs_float_equal", "SELECT x FROM t", [(1,)], [(1.0,)], True),
    ("int_vs_float_close", "SELECT x FROM t", [(1,)], [(1.0000000001,)], True),
    ("int_vs_int_exact", "SELECT x FROM t", [(1000000,)], [(1000001,)], False),
    ("str_vs_int", "SELECT x FROM t", [("1",)], [(1,)], False),
    ("str_case", "SELECT x FROM t", [("a",)], [("A",)], False),
    ("bytes_vs_str", "SELECT x FROM t", [(b"a",)], [("a",)], False),
    (
        "float_multiset_with_text",
        "SELECT s, x FROM t",
        [("a", 1.0), ("b", 2.0)],
        [("b", 2.0000000001), ("a", 0.9999999995)],
        True,
    ),
    (
        "float_multiset_swapped_keys",
        "SELECT s, x FROM t",
        [("a", 1.0), ("b", 2.0)],
        [("a", 2.0), ("b", 1.0)],
        False,
    ),
    (
        "float_ordered_inside",
        "SELECT x FROM t ORDER BY x",
        [(1.0,), (2.0,)],
        [(1.0000000001,), (2.0000000001,)],
        True,
    ),
    ("null_equals_null", "SELECT a, b FROM t", [(None, 1)], [(None, 1)], True),
    ("null_vs_zero", "SELECT a FROM t", [(None,)], [(0,)], False),
    ("null_vs_empty_str", "SELECT a FROM t", [(None,)], [("",)], False),
    ("null_perm_cols", "SELECT a, b FROM t", [(None, 1), (2, None)], [(1, None), (None, 2)], True),
    ("empty_both", "SELECT a FROM t WHERE 0", [], [], True),
    ("empty_vs_row", "SELECT a FROM t WHERE 0", [], [(1,)], False),
]


@pytest.mark.parametrize("name,gold_sql,gold,pred,expected", CASES, ids=[c[0] for c in CASES])
def test_execution_match_table(name, gold_sql, gold, pred, expected):
    def cols(rows, default):
        return [f"c{i}" for i in range(len(rows[0]))] if rows else default

    gcols = cols(gold, ["a"])
    pcols = cols(pred, gcols)
    m = execution_match(gcols, gold, pcols, pred, gold_shape(gold_sql))
    assert m.match is expected, (name, m)
    # the rules are symmetric for plain multisets
    if not gold_shape(gold_sql).order_matters:
        assert execution_match(pcols, pred, gcols, gold, gold_shape(gold_sql)).match is expected


# (gold value, predicted value, match?): integers and integral floats compare exactly; the 1e-12
# relative tolerance (float rounding noise) applies only when one side is a non-integral float
VALUE_PAIRS = [
    (1000001, 1000000.0, False),  # off by one, the float is integral: no tolerance
    (1000000.0, 1000001, False),
    (1000001, 1000000, False),
    (3, 3.0, True),
    (3.0, 3, True),
    (2**53 + 1, float(2**53), False),  # the int is not representable; == is exact in Python
    (10**18, 10**18 + 1, False),
    (-1000001, -1000000.0, False),
    (-5, -5.0, True),
    (0, -0.0, True),
    (0.0, -0.0, True),
    (1e16, 1e16 + 2, False),  # both integral floats
    (1e16, 10**16, True),
    (1e16 + 2, 10**16, False),
    (1e16, 1e16, True),
    (1.5, 1.5000000001, True),  # non-integral, within the 1e-9 absolute tolerance
    (1.5, 1.5000001, False),  # 7e-8 relative: a different value, not noise
    (1.5, 1.5000100, False),
    (-2.25, -2.2500000001, True),
    (3, 3.0000000001, True),  # one side non-integral: tolerance applies (1e-10, inside the absolute 1e-9)
    (0.1 + 0.2, 0.3, True),  # summation noise
    (1000000.5, 1000001.0, False),  # |diff| 0.5 > 1e-12 * 1000001: a rounded answer, not noise
    (1077459.33, 1077460, False),  # college_2: a budget sum rounded up to an integer
    (1e16 + 0.0, 1e16 + 0.5, True),  # 1e16 + 0.5 rounds to the integral 1e16: == holds
    (1, "1", False),
    (1.0, "1.0", False),
    ("1000001", 1000000.0, False),
    (None, 0, False),
]


@pytest.mark.parametrize("gold,pred,expected", VALUE_PAIRS, ids=[f"{g!r}~{p!r}" for g, p, _ in VALUE_PAIRS])
def test_value_equality_integral_exact_non_integral_tolerant(gold, pred, expected):
    for g, p in ((gold, pred), (pred, gold)):  # symmetric
        assert execution_match(["x"], [(g,)], ["x"], [(p,)]).match is expected, (g, p)
        # inside a multiset with a float elsewhere (the tolerance path) and in an ordered result
        m = execution_match(["k", "x"], [("a", g), ("b", 0.5)], ["k", "x"], [("b", 0.5), ("a", p)])
        assert m.match is expected, (g, p, m)
        seq = execution_match(["x"], [(g,), (9.5,)], ["x"], [(p,), (9.5,)], GoldShape(order_matters=True))
        assert seq.match is expected, (g, p, seq)


def test_empty_with_different_column_count_is_mismatch_for_us_but_equal_for_test_suite():
    m = execution_match(["a", "b"], [], ["a"], [], GoldShape())
    assert not m.match and m.reason == "column_count"
    assert test_suite_result_eq(["a", "b"], [], ["a"], [], False).match


SHAPES = [
    ("SELECT a FROM t", False, None, False),
    ("SELECT a FROM t ORDER BY a", True, (0,), False),
    ("select T1.a, b as x from t as T1 order by x desc, T1.a limit 3", True, (1, 0), True),
    ("SELECT a FROM t ORDER BY b", True, None, False),
    ("SELECT * FROM t ORDER BY a", True, None, False),
    ("SELECT a FROM (SELECT a FROM t ORDER BY a) LIMIT 1", False, None, True),
    ("SELECT a FROM t UNION SELECT b FROM u ORDER BY a LIMIT 2", True, (0,), True),
    ("SELECT a FROM t EXCEPT SELECT a FROM u", False, None, False),
    ("SELECT T1.name FROM t AS T1 JOIN u AS T2 ORDER BY T2.name", True, None, False),
]


@pytest.mark.parametrize("sql,order,keys,limit", SHAPES)
def test_gold_shape(sql, order, keys, limit):
    s = gold_shape(sql)
    assert (s.order_matters, s.key_columns, s.has_limit) == (order, keys, limit)


def test_gold_shape_unparseable_falls_back_to_depth_zero_order_by():
    assert gold_shape("SELECT a FROM t ORDER BY a ,,, garbage (").order_matters
    assert not gold_shape("SELECT a FROM (SELECT a ORDER BY a) ,,, garbage (").order_matters


@pytest.mark.parametrize(
    "sql,expected",
    [
        ("SELECT DISTINCT a FROM t", "SELECT  a FROM t"),
        ("select count(distinct a) from t", "select count( a) from t"),
        ("SELECT a FROM t WHERE s = 'distinct'", "SELECT a FROM t WHERE s = 'distinct'"),
        ("SELECT a FROM t", "SELECT a FROM t"),
    ],
)
def test_remove_distinct(sql, expected):
    assert remove_distinct(sql) == expected


def _spider_sql() -> list[str]:
    from conftest import SHARED_SPIDER

    out: list[str] = []
    for name in ("train_spider.json", "train_others.json", "dev.json"):
        f = SHARED_SPIDER / name
        if f.is_file():
            out += [e["query"] for e in json.loads(f.read_text())]
    return out


def test_remove_distinct_fast_path_equals_the_tokenizer():
    """The regex fast path either declines (None) or gives exactly the tokenizer's answer: on every
    Spider SQL (with DISTINCT inserted and case-varied), on edge cases, and on random text."""
    from sqlrl.reward.shape import _remove_distinct_fast, _remove_distinct_tokens

    rng = random.Random(0)
    texts = [
        "SELECT 1distinct",
        "select t.distinct from x",
        "select $distinct",
        "select @distinct",
        "select a::distinct",
        "select `distinct`",
        "select x distinct_y",
        "select 1.distinct",
        "select 1e5distinct",
        "select 'x'distinct",
        "select distinct'x'",
        "select x'00'distinct",
        "select n'a'distinct",
        "select 'a''distinct'",
        '"a""distinct"',
        "select [a]distinct",
        "select [a]]distinct]",
        "select\x0cdistinct a",
        "select\x00distinct",
        "select 'a\\' distinct '",
        "select 'unterminated distinct",
        "select distinct -- distinct\n a",
        "select distinct /* distinct */ a",
        "SELECT DISTINCT a FROM t WHERE b = 'DISTINCT' AND \"distinct\" = 1",
        "SELECT DiStInCt a FROM t",
    ]
    base = _spider_sql()
    for sql in base[:4000]:
        texts.append(sql)
        texts.append(sql.replace("SELECT ", "SELECT DISTINCT ", 1))
        texts.append(sql.replace("select ", "select distinct ", 1).replace("count(", "count(DiStInCt "))
    alphabet = list("aDdIiSsTtNnCc_1 .,()*'\"`[]-/;:$@#?\\{}\n\t=<>|!&~^%é\x00")
    pieces = ["distinct", "DISTINCT", "Distinct", "--", "/*", "*/", "''", "select", " "]
    for _ in range(20000):
        k = rng.randint(1, 12)
        texts.append(
            "".join(rng.choice(pieces) if rng.random() < 0.4 else rng.choice(alphabet) for _ in range(k))
        )
    answered = 0
    for sql in texts:
        fast = _remove_distinct_fast(sql)
        if fast is not None:
            answered += 1
            assert fast == _remove_distinct_tokens(sql), sql
        assert remove_distinct(sql) == _remove_distinct_tokens(sql) or "distinct" not in sql.lower(), sql
    if base:  # the fast path must actually carry the Spider SQL
        spider_answered = sum(_remove_distinct_fast(s) is not None for s in base if "distinct" in s.lower())
        assert spider_answered >= 0.9 * sum("distinct" in s.lower() for s in base)
    assert answered > 1000


def test_test_suite_semantics_exact_values_and_strict_order():
    assert not test_suite_result_eq(["x"], [(1.0,)], ["x"], [(1.0000005,)], False).match
    assert test_suite_result_eq(["x"], [(1,)], ["x"], [(1.0,)], False).match
    assert test_suite_result_eq(["a", "b"], [(1, "x")], ["b", "a"], [("x", 1)], False).match
    # strict sequence when order matters, no tie relaxation
    assert not test_suite_result_eq(["n", "a"], NAB, ["n", "a"], [NAB[1], NAB[0], NAB[2]], True).match
    assert test_suite_result_eq(["n", "a"], NAB, ["n", "a"], [NAB[1], NAB[0], NAB[2]], False).match


def test_wide_null_results_bounded_time():
    rng = random.Random(0)
    k, n = 30, 2000
    gold = [tuple(rng.choice([None] * 40 + [1, 2, "x"]) for _ in range(k)) for _ in range(n)]
    perm = list(range(k))
    rng.shuffle(perm)
    pred = [tuple(r[i] for i in perm) for r in gold]
    rng.shuffle(pred)
    allnull = [(None,) * k] * n
    # one-hot rows: every column has the same value multiset, any permutation matches
    onehot = [tuple(1 if i == j % k else None for i in range(k)) for j in range(n)]
    # a mismatch deep in a wide NULL table
    bad = list(pred)
    bad[7] = tuple(3 if v is None else v for v in bad[7])
    for g, p, expected in [
        (gold, pred, True),
        (allnull, allnull, True),
        (onehot, onehot[::-1], True),
        (gold, bad, False),
    ]:
        t = time.perf_counter()
        assert execution_match(None, g, None, p).match is expected
        assert time.perf_counter() - t < 2.0


def test_permutation_bound_declared_and_reported():
    # 6 columns with the same value multiset {0, 0, 1}; gold rows hold two 1s each, predicted rows
    # three, three and zero, so no permutation can match (row sums are permutation-invariant)
    gold = [(1, 1, 0, 0, 0, 0), (0, 0, 1, 1, 0, 0), (0, 0, 0, 0, 1, 1)]
    pred = [(1, 1, 1, 0, 0, 0), (0, 0, 0, 1, 1, 1), (0, 0, 0, 0, 0, 0)]
    m = execution_match(None, gold, None, pred, max_tries=3)
    assert not m.match and m.reason == "permutation_bound"
    m = execution_match(None, gold, None, pred)
    assert not m.match and m.reason != "permutation_bound"


def test_worst_case_search_is_time_bounded():
    # many columns sharing one value multiset and no matching permutation: bounded by max_work
    rng = random.Random(3)
    k, n = 12, 2000
    base = [rng.randint(0, 3) for _ in range(n)]
    gold = [tuple(base[(r + c * 7) % n] for c in range(k)) for r in range(n)]
    pred = [tuple(base[(r + c * 11) % n] for c in range(k)) for r in range(n)]
    t = time.perf_counter()
    m = execution_match(None, gold, None, pred)
    assert not m.match
    assert time.perf_counter() - t < 2.0


def test_validity_reward():
    @dataclass
    class R:
        status: str

    assert validity_reward(R("ok")) == 1.0
    for st in ("syntax_error", "timeout", "worker_crash", "empty_sql"):
        assert validity_reward(R(st)) == 0.0


def test_reward_dataclass_invariants():
    with pytest.raises(ValueError):
        Reward(0.0, "gold_unscorable", {})
    with pytest.raises(ValueError):
        Reward(1.0, "bogus", {})
    assert Reward(None, "infra_error", {}).excluded


# ------------------------------------------------------------------------------------ Evaluator


@dataclass(frozen=True)
class FakeResult:
    status: str
    columns: list = field(default_factory=list)
    rows: list = field(default_factory=list)
    row_count: int = 0
    elapsed_ms: float = 0.0
    message: str = ""


class FakeSandbox:
    """Contract double of sqlrl.sql.sandbox.Sandbox on sqlite3 (read-only). Records every SQL it runs."""

    def __init__(self, force: str | None = None, raise_exc: bool = False):
        self.force = force
        self.raise_exc = raise_exc
        self.calls: list[str] = []

    def execute(self, db_path, sql, timeout_s=None):
        self.calls.append(sql)
        if self.raise_exc:
            raise RuntimeError("boom")
        if self.force:
            return FakeResult(self.force, message="forced")
        if not sql.strip().strip(";").strip():
            return FakeResult("empty_sql")
        con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
        try:
            cur = con.execute(sql)
            rows = [tuple(r) for r in cur.fetchall()]
            cols = [d[0] for d in cur.description or []]
            return FakeResult("ok", cols, rows, len(rows))
        except sqlite3.OperationalError as e:
            st = "syntax_error" if "syntax" in str(e) else "runtime_error"
            return FakeResult(st, message=str(e))
        finally:
            con.close()

    def close(self):
        pass


@pytest.fixture()
def db(tmp_path):
    path = tmp_path / "toy" / "toy.sqlite"
    path.parent.mkdir()
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE singer (id INTEGER PRIMARY KEY, name TEXT, age INTEGER, country TEXT, score REAL);
        INSERT INTO singer VALUES (1, 'Ann', 30, 'FR', 1.5), (2, 'Bob', 30, 'US', 2.25),
            (3, 'Cid', 40, 'US', 3.0), (4, 'Dee', 25, 'FR', NULL), (5, 'Eve', 40, 'DE', 0.1);
        """
    )
    con.commit()
    con.close()
    return str(path)


def make_task(db_path, gold_sql):
    from sqlrl.tasks.data import PrivateTask, PublicTask

    pub = PublicTask("t/00000", "toy", "q?", "", "", db_path)
    return PrivateTask(pub, gold_sql)


@pytest.fixture()
def gold_cache():
    from sqlrl.tasks.goldcache import GoldCache

    gold_runner = FakeSandbox()
    with GoldCache(executor=gold_runner) as gc:
        gc.runner = gold_runner  # type: ignore[attr-defined]
        yield gc


GOLD = "SELECT name FROM singer WHERE country = 'US'"
EVAL_CASES = [
    # (pred, expected status, expected value)
    ("SELECT name FROM singer WHERE country = 'US'", "match", 1.0),
    ("SELECT name FROM singer WHERE age >= 30 AND country != 'FR' AND country != 'DE'", "match", 1.0),
    ("SELECT name FROM singer WHERE country = 'FR'", "mismatch", 0.0),
    ("SELECT name, age FROM singer WHERE country = 'US'", "mismatch", 0.0),
    (None, "no_sql", 0.0),
    ("", "no_sql", 0.0),
    ("  ;  ", "no_sql", 0.0),
    ("SELEC name FROM singer", "exec_error", 0.0),
    ("SELECT nope FROM singer", "exec_error", 0.0),
]


@pytest.mark.parametrize("pred,status,value", EVAL_CASES)
def test_evaluator_statuses(db, gold_cache, pred, status, value):
    sb = FakeSandbox()
    r = Evaluator(sb, gold_cache).score(pred, make_task(db, GOLD))
    assert (r.status, r.value) == (status, value), r
    json.dumps(r.parts)  # parts must be JSON-serializable for trajectories.jsonl
    assert GOLD not in sb.calls or pred == GOLD  # the gold never runs on the policy's sandbox
    assert "test_suite_match" in r.parts


@pytest.mark.parametrize(
    "forced,status,value",
    [
        ("syntax_error", "exec_error", 0.0),
        ("forbidden", "exec_error", 0.0),
        ("multiple_statements", "exec_error", 0.0),
        ("runtime_error", "exec_error", 0.0),
        ("too_many_rows", "exec_error", 0.0),
        ("too_large", "exec_error", 0.0),
        ("timeout", "timeout", 0.0),
        ("worker_crash", "infra_error", None),
        ("weird_new_status", "infra_error", None),
    ],
)
def test_evaluator_sandbox_status_mapping(db, gold_cache, forced, status, value):
    r = Evaluator(FakeSandbox(force=forced), gold_cache).score("SELECT 1", make_task(db, GOLD))
    assert (r.status, r.value) == (status, value)
    if status == "exec_error":
        assert r.parts["sandbox_status"] == forced


def test_evaluator_sandbox_exception_is_infra_error(db, gold_cache):
    r = Evaluator(FakeSandbox(raise_exc=True), gold_cache).score("SELECT 1", make_task(db, GOLD))
    assert r.status == "infra_error" and r.value is None


@pytest.mark.parametrize(
    "gold_sql,reason",
    [
        ("SELECT name FROM singer WHERE 0", "gold_empty"),
        ("SELECT nope FROM singer", "gold_error"),
    ],
)
@pytest.mark.parametrize("kind", ["execution", "validity"])
@pytest.mark.parametrize("pred", [None, "SELECT name FROM singer", "SELEC x"])
def test_gold_unscorable_excluded_whatever_the_prediction(db, gold_cache, gold_sql, reason, kind, pred):
    r = Evaluator(FakeSandbox(), gold_cache, kind=kind).score(pred, make_task(db, gold_sql))
    assert r.status == "gold_unscorable" and r.value is None and r.parts["reason"] == reason


def test_gold_cache_failure_is_infra_error(db):
    class Broken:
        def get(self, db_path, sql):
            raise RuntimeError("disk on fire")

    r = Evaluator(FakeSandbox(), Broken()).score("SELECT 1", make_task(db, GOLD))
    assert r.status == "infra_error" and r.value is None


def test_gold_served_from_cache_not_policy_sandbox(db, gold_cache):
    sb = FakeSandbox()
    ev = Evaluator(sb, gold_cache)
    task = make_task(db, "SELECT DISTINCT country FROM singer")
    for _ in range(3):
        ev.score("SELECT country FROM singer GROUP BY country", task)
    # gold + its DISTINCT-free variant, each executed once by the gold cache's own runner
    assert gold_cache.runner.calls.count("SELECT DISTINCT country FROM singer") == 1
    assert all("DISTINCT" not in c for c in sb.calls)


def test_validity_kind(db, gold_cache):
    ev = Evaluator(FakeSandbox(), gold_cache, kind="validity")
    task = make_task(db, GOLD)
    ok_wrong = ev.score("SELECT name FROM singer", task)
    assert ok_wrong.value == 1.0 and ok_wrong.status == "mismatch"
    assert ev.score(GOLD, task).value == 1.0
    bad = ev.score("SELEC", task)
    assert bad.value == 0.0 and bad.status == "exec_error"
    assert ev.score(None, task).status == "no_sql"
    assert (
        Evaluator(FakeSandbox(force="worker_crash"), gold_cache, kind="validity")
        .score("SELECT 1", task)
        .value
        is None
    )


def test_public_task_raises_type_error(db, gold_cache):
    task = make_task(db, GOLD)
    ev = Evaluator(FakeSandbox(), gold_cache)
    with pytest.raises(TypeError):
        ev.score("SELECT 1", task.public)
    with pytest.raises(TypeError):
        ev.score("SELECT 1", object())
    with pytest.raises(ValueError):
        Evaluator(FakeSandbox(), gold_cache, kind="bogus")


@pytest.mark.parametrize(
    "gold_sql,pred,ours,ts",
    [
        # DISTINCT kept by us, removed by test-suite
        ("SELECT DISTINCT age FROM singer", "SELECT age FROM singer", 0.0, 1.0),
        ("SELECT age FROM singer", "SELECT DISTINCT age FROM singer", 0.0, 1.0),
        ("SELECT count(DISTINCT country) FROM singer", "SELECT count(country) FROM singer", 0.0, 1.0),
        # float tolerance only in ours
        ("SELECT sum(score) FROM singer", "SELECT sum(score) + 1e-10 FROM singer", 1.0, 0.0),
        # limit ties relaxed only in ours (Ann and Bob are both 30)
        (
            "SELECT name, age FROM singer WHERE age < 40 ORDER BY age DESC LIMIT 1",
            "SELECT name, age FROM singer WHERE age = 30 ORDER BY name DESC LIMIT 1",
            1.0,
            0.0,
        ),
        (
            "SELECT name, age FROM singer ORDER BY age",
            "SELECT age, name FROM singer ORDER BY age, id",
            1.0,
            1.0,
        ),
        ("SELECT name FROM singer ORDER BY id", "SELECT name FROM singer ORDER BY id DESC", 0.0, 0.0),
        (
            "SELECT name FROM singer WHERE id IN (SELECT id FROM singer ORDER BY id LIMIT 2)",
            "SELECT name FROM singer WHERE id < 3 ORDER BY id DESC",
            1.0,
            1.0,
        ),
    ],
)
def test_ours_vs_test_suite(db, gold_cache, gold_sql, pred, ours, ts):
    r = Evaluator(FakeSandbox(), gold_cache).score(pred, make_task(db, gold_sql))
    assert r.value == ours, r
    assert r.parts["test_suite_match"] == ts, r


def test_test_suite_none_when_gold_variant_fails(db, gold_cache):
    # removing DISTINCT from the gold makes it a different query; if that variant fails -> None + reason
    class Flaky(FakeSandbox):
        def execute(self, db_path, sql, timeout_s=None):
            if "DISTINCT" not in sql and "country" in sql:
                return FakeResult("runtime_error", message="variant fails")
            return super().execute(db_path, sql, timeout_s)

    from sqlrl.tasks.goldcache import GoldCache

    with GoldCache(executor=Flaky()) as gc:
        r = Evaluator(FakeSandbox(), gc).score(
            "SELECT DISTINCT country FROM singer", make_task(db, "SELECT DISTINCT country FROM singer")
        )
    assert r.status == "match"
    assert r.parts["test_suite_match"] is None and r.parts["test_suite_reason"].startswith("gold_variant")


@pytest.mark.skipif(not HAVE_SANDBOX, reason="sqlrl.sql.sandbox not written yet")
def test_evaluator_with_real_sandbox_and_gold_cache(db, tmp_path):
    from sqlrl.sql.sandbox import Sandbox
    from sqlrl.tasks.goldcache import GoldCache

    with Sandbox(workers=1) as sb, GoldCache(tmp_path / "cache") as gc:
        ev = Evaluator(sb, gc)
        task = make_task(db, GOLD)
        assert ev.score(GOLD, task).status == "match"
        assert ev.score("SELECT name FROM singer", task).status == "mismatch"
        assert ev.score("SELEC", task).status == "exec_error"
        assert ev.score("DROP TABLE singer", task).status == "exec_error"
        assert ev.score(None, task).status == "no_sql"
        assert ev.score(GOLD, make_task(db, "SELECT name FROM singer WHERE 0")).status == "gold_unscorable"


def _numbers_db(path, n: int) -> str:
    """A real database whose table t holds x = 1..n."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (x INTEGER PRIMARY KEY)")
    con.execute(
        f"WITH RECURSIVE c(v) AS (SELECT 1 UNION ALL SELECT v + 1 FROM c LIMIT {n}) INSERT INTO t SELECT v FROM c"
    )
    con.commit()
    con.close()
    return str(path)


@pytest.mark.skipif(not HAVE_SANDBOX, reason="sqlrl.sql.sandbox not written yet")
def test_gold_over_the_prediction_row_cap_is_unscorable_not_a_mismatch(tmp_path):
    """Gold and prediction share one row cap (the sandbox's default, 100,000): an identical
    prediction of a 100,001-row gold is excluded as gold_too_many_rows, never scored 0."""
    from sqlrl.sql.result import MAX_ROWS
    from sqlrl.sql.sandbox import Sandbox
    from sqlrl.tasks.goldcache import GoldCache

    assert MAX_ROWS == 100_000
    db = _numbers_db(tmp_path / "nums" / "nums.sqlite", MAX_ROWS + 1)
    over, at_cap = "SELECT x FROM t", f"SELECT x FROM t WHERE x <= {MAX_ROWS}"
    with Sandbox(workers=1) as sb, GoldCache(tmp_path / "cache", workers=1) as gc:
        ev = Evaluator(sb, gc)
        r = ev.score(over, make_task(db, over))
        assert (r.status, r.value, r.parts.get("reason")) == (
            "gold_unscorable",
            None,
            "gold_too_many_rows",
        ), r
        assert gc.get(db, over).unscorable_reason == "gold_too_many_rows"
        r = ev.score(at_cap, make_task(db, at_cap))
        assert (r.status, r.value) == ("match", 1.0), r
        assert ev.score(f"SELECT x FROM t WHERE x < {MAX_ROWS}", make_task(db, at_cap)).status == "mismatch"


@pytest.mark.skipif(not HAVE_SANDBOX, reason="sqlrl.sql.sandbox not written yet")
def test_gold_cache_with_a_larger_row_cap_than_the_sandbox_still_unscorable(tmp_path):
    """A gold cached under a larger cap than the predictions' sandbox keeps (here 200 vs 100 rows) is
    excluded by the Evaluator: no prediction could match it."""
    from sqlrl.sql.sandbox import Sandbox
    from sqlrl.tasks.goldcache import GoldCache

    db = _numbers_db(tmp_path / "nums" / "nums.sqlite", 150)
    gold = "SELECT x FROM t"
    with Sandbox(workers=1, max_rows=100) as sb, GoldCache(tmp_path / "cache", max_rows=200, workers=1) as gc:
        assert gc.get(db, gold).row_count == 150
        r = Evaluator(sb, gc).score(gold, make_task(db, gold))
        assert (r.status, r.parts.get("reason")) == ("gold_unscorable", "gold_too_many_rows"), r
        at_cap = "SELECT x FROM t WHERE x <= 100"
        assert Evaluator(sb, gc).score(at_cap, make_task(db, at_cap)).status == "match"
        assert Evaluator(sb, gc).score(gold, make_task(db, at_cap)).status == "exec_error"  # too_many_rows


# ------------------------------------------------------------------------------------------ CLI


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "sqlrl.cli", "reward", *args], capture_output=True, text=True, timeout=60
    )


def test_cli_missing_db_exit_2(tmp_path):
    p = _cli("--db", str(tmp_path / "nope.sqlite"), "--gold", "SELECT 1", "--pred", "SELECT 1", "--json")
    assert p.returncode == 2 and "not found" in p.stderr


def test_cli_bad_args_exit_2():
    assert _cli("--db").returncode == 2


@pytest.mark.skipif(not HAVE_SANDBOX, reason="sqlrl.sql.sandbox not written yet")
def test_cli_scores(db):
    p = _cli("--db", db, "--gold", GOLD, "--pred", "SELECT name FROM singer WHERE country='US'", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["value"] == 1.0 and out["status"] == "match" and "test_suite_match" in out["parts"]
    p = _cli("--db", db, "--gold", GOLD, "--pred", "SELEC", "--kind", "validity", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["status"] == "exec_error"
    p = _cli("--db", db, "--gold", "SELECT name FROM singer WHERE 0", "--pred", "SELECT 1")
    assert p.returncode == 0 and json.loads(p.stdout)["value"] is None


def test_score_many_equals_score(db, gold_cache):
    class ManySandbox(FakeSandbox):
        def __init__(self):
            super().__init__()
            self.batches = 0

        def execute_many(self, items):
            self.batches += 1
            return [self.execute(d, s) for d, s in items]

    preds = [p for p, _, _ in EVAL_CASES] + [
        "SELECT DISTINCT name FROM singer WHERE country = 'US'",
        "SELECT DISTINCT name FROM singer",
    ]
    task = make_task(db, GOLD)
    sb = ManySandbox()
    many = Evaluator(sb, gold_cache).score_many([(p, task) for p in preds])
    single = [Evaluator(FakeSandbox(), gold_cache).score(p, task) for p in preds]
    assert [r.to_dict() for r in many] == [r.to_dict() for r in single]
    assert sb.batches == 2  # predictions, then the DISTINCT-free variants

    class BrokenMany(FakeSandbox):
        def execute_many(self, items):
            raise RuntimeError("pool gone")

    fallback = Evaluator(BrokenMany(), gold_cache).score_many([(p, task) for p in preds])
    assert [r.to_dict() for r in fallback] == [r.to_dict() for r in single]
