"""An SFT run's branch point (`training/sft_branch.py`): its weights after step N as a loadable folder.

The tiny random Qwen2 of test_trainer.py on 4 embedded Spider training golds, on CPU; a branch of a
3-step run at step 2 against a separate 2-step run, with a constant and with a cosine schedule.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sqlrl import config_tables as T
from sqlrl.training.sft import train_sft

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_sft_text2sql import _cfg  # noqa: E402
from test_trainer import tiny_factory  # noqa: E402

BASE = {"batch_size": 2, "micro_batch": 1, "lr": 1e-3}


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def _steps(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "steps.jsonl").read_text().splitlines()]


def _pair(tmp_path: Path, schedule: dict) -> tuple[Path, Path]:
    """(a 3-step run branched at step 2, a 2-step run) with the same settings otherwise."""
    long_run, short_run = tmp_path / "long", tmp_path / "short"
    sft3 = T.sft_from_dict({**BASE, **schedule, "steps": 3})
    res = train_sft(_cfg(), sft3, long_run, policy_factory=tiny_factory, progress=False, branch_step=2)
    assert res["finished"]
    sft2 = T.sft_from_dict({**BASE, **schedule, "steps": 2})
    assert train_sft(_cfg(), sft2, short_run, policy_factory=tiny_factory, progress=False)["finished"]
    return long_run, short_run


def test_constant_schedule_branch_equals_the_final_of_a_run_of_that_many_steps(tmp_path):
    long_run, short_run = _pair(tmp_path, {})
    branch = long_run / "branch_step_000002"
    ident = _read(branch / "identity.json")
    info = _read(branch / "branch.json")
    run = _read(long_run / "run.json")
    # a loadable folder as a final: weights, tokenizer, identity at step 2; no optimizer state
    assert ident["step"] == 2 and (branch / "config.json").is_file()
    assert any(branch.glob("*.safetensors")) and not any(branch.glob("*.pt"))
    assert info["step"] == 2 and info["of_steps"] == 3 and info["same_as_n_step_run"] is True
    assert info["identity"] == ident["weights_hash"] and info["lr"] == 1e-3
    assert 0 < info["train_seconds"] <= run["train_seconds"]
    assert run["branch"] == {"folder": "branch_step_000002", **info} and run["branch_seconds"] > 0
    # the first two steps are the same batches and losses in both runs (data order from run.seed only)
    a, b = _steps(long_run), _steps(short_run)
    assert [(x["task_ids"], x["loss"], x["lr"]) for x in a[:2]] == [
        (x["task_ids"], x["loss"], x["lr"]) for x in b
    ]
    # bit-equal weights: the 2-step run's final hash is the branch's, and the 3-step final differs
    short_final = _read(short_run / "final/identity.json")["weights_hash"]
    assert ident["weights_hash"] == short_final != _read(long_run / "final/identity.json")["weights_hash"]
    # no branch folder without a branch step; config.json leaves the matrix's init_* settings out
    assert not list(short_run.glob("branch_step_*")) and "branch" not in _read(short_run / "run.json")
    assert "init_from" not in _read(long_run / "config.json")["sft"]


def test_cosine_schedule_branch_is_the_controls_weights_mid_decay(tmp_path):
    # step k's factor is 0.5 * (1 + cos(pi * k / steps)): step 2 of 3 at 0.25, step 2 of 2 at 0.0 (a
    # steps.jsonl line's lr is the scheduler's after its step: the next step's)
    long_run, short_run = _pair(tmp_path, {"lr_schedule": "cosine"})
    info = _read(long_run / "branch_step_000002/branch.json")
    assert info["same_as_n_step_run"] is False and info["lr_schedule"] == "cosine"
    assert abs(info["lr"] - 0.25e-3) < 1e-12
    a, b = _steps(long_run), _steps(short_run)
    assert a[0]["task_ids"] == b[0]["task_ids"] and a[0]["loss"] == b[0]["loss"]  # same start
    assert abs(a[0]["lr"] - 0.25e-3) < 1e-12 and b[0]["lr"] == 0.0
    short_final = _read(short_run / "final/identity.json")["weights_hash"]
    assert info["identity"] != short_final


def test_the_branch_export_leaves_the_control_run_unchanged(tmp_path):
    """The sft control with a branch at step 2 ends with the same weights, losses and checkpoints' worth
    of steps as the same run without one, and a run resumed across the branch step exports it."""
    sft3 = T.sft_from_dict({**BASE, "steps": 3})
    kw = dict(policy_factory=tiny_factory, progress=False)
    train_sft(_cfg(), sft3, tmp_path / "branched", branch_step=2, **kw)
    train_sft(_cfg(), sft3, tmp_path / "plain", **kw)
    final = [_read(tmp_path / r / "final/identity.json")["weights_hash"] for r in ("branched", "plain")]
    assert final[0] == final[1]
    assert [x["loss"] for x in _steps(tmp_path / "branched")] == [
        x["loss"] for x in _steps(tmp_path / "plain")
    ]
    # stopped after step 1 (checkpoint), resumed: the resumed invocation exports the branch
    run = tmp_path / "resumed"
    assert not train_sft(_cfg(), sft3, run, branch_step=2, stop_after=1, **kw)["finished"]
    assert not list(run.glob("branch_step_*"))
    train_sft(_cfg(), sft3, run, branch_step=2, resume=True, **kw)
    info = _read(run / "branch_step_000002/branch.json")
    assert info["identity"] == _read(tmp_path / "branched/branch_step_000002/identity.json")["weights_hash"]
    assert 0 < info["train_seconds"] <= _read(run / "run.json")["train_seconds"]
    assert _read(run / "final/identity.json")["weights_hash"] == final[0]
