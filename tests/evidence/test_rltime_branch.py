"""grpo_sft started from the sft arm's weights at a branch step (`sft.init_from = "control"`): its training
time is the control's time up to that step plus its own GRPO time (`evidence/rltime.py`).

Synthetic experiment folders (tests/fixtures/make_experiment.py: every trained arm 12 steps x 30 s =
6.00 min, steps.jsonl `time_step_s` 30.0) with a hand-written branch folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sqlrl.artifacts import read_json, write_json_atomic
from sqlrl.evidence.gate import evidence_gate
from sqlrl.evidence.rltime import rl_training, time_problem
from sqlrl.evidence.rundir import Experiment

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from make_experiment import make_experiment  # noqa: E402

ARMS = ("base", "grpo", "no_update", "validity", "sft", "grpo_sft")
BRANCH = "arms/sft/train/branch_step_000004"


def _branch(p: Path, branch_seconds: float | None, *, declare: str = "experiment") -> None:
    """grpo_sft started from the sft arm's weights after step 4 (its branch.json says `branch_seconds`,
    or has no branch.json with None), declared in experiment.json or only in its train run.json; the
    sft arm's run.json gets its 12 steps."""
    if branch_seconds is not None:
        write_json_atomic(p / BRANCH / "branch.json", {"step": 4, "train_seconds": branch_seconds})
    if declare == "experiment":
        e = read_json(p / "experiment.json")
        e["arms"]["grpo_sft"].update(init_run="arms/sft/train", init_branch=BRANCH)
        write_json_atomic(p / "experiment.json", e)
    else:
        run = read_json(p / "arms/grpo_sft/train/run.json")
        run["init_sft"] = {"run": "arms/sft/train", "branch": BRANCH, "step": 4, "train_seconds": None}
        write_json_atomic(p / "arms/grpo_sft/train/run.json", run)
    run = read_json(p / "arms/sft/train/run.json")
    write_json_atomic(p / "arms/sft/train/run.json", {**run, "steps": 12})


def test_branch_time_is_the_controls_time_up_to_the_branch_plus_grpo(tmp_path: Path) -> None:
    p = make_experiment(tmp_path / "e", synthetic=False, arms=ARMS)
    _branch(p, 130.0)
    exp = Experiment(p)
    parts = rl_training(exp, exp.arms["grpo_sft"])
    # branch.json's 130 s (not the control's 360 s) + grpo_sft's own 12 x 30 s = 490 s
    assert parts == {
        "rl": 360.0,
        "sft": 130.0,
        "sft_run": "arms/sft/train",
        "from_control": "sft",
        "branch_step": 4,
        "total": 490.0,
        # one device for grpo_sft's run and the control's run it branched from (the device check's input)
        "devices": [
            ("arms/grpo_sft/train", "GPU: SYNTHETIC H200"),
            ("arms/sft/train", "GPU: SYNTHETIC H200"),
        ],
    }
    # the control trained 360 s < 490 s: refused, with the steps it needs (490 / 30 s = 17)
    line = time_problem(exp, exp.arms["sft"], exp.arms["grpo_sft"], 360.0, parts)
    assert line == (
        "arm 'sft' trained 6.00 min, less than 'grpo_sft' in total (8.17 min = SFT part 2.17 min in "
        "arms/sft/train up to step 4 + GRPO part 6.00 min): not an equal-time control; raise sft.steps to "
        "at least 17 (30.00 s a step in 'sft')"
    )
    # a control of 490 s covers it
    assert time_problem(exp, exp.arms["sft"], exp.arms["grpo_sft"], 490.0, parts) is None


def test_without_branch_json_the_time_is_the_controls_steps_up_to_the_branch(tmp_path: Path) -> None:
    p = make_experiment(tmp_path / "e", synthetic=False, arms=ARMS)
    _branch(p, None, declare="run")  # declared in run.json only, no branch.json: steps.jsonl 4 x 30 s
    exp = Experiment(p)
    parts = rl_training(exp, exp.arms["grpo_sft"])
    assert (parts["branch_step"], parts["sft"], parts["total"]) == (4, 120.0, 480.0)
    # steps.jsonl shorter than the branch step: the SFT part is unknown, and so is the total
    lines = (p / "arms/sft/train/steps.jsonl").read_text().splitlines()
    (p / "arms/sft/train/steps.jsonl").write_text("\n".join(lines[:3]) + "\n")
    parts = rl_training(Experiment(p), exp.arms["grpo_sft"])
    assert (parts["branch_step"], parts["sft"], parts["total"]) == (4, None, None)
    assert [x for x in evidence_gate(p).sft_control.problems if "not recorded" in x] == [
        "arm 'grpo_sft': the training time of the SFT run it started from is not recorded (branch.json "
        "train_seconds of its branch at step 4, or steps.jsonl time_step_s of every step up to it, in "
        "arms/sft/train), so its total is unknown"
    ]


def test_gate_with_a_branch_asks_for_more_control_steps_not_an_own_stage(tmp_path: Path) -> None:
    p = make_experiment(tmp_path / "e", synthetic=False, arms=ARMS)
    _branch(p, 120.0)
    v = evidence_gate(p)
    assert not v.rl_over_sft_allowed
    assert v.sft_control.problems == [
        "arm 'sft' trained 6.00 min, less than 'grpo_sft' in total (8.00 min = SFT part 2.00 min in "
        "arms/sft/train up to step 4 + GRPO part 6.00 min): not an equal-time control; raise sft.steps to "
        "at least 16 (30.00 s a step in 'sft')"
    ]
    # the control trained 16 steps x 30 s = 8.00 min: as long as grpo_sft's whole training
    run = read_json(p / "arms/sft/train/run.json")
    write_json_atomic(p / "arms/sft/train/run.json", {**run, "train_seconds": 480.0, "steps": 16})
    v = evidence_gate(p)
    assert [x for x in v.sft_control.problems if "equal-time" in x] == []


def test_a_branch_that_now_holds_other_weights_is_refused(tmp_path: Path) -> None:
    """grpo_sft recorded the branch's identity when it started; the sft arm trained again afterwards and
    exported other weights there: its SFT part is not that run's time, and the gate says so."""
    from sqlrl.evidence.rltime import branch_problem

    p = make_experiment(tmp_path / "e", synthetic=False, arms=ARMS)
    _branch(p, 130.0, declare="run")
    run = read_json(p / "arms/grpo_sft/train/run.json")
    run["init_sft"]["identity"] = "sha256:aaa"
    write_json_atomic(p / "arms/grpo_sft/train/run.json", run)
    write_json_atomic(
        p / BRANCH / "branch.json", {"step": 4, "train_seconds": 130.0, "identity": "sha256:aaa"}
    )
    exp = Experiment(p)
    assert branch_problem(exp, exp.arms["grpo_sft"]) is None  # the same weights
    write_json_atomic(
        p / BRANCH / "branch.json", {"step": 4, "train_seconds": 130.0, "identity": "sha256:bbb"}
    )
    exp = Experiment(p)
    line = (
        f"arm 'grpo_sft' started from {BRANCH} with weights sha256:aaa, but that branch now holds sha256:bbb "
        "(the sft arm trained again after it): its SFT part is not that run's; delete arms/grpo_sft to train "
        "it again from the current branch"
    )
    assert branch_problem(exp, exp.arms["grpo_sft"]) == line
    assert line in evidence_gate(p).sft_control.problems
    assert branch_problem(exp, exp.arms["grpo"]) is None
