"""One seed's matrix split over two sessions in the reverse order of configs/spider-0.5b-gpu-final.toml's
plan: base, grpo, no_update and validity first (`GO_ARMS`; the weight audit of grpo's and no_update's
finals runs there), the folder packed as `scripts/gpu.sh pack` packs it (no *.safetensors, *.pt,
tokenizer.json or gold caches), then the full arm list (sft with its branch, grpo_sft from it). Also
first sessions stopped by their time budget inside an arm: after grpo and no_update (the audit is done,
the stopped arm trains again from the start), and inside grpo listed after no_update (grpo trains again,
the audit runs in session two). On the tiny random Qwen2 of test_experiment.py and the embedded Spider
slice, GRPO rewards scripted (`Alternating`) so that grpo's weights move and the audit can pass.

Not covered: a first session stopped after grpo finished and before a no_update listed after it: grpo's
weights are gone before any audit (the weight audit's module docstring), so its audit fails.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import pytest

from sqlrl import config as C
from sqlrl.experiment.matrix import ExperimentConfig, finished_matrix, run_experiment
from sqlrl.reward.match import Reward

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_experiment import tiny_model_dir  # noqa: E402, F401  (a module-scoped fixture)
from test_sft_branch_matrix import _tiny_branch_matrix  # noqa: E402


class Alternating:
    """Scripted training reward: 0, 1, 0, 1, ... in call order, so that every group of 2 has a gradient
    (the tiny model writes no SQL) and grpo's final differs from the base: the weight audit can pass."""

    def __init__(self, sandbox, gold_cache, kind):
        self.n = 0

    def score(self, final_sql, task):
        self.n += 1
        return Reward(float(self.n % 2), "match" if self.n % 2 else "mismatch", {})


def _matrix(model_dir: str, monkeypatch, grpo_steps: int = 1) -> tuple[C.Config, ExperimentConfig]:
    """_tiny_branch_matrix's (config, experiment) with every arm, its GRPO runs scored by `Alternating`."""
    from sqlrl.training import trainer

    real = trainer.train
    monkeypatch.setattr(trainer, "train", lambda *a, **k: real(*a, evaluator_factory=Alternating, **k))
    cfg, sft = _tiny_branch_matrix(model_dir)
    cfg = cfg.replace(grpo={"steps": grpo_steps, "lr": 1e-3})
    return cfg, ExperimentConfig(name="reversed", arms=FULL, leakage_tasks=1, smoke=True, sft=sft)


FULL = ("base", "sft", "grpo_sft", "grpo", "no_update", "validity")
FIRST = ("base", "grpo", "no_update", "validity")


def _pack(out: Path) -> list[Path]:
    """Delete what `scripts/gpu.sh pack` leaves out (*.safetensors, *.pt, tokenizer.json and the gold
    caches .goldcache, .gold_real, .gold_mutated); returns the deleted weight files."""
    import shutil

    for p in [p for p in out.rglob("*") if p.name in (".goldcache", ".gold_real", ".gold_mutated")]:
        shutil.rmtree(p)
    gone = [p for p in out.rglob("*") if p.suffix in (".safetensors", ".pt")]
    for p in gone + list(out.rglob("tokenizer.json")):
        p.unlink()
    return gone


def _runs(out: Path, arms) -> dict[str, dict]:
    return {a: json.loads((out / f"arms/{a}/train/run.json").read_text()) for a in arms}


def _second_session(cfg, exp: ExperimentConfig, out: Path, kept: dict[str, str], audit: dict | None) -> None:
    """The full arm list after the pack: sft and grpo_sft train, the first session's finished arms and
    weight audit (None: it had none) are kept, the audit passes, the matrix finishes and the RL-over-SFT
    check finds its device and time records."""
    from sqlrl.evidence.gate import check_sft_control
    from sqlrl.evidence.rltime import device_problem, rl_training
    from sqlrl.evidence.rundir import Experiment

    run_experiment(cfg, exp, out)  # with the report, which reads the weightless first-session arms
    assert {a: (out / f"arms/{a}/train/run.json").read_text() for a in kept} == kept
    for arm, run in _runs(out, ("sft", "grpo_sft")).items():
        assert run["status"] == "finished" and run["resumed_from_step"] is None, arm
    assert _runs(out, ["sft"])["sft"]["branch"]["step"] == 2
    e = json.loads((out / "experiment.json").read_text())
    assert set(e["arms"]) == set(FULL) and e["finished"] and finished_matrix(out, exp)
    assert e["arms"]["grpo_sft"]["init_branch"] == "arms/sft/train/branch_step_000002"
    wa = json.loads((out / "weights_audit.json").read_text())
    assert audit is None or wa == audit  # kept: its finals' weights are gone
    assert wa["passed"] is True, wa["errors"]
    assert wa["verdicts"]["no_update_identical"] is True and wa["verdicts"]["reloaded_identity"] is True
    assert json.loads((out / "verdict.json").read_text())["claim_allowed"] is False  # a smoke run
    ex = Experiment(out)
    info = json.loads((out / "arms/sft/train/branch_step_000002/branch.json").read_text())
    for arm in ("grpo_sft", "grpo"):
        parts = rl_training(ex, ex.arms[arm])
        assert device_problem(ex, ex.arms["sft"], ex.arms[arm], parts) is None
    parts = rl_training(ex, ex.arms["grpo_sft"])
    gs_s = _runs(out, ["grpo_sft"])["grpo_sft"]["train_seconds"]
    assert (parts["sft"], parts["branch_step"], parts["total"]) == (
        info["train_seconds"],
        2,
        info["train_seconds"] + gs_s,
    )
    # the check itself finds every record (tiny CPU runs may still fail it on time or zero gradients)
    probs = check_sft_control(ex).problems
    assert not [p for p in probs if "device" in p or "not recorded" in p], probs


@pytest.mark.slow
def test_a_matrix_split_in_reverse_order_keeps_the_first_sessions_arms_and_audit(
    tiny_model_dir,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    cfg, exp = _matrix(tiny_model_dir, monkeypatch)
    first, out = dataclasses.replace(exp, arms=FIRST), tmp_path / "exp"
    run_experiment(cfg, first, out, report=False)
    assert finished_matrix(out, first) and not finished_matrix(out, exp)  # `gpu.sh go` runs session two
    audit = json.loads((out / "weights_audit.json").read_text())
    assert audit["passed"] is True, audit["errors"]
    kept = {a: (out / f"arms/{a}/train/run.json").read_text() for a in FIRST[1:]}
    gone = _pack(out)
    assert any("arms/grpo/train/final" in str(p) for p in gone)
    _second_session(cfg, exp, out, kept, audit)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("order", "stops", "audited"),
    [
        (FIRST, ("grpo", "no_update", "validity"), True),  # inside validity: grpo and no_update audited
        (("base", "no_update", "grpo", "validity"), ("no_update", "grpo"), False),  # inside grpo
    ],
)
def test_a_first_session_stopped_inside_an_arm_trains_that_arm_again(
    tiny_model_dir,  # noqa: F811
    tmp_path,
    monkeypatch,
    order,
    stops,
    audited,
):
    """Session one's calls each stop at their time budget (a deadline already past: an arm trains one
    step of 2 per call, then checkpoints and stops), the last one inside arm `stops[-1]`. Packed without
    weights, session two trains that arm again from the start (its checkpoint holds no weights), keeps
    the arms that finished and the weight audit done in session one, or audits in session two."""
    from sqlrl.experiment import arms
    from sqlrl.training.budget import Unfinished

    cfg, exp = _matrix(tiny_model_dir, monkeypatch, grpo_steps=2)
    first, out, again = dataclasses.replace(exp, arms=order), tmp_path / "exp", stops[-1]
    with monkeypatch.context() as m:
        m.setattr(arms, "check_time", lambda *a: None)  # each arm starts, then stops after a step
        for stopped in stops:
            with pytest.raises(Unfinished, match=f"arm {stopped} stopped at step 1 of 2"):
                run_experiment(cfg, first, out, report=False, deadline=time.monotonic())
    assert not finished_matrix(out, first)
    assert (out / f"arms/{again}/train/checkpoints/step_000001").is_dir()
    assert (out / "weights_audit.json").is_file() is audited
    audit = json.loads((out / "weights_audit.json").read_text()) if audited else None
    assert audit is None or audit["passed"] is True
    kept = {a: (out / f"arms/{a}/train/run.json").read_text() for a in stops[:-1]}
    gone = _pack(out)
    assert any(f"arms/{again}/train/checkpoints/step_000001" in str(p) for p in gone)

    _second_session(cfg, exp, out, kept, audit)
    run = _runs(out, [again])[again]
    assert run["status"] == "finished" and run["resumed_from_step"] is None and run["steps"] == 2
    steps = [
        json.loads(x)["step"] for x in (out / f"arms/{again}/train/steps.jsonl").read_text().splitlines()
    ]
    assert steps == [1, 2]  # step 1 of session one went with its checkpoint's weights
    assert json.loads((out / f"arms/{again}/eval/summary.json").read_text())["n_tasks"] == 2
