"""The SFT trainer's learning curve and learning-rate schedule, on CPU.

The embedded Spider demo slice, the byte-level test tokenizer and the tiny random Qwen2 of
test_trainer.py (as test_sft_text2sql.py).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import pytest

from sqlrl import config as C
from sqlrl import config_tables as T
from sqlrl.training.schedule import lr_factor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_sft_text2sql import _cfg  # noqa: E402
from test_trainer import tiny_factory  # noqa: E402


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _final(run: Path) -> str:
    return json.loads((run / "final" / "identity.json").read_text())["weights_hash"]


def _curve_cfg():
    return _cfg().replace(
        run={"eval_every": 2, "eval_tasks": 3, "gen_engine": "fast"}, agent={"max_new_tokens": 64}
    )


def test_sft_curve_points_leave_training_unchanged_stay_out_of_train_seconds_and_resume(
    tmp_path, monkeypatch
):
    from sqlrl.evaluation import runner
    from sqlrl.training.sft import train_sft

    sft = T.sft_from_dict({"steps": 3, "batch_size": 2, "micro_batch": 2, "lr": 1e-3})
    kw = dict(policy_factory=tiny_factory, progress=False)
    plain = tmp_path / "plain"
    train_sft(_cfg().replace(agent={"max_new_tokens": 64}), sft, plain, **kw)
    real = runner.evaluate_tasks

    def slow(*a, **k):  # every point takes at least 2.5 s
        time.sleep(2.5)
        return real(*a, **k)

    monkeypatch.setattr(runner, "evaluate_tasks", slow)
    full = tmp_path / "full"
    t0 = time.perf_counter()
    train_sft(_curve_cfg(), sft, full, **kw)
    wall = time.perf_counter() - t0
    pts = _lines(full / "curve.jsonl")
    assert [p["step"] for p in pts] == [2, 3]  # every 2nd step and the last
    assert all(p["n_tasks"] == 3 and p["n"] + sum(p["excluded"].values()) == 3 for p in pts)
    assert all(p["seconds"] >= 2.5 for p in pts)
    assert _final(full) == _final(plain)  # the points never reached the update
    assert [s["loss"] for s in _lines(full / "steps.jsonl")] == [
        s["loss"] for s in _lines(plain / "steps.jsonl")
    ]
    run = json.loads((full / "run.json").read_text())
    base = json.loads((plain / "run.json").read_text())
    # >= 5 s of points are in curve_seconds and not in train_seconds: the steps' time fits in the call's
    # wall time without them (with them inside, train_seconds would exceed it unless setup took > 5 s).
    # Against this run's own wall time, so a loaded machine slows both sides alike.
    assert run["curve_seconds"] >= 5.0
    assert run["train_seconds"] <= wall - run["curve_seconds"], (run["train_seconds"], wall)
    assert base["train_seconds"] > 0
    assert run["curve_budgets"]["turns"] == 1
    monkeypatch.setattr(runner, "evaluate_tasks", real)
    part = tmp_path / "part"
    train_sft(_curve_cfg(), sft, part, stop_after=2, **kw)  # checkpoint at step 2 (checkpoint_every = 1)
    assert [p["step"] for p in _lines(part / "curve.jsonl")] == [2]
    (part / "curve.jsonl").write_text((part / "curve.jsonl").read_text() + json.dumps({"step": 3}) + "\n")
    train_sft(_curve_cfg(), sft, part, resume=True, **kw)  # the point after the checkpoint is measured again
    again = _lines(part / "curve.jsonl")
    assert [p["step"] for p in again] == [2, 3]
    assert [p["execution_match"] for p in again] == [p["execution_match"] for p in pts]


def test_sft_curve_evaluates_at_the_turns_it_is_given(tmp_path):
    from sqlrl.agent.loop import Budgets
    from sqlrl.training.sft import curve_budgets

    cfg = _cfg()
    single = Budgets.from_config(cfg.agent)
    assert curve_budgets(cfg, single, None) is single and curve_budgets(cfg, single, 1) is single
    three = curve_budgets(cfg, single, 3)
    assert three == Budgets.from_config(cfg.replace(agent={"turns": 3}).agent) and three.turns == 3


def test_lr_factor_by_hand():
    # warm-up 2 steps, decay over steps 3..10 to 0.1: fraction (step - 2) / 8
    cos = dict(warmup_steps=2, schedule="cosine", total_steps=10, min_ratio=0.1)
    assert lr_factor(1, **cos) == pytest.approx(0.5, abs=1e-12)
    assert lr_factor(2, **cos) == pytest.approx(1.0, abs=1e-12)
    assert lr_factor(4, **cos) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)), abs=1e-12)
    assert lr_factor(6, **cos) == pytest.approx(0.55, abs=1e-12)  # halfway: 0.1 + 0.9 * 0.5
    assert lr_factor(10, **cos) == pytest.approx(0.1, abs=1e-12)
    assert lr_factor(12, **cos) == pytest.approx(0.1, abs=1e-12)  # after the end it stays
    lin = {**cos, "schedule": "linear"}
    assert lr_factor(4, **lin) == pytest.approx(0.775, abs=1e-12)  # 0.1 + 0.9 * (1 - 2/8)
    assert lr_factor(8, **lin) == pytest.approx(0.325, abs=1e-12)  # 0.1 + 0.9 * (1 - 6/8)
    assert lr_factor(1, 0, "linear", 4, 0.0) == pytest.approx(0.75, abs=1e-12)  # no warm-up: 1 - 1/4
    # constant: exactly the warm-up rule it always had (bit for bit)
    for warm in (0, 1, 3, 10):
        for s in range(0, 30):
            old = min(1.0, (s + 1) / warm) if warm else 1.0
            assert lr_factor(s + 1, warm) == old
    with pytest.raises(ValueError, match="nothing to decay over"):
        lr_factor(5, 4, "cosine", 4, 0.0)


def test_sft_cosine_schedule_in_a_run_and_across_a_resume(tmp_path):
    """steps.jsonl `lr` is the rate after the step's scheduler advance, i.e. the one the next step uses:
    warm-up 1, cosine to 0 at step 4, lr 1e-3: steps 1..4 use 1e-3, 7.5e-4, 2.5e-4, 0."""
    from sqlrl.training.sft import train_sft

    sft = T.sft_from_dict(
        {
            "steps": 4,
            "batch_size": 2,
            "micro_batch": 2,
            "lr": 1e-3,
            "warmup_steps": 1,
            "lr_schedule": "cosine",
        }
    )
    kw = dict(policy_factory=tiny_factory, progress=False)
    full = tmp_path / "full"
    train_sft(_cfg(), sft, full, **kw)
    want = [7.5e-4, 2.5e-4, 0.0, 0.0]  # after steps 1..4: the rates of steps 2..5
    got = [s["lr"] for s in _lines(full / "steps.jsonl")]
    assert got == pytest.approx(want, abs=1e-12)
    part = tmp_path / "part"
    train_sft(_cfg(), sft, part, stop_after=2, **kw)
    train_sft(_cfg(), sft, part, resume=True, **kw)
    assert [s["lr"] for s in _lines(part / "steps.jsonl")] == pytest.approx(want, abs=1e-12)
    assert _final(part) == _final(full)
    # the schedule is part of the run's config: a resume with another one is refused
    with pytest.raises(C.ConfigError, match="sft.lr_schedule"):
        other = T.sft_from_dict(
            {**json.loads((full / "config.json").read_text())["sft"], "lr_schedule": "linear"}
        )
        train_sft(_cfg(), other, part, resume=True, **kw)


def test_schedule_settings_are_checked_and_constant_keeps_the_config():
    from sqlrl.training.sft import resolved

    with pytest.raises(C.ConfigError, match="lr_schedule"):
        T.sft_from_dict({"lr_schedule": "exponential"})
    with pytest.raises(C.ConfigError, match=r"min_lr_ratio = 1.0: .*\[0, 1\)"):
        T.sft_from_dict({"lr_schedule": "cosine", "min_lr_ratio": 1.0})
    with pytest.raises(C.ConfigError, match="changes nothing with sft.lr_schedule"):
        T.sft_from_dict({"min_lr_ratio": 0.1})
    with pytest.raises(C.ConfigError, match=r"sft.steps = 5, but sft.warmup_steps = 5 leaves no step"):
        T.sft_from_dict({"lr_schedule": "linear", "steps": 5, "warmup_steps": 5})
    with pytest.raises(C.ConfigError, match=r"sft.init_steps = 3, but sft.warmup_steps = 5"):
        T.sft_from_dict({"lr_schedule": "linear", "steps": 50, "init_steps": 3, "warmup_steps": 5})
    T.sft_from_dict({"lr_schedule": "linear", "steps": 50, "init_steps": 0, "warmup_steps": 5})
    # constant (the default) leaves config.json, and so the config hash of existing runs, as it was
    assert "lr_schedule" not in resolved(_cfg(), T.sft_from_dict({}))["sft"]
    cos = resolved(_cfg(), T.sft_from_dict({"lr_schedule": "cosine", "min_lr_ratio": 0.1}))["sft"]
    assert (cos["lr_schedule"], cos["min_lr_ratio"]) == ("cosine", 0.1)


def test_sft_curve_of_a_full_fine_tune_generates_with_a_refreshed_generation_dtype_copy(
    tmp_path, monkeypatch
):
    """model.dtype = "bfloat16" on CPU: float32 master weights train, a bfloat16 copy generates (as in GRPO);
    every point sees the weights of its step, cast."""
    import torch

    from sqlrl.evaluation import runner
    from sqlrl.training.sft import train_sft

    seen = []
    real = runner.evaluate_tasks

    def spy(tasks, policy, *a, **k):
        w = next(policy.model.parameters())
        seen.append((w.dtype, w.detach().clone(), policy.identity))
        return real(tasks, policy, *a, **k)

    monkeypatch.setattr(runner, "evaluate_tasks", spy)
    sft = T.sft_from_dict({"steps": 2, "batch_size": 2, "micro_batch": 2, "lr": 1e-2})
    cfg = _curve_cfg().replace(model={"dtype": "bfloat16"}, run={"eval_every": 1, "eval_tasks": 1})
    out = tmp_path / "bf16"
    train_sft(cfg, sft, out, policy_factory=tiny_factory, progress=False)
    assert [d for d, _, _ in seen] == [torch.bfloat16, torch.bfloat16]
    assert not torch.equal(seen[0][1], seen[1][1])  # refreshed from the trained weights between points
    assert [i.rsplit("@", 1)[1] for _, _, i in seen] == ["bf16:step1", "bf16:step2"]
    from safetensors.torch import load_file

    final = load_file(str(next((out / "final").glob("*.safetensors"))))
    name = next(k for k in final if k.endswith("embed_tokens.weight"))
    assert torch.equal(final[name].to(torch.bfloat16), seen[1][1])  # the last point: the final weights


def test_sft_curve_setup_time_is_not_taken_out_of_train_seconds(tmp_path, monkeypatch):
    """The curve's generation policy is built before training starts; its time goes to curve_seconds and
    must not be subtracted from train_seconds, which then still covers the steps' own time (steps.jsonl
    time_step_s). The setup is made to take 4 s, far more than the steps of this tiny model."""
    from sqlrl.training import trainer
    from sqlrl.training.sft import train_sft

    real = trainer.rollout_policy

    def slow(*a, **k):
        time.sleep(4.0)
        return real(*a, **k)

    monkeypatch.setattr(trainer, "rollout_policy", slow)
    sft = T.sft_from_dict({"steps": 2, "batch_size": 2, "micro_batch": 2, "lr": 1e-3})
    cfg = _curve_cfg().replace(run={"eval_every": 2, "eval_tasks": 1})
    out = tmp_path / "setup"
    train_sft(cfg, sft, out, policy_factory=tiny_factory, progress=False)
    run = json.loads((out / "run.json").read_text())
    steps_s = sum(s["time_step_s"] for s in _lines(out / "steps.jsonl"))
    assert run["curve_seconds"] >= 4.0
    assert run["train_seconds"] >= steps_s - 0.01, (run["train_seconds"], steps_s)


def test_sft_steps_run_without_the_curves_rollout_engine(tmp_path, monkeypatch):
    """The static engine a curve point builds (KV cache and CUDA graphs, sized by the validation batch) is
    dropped after the point: SFT steps never generate, and on a GPU they need that memory (the SFT step
    has no out-of-memory retry). bfloat16 generation copy on CPU, as a full fine-tune on CUDA."""
    from sqlrl.training import sft_loop, trainer
    from sqlrl.training.sft import train_sft

    gens, held = [], []
    real_policy, real_step = trainer.rollout_policy, sft_loop.sft_step

    def policy(*a, **k):
        out = real_policy(*a, **k)
        gens.append(out[0])
        return out

    def step(*a, **k):
        held.append(hasattr(gens[0], "_sqlrl_static"))
        return real_step(*a, **k)

    monkeypatch.setattr(trainer, "rollout_policy", policy)
    monkeypatch.setattr(sft_loop, "sft_step", step)
    sft = T.sft_from_dict({"steps": 3, "batch_size": 2, "micro_batch": 2, "lr": 1e-3})
    cfg = _curve_cfg().replace(
        model={"dtype": "bfloat16"}, run={"eval_every": 1, "eval_tasks": 1, "gen_engine": "static"}
    )
    train_sft(cfg, sft, tmp_path / "run", policy_factory=tiny_factory, progress=False)
    assert len(_lines(tmp_path / "run" / "curve.jsonl")) == 3  # a point after every step
    assert held == [False, False, False]  # steps 2 and 3 follow a point: its engine is gone
    assert not hasattr(gens[0], "_sqlrl_static")
