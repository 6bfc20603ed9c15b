"""`sqlrl seeds EXP EXP [EXP ...]`: one experiment matrix run with several training seeds, summarised.

A single training run is one draw: GRPO's gain over its controls moves with the seed (`run.seed`
drives task sampling and rollout sampling; the split, the model, the budgets and the evaluation tasks
stay). This command takes the folders of the same matrix (`sqlrl experiment`) run with different
`run.seed` values and writes `seeds.json`, `seeds.md` and `seeds.html` (one self-contained file in the
report's style with an interval chart of every per-seed and across-seed difference; no JavaScript, all
text HTML-escaped):

- consistency checks: at least two folders; `run.seed` differs between every two of them; every other
  setting of the resolved configuration (`experiment.json` "config") is equal, except `data.path`
  (where the data lay) and settings that exist in only some folders (a newer sqlrl added them; noted,
  not failed); one dataset fingerprint; the same evaluation task list; the same arms. Folders made by
  different code versions (`git.commit`) are noted, not failed.
- every folder's own evidence gate (`gate.evidence_gate`), as `sqlrl report` applies it.
- per seed: GRPO against Base, No-update and validity-only (`report.compare_arms`: paired bootstrap and
  exact McNemar on the tasks scored in both arms).
- across seeds, per comparison: the mean, smallest and largest per-seed difference, the number of seeds
  where GRPO was ahead with McNemar p < 0.01, and `stats.hierarchical_bootstrap` over (seeds, tasks) on
  the tasks scored in every run of both arms (seeds resampled within each arm, tasks resampled once
  and shared).
- whether the Base evaluations agree answer for answer across the folders (same model, greedy: they
  should; a difference says the evaluation is not reproducible on that machine).

Verdict: a claim across seeds is allowed only when every consistency check passes, every folder's gate
allows its own claim, and for every control (No-update and validity-only) GRPO is ahead in every seed
with McNemar p < 0.01. Otherwise "no claim", with the reasons.

Compared arms: in each folder the primary arm of each kind (`Experiment.primary`: the arm named like its
kind, i.e. the first turn group of a matrix with several); other turn groups are not summarised.

Guaranteed: the numbers are recomputed from the folders' results.jsonl files (nothing copied from
summaries), deterministically (bootstrap seed 0, 10,000 resamples by default). Not guaranteed: with two
to five seeds the hierarchical interval sees little of the between-seed variability and may be too
narrow (see `stats.hierarchical_bootstrap`); no correction for multiple comparisons; a folder's gate is
re-applied, not its stored verdict.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlrl.artifacts import write_bytes_atomic, write_json_atomic
from sqlrl.evidence.gate import Experiment, _flatten, evidence_gate
from sqlrl.evidence.report import (
    CSS,
    KIND_COLOR,
    _e,
    _fmt_p,
    _pct,
    _pp,
    _table,
    compare_arms,
    svg_interval_chart,
)

KINDS = ("base", "grpo", "no_update", "validity")
CONTROLS = ("base", "no_update", "validity")
CLAIM_CONTROLS = ("no_update", "validity")  # a claim needs GRPO ahead of both, in every seed
P_CLAIM = 0.01
_IGNORED = ("run.seed", "data.path")


def _config_differences(exps: list[Experiment]) -> tuple[list[str], list[str]]:
    """(settings whose values differ between folders, settings present in only some folders)."""
    flats = [_flatten(e.meta.get("config") or {}) for e in exps]
    keys = sorted(set().union(*flats))
    differ, partial = [], []
    for k in keys:
        if k in _IGNORED:
            continue
        present = [f for f in flats if k in f]
        if len(present) < len(flats):
            partial.append(k)
            continue
        vals = [json.dumps(f[k], sort_keys=True) for f in present]
        if len(set(vals)) > 1:
            differ.append(f"{k}: " + " / ".join(vals))
    return differ, partial


def _run_seed(e: Experiment) -> Any:
    return ((e.meta.get("config") or {}).get("run") or {}).get("seed")


def _arm_of_kind(e: Experiment, kind: str) -> str | None:
    arm = e.primary(kind)
    return arm.name if arm is not None else None


def _outcomes(e: Experiment, arm: str | None) -> dict[str, int | None]:
    rows = e.results(arm) if arm else None
    return {
        str(r.get("task_id")): (None if r.get("correct") is None else int(bool(r["correct"])))
        for r in rows or []
    }


def summarize(exp_dirs: list[str | Path], *, n_boot: int = 10000, seed: int = 0, ci: float = 0.95) -> dict:
    """The analysis described in the module docstring, as one JSON-serialisable dict."""
    from sqlrl.evidence import stats

    exps = [Experiment(d) for d in exp_dirs]
    problems: list[str] = []
    if len(exps) < 2:
        problems.append(f"{len(exps)} experiment folder(s): a seed comparison needs at least two")
    seeds = [_run_seed(e) for e in exps]
    if len(set(map(json.dumps, seeds))) < len(seeds):
        problems.append(f"run.seed values are not all different: {seeds}")
    differ, partial = _config_differences(exps)
    problems += [f"setting differs between folders: {d}" for d in differ]
    fps = {str(e.meta.get("fingerprint")) for e in exps}
    if len(fps) > 1:
        problems.append(f"{len(fps)} dataset fingerprints: {sorted(fps)}")
    task_lists = {json.dumps(e.meta.get("tasks")) for e in exps}
    if len(task_lists) > 1:
        problems.append("the evaluation task lists differ between folders")
    arm_sets = {tuple(sorted(e.arms)) for e in exps}
    if len(arm_sets) > 1:
        problems.append(f"the arms differ between folders: {sorted(arm_sets)}")

    # per folder: kind -> {task id: 1 / 0 / None (excluded)} of its primary arm of that kind
    outcomes = [{kind: _outcomes(e, _arm_of_kind(e, kind)) for kind in KINDS} for e in exps]
    runs: list[dict] = []
    for e, s, outs_of in zip(exps, seeds, outcomes):
        verdict = evidence_gate(e)
        grpo = _arm_of_kind(e, "grpo")
        row: dict[str, Any] = {
            "dir": str(e.dir),
            "name": e.name,
            "run_seed": s,
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
            row["comparisons"][kind] = {
                k: c.get(k)
                for k in (
                    "available",
                    "n",
                    "diff",
                    "ci_low",
                    "ci_high",
                    "p_value",
                    "b_only",
                    "a_only",
                    "reason",
                )
                if k in c
            }
        runs.append(row)

    across: dict[str, Any] = {}
    for kind in CONTROLS:
        per = [r["comparisons"].get(kind) or {} for r in runs]
        if not all(p.get("available") for p in per):
            across[kind] = {"available": False}
            continue
        diffs = [p["diff"] for p in per]
        ahead = sum(1 for p in per if p["diff"] > 0 and p["p_value"] is not None and p["p_value"] < P_CLAIM)
        a_out = [o[kind] for o in outcomes]
        b_out = [o["grpo"] for o in outcomes]
        common = sorted(set.intersection(*(set(o) for o in a_out + b_out)))
        tasks = [t for t in common if all(o[t] is not None for o in a_out + b_out)]
        if not tasks:
            across[kind] = {"available": False, "reason": "no task scored in every run of both arms"}
            continue
        h = stats.hierarchical_bootstrap(
            [[o[t] for t in tasks] for o in a_out],
            [[o[t] for t in tasks] for o in b_out],
            n_boot=n_boot,
            seed=seed,
            ci=ci,
        )
        across[kind] = {
            "available": True,
            "seeds": len(per),
            "mean_diff": sum(diffs) / len(diffs),
            "min_diff": min(diffs),
            "max_diff": max(diffs),
            "seeds_ahead_p_lt_0.01": ahead,
            "hierarchical": h,
        }
        if kind in CLAIM_CONTROLS and ahead < len(per):
            problems.append(
                f"GRPO is ahead of {kind} with McNemar p < {P_CLAIM} in {ahead} of {len(per)} seeds, not in every seed"
            )
    for kind in CLAIM_CONTROLS:
        if not (across.get(kind) or {}).get("available"):
            problems.append(f"no GRPO vs {kind} comparison in every folder")

    base_same = None
    if all(o["base"] for o in outcomes):
        answers = []
        for e in exps:
            rows = e.results(_arm_of_kind(e, "base") or "") or []
            answers.append({str(r.get("task_id")): (r.get("final_sql"), r.get("status")) for r in rows})
        base_same = all(a == answers[0] for a in answers[1:])
    commits = sorted({str((e.meta.get("git") or {}).get("commit")) for e in exps})
    notes = []
    if partial:
        notes.append(
            f"settings present in only some folders (added by a newer sqlrl; not compared): {', '.join(partial)}"
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
        "base_evaluations_identical": base_same,
        "n_boot": n_boot,
        "bootstrap_seed": seed,
        "ci": ci,
    }


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
            ci_ = f" ({_pp(c['ci_low'])} to {_pp(c['ci_high'])})" if kind == "base" else ""
            cells.append(f"{_pp(c['diff'])}{ci_}, p = {_fmt_p(c['p_value'])}")
        out.append(
            f"| {r['run_seed']} | {r['gate']} | {_pct(acc.get('base'))} | {_pct(acc.get('grpo'))} "
            f"| {_pct(acc.get('no_update'))} | {_pct(acc.get('validity'))} | " + " | ".join(cells) + " |"
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
            f"| {kind} | {a['seeds']} | {_pp(a['mean_diff'])} | {_pp(a['min_diff'])} | {_pp(a['max_diff'])} "
            f"| {a['seeds_ahead_p_lt_0.01']} of {a['seeds']} | {_pp(h['diff'])} ({_pp(h['ci_low'])} to "
            f"{_pp(h['ci_high'])}) | {h['n']} |"
        )
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
        parts.append("<ul>" + "".join(f"<li>{_e(p)}</li>" for p in s["problems"]) + "</ul>")
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
        cells = [_e(r["run_seed"]), _e(r["gate"])]
        cells += [_e(_pct(acc.get(k))) for k in ("base", "grpo", "no_update", "validity")]
        for kind in CONTROLS:
            c = r["comparisons"].get(kind) or {}
            cells.append(_e(f"{_pp(c['diff'])}, p = {_fmt_p(c['p_value'])}") if c.get("available") else "-")
        table.append(cells)
    heads = ["run.seed", "gate", "base", "grpo", "no_update", "validity"]
    heads += [f"grpo − {k}" for k in CONTROLS]
    parts += ["<section><h2>Per seed</h2>", _table(heads, table), "</section><section><h2>Across seeds</h2>"]
    across = []
    for kind in CONTROLS:
        a = s["across_seeds"].get(kind) or {}
        if not a.get("available"):
            across.append([_e(kind)] + ["-"] * 6)
            continue
        h = a["hierarchical"]
        across.append(
            [
                _e(kind),
                _e(a["seeds"]),
                _e(_pp(a["mean_diff"])),
                _e(f"{_pp(a['min_diff'])} to {_pp(a['max_diff'])}"),
                _e(f"{a['seeds_ahead_p_lt_0.01']} of {a['seeds']}"),
                _e(f"{_pp(h['diff'])} ({_pp(h['ci_low'])} to {_pp(h['ci_high'])})"),
                _e(h["n"]),
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
    parts.append(_table([_e(x) for x in heads], across))
    same = s["base_evaluations_identical"]
    parts.append(
        "<p>Base evaluations identical across folders: "
        + ("-" if same is None else ("yes" if same else "<b>no</b>"))
        + "</p><p>Notes: "
        + (_e("; ".join(s["notes"])) if s["notes"] else "none")
        + "</p><p>Folders: "
        + ", ".join(f"<code>{_e(r['dir'])}</code> (run.seed {_e(r['run_seed'])})" for r in s["runs"])
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
