"""`sqlrl seeds`' section "grpo_sft vs its SFT start": the report's `branchstart` comparison, per seed.

Per seed: `branchstart.branch_start_rows`' row for the folder's primary grpo_sft arm (the branch of the
sft arm's weights grpo_sft started from, evaluated like every arm; Δ, bootstrap CI, exact McNemar,
repair / answer split). Across seeds (`summary`, given `seeds._spread` of those rows): the mean,
smallest and largest Δ, the seeds with Δ above / below zero and with grpo_sft ahead at McNemar
p < 0.01, the hierarchical bootstrap over (seeds, tasks), and the mean repair and answer parts.

What is covered: a folder without numbers (no grpo_sft arm; grpo_sft started from its own SFT stage
or its start is not recorded; no branch evaluation; a branch measured unlike grpo_sft) gives a row
saying why; the across-seed numbers need numbers in every seed, else say which seed lacks them.
What is not: an evidence check: the seeds verdict, `claim_allowed` and the exit code never read it;
not an equal-time comparison (the sft arm's final weights are the control); arms other than the
primary grpo_sft (other cells) are not summarised.
"""

from __future__ import annotations

from typing import Any

from sqlrl.evidence.branchstart import HEADERS, NOTE, branch_start_cells, branch_start_rows
from sqlrl.evidence.charts import svg_interval_chart
from sqlrl.evidence.fmt import esc, html_table, md_cell, pp
from sqlrl.evidence.rundir import Arm, Experiment

TITLE = "grpo_sft vs its SFT start (information, not a claim)"
ACROSS_NOTE = (
    "Across seeds: the per-seed Δ (mean, range, signs), the seeds where grpo_sft led with McNemar "
    "p < 0.01, and the hierarchical bootstrap (seeds resampled within each side, tasks once and shared) "
    "on the tasks scored in every run of both; it never changes the verdict or the exit code."
)
_KEYS = (
    "available", "label", "a", "b", "folder", "n", "mean_a", "mean_b", "diff", "ci_low", "ci_high",
    "p_value", "b_only", "a_only", "dropped_excluded", "unpaired", "repair", "reason",
)  # fmt: skip


def _why_none(e: Experiment, gs: Arm) -> str:
    """Why `branch_start_rows` gave no row for grpo_sft arm `gs`."""
    sfts = e.same_cell(gs, "sft")
    if not sfts:
        return f"no sft arm in {gs.name}'s cell"
    init = gs.spec.get("init_run")
    if init is None:
        return f"{gs.name}'s start is not recorded (no init_run in experiment.json)"
    starts = [s for s in sfts if s.spec.get("train_run") == init]
    if not starts:
        return f"{gs.name} started from {init} (its own SFT stage), not from an sft arm's training run"
    where = starts[0].spec.get("branch_eval_run") or f"arms/{starts[0].name}/branch_eval"
    return f"no branch evaluation of {starts[0].name} (no run.json in {where})"


def seed_row(
    e: Experiment, run_seed: Any, *, n_boot: int, seed: int, ci: float
) -> tuple[dict, list[dict] | None, list[dict] | None]:
    """(the folder's row, the branch evaluation's results, grpo_sft's results); both results None when
    the row has no numbers."""
    gs = e.primary("grpo_sft")
    rows = [] if gs is None else branch_start_rows(e, n_boot=n_boot, seed=seed, ci=ci)
    rows = [r for r in rows if r["b"] == gs.name] if gs is not None else []
    if not rows:
        reason = "no grpo_sft arm" if gs is None else _why_none(e, gs)
        label = "grpo_sft vs its SFT start" if gs is None else f"{gs.name} vs its SFT start"
        return (
            {"run_seed": run_seed, "available": False, "label": label, "n": 0, "reason": reason},
            None,
            None,
        )
    r = rows[0]
    row = {"run_seed": run_seed, **{k: r[k] for k in _KEYS if k in r}, "folder": str(r["folder"])}
    if not r["available"]:
        return row, None, None
    return row, e.run_results(r["folder"]), e.results(r["b"])


def summary(rows: list[dict], spread: dict | None) -> dict:
    """{"runs": rows, "across": ..., "line": ...}; `spread` is `seeds._spread` of the rows (None when a
    seed has no numbers); `across` adds the mean repair and answer parts."""
    missing = [f"run.seed {r['run_seed']}: {r.get('reason', '')}" for r in rows if not r["available"]]
    if spread is None or not spread.get("available"):
        why = "; ".join(missing) if missing else (spread or {}).get("reason", "no seeds")
        across = {"available": False, "reason": why}
        line = f"grpo_sft vs its SFT start across seeds: no numbers ({why})"
        return {"runs": rows, "across": across, "line": line}
    across = dict(spread)
    for part in ("repair_part", "answer_part"):
        across[f"mean_{part}"] = sum(r["repair"][part] for r in rows) / len(rows)
    h, n = across["hierarchical"], across["seeds"]
    line = (
        f"grpo_sft vs its SFT start across seeds: Δ {pp(h['diff'])} (hierarchical 95% CI {pp(h['ci_low'])} "
        f"to {pp(h['ci_high'])}, {h['n']} tasks); Δ > 0 in {across['seeds_above_zero']} of {n} seeds, "
        f"ahead with p < 0.01 in {across['seeds_ahead_p_lt_0.01']} of {n}; information, not a claim"
    )
    return {"runs": rows, "across": across, "line": line}


def _across_cells(a: dict) -> list[str]:
    if not a.get("available"):
        return ["-"] * 8 + [a.get("reason", "")]
    h = a["hierarchical"]
    return [
        str(a["seeds"]),
        pp(a["mean_diff"]),
        f"{pp(a['min_diff'])} to {pp(a['max_diff'])}",
        f"{a['seeds_above_zero']} / {a['seeds_below_zero']}",
        f"{a['seeds_ahead_p_lt_0.01']} of {a['seeds']}",
        f"{pp(h['diff'])} ({pp(h['ci_low'])} to {pp(h['ci_high'])})",
        str(h["n"]),
        f"{pp(a['mean_repair_part'])} / {pp(a['mean_answer_part'])}",
        "",
    ]


ACROSS_HEADERS = [
    "seeds",
    "mean Δ",
    "range of Δ",
    "seeds Δ > 0 / < 0",
    "ahead with p < 0.01",
    "hierarchical Δ (95% CI)",
    "tasks",
    "mean repair / answer part",
    "no numbers because",
]
SEED_HEADERS = ["run.seed", *HEADERS[:-1], f"{HEADERS[-1]} (or why no numbers)"]


def markdown(b: dict) -> list[str]:
    """seeds.md's section: the line, the per-seed table, the across-seed table."""
    out = ["", f"## {TITLE}", "", b["line"], "", NOTE, "", ACROSS_NOTE, ""]
    out += ["| " + " | ".join(SEED_HEADERS) + " |", "|" + " --- |" * len(SEED_HEADERS)]
    for r in b["runs"]:
        out.append("| " + " | ".join(md_cell(c) for c in [str(r["run_seed"]), *branch_start_cells(r)]) + " |")
    out += ["", "| " + " | ".join(ACROSS_HEADERS) + " |", "|" + " --- |" * len(ACROSS_HEADERS)]
    return out + ["| " + " | ".join(md_cell(c) for c in _across_cells(b["across"])) + " |"]


def html(b: dict) -> list[str]:
    """seeds.html's section: the line, an interval chart (when there are numbers), both tables."""
    chart = [
        (f"seed {r['run_seed']}", r["diff"], r["ci_low"], r["ci_high"], "#2563eb")
        for r in b["runs"]
        if r["available"]
    ]
    a = b["across"]
    if a.get("available"):
        h = a["hierarchical"]
        chart.append(("all seeds", h["diff"], h["ci_low"], h["ci_high"], "#111827"))
    seed_rows = [[esc(c) for c in [str(r["run_seed"]), *branch_start_cells(r)]] for r in b["runs"]]
    out = [f'<section id="sft-start"><h2>{esc(TITLE)}</h2><p><b>{esc(b["line"])}</b></p>']
    if chart:
        out.append(
            svg_interval_chart(chart, title="grpo_sft minus its SFT start", zero_line=True, pct_axis=True)
        )
    out += [
        html_table([esc(x) for x in SEED_HEADERS], seed_rows),
        html_table([esc(x) for x in ACROSS_HEADERS], [[esc(c) for c in _across_cells(a)]]),
        f'<p class="note">{esc(NOTE)}</p><p class="note">{esc(ACROSS_NOTE)}</p></section>',
    ]
    return out
