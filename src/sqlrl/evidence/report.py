"""`sqlrl report EXP`: apply the evidence gate and write verdict.json, report.md and report.html.

`write_report(exp_dir, out_dir=None)` writes three files (into the experiment folder by default):
- `verdict.json`: `gate.evidence_gate(...).to_dict()` (claim / no claim, the checks, the missing list);
- `report.md`: verdict, evidence checks, results table (`results_table_md`, also the README's tables)
  with each arm's notes (a summary.json that disagrees with results.jsonl),
  paired comparisons, RL vs SFT, grpo_sft vs its SFT start (`branchstart`), repair decomposition,
  accuracy by Spider hardness, validation learning curve, self-consistency beside greedy, turn use of
  multi-turn arms, provenance with links;
- `report.html`: the same and more as one self-contained page (`html.render_html`).

The numbers come from `analysis.analyze` (recomputed from the raw per-task files; see its docstring).
Links to raw files are relative to the output folder.

What is covered: deterministic files for a given folder, output folder and (n_boot, seed) (bootstrap seed
0, 10000 resamples by default); the report is written even when the gate says "no claim", and then says
so at the top; all three files are rendered before the first is written, verdict.json last.
What is not: percentile intervals may under-cover (stats.py); no correction for multiple comparisons;
provenance (machine, model identity) is taken from run.json/summary.json as recorded.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlrl.artifacts import write_bytes_atomic, write_json_atomic
from sqlrl.evidence.analysis import (
    TURN_USE_HEADERS,
    TURN_USE_NOTE,
    analyze,
    base_comparisons,
    cell_flag,
    claim_lines,
    find_comparison,
    has_context_axis,
    sft_comparisons,
    turn_use_rows,
)
from sqlrl.evidence.branchstart import branch_start_markdown
from sqlrl.evidence.difficulty import difficulty_markdown
from sqlrl.evidence.fmt import (
    DEVICE_MINUTES_NOTE,
    acc_ci,
    budgets_str,
    device_minutes_str,
    diff_ci,
    fmt_p,
    machine_str,
    md_cell,
    pp,
    short,
)
from sqlrl.evidence.nonexec import nonexec_markdown
from sqlrl.evidence.page import render_html
from sqlrl.evidence.rltime import rl_training, train_seconds
from sqlrl.evidence.rundir import Experiment
from sqlrl.evidence.sections import breakdown_markdown


def results_table_md(exp_dir: str | Path | Experiment | dict, **kw: Any) -> str:
    """README-ready Markdown table: arm | accuracy (95% CI) | Δ vs Base (95% CI) | McNemar p | device
    minutes | steps, with `turns | context tokens` after the arm when the matrix has a context axis."""
    analysis = exp_dir if isinstance(exp_dir, dict) else analyze(exp_dir, **kw)
    level = int(round(100 * analysis["params"]["ci"]))
    axis = has_context_axis(analysis)
    cols = ["arm", *(["turns", "context tokens"] if axis else [])]
    cols += [f"accuracy ({level}% CI)", f"Δ vs Base ({level}% CI)", "McNemar p", "device minutes", "steps"]
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for arm in analysis["arms"]:
        b = analysis["base_of"].get(arm["name"])
        row = find_comparison(analysis, b, arm["name"]) if b else None
        train = arm.get("train") or {}
        steps = train.get("steps")
        lines.append(
            "| "
            + " | ".join(
                [
                    md_cell(arm["name"]),
                    *([str(arm["turns"]), str(arm["context_tokens"] or "-")] if axis else []),
                    acc_ci(arm),
                    diff_ci(row),
                    fmt_p(row["p_value"]) if row and row.get("available") else "-",
                    device_minutes_str(arm),
                    str(steps) if steps is not None else "-",
                ]
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def render_markdown(analysis: dict, links: dict[str, dict[str, str]]) -> str:
    """report.md for `analysis` (from `analysis.analyze`), linking raw files by `links` (arm -> name -> path)."""
    v = analysis["verdict"]
    e = analysis["experiment"]
    out = [f"# sqlrl report: {md_cell(e['name'])}", ""]
    if v.claim_allowed:
        out += ["**Verdict: CLAIM ALLOWED.** Every evidence check passed. What may be stated:", ""]
        out += [f"- {md_cell(line)}" for line in claim_lines(analysis)] + [""]
    else:
        out += [
            "**Verdict: NO CLAIM.** The evidence gate did not pass; the numbers below are not a learning result.",
            "",
        ]
        out += ["Missing:", ""] + [f"- {md_cell(m)}" for m in v.missing] + [""]
    out += [f"**{md_cell(v.rl_over_sft_line)}**", ""]
    out += ["## Evidence checks", "", "| check | passed | detail |", "| --- | --- | --- |"]
    out += [f"| {c.name} | {'yes' if c.passed else 'NO'} | {md_cell(c.detail)} |" for c in v.checks]
    out += ["", "## Results", "", results_table_md(analysis)]
    notes = [f"{a['name']}: {n}" for a in analysis["arms"] for n in a["notes"]]
    if notes:  # as report.html shows them: e.g. a summary.json that disagrees with results.jsonl
        out += ["Notes:", ""] + [f"- {md_cell(n)}" for n in notes] + [""]
    out += [
        "Accuracy = execution match over scored tasks (excluded tasks dropped), percentile bootstrap CI; "
        "Δ and McNemar p are paired by task id over tasks scored in both arms. " + DEVICE_MINUTES_NOTE,
        "",
        "## Paired comparisons",
        "",
        "| comparison | n pairs | Δ (95% CI) | b right, a wrong | a right, b wrong | McNemar p | dropped (excluded) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in analysis["comparisons"]:
        label = " ".join(x for x in (f"{row['b']} vs {row['a']}", cell_flag(row)) if x)
        if row.get("available"):
            out.append(
                f"| {md_cell(label)} | {row['n']} | {diff_ci(row)} | {row['b_only']} | {row['a_only']} | "
                f"{fmt_p(row['p_value'])} | {row['dropped_excluded']} |"
            )
        else:
            out.append(f"| {md_cell(label)} | 0 | - | - | - | - | {md_cell(row.get('reason', ''))} |")
    out += _sft_section(analysis)
    out += branch_start_markdown(analysis)
    rep = base_comparisons(analysis)
    if rep:
        out += [
            "",
            "## Execution repair vs answer change (each arm vs base)",
            "",
            "Δ = repair part + answer part. Repair part = (non-executable→match − match→non-executable)/n; "
            "answer part = (mismatch→match − match→mismatch)/n. Non-executable = no_sql, exec_error, timeout.",
            "",
            "| arm | Δ | repair part | answer part | became executable | became non-executable |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for r in rep:
            d = r["repair"]
            out.append(
                f"| {md_cell(r['b'])} | {pp(d['delta'])} | {pp(d['repair_part'])} | {pp(d['answer_part'])} | "
                f"{d['became_executable']} | {d['became_nonexecutable']} |"
            )
    out += nonexec_markdown(analysis)
    tu = turn_use_rows(analysis)
    out += breakdown_markdown(analysis)
    out += difficulty_markdown(analysis)
    if tu:
        out += [
            "",
            "## Turn use (multi-turn arms)",
            "",
            TURN_USE_NOTE,
            "",
            "| " + " | ".join(TURN_USE_HEADERS) + " |",
            "|" + " --- |" * len(TURN_USE_HEADERS),
        ]
        out += ["| " + " | ".join(md_cell(c) for c in r) + " |" for r in tu]
    axis = has_context_axis(analysis)
    heads = ["arm", "kind", "turns", *(["context tokens"] if axis else [])]
    heads += ["model identity", "eval machine", "fingerprint", "budgets", "files"]
    out += ["", "## Provenance", "", "| " + " | ".join(heads) + " |", "|" + " --- |" * len(heads)]
    for arm in analysis["arms"]:
        lk = links.get(arm["name"], {})
        files = " ".join(f"[{k}]({quote(v)})" for k, v in lk.items()) or "-"
        out.append(
            f"| {md_cell(arm['name'])} | {arm['kind']} | {arm['turns']} | "
            + (f"{arm['context_tokens'] or '-'} | " if axis else "")
            + f"`{short(arm['model'].get('identity'), 16)}` | "
            f"{md_cell(machine_str(arm['machine']))} | `{short(arm['fingerprint'])}` | "
            f"{md_cell(budgets_str(arm['budgets']))} | {files} |"
        )
    out += ["", "Full report with charts: `report.html`.", ""]
    return "\n".join(out)


def _sft_section(analysis: dict) -> list[str]:
    """RL arms vs the SFT-only control, with training minutes side by side (empty without an sft arm):
    an RL arm's minutes are its total, for grpo_sft the SFT run it started from plus its GRPO part."""
    rows = sft_comparisons(analysis)
    if not rows:
        return []
    exp: Experiment = analysis["_exp"]
    out = [
        "",
        "## RL vs supervised fine-tuning (SFT-only control)",
        "",
        analysis["verdict"].rl_over_sft_line,
        "",
        "| RL arm vs SFT | Δ (95% CI) | McNemar p | reading | train min: RL total (SFT part + GRPO part) / SFT |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ok = r.get("available")
        out.append(
            f"| {md_cell(r['b'])} vs {md_cell(r['a'])} | {diff_ci(r) if ok else '-'} | "
            f"{fmt_p(r['p_value']) if ok else '-'} | {md_cell(r['reading'])} | {_train_minutes(exp, r['b'], r['a'])} |"
        )
    out += [
        "",
        "An RL arm's train minutes are its whole training: grpo_sft's are the SFT run it started from "
        "(the sft arm's own run, its own stage with sft.init_steps > 0, or the sft arm's run up to step "
        'init_steps with sft.init_from = "control") plus its GRPO steps; the SFT control needs at least '
        "as many (run.json train_seconds), on the same device (run.json machines: every session's): minutes on different "
        "devices are not compared; both arms are evaluated on one device (greedy answers differ between GPU "
        "models).",
    ]
    return out


def _train_minutes(exp: Experiment, rl_name: str, sft_name: str) -> str:
    """ "RL / SFT" train minutes, the RL side as "total (SFT part + GRPO part)" for an arm with an SFT start."""

    def m(x: float | None) -> str:
        return f"{x / 60:.2f}" if x is not None else "-"

    rl_arm, sft_arm = exp.arms.get(rl_name), exp.arms.get(sft_name)
    sft_side = m(train_seconds(exp, sft_arm)) if sft_arm is not None else "-"
    if rl_arm is None:
        return f"- / {sft_side}"
    parts = rl_training(exp, rl_arm)
    if rl_arm.kind != "grpo_sft":
        return f"{m(parts['total'])} / {sft_side}"
    return f"{m(parts['total'])} ({m(parts['sft'])} + {m(parts['rl'])}) / {sft_side}"


def _links(exp: Experiment, out_dir: Path) -> dict[str, dict[str, str]]:
    links: dict[str, dict[str, str]] = {}
    for name in exp.arms:
        lk = {}
        for fname in ("trajectories.jsonl", "results.jsonl", "summary.json"):
            p = exp.eval_file(name, fname)
            if p is not None and p.is_file():
                lk[fname] = Path(os.path.relpath(p.resolve(), out_dir.resolve())).as_posix()
        p = exp.train_file(name, "steps.jsonl")
        if p is not None and p.is_file():
            lk["steps.jsonl"] = Path(os.path.relpath(p.resolve(), out_dir.resolve())).as_posix()
        links[name] = lk
    return links


def write_report(
    exp_dir: str | Path,
    out_dir: str | Path | None = None,
    *,
    n_boot: int = 10000,
    seed: int = 0,
    data: str | Path | None = None,
) -> dict:
    """Write verdict.json, report.md, report.html; return {"verdict", "markdown", "html"} paths + "claim_allowed".
    `data`: the Spider folder whose golds give the hardness classes (default: each eval run.json's)."""
    analysis = analyze(exp_dir, n_boot=n_boot, seed=seed, data=data)
    exp: Experiment = analysis["_exp"]
    out = Path(out_dir) if out_dir is not None else exp.dir
    links = _links(exp, out)
    # every file is rendered before any is written: a report that fails leaves no verdict.json behind
    markdown = render_markdown(analysis, links).encode("utf-8")
    html = render_html(analysis, links).encode("utf-8")
    out.mkdir(parents=True, exist_ok=True)
    paths = {"verdict": out / "verdict.json", "markdown": out / "report.md", "html": out / "report.html"}
    write_bytes_atomic(paths["markdown"], markdown)
    write_bytes_atomic(paths["html"], html)
    write_json_atomic(paths["verdict"], analysis["verdict"].to_dict())
    return {**paths, "claim_allowed": analysis["verdict"].claim_allowed}
