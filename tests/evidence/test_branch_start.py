"""The report's "grpo_sft vs its SFT start": grpo_sft paired with the sft arm's branch evaluation.

Synthetic folders (tests/fixtures/make_experiment.py) whose grpo_sft and branch results are rewritten with a
known pattern over 11 tasks: both right on 2, the branch only on 1 (grpo_sft: mismatch), grpo_sft only on 5
(3 from exec_error / no_sql / timeout, 2 from mismatch), both wrong on 2, one excluded in grpo_sft. So n = 10,
start 3/10, grpo_sft 7/10, Δ = +40 pp, exact two-sided McNemar p = 2 (C(6,0) + C(6,1)) / 2^6 = 0.21875,
repair part (3 - 0) / 10 = +30 pp, answer part (2 - 1) / 10 = +10 pp.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from conftest import status_rows
from sqlrl.artifacts import read_json, write_json_atomic, write_jsonl
from sqlrl.evidence.branchstart import branch_start_rows
from sqlrl.evidence.gate import evidence_gate
from sqlrl.evidence.report import write_report
from sqlrl.evidence.rundir import Experiment

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from make_experiment import make_experiment  # noqa: E402

# (branch status, grpo_sft status) per task
PATTERN = [
    ("match", "match"),
    ("match", "match"),
    ("match", "mismatch"),  # lost: an answer loss
    ("exec_error", "match"),  # gained by repair x 3
    ("no_sql", "match"),
    ("timeout", "match"),
    ("mismatch", "match"),  # gained by an answer change x 2
    ("mismatch", "match"),
    ("mismatch", "mismatch"),
    ("timeout", "exec_error"),
    ("match", "infra_error"),  # excluded in grpo_sft: dropped from the pairs
]


def _folder(tmp_path: Path, *, with_branch: bool = True) -> Path:
    p = make_experiment(tmp_path / "e", synthetic=False, arms=("base", "sft", "grpo_sft"), n_tasks=11)
    write_jsonl(p / "arms/grpo_sft/eval/results.jsonl", status_rows(PATTERN, 1))
    e = read_json(p / "experiment.json")
    e["arms"]["grpo_sft"]["init_run"] = "arms/sft/train"
    e["arms"]["grpo_sft"]["init_branch"] = "arms/sft/train/branch_step_000240"
    if with_branch:
        shutil.copytree(p / "arms/sft/eval", p / "arms/sft/branch_eval")
        write_jsonl(p / "arms/sft/branch_eval/results.jsonl", status_rows(PATTERN, 0))
        e["arms"]["sft"].update(branch_eval_run="arms/sft/branch_eval", branch_step=240)
    write_json_atomic(p / "experiment.json", e)
    run = read_json(p / "arms/grpo_sft/train/run.json")
    run["init_sft"] = {"run": "arms/sft/train", "branch": "arms/sft/train/branch_step_000240", "step": 240}
    write_json_atomic(p / "arms/grpo_sft/train/run.json", run)
    return p


def test_the_paired_numbers_are_the_hand_derived_ones(tmp_path: Path) -> None:
    (row,) = branch_start_rows(Experiment(_folder(tmp_path)), n_boot=2000)
    assert row["label"] == "grpo_sft vs its SFT start (sft at step 240)" and row["available"]
    assert (row["n"], row["dropped_excluded"], row["b_only"], row["a_only"]) == (10, 1, 5, 1)
    assert (row["mean_a"], row["mean_b"]) == (pytest.approx(0.3), pytest.approx(0.7))
    assert row["diff"] == pytest.approx(0.4) and row["ci_low"] <= 0.4 <= row["ci_high"]
    assert row["p_value"] == pytest.approx(0.21875, abs=1e-12)
    rep = row["repair"]
    assert (rep["repair_gains"], rep["breakages"], rep["answer_gains"], rep["answer_losses"]) == (3, 0, 2, 1)
    assert (rep["repair_part"], rep["answer_part"]) == (pytest.approx(0.3), pytest.approx(0.1))


def test_the_report_shows_it_and_the_verdict_does_not_change(tmp_path: Path) -> None:
    without = _folder(tmp_path / "a", with_branch=False)
    p = _folder(tmp_path / "b")
    verdicts = [{**evidence_gate(x).to_dict(), "experiment": None} for x in (p, without)]
    assert verdicts[0] == verdicts[1]  # information, not a gate check
    write_report(p, n_boot=500)
    md = (p / "report.md").read_text()
    assert "## grpo_sft vs its SFT start" in md
    line = next(x for x in md.splitlines() if x.startswith("| grpo_sft vs its SFT start (sft at step 240) |"))
    assert line.startswith("| grpo_sft vs its SFT start (sft at step 240) | 10 | 30.0% → 70.0% | +40.0 pp (")
    assert line.endswith(" | 5 | 1 | 0.219 | +30.0 pp | +10.0 pp |")
    assert 'id="sft-start"' in (p / "report.html").read_text()
    write_report(without, n_boot=500)
    assert "SFT start" not in (without / "report.md").read_text()
    assert 'id="sft-start"' not in (without / "report.html").read_text()


def test_a_branch_that_is_not_grpo_sfts_start_measured_alike_gives_no_numbers(tmp_path: Path) -> None:
    p = _folder(tmp_path)
    run = read_json(p / "arms/grpo_sft/train/run.json")
    run["init_sft"]["step"] = 100
    write_json_atomic(p / "arms/grpo_sft/train/run.json", run)
    (row,) = branch_start_rows(Experiment(p), n_boot=100)
    assert (
        not row["available"]
        and row["reason"] == "grpo_sft started from step 100, the evaluated branch is step 240"
    )
    run["init_sft"]["step"] = 240
    write_json_atomic(p / "arms/grpo_sft/train/run.json", run)
    be = read_json(p / "arms/sft/branch_eval/run.json")
    be["budgets"]["max_new_tokens"] = 128
    write_json_atomic(p / "arms/sft/branch_eval/run.json", be)
    (row,) = branch_start_rows(Experiment(p), n_boot=100)
    assert not row["available"] and row["reason"].startswith("the branch evaluation's budgets {")
    assert "differ from grpo_sft's" in row["reason"]
    # a grpo_sft that started from another SFT run (its own stage) is not paired with the sft arm's branch
    e = read_json(p / "experiment.json")
    e["arms"]["grpo_sft"]["init_run"] = "arms/grpo_sft/sft_init"
    write_json_atomic(p / "experiment.json", e)
    assert branch_start_rows(Experiment(p), n_boot=100) == []
