"""The learning curve: validation points every N steps that never change what is trained."""

from __future__ import annotations

import json

import pytest

from sqlrl.config import ConfigError


def _points(run) -> list[dict]:
    return [json.loads(x) for x in (run / "curve.jsonl").read_text().splitlines() if x.strip()]


def test_curve_points_leave_training_unchanged_and_resume(tmp_path):
    from tests.training.test_trainer import Alternating, final_hash, tiny_cfg, tiny_factory

    from sqlrl.training.trainer import train

    kw = dict(policy_factory=tiny_factory, evaluator_factory=Alternating, progress=False)
    plain = tmp_path / "plain"
    train(tiny_cfg(steps=3), plain, **kw)
    cfg = tiny_cfg(steps=3).replace(run={"eval_every": 2, "eval_tasks": 3})
    full = tmp_path / "full"
    train(cfg, full, **kw)
    pts = _points(full)
    assert [p["step"] for p in pts] == [2, 3]  # every 2nd step and the last
    assert all(p["n_tasks"] == 3 and p["n"] + sum(p["excluded"].values()) == 3 for p in pts)
    assert final_hash(full) == final_hash(plain)  # the evaluation never reached the update
    run = json.loads((full / "run.json").read_text())
    assert run["curve_seconds"] > 0 and run["train_seconds"] > 0
    part = tmp_path / "part"
    train(cfg, part, stop_after=2, **kw)  # checkpoint at step 2 (checkpoint_every = 1)
    assert [p["step"] for p in _points(part)] == [2]
    (part / "curve.jsonl").write_text((part / "curve.jsonl").read_text() + json.dumps({"step": 3}) + "\n")
    train(cfg, part, resume=True, **kw)  # a point after the checkpoint is dropped, then measured again
    assert [p["step"] for p in _points(part)] == [2, 3]
    assert [p["execution_match"] for p in _points(part)] == [p["execution_match"] for p in pts]


def test_curve_settings_are_checked():
    from tests.training.test_trainer import tiny_cfg

    with pytest.raises(ConfigError, match="eval_every"):
        tiny_cfg().replace(run={"eval_every": -1})
    with pytest.raises(ConfigError, match="text2sql-only"):
        tiny_cfg().replace(run={"eval_every": 5}, data={"kind": "debug"})
