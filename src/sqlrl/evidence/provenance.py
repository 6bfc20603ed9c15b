"""Evidence checks that tie an experiment's figures to what was trained: identities, training, exclusions.

The problems (plain lines) of five checks of the gate (`gate.CHECKS`). `weights_audit`: passed, each
verdict true, no errors recorded. `leakage_audit`: leakage.json passed, on at least one task, with its
static check and every per-turn budget passed. And:
- `identities`: every evaluation records the identity (weights hash) of the model it ran; a base arm ran
  the base weights (the weight audit's `hashes.base`, else the primary base arm's); an arm with a train
  run evaluated exactly its train run's `final_identity`, which its `final/identity.json` repeats; a
  No-update arm's final weights are the base weights and every other trained arm's are not (a validity
  control that never changed is no control); the weight audit's `trained` and `no_update` hashes, in
  every cell, are grpo and no_update finals; every trajectory's model identity is its evaluation's.
- `training`: every evaluated arm but a base or control one has a readable train run.json, recording its
  status (real_run requires "finished"), with every configured step recorded (distinct `step` values
  of steps.jsonl = `grpo.steps`, or `sft.steps` for an sft arm, = run.json `steps`); each arm's config
  is the treatment its kind names (grpo kinds and grpo_sft: not the validity reward, no control;
  no_update: `control = "no-update"`; validity: the validity reward, no control; sft: an `[sft]`
  table); within a cell the controls trained with the GRPO arm's steps, tasks per step, group size and
  temperature; every train run has one `run.seed`.
- `exclusions`: every evaluation has a readable summary.json; unscorable golds are a property of the
  gold, so every arm excludes the same tasks as `gold_unscorable`; at most 1 % of an arm's tasks (or
  one task) end in an infrastructure failure (excluded, never scored as wrong: above that the
  comparison could hinge on them; re-run the evaluation); every other row has a true/false `correct`
  that its status agrees with (true only for `match`); results cover the task ids run.json lists.

Not covered: hashes are compared as recorded, not recomputed (`sqlrl audit weights` does that).
"""

from __future__ import annotations

import json
import math

from sqlrl.evaluation.outcome import EXCLUDED_STATUSES, outcome
from sqlrl.evidence.rundir import GRPO_KINDS, Arm, Experiment

TRAINED_NOT_BASE = (*GRPO_KINDS, "grpo_sft", "validity", "sft")
SAME_TRAINING = ("steps", "prompts_per_step", "group_size", "temperature")  # grpo.* a control shares
INFRA_SHARE = 0.01
AUDIT_VERDICTS = {
    "trained_changed": "GRPO weights did not change (trained_changed=false)",
    "no_update_identical": "No-update weights are not bit-identical to the base (no_update_identical=false)",
    "reloaded_identity": "reloaded weights do not match the evaluated identity (reloaded_identity=false)",
}


def _str(v) -> str | None:
    return v if isinstance(v, str) and v else None


def eval_identity(exp: Experiment, arm: str) -> str | None:
    run = exp.eval_run(arm)
    model = run.get("model") if isinstance(run, dict) else None
    return _str(model.get("identity")) if isinstance(model, dict) else None


def final_identity(exp: Experiment, arm: str) -> str | None:
    run = exp.train_run(arm)
    return _str(run.get("final_identity")) if isinstance(run, dict) else None


def recorded_weights(exp: Experiment, arm: str) -> str | None:
    """The weights hash the arm's `final/identity.json` records (None when there is none)."""
    d = exp.arms[arm].train_dir
    ident = exp.run_json(d / "final", "identity.json") if d is not None else None
    return _str(ident.get("weights_hash")) if isinstance(ident, dict) else None


def _short(h: str | None) -> str:
    return (h or "none")[:19]


def _base_identity(exp: Experiment) -> str | None:
    audit = exp.audit("weights_audit.json")
    hashes = audit.get("hashes") if isinstance(audit, dict) else None
    if isinstance(hashes, dict) and _str(hashes.get("base")):
        return hashes["base"]
    base = exp.primary("base")
    return eval_identity(exp, base.name) if base is not None else None


def _trained_identity_problems(
    exp: Experiment, arm: Arm, base: str | None, evaluated: str | None
) -> list[str]:
    final = final_identity(exp, arm.name)
    if final is None:
        return [f"arm '{arm.name}': its train run.json records no final_identity"]
    out = []
    recorded = recorded_weights(exp, arm.name)
    if recorded is not None and recorded != final:
        out.append(f"arm '{arm.name}': final/identity.json says {_short(recorded)}, run.json {_short(final)}")
    if evaluated is not None and evaluated != final:
        out.append(
            f"arm '{arm.name}' evaluated weights {_short(evaluated)}, not its trained weights {_short(final)}"
        )
    if base is not None and arm.kind == "no_update" and final != base:
        out.append(
            f"arm '{arm.name}': No-update's final weights {_short(final)} are not the base {_short(base)}"
        )
    if base is not None and arm.kind in TRAINED_NOT_BASE and final == base:
        out.append(f"arm '{arm.name}': its final weights are the base weights ({_short(base)})")
    return out


def identity_problems(exp: Experiment) -> list[str]:
    problems: list[str] = []
    base = _base_identity(exp)
    for arm in exp.arms.values():
        if arm.eval_dir is None or exp.eval_run(arm.name) is None:
            continue  # a missing evaluation is core_arms' / controls' problem
        evaluated = eval_identity(exp, arm.name)
        if evaluated is None:
            problems.append(f"arm '{arm.name}': its eval run.json records no model identity")
        elif arm.kind == "base" and base is not None and evaluated != base:
            problems.append(
                f"arm '{arm.name}' evaluated {_short(evaluated)}, not the base weights {_short(base)}"
            )
        if exp.has_train(arm.name):
            problems += _trained_identity_problems(exp, arm, base, evaluated)
        odd = sum(
            1
            for t in exp.trajectories(arm.name) or []
            if isinstance(t, dict)
            and isinstance(t.get("model"), dict)
            and "identity" in t["model"]
            and t["model"]["identity"] != evaluated
        )
        if odd:
            problems.append(
                f"arm '{arm.name}': {odd} trajectories record another model identity than its evaluation"
            )
    return problems + _audit_identity_problems(exp)


def _audit_identity_problems(exp: Experiment) -> list[str]:
    """Each cell audit's `trained` / `no_update` hash is the final identity of a grpo / no_update arm."""
    audit = exp.audit("weights_audit.json")
    if not isinstance(audit, dict):
        return []
    cells = audit.get("cells") if isinstance(audit.get("cells"), dict) and audit.get("cells") else {"": audit}
    finals = {
        kind: {final_identity(exp, a.name) for a in exp.arms_of(kind) if exp.has_train(a.name)}
        for kind in ("grpo", "no_update")
    }
    problems = []
    for cell, part in cells.items():
        hashes = part.get("hashes") if isinstance(part, dict) else None
        for key, kind in (("trained", "grpo"), ("no_update", "no_update")):
            if (
                isinstance(hashes, dict)
                and key in hashes
                and finals[kind]
                and hashes[key] not in finals[kind]
            ):
                where = f" (cell {cell})" if cell else ""
                problems.append(
                    f"weights_audit.json hashes.{key}{where} {_short(hashes[key])} is no {kind} arm's final "
                    "identity: the audit audited other weights"
                )
    return problems


def _configured_steps(arm: Arm, config: dict) -> object:
    table = config.get("sft") if arm.kind == "sft" else config.get("grpo")
    return table.get("steps") if isinstance(table, dict) else None


def _treatment_problem(arm: Arm, config: dict) -> str | None:
    grpo = config.get("grpo") if isinstance(config.get("grpo"), dict) else {}
    reward, control = grpo.get("reward"), grpo.get("control", "none")
    if arm.kind == "sft":
        ok, want = isinstance(config.get("sft"), dict), "an [sft] table"
    elif arm.kind == "no_update":
        ok, want = control == "no-update", 'grpo.control = "no-update"'
    elif arm.kind == "validity":
        ok, want = reward == "validity" and control == "none", 'grpo.reward = "validity" and no control'
    elif arm.kind in (*GRPO_KINDS, "grpo_sft"):
        ok, want = reward not in (None, "validity") and control == "none", "a task reward and no control"
    else:
        return None
    if ok:
        return None
    return f"arm '{arm.name}' (kind {arm.kind}) did not train with {want} (train config.json: reward {reward!r}, control {control!r})"


def _run_problems(exp: Experiment, arm: Arm) -> list[str]:
    run = exp.train_run(arm.name)
    if not isinstance(run, dict):
        return []
    out = []
    if "status" not in run:  # a status other than "finished" is real_run's problem
        out.append(f"arm '{arm.name}': its train run.json records no status, so it may not have finished")
    config = exp.train_config(arm.name)
    if not isinstance(config, dict):
        return out + [f"arm '{arm.name}': train config.json missing or unreadable"]
    treatment = _treatment_problem(arm, config)
    if treatment:
        out.append(treatment)
    want = _configured_steps(arm, config)
    steps = exp.steps(arm.name) or []
    done = {s.get("step") for s in steps if isinstance(s, dict) and isinstance(s.get("step"), int)}
    if not done and arm.kind in GRPO_KINDS:
        return out  # optimizer_steps names a GRPO arm without steps
    if (
        not isinstance(want, int)
        or len(done) != want
        or run.get("steps") != want
        or (done and max(done) != want)
    ):
        out.append(
            f"arm '{arm.name}': {len(done)} distinct steps in steps.jsonl, run.json steps {run.get('steps')!r}, "
            f"configured {want!r}: the training or its record is incomplete"
        )
    return out


def training_problems(exp: Experiment) -> list[str]:
    problems: list[str] = []
    seeds: dict[str, object] = {}
    for arm in exp.arms.values():
        if not exp.has_train(arm.name):
            # (a control without one is the controls check's problem)
            if (
                arm.kind not in ("base", "no_update", "validity")
                and arm.train_dir is not None
                and exp.has_eval(arm.name)
            ):
                problems.append(f"arm '{arm.name}': its train run.json is missing or unreadable")
            continue
        problems += _run_problems(exp, arm)
        config = exp.train_config(arm.name)
        run_table = config.get("run") if isinstance(config, dict) else None
        if isinstance(run_table, dict) and "seed" in run_table:
            seeds[arm.name] = run_table["seed"]
    if len({repr(s) for s in seeds.values()}) > 1:
        problems.append("train runs differ in run.seed: " + ", ".join(f"{a}={s!r}" for a, s in seeds.items()))
    for g in exp.grpo_arms():
        gconf = exp.train_config(g.name) if exp.has_train(g.name) else None
        gtable = gconf.get("grpo") if isinstance(gconf, dict) else None
        if not isinstance(gtable, dict):
            continue
        for kind in ("no_update", "validity"):
            for c in exp.same_cell(g, kind):
                cconf = exp.train_config(c.name) if exp.has_train(c.name) else None
                ctable = cconf.get("grpo") if isinstance(cconf, dict) else None
                if not isinstance(ctable, dict):
                    continue
                diff = [k for k in SAME_TRAINING if ctable.get(k) != gtable.get(k)]
                if diff:
                    problems.append(
                        f"control '{c.name}' trained with other grpo settings than '{g.name}': "
                        + ", ".join(f"{k} {ctable.get(k)!r} vs {gtable.get(k)!r}" for k in diff)
                    )
    return problems


def exclusion_problems(exp: Experiment) -> list[str]:
    problems: list[str] = []
    unscorable: dict[str, set[str]] = {}
    for arm in exp.arms:
        rows = [r for r in exp.results(arm) or [] if isinstance(r, dict)]
        if not rows:
            continue
        unscorable[arm] = {str(r.get("task_id")) for r in rows if r.get("status") == "gold_unscorable"}
        if not isinstance(exp.summary(arm), dict):
            problems.append(f"arm '{arm}': its eval summary.json is missing or unreadable")
        unread = sum(1 for r in rows if r.get("status") not in EXCLUDED_STATUSES and outcome(r) is None)
        if unread:
            problems.append(
                f"arm '{arm}': {unread} rows of results.jsonl have a scored status but no true/false `correct`, "
                "so they would drop out of its accuracy unannounced"
            )
        odd = sum(
            1 for r in rows if outcome(r) is not None and (r.get("status") == "match") != (outcome(r) == 1)
        )
        if odd:
            problems.append(
                f"arm '{arm}': {odd} rows of results.jsonl have a `correct` their status contradicts"
            )
        infra = sum(1 for r in rows if r.get("status") == "infra_error")
        if infra > max(1, math.floor(INFRA_SHARE * len(rows))):
            problems.append(
                f"arm '{arm}': {infra} of {len(rows)} tasks ended in an infrastructure failure (excluded, not "
                "scored; more than 1 %): re-run its evaluation"
            )
        run = exp.eval_run(arm)
        listed = run.get("task_ids") if isinstance(run, dict) else None
        if isinstance(listed, list) and {str(t) for t in listed} != {str(r.get("task_id")) for r in rows}:
            problems.append(
                f"arm '{arm}': results.jsonl does not cover exactly the task_ids its eval run.json lists"
            )
    if len({frozenset(s) for s in unscorable.values()}) > 1:
        sizes = ", ".join(f"{a} {len(s)}" for a, s in unscorable.items())
        problems.append(f"arms exclude different tasks as gold_unscorable (a property of the gold): {sizes}")
    return problems


def _audit_file(exp: Experiment, name: str, what: str) -> tuple[dict | None, list[str]]:
    """(the audit file `name` as an object, []), or (None, [why it is missing or unreadable])."""
    audit = exp.audit(name)
    if isinstance(audit, dict):
        return audit, []
    exists = (exp.dir / name).is_file()
    return None, [f"{name} " + ("unreadable" if exists else f"missing: the {what} was not run")]


def leakage_problems(exp: Experiment) -> list[str]:
    leak, missing = _audit_file(exp, "leakage.json", "leakage audit")
    if leak is None:
        return missing
    if leak.get("passed") is not True:
        first = leak.get("first_difference")
        extra = f" (first difference: {json.dumps(first, default=str)[:200]})" if first else ""
        return [f"leakage audit failed (passed=false){extra}"]
    problems = []
    tasks = leak.get("tasks")
    if not isinstance(tasks, int) or isinstance(tasks, bool) or tasks < 1:
        problems.append(f"leakage audit ran on {tasks!r} tasks: it proves nothing")
    static = leak.get("static_check")
    if isinstance(static, dict) and static.get("passed") is not True:
        problems.append(
            "leakage audit's static check did not pass (a gold string in a prompt or observation)"
        )
    budgets = leak.get("per_turn_budget") if isinstance(leak.get("per_turn_budget"), dict) else {}
    failed = sorted(k for k, v in budgets.items() if not (isinstance(v, dict) and v.get("passed") is True))
    if failed:
        problems.append("leakage audit failed at turn budgets " + ", ".join(failed))
    return problems


def weights_audit_problems(exp: Experiment) -> list[str]:
    audit, missing = _audit_file(exp, "weights_audit.json", "weight audit")
    if audit is None:
        return missing
    problems = []
    verdicts = audit.get("verdicts") if isinstance(audit.get("verdicts"), dict) else {}
    for key, message in AUDIT_VERDICTS.items():
        if key not in verdicts:
            problems.append(f"weight audit verdict '{key}' not recorded")
        elif verdicts[key] is None:
            problems.append(f"weight audit verdict '{key}' was not determined (null)")
        elif verdicts[key] is not True:
            problems.append(message)
    if audit.get("passed") is not True:
        problems.append("weight audit did not pass (passed=false)")
    if audit.get("errors"):
        problems.append(f"weight audit recorded errors: {json.dumps(audit['errors'], default=str)[:200]}")
    return problems
