"""The shortcuts added for reward throughput give exactly the answers of the general code: the
sandbox pre-check's no-semicolon/no-comment shortcut (vs the tokenizer scan), the short-result exit
of the capped fetch (vs the caps), the fast reject of `execution_match` (vs its permutation search),
the ASCII shortcut of the transient-error test (vs the re.I search)."""

from __future__ import annotations

import random
import sqlite3

import pytest

import sqlrl.reward.match as reward_mod
import sqlrl.reward.reproducible as repro_mod
import sqlrl.sql.guard as guard_mod
from sqlrl.reward.cut import Cut
from sqlrl.reward.match import execution_match, test_suite_result_eq
from sqlrl.reward.shape import GoldShape, gold_shape
from sqlrl.sql.engine import Deadline, fetch_rows
from sqlrl.sql.guard import check_statement
from sqlrl.sql.sandbox import Sandbox

PRECHECK_CASES = [
    "SELECT 1",
    "  select a from t  ",
    "",
    "   \n\t ",
    "SELECT 'a;b' FROM t",
    "SELECT 'a--b' FROM t",
    'SELECT "x/*y" FROM t',
    "SELECT 1; SELECT 2",
    "SELECT 1;",
    "SELECT 1 -- trailing",
    "/* c */ SELECT 1",
    "DROP TABLE t",
    "  insert into t values (1)",
    "EXPLAIN SELECT 1",
    "EXPLAIN QUERY PLAN SELECT 1",
    "EXPLAIN DELETE FROM t",
    "WITH x AS (SELECT 1) SELECT * FROM x",
    "SELECT [a] FROM `t` WHERE b = 'it''s'",
    "SELECT 'unterminated",
    "SELECT a - b / c FROM t",
    "SELECT a -- b",
    "VALUES (1)",
    "PRAGMA table_info(t)",
    "ATTACH 'x' AS y",
    "x" * 50,
]


@pytest.mark.parametrize("sql", PRECHECK_CASES)
def test_precheck_shortcut_equals_scan(sql, monkeypatch):
    fast = check_statement(sql, 1000)
    # the general path: the same function with the shortcut's condition always false
    monkeypatch.setattr(guard_mod, "_precheck_fast_ok", lambda s: False)
    slow = check_statement(sql, 1000)
    if isinstance(fast, str):
        assert fast == slow
    else:
        assert (fast.status, fast.message) == (slow.status, slow.message)


def test_precheck_shortcut_random_text(monkeypatch):
    rng = random.Random(1)
    alphabet = list("SELECT ab;'\"`[]-/*\n ") + ["DROP ", "EXPLAIN ", "select ", "--", "/*", "*/"]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20))) for _ in range(3000)]
    fast = [check_statement(t, 1000) for t in texts]
    monkeypatch.setattr(guard_mod, "_precheck_fast_ok", lambda s: False)
    slow = [check_statement(t, 1000) for t in texts]
    for t, a, b in zip(texts, fast, slow):
        if isinstance(a, str) or isinstance(b, str):
            assert a == b, t
        else:
            assert (a.status, a.message) == (b.status, b.message), t


@pytest.mark.parametrize(
    ("n_rows", "max_rows", "max_bytes"),
    [
        (0, 10, 10_000),
        (1, 10, 10_000),
        (5, 5, 10_000),
        (6, 5, 10_000),
        (63, 100, 10**6),
        (64, 100, 10**6),
        (65, 100, 10**6),
        (300, 1000, 10**6),
        (300, 1000, 2_000),
        (10, 9, 10**6),
        (3, 10, 40),
        (64, 64, 10**6),
        (65, 64, 10**6),
    ],
)
def test_fetch_caps_hold(n_rows, max_rows, max_bytes):
    con = sqlite3.connect(":memory:")
    con.execute("CREATE TABLE t (a INTEGER, b TEXT)")
    con.executemany("INSERT INTO t VALUES (?, ?)", [(i, "x" * (i % 7)) for i in range(n_rows)])
    dl = Deadline()
    dl.t = float("inf")
    cfg = {"max_rows": max_rows, "max_result_bytes": max_bytes}
    status, rows, _ = fetch_rows(con.execute("SELECT a, b FROM t ORDER BY a"), cfg, dl)
    want = [(i, "x" * (i % 7)) for i in range(n_rows)]
    # reference: row by row under the same caps
    ref, nbytes, ref_status = [], 0, "ok"
    import marshal

    for r in want:
        nbytes += len(marshal.dumps(r))
        if nbytes > max_bytes:
            ref_status = "too_large"
            break
        if len(ref) >= max_rows:
            ref_status = "too_many_rows"
            break
        ref.append(r)
    assert len(rows) <= max_rows
    assert status == ref_status or (status != "ok" and ref_status != "ok")
    if status == "ok":
        assert rows == want
    else:
        assert rows == want[: len(rows)]


def _rand_rows(rng, n, k, floats):
    vals = [1, 2, 3, "a", "b", None, b"x"] + ([0.5, 1.25, 1e-12, 2.0] if floats else [])
    return [tuple(rng.choice(vals) for _ in range(k)) for _ in range(n)]


GOLDS = [
    "SELECT a, b FROM t",
    "SELECT a FROM t",
    "SELECT a, b FROM t ORDER BY a",
    "SELECT a, b FROM t ORDER BY b DESC, a",
    "SELECT a, b FROM t ORDER BY a LIMIT 4",
    "SELECT a, b FROM t ORDER BY a LIMIT 1",
    "SELECT a, b, c FROM t ORDER BY count(*)",
    "SELECT a, b, c FROM t ORDER BY c LIMIT 2 OFFSET 1",
    "SELECT a FROM t ORDER BY a DESC LIMIT 3 OFFSET 1",
    "SELECT * FROM t ORDER BY a LIMIT 2",
]


@pytest.mark.parametrize("seed", range(8))
def test_fast_reject_changes_no_verdict(seed, monkeypatch):
    """execution_match and the test-suite comparison with the fast paths on and off: same match,
    reason, permutation and mode on random results (permuted columns, shuffled or cut rows, near
    floats, boundary runs, mixed types)."""
    rng = random.Random(seed)
    cases = []
    for _ in range(400):
        gsql = rng.choice(GOLDS)
        k = gsql.split("FROM")[0].count(",") + 1 if "*" not in gsql else rng.randint(1, 9)
        n = rng.randint(0, 6)
        g = _rand_rows(rng, n, k, rng.random() < 0.4)
        kind = rng.random()
        if kind < 0.25:
            p = list(g)
        elif kind < 0.4:
            p = rng.sample(g, len(g))
        elif kind < 0.55:
            perm = rng.sample(range(k), k)
            p = [tuple(r[i] for i in perm) for r in g]
        elif kind < 0.65 and g:  # one cell changed
            p = [list(r) for r in g]
            p[rng.randrange(n)][rng.randrange(k)] = rng.choice([7, "z", None, 0.5 + 1e-9])
            p = [tuple(r) for r in p]
        elif kind < 0.75:
            p = [tuple(x * 1.0000001 if type(x) is float else x for x in r) for r in g]
        else:
            p = _rand_rows(rng, n, k, rng.random() < 0.4)
        cases.append((gsql, g, p))

    def run():
        out = []
        for gsql, g, p in cases:
            sh = gold_shape(gsql)
            for tol in (True, False):
                m = execution_match(None, g, None, p, sh, float_tol=tol, tie_relax=tol)
                out.append((m.match, m.reason, m.permutation, m.mode))
            m = test_suite_result_eq(None, g, None, p, sh.order_matters)
            out.append((m.match, m.reason, m.permutation, m.mode))
            # a tiny budget: the search may run out, the fast reject must then leave it alone
            m = execution_match(None, g, None, p, sh, max_tries=3, max_work=6)
            out.append((m.match, m.reason, m.permutation, m.mode))
        return out

    fast = run()
    monkeypatch.setattr(reward_mod, "_FAST_PATH", False)
    assert run() == fast


def test_fast_reject_cases():
    key_limit = GoldShape(order_matters=True, key_columns=(1,), has_limit=True, limit=1)
    # a cut whose pool holds two rows tied on the key: either may stand at the cut, in any column order
    cut = Cut(runs=(1,), pools=((0, ((1528, 89632), (7, 89632))),))
    assert execution_match(["a", "b"], [(1528, 89632)], ["x", "y"], [(7, 89632)], key_limit, cut).match
    assert execution_match(["a", "b"], [(1528, 89632)], ["x", "y"], [(89632, 7)], key_limit, cut).match
    for pred in [(9, 89632), (82506, 82506)]:  # carries the key but is not a row of the full result
        m = execution_match(["a", "b"], [(1528, 89632)], ["x", "y"], [pred], key_limit, cut)
        assert (m.match, m.reason, m.mode, m.tries) == (False, "order_differs_or_rows_differ", "runs", 0)
    # without a cut, nothing stands in for the gold's own row
    m = execution_match(["a", "b"], [(1528, 89632)], ["x", "y"], [(7, 89632)], key_limit)
    assert (m.match, m.mode) == (False, "runs")
    # ints and floats: 1 == 1.0 both in the reject and in the search
    assert execution_match(None, [(1, "a")], None, [(1.0, "a")]).match
    assert test_suite_result_eq(None, [(1, "a")], None, [("a", 1.0)], False).match
    m = execution_match(None, [("a",)], None, [("b",)], GoldShape(order_matters=True))
    assert (m.match, m.reason, m.mode) == (False, "order_differs_or_rows_differ", "sequence")


@pytest.mark.parametrize(
    "msg",
    [
        "no such column: x",
        "database is LOCKED",
        "Disk I/O error",
        "out of memory",
        "unable to open",
        "no such table: buſy",
        "malformed",
        "RESOURCE",
        "interrupted",
        "",
        "no such column: \u212a",
    ],
)
def test_transient_shortcut(msg):
    assert repro_mod._transient(msg) == bool(repro_mod._TRANSIENT_ERROR.search(msg))


def test_scored_stat_per_chunk_still_sees_a_replaced_file(tmp_path):
    """execute_scored stats a database once per chunk: a file replaced between two calls is still
    re-opened by the worker (a stale connection would give the old value, hence a mismatch)."""
    path = tmp_path / "d.sqlite"
    shape = (False, None, False, None, False, True)
    with Sandbox(workers=1) as sb:
        for v in (1, 2, 3):
            if path.exists():
                path.unlink()
            con = sqlite3.connect(path)
            con.execute("CREATE TABLE t (a)")
            con.executemany("INSERT INTO t VALUES (?)", [(v,)] * v)
            con.commit()
            con.close()
            refs = {v: (1, (["a"], [(v,)] * v, shape, None))}
            items = [(str(path), "SELECT a FROM t", (v,), None)] * 3
            got = sb.execute_scored(
                items, refs, "sqlrl.reward.scoring:score_in_worker", {"kind": "execution", "ts": False}
            )
            assert [g[1] for g in got] == ["match"] * 3


# ------------------------------------------------------------- is_deterministic_sql's ASCII shortcut

NONDET_EDGE = [
    "SELECT RANDOM() FROM t",
    "SELECT x FROM t WHERE name = 'now'",
    "select nowhere from t",
    "select know from t",
    'SELECT "Date"(x) FROM t',
    "SELECT date FROM t",
    "SELECT date\t(x) FROM t",
    "SELECT time/**/(x)",
    "SELECT time--\n(x)",
    "SELECT DateTime FROM t",
    "select total_changes ()",
    "select Last_Insert_RowID()",
    "select julianDAY(d) from t",
    "select unixepoch from t",
    "select timediff(a, b)",
    "select x from t where random_id = 1",
    "select current_timestamp",
    "select CURRENT_TIME",
    "select [random] from t",
    "select `now` from t",
    "select a_now from t",
    "select strftime('%Y', d) from t",
    "SELECT ſtrftime('%Y', d) FROM t",  # non-ASCII: 'ſ' folds to 's' under re.I
    "SELECT \u212aey, now FROM t",  # the Kelvin sign folds to 'k'
    "SELECT n\u00f6w FROM t",
    "SELECT İ FROM t WHERE date(x)",
    "",
    "SELECT name FROM singer",
]


def _nondet_texts() -> list[str]:
    from conftest import SHARED_SPIDER

    texts = list(NONDET_EDGE)
    for name in ("train_spider.json", "dev.json"):
        f = SHARED_SPIDER / name
        if f.is_file():
            import json

            texts += [e["query"] for e in json.loads(f.read_text())]
    rng = random.Random(7)
    pieces = [
        "random",
        "RANDOM",
        "blob",
        "changes",
        "total_",
        "last_insert_rowid",
        "julianday",
        "date",
        "Date",
        "time",
        "TIME",
        "stamp",
        "diff",
        "str",
        "f",
        "unixepoch",
        "now",
        "NOW",
        "current_",
        "(",
        " (",
        "\t(",
        "/*",
        "--",
        " ",
        "_",
        "x",
        "1",
        '"',
        "`",
        "[",
        "]",
        "'",
        "ſ",
        "\u212a",
        "é",
        "SELECT ",
    ]
    texts += ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 12))) for _ in range(20000)]
    return texts


def _nondet_general(sql: str) -> bool:
    text = repro_mod._QUOTES.sub(" ", sql)
    return not (repro_mod._NONDET_WORDS.search(text) or repro_mod._NONDET_CALL.search(text))


def test_is_deterministic_shortcut_equals_the_re_i_search(monkeypatch):
    """The ASCII shortcut (substring pre-check, then the patterns without re.I on the lower-cased
    text) gives the re.I search's answer on every Spider SQL, edge cases and random text; with it off,
    `is_deterministic_sql` is the general search itself."""
    texts = _nondet_texts()
    want = [_nondet_general(t) for t in texts]
    repro_mod.is_deterministic_sql.cache_clear()
    got = [repro_mod.is_deterministic_sql(t) for t in texts]
    assert got == want
    assert True in want and False in want and sum(not w for w in want) > 1000
    monkeypatch.setattr(repro_mod, "_ASCII_SHORTCUT", False)
    repro_mod.is_deterministic_sql.cache_clear()
    assert [repro_mod.is_deterministic_sql(t) for t in texts] == want
    repro_mod.is_deterministic_sql.cache_clear()


def test_is_deterministic_shortcut_test_catches_a_missing_hint(monkeypatch):
    """The cases above can fail: with one hint word missing from the pre-check ('now'), the shortcut
    calls some non-deterministic SQL deterministic, and the comparison sees it."""
    texts = _nondet_texts()
    monkeypatch.setattr(repro_mod, "_NONDET_HINTS", tuple(h for h in repro_mod._NONDET_HINTS if h != "now"))
    repro_mod.is_deterministic_sql.cache_clear()
    try:
        assert any(repro_mod.is_deterministic_sql(t) != _nondet_general(t) for t in texts)
    finally:
        repro_mod.is_deterministic_sql.cache_clear()
