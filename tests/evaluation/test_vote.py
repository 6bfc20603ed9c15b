"""Execution-guided self-consistency on real SQLite with a scripted policy whose samples differ."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest

from sqlrl.agent.loop import Budgets
from sqlrl.evaluation.vote import choose, result_key, self_consistency
from sqlrl.generation.scripted import ScriptedPolicy
from sqlrl.sql.sandbox import Sandbox
from sqlrl.tasks.data import PrivateTask
from sqlrl.tasks.goldcache import GoldCache


@dataclass
class Res:
    status: str
    columns: list
    rows: list


OK1 = Res("ok", ["a"], [(1,)])
OK2 = Res("ok", ["a"], [(2,)])
BAD = Res("syntax_error", [], [])


@pytest.mark.parametrize(
    "sqls,results,want",
    [
        (["x", "y", "z"], [OK1, OK2, Res("ok", ["b"], [(1,)])], (0, 2)),  # x and z agree (names ignored)
        (["x", "y"], [OK1, OK2], (0, 1)),  # a tie goes to the first sampled
        (["x", "y", "z"], [BAD, OK2, OK1], (1, 1)),  # a failure does not vote
        (["x", "y"], [BAD, BAD], (0, 0)),  # nothing executes: the first sample
        ([None, "y"], [OK1, OK2], (1, 1)),  # no SQL, no vote
        (["x", "y", "z"], [Res("ok", ["a"], [(1,), (2,)]), OK2, Res("ok", ["a"], [(2,), (1,)])], (0, 2)),
    ],
)
def test_choose(sqls, results, want):
    assert choose(sqls, results) == want


def test_result_key_separates_column_counts_and_duplicates():
    assert result_key(Res("ok", ["a"], [])) != result_key(Res("ok", ["a", "b"], []))
    assert result_key(Res("ok", ["a"], [(1,)])) != result_key(Res("ok", ["a"], [(1,), (1,)]))
    assert result_key(BAD) is None


# per question, the k = 4 sampled answers in sample order
SAMPLES = {
    # greedy (sample 0) is wrong; two differently written correct answers outvote it
    "How many customers are there?": [
        "SELECT 2",
        "SELECT count(*) FROM customer",
        "SELECT count(id) FROM customer",
        "SELEC nonsense",
    ],
    # the majority is wrong; one sample is right (pass@k, not the vote)
    "List customer names in London.": [
        "SELECT name FROM customer WHERE city = 'Paris'",
        "SELECT name FROM customer WHERE city = 'Paris'",
        "SELECT name FROM customer WHERE city = 'London'",
        "SELECT name FROM customer WHERE id = 1",
    ],
    # nothing executes: the first sample is the answer
    "What is the total order amount?": ["SELECT sum(amont) FROM orders", "SELEC", "SELEC", "SELEC"],
}


def scripted():
    seen: Counter = Counter()

    def answer(text, turn):
        for q, sqls in SAMPLES.items():
            if q in text:
                i = seen[q]
                seen[q] += 1
                return f"```sql\n{sqls[i % len(sqls)]}\n```"
        return "?"

    return ScriptedPolicy(answer)


def test_self_consistency_votes_then_scores(shop_tasks, tmp_path):
    unscorable = PrivateTask(
        shop_tasks[0].public.__class__(
            "shop/00099",
            "shop",
            "Who is from Mars?",
            shop_tasks[0].public.schema,
            "",
            shop_tasks[0].public.db_path,
        ),
        "SELECT name FROM customer WHERE city = 'Mars'",
    )
    with Sandbox(workers=1, timeout_s=2.0) as sb, GoldCache(tmp_path / "gc") as gc:
        out = self_consistency(
            shop_tasks + [unscorable], scripted(), sb, gc, Budgets(), k=4, temperature=0.7, progress=False
        )
    by = {r["task_id"]: r for r in out.results}
    assert (by["shop/00000"]["correct"], by["shop/00000"]["votes"], by["shop/00000"]["sample"]) == (
        True,
        2,
        1,
    )
    assert (by["shop/00001"]["correct"], by["shop/00001"]["votes"], by["shop/00001"]["pass_at_k"]) == (
        False,
        2,
        True,
    )
    assert (by["shop/00002"]["status"], by["shop/00002"]["votes"], by["shop/00002"]["sample"]) == (
        "exec_error",
        0,
        0,
    )
    assert by["shop/00099"]["status"] == "gold_unscorable"
    s = out.summary
    assert (s["n"], s["k"], s["excluded"]) == (3, 4, 1)
    assert s["execution_match"] == pytest.approx(1 / 3) and s["pass_at_k"] == pytest.approx(2 / 3)


def test_self_consistency_refuses_greedy_or_one_sample(shop_tasks, tmp_path):
    with Sandbox(workers=1) as sb, GoldCache(tmp_path / "gc") as gc:
        with pytest.raises(ValueError, match="k >= 2"):
            self_consistency(shop_tasks, scripted(), sb, gc, Budgets(), k=1, progress=False)
        with pytest.raises(ValueError, match="temperature > 0"):
            self_consistency(shop_tasks, scripted(), sb, gc, Budgets(), k=4, temperature=0.0, progress=False)


@pytest.mark.parametrize(
    "args", [["--self-consistency", "1"], ["--self-consistency", "4", "--sc-temperature", "0"]]
)
def test_cli_refuses_a_vote_of_one_or_greedy_sampling(tmp_path, capsys, args):
    from sqlrl.cli.eval import cli_main

    assert cli_main(["--out", str(tmp_path / "e"), *args]) == 2
    assert "needs K >= 2" in capsys.readouterr().err
    assert not (tmp_path / "e").exists()  # nothing written
