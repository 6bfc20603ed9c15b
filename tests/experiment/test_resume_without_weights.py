"""Resuming a matrix folder carried without its weights (`scripts/gpu.sh pack` leaves out *.safetensors
and *.pt), or moved to another path: the grpo_sft arm with its own SFT stage, on the tiny random Qwen2 of
test_experiment.py and the embedded Spider slice.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import sys
from pathlib import Path

import pytest

from sqlrl import config as C
from sqlrl import config_tables as T
from sqlrl.experiment.arms import arm_config, drop_unloadable, sft_run_config
from sqlrl.experiment.matrix import ExperimentConfig, run_experiment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_experiment import tiny_model_dir  # noqa: E402, F401  (a module-scoped fixture)


def _setup(model: str) -> tuple[C.Config, ExperimentConfig]:
    cfg = C.from_dict(
        {
            "model": {"name": model},
            "data": {"path": "embedded", "max_train_tasks": 6, "max_eval_tasks": 2},
            "agent": {"max_new_tokens": 160, "max_schema_chars": 300, "max_context_tokens": 2048},
            "grpo": {"steps": 2, "prompts_per_step": 2, "group_size": 2, "micro_batch": 4},
            "run": {"device": "cpu", "loggers": [], "sandbox_workers": 1, "checkpoint_every": 1},
        }
    )
    sft = T.sft_from_dict({"steps": 1, "init_steps": 1, "batch_size": 2, "micro_batch": 2, "lr": 1e-3})
    return cfg, ExperimentConfig(
        name="packed", arms=("base", "grpo_sft"), leakage_tasks=1, smoke=True, sft=sft
    )


def _interrupted_grpo_sft(cfg: C.Config, exp: ExperimentConfig, out: Path) -> None:
    """grpo_sft as a session left it: its SFT stage finished, GRPO stopped after step 1 of 2 (checkpoint)."""
    from sqlrl.training.sft import train_sft
    from sqlrl.training.trainer import train

    stage = out / "arms/grpo_sft/sft_init"
    train_sft(sft_run_config(cfg, 1), dataclasses.replace(exp.sft, steps=1), stage, progress=False)
    acfg = arm_config(cfg, "grpo_sft", 1).replace(model={"name": str((stage / "final").resolve())})
    assert train(acfg, out / "arms/grpo_sft/train", stop_after=1, progress=False)["finished"] is False


def _run(cfg, exp, out: Path, caplog) -> list[str]:
    caplog.set_level(logging.INFO, logger="sqlrl")
    run_experiment(cfg, exp, out, report=False)
    return [r.getMessage() for r in caplog.records if r.name == "sqlrl.experiment.arms"]


@pytest.mark.slow
def test_grpo_sft_packed_without_weights_trains_again_from_the_start(tiny_model_dir, tmp_path, caplog):  # noqa: F811
    cfg, exp = _setup(tiny_model_dir)
    out = tmp_path / "exp"
    _interrupted_grpo_sft(cfg, exp, out)
    gone = [p for p in (out / "arms/grpo_sft").rglob("*") if p.suffix in (".safetensors", ".pt")]
    assert any("sft_init/final" in str(p) for p in gone) and any("step_000001" in str(p) for p in gone)
    for p in gone:
        p.unlink()
    messages = _run(cfg, exp, out, caplog)
    said = [m for m in messages if "hold" in m and "no weights" in m]
    assert said == [
        f"[experiment] grpo_sft: {out / 'arms/grpo_sft/sft_init/final'} holds no weights; the checkpoints in "
        f"{out / 'arms/grpo_sft/train/checkpoints'} (step_000001) hold no weights (a folder carried without its "
        "weights?): training the arm again from the start"
    ]
    stage = json.loads((out / "arms/grpo_sft/sft_init/run.json").read_text())
    run = json.loads((out / "arms/grpo_sft/train/run.json").read_text())
    assert stage["status"] == "finished" and stage["resumed_from_step"] is None
    assert run["status"] == "finished" and run["resumed_from_step"] is None and run["steps"] == 2
    assert run["model"]["base_identity"] == stage["final_identity"]  # GRPO started from the new stage
    steps = [
        json.loads(x)["step"] for x in (out / "arms/grpo_sft/train/steps.jsonl").read_text().splitlines()
    ]
    assert steps == [1, 2]
    assert json.loads((out / "arms/grpo_sft/eval/summary.json").read_text())["n_tasks"] == 2


@pytest.mark.slow
def test_a_moved_experiment_folder_resumes_grpo_sft(tiny_model_dir, tmp_path, caplog):  # noqa: F811
    """The run's config.json named its start weights by their absolute path in the old folder."""
    cfg, exp = _setup(tiny_model_dir)
    _interrupted_grpo_sft(cfg, exp, tmp_path / "here")
    out = tmp_path / "elsewhere" / "exp"
    shutil.move(tmp_path / "here", out)
    messages = _run(cfg, exp, out, caplog)
    assert not [m for m in messages if "no weights" in m]
    run = json.loads((out / "arms/grpo_sft/train/run.json").read_text())
    assert run["status"] == "finished" and run["resumed_from_step"] == 1
    conf = json.loads((out / "arms/grpo_sft/train/config.json").read_text())
    assert conf["model"]["name"] == str((out / "arms/grpo_sft/sft_init/final").resolve())


def test_grpo_sft_refuses_an_evaluated_sft_arm_without_weights(tmp_path):
    """With sft.init_steps = 0 grpo_sft starts from the sft arm's final; training that evaluated arm again
    is not safe, so a missing copy of its weights is one error naming the folder and the fix."""
    out = tmp_path / "exp"
    final = out / "arms/sft/train/final"
    final.mkdir(parents=True)
    (final / "identity.json").write_text(json.dumps({"weights_hash": "sha256:aa", "weights_stored": "dense"}))
    (final / "config.json").write_text("{}")
    with pytest.raises(C.ConfigError) as e:
        drop_unloadable(out, "grpo_sft", "grpo_sft", out / "arms/sft/train", own_stage=False, eval_done=False)
    assert str(e.value) == (
        f"arm grpo_sft starts from {final}, which holds no weights (a folder carried without them); copy them "
        f"back, or delete {out / 'arms/sft'} and {out / 'arms/grpo_sft'} to train both again"
    )
    (final / "model.safetensors").write_bytes(b"x")
    drop_unloadable(out, "grpo_sft", "grpo_sft", out / "arms/sft/train", own_stage=False, eval_done=False)


def test_a_moved_folder_renames_the_start_weights_of_grpo_sft(tmp_path):
    """config.json's model.name and a patch final's base, written in the old folder, name the same
    folder under the new one; a start path elsewhere is left as it is (the config check then refuses)."""
    from sqlrl.experiment.arms import _follow_move

    out = tmp_path / "new" / "exp"
    train = out / "arms/grpo_sft/train"
    (train / "final").mkdir(parents=True)
    old = "/old/place/exp/arms/grpo_sft/sft_init/final"
    (train / "config.json").write_text(json.dumps({"model": {"name": old, "dtype": "float32"}}))
    (train / "final/identity.json").write_text(json.dumps({"weights_stored": "patch", "base": old}))
    start = (out / "arms/grpo_sft/sft_init/final").resolve()
    _follow_move(out, train, start)
    assert json.loads((train / "config.json").read_text()) == {
        "model": {"name": str(start), "dtype": "float32"}
    }
    assert json.loads((train / "final/identity.json").read_text())["base"] == str(start)
    other = "/old/place/exp/arms/sft/train/final"
    (train / "config.json").write_text(json.dumps({"model": {"name": other}}))
    _follow_move(out, train, start)
    assert json.loads((train / "config.json").read_text())["model"]["name"] == other
