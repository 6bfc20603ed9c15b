"""`sqlrl eval` end to end on a BIRD-layout folder (tests/fixtures/make_bird.py) with a scripted policy:
evidence in the prompt (or not), both metrics and the difficulty breakdown in summary.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sqlrl.agent.loop import Budgets
from sqlrl.agent.prompts import build_messages
from sqlrl.generation.scripted import ScriptedPolicy
from sqlrl.tasks.bird import open_data

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from make_bird import make_bird  # noqa: E402

# question -> reply; expected (ours, BIRD): 1 1 / 0 0 / 0 1 / 1 1 / 0 0 / 0 1
ANSWERS = {
    "How many dorms": "SELECT count(*) FROM Dorm",
    "capacity over 300": "SELECT 1",
    "distinct genders": "SELECT DISTINCT gender FROM Dorm",  # 3 rows of the gold's 7: a set match
    "How many video games": "SELECT count(*) FROM Video_games",
    "play sports": "SELECT count(*) FROM SportsInfo",  # 14, the gold counts 12 students
    "game types": "SELECT GType FROM Video_games UNION ALL SELECT GType FROM Video_games",
}


class Recording(ScriptedPolicy):
    def __init__(self):
        self.texts: list[str] = []

        def reply(text: str, turn: int) -> str:
            self.texts.append(text)
            return next(f"```sql\n{sql}\n```" for k, sql in ANSWERS.items() if k in text)

        super().__init__(reply)


@pytest.fixture(scope="module")
def bird(tmp_path_factory) -> Path:
    return make_bird(tmp_path_factory.mktemp("bird") / "bird")


def _eval(bird: Path, out: Path, policy, **budget):
    from sqlrl.evaluation.runner import run_eval

    return run_eval(
        model="scripted",
        data=str(bird),
        split="dev",
        out=out,
        budgets=Budgets(turns=1, max_new_tokens=160, **budget),
        policy=policy,
        sandbox_workers=1,
        progress=False,
    )


def test_eval_on_bird_dev_writes_both_metrics_and_the_difficulty_breakdown(bird, tmp_path):
    policy = Recording()
    _eval(bird, tmp_path / "eval", policy)
    s = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert (s["n"], s["execution_match"], s["bird_execution_match"]) == (6, 2 / 6, 4 / 6)
    bd = s["by_difficulty"]
    assert [
        (bd[d]["correct"], bd[d]["bird_correct"], bd[d]["n"]) for d in ("simple", "moderate", "challenging")
    ] == [
        (2, 2, 2),
        (0, 0, 2),
        (0, 2, 2),
    ]
    res = [json.loads(x) for x in (tmp_path / "eval" / "results.jsonl").read_text().splitlines()]
    assert [r["bird_correct"] for r in res] == [True, False, True, True, False, True]
    assert res[2]["difficulty"] == "challenging"
    assert "Evidence: capacity over 300 refers to student_capacity > 300\n\nQuestion:" in policy.texts[1]
    assert "Evidence:" not in policy.texts[3]  # that example has no evidence
    # the gold never reaches the policy: no prompt holds its gold SQL
    golds = [t.gold_sql for t in open_data(bird).load("dev")]
    assert not any(g in text for g in golds for text in policy.texts if g != ANSWERS["How many dorms"])


def test_evidence_can_be_turned_off_and_descriptions_on(bird, tmp_path):
    policy = Recording()
    _eval(bird, tmp_path / "off", policy, show_evidence=False)
    assert policy.texts and not any("Evidence:" in t for t in policy.texts)
    s = json.loads((tmp_path / "off" / "summary.json").read_text())
    assert s["budgets"]["show_evidence"] is False  # recorded: runs with and without are not comparable
    task = open_data(bird).load("dev")[0].public
    msgs = build_messages(task, turns=1, max_schema_chars=8000, column_descriptions=True)
    assert "/* column descriptions of Dorm:\ndormid: the unique id of the dorm\n" in msgs[1]["content"]
    with pytest.raises(ValueError, match="column_descriptions needs schema_order = 'file'"):
        build_messages(task, turns=1, max_schema_chars=8000, column_descriptions=True, schema_sample_values=2)


def test_spider_budgets_record_nothing_new():
    assert "show_evidence" not in Budgets().to_dict() and "column_descriptions" not in Budgets().to_dict()


def test_eval_cli_refuses_descriptions_with_sample_values(capsys):
    from sqlrl.cli.eval import cli_main

    with pytest.raises(SystemExit) as e:
        cli_main(["--out", "x", "--column-descriptions", "--schema-sample-values", "2"])
    assert e.value.code == 2 and "--column-descriptions needs --schema-order file" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [["--kind", "debug"], ["--max-sql-executions", "0"]])
def test_eval_cli_refuses_the_checker_without_an_execution(extra, capsys):
    from sqlrl.cli.eval import cli_main

    with pytest.raises(SystemExit) as e:
        cli_main(["--out", "x", "--checker", *extra])
    assert e.value.code == 2 and "--checker executes the answer once" in capsys.readouterr().err


def test_eval_cli_ends_with_accuracy_by_hardness_and_difficulty(bird, tmp_path, monkeypatch, capsys):
    """Every gold of the fixture is easy (one table, no clause beyond WHERE / DISTINCT); ours and BIRD's
    metric per difficulty as in the test above: simple 2/2 and 2/2, moderate 0/2 and 0/2, challenging
    0/2 and 2/2."""
    from sqlrl.cli import eval as cli_eval
    from sqlrl.evaluation import runner

    monkeypatch.setattr(cli_eval, "check_model", lambda name: None)
    monkeypatch.setattr(runner, "load_policy", lambda *a, **k: Recording())
    out = tmp_path / "cli"
    argv = ["--model", "scripted", "--data", str(bird), "--split", "dev", "--out", str(out)]
    assert cli_eval.cli_main([*argv, "--max-new-tokens", "160"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-3].startswith("n=6 execution_match=0.3333 ")
    assert lines[-2] == "accuracy by Spider hardness: easy 33.3% (2/6), medium -, hard -, extra -"
    assert lines[-1] == (
        "accuracy by BIRD difficulty: simple 100.0% (2/2; BIRD metric 100.0%), moderate 0.0% (0/2; BIRD "
        "metric 0.0%), challenging 0.0% (0/2; BIRD metric 100.0%)"
    )
