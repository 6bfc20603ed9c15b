"""Training time of the arms an SFT-only control is measured against (the gate's `sft_control` check).

An RL arm's training time is its whole training: a `grpo` arm's own train run, a `grpo_sft` arm's GRPO
run plus the SFT run it started from (`init_run`: experiment.json's `init_run`, else its train run.json's
`init_sft.run`, else the sft arm of its cell, as in folders written before the matrix recorded it).
A grpo_sft that started from the sft arm's weights at a branch step N (`sft.init_from = "control"`:
experiment.json's `init_branch`, else run.json's `init_sft.branch`) counts that run's time up to N:
the branch's branch.json `train_seconds`, else the sum of steps.jsonl `time_step_s` of steps 1..N.
`rl_training` returns the parts, `time_problem` the one line refusing a control that trained less.
Times are run.json `train_seconds` (else `gpu_minutes`); absent or unreadable files read as None.
Not covered: the steps.jsonl fallback leaves out checkpoint writes, which `train_seconds` holds.
Times are compared only between runs on one device: `device_problem` refuses the comparison unless the
control's train run and every run of the RL arm's training name the same device (`fmt.device_str`: GPU
name, with the GPU count where recorded; a CPU run's core count and architecture) for every invocation
that trained them (run.json `machines`, else `machine` and `device`): a run resumed on another device
trained on two. An unrecorded device refuses too; a record without a GPU count differs from one with it.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from sqlrl.artifacts import json_number, read_json
from sqlrl.evidence.fmt import device_str
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
        t = json_number(run.get(key))
        if t is not None:
            return t * scale
    return None


MIXED = " + "  # joins the devices of a run trained on more than one


def run_device(run: dict | None) -> str | None:
    """The device a train run.json records, as `fmt.device_str` names it (`GPU: NVIDIA H200`, `CPU:
    16-core x86_64`), over every invocation that trained it (`machines`, else its `machine`); a run
    trained on several devices names each with its steps, joined by `MIXED` (`GPU: A (steps 1-40) +
    GPU: B (steps 41-80)`). None when a machine is not recorded, or is CUDA without the GPU's name."""
    run = run or {}
    entries = run.get("machines")
    if not isinstance(entries, list) or not entries:
        entries = [{"machine": run.get("machine"), "device": run.get("device")}]
    named = []
    for e in entries:
        m = e.get("machine") if isinstance(e, dict) else None
        if not isinstance(m, dict) or not m or (e.get("device") == "cuda" and not m.get("accelerator")):
            return None
        steps = e.get("steps")
        where = f"steps {steps[0]}-{steps[1]}" if isinstance(steps, list) and len(steps) == 2 else "steps ?"
        named.append((device_str(m, e.get("device")), where))
    if len({d for d, _ in named}) == 1:
        return named[0][0]
    return MIXED.join(f"{d} ({where})" for d, where in named)


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


def init_branch(exp: Experiment, arm: Arm, run_dir: Path | None) -> tuple[int | None, float | None]:
    """(step, the SFT run's training seconds up to it) of the branch a grpo_sft arm started from, or
    (None, None) when it started from a run's final weights. Seconds: branch.json's, else steps.jsonl's
    `time_step_s` summed over steps 1..step (None when a step's line is missing)."""
    from sqlrl.training.sft_branch import read_branch

    init = (exp.train_run(arm.name) or {}).get("init_sft") or {}
    declared = arm.spec.get("init_branch") or init.get("branch")
    if not isinstance(declared, str) or not declared:
        return None, None
    folder = Path(declared) if Path(declared).is_absolute() else exp.dir / declared
    branch = read_branch(folder) or {}
    match = re.fullmatch(r"branch_step_(\d+)", folder.name)
    step = branch.get("step") or init.get("step") or (int(match.group(1)) if match else None)
    seconds = json_number(branch.get("train_seconds"))
    if seconds is None and isinstance(step, int) and run_dir is not None:
        seconds = _steps_seconds(run_dir / "steps.jsonl", step)
    return step, seconds


def branch_problem(exp: Experiment, arm: Arm) -> str | None:
    """The line refusing a grpo_sft whose branch folder now holds other weights than the ones it started
    from (its run.json `init_sft.identity` against the branch's branch.json `identity`: the sft arm was
    trained again after it), so that run's time up to the branch is not its SFT part; None otherwise."""
    from sqlrl.training.sft_branch import read_branch

    init = (exp.train_run(arm.name) or {}).get("init_sft") or {}
    declared = init.get("branch")
    if arm.kind != "grpo_sft" or not isinstance(declared, str) or not init.get("identity"):
        return None
    folder = Path(declared) if Path(declared).is_absolute() else exp.dir / declared
    now = (read_branch(folder) or {}).get("identity")
    if now is None or now == init["identity"]:
        return None
    return (
        f"arm '{arm.name}' started from {rel_path(exp, folder)} with weights {init['identity']}, but that "
        f"branch now holds {now} (the sft arm trained again after it): its SFT part is not that run's; "
        f"delete {rel_path(exp, arm.train_dir.parent) if arm.train_dir else 'its arm folder'} to train it "
        "again from the current branch"
    )


def _steps_seconds(path: Path, step: int) -> float | None:
    """Sum of `time_step_s` of steps 1..`step` in a steps.jsonl (a resumed run's last line per step)."""
    per_step: dict[int, float] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        t = json_number(row.get("time_step_s")) if isinstance(row, dict) else None
        if isinstance(row.get("step"), int) and t is not None and row["step"] <= step:
            per_step[row["step"]] = t
    return sum(per_step.values()) if len(per_step) == step else None


def rl_training(exp: Experiment, arm: Arm) -> dict:
    """An RL arm's training time in parts: {"rl": its own train run's seconds, "sft": the seconds of the
    SFT run it started from (grpo_sft; None for an arm that started from the base model or when not
    recorded; from a branch: that run's seconds up to the branch step), "sft_run": that run's folder
    relative to the experiment, "from_control": the name of the sft arm whose own run that is (None for
    grpo_sft's own stage), "branch_step": the step of the sft arm's weights it started from (None: the
    run's final), "total": rl + sft (None when a part is unknown), "devices": [(run folder,
    `run_device`) of its train run, then of that SFT run]}. The SFT part counts: an SFT-only control
    must match the whole, on the same device."""
    rl = train_seconds(exp, arm)
    own = exp.train_run(arm.name) if arm.train_dir is not None else None
    devices = [(rel_path(exp, arm.train_dir), run_device(own))]
    out: dict = {
        "rl": rl,
        "sft": None,
        "sft_run": None,
        "from_control": None,
        "branch_step": None,
        "total": rl,
        "devices": devices,
    }
    if arm.kind != "grpo_sft":
        return out
    d, run = init_run(exp, arm)
    if d is not None:
        devices.append((rel_path(exp, d), run_device(run)))
    out["branch_step"], branch_s = init_branch(exp, arm, d)
    out["sft"] = branch_s if out["branch_step"] is not None else json_number((run or {}).get("train_seconds"))
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
    at = f" up to step {parts['branch_step']}" if parts.get("branch_step") is not None else ""
    head = (
        f"arm '{s.name}' trained {ts / 60:.2f} min, less than '{g.name}' in total ({total / 60:.2f} min = "
        f"SFT part {parts['sft'] / 60:.2f} min in {parts['sft_run']}{at} + GRPO part {parts['rl'] / 60:.2f} "
        "min): not an equal-time control; "
    )
    if parts["from_control"] is not None and parts.get("branch_step") is None:
        return head + (
            f"grpo_sft started from the '{parts['from_control']}' arm's own weights, so no sft.steps can "
            "match it: set sft.init_steps > 0 (grpo_sft then runs its own SFT stage) and size sft.steps to the total"
        )
    steps = (exp.train_run(s.name) or {}).get("steps")
    if isinstance(steps, int) and steps > 0 and ts > 0:
        need = math.ceil(round(total / (ts / steps), 6))
        return head + f"raise sft.steps to at least {need} ({ts / steps:.2f} s a step in '{s.name}')"
    return head + "raise sft.steps"


def device_problem(exp: Experiment, s: Arm, g: Arm, parts: dict) -> str | None:
    """The line refusing to compare `s`'s training time with `g`'s whole training (`parts`, from
    `rl_training`) because the runs did not all train on one recorded device (a run resumed on another
    device did not, whatever the others did); None when they did."""
    runs = [(rel_path(exp, s.train_dir), run_device(exp.train_run(s.name))), *parts["devices"]]
    unknown = [d for d, dev in runs if dev is None]
    if unknown:
        return (
            f"'{s.name}' vs '{g.name}': the device of {', '.join(unknown)} is not recorded (run.json "
            "machine), so the training times cannot be compared; train the runs on one device with "
            "sqlrl, which records it"
        )
    if len({dev for _, dev in runs}) == 1 and MIXED not in runs[0][1]:
        return None
    where = "; ".join(f"{d} on {dev}" for d, dev in runs)
    rl_devs = {dev for _, dev in parts["devices"]}
    fix = (
        f"train '{s.name}' on the device '{g.name}' trained on ({next(iter(rl_devs))}), or "
        if len(rl_devs) == 1 and MIXED not in next(iter(rl_devs))
        else ""
    )
    return (
        f"'{s.name}' vs '{g.name}': trained on different devices ({where}), and training times on "
        f"different devices are not comparable: {fix}train all of these runs on one device"
    )
