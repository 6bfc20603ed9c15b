"""experiment.json on resume: a matrix resumed with more arms is not finished until they are, and a
finished matrix is one that holds every arm of every cell asked for now."""

from __future__ import annotations

import json
from types import SimpleNamespace

from sqlrl import config as C
from sqlrl.experiment import matrix
from sqlrl.experiment.matrix import ExperimentConfig


def _state(tmp_path, exp: ExperimentConfig) -> dict:
    return matrix._experiment_state(
        C.from_dict({}),
        exp,
        tmp_path,
        root=tmp_path,
        fingerprint="fp",
        eval_tasks=[SimpleNamespace(public=SimpleNamespace(task_id="t1"))],
        command=["sqlrl", "experiment"],
    )


def test_a_resumed_matrix_is_not_finished_until_it_finishes_again(tmp_path):
    first = {
        "config": json.loads(json.dumps(C.from_dict({}).resolve())),
        "arms": {"base": {"kind": "base"}},
        "finished": "2026-12-02T08:00:00+0000",
    }
    (tmp_path / "experiment.json").write_text(json.dumps(first))
    state = _state(tmp_path, ExperimentConfig(arms=("base", "grpo")))
    on_disk = json.loads((tmp_path / "experiment.json").read_text())
    assert "finished" not in state and "finished" not in on_disk  # a stop now leaves it unfinished
    assert on_disk["arms"] == {"base": {"kind": "base"}}  # the finished arm is kept


def _write(tmp_path, arms: list[str], finished: bool = True) -> None:
    meta = {"arms": dict.fromkeys(arms, {}), **({"finished": "x"} if finished else {})}
    (tmp_path / "experiment.json").write_text(json.dumps(meta))


def test_finished_matrix_wants_every_arm_of_every_cell(tmp_path):
    exp = ExperimentConfig(arms=("base", "grpo"), turns=(1, 3), context_tokens=(2048,))
    assert matrix.arm_names(exp) == ["base_c2048", "grpo_c2048", "base_t3_c2048", "grpo_t3_c2048"]
    _write(tmp_path, ["base_c2048", "grpo_c2048", "base_t3_c2048", "grpo_t3_c2048"])
    assert matrix.finished_matrix(tmp_path, exp)
    _write(tmp_path, ["base_c2048", "grpo_c2048", "base_t3_c2048", "grpo_t3_c2048"], finished=False)
    assert not matrix.finished_matrix(tmp_path, exp)
    _write(tmp_path, ["base_c2048", "grpo_c2048"])  # finished, but with the 1-turn cell only
    assert not matrix.finished_matrix(tmp_path, exp)
    assert not matrix.finished_matrix(tmp_path / "none", exp)
