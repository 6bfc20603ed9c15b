"""The evidence gate: may this experiment folder state a learning result, or is it "no claim"?

`evidence_gate(exp_dir) -> Verdict` runs a fixed list of checks over an experiment folder (read through
`rundir.Experiment`). A claim is allowed only when every check passes; otherwise `Verdict.missing` lists
every problem in plain words, prefixed with the check name. Checks, in order (names are stable; tests and
CI match on them): `real_run` (not flagged smoke/synthetic/partial, finished, every train run finished),
`core_arms` (base and GRPO arms with eval runs; every GRPO arm, kind grpo or grpo_checker, has a base in
its cell: turns and context length), `controls` (No-update and validity-only arms, train + eval, in the
cell of every GRPO arm), `optimizer_steps` (every GRPO arm has steps with finite grad norms, not all
zero; skipped non-finite steps are disclosed), `weights_audit`, `trajectories` (present, counts and task
ids match the rolled-out results), `equal_budgets` (identical budgets within each cell but a kind's
treatment, `rundir.TREATMENT_BUDGETS`, which it must hold, and as recorded by each eval run),
`same_tasks`, `same_fingerprint`, `leakage_audit`, `identities`, `training`, `exclusions` (those four
and `weights_audit` in `evidence/provenance.py`: audits passed; what was evaluated is what was trained
and audited; training complete, the treatment its kind names; the same unscorable golds), `devices`
(GRPO arms and controls evaluated on one device, `evidence/devices.py`).

"RL adds value over supervised fine-tuning" is a separate claim (`check_sft_control`, outside
`claim_allowed`): the whole gate plus an `sft` arm (train + eval, sound steps) in the cell of every RL
arm (kind `grpo*`), trained at least as long as each RL arm in total (train_seconds; grpo_sft: GRPO part
+ its SFT start, `rl_training`) on its device (`device_problem`) and evaluated there; no sft arm: `SFT_MISSING`.

Covered: every defect of a readable experiment folder becomes a failed check with a named problem; a non-
experiment folder raises `rundir.ExperimentError` (CLI exit 2); no torch import. Not covered: hashes are
compared, not recomputed; structure and consistency, not significance.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlrl.evidence.devices import device_problems, eval_device_problem
from sqlrl.evidence.provenance import (
    exclusion_problems,
    identity_problems,
    leakage_problems,
    training_problems,
    weights_audit_problems,
)
from sqlrl.evidence.rltime import branch_problem, device_problem, rl_training, time_problem, train_seconds
from sqlrl.evidence.rltime import rel_path as _rel
from sqlrl.evidence.rundir import GRPO_KINDS, RUN_FLAGS, TREATMENT_BUDGETS, Arm, Experiment

CONTROL_KINDS = ("no_update", "validity")
SFT_MISSING = "no SFT control: whether RL beats SFT is not answered"


@dataclass
class Check:
    """One check's outcome: `detail` is the success line, or every problem joined."""

    name: str
    passed: bool
    detail: str
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "passed": self.passed,
            "detail": self.detail,
            "problems": list(self.problems),
        }


@dataclass
class Verdict:
    """The gate's outcome for one folder; `to_dict()` is what verdict.json holds."""

    claim_allowed: bool
    checks: list[Check]
    missing: list[str]
    experiment: str = ""
    name: str = ""
    sft_control: Check | None = None

    @property
    def label(self) -> str:
        return "claim" if self.claim_allowed else "no claim"

    @property
    def rl_over_sft_allowed(self) -> bool:
        """May the experiment claim (or deny) that RL adds value over supervised fine-tuning?"""
        return self.claim_allowed and self.sft_control is not None and self.sft_control.passed

    @property
    def rl_over_sft_line(self) -> str:
        """One plain line on the RL-over-SFT claim, for verdict.json and the report."""
        c = self.sft_control
        if c is None or c.problems == [SFT_MISSING]:
            return SFT_MISSING
        if not c.passed:
            return "RL over SFT: no claim: " + c.detail
        if not self.claim_allowed:
            return "RL over SFT: no claim: the evidence gate did not pass (see missing)"
        return "RL over SFT: may be claimed (" + c.detail + "); the grpo* vs sft comparisons answer it"

    def to_dict(self) -> dict:
        return {
            "claim_allowed": self.claim_allowed,
            "verdict": self.label,
            "experiment": self.experiment,
            "name": self.name,
            "missing": list(self.missing),
            "checks": [c.to_dict() for c in self.checks],
            "rl_over_sft": {
                "allowed": self.rl_over_sft_allowed,
                "line": self.rl_over_sft_line,
                "problems": list(self.sft_control.problems) if self.sft_control else [SFT_MISSING],
            },
        }


# ---------------------------------------------------------------------------------------------------------
# Checks


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one dict with dotted keys (`{"a": {"b": 1}}` -> `{"a.b": 1}`)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


_ABSENT = object()


def budget_differences(a: dict, b: dict) -> list[tuple[str, Any, Any]]:
    """Fields (dotted for nested dicts) whose values differ; absent fields are reported as '(absent)'."""
    fa, fb = flatten(a), flatten(b)
    diffs = []
    for k in sorted(set(fa) | set(fb)):
        va, vb = fa.get(k, _ABSENT), fb.get(k, _ABSENT)
        if va != vb:
            diffs.append((k, "(absent)" if va is _ABSENT else va, "(absent)" if vb is _ABSENT else vb))
    return diffs


def _fmt_diffs(diffs: list[tuple[str, Any, Any]]) -> str:
    return ", ".join(
        f"{k} ({json.dumps(vb, default=str)} vs {json.dumps(va, default=str)})" for k, va, vb in diffs
    )


def _check(name: str, problems: list[str], ok_detail: str) -> Check:
    if problems:
        return Check(name, False, "; ".join(problems), problems)
    return Check(name, True, ok_detail, [])


def _cell_words(arm: Arm) -> str:
    return "turns" if arm.context_tokens is None else "turns and context length"


def check_real_run(exp: Experiment) -> Check:
    problems = []
    for flag, on in exp.flags().items():
        if on:
            problems.append(
                f'{flag} run: experiment.json has "{flag}": true, and {flag} runs never become claims'
            )
    if exp.meta.get("started") and not exp.meta.get("finished"):
        problems.append(
            "partial run: experiment.json has no 'finished' timestamp (the experiment did not complete)"
        )
    for arm in exp.arms:
        for label, run in (("train", exp.train_run(arm)), ("eval", exp.eval_run(arm))):
            if isinstance(run, dict):
                for flag in RUN_FLAGS:
                    if run.get(flag) and not exp.flags()[flag]:
                        problems.append(f"{flag} run: arm '{arm}' {label} run.json has \"{flag}\": true")
        train = exp.train_run(arm)
        if isinstance(train, dict) and "status" in train and train["status"] != "finished":
            problems.append(
                f"partial run: arm '{arm}' train run.json status is {train['status']!r} (training did not finish)"
            )
    return _check("real_run", problems, "not a smoke, synthetic or partial run")


def check_core_arms(exp: Experiment) -> Check:
    problems = []
    for kind in ("base", "grpo"):
        arm = exp.primary(kind)
        if arm is None:
            problems.append(f"no arm of kind '{kind}' in experiment.json")
        elif not exp.has_eval(arm.name):
            problems.append(
                f"arm '{arm.name}': eval run missing ({_rel(exp, arm.eval_dir)}/run.json + results.jsonl)"
            )
    if exp.primary("base") is not None:
        for arm in exp.grpo_arms():
            if exp.base_for(arm) is None:
                problems.append(
                    f"arm '{arm.name}' ({arm.cell_label}) has no base arm with the same {_cell_words(arm)} "
                    "to compare against"
                )
    return _check("core_arms", problems, "base and GRPO arms present with eval runs")


def check_controls(exp: Experiment) -> Check:
    problems = []
    for kind in CONTROL_KINDS:
        arms = exp.arms_of(kind)
        if not arms:
            problems.append(f"control '{kind}' missing: no arm of kind '{kind}' in experiment.json")
            continue
        for g in exp.grpo_arms():
            if not exp.same_cell(g, kind):
                problems.append(
                    f"control '{kind}' missing for {g.cell_label}: "
                    f"arm '{g.name}' has no '{kind}' arm with the same {_cell_words(g)}"
                )
        for arm in arms:
            if not exp.has_train(arm.name):
                problems.append(
                    f"control '{arm.name}': train run missing ({_rel(exp, arm.train_dir)}/run.json)"
                )
            if not exp.has_eval(arm.name):
                problems.append(
                    f"control '{arm.name}': eval run missing ({_rel(exp, arm.eval_dir)}/run.json + results.jsonl)"
                )
    return _check("controls", problems, "No-update and validity-only controls present (train + eval)")


def _steps_problems(exp: Experiment, arm: Arm, problems: list[str]) -> int | None:
    """Append the problems of `arm`'s optimizer steps (recorded, finite, not all zero grad norms);
    return how many steps were skipped for a non-finite gradient (None when there are no steps)."""
    path = exp.train_file(arm.name, "steps.jsonl")
    if arm.train_dir is None:
        problems.append(f"arm '{arm.name}': no train run, so no optimizer steps")
        return None
    steps = exp.steps(arm.name)
    if steps is None:
        problems.append(f"arm '{arm.name}': {_rel(exp, path)} missing or unreadable, so no optimizer steps")
        return None
    steps = [s for s in steps if isinstance(s, dict) and "step" in s]
    if not steps:
        problems.append(f"arm '{arm.name}': 0 optimizer steps in {_rel(exp, path)}")
        return None
    # A step whose gradient was non-finite is recorded with skipped_nonfinite = true and no update:
    # it is disclosed in the detail, not counted as a missing grad norm.
    skipped = [s for s in steps if s.get("skipped_nonfinite") is True and s.get("update_applied") is not True]
    steps = [s for s in steps if s not in skipped]
    if not steps:
        problems.append(f"arm '{arm.name}': every step was skipped (non-finite gradients)")
        return len(skipped)
    norms = [s.get("grad_norm") for s in steps]
    unrecorded = sum(1 for g in norms if not isinstance(g, int | float) or isinstance(g, bool))
    nonfinite = sum(1 for g in norms if isinstance(g, int | float) and not math.isfinite(g))
    if unrecorded:
        problems.append(f"arm '{arm.name}': grad_norm not recorded in {unrecorded} of {len(steps)} steps")
    if nonfinite:
        problems.append(f"arm '{arm.name}': non-finite grad_norm in {nonfinite} of {len(steps)} steps")
    if not unrecorded and not nonfinite and all(g == 0 for g in norms):
        problems.append(f"arm '{arm.name}': all {len(steps)} grad norms are zero (no gradient ever flowed)")
    return len(skipped)


def check_optimizer_steps(exp: Experiment) -> Check:
    problems: list[str] = []
    skipped_info: dict[str, int] = {}
    arms = exp.grpo_arms()
    if not arms:
        problems.append("no arm of kind 'grpo' to check for optimizer steps")
    for arm in arms:
        skipped = _steps_problems(exp, arm, problems)
        if skipped:
            skipped_info[arm.name] = skipped
    n = {a.name: len(exp.steps(a.name) or []) - skipped_info.get(a.name, 0) for a in arms}
    detail = "optimizer steps with non-zero grad norms: " + ", ".join(f"{k}={v}" for k, v in n.items())
    if skipped_info:
        detail += "; skipped for a non-finite gradient (no update applied): " + ", ".join(
            f"{k}={v}" for k, v in skipped_info.items()
        )
    return _check("optimizer_steps", problems, detail)


def check_trajectories(exp: Experiment) -> Check:
    problems = []
    for arm in exp.arms:
        tpath, rpath = exp.eval_file(arm, "trajectories.jsonl"), exp.eval_file(arm, "results.jsonl")
        if tpath is None or not tpath.is_file():
            problems.append(f"arm '{arm}': raw trajectories missing ({_rel(exp, tpath)})")
            continue
        trajs = exp.trajectories(arm)
        if trajs is None:
            problems.append(f"arm '{arm}': {_rel(exp, tpath)} is unreadable")
            continue
        if not trajs:
            problems.append(f"arm '{arm}': {_rel(exp, tpath)} is empty")
            continue
        results = exp.results(arm)
        if results is None:
            problems.append(f"arm '{arm}': {_rel(exp, rpath)} missing or unreadable")
            continue
        # tasks with an unscorable gold are excluded before the rollout: they have a result line
        # (status gold_unscorable) and, by design, no trajectory
        rolled = [r for r in results if not (isinstance(r, dict) and r.get("status") == "gold_unscorable")]
        if len(trajs) != len(rolled):
            problems.append(
                f"arm '{arm}': {len(trajs)} trajectories but {len(rolled)} rolled-out results "
                f"({len(results) - len(rolled)} excluded before the rollout)"
            )
            continue
        if all(isinstance(t, dict) and "task_id" in t for t in trajs):
            if sorted(str(t["task_id"]) for t in trajs) != sorted(str(r.get("task_id")) for r in rolled):
                problems.append(f"arm '{arm}': trajectory task ids differ from results task ids")
    return _check("trajectories", problems, "raw trajectories present for every arm, counts match results")


def _cell_differences(ref: Arm, arm: Arm) -> list[tuple[str, Any, Any]]:
    """`budget_differences` of two arms of one cell, less a field one side's kind sets as its treatment
    (`TREATMENT_BUDGETS`) where that side holds the treatment's value and the other has it off (absent
    or false)."""
    out = []
    for k, va, vb in budget_differences(ref.budgets or {}, arm.budgets or {}):
        excused = False
        for side, mine, other in ((ref, va, vb), (arm, vb, va)):
            treat = TREATMENT_BUDGETS.get(side.kind, {})
            excused |= k in treat and mine == treat[k] and (other == "(absent)" or other is False)
        if not excused:
            out.append((k, va, vb))
    return out


def check_equal_budgets(exp: Experiment) -> Check:
    problems = []
    treated = []
    for arm in exp.arms.values():
        if arm.budgets is None:
            problems.append(f"arm '{arm.name}': no budgets declared in experiment.json")
            continue
        for k, v in TREATMENT_BUDGETS.get(arm.kind, {}).items():
            treated.append(f"{arm.name} by {k} = {json.dumps(v)}")
            if arm.budgets.get(k) != v:
                problems.append(
                    f"arm '{arm.name}' (kind {arm.kind}) declares {k} = "
                    f"{json.dumps(arm.budgets.get(k, '(absent)'))}; its kind runs with {k} = {json.dumps(v)}"
                )
    groups: dict[tuple, list[Arm]] = {}
    for arm in exp.arms.values():
        groups.setdefault(arm.cell, []).append(arm)
    for members in groups.values():
        ref = exp.base_for(members[0]) or members[0]
        if ref.budgets is None:
            continue
        for arm in members:
            if arm is ref or arm.budgets is None:
                continue
            diffs = _cell_differences(ref, arm)
            if diffs:
                problems.append(f"budgets differ: arm '{arm.name}' vs '{ref.name}' in {_fmt_diffs(diffs)}")
    for arm in exp.arms.values():
        recorded = exp.eval_budgets(arm.name)
        if arm.budgets is not None and recorded is not None:
            diffs = budget_differences(arm.budgets, recorded)
            if diffs:
                problems.append(
                    f"arm '{arm.name}': eval run used budgets that differ from experiment.json in "
                    f"{_fmt_diffs(diffs)} (recorded vs declared)"
                )
    detail = f"identical budgets across {len(exp.arms)} arms"
    if len(groups) > 1:
        what = (
            "cells (turns, context)"
            if any(a.context_tokens is not None for a in exp.arms.values())
            else "turn groups"
        )
        detail = f"identical budgets within each of {len(groups)} {what} ({len(exp.arms)} arms)"
    if treated:
        detail += "; differing only by their treatment: " + ", ".join(treated)
    return _check("equal_budgets", problems, detail)


def check_same_tasks(exp: Experiment) -> Check:
    problems = []
    sets: dict[str, set[str]] = {}
    for arm in exp.arms:
        results = exp.results(arm)
        if results is None:
            problems.append(f"arm '{arm}': results.jsonl missing, task set unknown")
            continue
        ids = [str(r.get("task_id")) for r in results]
        if len(set(ids)) != len(ids):
            problems.append(f"arm '{arm}': results.jsonl has {len(ids) - len(set(ids))} duplicate task ids")
        sets[arm] = set(ids)

    def describe(arm: str, got: set[str], want: set[str], against: str) -> str | None:
        lacks, extra = sorted(want - got), sorted(got - want)
        if not lacks and not extra:
            return None
        parts = []
        if lacks:
            parts.append(f"{len(lacks)} missing (e.g. {lacks[0]})")
        if extra:
            parts.append(f"{len(extra)} extra (e.g. {extra[0]})")
        return f"task sets differ: arm '{arm}' vs {against}: " + ", ".join(parts)

    declared = exp.meta.get("tasks")
    if isinstance(declared, list) and declared:
        want = {str(t) for t in declared}
        for arm, got in sets.items():
            msg = describe(arm, got, want, "experiment.json tasks")
            if msg:
                problems.append(msg)
    elif sets:
        ref_arm = (
            exp.primary("base").name if exp.primary("base") and exp.primary("base").name in sets else None
        ) or next(iter(sets))
        for arm, got in sets.items():
            if arm != ref_arm:
                msg = describe(arm, got, sets[ref_arm], f"arm '{ref_arm}'")
                if msg:
                    problems.append(msg)
    n = len(next(iter(sets.values()))) if sets else 0
    return _check("same_tasks", problems, f"same {n} task ids in every arm's eval")


def check_same_fingerprint(exp: Experiment) -> Check:
    problems = []
    fps = {}
    for arm in exp.arms:
        fp = exp.fingerprint(arm)
        if fp is None:
            problems.append(f"arm '{arm}': eval records no dataset fingerprint")
        else:
            fps[arm] = fp
    declared = exp.meta.get("fingerprint")
    if declared:
        for arm, fp in fps.items():
            if fp != declared:
                problems.append(
                    f"dataset fingerprint differs: arm '{arm}' has {fp[:12]} but experiment.json has {str(declared)[:12]}"
                )
    elif len(set(fps.values())) > 1:
        problems.append(
            "dataset fingerprints differ across arms: " + ", ".join(f"{a}={fp[:12]}" for a, fp in fps.items())
        )
    return _check(
        "same_fingerprint",
        problems,
        f"one dataset fingerprint: {str(declared or next(iter(fps.values()), ''))[:16]}",
    )


def _problems_check(name: str, problems_of, ok_detail: str):
    def check(exp: Experiment) -> Check:
        return _check(name, problems_of(exp), ok_detail)

    check.__name__ = f"check_{name}"
    return check


check_weights_audit = _problems_check(
    "weights_audit",
    weights_audit_problems,
    "GRPO changed, No-update bit-identical, reloaded identity matches evaluation",
)
check_leakage = _problems_check("leakage_audit", leakage_problems, "gold-mutation leakage audit passed")
check_identities = _problems_check(
    "identities", identity_problems, "every evaluation ran the weights its arm names"
)
check_training = _problems_check(
    "training", training_problems, "every train run complete, each the treatment its kind names"
)
check_exclusions = _problems_check(
    "exclusions", exclusion_problems, "same unscorable golds in every arm, infrastructure failures rare"
)
check_devices = _problems_check("devices", device_problems, "GRPO arms and controls evaluated on one device")


def check_sft_control(exp: Experiment) -> Check:
    """The SFT-only control behind a claim that RL adds value over supervised fine-tuning (not in
    `CHECKS`: it decides `Verdict.rl_over_sft_allowed`, not `claim_allowed`). The control must train at
    least as long as every RL arm's whole training: for grpo_sft its GRPO part plus its SFT start; times
    are compared only when all those runs trained on one recorded device (`rltime.device_problem`)."""
    rl = [a for a in exp.arms.values() if a.kind.startswith("grpo")]
    sfts = exp.arms_of("sft")
    if not sfts:
        return _check("sft_control", [SFT_MISSING], "")
    problems: list[str] = []
    if not rl:
        problems.append("no RL arm (kind grpo*) to compare with the sft arm")
    for g in rl:
        if not exp.same_cell(g, "sft"):
            problems.append(f"arm '{g.name}' ({g.cell_label}) has no sft arm with the same {_cell_words(g)}")
    for arm in sfts + [a for a in rl if a.kind not in GRPO_KINDS]:
        if not exp.has_train(arm.name):
            problems.append(f"arm '{arm.name}': train run missing ({_rel(exp, arm.train_dir)}/run.json)")
            continue
        if not exp.has_eval(arm.name):
            problems.append(
                f"arm '{arm.name}': eval run missing ({_rel(exp, arm.eval_dir)}/run.json + results.jsonl)"
            )
        _steps_problems(exp, arm, problems)
        if arm.kind == "sft" and (exp.train_run(arm.name) or {}).get("weights_changed") is False:
            problems.append(
                f"arm '{arm.name}': weights did not change (train run.json weights_changed=false)"
            )
    times, devices = [], set()
    for g in rl:
        parts = rl_training(exp, g)
        for s in exp.same_cell(g, "sft"):
            ts = train_seconds(exp, s)
            if ts is None or parts["rl"] is None:
                problems.append(
                    f"training time of '{s.name}' or '{g.name}' not recorded (train run.json train_seconds)"
                )
            elif parts["total"] is None:
                where = (
                    f"{parts['sft_run'] or 'no SFT run found'}/run.json train_seconds"
                    if parts.get("branch_step") is None
                    else f"branch.json train_seconds of its branch at step {parts['branch_step']}, or steps.jsonl "
                    f"time_step_s of every step up to it, in {parts['sft_run']}"
                )
                problems.append(
                    f"arm '{g.name}': the training time of the SFT run it started from is not recorded "
                    f"({where}), so its total is unknown"
                )
            elif (
                line := branch_problem(exp, g)
                or device_problem(exp, s, g, parts)
                or eval_device_problem(exp, s, g)
                or time_problem(exp, s, g, ts, parts)
            ) is not None:
                problems.append(line)
            else:
                devices.add(parts["devices"][0][1])
                split = (
                    f" (SFT part {parts['sft'] / 60:.2f} + GRPO part {parts['rl'] / 60:.2f})"
                    if parts["sft"] is not None
                    else ""
                )
                times.append(f"{s.name} {ts / 60:.2f} min >= {g.name} {parts['total'] / 60:.2f} min{split}")
    detail = "sft control present for every RL arm" + (
        f"; {', '.join(times)} of training on {', '.join(sorted(devices))}" if times else ""
    )
    return _check("sft_control", problems, detail)


CHECKS = (
    check_real_run,
    check_core_arms,
    check_controls,
    check_optimizer_steps,
    check_weights_audit,
    check_trajectories,
    check_equal_budgets,
    check_same_tasks,
    check_same_fingerprint,
    check_leakage,
    check_identities,
    check_training,
    check_exclusions,
    check_devices,
)


def evidence_gate(exp_dir: str | Path | Experiment) -> Verdict:
    """Apply every check; a claim is allowed only if all pass. Raises rundir.ExperimentError for a
    non-experiment folder."""
    exp = exp_dir if isinstance(exp_dir, Experiment) else Experiment(exp_dir)
    checks = [fn(exp) for fn in CHECKS]
    missing = [f"{c.name}: {p}" for c in checks for p in c.problems]
    return Verdict(
        claim_allowed=all(c.passed for c in checks),
        checks=checks,
        missing=missing,
        experiment=str(exp.dir),
        name=exp.name,
        sft_control=check_sft_control(exp),
    )
