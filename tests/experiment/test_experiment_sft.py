"""The matrix's opt-in `sft` (SFT-only control) and `grpo_sft` (GRPO from the SFT weights) arms on CPU.

The tiny random Qwen2 of test_experiment.py (a local Hugging Face folder) and the embedded Spider slice.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sqlrl import config as C
from sqlrl import config_tables as T
from sqlrl.experiment.matrix import ExperimentConfig, load_experiment, run_experiment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_experiment import tiny_model_dir  # noqa: E402, F401  (a module-scoped fixture)


@pytest.mark.slow
def test_sft_and_grpo_sft_arms_run_and_are_compared(tiny_model_dir, tmp_path):  # noqa: F811
    cfg = C.from_dict(
        {
            "model": {"name": tiny_model_dir},
            "data": {"path": "embedded", "max_train_tasks": 6, "max_eval_tasks": 3},
            "agent": {"max_new_tokens": 160, "max_schema_chars": 300, "max_context_tokens": 2048},
            "grpo": {"steps": 1, "prompts_per_step": 2, "group_size": 2, "micro_batch": 4},
            "run": {"device": "cpu", "loggers": [], "sandbox_workers": 1, "checkpoint_every": 1},
        }
    )
    sft = T.sft_from_dict({"steps": 2, "batch_size": 2, "micro_batch": 2, "lr": 1e-3})
    exp = ExperimentConfig(
        name="tiny-sft", arms=("base", "grpo", "sft", "grpo_sft"), leakage_tasks=1, smoke=True, sft=sft
    )
    out = tmp_path / "exp"
    run_experiment(cfg, exp, out, report=True)
    e = json.loads((out / "experiment.json").read_text())
    assert {n: a["kind"] for n, a in e["arms"].items()} == {
        "base": "base",
        "grpo": "grpo",
        "sft": "sft",
        "grpo_sft": "grpo_sft",
    }
    assert (
        e["experiment"]["sft"]["steps"] == 2 and e["arms"]["sft"]["budgets"] == e["arms"]["grpo"]["budgets"]
    )
    run = json.loads((out / "arms/sft/train/run.json").read_text())
    assert run["kind"] == "sft" and run["status"] == "finished" and run["steps"] == 2
    assert run["data_kind"] == "text2sql" and run["examples"] == 6 and run["weights_changed"] is True
    # grpo_sft trains GRPO (the grpo arm's settings) from the sft arm's final weights
    conf = json.loads((out / "arms/grpo_sft/train/config.json").read_text())
    assert conf["model"]["name"] == str((out / "arms/sft/train/final").resolve())
    assert conf["grpo"] == json.loads((out / "arms/grpo/train/config.json").read_text())["grpo"]
    gs_run = json.loads((out / "arms/grpo_sft/train/run.json").read_text())
    assert gs_run["status"] == "finished" and gs_run["model"]["base_identity"] == run["final_identity"]
    for arm in ("sft", "grpo_sft"):
        summary = json.loads((out / f"arms/{arm}/eval/summary.json").read_text())
        assert summary["n_tasks"] == 3
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["rl_over_sft"]["allowed"] is False  # a smoke run never becomes a claim
    # 1 GRPO step of a random model has zero grad norm, and 2 SFT steps train less long than it
    assert verdict["rl_over_sft"]["line"].startswith(
        "RL over SFT: no claim: arm 'grpo_sft': all 1 grad norms"
    )
    md = (out / "report.md").read_text()
    assert "| grpo vs sft |" in md and "| grpo_sft vs sft |" in md


def test_sft_table_and_arm_order_in_the_experiment_file(tmp_path):
    p = tmp_path / "e.toml"
    p.write_text("[experiment]\narms = ['base', 'grpo', 'sft', 'grpo_sft']\n[sft]\nsteps = 7\nlr = 2e-5\n")
    _, exp = load_experiment(p)
    assert exp.arms == ("base", "grpo", "sft", "grpo_sft") and exp.sft.steps == 7 and exp.sft.lr == 2e-5
    _, exp = load_experiment(p, ["experiment.arms=['base','grpo']"])
    assert exp.sft.steps == 7  # the [sft] table is read whatever the arms
    p.write_text("[experiment]\narms = ['base', 'grpo_sft', 'sft']\n")
    with pytest.raises(C.ConfigError, match="list sft before grpo_sft"):
        load_experiment(p)
    p.write_text("[experiment]\narms = ['base', 'grpo_sft']\n")
    with pytest.raises(C.ConfigError, match="list sft before grpo_sft"):
        load_experiment(p)
    p.write_text("[experiment]\nsft = 3\n")
    with pytest.raises(C.ConfigError, match="unknown key experiment.sft"):
        load_experiment(p)
    p.write_text("[sft]\nsteps = 0\n")
    with pytest.raises(C.ConfigError, match="sft.steps = 0"):
        load_experiment(p)
    # without the new arms the default matrix is unchanged
    p.write_text("")
    assert load_experiment(p)[1].arms == ("base", "grpo", "no_update", "validity")
