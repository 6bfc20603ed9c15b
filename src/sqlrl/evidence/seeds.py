"""`sqlrl seeds EXP EXP [EXP ...]`: one experiment matrix run with several training seeds, summarised.

One training run is one draw: GRPO's gain over its controls moves with `run.seed` (task and rollout
sampling). `summarize` takes the folders of one matrix run with different `run.seed` values;
`write_summary` writes seeds.json, seeds.md and seeds.html (self-contained, no JavaScript, escaped). Checks:
- two folders or more, each with a `run.seed`, all different; every other resolved setting equal (but
  `data.path`; two values are a difference even where some folders lack the setting; one present in some
  folders only, and differing `git.commit`s, are noted); one fingerprint, task list and arm set; for each
  arm whose training changes the weights (not base, no_update), no two folders with the same final weights
  (train run.json `final_identity`, else final/identity.json `weights_hash`) or evaluation results;
- every folder's own evidence gate, re-applied (not its stored verdict.json);
- Base evaluations identical answer for answer on one device; across devices complete machine records,
  one Base weights identity and at most 10 % of tasks differing (`devices.base_check`).
Numbers: per seed, GRPO vs Base, No-update and validity-only (`analysis.compare_arms`); across seeds, the
mean, smallest and largest difference, the seeds where GRPO led with McNemar p < 0.01, and
`stats.hierarchical_bootstrap` over (seeds, tasks) on the tasks scored in every run of both arms. A claim
across seeds needs every check passed and GRPO ahead of both controls with p < 0.01 in every seed (each
folder's primary arm of each kind). "RL adds over SFT" is a separate claim per RL kind (`rl_over_sft`,
outside `claim_allowed`): every check passed and, in every seed, the folder's `sft_control` passed and
that kind's arm ahead of the sft arm with McNemar p < 0.01.

Covered: numbers recomputed from results.jsonl, deterministically; grpo_sft vs its SFT start (`seedsbranch`).
Not: with two to five seeds the hierarchical interval may be too narrow; no multiple-comparison correction;
cells other than the first (a kind's primary arm) are not summarised; grpo_sft vs its SFT start is no check.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlrl.artifacts import write_bytes_atomic, write_json_atomic
from sqlrl.evaluation.outcome import outcome
from sqlrl.evidence.analysis import KIND_COLOR, compare_arms
from sqlrl.evidence.charts import svg_interval_chart
from sqlrl.evidence.devices import base_check
from sqlrl.evidence.fmt import esc, fmt_p, html_table, md_cell, pct, pp
from sqlrl.evidence.gate import SFT_MISSING, evidence_gate, flatten
from sqlrl.evidence.page import CSS
from sqlrl.evidence.provenance import final_identity, recorded_weights
from sqlrl.evidence.rundir import Experiment
from sqlrl.evidence.seedsbranch import html as branch_start_html
from sqlrl.evidence.seedsbranch import markdown as branch_start_markdown
from sqlrl.evidence.seedsbranch import seed_row as branch_start_seed_row
from sqlrl.evidence.seedsbranch import summary as branch_start_summary

KINDS = ("base", "grpo", "no_update", "validity")
CONTROLS = ("base", "no_update", "validity")
CLAIM_CONTROLS = ("no_update", "validity")  # a claim needs GRPO ahead of both, in every seed
P_CLAIM = 0.01
_IGNORED = ("run.seed", "data.path")
_COMPARISON_KEYS = ("available", "n", "diff", "ci_low", "ci_high", "p_value", "b_only", "a_only", "reason")


def _config_differences(exps: list[Experiment]) -> tuple[list[str], list[str], list[str]]:
    """(settings with two or more values among the folders that have them, each with the folders that
    lack it; settings present in only some folders with one value; those, each with the folders that
    lack it)."""
    flats = [flatten(e.meta.get("config") or {}) for e in exps]
    differ, partial, lacking = [], [], []
    for k in sorted(set().union(*flats)):
        if k in _IGNORED:
            continue
        vals = [json.dumps(f[k], sort_keys=True, default=str) for f in flats if k in f]
        absent = [str(e.dir) for e, f in zip(exps, flats) if k not in f]
        where = f" (absent in {', '.join(absent)})" if absent else ""
        if len(set(vals)) > 1:
            differ.append(f"{k}: " + " / ".join(vals) + where)
        elif absent:
            partial.append(k)
            lacking.append(k + where)
    return differ, partial, lacking


def _run_seed(e: Experiment) -> Any:
    return ((e.meta.get("config") or {}).get("run") or {}).get("seed")


def _arm_of_kind(e: Experiment, kind: str) -> str | None:
    arm = e.primary(kind)
    return arm.name if arm is not None else None


def _by_task(rows: list[dict] | None) -> dict[str, int | None]:
    """results.jsonl rows as {task id: 1 / 0 / None (not scored)} (`evaluation.outcome.outcome`)."""
    return {str(r.get("task_id")): outcome(r) for r in rows or []}


def _outcomes(e: Experiment, arm: str | None) -> dict[str, int | None]:
    return _by_task(e.results(arm) if arm else None)


def _consistency_problems(exps: list[Experiment], seeds: list[Any]) -> tuple[list[str], list[str], list[str]]:
    """(problems that make the folders incomparable, settings present in only some folders, the same
    with the folders that lack each)."""
    problems: list[str] = []
    if len(exps) < 2:
        problems.append(f"{len(exps)} experiment folder(s): a seed comparison needs at least two")
    problems += [
        f"{e.dir}: experiment.json config records no run.seed" for e, s in zip(exps, seeds) if s is None
    ]
    if len(set(map(json.dumps, seeds))) < len(seeds):
        problems.append(f"run.seed values are not all different: {seeds}")
    differ, partial, lacking = _config_differences(exps)
    problems += [f"setting differs between folders: {d}" for d in differ]
    problems += _duplicate_problems(exps)
    fps = {str(e.meta.get("fingerprint")) for e in exps}
    if len(fps) > 1:
        problems.append(f"{len(fps)} dataset fingerprints: {sorted(fps)}")
    task_lists = {json.dumps(e.meta.get("tasks")) for e in exps}
    if len(task_lists) > 1:
        problems.append("the evaluation task lists differ between folders")
    arm_sets = {tuple(sorted(e.arms)) for e in exps}
    if len(arm_sets) > 1:
        problems.append(f"the arms differ between folders: {sorted(arm_sets)}")
    return problems, partial, lacking


def _final_identity(e: Experiment, arm: str) -> str | None:
    """The arm's final weights: train run.json `final_identity`, else final/identity.json `weights_hash`."""
    return final_identity(e, arm) or recorded_weights(e, arm)


def _answers(e: Experiment, arm: str) -> str | None:
    """Every task's final SQL and status, as one comparable string (None without results)."""
    rows = e.results(arm)
    if not rows:
        return None
    return json.dumps(
        sorted((str(r.get("task_id")), str(r.get("final_sql")), str(r.get("status"))) for r in rows)
    )


def _duplicate_problems(exps: list[Experiment]) -> list[str]:
    """Two folders whose arm of a weight-changing kind (all but base and no_update, whose weights and
    greedy answers are the base's in every seed) has the same final weights: one training run counted as
    two seeds. Where either folder records no final weights, the same evaluation results (every task's
    final SQL and status) stand for them; with weights that differ, equal answers are possible (a short
    run, few tasks) and are not a problem."""
    problems = []
    for i, a in enumerate(exps):
        for b in exps[i + 1 :]:
            for name in sorted(set(a.arms) & set(b.arms)):
                if a.arms[name].kind in ("base", "no_update") or a.arms[name].train_dir is None:
                    continue
                wa, wb = _final_identity(a, name), _final_identity(b, name)
                if wa is not None and wa == wb:
                    what = "final weights"
                elif (
                    (wa is None or wb is None)
                    and (ra := _answers(a, name)) is not None
                    and ra == _answers(b, name)
                ):
                    what = "answers on every task, and no final weights to tell the runs apart"
                else:
                    continue
                problems.append(
                    f"{a.dir} and {b.dir}: arm '{name}' has the same {what}: one training run, not two seeds"
                )
    return problems


def _seed_row(
    e: Experiment, run_seed: Any, outs_of: dict, *, n_boot: int, seed: int, ci: float
) -> tuple[dict, list[str]]:
    """One folder's row (gate, accuracy per kind, GRPO vs each control) and its problems."""
    problems = []
    verdict = evidence_gate(e)
    grpo = _arm_of_kind(e, "grpo")
    row: dict[str, Any] = {
        "dir": str(e.dir),
        "name": e.name,
        "run_seed": run_seed,
        "git_commit": (e.meta.get("git") or {}).get("commit"),
        "gate": verdict.label,
        "gate_missing": list(verdict.missing),
        "accuracy": {},
        "comparisons": {},
    }
    if not verdict.claim_allowed:
        problems.append(
            f"{e.dir}: its evidence gate refused a claim ({len(verdict.missing)} check(s) failed)"
        )
    for kind in KINDS:
        outs = [v for v in outs_of[kind].values() if v is not None]
        row["accuracy"][kind] = (sum(outs) / len(outs)) if outs else None
    for kind in CONTROLS:
        ctl = _arm_of_kind(e, kind)
        if grpo is None or ctl is None:
            row["comparisons"][kind] = {
                "available": False,
                "reason": f"no {'grpo' if grpo is None else kind} arm",
            }
            continue
        c = compare_arms(e, ctl, grpo, n_boot=n_boot, seed=seed, ci=ci)
        row["comparisons"][kind] = {k: c.get(k) for k in _COMPARISON_KEYS if k in c}
    row["rl_over_sft"] = _rl_over_sft_row(e, verdict, n_boot=n_boot, seed=seed, ci=ci)
    return row, problems


def _ahead(c: dict) -> bool:
    """A comparison's second arm ahead with McNemar p < P_CLAIM."""
    return bool(c.get("available") and c["diff"] > 0 and c["p_value"] is not None and c["p_value"] < P_CLAIM)


def _rl_over_sft_row(e: Experiment, verdict, *, n_boot: int, seed: int, ci: float) -> dict:
    """One folder's RL-over-SFT evidence: its gate's verdict on the SFT-only control (`allowed`, `line`)
    and the primary arm of each RL kind (grpo*) vs the primary sft arm; `holds` = both."""
    out: dict[str, Any] = {
        "allowed": verdict.rl_over_sft_allowed,
        "line": verdict.rl_over_sft_line,
        "comparisons": {},
    }
    sft = _arm_of_kind(e, "sft")
    if sft is None:
        return out
    for kind in sorted({a.kind for a in e.arms.values() if a.kind.startswith("grpo")}):
        c = compare_arms(e, sft, _arm_of_kind(e, kind), n_boot=n_boot, seed=seed, ci=ci)
        row = {k: c.get(k) for k in _COMPARISON_KEYS if k in c}
        out["comparisons"][kind] = {**row, "ahead": _ahead(c), "holds": out["allowed"] and _ahead(c)}
    return out


def _rl_over_sft(runs: list[dict], consistent: bool) -> dict:
    """Across seeds, per RL kind: the seeds where it holds (the folder's SFT control passed and the kind
    beat sft with p < 0.01); a claim for a kind needs consistent folders and every seed."""
    per = [r["rl_over_sft"] for r in runs]
    if not all(p["comparisons"] for p in per):
        return {"answered": False, "kinds": {}, "problems": [SFT_MISSING], "line": SFT_MISSING}
    problems = [] if consistent else ["the folders are not one matrix with different seeds (see problems)"]
    problems += [f"run.seed {r['run_seed']}: {p['line']}" for r, p in zip(runs, per) if not p["allowed"]]
    kinds: dict[str, dict] = {}
    for kind in sorted(set().union(*(p["comparisons"] for p in per))):
        held = sum(1 for p in per if (p["comparisons"].get(kind) or {}).get("holds"))
        ahead = sum(1 for p in per if (p["comparisons"].get(kind) or {}).get("ahead"))
        kinds[kind] = {"seeds": len(per), "seeds_ahead": ahead, "seeds_holding": held}
        kinds[kind]["allowed"] = consistent and held == len(per)
        if ahead < len(per):
            problems.append(
                f"{kind} is ahead of sft with McNemar p < {P_CLAIM} in {ahead} of {len(per)} seeds"
            )
    claims = [k for k, v in kinds.items() if v["allowed"]]
    line = (
        (
            f"RL over SFT across seeds: may be claimed for {', '.join(claims)}"
            if claims
            else "RL over SFT across seeds: no claim"
        )
        + "; "
        + ", ".join(f"{k} holds in {v['seeds_holding']} of {v['seeds']} seeds" for k, v in kinds.items())
    )
    return {"answered": True, "kinds": kinds, "problems": problems, "line": line}


def _spread(
    per: list[dict], a_out: list[dict], b_out: list[dict], *, n_boot: int, seed: int, ci: float
) -> dict:
    """One pair of arms (b against a) across seeds, from each seed's available comparison `per` and
    outcomes by task: the per-seed differences (mean, smallest, largest, signs), the seeds where b led
    with p < 0.01, and `stats.hierarchical_bootstrap` on the tasks scored in every run of both arms."""
    from sqlrl.evidence import stats

    common = sorted(set.intersection(*(set(o) for o in a_out + b_out)))
    tasks = [t for t in common if all(o[t] is not None for o in a_out + b_out)]
    if not tasks:
        return {"available": False, "reason": "no task scored in every run of both arms"}
    h = stats.hierarchical_bootstrap(
        [[o[t] for t in tasks] for o in a_out],
        [[o[t] for t in tasks] for o in b_out],
        n_boot=n_boot,
        seed=seed,
        ci=ci,
    )
    diffs = [p["diff"] for p in per]
    return {
        "available": True,
        "seeds": len(per),
        "mean_diff": sum(diffs) / len(diffs),
        "min_diff": min(diffs),
        "max_diff": max(diffs),
        "seeds_above_zero": sum(1 for d in diffs if d > 0),
        "seeds_below_zero": sum(1 for d in diffs if d < 0),
        "seeds_ahead_p_lt_0.01": sum(1 for p in per if _ahead(p)),
        "hierarchical": h,
    }


def _across_seeds(
    runs: list[dict], outcomes: list[dict], *, n_boot: int, seed: int, ci: float
) -> tuple[dict, list[str]]:
    """Per control kind: GRPO against it across seeds (`_spread`); and the problems that refuse a claim
    across seeds."""
    problems = []
    across: dict[str, Any] = {}
    for kind in CONTROLS:
        per = [r["comparisons"].get(kind) or {} for r in runs]
        if not all(p.get("available") for p in per):
            across[kind] = {"available": False}
            continue
        a_out, b_out = [o[kind] for o in outcomes], [o["grpo"] for o in outcomes]
        across[kind] = a = _spread(per, a_out, b_out, n_boot=n_boot, seed=seed, ci=ci)
        if a["available"] and kind in CLAIM_CONTROLS and a["seeds_ahead_p_lt_0.01"] < len(per):
            problems.append(
                f"GRPO is ahead of {kind} with McNemar p < {P_CLAIM} in {a['seeds_ahead_p_lt_0.01']} of "
                f"{len(per)} seeds, not in every seed"
            )
    for kind in CLAIM_CONTROLS:
        if not (across.get(kind) or {}).get("available"):
            problems.append(f"no GRPO vs {kind} comparison in every folder")
    return across, problems


def _branch_start(exps: list[Experiment], seeds: list[Any], *, n_boot: int, seed: int, ci: float) -> dict:
    """grpo_sft vs its SFT start per seed and across seeds (`seedsbranch`); information only."""
    per = [branch_start_seed_row(e, s, n_boot=n_boot, seed=seed, ci=ci) for e, s in zip(exps, seeds)]
    rows = [r for r, _, _ in per]
    spread = None
    if all(r["available"] for r in rows):
        a_out, b_out = [_by_task(a) for _, a, _ in per], [_by_task(b) for _, _, b in per]
        spread = _spread(rows, a_out, b_out, n_boot=n_boot, seed=seed, ci=ci)
    return branch_start_summary(rows, spread)


def summarize(exp_dirs: list[str | Path], *, n_boot: int = 10000, seed: int = 0, ci: float = 0.95) -> dict:
    """The analysis described in the module docstring, as one JSON-serialisable dict."""
    exps = [Experiment(d) for d in exp_dirs]
    seeds = [_run_seed(e) for e in exps]
    problems, partial, lacking = _consistency_problems(exps, seeds)
    # per folder: kind -> {task id: 1 / 0 / None (not scored)} of its primary arm of that kind
    outcomes = [{kind: _outcomes(e, _arm_of_kind(e, kind)) for kind in KINDS} for e in exps]
    base = base_check(exps, [_arm_of_kind(e, "base") if o["base"] else None for e, o in zip(exps, outcomes)])
    problems += base["problems"]
    consistent = not problems
    runs: list[dict] = []
    for e, s, outs_of in zip(exps, seeds, outcomes):
        row, row_problems = _seed_row(e, s, outs_of, n_boot=n_boot, seed=seed, ci=ci)
        runs.append(row)
        problems += row_problems
    across, across_problems = _across_seeds(runs, outcomes, n_boot=n_boot, seed=seed, ci=ci)
    problems += across_problems
    commits = sorted({str((e.meta.get("git") or {}).get("commit")) for e in exps})
    notes = list(base["notes"])
    if partial:
        notes.append(
            f"settings present in only some folders (added by a newer sqlrl; not compared): {'; '.join(lacking)}"
        )
    if len(commits) > 1:
        notes.append(f"the folders were made by {len(commits)} code versions: {', '.join(commits)}")
    return {
        "claim_allowed": not problems,
        "verdict": "claim" if not problems else "no claim",
        "problems": problems,
        "notes": notes,
        "settings_in_some_folders_only": partial,
        "run_seeds": seeds,
        "runs": runs,
        "across_seeds": across,
        "base_evaluations_identical": base["identical"],
        "base_devices": base["devices"],
        "rl_over_sft": _rl_over_sft(runs, consistent),
        "grpo_sft_vs_sft_start": _branch_start(exps, seeds, n_boot=n_boot, seed=seed, ci=ci),
        "n_boot": n_boot,
        "bootstrap_seed": seed,
        "ci": ci,
    }


def _rl_over_sft_table(s: dict) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of plain text: per seed, the SFT control's verdict and each RL kind minus sft."""
    kinds = list(s["rl_over_sft"]["kinds"])
    heads = ["run.seed", "SFT control (gate, equal time, one device)", *[f"{k} − sft, p" for k in kinds]]
    rows = []
    for r in s["runs"]:
        o = r["rl_over_sft"]
        cells = [str(r["run_seed"]), "passed" if o["allowed"] else o["line"].removeprefix("RL over SFT: ")]
        for k in kinds:
            c = o["comparisons"].get(k) or {}
            ok = c.get("available")
            cells.append(
                f"{pp(c['diff'])}, p = {fmt_p(c['p_value'])}" + (" (holds)" if c["holds"] else "")
                if ok
                else "-"
            )
        rows.append(cells)
    return heads, rows


def render_markdown(s: dict) -> str:
    """seeds.md: the verdict, per-seed table, across-seed table, checks."""
    out = [f"# sqlrl seeds: {len(s['runs'])} training seeds of one experiment matrix", ""]
    out.append(f"**Verdict across seeds: {s['verdict'].upper()}.**")
    for p in s["problems"]:
        out.append(f"- {p}")
    out += ["", "## Per seed (each folder's own evidence gate and paired comparisons)", ""]
    out.append(
        "| run.seed | gate | base | grpo | no_update | validity | grpo − base (95% CI), p "
        "| grpo − no_update, p | grpo − validity, p |"
    )
    out.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in s["runs"]:
        acc = r["accuracy"]
        cells = []
        for kind in CONTROLS:
            c = r["comparisons"].get(kind) or {}
            if not c.get("available"):
                cells.append("-")
                continue
            ci_ = f" ({pp(c['ci_low'])} to {pp(c['ci_high'])})" if kind == "base" else ""
            cells.append(f"{pp(c['diff'])}{ci_}, p = {fmt_p(c['p_value'])}")
        out.append(
            f"| {r['run_seed']} | {r['gate']} | {pct(acc.get('base'))} | {pct(acc.get('grpo'))} "
            f"| {pct(acc.get('no_update'))} | {pct(acc.get('validity'))} | " + " | ".join(cells) + " |"
        )
    out += ["", "## Across seeds", ""]
    out.append(
        "| grpo vs | seeds | mean Δ | smallest Δ | largest Δ | seeds ahead with p < 0.01 "
        "| hierarchical bootstrap Δ (95% CI) | tasks |"
    )
    out.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for kind in CONTROLS:
        a = s["across_seeds"].get(kind) or {}
        if not a.get("available"):
            out.append(f"| {kind} | - | - | - | - | - | - | - |")
            continue
        h = a["hierarchical"]
        out.append(
            f"| {kind} | {a['seeds']} | {pp(a['mean_diff'])} | {pp(a['min_diff'])} | {pp(a['max_diff'])} "
            f"| {a['seeds_ahead_p_lt_0.01']} of {a['seeds']} | {pp(h['diff'])} ({pp(h['ci_low'])} to "
            f"{pp(h['ci_high'])}) | {h['n']} |"
        )
    rs = s["rl_over_sft"]
    out += ["", "## RL over SFT (the SFT-only control: a separate claim)", "", rs["line"]]
    out += [f"- {p}" for p in rs["problems"]]
    if rs["answered"]:
        heads, rows = _rl_over_sft_table(s)
        out += ["", "| " + " | ".join(heads) + " |", "|" + " --- |" * len(heads)]
        out += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows]
    out += branch_start_markdown(s["grpo_sft_vs_sft_start"])
    same = s["base_evaluations_identical"]
    out += [
        "",
        "Base evaluations identical across folders (every task's final SQL and status): "
        + ("-" if same is None else ("yes" if same else "**no**")),
        "",
        "Notes: " + ("; ".join(s["notes"]) if s["notes"] else "none"),
        "",
        "Folders: "
        + ", ".join(
            f"`{r['dir']}` (run.seed {r['run_seed']}, code {r['git_commit'] or '?'})" for r in s["runs"]
        ),
        "",
        f"Paired bootstrap / hierarchical bootstrap: {s['n_boot']} resamples, seed {s['bootstrap_seed']}; "
        "McNemar exact. The hierarchical interval resamples seeds within each arm and tasks once (shared); "
        "with few seeds it may be too narrow (`sqlrl.evidence.stats.hierarchical_bootstrap`).",
        "",
    ]
    return "\n".join(out)


def render_html(s: dict) -> str:
    """seeds.html: the verdict, an interval chart of GRPO's difference to each control per seed and across
    seeds (hierarchical bootstrap), and the tables of seeds.md."""
    ok = s["claim_allowed"]
    parts = [
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        f"<title>sqlrl seeds: {len(s['runs'])} training seeds</title><style>{CSS}</style></head><body><main>",
        f"<h1>sqlrl seeds: {len(s['runs'])} training seeds of one experiment matrix</h1>",
        f'<section class="verdict {"ok" if ok else "no"}"><span class="badge">'
        f"{'CLAIM ACROSS SEEDS' if ok else 'NO CLAIM'}</span>",
    ]
    if s["problems"]:
        parts.append("<ul>" + "".join(f"<li>{esc(p)}</li>" for p in s["problems"]) + "</ul>")
    else:
        parts.append(
            "<p>Every folder passed its own evidence gate and GRPO beat both controls with McNemar "
            f"p &lt; {P_CLAIM} in every seed.</p>"
        )
    parts.append("</section>")
    rows = []
    for kind in CONTROLS:
        color = KIND_COLOR.get(kind, "#2563eb")
        for r in s["runs"]:
            c = r["comparisons"].get(kind) or {}
            if c.get("available"):
                rows.append(
                    (f"grpo − {kind}, seed {r['run_seed']}", c["diff"], c["ci_low"], c["ci_high"], color)
                )
        a = s["across_seeds"].get(kind) or {}
        if a.get("available"):
            h = a["hierarchical"]
            rows.append((f"grpo − {kind}, all seeds", h["diff"], h["ci_low"], h["ci_high"], "#111827"))
    parts.append("<section><h2>Differences (95% CI)</h2>")
    parts.append(
        svg_interval_chart(
            rows, title="GRPO minus each control, per seed and across seeds", zero_line=True, pct_axis=True
        )
    )
    parts.append(
        '<p class="note">Per seed: paired bootstrap over the tasks scored in both arms. All seeds: '
        "hierarchical bootstrap (seeds resampled within each arm, tasks resampled once and shared); with few "
        "seeds it may be too narrow.</p></section>"
    )
    table = []
    for r in s["runs"]:
        acc = r["accuracy"]
        cells = [esc(r["run_seed"]), esc(r["gate"])]
        cells += [esc(pct(acc.get(k))) for k in ("base", "grpo", "no_update", "validity")]
        for kind in CONTROLS:
            c = r["comparisons"].get(kind) or {}
            cells.append(esc(f"{pp(c['diff'])}, p = {fmt_p(c['p_value'])}") if c.get("available") else "-")
        table.append(cells)
    heads = ["run.seed", "gate", "base", "grpo", "no_update", "validity"]
    heads += [f"grpo − {k}" for k in CONTROLS]
    parts += [
        "<section><h2>Per seed</h2>",
        html_table(heads, table),
        "</section><section><h2>Across seeds</h2>",
    ]
    across = []
    for kind in CONTROLS:
        a = s["across_seeds"].get(kind) or {}
        if not a.get("available"):
            across.append([esc(kind)] + ["-"] * 6)
            continue
        h = a["hierarchical"]
        across.append(
            [
                esc(kind),
                esc(a["seeds"]),
                esc(pp(a["mean_diff"])),
                esc(f"{pp(a['min_diff'])} to {pp(a['max_diff'])}"),
                esc(f"{a['seeds_ahead_p_lt_0.01']} of {a['seeds']}"),
                esc(f"{pp(h['diff'])} ({pp(h['ci_low'])} to {pp(h['ci_high'])})"),
                esc(h["n"]),
            ]
        )
    heads = [
        "grpo vs",
        "seeds",
        "mean Δ",
        "range of Δ",
        "ahead with p < 0.01",
        "hierarchical Δ (95% CI)",
        "tasks",
    ]
    parts.append(html_table([esc(x) for x in heads], across))
    rs = s["rl_over_sft"]
    parts.append(
        f"<h2>RL over SFT (the SFT-only control: a separate claim)</h2><p><b>{esc(rs['line'])}</b></p>"
    )
    if rs["problems"]:
        parts.append("<ul>" + "".join(f"<li>{esc(p)}</li>" for p in rs["problems"]) + "</ul>")
    if rs["answered"]:
        heads, rows = _rl_over_sft_table(s)
        parts.append(html_table([esc(x) for x in heads], [[esc(c) for c in row] for row in rows]))
    parts.append("</section>")
    parts += branch_start_html(s["grpo_sft_vs_sft_start"])
    same = s["base_evaluations_identical"]
    parts.append(
        "<section><p>Base evaluations identical across folders: "
        + ("-" if same is None else ("yes" if same else "<b>no</b>"))
        + "</p><p>Notes: "
        + (esc("; ".join(s["notes"])) if s["notes"] else "none")
        + "</p><p>Folders: "
        + ", ".join(f"<code>{esc(r['dir'])}</code> (run.seed {esc(r['run_seed'])})" for r in s["runs"])
        + "</p></section></main></body></html>"
    )
    return "".join(parts)


def write_summary(s: dict, out: str | Path) -> dict[str, Path]:
    """Write seeds.json, seeds.md and seeds.html into `out` (created); returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "seeds.json", "markdown": out / "seeds.md", "html": out / "seeds.html"}
    write_json_atomic(paths["json"], s)
    write_bytes_atomic(paths["markdown"], render_markdown(s).encode("utf-8"))
    write_bytes_atomic(paths["html"], render_html(s).encode("utf-8"))
    return paths
