"""The `grpo_checker` arm (GRPO with agent.checker = true) in the gate and the report.

Synthetic experiment folders (tests/fixtures/make_experiment.py): the grpo_checker arm's budgets are the
cell's plus `checker: true`, its treatment.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sqlrl.artifacts import read_json, write_json_atomic
from sqlrl.evidence.analysis import analyze
from sqlrl.evidence.gate import evidence_gate
from sqlrl.evidence.report import write_report

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from make_experiment import make_experiment  # noqa: E402

CORE = ("base", "grpo", "no_update", "validity")


def _set_budgets(p: Path, arm: str, **changes) -> None:
    """Change an arm's declared budgets and its eval run's recorded ones alike."""
    meta = read_json(p / "experiment.json")
    meta["arms"][arm]["budgets"] = {**meta["arms"][arm]["budgets"], **changes}
    write_json_atomic(p / "experiment.json", meta)
    for name in ("run.json", "summary.json"):
        path = p / "arms" / arm / "eval" / name
        write_json_atomic(path, {**read_json(path), "budgets": meta["arms"][arm]["budgets"]})


def test_grpo_checker_is_a_grpo_arm_held_to_base_and_the_controls(tmp_path: Path) -> None:
    p = make_experiment(tmp_path / "e", synthetic=False, arms=(*CORE, "grpo_checker"))
    v = evidence_gate(p)
    assert v.claim_allowed, v.missing
    checks = {c.name: c for c in v.checks}
    assert checks["equal_budgets"].detail == (
        "identical budgets across 5 arms; differing only by their treatment: grpo_checker by checker = true"
    )
    assert (
        checks["optimizer_steps"].detail
        == "optimizer steps with non-zero grad norms: grpo=12, grpo_checker=12"
    )
    pairs = [(r["a"], r["b"]) for r in analyze(p, n_boot=200)["comparisons"]]
    for a in ("base", "no_update", "validity", "grpo"):
        assert (a, "grpo_checker") in pairs
    assert ("grpo_checker", "grpo") not in pairs
    write_report(p, n_boot=200)
    md = (p / "report.md").read_text(encoding="utf-8")
    assert "| grpo_checker vs grpo |" in md and "| grpo_checker vs no_update |" in md


def test_grpo_checker_must_hold_its_treatment_and_nothing_else(tmp_path: Path) -> None:
    p = make_experiment(tmp_path / "e", synthetic=False, arms=(*CORE, "grpo_checker"))
    meta = read_json(p / "experiment.json")
    budgets = meta["arms"]["grpo_checker"]["budgets"]
    _set_budgets(p, "grpo_checker", checker=False)
    problems = {c.name: c.problems for c in evidence_gate(p).checks}["equal_budgets"]
    assert problems == [
        "arm 'grpo_checker' (kind grpo_checker) declares checker = false; its kind runs with checker = true",
        "budgets differ: arm 'grpo_checker' vs 'base' in checker (false vs \"(absent)\")",
    ]
    _set_budgets(p, "grpo_checker", checker=True, max_new_tokens=512)
    problems = {c.name: c.problems for c in evidence_gate(p).checks}["equal_budgets"]
    assert problems == ["budgets differ: arm 'grpo_checker' vs 'base' in max_new_tokens (512 vs 256)"]
    # a base arm that ran with the checker differs from the grpo arm by it: not a treatment of base's
    _set_budgets(p, "grpo_checker", **budgets)
    _set_budgets(p, "base", checker=True)
    problems = {c.name: c.problems for c in evidence_gate(p).checks}["equal_budgets"]
    assert "budgets differ: arm 'grpo' vs 'base' in checker (\"(absent)\" vs true)" in problems
    assert not any("'grpo_checker' vs" in x for x in problems)


def test_grpo_checker_needs_base_controls_and_sound_steps_in_its_cell(tmp_path: Path) -> None:
    p = make_experiment(tmp_path / "e", synthetic=False, arms=(*CORE, "grpo_checker_t3"))
    v = evidence_gate(p)
    assert not v.claim_allowed
    assert (
        "core_arms: arm 'grpo_checker_t3' (turns=3) has no base arm with the same turns to compare against"
        in v.missing
    )
    assert (
        "controls: control 'no_update' missing for turns=3: arm 'grpo_checker_t3' has no 'no_update' arm with the same turns"
        in v.missing
    )
    q = make_experiment(tmp_path / "f", synthetic=False, arms=(*CORE, "grpo_checker"))
    steps = q / "arms/grpo_checker/train/steps.jsonl"
    rows = [json.loads(x) for x in steps.read_text().splitlines()]
    steps.write_text("".join(json.dumps({**r, "grad_norm": 0.0}) + "\n" for r in rows))
    v = evidence_gate(q)
    assert v.missing == [
        "optimizer_steps: arm 'grpo_checker': all 12 grad norms are zero (no gradient ever flowed)"
    ]
