"""One seed's matrix of configs/spider-0.5b-gpu-final.toml split over three sessions as planned (`GO_ARMS`
per session, `GO_RESUME` unpacking the previous session's pack): base and validity; then no_update and
grpo (their weight audit needs both finals in one session); then sft and grpo_sft (grpo_sft branches
from the sft control's weights, `sft.init_from = "control"`), and the same with sessions two and three
swapped. Each session runs only its own arms and is packed as `scripts/gpu.sh pack` packs it (no
*.safetensors, *.pt, tokenizer.json or gold caches). After each session: its arms finished, every arm
of an earlier session kept as it was (run.json, eval summary and results, experiment.json entry), the
weight audit run in the no_update/grpo session and kept after it. After the last: experiment.json,
verdict.json and the report cover all six arms, and every gate check except real_run (a smoke run)
passes. The same for seed 1's order: sft and grpo_sft; base; no_update, grpo and validity. Also: the
config accepts each session's arm list (`load_experiment` with the `--set` that `gpu.sh go` builds from
GO_ARMS).

On the tiny random Qwen2 of test_experiment.py and the embedded Spider slice, GRPO rewards scripted
(test_reversed_split's `Alternating`) so that grpo's weights move and the audit can pass.

Not covered: sessions stopped inside an arm (test_reversed_split.py), the RL-over-SFT check's time
comparison (tiny CPU runs), the real model or data.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from sqlrl.experiment.matrix import finished_matrix, load_experiment, run_experiment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_experiment import tiny_model_dir  # noqa: E402, F401  (a module-scoped fixture)
from test_reversed_split import _matrix, _pack  # noqa: E402

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "spider-0.5b-gpu-final.toml"
FINAL = ("base", "sft", "grpo_sft", "no_update", "grpo", "validity")  # the config's experiment.arms
FIRST, AUDITED, BRANCHED = ("base", "validity"), ("no_update", "grpo"), ("sft", "grpo_sft")
# what a finished arm leaves that a later session must not rewrite (base has no train run)
KEPT_FILES = (
    "train/run.json",
    "train/steps.jsonl",
    "eval/summary.json",
    "eval/run.json",
    "eval/results.jsonl",
)
# the gate's checks that a smoke matrix of tiny CPU runs can pass
PASSING = (
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
)


def test_the_config_accepts_each_sessions_arm_list():
    """`gpu.sh go` passes GO_ARMS as `--set experiment.arms=[...]`; every planned session's list loads."""
    assert load_experiment(CONFIG)[1].arms == FINAL
    for arms in (FIRST, AUDITED, BRANCHED, ("base",), AUDITED + ("validity",)):
        listed = ",".join(f'"{a}"' for a in arms)
        assert load_experiment(CONFIG, [f"experiment.arms=[{listed}]"])[1].arms == arms


def _kept(out: Path, arms) -> dict[str, str]:
    """The text of each arm's KEPT_FILES that exist, and its experiment.json entry."""
    entries = json.loads((out / "experiment.json").read_text())["arms"]
    got = {f"{a}:entry": json.dumps(entries.get(a), sort_keys=True) for a in arms}
    for a in arms:
        for f in KEPT_FILES:
            if (out / "arms" / a / f).is_file():
                got[f"{a}/{f}"] = (out / "arms" / a / f).read_text()
    return got


def _session(cfg, exp, out: Path, arms: tuple[str, ...], earlier: tuple[str, ...]) -> None:
    """One `gpu.sh go` session on the unpacked folder: `arms` train now, the `earlier` arms stay as the
    previous sessions left them; then the pack."""
    kept = _kept(out, earlier) if earlier else {}
    now = dataclasses.replace(exp, arms=arms)
    run_experiment(cfg, now, out)  # with the report, as `sqlrl experiment` in `gpu.sh go`
    assert _kept(out, earlier) == kept
    assert finished_matrix(out, now) and finished_matrix(out, exp) is (len(earlier) + len(arms) == 6)
    e = json.loads((out / "experiment.json").read_text())
    assert set(e["arms"]) == set(earlier) | set(arms) and e["experiment"]["arms"] == [*earlier, *arms]
    for arm in arms:
        summary = json.loads((out / f"arms/{arm}/eval/summary.json").read_text())
        assert summary["n_tasks"] == 2, arm
        if arm != "base":
            run = json.loads((out / f"arms/{arm}/train/run.json").read_text())
            assert run["status"] == "finished" and run["resumed_from_step"] is None, arm
            assert run["steps"] == (3 if arm == "sft" else 1), arm
    _pack(out)
    assert not list(out.rglob("*.safetensors")) and not list(out.rglob("*.pt"))


@pytest.mark.slow
@pytest.mark.parametrize("middle", [AUDITED, BRANCHED], ids=["audit-second", "branch-second"])
def test_a_matrix_split_over_three_sessions_finishes_with_every_arm(
    tiny_model_dir,  # noqa: F811
    tmp_path,
    monkeypatch,
    middle,
):
    cfg, exp = _matrix(tiny_model_dir, monkeypatch)
    exp, out = dataclasses.replace(exp, name="three", arms=FINAL), tmp_path / "exp"
    last = BRANCHED if middle == AUDITED else AUDITED

    _session(cfg, exp, out, FIRST, ())
    assert not (out / "weights_audit.json").exists()  # no grpo yet
    _session(cfg, exp, out, middle, FIRST)
    assert (out / "weights_audit.json").exists() is (middle == AUDITED)
    audit = (out / "weights_audit.json").read_text() if middle == AUDITED else None
    _session(cfg, exp, out, last, FIRST + middle)
    assert audit is None or (out / "weights_audit.json").read_text() == audit  # kept, its finals are gone
    _all_six_arms_checked(out, exp)


@pytest.mark.slow
def test_seed_1s_order_branch_then_base_then_the_audited_arms_with_validity(
    tiny_model_dir,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """Seed 1 of the final config ran sft + grpo_sft first, then base, on an H200; its last session runs
    no_update, grpo and validity together."""
    cfg, exp = _matrix(tiny_model_dir, monkeypatch)
    exp, out = dataclasses.replace(exp, name="three", arms=FINAL), tmp_path / "exp"
    _session(cfg, exp, out, BRANCHED, ())
    _session(cfg, exp, out, ("base",), BRANCHED)
    assert not (out / "weights_audit.json").exists()
    _session(cfg, exp, out, AUDITED + ("validity",), BRANCHED + ("base",))
    _all_six_arms_checked(out, exp)


def _all_six_arms_checked(out: Path, exp) -> None:
    """After the last session: the weight audit passes, experiment.json, verdict.json and the report hold
    all six arms, and every gate check but real_run passes."""
    wa = json.loads((out / "weights_audit.json").read_text())
    assert wa["passed"] is True, wa["errors"]
    assert all(
        wa["verdicts"][v] is True for v in ("trained_changed", "no_update_identical", "reloaded_identity")
    )
    e = json.loads((out / "experiment.json").read_text())
    assert sorted(e["arms"]) == sorted(FINAL) and e["finished"] and finished_matrix(out, exp)
    assert {a: e["arms"][a]["kind"] for a in FINAL} == {a: a for a in FINAL}
    assert e["arms"]["grpo_sft"]["init_branch"] == "arms/sft/train/branch_step_000002"
    assert json.loads((out / "arms/sft/train/run.json").read_text())["branch"]["step"] == 2

    verdict = json.loads((out / "verdict.json").read_text())
    checks = {c["name"]: c for c in verdict["checks"]}
    assert {n: checks[n]["passed"] for n in PASSING} == dict.fromkeys(PASSING, True), verdict["missing"]
    assert verdict["claim_allowed"] is False and verdict["missing"] == [
        'real_run: smoke run: experiment.json has "smoke": true, and smoke runs never become claims'
    ]
    assert checks["equal_budgets"]["detail"].startswith("identical budgets across 6 arms")
    assert checks["same_tasks"]["detail"] == "same 2 task ids in every arm's eval"
    # the RL-over-SFT check finds every record of arms trained in different sessions (its time
    # comparison may still fail on tiny CPU runs)
    probs = verdict["rl_over_sft"]["problems"]
    assert probs != ["no SFT control: whether RL beats SFT is not answered"], probs
    assert not [p for p in probs if "device" in p or "not recorded" in p], probs
    report = (out / "report.md").read_text()
    assert all(f"| {a} |" in report for a in FINAL), report
