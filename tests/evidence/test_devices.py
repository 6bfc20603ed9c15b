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
        (
            "grpo",
            lambda r: r["machine"].__setitem__("accelerator", "NVIDIA H200"),
            "nvidia h200 (torch 2.11.0+cu130, cuda 13.0): grpo",
        ),
        ("validity", lambda r: r.pop("machine"), "unrecorded: validity"),
        (
            "no_update",
            lambda r: r["machine"].pop("accelerator"),
            "cpu (torch 2.11.0+cu130, cuda 13.0): no_update",
        ),
        (
            "base",
            lambda r: r["machine"].__setitem__("accelerator", "NVIDIA A100"),
            "nvidia a100 (torch 2.11.0+cu130, cuda 13.0): base",
        ),
    ],
)
def test_a_grpo_arm_or_control_evaluated_on_another_device_refuses_the_claim(exp, arm, change, said) -> None:
    _eval_machine(exp, arm, change)
    v = evidence_gate(exp)
    assert not v.claim_allowed
    (problem,) = _devices(v)["problems"]
    assert problem.startswith("arm 'grpo' and its controls (turns=1) were evaluated on 2 devices (")
    assert said in problem and "nvidia h100 80gb hbm3 (torch 2.11.0+cu130, cuda 13.0): " in problem, problem
    assert problem.endswith("greedy answers differ between devices")


def test_spelling_of_the_same_accelerator_is_one_device(exp) -> None:
    _eval_machine(exp, "grpo", lambda r: r["machine"].__setitem__("accelerator", f"  {H100.lower()} "))
    assert evidence_gate(exp).claim_allowed


def test_an_rl_arm_evaluated_elsewhere_than_its_sft_arm_answers_no_rl_over_sft(exp) -> None:
    _eval_machine(exp, "grpo_sft", lambda r: r["machine"].__setitem__("accelerator", "NVIDIA H200"))
    v = evidence_gate(exp)
    assert v.claim_allowed and not v.rl_over_sft_allowed  # grpo_sft is outside the GRPO claim
    assert (
        "'grpo_sft' was evaluated on nvidia h200 (torch 2.11.0+cu130, cuda 13.0), 'sft' on nvidia h100 80gb hbm3 (torch 2.11.0+cu130, cuda 13.0): answers of two devices"
        in v.sft_control.problems
    ), v.sft_control.problems


def test_another_software_stack_on_the_same_gpu_is_another_device(exp) -> None:
    _eval_machine(exp, "grpo", lambda r: r["machine"].__setitem__("torch", "2.4.0+cu121"))
    (problem,) = _devices(evidence_gate(exp))["problems"]
    assert "nvidia h100 80gb hbm3 (torch 2.4.0+cu121, cuda 13.0): grpo" in problem


def test_each_cell_is_checked_on_its_own(tmp_path) -> None:
    """A turns=1 cell on one GPU and a turns=3 cell on another: each compares its own arms, so the claim
    stands; a control of the turns=3 cell on a third GPU refuses it, naming that cell."""
    from make_experiment import make_experiment

    arms = ("base", "grpo", "no_update", "validity", "base_t3", "grpo_t3", "no_update_t3", "validity_t3")
    exp = make_experiment(tmp_path / "cells", synthetic=False, arms=arms)
    for arm in arms[4:]:
        _eval_machine(exp, arm, lambda r: r["machine"].__setitem__("accelerator", "NVIDIA H100"))
    v = evidence_gate(exp)
    assert _devices(v)["passed"] and v.claim_allowed, v.missing
    _eval_machine(exp, "validity_t3", lambda r: r["machine"].__setitem__("accelerator", "NVIDIA A100"))
    (problem,) = _devices(evidence_gate(exp))["problems"]
    assert problem.startswith("arm 'grpo_t3' and its controls (turns=3) were evaluated on 2 devices"), problem


def test_device_key() -> None:
    assert device_key({"machine": {"accelerator": " NVIDIA H200 ", "torch": "2.11", "cuda": "13.0"}}) == (
        "nvidia h200 (torch 2.11, cuda 13.0)"
    )
    assert device_key({"machine": {"accelerator": None, "cpu_count": 2}}) == "cpu (torch ?, cuda ?)"
    assert device_key({"machine": ["x"]}) == device_key({}) == device_key(None) == "unrecorded"
