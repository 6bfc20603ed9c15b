"""The matrix's opt-in `grpo_checker` arm: GRPO with agent.checker = true, all else as the `grpo` arm.

Config derivation and validation on CPU in milliseconds; one slow matrix with the tiny random Qwen2 of
test_experiment.py on the embedded Spider slice. That model writes no SQL, so the test reads every reply
as `SELECT 1` (the Parser patched): every answer then gets its checker turn, in training and evaluation.
The checker turn's rules are covered by tests/agent/test_checker.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sqlrl import config as C
from sqlrl.experiment.arms import arm_config, arm_name
from sqlrl.experiment.matrix import ExperimentConfig, disk_needed, load_experiment, run_experiment
from sqlrl.training.trainer import arm_kind

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_experiment import tiny_model_dir  # noqa: E402, F401  (a module-scoped fixture)


def test_grpo_checker_config_is_grpo_with_the_checker():
    cfg = C.from_dict({"agent": {"max_sql_executions": 2}, "grpo": {"lr": 3e-6}})
    g, c = arm_config(cfg, "grpo", 3, 2048), arm_config(cfg, "grpo_checker", 3, 2048)
    assert c.agent.checker is True and g.agent.checker is False
    assert c.resolve() == {**g.resolve(), "agent": {**g.resolve()["agent"], "checker": True}}
    assert arm_kind(c) == "grpo_checker" and arm_kind(g) == "grpo"
    assert arm_kind(arm_config(cfg, "no_update", 1)) == "no_update"
    assert arm_name("grpo_checker", 3, 2048) == "grpo_checker_t3_c2048"
    assert arm_config(cfg, "base", 1).agent.checker is False  # base and the controls: no checker


def test_grpo_checker_in_the_experiment_file(tmp_path):
    p = tmp_path / "e.toml"
    p.write_text("[experiment]\narms = ['base', 'grpo', 'no_update', 'validity', 'grpo_checker']\n")
    assert load_experiment(p)[1].arms[-1] == "grpo_checker"
    p.write_text("[agent]\nchecker = true\n[experiment]\narms = ['base', 'grpo_checker']\n")
    with pytest.raises(
        C.ConfigError, match="agent.checker is already true for every arm.*set agent.checker = false"
    ):
        load_experiment(p)


def test_disk_needed_counts_the_grpo_checker_final():
    cfg = C.from_dict(
        {"grpo": {"steps": 2}, "run": {"checkpoint_every": 2, "prune_checkpoints_at_end": True}}
    )
    p = 1_000_000_000  # float32 finals: 4 GB each for grpo, validity and grpo_checker, + 0.2 GB logs
    exp = ExperimentConfig(arms=("base", "grpo", "no_update", "validity", "grpo_checker"))
    assert disk_needed(cfg, exp, p)[0] == 12_200_000_000


@pytest.mark.slow
def test_grpo_checker_arm_trains_evaluates_and_is_compared(tiny_model_dir, tmp_path, monkeypatch):  # noqa: F811
    from sqlrl.agent.prompts import Parser

    monkeypatch.setattr(Parser, "extract_sql", staticmethod(lambda text: "SELECT 1"))
    cfg = C.from_dict(
        {
            "model": {"name": tiny_model_dir},
            "data": {"path": "embedded", "max_train_tasks": 6, "max_eval_tasks": 3},
            "agent": {"max_new_tokens": 16, "max_schema_chars": 300, "max_context_tokens": 2048},
            "grpo": {"steps": 1, "prompts_per_step": 2, "group_size": 2, "micro_batch": 4},
            "run": {"device": "cpu", "loggers": [], "sandbox_workers": 1, "checkpoint_every": 1},
        }
    )
    exp = ExperimentConfig(
        name="tiny-check", arms=("base", "grpo", "grpo_checker"), leakage_tasks=1, smoke=True
    )
    out = tmp_path / "exp"
    run_experiment(cfg, exp, out, report=True)
    e = json.loads((out / "experiment.json").read_text())
    arms = e["arms"]
    assert {n: a["kind"] for n, a in arms.items()} == {
        "base": "base",
        "grpo": "grpo",
        "grpo_checker": "grpo_checker",
    }
    assert arms["grpo_checker"]["budgets"] == {**arms["grpo"]["budgets"], "checker": True}
    assert "checker" not in arms["base"]["budgets"]
    conf = json.loads((out / "arms/grpo_checker/train/config.json").read_text())
    grpo_conf = json.loads((out / "arms/grpo/train/config.json").read_text())
    assert conf == {**grpo_conf, "agent": {**grpo_conf["agent"], "checker": True}}
    assert json.loads((out / "arms/grpo_checker/train/run.json").read_text())["arm"] == "grpo_checker"
    # training: every rollout's answer (SELECT 1, without FINAL: the first answer stands) was checked
    [step] = [json.loads(x) for x in (out / "arms/grpo_checker/train/steps.jsonl").read_text().splitlines()]
    assert (step["checker_checked"], step["checker_changed"], step["mean_turns"]) == (1.0, 0.0, 2.0)
    [gstep] = [json.loads(x) for x in (out / "arms/grpo/train/steps.jsonl").read_text().splitlines()]
    assert "checker_checked" not in gstep and gstep["mean_turns"] == 1.0
    summary = json.loads((out / "arms/grpo_checker/eval/summary.json").read_text())
    assert summary["budgets"]["checker"] is True and summary["n"] == 3
    c = summary["checker"]
    assert (c["checked"], c["changed"], c["not_checked"]) == (3, 0, {})
    assert c["replies"]["confirm"] + c["replies"]["no_final"] == 3
    assert "checker" not in json.loads((out / "arms/grpo/eval/summary.json").read_text())
    assert json.loads((out / "leakage.json").read_text())["passed"]
    md = (out / "report.md").read_text()
    assert "| grpo_checker vs base |" in md and "| grpo_checker vs grpo |" in md


def test_step_metrics_count_checked_and_changed_answers():
    from types import SimpleNamespace

    from sqlrl.training.trainer import checker_metrics

    def tr(checker):
        return SimpleNamespace(checker=checker)

    trajs = [
        tr({"checked": True, "changed": True}),
        tr({"checked": True, "changed": False}),
        tr({"checked": False, "changed": False}),  # e.g. sql_budget
        tr({"checked": True, "changed": False}),
    ]
    assert checker_metrics(trajs) == {"checker_checked": 0.75, "checker_changed": 0.25}
    assert checker_metrics([tr(None), tr(None)]) == {}  # agent.checker off: steps.jsonl unchanged


def test_sft_refuses_the_checker():
    from sqlrl.agent.loop import Budgets
    from sqlrl.config_tables import SFTConfig
    from sqlrl.training.sft import check_sft_settings

    cfg = C.from_dict({"agent": {"checker": True}})
    with pytest.raises(C.ConfigError, match="SFT examples have no checker turn.*set agent.checker = false"):
        check_sft_settings(cfg, SFTConfig(), Budgets.from_config(cfg.agent))
    check_sft_settings(C.from_dict({}), SFTConfig(), Budgets())  # off: accepted
