"""A matrix resumed with other [sft] settings than experiment.json records: allowed (and recorded) while
no sft or grpo_sft arm has a folder, refused naming the folders to delete once one has."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sqlrl import config_tables as T
from sqlrl.config import ConfigError
from sqlrl.experiment.matrix import ExperimentConfig, _check_sft_change


def _exp(steps: int, arms=("base", "grpo", "sft", "grpo_sft")) -> ExperimentConfig:
    sft = T.sft_from_dict({"steps": steps, "init_steps": 2, "batch_size": 2, "micro_batch": 2, "lr": 1e-3})
    return ExperimentConfig(name="x", arms=arms, sft=sft)


def _state(exp: ExperimentConfig) -> dict:
    return {"experiment": {"sft": json.loads(json.dumps(dataclasses.asdict(exp.sft)))}}


def test_sft_steps_raised_after_deleting_the_sft_arms_is_recorded(tmp_path: Path) -> None:
    state = _state(_exp(640))
    (tmp_path / "arms" / "grpo").mkdir(parents=True)  # other arms do not matter
    _check_sft_change(state, _exp(720), tmp_path)
    assert state["resume_changes"][0]["changes"] == ["sft.steps: 640 -> 720"]
    same = _state(_exp(640))
    _check_sft_change(same, _exp(640), tmp_path)
    assert "resume_changes" not in same


@pytest.mark.parametrize("started", ["sft", "grpo_sft"])
def test_sft_change_with_an_arm_that_trained_on_the_old_settings_is_refused(tmp_path, started) -> None:
    (tmp_path / "arms" / started).mkdir(parents=True)
    with pytest.raises(ConfigError) as e:
        _check_sft_change(_state(_exp(640)), _exp(720), tmp_path)
    assert str(e.value) == (
        f"{tmp_path}: the [sft] settings differ from the ones its arms ['{started}'] trained with "
        f"(['sft.steps: 640 -> 720']); delete {tmp_path / 'arms' / started} to rerun them with the new "
        "settings, or resume with the old ones"
    )


def test_a_key_an_older_folder_lacks_counts_as_its_default(tmp_path: Path) -> None:
    (tmp_path / "arms" / "sft").mkdir(parents=True)
    state = _state(_exp(640))
    del state["experiment"]["sft"]["init_from"]  # written before the setting existed: "stage"
    _check_sft_change(state, _exp(640), tmp_path)
    assert "resume_changes" not in state
    # a matrix resumed with arms that do not use [sft] (base, grpo, ...) compares nothing
    _check_sft_change(_state(_exp(640)), _exp(720, arms=("base", "grpo")), tmp_path)


def test_a_resume_with_arms_that_do_not_use_sft_keeps_its_record(tmp_path: Path) -> None:
    """experiment.json keeps the [sft] settings the sft arms trained with through a session whose arms do
    not use them (scripts/gpu.sh GO_ARMS="grpo no_update"), so a later resume with changed settings is
    still refused."""
    from sqlrl import config as C
    from sqlrl.experiment.matrix import _experiment_state

    cfg = C.from_dict({})

    def state(exp: ExperimentConfig) -> dict:
        return _experiment_state(
            cfg, exp, tmp_path, root=tmp_path, fingerprint="f", eval_tasks=[], command=[]
        )

    state(_exp(640, arms=("base", "sft", "grpo_sft")))
    (tmp_path / "arms" / "sft").mkdir(parents=True)
    kept = state(_exp(720, arms=("base", "grpo")))  # [sft] unused by these arms: nothing compared
    assert kept["experiment"]["sft"]["steps"] == 640 and "resume_changes" not in kept
    with pytest.raises(ConfigError, match=r"sft.steps: 640 -> 720"):
        state(_exp(720, arms=("base", "sft", "grpo_sft")))
