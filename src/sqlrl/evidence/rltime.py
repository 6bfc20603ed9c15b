"""Training time of the arms an SFT-only control is measured against (the gate's `sft_control` check).

An RL arm's training time is its whole training: a `grpo` arm's own train run, a `grpo_sft` arm's GRPO
run plus the SFT run it started from (`init_run`: experiment.json's `init_run`, else its train run.json's
`init_sft.run`, else the sft arm of its cell, as in folders written before the matrix recorded it).
`rl_training` returns the parts, `time_problem` the one line refusing a control that trained less.
Times are run.json `train_seconds` (else `gpu_minutes`); absent or unreadable files read as None.
"""

from __future__ import annotations

import math
from pathlib import Path

from sqlrl.artifacts import read_json
from sqlrl.evidence.rundir import Arm, Experiment


def rel_path(exp: Experiment, path: Path | None) -> str:
    if path is None:
        return "(none)"
    try:
        return str(path.relative_to(exp.dir))
    except ValueError:
        return str(path)


def train_seconds(exp: Experiment, arm: Arm) -> float | None:
    run = exp.train_run(arm.name) if arm.train_dir is not None else None
    if not isinstance(run, dict):
        return None
    for key, scale in (("train_seconds", 1.0), ("gpu_minutes", 60.0)):
        t = run.get(key)
        if isinstance(t, int | float) and not isinstance(t, bool):
            return float(t) * scale
    return None


def init_run(exp: Experiment, arm: Arm) -> tuple[Path | None, dict | None]:
    """(folder, run.json) of the SFT run a grpo_sft arm started from: experiment.json's `init_run`, else
    its train run.json's `init_sft.run`, else (folders written before either existed) the sft arm of its
    cell, whose final weights grpo_sft then started from."""
    declared = arm.spec.get("init_run") or ((exp.train_run(arm.name) or {}).get("init_sft") or {}).get("run")
    if isinstance(declared, str) and declared:
        d = Path(declared) if Path(declared).is_absolute() else exp.dir / declared
    else:
        same = [s for s in exp.same_cell(arm, "sft") if s.train_dir is not None]
        if not same:
            return None, None
        d = same[0].train_dir
    try:
        run = read_json(d / "run.json")
    except (OSError, ValueError):
        run = None
    return d, run if isinstance(run, dict) else None


def rl_training(exp: Experiment, arm: Arm) -> dict:
    """An RL arm's training time in parts: {"rl": its own train run's seconds, "sft": the seconds of the
    SFT run it started from (grpo_sft; None for an arm that started from the base model or when not
    recorded), "sft_run": that run's folder relative to the experiment, "from_control": the name of the
    sft arm whose own run that is (None for grpo_sft's own stage), "total": rl + sft (None when a part
    is unknown)}. The SFT part counts: an SFT-only control must match the whole."""
    rl = train_seconds(exp, arm)
    out: dict = {"rl": rl, "sft": None, "sft_run": None, "from_control": None, "total": rl}
    if arm.kind != "grpo_sft":
        return out
    d, run = init_run(exp, arm)
    t = (run or {}).get("train_seconds")
    out["sft"] = float(t) if isinstance(t, int | float) and not isinstance(t, bool) else None
    out["sft_run"] = rel_path(exp, d) if d is not None else None
    if d is not None:
        for s in exp.arms_of("sft"):
            if s.train_dir is not None and s.train_dir.resolve() == d.resolve():
                out["from_control"] = s.name
    out["total"] = rl + out["sft"] if rl is not None and out["sft"] is not None else None
    return out


def time_problem(exp: Experiment, s: Arm, g: Arm, ts: float, parts: dict) -> str | None:
    """The line refusing `s` as `g`'s equal-time control, or None when `s` trained long enough."""
    total = parts["total"]
    if ts >= total:
        return None
    if parts["sft"] is None:
        return (
            f"arm '{s.name}' trained {ts / 60:.2f} min, less than '{g.name}' ({total / 60:.2f} min): "
            "not an equal-time control; raise sft.steps"
        )
    head = (
        f"arm '{s.name}' trained {ts / 60:.2f} min, less than '{g.name}' in total ({total / 60:.2f} min = "
        f"SFT part {parts['sft'] / 60:.2f} min in {parts['sft_run']} + GRPO part {parts['rl'] / 60:.2f} min): "
        "not an equal-time control; "
    )
    if parts["from_control"] is not None:
        return head + (
            f"grpo_sft started from the '{parts['from_control']}' arm's own weights, so no sft.steps can "
            "match it: set sft.init_steps > 0 (grpo_sft then runs its own SFT stage) and size sft.steps to the total"
        )
    steps = (exp.train_run(s.name) or {}).get("steps")
    if isinstance(steps, int) and steps > 0 and ts > 0:
        need = math.ceil(round(total / (ts / steps), 6))
        return head + f"raise sft.steps to at least {need} ({ts / steps:.2f} s a step in '{s.name}')"
    return head + "raise sft.steps"
