"""Which device an evaluation ran on, and the rules that keep answers of two GPU models apart.

Greedy decoding of the same weights gives the same answers on one GPU model and software stack, but not
bitwise across GPU models (measured: the final config's Base on an H100 and on an H200, one weights hash,
differs in 22 of 759 tasks' final SQL or status, 48.1 % on both; results/2026-12-07-spider-0.5b-gpu-
final-seed0 and -seed1). The device is the eval run.json `machine`: accelerator (trimmed, case-folded;
"cpu" without one), torch and CUDA versions; "unrecorded" without a record (`device_key`).
- The gate (`device_problems`): every GRPO arm and its cell's Base, No-update and validity evaluated on one
  device; the RL-over-SFT line compares an RL arm with an sft arm evaluated on its device.
- `sqlrl seeds` (`base_check`): a seed matrix may put seeds on different GPU models. Folders on one device
  agree answer for answer (final SQL and status); between devices answers may differ only where every
  Base evaluation records a complete machine (accelerator, torch, CUDA), one weights identity (eval
  run.json `model.identity`) and at most `MAX_DEVICE_DIFF` of the tasks differ, counted in a note.

What is not covered: whether answers that differ between devices differ by numerics alone (the results
cannot show it; the cap bounds it); arms outside the claim (sft, grpo_sft) may be evaluated elsewhere.
"""

from __future__ import annotations

from typing import Any

from sqlrl.evidence.provenance import eval_identity
from sqlrl.evidence.rundir import Arm, Experiment

PREFIX = "the Base evaluations differ between folders"


MAX_DEVICE_DIFF = 0.10  # the share of tasks whose Base answer may differ between GPU models (measured 2.9 %)


def _machine(run: dict | None) -> dict | None:
    """The run's machine record when it names a non-empty accelerator, torch and CUDA; else None."""
    m = run.get("machine") if isinstance(run, dict) else None
    ok = isinstance(m, dict) and all(
        isinstance(m.get(k), str) and m[k].strip() for k in ("accelerator", "torch", "cuda")
    )
    return m if ok else None


def _text(m: dict, key: str) -> str:
    v = m.get(key)
    return v.strip() if isinstance(v, str) else ""


def device_key(run: dict | None) -> str:
    """The device an evaluation ran on, as compared and shown: "nvidia h200 (torch 2.11.0, cuda 13.0)" (the
    accelerator trimmed and case-folded, "cpu" without one; a missing torch or CUDA "?"), or "unrecorded"."""
    m = run.get("machine") if isinstance(run, dict) else None
    if not isinstance(m, dict):
        return "unrecorded"
    acc = _text(m, "accelerator").casefold() or "cpu"
    return f"{acc} (torch {_text(m, 'torch') or '?'}, cuda {_text(m, 'cuda') or '?'})"


def device_problems(exp: Experiment) -> list[str]:
    """One problem per GRPO arm whose evaluation and those of its cell's Base, No-update and validity arms
    ran on more than one device."""
    out = []
    for g in exp.grpo_arms():
        where: dict[str, list[str]] = {}
        for a in [g, *(c for kind in ("base", "no_update", "validity") for c in exp.same_cell(g, kind))]:
            if exp.has_eval(a.name):
                where.setdefault(device_key(exp.eval_run(a.name)), []).append(a.name)
        if len(where) > 1:
            said = "; ".join(f"{k}: {', '.join(v)}" for k, v in where.items())
            out.append(
                f"arm '{g.name}' and its controls ({g.cell_label}) were evaluated on {len(where)} devices "
                f"({said}); greedy answers differ between devices"
            )
    return out


def eval_device_problem(exp: Experiment, sft: Arm, rl: Arm) -> str | None:
    """Why the RL-over-SFT line may not compare `rl` with `sft`: evaluated on two devices (None if one)."""
    a, b = device_key(exp.eval_run(sft.name)), device_key(exp.eval_run(rl.name))
    return (
        None if a == b else f"'{rl.name}' was evaluated on {b}, '{sft.name}' on {a}: answers of two devices"
    )


def base_check(exps: list[Experiment], base_arms: list[str | None]) -> dict[str, Any]:
    """`identical` (every folder's Base gave the same final SQL and status on every task; None when a
    folder has no Base arm), `devices` (per folder), `problems` and `notes` by the rule above."""
    if not exps or not all(base_arms):
        return {"identical": None, "devices": [], "problems": [], "notes": []}
    answers, keys, complete, idents = [], [], [], []
    for e, arm in zip(exps, base_arms):
        rows = e.results(arm) or []
        answers.append({str(r.get("task_id")): (r.get("final_sql"), r.get("status")) for r in rows})
        run = e.eval_run(arm)
        keys.append(device_key(run))
        complete.append(_machine(run) is not None)
        idents.append(eval_identity(e, arm))
    identical = all(a == answers[0] for a in answers[1:])
    groups: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    problems, notes = [], []
    for idx in groups.values():
        if any(answers[i] != answers[idx[0]] for i in idx[1:]):
            problems.append(
                f"{PREFIX} on one device ({keys[idx[0]]}; greedy on the same weights): the evaluation is "
                "not reproducible or the folders differ in something else"
            )
    reps = [idx[0] for idx in groups.values()]
    tasks = set().union(*(a.keys() for a in answers))
    differ = {t for i in reps[1:] for t in tasks if answers[i].get(t) != answers[0].get(t)}
    if differ:
        where = "; ".join(
            f"{keys[idx[0]]}: {', '.join(str(exps[i].dir) for i in idx)}" for idx in groups.values()
        )
        why = []
        if not all(complete):
            why.append("a Base evaluation records no complete machine (accelerator, torch, cuda)")
        if None in idents or len(set(idents)) > 1:
            why.append(
                "their Base weights are not recorded as one (eval run.json model.identity: "
                f"{', '.join(str(x)[:19] for x in idents)})"
            )
        if len(differ) > MAX_DEVICE_DIFF * len(tasks):
            why.append(f"{len(differ)} of {len(tasks)} tasks differ, more than {MAX_DEVICE_DIFF:.0%}")
        if why:
            problems.append(f"{PREFIX} on different devices ({where}) and {'; '.join(why)}")
        else:
            notes.append(
                f"Base evaluated on {len(groups)} devices ({where}) with the same weights {idents[0][:19]}: "
                f"{len(differ)} of {len(tasks)} tasks' final SQL or status differ between devices "
                "(greedy decoding is not bitwise reproducible across GPU models); each seed is compared with "
                "its own Base"
            )
    return {"identical": identical, "devices": keys, "problems": problems, "notes": notes}
