"""`sqlrl seeds`' check of the Base evaluations: one set of Base weights, evaluated alike in every folder.

Greedy decoding of the same weights gives the same answers on one GPU model and software stack, but not
bitwise across GPU models (measured: the final config's Base on an H100 and on an H200, one weights hash,
differs in 22 of 759 tasks' final SQL, 4 of them in status, 48.1 % on both;
`results/2026-12-07-spider-0.5b-gpu-final-seed0` and `-seed1`). A seed matrix may put its seeds on
different GPU models (one model per seed, all of a seed's arms on it), so the rule is per device:
- folders whose Base evaluation ran on one device (eval run.json `machine`: accelerator, torch, CUDA; a
  folder that records none counts as one device "unrecorded") agree answer for answer, final SQL and status
  on every task; a difference is a problem (the evaluation is not reproducible, or the folders differ in
  something else);
- between devices, answers may differ only where every Base evaluation records one weights identity (eval
  run.json `model.identity`); then the differing tasks are counted in a note; a missing or a second
  identity is a problem.

What is not covered: whether the answers that differ between devices differ by numerics alone (the
results cannot show it); each folder's comparisons pair its own arms with its own Base, so a difference
between devices never enters a per-seed figure.
"""

from __future__ import annotations

from typing import Any

from sqlrl.evidence.provenance import eval_identity
from sqlrl.evidence.rundir import Experiment

PREFIX = "the Base evaluations differ between folders"


def device_label(run: dict | None) -> str:
    """The device an evaluation ran on, from its run.json `machine`: "NVIDIA H200 (torch 2.11, cuda 13.0)"."""
    m = run.get("machine") if isinstance(run, dict) else None
    if not isinstance(m, dict):
        return "unrecorded"
    extra = ", ".join(f"{k} {m[k]}" for k in ("torch", "cuda") if m.get(k))
    acc = str(m.get("accelerator") or "CPU")
    return f"{acc} ({extra})" if extra else acc


def base_check(exps: list[Experiment], base_arms: list[str | None]) -> dict[str, Any]:
    """`identical` (every folder's Base gave the same final SQL and status on every task; None when a
    folder has no Base arm), `devices` (per folder), `problems` and `notes` by the rule above."""
    if not exps or not all(base_arms):
        return {"identical": None, "devices": [], "problems": [], "notes": []}
    answers, devices, idents = [], [], []
    for e, arm in zip(exps, base_arms):
        rows = e.results(arm) or []
        answers.append({str(r.get("task_id")): (r.get("final_sql"), r.get("status")) for r in rows})
        devices.append(device_label(e.eval_run(arm)))
        idents.append(eval_identity(e, arm))
    identical = all(a == answers[0] for a in answers[1:])
    groups: dict[str, list[int]] = {}
    for i, d in enumerate(devices):
        groups.setdefault(d, []).append(i)
    problems, notes = [], []
    for d, idx in groups.items():
        if any(answers[i] != answers[idx[0]] for i in idx[1:]):
            problems.append(
                f"{PREFIX} on one device ({d}; greedy on the same weights): the evaluation is not "
                "reproducible or the folders differ in something else"
            )
    reps = [idx[0] for idx in groups.values()]
    differ = {
        t
        for i in reps[1:]
        for t in answers[0].keys() | answers[i].keys()
        if answers[i].get(t) != answers[0].get(t)
    }
    if differ:
        where = "; ".join(f"{d}: {', '.join(str(exps[i].dir) for i in idx)}" for d, idx in groups.items())
        if None in idents or len(set(idents)) > 1:
            problems.append(
                f"{PREFIX} on different devices ({where}) and their Base weights are not recorded as one "
                f"(eval run.json model.identity: {', '.join(str(x)[:19] for x in idents)})"
            )
        else:
            notes.append(
                f"Base evaluated on {len(groups)} devices ({where}) with the same weights {idents[0][:19]}: "
                f"{len(differ)} of {len(answers[0])} tasks' final SQL or status differ between devices "
                "(greedy decoding is not bitwise reproducible across GPU models); each seed is compared with "
                "its own Base"
            )
    return {"identical": identical, "devices": devices, "problems": problems, "notes": notes}
