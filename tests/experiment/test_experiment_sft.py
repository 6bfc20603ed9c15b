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


def test_init_steps_lets_grpo_sft_run_without_the_sft_arm(tmp_path):
    p = tmp_path / "e.toml"
    p.write_text("[experiment]\narms = ['base', 'grpo_sft', 'sft']\n[sft]\ninit_steps = 240\nsteps = 520\n")
    _, exp = load_experiment(p)
    assert exp.sft.init_steps == 240 and exp.sft.steps == 520
    p.write_text("[experiment]\narms = ['base', 'grpo_sft']\n[sft]\ninit_steps = 3\n")
    assert load_experiment(p)[1].arms == ("base", "grpo_sft")
    p.write_text("[sft]\ninit_steps = -1\n")
    with pytest.raises(C.ConfigError, match="sft.init_steps = -1 must be >= 0"):
        load_experiment(p)
    p.write_text("")
    assert load_experiment(p)[1].sft.init_steps == 0  # default: grpo_sft starts from the sft arm


def test_disk_needed_counts_sft_finals_and_the_grpo_sft_stage():
    from sqlrl.experiment.matrix import disk_needed

    cfg = C.from_dict(
        {"grpo": {"steps": 2}, "run": {"checkpoint_every": 2, "prune_checkpoints_at_end": True}}
    )
    p = 1_000_000_000  # float32 weights: 4 GB per stored final

    def need(init_steps: int) -> int:
        sft = T.sft_from_dict({"init_steps": init_steps})
        exp = ExperimentConfig(name="q", arms=("base", "grpo", "sft", "grpo_sft"), sft=sft)
        return disk_needed(cfg, exp, p)[0]

    # the finals of grpo, sft and grpo_sft (+ grpo_sft's own SFT stage), + 0.2 GB logs
    assert need(0) == 12_200_000_000
    assert need(3) == 16_200_000_000


@pytest.mark.slow
def test_grpo_sft_runs_its_own_sft_stage_resumed_then_grpo_from_it(tiny_model_dir, tmp_path):  # noqa: F811
    import dataclasses

    from sqlrl.evidence.gate import check_sft_control
    from sqlrl.evidence.rundir import Experiment
    from sqlrl.experiment.arms import sft_run_config
    from sqlrl.training.sft import train_sft

    cfg = C.from_dict(
        {
            "model": {"name": tiny_model_dir},
            "data": {"path": "embedded", "max_train_tasks": 6, "max_eval_tasks": 3},
            "agent": {"max_new_tokens": 160, "max_schema_chars": 300, "max_context_tokens": 2048},
            "grpo": {"steps": 1, "prompts_per_step": 2, "group_size": 2, "micro_batch": 4},
            "run": {"device": "cpu", "loggers": [], "sandbox_workers": 1, "checkpoint_every": 1},
        }
    )
    sft = T.sft_from_dict({"steps": 3, "init_steps": 2, "batch_size": 2, "micro_batch": 2, "lr": 1e-3})
    exp = ExperimentConfig(
        name="tiny-eq", arms=("base", "grpo", "sft", "grpo_sft"), leakage_tasks=1, smoke=True, sft=sft
    )
    out = tmp_path / "exp"
    stage = out / "arms/grpo_sft/sft_init"
    # an interrupted grpo_sft: its stage stopped after step 1 of 2 (checkpoint at step 1)
    res = train_sft(
        sft_run_config(cfg, 1), dataclasses.replace(sft, steps=2), stage, stop_after=1, progress=False
    )
    assert res == {"steps": 1, "finished": False, "base_identity": res["base_identity"]}
    run_experiment(cfg, exp, out, report=False)
    e = json.loads((out / "experiment.json").read_text())
    assert e["arms"]["grpo_sft"]["init_run"] == "arms/grpo_sft/sft_init"
    st_run = json.loads((stage / "run.json").read_text())
    assert st_run["status"] == "finished" and st_run["steps"] == 2 and st_run["resumed_from_step"] == 1
    # the stage is the sft arm's run with steps = init_steps: same config otherwise, same seeded batches
    st_conf = json.loads((stage / "config.json").read_text())
    sft_conf = json.loads((out / "arms/sft/train/config.json").read_text())
    assert (
        st_conf == {**sft_conf, "sft": {**sft_conf["sft"], "steps": 2}} and "init_steps" not in st_conf["sft"]
    )
    stage_batches = [json.loads(x)["task_ids"] for x in (stage / "steps.jsonl").read_text().splitlines()]
    sft_batches = [
        json.loads(x)["task_ids"] for x in (out / "arms/sft/train/steps.jsonl").read_text().splitlines()
    ]
    assert stage_batches == sft_batches[:2]
    # GRPO started from the stage's final weights, and its run.json says so
    conf = json.loads((out / "arms/grpo_sft/train/config.json").read_text())
    assert conf["model"]["name"] == str((stage / "final").resolve())
    gs_run = json.loads((out / "arms/grpo_sft/train/run.json").read_text())
    assert gs_run["model"]["base_identity"] == st_run["final_identity"] != st_run["model"]["base_identity"]
    assert gs_run["init_sft"] == {
        "run": "arms/grpo_sft/sft_init",
        "train_seconds": st_run["train_seconds"],
        "final_identity": st_run["final_identity"],
    }
    assert json.loads((out / "arms/sft/train/run.json").read_text())["steps"] == 3
    # the gate's time check: the control against grpo_sft's stage + GRPO part
    total = st_run["train_seconds"] + gs_run["train_seconds"]

    def time_lines(sft_seconds: float) -> list[str]:
        path = out / "arms/sft/train/run.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "train_seconds": sft_seconds}))
        return [x for x in check_sft_control(Experiment(out)).problems if "not an equal-time control" in x]

    grpo_s = json.loads((out / "arms/grpo/train/run.json").read_text())["train_seconds"]
    assert time_lines(max(total, grpo_s) + 1.0) == []  # covers grpo_sft's total and grpo's
    refused = [x for x in time_lines(total * 0.5) if "'grpo_sft'" in x]
    assert (
        len(refused) == 1
        and refused[0].startswith(
            f"arm 'sft' trained {total * 0.5 / 60:.2f} min, less than 'grpo_sft' in total ({total / 60:.2f} min = "
            f"SFT part {st_run['train_seconds'] / 60:.2f} min in arms/grpo_sft/sft_init + GRPO part"
        )
        and refused[0].endswith("s a step in 'sft')")
    )


@pytest.mark.slow
def test_sft_arms_run_per_context_cell(tiny_model_dir, tmp_path):  # noqa: F811
    """With `context_tokens = [2048, 1536]` each cell has its own sft control, trained at its context
    length, and its own grpo_sft started from that cell's sft weights; the report pairs them by cell."""
    cfg = C.from_dict(
        {
            "model": {"name": tiny_model_dir},
            "data": {"path": "embedded", "max_train_tasks": 6, "max_eval_tasks": 2},
            "agent": {"max_new_tokens": 160, "max_schema_chars": 300, "max_context_tokens": 2048},
            "grpo": {"steps": 1, "prompts_per_step": 2, "group_size": 2, "micro_batch": 4},
            "run": {"device": "cpu", "loggers": [], "sandbox_workers": 1, "checkpoint_every": 1},
        }
    )
    sft = T.sft_from_dict({"steps": 1, "batch_size": 2, "micro_batch": 2, "lr": 1e-3})
    exp = ExperimentConfig(
        name="ctx-sft",
        arms=("base", "sft", "grpo_sft"),
        context_tokens=(2048, 1536),
        leakage_tasks=1,
        smoke=True,
        sft=sft,
    )
    out = tmp_path / "exp"
    run_experiment(cfg, exp, out, report=True)
    e = json.loads((out / "experiment.json").read_text())
    assert list(e["arms"]) == [
        "base_c2048",
        "sft_c2048",
        "grpo_sft_c2048",
        "base_c1536",
        "sft_c1536",
        "grpo_sft_c1536",
    ]
    assert e["arms"]["grpo_sft_c1536"]["init_run"] == "arms/sft_c1536/train"
    for ctx in (2048, 1536):
        sft_conf = json.loads((out / f"arms/sft_c{ctx}/train/config.json").read_text())
        assert (sft_conf["agent"]["turns"], sft_conf["agent"]["max_context_tokens"]) == (1, ctx)
        conf = json.loads((out / f"arms/grpo_sft_c{ctx}/train/config.json").read_text())
        assert conf["model"]["name"] == str((out / f"arms/sft_c{ctx}/train/final").resolve())
        assert conf["agent"]["max_context_tokens"] == ctx
    md = (out / "report.md").read_text()
    assert "| grpo_sft_c1536 vs sft_c1536 |" in md and "| grpo_sft_c2048 vs sft_c2048 |" in md
    assert "grpo_sft_c1536 vs sft_c2048" not in md


def test_sft_runs_of_the_matrix_measure_their_curve_at_the_arms_turns(tmp_path, monkeypatch):
    """The sft arm and grpo_sft's own SFT stage train single-turn; their learning curve (run.eval_every)
    evaluates at the cell's turn budget, the one the arm is evaluated with."""
    from sqlrl.experiment import arms
    from sqlrl.training import sft as sft_mod

    calls = []

    def fake(cfg, sft, out, **kw):
        calls.append((cfg.agent.turns, kw.get("curve_turns")))
        return {"steps": sft.steps, "finished": True}

    monkeypatch.setattr(sft_mod, "train_sft", fake)
    cfg = C.from_dict({"model": {"name": "tiny"}, "data": {"path": "embedded"}, "run": {"eval_every": 5}})
    sft = T.sft_from_dict({"steps": 3, "init_steps": 2})
    kw = dict(resume=False, command=None, deadline=None, sft=sft, progress=None)
    arms.train_arm(cfg, tmp_path, "sft_t3", "sft", 3, **kw)
    arms.sft_stage(cfg, sft, tmp_path / "arms/grpo_sft_t3/sft_init", 3, "grpo_sft_t3", None, None)
    assert calls == [(1, 3), (1, 3)]
