"""`sqlrl seeds`' check of the Base evaluations: one set of Base weights, evaluated alike in every folder.

Greedy decoding of the same weights gives the same answers on one GPU model and software stack, but not
bitwise across GPU models (measured: the final config's Base on an H100 and on an H200, one weights hash,
differs in 22 of 759 tasks' final SQL, 4 of them in status, 48.1 % on both;
`results/2026-12-07-spider-0.5b-gpu-final-seed0` and `-seed1`). A seed matrix may put its seeds on
different GPU models (one model per seed), so the rule is per device, the device being the accelerator
(trimmed, case-folded) of the Base eval run.json's `machine`:
- folders on one device agree answer for answer, final SQL and status on every task; so do folders whose
  record lacks a non-empty accelerator, torch or CUDA (or is no record at all): a difference is a problem
  (the evaluation is not reproducible, or the folders differ in something else);
- between devices, answers may differ only where every Base evaluation records a complete machine, one
  weights identity (eval run.json `model.identity`), and at most `MAX_DEVICE_DIFF` of the tasks differ;
  the differing tasks are then counted in a note; otherwise it is a problem.

What is not covered: whether the answers that differ between devices differ by numerics alone (the
results cannot show it; the cap bounds it); that every arm of one folder was evaluated on one device
(the seeds config says so; each folder's comparisons pair its arms with its own Base).
"""

from __future__ import annotations

from typing import Any

from sqlrl.evidence.provenance import eval_identity
from sqlrl.evidence.rundir import Experiment

PREFIX = "the Base evaluations differ between folders"


MAX_DEVICE_DIFF = 0.10  # the share of tasks whose Base answer may differ between GPU models (measured 2.9 %)


def _machine(run: dict | None) -> dict | None:
    """The run's machine record when it names a non-empty accelerator, torch and CUDA; else None."""
    m = run.get("machine") if isinstance(run, dict) else None
    ok = isinstance(m, dict) and all(
        isinstance(m.get(k), str) and m[k].strip() for k in ("accelerator", "torch", "cuda")
    )
    return m if ok else None


def device_label(run: dict | None) -> str:
    """The device an evaluation ran on: "NVIDIA H200 (torch 2.11.0, cuda 13.0)", or "unrecorded"."""
    m = _machine(run)
    return f"{m['accelerator'].strip()} (torch {m['torch']}, cuda {m['cuda']})" if m else "unrecorded"


def _device_key(run: dict | None) -> str:
    m = _machine(run)
    return m["accelerator"].strip().casefold() if m else "unrecorded"


def base_check(exps: list[Experiment], base_arms: list[str | None]) -> dict[str, Any]:
    """`identical` (every folder's Base gave the same final SQL and status on every task; None when a
    folder has no Base arm), `devices` (per folder), `problems` and `notes` by the rule above."""
    if not exps or not all(base_arms):
        return {"identical": None, "devices": [], "problems": [], "notes": []}
    answers, devices, keys, idents = [], [], [], []
    for e, arm in zip(exps, base_arms):
        rows = e.results(arm) or []
        answers.append({str(r.get("task_id")): (r.get("final_sql"), r.get("status")) for r in rows})
        run = e.eval_run(arm)
        devices.append(device_label(run))
        keys.append(_device_key(run))
        idents.append(eval_identity(e, arm))
    identical = all(a == answers[0] for a in answers[1:])
    groups: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    problems, notes = [], []
    for idx in groups.values():
        if any(answers[i] != answers[idx[0]] for i in idx[1:]):
            problems.append(
                f"{PREFIX} on one device ({devices[idx[0]]}; greedy on the same weights): the evaluation is "
                "not reproducible or the folders differ in something else"
            )
    reps = [idx[0] for idx in groups.values()]
    tasks = set().union(*(a.keys() for a in answers))
    differ = {t for i in reps[1:] for t in tasks if answers[i].get(t) != answers[0].get(t)}
    if differ:
        where = "; ".join(
            f"{devices[idx[0]]}: {', '.join(str(exps[i].dir) for i in idx)}" for idx in groups.values()
        )
        why = []
        if "unrecorded" in groups:
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
    return {"identical": identical, "devices": devices, "problems": problems, "notes": notes}
