"""Evidence gate: a complete experiment allows a claim; each missing piece blocks it with its own message."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sqlrl.artifacts import read_json, read_jsonl, write_json_atomic, write_jsonl
from sqlrl.evidence.gate import evidence_gate
from sqlrl.evidence.rundir import ExperimentError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from make_experiment import make_experiment  # noqa: E402


@pytest.fixture
def exp(tmp_path: Path) -> Path:
    """A structurally complete experiment with the synthetic flag off (the claim case)."""
    return make_experiment(tmp_path / "exp", synthetic=False)


def edit_json(path: Path, fn) -> None:
    obj = read_json(path)
    fn(obj)
    write_json_atomic(path, obj)


def failed(exp_dir: Path) -> dict[str, list[str]]:
    v = evidence_gate(exp_dir)
    assert not v.claim_allowed
    assert v.missing, "a no-claim verdict must list what is missing"
    return {c.name: c.problems for c in v.checks if not c.passed}


def only_failure(exp_dir: Path, check: str, needle: str) -> None:
    f = failed(exp_dir)
    assert set(f) == {check}, f
    assert any(needle in p for p in f[check]), f[check]
    assert any(needle in m and m.startswith(f"{check}: ") for m in evidence_gate(exp_dir).missing)


def test_complete_experiment_allows_claim(exp: Path) -> None:
    v = evidence_gate(exp)
    assert v.claim_allowed, v.missing
    assert v.missing == []
    names = [c.name for c in v.checks]
    assert names == [
        "real_run",
        "core_arms",
        "controls",
        "optimizer_steps",
        "weights_audit",
        "trajectories",
        "equal_budgets",
        "same_tasks",
        "same_fingerprint",
        "leakage_audit",
        "identities",
        "training",
        "exclusions",
        "devices",
    ]
    d = v.to_dict()
    assert d["claim_allowed"] is True and d["verdict"] == "claim"
    json.dumps(d)


T3 = ("base_t3", "grpo_t3", "no_update_t3", "validity_t3")


def test_second_turn_group_is_compared_within_itself(tmp_path: Path) -> None:
    # `sqlrl experiment` writes one full arm matrix per turn budget; budgets differ (turns) across groups.
    p = make_experiment(tmp_path / "e", synthetic=False, arms=("base", "grpo", "no_update", "validity", *T3))
    v = evidence_gate(p)
    assert v.claim_allowed, v.missing
    assert "2 turn groups" in next(c.detail for c in v.checks if c.name == "equal_budgets")


def test_lone_multi_turn_grpo_arm_blocks_claim(tmp_path: Path) -> None:
    p = make_experiment(
        tmp_path / "e", synthetic=False, arms=("base", "grpo", "no_update", "validity", "grpo_mt")
    )
    f = failed(p)
    assert set(f) == {"core_arms", "controls"}, f
    assert f["core_arms"] == [
        "arm 'grpo_mt' (turns=3) has no base arm with the same turns to compare against"
    ]
    assert (
        "control 'no_update' missing for turns=3: arm 'grpo_mt' has no 'no_update' arm with the same turns"
        in (f["controls"])
    )


def test_multi_turn_group_missing_control(tmp_path: Path) -> None:
    arms = ("base", "grpo", "no_update", "validity", "base_t3", "grpo_t3", "no_update_t3")
    p = make_experiment(tmp_path / "e", synthetic=False, arms=arms)
    only_failure(p, "controls", "control 'validity' missing for turns=3: arm 'grpo_t3' has no 'validity' arm")


@pytest.mark.parametrize("flag", ["synthetic", "smoke", "partial"])
def test_flags_never_claim(tmp_path: Path, flag: str) -> None:
    p = make_experiment(
        tmp_path / "e", synthetic=flag == "synthetic", smoke=flag == "smoke", partial=flag == "partial"
    )
    only_failure(p, "real_run", f"{flag} run")


def test_default_fixture_is_synthetic(tmp_path: Path) -> None:
    p = make_experiment(tmp_path / "e")
    assert read_json(p / "experiment.json")["synthetic"] is True
    only_failure(p, "real_run", "synthetic runs never become claims")


def test_smoke_flag_in_run_json(exp: Path) -> None:
    edit_json(exp / "arms/grpo/train/run.json", lambda o: o.update(smoke=True))
    only_failure(exp, "real_run", "arm 'grpo' train run.json has \"smoke\": true")


def test_no_steps_file(exp: Path) -> None:
    (exp / "arms/grpo/train/steps.jsonl").unlink()
    only_failure(exp, "optimizer_steps", "arm 'grpo': arms/grpo/train/steps.jsonl missing or unreadable")


def test_zero_steps(exp: Path) -> None:
    (exp / "arms/grpo/train/steps.jsonl").write_text("")
    only_failure(exp, "optimizer_steps", "arm 'grpo': 0 optimizer steps")


def test_zero_grad_norms(exp: Path) -> None:
    path = exp / "arms/grpo/train/steps.jsonl"
    write_jsonl(path, [dict(s, grad_norm=0.0) for s in read_jsonl(path)])
    only_failure(exp, "optimizer_steps", "arm 'grpo': all 12 grad norms are zero")


def test_skipped_nonfinite_step_is_disclosed_not_blocking(exp: Path) -> None:
    path = exp / "arms/grpo/train/steps.jsonl"
    steps = list(read_jsonl(path))
    steps[4].update(grad_norm=None, skipped_nonfinite=True, update_applied=False)
    write_jsonl(path, steps)
    v = evidence_gate(exp)
    check = next(c for c in v.checks if c.name == "optimizer_steps")
    assert check.passed and "grpo=11" in check.detail and "non-finite" in check.detail
    # a skipped step that claims its update was applied is not excused
    steps[4]["update_applied"] = True
    write_jsonl(path, steps)
    only_failure(exp, "optimizer_steps", "grad_norm not recorded in 1 of 12 steps")


def test_grad_norm_not_recorded(exp: Path) -> None:
    path = exp / "arms/grpo/train/steps.jsonl"
    steps = list(read_jsonl(path))
    for s in steps[:3]:
        del s["grad_norm"]
    write_jsonl(path, steps)
    only_failure(exp, "optimizer_steps", "arm 'grpo': grad_norm not recorded in 3 of 12 steps")


@pytest.mark.parametrize(
    "key,needle",
    [
        ("trained_changed", "GRPO weights did not change (trained_changed=false)"),
        (
            "no_update_identical",
            "No-update weights are not bit-identical to the base (no_update_identical=false)",
        ),
        (
            "reloaded_identity",
            "reloaded weights do not match the evaluated identity (reloaded_identity=false)",
        ),
    ],
)
def test_weight_audit_verdict_failed(exp: Path, key: str, needle: str) -> None:
    def fail(o: dict) -> None:
        o["verdicts"][key] = False
        o["passed"] = False

    edit_json(exp / "weights_audit.json", fail)
    only_failure(exp, "weights_audit", needle)
    assert any("passed=false" in m for m in evidence_gate(exp).missing)


def test_weight_audit_verdict_undetermined(exp: Path) -> None:
    edit_json(exp / "weights_audit.json", lambda o: o["verdicts"].update(no_update_identical=None))
    only_failure(exp, "weights_audit", "weight audit verdict 'no_update_identical' was not determined (null)")


def test_weight_audit_missing(exp: Path) -> None:
    (exp / "weights_audit.json").unlink()
    only_failure(exp, "weights_audit", "weights_audit.json missing")


def test_weight_audit_passed_false_alone(exp: Path) -> None:
    edit_json(exp / "weights_audit.json", lambda o: o.update(passed=False))
    only_failure(exp, "weights_audit", "weight audit did not pass (passed=false)")


def test_missing_trajectories(exp: Path) -> None:
    (exp / "arms/no_update/eval/trajectories.jsonl").unlink()
    only_failure(
        exp,
        "trajectories",
        "arm 'no_update': raw trajectories missing (arms/no_update/eval/trajectories.jsonl)",
    )


def test_empty_trajectories(exp: Path) -> None:
    (exp / "arms/grpo/eval/trajectories.jsonl").write_text("")
    only_failure(exp, "trajectories", "arm 'grpo': arms/grpo/eval/trajectories.jsonl is empty")


def test_trajectory_count_mismatch(exp: Path) -> None:
    path = exp / "arms/base/eval/trajectories.jsonl"
    write_jsonl(path, list(read_jsonl(path))[:-2])
    only_failure(
        exp,
        "trajectories",
        "arm 'base': 57 trajectories but 59 rolled-out results (1 excluded before the rollout)",
    )


@pytest.mark.parametrize("control", ["no_update", "validity"])
def test_missing_control_arm(exp: Path, control: str) -> None:
    edit_json(exp / "experiment.json", lambda o: o["arms"].pop(control))
    only_failure(
        exp, "controls", f"control '{control}' missing: no arm of kind '{control}' in experiment.json"
    )


def test_control_without_train_run(exp: Path) -> None:
    (exp / "arms/validity/train/run.json").unlink()
    only_failure(exp, "controls", "control 'validity': train run missing (arms/validity/train/run.json)")


def test_control_without_eval_run(exp: Path) -> None:
    (exp / "arms/no_update/eval/run.json").unlink()
    only_failure(exp, "controls", "control 'no_update': eval run missing")


def test_missing_grpo_arm(exp: Path) -> None:
    edit_json(exp / "experiment.json", lambda o: o["arms"].pop("grpo"))
    f = failed(exp)
    assert "no arm of kind 'grpo' in experiment.json" in f["core_arms"]
    assert "no arm of kind 'grpo' to check for optimizer steps" in f["optimizer_steps"]


def test_unequal_budgets_names_arm_and_field(exp: Path) -> None:
    edit_json(exp / "experiment.json", lambda o: o["arms"]["grpo"]["budgets"].update(max_new_tokens=512))
    for name in ("run.json", "summary.json"):
        edit_json(exp / "arms/grpo/eval" / name, lambda o: o["budgets"].update(max_new_tokens=512))
    only_failure(exp, "equal_budgets", "budgets differ: arm 'grpo' vs 'base' in max_new_tokens (512 vs 256)")


def test_eval_budgets_differ_from_declared(exp: Path) -> None:
    for name in ("run.json", "summary.json"):
        edit_json(exp / "arms/validity/eval" / name, lambda o: o["budgets"].update(timeout_s=30.0))
    only_failure(
        exp,
        "equal_budgets",
        "arm 'validity': eval run used budgets that differ from experiment.json in timeout_s (30.0 vs 5.0)",
    )


def test_unequal_turns_budget_within_group(exp: Path) -> None:
    edit_json(exp / "experiment.json", lambda o: o["arms"]["validity"]["budgets"].update(turns=2))
    for name in ("run.json", "summary.json"):
        edit_json(exp / "arms/validity/eval" / name, lambda o: o["budgets"].update(turns=2))
    only_failure(exp, "equal_budgets", "budgets differ: arm 'validity' vs 'base' in turns (2 vs 1)")


def test_unfinished_training_is_partial(exp: Path) -> None:
    edit_json(exp / "arms/grpo/train/run.json", lambda o: o.update(status="stopped"))
    only_failure(
        exp,
        "real_run",
        "partial run: arm 'grpo' train run.json status is 'stopped' (training did not finish)",
    )


def test_different_fingerprint(exp: Path) -> None:
    for name in ("run.json", "summary.json"):
        edit_json(exp / "arms/grpo/eval" / name, lambda o: o.update(fingerprint="0" * 64))
    only_failure(exp, "same_fingerprint", "dataset fingerprint differs: arm 'grpo' has 000000000000")


def test_different_task_sets(exp: Path) -> None:
    for name in ("results.jsonl", "trajectories.jsonl"):
        path = exp / "arms/validity/eval" / name
        write_jsonl(path, list(read_jsonl(path))[:-1])
    only_failure(
        exp,
        "same_tasks",
        "task sets differ: arm 'validity' vs experiment.json tasks: 1 missing (e.g. dev/00059)",
    )


def test_different_task_sets_without_declared_list(exp: Path) -> None:
    edit_json(exp / "experiment.json", lambda o: o.pop("tasks"))
    for name in ("results.jsonl", "trajectories.jsonl"):
        path = exp / "arms/grpo/eval" / name
        recs = list(read_jsonl(path))
        for r in recs:
            if r["task_id"] == "dev/00005":
                r["task_id"] = "dev/99999"
        write_jsonl(path, recs)
    only_failure(
        exp,
        "same_tasks",
        "task sets differ: arm 'grpo' vs arm 'base': 1 missing (e.g. dev/00005), 1 extra (e.g. dev/99999)",
    )


def test_leakage_failed(exp: Path) -> None:
    edit_json(
        exp / "leakage.json", lambda o: o.update(passed=False, first_difference={"task_id": "dev/00003"})
    )
    only_failure(exp, "leakage_audit", "leakage audit failed (passed=false) (first difference:")


def test_leakage_missing(exp: Path) -> None:
    (exp / "leakage.json").unlink()
    only_failure(exp, "leakage_audit", "leakage.json missing")


def test_unfinished_experiment_is_partial(exp: Path) -> None:
    edit_json(exp / "experiment.json", lambda o: o.update(started="2025-01-01T00:00:00"))
    only_failure(exp, "real_run", "partial run: experiment.json has no 'finished' timestamp")


def test_experiment_with_no_finished_arms_is_no_claim_not_bad_folder(tmp_path: Path) -> None:
    write_json_atomic(tmp_path / "experiment.json", {"name": "x", "arms": {}, "started": "2025-01-01"})
    f = failed(tmp_path)
    assert "no arm of kind 'base' in experiment.json" in f["core_arms"]
    assert "weights_audit.json missing: the weight audit was not run" in f["weights_audit"]
    from sqlrl.evidence.report import write_report

    text = Path(write_report(tmp_path, n_boot=100)["html"]).read_text(encoding="utf-8")
    assert "NO CLAIM" in text


def test_bad_folders(tmp_path: Path) -> None:
    with pytest.raises(ExperimentError):
        evidence_gate(tmp_path / "nope")
    with pytest.raises(ExperimentError):
        evidence_gate(tmp_path)  # no experiment.json
    (tmp_path / "experiment.json").write_text("{not json")
    with pytest.raises(ExperimentError):
        evidence_gate(tmp_path)


# ---- CLI exit codes -------------------------------------------------------------------------------------


def sqlrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sqlrl.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_check_exit_codes(tmp_path: Path) -> None:
    good = make_experiment(tmp_path / "good", synthetic=False)
    r = sqlrl("report", str(good), "--check")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["claim_allowed"] is True
    assert not (good / "report.html").exists(), "--check writes nothing"

    synth = make_experiment(tmp_path / "synth")
    r = sqlrl("report", str(synth), "--check")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert out["claim_allowed"] is False and out["verdict"] == "no claim"
    assert any("synthetic run" in m for m in out["missing"])

    for bad in (tmp_path / "missing", tmp_path / "empty"):
        if bad.name == "empty":
            bad.mkdir()
        r = sqlrl("report", str(bad), "--check")
        assert r.returncode == 2
        assert "sqlrl report:" in r.stderr


def test_cli_report_exit_codes(tmp_path: Path) -> None:
    good = make_experiment(tmp_path / "good", synthetic=False)
    r = sqlrl("report", str(good), "--n-boot", "500")
    assert r.returncode == 0, r.stderr
    assert (
        (good / "report.html").is_file()
        and (good / "verdict.json").is_file()
        and (good / "report.md").is_file()
    )

    synth = make_experiment(tmp_path / "synth")
    out = tmp_path / "out"
    r = sqlrl("report", str(synth), "--out", str(out), "--n-boot", "500")
    assert r.returncode == 1, r.stderr
    assert "NO CLAIM" in (out / "report.html").read_text()
    assert read_json(out / "verdict.json")["claim_allowed"] is False

    r = sqlrl("report", str(tmp_path / "missing"))
    assert r.returncode == 2


def test_gate_and_report_do_not_import_torch() -> None:
    code = "import sys, sqlrl.evidence.gate, sqlrl.evidence.report, sqlrl.evidence.seeds; assert 'torch' not in sys.modules, 'torch imported'"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


KINDS = ("base", "grpo", "no_update", "validity")
CTX = tuple(f"{k}_c{c}" for c in (2048, 4096) for k in KINDS)  # `experiment.context_tokens = [2048, 4096]`


def test_context_cells_are_compared_within_themselves(tmp_path: Path) -> None:
    # budgets differ (max_context_tokens) across the two cells of turns 1, and agree within each
    p = make_experiment(tmp_path / "e", synthetic=False, arms=CTX)
    v = evidence_gate(p)
    assert v.claim_allowed, v.missing
    assert "2 cells (turns, context)" in next(c.detail for c in v.checks if c.name == "equal_budgets")
    edit_json(p / "experiment.json", lambda o: o["arms"]["validity_c4096"]["budgets"].update(turns=2))
    for name in ("run.json", "summary.json"):
        edit_json(p / "arms/validity_c4096/eval" / name, lambda o: o["budgets"].update(turns=2))
    only_failure(p, "equal_budgets", "budgets differ: arm 'validity_c4096' vs 'base_c4096' in turns (2 vs 1)")


def test_context_cell_missing_control_or_base(tmp_path: Path) -> None:
    p = make_experiment(tmp_path / "e", synthetic=False, arms=tuple(a for a in CTX if a != "validity_c4096"))
    only_failure(
        p,
        "controls",
        "control 'validity' missing for turns=1, context_tokens=4096: arm 'grpo_c4096' has no 'validity' "
        "arm with the same turns and context length",
    )
    p = make_experiment(tmp_path / "f", synthetic=False, arms=tuple(a for a in CTX if a != "base_c4096"))
    f = failed(p)
    assert f["core_arms"] == [
        "arm 'grpo_c4096' (turns=1, context_tokens=4096) has no base arm with the same turns and context "
        "length to compare against"
    ]


def test_context_cell_needs_its_own_sft_control(tmp_path: Path) -> None:
    from sqlrl.evidence.gate import check_sft_control
    from sqlrl.evidence.rundir import Experiment

    p = make_experiment(tmp_path / "e", synthetic=False, arms=(*CTX, "sft_c2048"))
    assert check_sft_control(Experiment(p)).problems == [
        "arm 'grpo_c4096' (turns=1, context_tokens=4096) has no sft arm with the same turns and context length"
    ]
