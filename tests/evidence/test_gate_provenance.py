"""The gate's identities, training and exclusions checks (`evidence/provenance.py`): each tampering of a
complete experiment folder blocks the claim under exactly one check, with its own message."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sqlrl.artifacts import read_jsonl, write_jsonl
from sqlrl.evidence.gate import evidence_gate

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from make_experiment import make_experiment  # noqa: E402
from test_gate import edit_json, only_failure  # noqa: E402


@pytest.fixture
def exp(tmp_path: Path) -> Path:
    return make_experiment(
        tmp_path / "exp", synthetic=False, arms=("base", "grpo", "no_update", "validity", "sft")
    )


def _identity(exp: Path, arm: str) -> str:
    from sqlrl.artifacts import read_json

    return read_json(exp / f"arms/{arm}/eval/run.json")["model"]["identity"]


def test_the_untampered_folder_passes_the_three_checks(exp: Path) -> None:
    v = evidence_gate(exp)
    assert v.claim_allowed, v.missing
    assert {c.name for c in v.checks} >= {"identities", "training", "exclusions"}


# identities --------------------------------------------------------------------------------------------


def test_an_arm_that_evaluated_other_weights_than_it_trained(exp: Path) -> None:
    def other(run):
        run["model"] = {"name": "another/model-7b", "identity": "ab" * 32}

    edit_json(exp / "arms/grpo/eval/run.json", other)
    only_failure(
        exp, "identities", "arm 'grpo' evaluated weights abababababababababa, not its trained weights"
    )


def test_no_update_evaluated_with_the_trained_weights(exp: Path) -> None:
    grpo = _identity(exp, "grpo")
    edit_json(exp / "arms/no_update/eval/run.json", lambda r: r["model"].update(identity=grpo))
    only_failure(exp, "identities", "arm 'no_update' evaluated weights")


def test_no_update_whose_final_weights_are_not_the_base(exp: Path) -> None:
    other = "cd" * 32
    edit_json(exp / "arms/no_update/train/run.json", lambda r: r.update(final_identity=other))
    edit_json(exp / "arms/no_update/train/final/identity.json", lambda r: r.update(weights_hash=other))
    edit_json(exp / "arms/no_update/eval/run.json", lambda r: r["model"].update(identity=other))
    only_failure(exp, "identities", "arm 'no_update': No-update's final weights cdcdcdcd")


def test_a_trained_arm_whose_final_weights_are_the_base(exp: Path) -> None:
    base = _identity(exp, "base")
    for f, key in (("train/run.json", "final_identity"), ("train/final/identity.json", "weights_hash")):
        edit_json(exp / f"arms/validity/{f}", lambda r, k=key: r.update({k: base}))
    edit_json(exp / "arms/validity/eval/run.json", lambda r: r["model"].update(identity=base))
    only_failure(exp, "identities", "arm 'validity': its final weights are the base weights")


def test_identity_json_and_run_json_disagree(exp: Path) -> None:
    edit_json(exp / "arms/grpo/train/final/identity.json", lambda r: r.update(weights_hash="ef" * 32))
    only_failure(exp, "identities", "arm 'grpo': final/identity.json says efefef")


def test_the_base_arm_evaluated_another_model(exp: Path) -> None:
    edit_json(exp / "arms/base/eval/run.json", lambda r: r["model"].update(identity="01" * 32))
    only_failure(exp, "identities", "arm 'base' evaluated 0101")


def test_an_evaluation_without_a_model_identity(exp: Path) -> None:
    edit_json(exp / "arms/base/eval/run.json", lambda r: r.pop("model"))
    only_failure(exp, "identities", "arm 'base': its eval run.json records no model identity")


def test_a_weight_audit_of_other_weights(exp: Path) -> None:
    edit_json(exp / "weights_audit.json", lambda a: a["hashes"].update(trained="23" * 32))
    only_failure(exp, "identities", "weights_audit.json hashes.trained 2323")


def test_every_cell_of_a_weight_audit_is_checked_whatever_the_order_of_cells(tmp_path: Path) -> None:
    """A turns = [3, 1] matrix: the file's top level is the first cell run (t3); each cell's hashes must
    be a grpo / no_update arm's final identity, in any order, and a cell that audited other weights is named."""
    from sqlrl.artifacts import read_json

    arms = ("base", "grpo", "no_update", "validity", "base_t3", "grpo_t3", "no_update_t3", "validity_t3")
    exp = make_experiment(tmp_path / "exp", synthetic=False, arms=arms)
    final = {
        a: read_json(exp / f"arms/{a}/train/run.json")["final_identity"]
        for a in ("grpo_t3", "grpo", "no_update")
    }

    def cell(trained: str) -> dict:
        return {"hashes": {"base": final["no_update"], "trained": trained, "no_update": final["no_update"]}}

    edit_json(
        exp / "weights_audit.json",
        lambda a: a.update(
            cell(final["grpo_t3"]), cells={"t3": cell(final["grpo_t3"]), "t1": cell(final["grpo"])}
        ),
    )
    v = evidence_gate(exp)
    assert v.claim_allowed, v.missing
    edit_json(exp / "weights_audit.json", lambda a: a["cells"].update(t1=cell("67" * 32)))
    only_failure(exp, "identities", "weights_audit.json hashes.trained (cell t1) 6767")


def test_trajectories_of_another_model(exp: Path) -> None:
    path = exp / "arms/grpo/eval/trajectories.jsonl"
    rows = list(read_jsonl(path))
    rows[3]["model"] = {"name": "x", "identity": "45" * 32}
    rows[4]["model"] = {"name": "x", "identity": _identity(exp, "grpo")}  # its own: fine
    write_jsonl(path, rows)
    only_failure(exp, "identities", "arm 'grpo': 1 trajectories record another model identity")


# training ----------------------------------------------------------------------------------------------


def test_a_train_run_without_a_status(exp: Path) -> None:
    edit_json(exp / "arms/grpo/train/run.json", lambda r: r.pop("status"))
    only_failure(exp, "training", "arm 'grpo': its train run.json records no status")


def test_a_truncated_training_record(exp: Path) -> None:
    path = exp / "arms/validity/train/steps.jsonl"
    write_jsonl(path, list(read_jsonl(path))[:5])
    only_failure(
        exp, "training", "arm 'validity': 5 distinct steps in steps.jsonl, run.json steps 12, configured 12"
    )


def test_a_grpo_arm_that_stopped_early_and_says_so_everywhere(exp: Path) -> None:
    """steps.jsonl, run.json and the config all say 6 steps: complete, but the controls trained 12."""
    path = exp / "arms/grpo/train/steps.jsonl"
    write_jsonl(path, list(read_jsonl(path))[:6])
    edit_json(exp / "arms/grpo/train/run.json", lambda r: r.update(steps=6))
    edit_json(exp / "arms/grpo/train/config.json", lambda c: c["grpo"].update(steps=6))
    only_failure(
        exp, "training", "control 'no_update' trained with other grpo settings than 'grpo': steps 12 vs 6"
    )


@pytest.mark.parametrize(
    "arm,edit,needle",
    [
        (
            "validity",
            {"reward": "execution"},
            "arm 'validity' (kind validity) did not train with grpo.reward",
        ),
        (
            "no_update",
            {"control": "none"},
            "arm 'no_update' (kind no_update) did not train with grpo.control",
        ),
        ("grpo", {"reward": "validity"}, "arm 'grpo' (kind grpo) did not train with a task reward"),
        ("grpo", {"control": "no-update"}, "arm 'grpo' (kind grpo) did not train with a task reward"),
    ],
)
def test_a_control_that_is_not_the_treatment_its_kind_names(exp: Path, arm, edit, needle) -> None:
    edit_json(exp / f"arms/{arm}/train/config.json", lambda c: c["grpo"].update(edit))
    only_failure(exp, "training", needle)


def test_an_sft_arm_without_an_sft_table(exp: Path) -> None:
    edit_json(exp / "arms/sft/train/config.json", lambda c: c.pop("sft"))
    f = {c.name: c.problems for c in evidence_gate(exp).checks if not c.passed}
    assert set(f) == {"training"}, f
    assert any("arm 'sft' (kind sft) did not train with an [sft] table" in p for p in f["training"])


def test_train_runs_of_different_seeds(exp: Path) -> None:
    edit_json(exp / "arms/validity/train/config.json", lambda c: c["run"].update(seed=7))
    only_failure(exp, "training", "train runs differ in run.seed")


# exclusions --------------------------------------------------------------------------------------------


def _relabel(exp: Path, arm: str, n: int, status: str) -> None:
    """Turn the first n scored non-matches of `arm` into excluded rows of `status`."""
    path = exp / f"arms/{arm}/eval/results.jsonl"
    rows = list(read_jsonl(path))
    done = 0
    for r in rows:
        if done < n and r["status"] in ("mismatch", "exec_error", "no_sql", "timeout"):
            r.update(status=status, correct=None, reward=None)
            done += 1
    assert done == n
    write_jsonl(path, rows)
    return rows


def test_wrong_answers_relabelled_as_unscorable_golds(exp: Path) -> None:
    rows = _relabel(exp, "grpo", 3, "gold_unscorable")
    drop = {r["task_id"] for r in rows if r["status"] == "gold_unscorable"}
    tpath = exp / "arms/grpo/eval/trajectories.jsonl"
    write_jsonl(tpath, [t for t in read_jsonl(tpath) if t["task_id"] not in drop])
    only_failure(exp, "exclusions", "arms exclude different tasks as gold_unscorable")


def test_more_than_one_percent_infrastructure_failures(exp: Path) -> None:
    """60 tasks: one infrastructure failure (the fixture's) is allowed, two are not."""
    _relabel(exp, "grpo", 1, "infra_error")
    only_failure(exp, "exclusions", "arm 'grpo': 2 of 60 tasks ended in an infrastructure failure")


def test_results_that_leave_out_listed_tasks(exp: Path) -> None:
    ids = [r["task_id"] for r in read_jsonl(exp / "arms/base/eval/results.jsonl")]
    edit_json(exp / "arms/grpo/eval/run.json", lambda r: r.update(task_ids=ids + ["dev/99999"]))
    only_failure(exp, "exclusions", "arm 'grpo': results.jsonl does not cover exactly the task_ids")


# audits --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "edit,needle",
    [
        ({"tasks": 0}, "leakage audit ran on 0 tasks"),
        ({"static_check": {"passed": False}}, "leakage audit's static check did not pass"),
        (
            {"per_turn_budget": {"t1": {"passed": False, "tasks": 60}}},
            "leakage audit failed at turn budgets t1",
        ),
    ],
)
def test_a_leakage_audit_that_says_passed_but_is_empty_or_partly_failed(exp: Path, edit, needle) -> None:
    edit_json(exp / "leakage.json", lambda a: a.update(edit))
    only_failure(exp, "leakage_audit", needle)


def test_a_weight_audit_that_passed_with_errors(exp: Path) -> None:
    edit_json(exp / "weights_audit.json", lambda a: a.update(errors=["no_update: could not read the final"]))
    only_failure(exp, "weights_audit", "weight audit recorded errors")


def test_a_trained_arm_whose_train_run_json_is_unreadable(exp: Path) -> None:
    (exp / "arms/grpo/train/run.json").write_text("[1, 2]")
    f = {c.name: c.problems for c in evidence_gate(exp).checks if not c.passed}
    assert any(
        "arm 'grpo': its train run.json is missing or unreadable" in p for p in f.get("training", [])
    ), f


def test_an_evaluation_whose_summary_is_unreadable(exp: Path) -> None:
    (exp / "arms/grpo/eval/summary.json").write_text("[1, 2]")
    only_failure(exp, "exclusions", "arm 'grpo': its eval summary.json is missing or unreadable")


@pytest.mark.parametrize("correct", [None, "false", 0])
def test_wrong_answers_whose_correct_is_not_a_boolean(exp: Path, correct) -> None:
    """A scored status without a true/false `correct` would drop out of the accuracy: GRPO's wrong rows
    blanked would raise it."""
    path = exp / "arms/grpo/eval/results.jsonl"
    rows = list(read_jsonl(path))
    for r in rows:
        if r["status"] == "mismatch":
            r["correct"] = correct
    write_jsonl(path, rows)
    only_failure(exp, "exclusions", "rows of results.jsonl have a scored status but no true/false `correct`")


def test_a_correct_that_its_status_contradicts(exp: Path) -> None:
    path = exp / "arms/grpo/eval/results.jsonl"
    rows = list(read_jsonl(path))
    n = 0
    for r in rows:
        if r["status"] == "exec_error" and n < 3:
            r["correct"], n = True, n + 1
    write_jsonl(path, rows)
    only_failure(
        exp, "exclusions", "arm 'grpo': 3 rows of results.jsonl have a `correct` their status contradicts"
    )
