"""grpo_sft against its own SFT start: the sft arm's weights at step N (`sft.init_from = "control"`).

The matrix evaluates that branch like every arm (`arms/<sft>/branch_eval`; experiment.json
`branch_eval_run` and `branch_step` on the sft arm). `branch_start_rows` pairs each grpo_sft arm's
results with the branch evaluation of the sft arm of its cell whose train run it started from, by task id
(`analysis.paired_outcomes` / `paired_statistics`: Δ, bootstrap CI, exact McNemar, the execution-repair /
answer-change split); `branch_start_markdown` / `branch_start_html` render the report's section
(`branch_start_cells`: a row's cells, also used by `sqlrl seeds`).

What is covered: a row only for a grpo_sft arm that started from that sft arm's run (its `init_run`); a
branch evaluation with other budgets, another fingerprint or another step than grpo_sft's start
(train run.json `init_sft.step`) gives a row saying so, without numbers.
What is not: an evidence check: the gate and `claim_allowed` never read it; it is not an equal-time
comparison (GRPO trained on top of those SFT steps; the sft arm's final weights are the control).
"""

from __future__ import annotations

from typing import Any

from sqlrl.evidence.analysis import paired_outcomes, paired_statistics
from sqlrl.evidence.fmt import diff_ci, esc, fmt_p, html_table, md_cell, pct, pp
from sqlrl.evidence.rundir import Experiment

NOTE = (
    "What GRPO added to the weights it started from: the sft arm's weights after step N (grpo_sft's "
    'start, sft.init_from = "control"), evaluated greedily on the same tasks with the same budgets as '
    "every arm (arms/<sft>/branch_eval). Paired by task over tasks scored in both; exact McNemar p; "
    "repair part = (non-executable→match − match→non-executable)/n, answer part = (mismatch→match − "
    "match→mismatch)/n. Information, not an evidence check, and not an equal-time comparison (the sft "
    "arm's own evaluation, of its final weights, is the control)."
)
HEADERS = [
    "comparison",
    "n pairs",
    "start → grpo_sft",
    "Δ (95% CI)",
    "gained",
    "lost",
    "McNemar p",
    "repair part",
    "answer part",
]


def _mismatch(exp: Experiment, gs: str, run: dict, step: Any) -> str | None:
    """Why the branch evaluation is not grpo_sft's start measured like grpo_sft, or None."""
    start = (exp.train_run(gs) or {}).get("init_sft") or {}
    if start.get("step") is not None and start["step"] != step:
        return f"{gs} started from step {start['step']}, the evaluated branch is step {step}"
    gs_budgets = exp.eval_budgets(gs)
    if run.get("budgets") != gs_budgets:
        return f"the branch evaluation's budgets {run.get('budgets')} differ from {gs}'s {gs_budgets}"
    if exp.fingerprint(gs) is not None and run.get("fingerprint") != exp.fingerprint(gs):
        return f"the branch evaluation's fingerprint differs from {gs}'s"
    return None


def branch_start_rows(exp: Experiment, *, n_boot: int = 10000, seed: int = 0, ci: float = 0.95) -> list[dict]:
    """One row per grpo_sft arm whose start (an sft arm's branch of its cell) was evaluated: b = grpo_sft,
    a = the branch; `label` "grpo_sft vs its SFT start (sft at step N)"; `paired_statistics`' keys when
    `available`, else `reason`."""
    rows = []
    for gs in exp.arms_of("grpo_sft"):
        for sft in exp.same_cell(gs, "sft"):
            folder = exp.branch_eval_dir(sft.name)
            if folder is None or gs.spec.get("init_run") != sft.spec.get("train_run"):
                continue
            run = exp.run_json(folder) or {}
            step = sft.spec.get("branch_step", (exp.train_run(gs.name) or {}).get("init_sft", {}).get("step"))
            row: dict[str, Any] = {
                "a": f"{sft.name} at step {step}",
                "b": gs.name,
                "label": f"{gs.name} vs its SFT start ({sft.name} at step {step})",
                "folder": folder,
                "n": 0,
                "available": False,
            }
            rows.append(row)
            ra, rb = exp.run_results(folder), exp.results(gs.name)
            reason = _mismatch(exp, gs.name, run, step)
            if ra is None or rb is None:
                reason = f"results.jsonl missing for {'the branch evaluation' if ra is None else gs.name}"
            if reason is not None:
                row["reason"] = reason
                continue
            p = paired_outcomes(ra, rb)
            row.update(dropped_excluded=p["dropped_excluded"], unpaired=p["unpaired"], n=len(p["a"]))
            if not p["a"]:
                row["reason"] = "no task scored in both"
                continue
            row.update(available=True, **paired_statistics(p, n_boot=n_boot, seed=seed, ci=ci))
    return rows


def _rows(analysis: dict) -> list[dict]:
    """The rows for this analysis, computed once (markdown and HTML share them)."""
    if "branch_start" not in analysis:
        analysis["branch_start"] = branch_start_rows(analysis["_exp"], **analysis["params"])
    return analysis["branch_start"]


def branch_start_cells(r: dict) -> list[str]:
    """A row's table cells under HEADERS (plain text); a row without numbers shows its reason last."""
    if not r.get("available"):
        return [r["label"], str(r["n"]), "-", "-", "-", "-", "-", "-", r.get("reason", "")]
    rep = r["repair"]
    return [
        r["label"],
        str(r["n"]),
        f"{pct(r['mean_a'])} → {pct(r['mean_b'])}",
        diff_ci(r),
        str(r["b_only"]),
        str(r["a_only"]),
        fmt_p(r["p_value"]),
        pp(rep["repair_part"]),
        pp(rep["answer_part"]),
    ]


def branch_start_markdown(analysis: dict) -> list[str]:
    """report.md's section (empty when no grpo_sft start was evaluated)."""
    rows = _rows(analysis)
    if not rows:
        return []
    out = ["", "## grpo_sft vs its SFT start", "", NOTE, ""]
    out += ["| " + " | ".join(HEADERS) + " |", "|" + " --- |" * len(HEADERS)]
    return out + ["| " + " | ".join(md_cell(c) for c in branch_start_cells(r)) + " |" for r in rows]


def branch_start_html(analysis: dict) -> list[str]:
    """report.html's section (empty when no grpo_sft start was evaluated)."""
    rows = _rows(analysis)
    if not rows:
        return []
    table = html_table(
        HEADERS, [[esc(c) for c in branch_start_cells(r)] for r in rows], {1, 3, 4, 5, 6, 7, 8}
    )
    return [
        '<section id="sft-start"><h2>grpo_sft vs its SFT start</h2>',
        table,
        f'<p class="note">{esc(NOTE)}</p></section>',
    ]
