"""The claim's evaluations on one device: greedy answers of the same weights differ between GPU models
(22 of 759 between an H100 and an H200), so the gate's `devices` check refuses a GRPO arm or a control
evaluated on another device, and the RL-over-SFT line an RL arm evaluated elsewhere than its sft arm.
Tampered copies of the committed seed-0 folder (every arm on one H100, the gate allows both claims)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sqlrl.artifacts import read_json, write_json_atomic
from sqlrl.evidence.devices import device_key
from sqlrl.evidence.gate import evidence_gate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from copy_result import SEED0, copy_result  # noqa: E402

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def exp(tmp_path) -> Path:
    return copy_result(SEED0, tmp_path / "exp")


def _eval_machine(exp: Path, arm: str, change) -> None:
    path = exp / "arms" / arm / "eval" / "run.json"
    run = read_json(path)
    change(run)
    write_json_atomic(path, run)


def _devices(v) -> dict:
    return next(c for c in v.checks if c.name == "devices").to_dict()


def test_the_committed_seed_passes_with_every_evaluation_on_one_h100(exp) -> None:
    v = evidence_gate(exp)
    assert v.claim_allowed and v.rl_over_sft_allowed
    assert _devices(v)["passed"] and _devices(v)["detail"] == "GRPO arms and controls evaluated on one device"


@pytest.mark.parametrize(
    "arm,change,said",
    [
        ("grpo", lambda r: r["machine"].__setitem__("accelerator", "NVIDIA H200"), "nvidia h200: grpo"),
        ("validity", lambda r: r.pop("machine"), "unrecorded: validity"),
        ("no_update", lambda r: r["machine"].pop("accelerator"), "cpu: no_update"),
        ("base", lambda r: r["machine"].__setitem__("accelerator", "NVIDIA A100"), "nvidia a100: base"),
    ],
)
def test_a_grpo_arm_or_control_evaluated_on_another_device_refuses_the_claim(exp, arm, change, said) -> None:
    _eval_machine(exp, arm, change)
    v = evidence_gate(exp)
    assert not v.claim_allowed
    (problem,) = _devices(v)["problems"]
    assert problem.startswith("the claim's evaluations ran on 2 devices (") and said in problem, problem
    assert "nvidia h100 80gb hbm3: " in problem and problem.endswith(
        "greedy answers differ between GPU models"
    )


def test_spelling_of_the_same_accelerator_is_one_device(exp) -> None:
    _eval_machine(exp, "grpo", lambda r: r["machine"].__setitem__("accelerator", f"  {H100.lower()} "))
    assert evidence_gate(exp).claim_allowed


def test_an_rl_arm_evaluated_elsewhere_than_its_sft_arm_answers_no_rl_over_sft(exp) -> None:
    _eval_machine(exp, "grpo_sft", lambda r: r["machine"].__setitem__("accelerator", "NVIDIA H200"))
    v = evidence_gate(exp)
    assert v.claim_allowed and not v.rl_over_sft_allowed  # grpo_sft is outside the GRPO claim
    assert (
        "'grpo_sft' was evaluated on nvidia h200, 'sft' on nvidia h100 80gb hbm3: answers of two devices"
        in v.sft_control.problems
    ), v.sft_control.problems


def test_device_key() -> None:
    assert device_key({"machine": {"accelerator": " NVIDIA H200 "}}) == "nvidia h200"
    assert device_key({"machine": {"accelerator": None, "cpu_count": 2}}) == "cpu"
    assert device_key({"machine": ["x"]}) == device_key({}) == device_key(None) == "unrecorded"
