"""The SFT-only control: the claim "RL adds value over supervised fine-tuning" needs an `sft` arm.

Synthetic experiment folders (tests/fixtures/make_experiment.py: every trained arm 12 steps x 30 s =
6.00 min) and one committed result folder, which must still load and report.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sqlrl.artifacts import read_json, write_json_atomic
from sqlrl.evidence.analysis import analyze, sft_comparisons
from sqlrl.evidence.gate import SFT_MISSING, evidence_gate
from sqlrl.evidence.report import write_report

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from make_experiment import MACHINE_GPU, make_experiment  # noqa: E402

CORE = ("base", "grpo", "no_update", "validity")
REPO = Path(__file__).resolve().parents[2]


def test_without_sft_arm_the_grpo_claim_stands_and_rl_over_sft_is_refused(tmp_path: Path) -> None:
    v = evidence_gate(make_experiment(tmp_path / "e", synthetic=False, arms=CORE))
    assert v.claim_allowed and not v.rl_over_sft_allowed
    assert v.rl_over_sft_line == "no SFT control: whether RL beats SFT is not answered" == SFT_MISSING
    d = v.to_dict()
    assert d["verdict"] == "claim" and d["rl_over_sft"] == {
        "allowed": False,
        "line": SFT_MISSING,
        "problems": [SFT_MISSING],
    }


def test_committed_result_without_sft_still_claims_and_gains_the_line() -> None:
    v = evidence_gate(REPO / "results" / "2026-12-01-spider-0.5b-single-turn-seed3")
    assert v.claim_allowed and v.to_dict()["rl_over_sft"]["line"] == SFT_MISSING


def test_sft_arm_with_at_least_grpo_time_allows_the_rl_over_sft_claim(tmp_path: Path) -> None:
    v = evidence_gate(make_experiment(tmp_path / "e", synthetic=False, arms=(*CORE, "sft")))
    assert v.claim_allowed and v.rl_over_sft_allowed
    assert v.sft_control.detail == (
        "sft control present for every RL arm; sft 6.00 min >= grpo 6.00 min of training on GPU: SYNTHETIC H200"
    )
    assert v.rl_over_sft_line.startswith("RL over SFT: may be claimed (")


def test_grpo_sft_from_the_sft_arm_counts_both_parts_and_can_never_match(tmp_path: Path) -> None:
    # grpo_sft started from the sft arm's final weights: 6.00 min of SFT + 6.00 min of GRPO = 12.00 min
    # of training against the control's 6.00 min; raising sft.steps raises both sides
    v = evidence_gate(make_experiment(tmp_path / "e", synthetic=False, arms=(*CORE, "sft", "grpo_sft")))
    assert v.claim_allowed and not v.rl_over_sft_allowed
    assert v.sft_control.problems == [
        "arm 'sft' trained 6.00 min, less than 'grpo_sft' in total (12.00 min = SFT part 6.00 min in "
        "arms/sft/train + GRPO part 6.00 min): not an equal-time control; grpo_sft started from the 'sft' "
        "arm's own weights, so no sft.steps can match it: set sft.init_steps > 0 (grpo_sft then runs its "
        "own SFT stage) and size sft.steps to the total"
    ]
    assert v.rl_over_sft_line.startswith("RL over SFT: no claim: arm 'sft' trained 6.00 min, less than")


def _own_stage(p: Path, seconds: float | None, *, declare: str = "experiment") -> None:
    """Give grpo_sft its own SFT stage (arms/grpo_sft/sft_init, 5 steps, `seconds` of training, on the
    fixture's GPU) and the sft arm's run.json its 12 steps; the stage is declared in experiment.json or in the train run.json."""
    if seconds is not None:
        write_json_atomic(
            p / "arms/grpo_sft/sft_init/run.json",
            {
                "kind": "sft",
                "status": "finished",
                "steps": 5,
                "train_seconds": seconds,
                "machine": MACHINE_GPU,
            },
        )
    if declare == "experiment":
        e = read_json(p / "experiment.json")
        e["arms"]["grpo_sft"]["init_run"] = "arms/grpo_sft/sft_init"
        write_json_atomic(p / "experiment.json", e)
    else:
        run = read_json(p / "arms/grpo_sft/train/run.json")
        run["init_sft"] = {"run": "arms/grpo_sft/sft_init", "train_seconds": seconds}
        write_json_atomic(p / "arms/grpo_sft/train/run.json", run)
    run = read_json(p / "arms/sft/train/run.json")
    write_json_atomic(p / "arms/sft/train/run.json", {**run, "steps": 12})


def _sft_seconds(p: Path, seconds: float) -> None:
    run = read_json(p / "arms/sft/train/run.json")
    write_json_atomic(p / "arms/sft/train/run.json", {**run, "train_seconds": seconds})


def test_grpo_sft_with_its_own_stage_needs_a_control_as_long_as_both_parts(tmp_path: Path) -> None:
    p = make_experiment(tmp_path / "e", synthetic=False, arms=(*CORE, "sft", "grpo_sft"))
    _own_stage(p, 150.0)  # stage 2.50 min + GRPO 6.00 min = 8.50 min; the control: 12 steps of 30 s
    v = evidence_gate(p)
    assert not v.rl_over_sft_allowed and v.sft_control.problems == [
        "arm 'sft' trained 6.00 min, less than 'grpo_sft' in total (8.50 min = SFT part 2.50 min in "
        "arms/grpo_sft/sft_init + GRPO part 6.00 min): not an equal-time control; raise sft.steps to at "
        "least 17 (30.00 s a step in 'sft')"
    ]
    _sft_seconds(p, 509.0)  # one second short of 510
    assert evidence_gate(p).sft_control.problems[0].startswith("arm 'sft' trained 8.48 min, less than")
    _sft_seconds(p, 510.0)  # exactly the total
    v = evidence_gate(p)
    assert v.rl_over_sft_allowed and v.sft_control.detail == (
        "sft control present for every RL arm; sft 8.50 min >= grpo 6.00 min, sft 8.50 min >= grpo_sft "
        "8.50 min (SFT part 2.50 + GRPO part 6.00) of training on GPU: SYNTHETIC H200"
    )


def test_grpo_sft_stage_recorded_in_its_run_json_or_missing(tmp_path: Path) -> None:
    p = make_experiment(tmp_path / "e", synthetic=False, arms=(*CORE, "sft", "grpo_sft"))
    _own_stage(p, 150.0, declare="run")
    _sft_seconds(p, 600.0)
    assert evidence_gate(p).rl_over_sft_allowed
    (p / "arms/grpo_sft/sft_init/run.json").unlink()
    assert evidence_gate(p).sft_control.problems == [
        "arm 'grpo_sft': the training time of the SFT run it started from is not recorded "
        "(arms/grpo_sft/sft_init/run.json train_seconds), so its total is unknown"
    ]


def test_sft_arm_trained_less_than_grpo_is_not_an_equal_time_control(tmp_path: Path) -> None:
    p = make_experiment(tmp_path / "e", synthetic=False, arms=(*CORE, "sft"))
    run = read_json(p / "arms/sft/train/run.json")
    write_json_atomic(p / "arms/sft/train/run.json", {**run, "train_seconds": 90.0})
    v = evidence_gate(p)
    assert v.claim_allowed and not v.rl_over_sft_allowed
    assert v.sft_control.problems == [
        "arm 'sft' trained 1.50 min, less than 'grpo' (6.00 min): not an equal-time control; raise sft.steps"
    ]
    assert v.rl_over_sft_line.startswith("RL over SFT: no claim: arm 'sft' trained 1.50 min")
    write_json_atomic(p / "arms/sft/train/run.json", {**run, "weights_changed": False})
    assert evidence_gate(p).sft_control.problems == [
        "arm 'sft': weights did not change (train run.json weights_changed=false)"
    ]


def test_sft_arm_without_eval_or_in_another_turn_group_is_refused(tmp_path: Path) -> None:
    p = make_experiment(tmp_path / "e", synthetic=False, arms=(*CORE, "sft", "grpo_t3"))
    (p / "arms/sft/eval/results.jsonl").unlink()
    problems = evidence_gate(p).sft_control.problems
    assert "arm 'grpo_t3' (turns=3) has no sft arm with the same turns" in problems
    assert any(x.startswith("arm 'sft': eval run missing") for x in problems)


def test_the_gate_failing_elsewhere_refuses_rl_over_sft_too(tmp_path: Path) -> None:
    p = make_experiment(tmp_path / "e", synthetic=True, arms=(*CORE, "sft"))
    v = evidence_gate(p)
    assert v.sft_control.passed and not v.claim_allowed and not v.rl_over_sft_allowed
    assert v.rl_over_sft_line == "RL over SFT: no claim: the evidence gate did not pass (see missing)"


def test_report_compares_every_rl_arm_with_sft(tmp_path: Path) -> None:
    p = make_experiment(tmp_path / "e", synthetic=False, arms=(*CORE, "sft", "grpo_sft"))
    a = analyze(p, n_boot=200)
    rows = sft_comparisons(a)
    assert [(r["b"], r["a"]) for r in rows] == [("grpo", "sft"), ("grpo_sft", "sft")]
    assert all(r["available"] and isinstance(r["p_value"], float) for r in rows)
    write_report(p, n_boot=200)
    md = (p / "report.md").read_text(encoding="utf-8")
    assert "## RL vs supervised fine-tuning (SFT-only control)" in md
    assert "| grpo vs sft |" in md and "| grpo_sft vs sft |" in md
    assert "| 6.00 / 6.00 |" in md and "| 12.00 (6.00 + 6.00) / 6.00 |" in md  # RL total = SFT + GRPO
    assert read_json(p / "verdict.json")["rl_over_sft"]["allowed"] is False
    write_report(q := make_experiment(tmp_path / "f", synthetic=False, arms=CORE), n_boot=200)
    md = (q / "report.md").read_text(encoding="utf-8")
    assert f"**{SFT_MISSING}**" in md and "RL vs supervised" not in md


def test_sft_reading_needs_p_below_001_and_the_ci_on_one_side() -> None:
    def reading(p, lo, hi):
        row = {"a": "sft", "b": "grpo", "available": True, "p_value": p, "ci_low": lo, "ci_high": hi}
        arms = [{"name": "sft", "kind": "sft"}, {"name": "grpo", "kind": "grpo"}]
        return sft_comparisons({"arms": arms, "comparisons": [row]})[0]["reading"]

    assert reading(0.001, 0.02, 0.10) == "RL better than SFT (p < 0.01)"
    assert reading(0.001, -0.10, -0.02) == "SFT better than RL (p < 0.01)"
    assert reading(0.02, 0.01, 0.10) == "no difference at p < 0.01"
    assert reading(0.001, -0.01, 0.10) == "no difference at p < 0.01"


def test_committed_sft_then_grpo_probe_is_refused_by_time() -> None:
    # results/2026-12-02-spider-0.5b-sft-grpo100: sft 264.14 s; grpo_sft 308.41 s of GRPO from its weights
    v = evidence_gate(REPO / "results" / "2026-12-02-spider-0.5b-sft-grpo100")
    assert v.sft_control.problems == [
        "arm 'sft' trained 4.40 min, less than 'grpo_sft' in total (9.54 min = SFT part 4.40 min in "
        "arms/sft/train + GRPO part 5.14 min): not an equal-time control; grpo_sft started from the 'sft' "
        "arm's own weights, so no sft.steps can match it: set sft.init_steps > 0 (grpo_sft then runs its "
        "own SFT stage) and size sft.steps to the total"
    ]


H100 = {**MACHINE_GPU, "accelerator": "SYNTHETIC H100"}


def _machine(p: Path, run: str, machine: dict | None, device: str | None = "cuda") -> None:
    """Set (or, with None, drop) the machine and device a run.json records."""
    r = read_json(p / run / "run.json")
    r.pop("machine", None)
    r.update({"machine": machine} if machine is not None else {})
    r.update({"device": device} if device is not None else {})
    write_json_atomic(p / run / "run.json", r)


def test_runs_on_different_devices_are_not_compared_by_time(tmp_path: Path) -> None:
    # the measured case: grpo_sft (own SFT stage + GRPO) on an H100, the sft control on an H200; the
    # control trained 6.00 min < 8.50 min, yet the time line is not given: the times are not comparable
    p = make_experiment(tmp_path / "e", synthetic=False, arms=(*CORE, "sft", "grpo_sft"))
    _own_stage(p, 150.0)
    _machine(p, "arms/grpo_sft/sft_init", H100)
    _machine(p, "arms/grpo_sft/train", H100)
    v = evidence_gate(p)
    assert v.claim_allowed and not v.rl_over_sft_allowed
    want = (
        "'sft' vs 'grpo_sft': trained on different devices (arms/sft/train on GPU: SYNTHETIC H200; "
        "arms/grpo_sft/train on GPU: SYNTHETIC H100; arms/grpo_sft/sft_init on GPU: SYNTHETIC H100), and "
        "training times on different devices are not comparable: train 'sft' on the device 'grpo_sft' "
        "trained on (GPU: SYNTHETIC H100), or train all of these runs on one device"
    )
    assert v.sft_control.problems == [want]
    assert v.rl_over_sft_line == "RL over SFT: no claim: " + want
    _sft_seconds(p, 600.0)  # longer than the total: still refused, time cannot fix a device mismatch
    assert evidence_gate(p).sft_control.problems == [want]
    _machine(p, "arms/sft/train", H100)  # the control on grpo_sft's device: time decides, and passes
    _machine(p, "arms/grpo/train", H100)
    v = evidence_gate(p)
    assert v.rl_over_sft_allowed and v.sft_control.detail.endswith("of training on GPU: SYNTHETIC H100")


def test_an_rl_arm_split_over_two_devices_or_without_one_is_refused(tmp_path: Path) -> None:
    p = make_experiment(tmp_path / "e", synthetic=False, arms=(*CORE, "sft", "grpo_sft"))
    _own_stage(p, 150.0)
    _sft_seconds(p, 600.0)
    _machine(p, "arms/grpo_sft/sft_init", H100)  # its SFT stage on an H100, its GRPO part on the H200
    assert evidence_gate(p).sft_control.problems == [
        "'sft' vs 'grpo_sft': trained on different devices (arms/sft/train on GPU: SYNTHETIC H200; "
        "arms/grpo_sft/train on GPU: SYNTHETIC H200; arms/grpo_sft/sft_init on GPU: SYNTHETIC H100), and "
        "training times on different devices are not comparable: train all of these runs on one device"
    ]
    _machine(p, "arms/grpo_sft/sft_init", None, device=None)
    assert evidence_gate(p).sft_control.problems == [
        "'sft' vs 'grpo_sft': the device of arms/grpo_sft/sft_init is not recorded (run.json machine), so "
        "the training times cannot be compared; train the runs on one device with sqlrl, which records it"
    ]
    _machine(p, "arms/grpo_sft/sft_init", {**MACHINE_GPU, "accelerator": None})  # cuda without a GPU name
    assert "the device of arms/grpo_sft/sft_init is not recorded" in evidence_gate(p).sft_control.problems[0]


def _sessions(p: Path, run: str, *entries: tuple) -> None:
    """Give a run.json its `machines`: ((first step, last step), machine) per invocation, on CUDA."""
    r = read_json(p / run / "run.json")
    r["machines"] = [{"steps": list(steps), "machine": m, "device": "cuda"} for steps, m in entries]
    write_json_atomic(p / run / "run.json", r)


def test_a_run_resumed_on_another_gpu_model_trained_on_two_devices(tmp_path: Path) -> None:
    # the control's run.json `machine` is its last session's (the H200 grpo trained on); its `machines`
    # say steps 1-6 ran on an H100
    p = make_experiment(tmp_path / "e", synthetic=False, arms=(*CORE, "sft"))
    _sessions(p, "arms/sft/train", ((1, 6), H100), ((7, 12), MACHINE_GPU))
    assert evidence_gate(p).sft_control.problems == [
        "'sft' vs 'grpo': trained on different devices (arms/sft/train on GPU: SYNTHETIC H100 (steps 1-6) + "
        "GPU: SYNTHETIC H200 (steps 7-12); arms/grpo/train on GPU: SYNTHETIC H200), and training times on "
        "different devices are not comparable: train 'sft' on the device 'grpo' trained on (GPU: SYNTHETIC "
        "H200), or train all of these runs on one device"
    ]
    # both sessions on the GPU model grpo trained on (another host): one device, time decides
    _sessions(p, "arms/sft/train", ((1, 6), {**MACHINE_GPU, "hostname": "other"}), ((7, 12), MACHINE_GPU))
    v = evidence_gate(p)
    assert v.rl_over_sft_allowed and v.sft_control.detail.endswith("of training on GPU: SYNTHETIC H200")
    # the RL arm split over two devices: no one device to train the control on
    _sessions(p, "arms/grpo/train", ((1, 6), MACHINE_GPU), ((7, 12), H100))
    assert evidence_gate(p).sft_control.problems == [
        "'sft' vs 'grpo': trained on different devices (arms/sft/train on GPU: SYNTHETIC H200; "
        "arms/grpo/train on GPU: SYNTHETIC H200 (steps 1-6) + GPU: SYNTHETIC H100 (steps 7-12)), and "
        "training times on different devices are not comparable: train all of these runs on one device"
    ]
    # the control split the same way: still refused, a run on two devices is comparable with none
    _sessions(p, "arms/sft/train", ((1, 6), MACHINE_GPU), ((7, 12), H100))
    assert (
        evidence_gate(p).sft_control.problems[0].startswith("'sft' vs 'grpo': trained on different devices")
    )
    # the same GPU model, another count in one session
    _sessions(p, "arms/grpo/train", ((1, 12), {**MACHINE_GPU, "gpu_count": 1}))
    _sessions(
        p,
        "arms/sft/train",
        ((1, 6), {**MACHINE_GPU, "gpu_count": 1}),
        ((7, 12), {**MACHINE_GPU, "gpu_count": 2}),
    )
    assert "(steps 1-6) + GPU: 2× SYNTHETIC H200 (steps 7-12)" in evidence_gate(p).sft_control.problems[0]
    # a session whose GPU is not named: the run's device is not recorded
    _sessions(p, "arms/sft/train", ((1, 6), {**MACHINE_GPU, "accelerator": None}), ((7, 12), MACHINE_GPU))
    assert "the device of arms/sft/train is not recorded" in evidence_gate(p).sft_control.problems[0]


def test_plain_grpo_and_cpu_runs_compare_by_device_description(tmp_path: Path) -> None:
    p = make_experiment(tmp_path / "e", synthetic=False, arms=(*CORE, "sft"))
    cpu = {
        "hostname": "h",
        "platform": "Linux-6.1-x86_64-with-glibc2.39",
        "cpu_count": 2,
        "accelerator": None,
    }
    _machine(p, "arms/grpo/train", cpu, "cpu")
    _machine(p, "arms/sft/train", {**cpu, "hostname": "other"}, "cpu")  # another host, same description
    v = evidence_gate(p)
    assert v.rl_over_sft_allowed and v.sft_control.detail.endswith("of training on CPU: 2-core x86_64")
    _machine(p, "arms/sft/train", {**cpu, "cpu_count": 16}, "cpu")
    assert evidence_gate(p).sft_control.problems == [
        "'sft' vs 'grpo': trained on different devices (arms/sft/train on CPU: 16-core x86_64; "
        "arms/grpo/train on CPU: 2-core x86_64), and training times on different devices are not "
        "comparable: train 'sft' on the device 'grpo' trained on (CPU: 2-core x86_64), or train all of "
        "these runs on one device"
    ]
    _machine(p, "arms/sft/train", {**MACHINE_GPU, "gpu_count": 2})  # same GPU, another count
    _machine(p, "arms/grpo/train", {**MACHINE_GPU, "gpu_count": 1})
    assert (
        "(arms/sft/train on GPU: 2× SYNTHETIC H200; arms/grpo/train on GPU: 1× SYNTHETIC H200)"
        in (evidence_gate(p).sft_control.problems[0])
    )
    # a time refusal on one device reads as before
    _machine(p, "arms/sft/train", MACHINE_GPU)
    _machine(p, "arms/grpo/train", MACHINE_GPU)
    _sft_seconds(p, 90.0)
    assert evidence_gate(p).sft_control.problems == [
        "arm 'sft' trained 1.50 min, less than 'grpo' (6.00 min): not an equal-time control; raise sft.steps"
    ]


def test_committed_equal_time_matrix_on_two_gpu_models_is_refused_by_device() -> None:
    # results/2026-12-02-spider-0.5b-sft-eq-seed0: sft 639.51 s on an H200; grpo_sft 262.76 s of SFT stage
    # + 383.3 s of GRPO on an H100. Minutes of two GPU models are not compared (no "raise sft.steps")
    v = evidence_gate(REPO / "results" / "2026-12-02-spider-0.5b-sft-eq-seed0")
    assert v.claim_allowed and not v.rl_over_sft_allowed
    assert v.sft_control.problems == [
        "'sft' vs 'grpo_sft': trained on different devices (arms/sft/train on GPU: NVIDIA H200; "
        "arms/grpo_sft/train on GPU: NVIDIA H100 80GB HBM3; arms/grpo_sft/sft_init on GPU: NVIDIA H100 80GB "
        "HBM3), and training times on different devices are not comparable: train 'sft' on the device "
        "'grpo_sft' trained on (GPU: NVIDIA H100 80GB HBM3), or train all of these runs on one device"
    ]
