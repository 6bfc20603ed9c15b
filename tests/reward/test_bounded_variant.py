"""The DISTINCT-free variant of a prediction is built in bounded time.

`remove_distinct` ran the sqlglot tokenizer (about 4 us a character) on any prediction its fast scan
could not answer, outside every deadline: 3.5-4.8 s on an 840 KB prediction with one comment. Now a
prediction longer than `VARIANT_MAX_CHARS` that the fast scan cannot answer gets no variant, and its
test-suite match is 0 (reason `pred_variant_too_long`); the reward itself does not change.
"""

from __future__ import annotations

import pytest

from conftest import ParentOnlySandbox, make_name_age_db
from sqlrl.reward import shape as shape_module
from sqlrl.reward.evaluator import Evaluator
from sqlrl.reward.shape import VARIANT_MAX_CHARS, distinct_free, remove_distinct
from sqlrl.sql.sandbox import Sandbox
from sqlrl.tasks.data import PrivateTask, PublicTask
from sqlrl.tasks.goldcache import GoldCache

# 840,051 characters: 420,000 literals and a trailing comment (the fast scan gives up on comments)
HUGE = "SELECT DISTINCT name FROM t WHERE age NOT IN (" + ",".join(["1"] * 420_000) + ") -- c"


def test_distinct_free_rules():
    short = "SELECT DISTINCT a FROM t -- c"
    assert distinct_free(short) == remove_distinct(short) == "SELECT  a FROM t -- c"
    long_safe = "SELECT DISTINCT a FROM t WHERE a NOT IN (" + ",".join(["1"] * 20_000) + ")"
    assert len(long_safe) > VARIANT_MAX_CHARS
    assert distinct_free(long_safe) == long_safe.replace("DISTINCT", "", 1)  # the fast scan answers
    assert distinct_free(long_safe + " -- c") is None  # only the tokenizer could answer
    no_word = "SELECT a FROM t WHERE a NOT IN (" + ",".join(["1"] * 20_000) + ") -- c"
    assert distinct_free(no_word) == no_word
    at_limit = "SELECT DISTINCT a FROM t -- " + "x" * (VARIANT_MAX_CHARS - 28)
    assert len(at_limit) == VARIANT_MAX_CHARS
    assert distinct_free(at_limit) == at_limit.replace("DISTINCT", "", 1)


def test_distinct_free_never_tokenizes_a_huge_prediction(monkeypatch):
    def boom(sql):
        raise AssertionError("tokenizer called")

    monkeypatch.setattr(shape_module, "_remove_distinct_tokens", boom)
    assert distinct_free(HUGE) is None  # the fast scan only (the tokenizer took 3.5 s here)


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> str:
    return make_name_age_db(
        tmp_path_factory.mktemp("variant") / "toy" / "toy.sqlite", [("A", 1), ("A", 2), ("B", 3)]
    )


# (prediction, status, value, test_suite_match, test_suite_reason) against the gold SELECT name FROM t
# (A, A, B). DISTINCT makes the prediction a mismatch (A, B); its variant drops it: test-suite match.
CASES = [
    ("SELECT DISTINCT name FROM t -- c", "mismatch", 0.0, 1.0, None),
    ("SELECT DISTINCT name FROM t", "mismatch", 0.0, 1.0, None),
    ("SELECT name FROM t -- " + "x" * 30_000, "match", 1.0, 1.0, None),
    # too long for a variant: same reward, test-suite match 0 with its reason
    ("SELECT DISTINCT name FROM t -- " + "x" * 30_000, "mismatch", 0.0, 0.0, "pred_variant_too_long"),
    (HUGE, "mismatch", 0.0, 0.0, "pred_variant_too_long"),
]


@pytest.mark.parametrize("path", ["workers", "parent"])
def test_variant_rule_on_both_paths(toy, path):
    task = PrivateTask(PublicTask("t/0", "toy", "q?", "", "", toy), "SELECT name FROM t")
    with Sandbox(workers=1, timeout_s=20) as sb, GoldCache(executor=sb) as gc:
        ev = Evaluator(sb if path == "workers" else ParentOnlySandbox(sb), gc)
        for sql, status, value, ts, reason in CASES:
            r = ev.score(sql, task)
            assert (r.status, r.value) == (status, value), sql[:40]
            assert r.parts["test_suite_match"] == ts, sql[:40]
            assert r.parts.get("test_suite_reason") == reason, sql[:40]
