"""Only `correct: true` is a correct answer and `correct: false` a wrong one: tampered copies of a committed
result folder, read by the report's analysis, `sqlrl compare` and `sqlrl seeds`."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from sqlrl.artifacts import read_jsonl, write_jsonl
from sqlrl.evaluation.outcome import outcome
from sqlrl.evidence.analysis import analyze, paired_outcomes
from sqlrl.evidence.pair import compare_runs
from sqlrl.evidence.seeds import _by_task

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from copy_result import SEED0, copy_result  # noqa: E402


@pytest.mark.parametrize(
    "row, want",
    [
        ({"status": "match", "correct": True}, 1),
        ({"status": "mismatch", "correct": False}, 0),
        ({"status": "mismatch", "correct": "false"}, None),
        ({"status": "match", "correct": 1}, None),
        ({"status": "match", "correct": None}, None),
        ({"status": "match"}, None),
        ({"status": "infra_error", "correct": False}, None),
        ({"status": "gold_unscorable", "correct": True}, None),
        ([1, 2], None),
    ],
)
def test_outcome_reads_only_json_booleans_of_scored_rows(row, want) -> None:
    assert outcome(row) == want


@pytest.fixture(scope="module")
def tampered(tmp_path_factory) -> tuple[Path, list[str]]:
    """The committed seed-0 matrix with three wrong GRPO answers rewritten: `correct` the string "false",
    `correct` 0, and status infra_error with `correct: false` kept. None of the three is scored."""
    d = copy_result(SEED0, tmp_path_factory.mktemp("outcome") / "exp")
    path = d / "arms" / "grpo" / "eval" / "results.jsonl"
    rows = list(read_jsonl(path))
    wrong = [r for r in rows if r["correct"] is False][:3]
    wrong[0]["correct"] = "false"
    wrong[1]["correct"] = 0
    wrong[2]["status"] = "infra_error"
    write_jsonl(path, rows)
    return d, [str(r["task_id"]) for r in wrong]


def test_report_counts_tampered_rows_as_not_scored(tampered) -> None:
    d, ids = tampered
    rows = list(read_jsonl(d / "arms" / "grpo" / "eval" / "results.jsonl"))
    right = sum(r["correct"] is True for r in rows)
    wrong = sum(r["correct"] is False and r["status"] != "infra_error" for r in rows)
    a = analyze(d, n_boot=50)
    grpo = next(x for x in a["arms"] if x["name"] == "grpo")
    assert (grpo["n"], grpo["n_total"]) == (right + wrong, len(rows))
    assert grpo["accuracy"]["value"] == pytest.approx(right / (right + wrong), abs=1e-12)
    unscored = Counter(
        r["status"]
        for r in rows
        if r["correct"] is not True and (r["correct"] is not False or r["status"] == "infra_error")
    )
    assert grpo["excluded"] == dict(unscored) and unscored["infra_error"] == 1
    base = list(read_jsonl(d / "arms" / "base" / "eval" / "results.jsonl"))
    p = paired_outcomes(base, rows)
    assert not set(ids) & set(p["task_ids"])
    assert p["dropped_excluded"] == 92 + 3


def test_compare_and_seeds_read_the_same_outcomes(tampered) -> None:
    d, ids = tampered
    c = compare_runs(d / "arms" / "base" / "eval", d / "arms" / "grpo" / "eval", n_boot=50)
    rows = list(read_jsonl(d / "arms" / "grpo" / "eval" / "results.jsonl"))
    assert c.b.correct == sum(r["correct"] is True for r in rows)
    assert c.b.scored == c.b.correct + sum(
        r["correct"] is False and r["status"] != "infra_error" for r in rows
    )
    by = _by_task(rows)
    assert [by[t] for t in ids] == [None, None, None]
