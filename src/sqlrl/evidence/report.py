"""`sqlrl report EXP`: apply the evidence gate and write verdict.json, report.md and report.html.

`write_report(exp_dir, out_dir=None) -> dict` writes three files (into the experiment folder by default):

- `verdict.json`: `gate.evidence_gate(...).to_dict()` (claim / no claim, the checks, the missing list).
- `report.md`: a Markdown summary (verdict, results table, paired comparisons, repair decomposition, turn
  use of multi-turn arms).
- `report.html`: ONE self-contained file: inline CSS, charts as inline SVG generated here, no JavaScript,
  no external resources (opens offline). Every piece of text from the artifacts is HTML-escaped.

Numbers and where they come from (all recomputed from the raw per-task files, not copied from summaries):

- accuracy per arm: mean of `correct` over the arm's results.jsonl records whose `correct` is not null
  (excluded tasks are counted separately), with a percentile bootstrap CI (`stats.accuracy_ci`); tasks are
  ordered by task_id. If summary.json disagrees with the recomputed value the report says so.
- paired differences: tasks present in both arms' results, ordered by task_id; a task excluded in either
  arm (`correct` null) is dropped from that pair and counted. `stats.paired_bootstrap(a, b)` (diff =
  mean(b) - mean(a)) and `stats.mcnemar_exact(a, b)`; every non-base arm vs the base arm with the same
  `turns` ("Δ vs Base"), and every GRPO-kind arm vs the control arms with the same `turns`. When no arm
  with the same turns exists the comparison falls back to the primary arm and is labelled
  "(different turns)".
- repair decomposition (arm vs base, same pairs): scored statuses are grouped as `match`, `mismatch`
  and non-executable (every other scored status: no_sql, exec_error, timeout, ...). Then
  Δ = (repair gains − breakages)/n + (answer gains − answer losses)/n exactly, where repair gains are
  non-executable → match, breakages match → non-executable, answer gains mismatch → match, answer losses
  match → mismatch. The first term is the "format/validity repair" part of the change.
- turn use (arms with more than one turn; `turn_use`): stop reasons and mean turns from results.jsonl;
  from the raw trajectories, answers revised after feedback (final SQL != first query proposed,
  whitespace-normalised) and trajectories that repeated one query. Descriptive counts only (no
  statistical test, no confidence interval).
- GPU minutes: train run.json `gpu_minutes`, else the sum of steps.jsonl `time_step_s` / 60 (marked "~");
  '-' when neither exists.

Guaranteed: deterministic output for a given folder (bootstrap seed 0, 10000 resamples by default); the
report is written even when the gate says "no claim" (and then says so at the top). Not guaranteed:
bootstrap intervals are percentile intervals (see stats.py for their coverage caveats); the report does not
correct for multiple comparisons; it trusts run.json/summary.json for provenance (machine, model identity).
"""

from __future__ import annotations

import html
import json
import math
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlrl.artifacts import write_bytes_atomic, write_json_atomic
from sqlrl.evidence.gate import Experiment, evidence_gate

NONEXEC = "non-executable"
STATUS_ORDER = ["match", "mismatch", "exec_error", "no_sql", "timeout", "gold_unscorable", "infra_error"]
STATUS_COLORS = {
    "match": "#16a34a",
    "mismatch": "#f59e0b",
    "exec_error": "#dc2626",
    "no_sql": "#7f1d1d",
    "timeout": "#9333ea",
    "gold_unscorable": "#9ca3af",
    "infra_error": "#4b5563",
}
ARM_COLORS = ["#6b7280", "#2563eb", "#d97706", "#7c3aed", "#0d9488", "#db2777", "#65a30d", "#0891b2"]
KIND_COLOR = {"base": "#6b7280", "grpo": "#2563eb", "no_update": "#d97706", "validity": "#7c3aed"}
CURVE_METRICS = [
    ("reward_mean", "reward (mean)"),
    ("accuracy", "train accuracy"),
    ("kl", "KL to reference"),
    ("grad_norm", "grad norm"),
    ("loss", "loss"),
    ("time_step_s", "step time (s)"),
    ("time_score_s", "reward scoring time (s)"),
]


# ---------------------------------------------------------------------------------------------------------
# Analysis (pure data; shared by the HTML, the Markdown and the tests)


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def paired_outcomes(results_a: list[dict], results_b: list[dict]) -> dict:
    """Pair two arms' results by task_id (sorted); drop tasks excluded in either arm.

    Returns {task_ids, a, b (lists of 0/1), status_a, status_b, dropped_excluded, unpaired}.
    """
    ra = {str(r.get("task_id")): r for r in results_a}
    rb = {str(r.get("task_id")): r for r in results_b}
    common = sorted(set(ra) & set(rb))
    out: dict[str, Any] = {"task_ids": [], "a": [], "b": [], "status_a": [], "status_b": []}
    dropped = 0
    for t in common:
        ca, cb = ra[t].get("correct"), rb[t].get("correct")
        if ca is None or cb is None:
            dropped += 1
            continue
        out["task_ids"].append(t)
        out["a"].append(int(bool(ca)))
        out["b"].append(int(bool(cb)))
        out["status_a"].append(str(ra[t].get("status")))
        out["status_b"].append(str(rb[t].get("status")))
    out["dropped_excluded"] = dropped
    out["unpaired"] = len(set(ra) ^ set(rb))
    return out


def compare_arms(
    exp: Experiment, a: str, b: str, *, n_boot: int = 10000, seed: int = 0, ci: float = 0.95
) -> dict:
    """Paired comparison of arm b against arm a (diff = acc(b) - acc(a)) on tasks scored in both."""
    from sqlrl.evidence import stats

    ra, rb = exp.results(a), exp.results(b)
    row: dict[str, Any] = {"a": a, "b": b, "n": 0, "available": False}
    if ra is None or rb is None:
        row["reason"] = f"results.jsonl missing for {a if ra is None else b}"
        return row
    p = paired_outcomes(ra, rb)
    row.update(dropped_excluded=p["dropped_excluded"], unpaired=p["unpaired"], n=len(p["a"]))
    if not p["a"]:
        row["reason"] = "no task scored in both arms"
        return row
    boot = stats.paired_bootstrap(p["a"], p["b"], n_boot=n_boot, seed=seed, ci=ci)
    mc = stats.mcnemar_exact(p["a"], p["b"])
    gains = sum(1 for x, y in zip(p["a"], p["b"]) if not x and y)
    losses = sum(1 for x, y in zip(p["a"], p["b"]) if x and not y)
    row.update(
        available=True,
        diff=boot["diff"],
        ci_low=boot["ci_low"],
        ci_high=boot["ci_high"],
        mean_a=boot.get("mean_a", sum(p["a"]) / len(p["a"])),
        mean_b=boot.get("mean_b", sum(p["b"]) / len(p["b"])),
        p_value=mc.get("p_value", mc.get("p")),
        b_only=gains,  # a wrong, b right
        a_only=losses,  # a right, b wrong
        bootstrap=boot,
        mcnemar=mc,
    )
    row["repair"] = repair_decomposition(p)
    return row


def _group(status: str, correct: int) -> str:
    if correct:
        return "match"
    return "mismatch" if status == "mismatch" else NONEXEC


def repair_decomposition(p: dict) -> dict:
    """Split the paired change into format/validity repair vs answer change (see module docstring)."""
    groups = ("match", "mismatch", NONEXEC)
    trans = {ga: dict.fromkeys(groups, 0) for ga in groups}
    for sa, sb, ca, cb in zip(p["status_a"], p["status_b"], p["a"], p["b"]):
        trans[_group(sa, ca)][_group(sb, cb)] += 1
    n = len(p["a"])
    rg, bl = trans[NONEXEC]["match"], trans["match"][NONEXEC]
    ag, al = trans["mismatch"]["match"], trans["match"]["mismatch"]
    return {
        "n": n,
        "transitions": trans,
        "repair_gains": rg,
        "breakages": bl,
        "answer_gains": ag,
        "answer_losses": al,
        "repair_part": (rg - bl) / n if n else 0.0,
        "answer_part": (ag - al) / n if n else 0.0,
        "delta": (rg + ag - bl - al) / n if n else 0.0,
        "became_executable": trans[NONEXEC]["match"] + trans[NONEXEC]["mismatch"],
        "became_nonexecutable": trans["match"][NONEXEC] + trans["mismatch"][NONEXEC],
    }


def _norm_sql(sql: Any) -> str | None:
    return " ".join(sql.split()) if isinstance(sql, str) and sql.strip() else None


def turn_use(results: list[dict], trajectories: list[dict] | None) -> dict:
    """How a multi-turn arm used its turns, over its scored tasks (results with `correct` not None).

    From results.jsonl: `stop_reason` counts (`final` = the policy replied FINAL, `max_turns` = it ran
    out of turns, ...) and the mean number of turns. From the raw trajectories when present (None
    otherwise): `with_sql` = trajectories that proposed at least one query; `revised` = the final SQL
    differs from the first query proposed (whitespace-normalised), i.e. the answer changed after
    feedback; `repeated` = two or more queries proposed and all identical. A high `repeated` with few
    `final` replies means the turns were spent re-running one query, not debugging."""
    scored = [r for r in results if r.get("correct") is not None]
    stops: dict[str, int] = {}
    for r in scored:
        k = str(r.get("stop_reason"))
        stops[k] = stops.get(k, 0) + 1
    turns = [r["turns"] for r in scored if isinstance(r.get("turns"), int)]
    out: dict[str, Any] = {
        "n": len(scored),
        "stop_reasons": dict(sorted(stops.items(), key=lambda kv: -kv[1])),
        "mean_turns": sum(turns) / len(turns) if turns else None,
        "with_sql": None,
        "revised": None,
        "revised_correct": None,
        "repeated": None,
    }
    if trajectories is None:
        return out
    correct = {str(r.get("task_id")): bool(r["correct"]) for r in scored}
    with_sql = revised = revised_correct = repeated = 0
    for t in trajectories:
        tid = str(t.get("task_id"))
        if tid not in correct:
            continue
        sqls = [
            q for q in (_norm_sql(x.get("sql")) for x in t.get("turns") or [] if isinstance(x, dict)) if q
        ]
        if not sqls:
            continue
        with_sql += 1
        final = _norm_sql(t.get("final_sql"))
        if final is not None and final != sqls[0]:
            revised += 1
            revised_correct += int(correct[tid])
        if len(sqls) >= 2 and len(set(sqls)) == 1:
            repeated += 1
    out.update(with_sql=with_sql, revised=revised, revised_correct=revised_correct, repeated=repeated)
    return out


def _gpu_minutes(exp: Experiment, arm: str) -> tuple[float | None, str]:
    run = exp.train_run(arm)
    if isinstance(run, dict) and _num(run.get("gpu_minutes")) is not None:
        return float(run["gpu_minutes"]), "run.json"
    steps = exp.steps(arm)
    if steps:
        t = [_num(s.get("time_step_s")) for s in steps]
        t = [x for x in t if x is not None]
        if t:
            return sum(t) / 60.0, "steps"
    return None, ""


def _arm_info(exp: Experiment, name: str, *, n_boot: int, seed: int, ci: float) -> dict:
    from sqlrl.evidence import stats

    arm = exp.arms[name]
    results = exp.results(name)
    summary = exp.summary(name) or {}
    run = exp.eval_run(name) or {}
    info: dict[str, Any] = {
        "name": name,
        "kind": arm.kind,
        "turns": arm.turns,
        "budgets": arm.budgets,
        "trained": arm.train_dir is not None,
        "has_results": results is not None,
        "fingerprint": exp.fingerprint(name),
        "split": summary.get("split") or run.get("split"),
        "model": summary.get("model") or run.get("model") or {},
        "machine": summary.get("machine") or run.get("machine") or {},
        "elapsed_s": _num(summary.get("elapsed_s")),
        "notes": [],
    }
    if results is not None:
        ordered = sorted(results, key=lambda r: str(r.get("task_id")))
        scored = [r for r in ordered if r.get("correct") is not None]
        excluded: dict[str, int] = {}
        for r in ordered:
            if r.get("correct") is None:
                excluded[str(r.get("status"))] = excluded.get(str(r.get("status")), 0) + 1
        status_counts: dict[str, int] = {}
        for r in ordered:
            status_counts[str(r.get("status"))] = status_counts.get(str(r.get("status")), 0) + 1
        info.update(n_total=len(ordered), n=len(scored), excluded=excluded, status_counts=status_counts)
        if scored:
            acc = stats.accuracy_ci(
                [int(bool(r["correct"])) for r in scored], n_boot=n_boot, seed=seed, ci=ci
            )
            info["accuracy"] = {"value": acc["accuracy"], "ci_low": acc["ci_low"], "ci_high": acc["ci_high"]}
            ts = [r.get("test_suite_correct") for r in scored if r.get("test_suite_correct") is not None]
            info["test_suite"] = {"value": sum(map(bool, ts)) / len(ts), "n": len(ts)} if ts else None
            ex = _num(summary.get("executable_rate"))
            if ex is None:
                ex = sum(r.get("status") in ("match", "mismatch") for r in scored) / len(scored)
            info["executable_rate"] = ex
            s_acc = _num(summary.get("execution_match"))
            if s_acc is not None and abs(s_acc - acc["accuracy"]) > 1e-9:
                info["notes"].append(
                    f"summary.json execution_match={s_acc:.4f} disagrees with results.jsonl ({acc['accuracy']:.4f})"
                )
        per_db: dict[str, list[int]] = {}
        for r in scored:
            d = per_db.setdefault(str(r.get("db_id")), [0, 0])
            d[0] += int(bool(r["correct"]))
            d[1] += 1
        info["per_db"] = per_db
        info["turn_use"] = turn_use(results, exp.trajectories(name)) if (arm.turns or 1) > 1 else None
    train_run = exp.train_run(name) if arm.train_dir is not None else None
    steps = exp.steps(name) if arm.train_dir is not None else None
    gm, gsrc = _gpu_minutes(exp, name) if arm.train_dir is not None else (None, "")
    info["train"] = (
        {
            "steps": len(steps) if steps is not None else None,
            "gpu_minutes": gm,
            "gpu_minutes_source": gsrc,
            "machine": (train_run or {}).get("machine") or {},
            "model": (train_run or {}).get("model") or {},
        }
        if arm.train_dir is not None
        else None
    )
    return info


def analyze(
    exp_dir: str | Path | Experiment, *, n_boot: int = 10000, seed: int = 0, ci: float = 0.95
) -> dict:
    """Everything the report shows, as plain data. Raises gate.ExperimentError for a non-experiment folder."""
    exp = exp_dir if isinstance(exp_dir, Experiment) else Experiment(exp_dir)
    verdict = evidence_gate(exp)
    arms = [_arm_info(exp, a, n_boot=n_boot, seed=seed, ci=ci) for a in exp.arms]
    base = exp.primary("base")
    # Every non-base arm vs the base arm with the same turns (else the primary base, flagged), and every
    # GRPO-kind arm vs the control arms with the same turns (else all controls of that kind, flagged).
    pairs: list[tuple[str, str]] = []
    base_of: dict[str, str] = {}
    for arm in exp.arms.values():
        if arm.kind == "base":
            continue
        b = exp.base_for(arm) or base
        if b is not None:
            base_of[arm.name] = b.name
            pairs.append((b.name, arm.name))
    for g in exp.arms_of("grpo"):
        for kind in ("no_update", "validity"):
            for c in exp.same_turns(g, kind) or exp.arms_of(kind):
                if (c.name, g.name) not in pairs:
                    pairs.append((c.name, g.name))
    comparisons = []
    for a, b in pairs:
        row = compare_arms(exp, a, b, n_boot=n_boot, seed=seed, ci=ci)
        row["turns_differ"] = exp.arms[a].turns != exp.arms[b].turns
        comparisons.append(row)
    curves = {a: exp.steps(a) or [] for a in exp.arms if exp.arms[a].train_dir is not None and exp.steps(a)}
    colors = {}
    for a in exp.arms:
        kind_default = KIND_COLOR.get(exp.arms[a].kind)
        colors[a] = kind_default if kind_default and exp.primary(exp.arms[a].kind).name == a else None
    spare = [c for c in ARM_COLORS if c not in colors.values()]
    for a in exp.arms:
        if colors[a] is None:
            colors[a] = spare.pop(0) if spare else "#111827"
    return {
        "experiment": {
            "name": exp.name,
            "dir": str(exp.dir),
            "flags": exp.flags(),
            "split": exp.meta.get("split"),
            "fingerprint": exp.meta.get("fingerprint"),
            "model": exp.meta.get("model"),
            "machine": exp.meta.get("machine"),
            "n_tasks": len(exp.meta.get("tasks") or []),
        },
        "verdict": verdict,
        "arms": arms,
        "comparisons": comparisons,
        "curves": curves,
        "colors": colors,
        "base": base.name if base else None,
        "base_of": base_of,
        "params": {"n_boot": n_boot, "seed": seed, "ci": ci},
        "_exp": exp,
    }


# ---------------------------------------------------------------------------------------------------------
# Formatting helpers


def _pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def _pp(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f} pp"


def _fmt_p(p: float | None) -> str:
    if p is None:
        return "-"
    if p >= 0.001:
        return f"{p:.3f}"
    return f"{p:.1e}"


def _acc_ci(arm: dict) -> str:
    acc = arm.get("accuracy")
    if not acc:
        return "-"
    return f"{_pct(acc['value'])} ({100 * acc['ci_low']:.1f}–{100 * acc['ci_high']:.1f})"


def _diff_ci(row: dict | None) -> str:
    if not row or not row.get("available"):
        return "-"
    return f"{_pp(row['diff'])} ({100 * row['ci_low']:+.1f} to {100 * row['ci_high']:+.1f})"


def _short(h: Any, n: int = 12) -> str:
    return "-" if not h else str(h)[:n]


def _machine_str(m: Any) -> str:
    if not isinstance(m, dict) or not m:
        return "-"
    parts = [str(m.get("accelerator") or "CPU only")]
    if m.get("gpu_count"):
        parts[0] = f"{m['gpu_count']}× {parts[0]}"
    if m.get("hostname"):
        parts.append(f"on {m['hostname']}")
    return " ".join(parts)


def _budgets_str(b: Any) -> str:
    if not isinstance(b, dict):
        return "-"
    return ", ".join(f"{k}={json.dumps(v) if isinstance(v, dict | list) else v}" for k, v in b.items())


def _gpu_str(arm: dict) -> str:
    t = arm.get("train")
    if not t or t.get("gpu_minutes") is None:
        return "-"
    return ("~" if t["gpu_minutes_source"] == "steps" else "") + f"{t['gpu_minutes']:.1f}"


def _find_cmp(analysis: dict, a: str, b: str) -> dict | None:
    for row in analysis["comparisons"]:
        if row["a"] == a and row["b"] == b:
            return row
    return None


def results_table_md(exp_dir: str | Path | Experiment | dict, **kw: Any) -> str:
    """README-ready Markdown table: arm | accuracy (95% CI) | Δ vs Base (95% CI) | McNemar p | GPU minutes | steps."""
    analysis = exp_dir if isinstance(exp_dir, dict) else analyze(exp_dir, **kw)
    level = int(round(100 * analysis["params"]["ci"]))
    lines = [
        f"| arm | accuracy ({level}% CI) | Δ vs Base ({level}% CI) | McNemar p | GPU minutes | steps |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for arm in analysis["arms"]:
        b = analysis["base_of"].get(arm["name"])
        row = _find_cmp(analysis, b, arm["name"]) if b else None
        train = arm.get("train") or {}
        steps = train.get("steps")
        lines.append(
            "| "
            + " | ".join(
                [
                    _md_cell(arm["name"]),
                    _acc_ci(arm),
                    _diff_ci(row),
                    _fmt_p(row["p_value"]) if row and row.get("available") else "-",
                    _gpu_str(arm),
                    str(steps) if steps is not None else "-",
                ]
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def _md_cell(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


# ---------------------------------------------------------------------------------------------------------
# Markdown


TURN_USE_HEADERS = [
    "arm",
    "turns",
    "scored",
    "replied FINAL",
    "ran out of turns",
    "other stops",
    "mean turns",
    "revised after feedback",
    "one query repeated",
]


TURN_USE_NOTE = (
    "Over scored tasks. Revised after feedback: the final SQL differs from the first query proposed (with how "
    "many of those are correct). One query repeated: two or more queries, all identical. Many repeats and few "
    "FINAL replies mean the turns were spent re-running one query, not debugging."
)


def turn_use_rows(analysis: dict) -> list[list[str]]:
    """Rows of the turn-use table (plain text), one per multi-turn arm; [] when there is none."""
    rows = []
    for arm in analysis["arms"]:
        u = arm.get("turn_use")
        if not u or not u["n"]:
            continue
        stops = dict(u["stop_reasons"])
        final, out_of = stops.pop("final", 0), stops.pop("max_turns", 0)
        other = ", ".join(f"{k} {v}" for k, v in stops.items()) or "-"

        def share(k: int | None, n: int = u["n"]) -> str:
            return "-" if k is None else f"{k} ({100 * k / n:.0f}%)"

        rev = "-" if u["revised"] is None else f"{share(u['revised'])}, {u['revised_correct']} correct"
        mt = "-" if u["mean_turns"] is None else f"{u['mean_turns']:.2f}"
        rows.append(
            [
                arm["name"],
                str(arm["turns"]),
                str(u["n"]),
                share(final),
                share(out_of),
                other,
                mt,
                rev,
                share(u["repeated"]),
            ]
        )
    return rows


def render_markdown(analysis: dict, links: dict[str, dict[str, str]]) -> str:
    v = analysis["verdict"]
    e = analysis["experiment"]
    out = [f"# sqlrl report: {_md_cell(e['name'])}", ""]
    if v.claim_allowed:
        out += ["**Verdict: CLAIM ALLOWED.** Every evidence check passed.", ""]
    else:
        out += [
            "**Verdict: NO CLAIM.** The evidence gate did not pass; the numbers below are not a learning result.",
            "",
        ]
        out += ["Missing:", ""] + [f"- {_md_cell(m)}" for m in v.missing] + [""]
    out += ["## Evidence checks", "", "| check | passed | detail |", "| --- | --- | --- |"]
    out += [f"| {c.name} | {'yes' if c.passed else 'NO'} | {_md_cell(c.detail)} |" for c in v.checks]
    out += ["", "## Results", "", results_table_md(analysis)]
    out += [
        "Accuracy = execution match over scored tasks (excluded tasks dropped), percentile bootstrap CI; "
        "Δ and McNemar p are paired by task id over tasks scored in both arms.",
        "",
        "## Paired comparisons",
        "",
        "| comparison | n pairs | Δ (95% CI) | b right, a wrong | a right, b wrong | McNemar p | dropped (excluded) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in analysis["comparisons"]:
        label = f"{row['b']} vs {row['a']}" + (" (different turns)" if row.get("turns_differ") else "")
        if row.get("available"):
            out.append(
                f"| {_md_cell(label)} | {row['n']} | {_diff_ci(row)} | {row['b_only']} | {row['a_only']} | "
                f"{_fmt_p(row['p_value'])} | {row['dropped_excluded']} |"
            )
        else:
            out.append(f"| {_md_cell(label)} | 0 | - | - | - | - | {_md_cell(row.get('reason', ''))} |")
    rep = [
        r for r in analysis["comparisons"] if r.get("available") and r["a"] == analysis["base_of"].get(r["b"])
    ]
    if rep:
        out += [
            "",
            "## Format/validity repair vs answer change (each arm vs base)",
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
                f"| {_md_cell(r['b'])} | {_pp(d['delta'])} | {_pp(d['repair_part'])} | {_pp(d['answer_part'])} | "
                f"{d['became_executable']} | {d['became_nonexecutable']} |"
            )
    tu = turn_use_rows(analysis)
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
        out += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in tu]
    out += [
        "",
        "## Provenance",
        "",
        "| arm | kind | turns | model identity | eval machine | fingerprint | budgets | files |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for arm in analysis["arms"]:
        lk = links.get(arm["name"], {})
        files = " ".join(f"[{k}]({quote(v)})" for k, v in lk.items()) or "-"
        out.append(
            f"| {_md_cell(arm['name'])} | {arm['kind']} | {arm['turns']} | `{_short(arm['model'].get('identity'), 16)}` | "
            f"{_md_cell(_machine_str(arm['machine']))} | `{_short(arm['fingerprint'])}` | "
            f"{_md_cell(_budgets_str(arm['budgets']))} | {files} |"
        )
    out += ["", "Full report with charts: `report.html`.", ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------------
# SVG charts (hand-written, no plotting dependency)


def _e(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0, 1.0]
    if hi <= lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=10 * mag)
    start = math.floor(lo / step + 1e-9) * step
    stop = math.ceil(hi / step - 1e-9) * step
    count = min(50, int(round((stop - start) / step)) + 1)
    return [round(start + i * step, 12) for i in range(max(2, count))]


def _fmt_tick(t: float, scale: float = 1.0, suffix: str = "") -> str:
    v = t * scale
    if v == 0:
        return "0" + suffix
    if abs(v) >= 1e5 or abs(v) < 0.01:
        return f"{v:.1e}" + suffix
    if float(v).is_integer():
        return f"{int(v)}" + suffix
    return f"{v:.3g}" + suffix


def svg_line_chart(
    title: str, series: dict[str, list[tuple[float, float | None]]], colors: dict[str, str]
) -> str:
    w, h = 322, 200
    ml, mr, mt, mb = 52, 12, 30, 34
    pts = [(x, y) for s in series.values() for x, y in s if y is not None]
    if not pts:
        return (
            f'<svg class="chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{_e(title)}">'
            f'<text x="{w / 2}" y="20" text-anchor="middle" class="ct">{_e(title)}</text>'
            f'<text x="{w / 2}" y="{h / 2}" text-anchor="middle" class="muted">not recorded</text></svg>'
        )
    xs = [p[0] for p in pts]
    ys = [p[1] for p in pts]
    xt = _nice_ticks(min(xs), max(xs), 5)
    if all(float(x).is_integer() for x in xs) and any(not float(t).is_integer() for t in xt):
        span = max(xs) - min(xs)
        step = next(m * 10**e for e in range(12) for m in (1, 2, 5) if span / (m * 10**e) <= 6)
        lo_t, hi_t = math.floor(min(xs) / step) * step, math.ceil(max(xs) / step) * step
        xt = [float(lo_t + i * step) for i in range(int((hi_t - lo_t) // step) + 1)]
        if len(xt) < 2:
            xt = [xt[0], xt[0] + step]
    yt = _nice_ticks(min(ys), max(ys), 4)
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]

    def sx(x: float) -> float:
        return ml + (x - x0) / ((x1 - x0) or 1) * (w - ml - mr)

    def sy(y: float) -> float:
        return h - mb - (y - y0) / ((y1 - y0) or 1) * (h - mt - mb)

    parts = [
        f'<svg class="chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{_e(title)}">',
        f'<text x="{ml}" y="18" class="ct">{_e(title)}</text>',
    ]
    for t in yt:
        parts.append(f'<line x1="{ml}" x2="{w - mr}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" class="grid"/>')
        parts.append(
            f'<text x="{ml - 6}" y="{sy(t) + 4:.1f}" text-anchor="end" class="tick">{_e(_fmt_tick(t))}</text>'
        )
    for t in xt:
        parts.append(
            f'<text x="{sx(t):.1f}" y="{h - mb + 15}" text-anchor="middle" class="tick">{_e(_fmt_tick(t))}</text>'
        )
    parts.append(f'<text x="{(ml + w - mr) / 2}" y="{h - 4}" text-anchor="middle" class="axis">step</text>')
    parts.append(f'<line x1="{ml}" x2="{w - mr}" y1="{h - mb}" y2="{h - mb}" class="axisline"/>')
    for name, s in series.items():
        segs: list[list[tuple[float, float]]] = [[]]
        for x, y in s:
            if y is None:
                segs.append([])
            else:
                segs[-1].append((sx(x), sy(y)))
        color = colors.get(name, "#111827")
        for seg in segs:
            if len(seg) >= 2:
                d = " ".join(f"{px:.1f},{py:.1f}" for px, py in seg)
                parts.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="1.8"/>')
            elif len(seg) == 1:
                parts.append(f'<circle cx="{seg[0][0]:.1f}" cy="{seg[0][1]:.1f}" r="2.5" fill="{color}"/>')
    parts.append("</svg>")
    return "".join(parts)


def svg_interval_chart(
    rows: list[tuple[str, float, float, float, str]], *, title: str, zero_line: bool, pct_axis: bool
) -> str:
    """Dot-and-whisker chart: rows of (label, value, lo, hi, color)."""
    w = 1000
    ml, mr, mt, row_h = 220, 24, 30, 26
    h = mt + row_h * max(1, len(rows)) + 34
    if not rows:
        return ""
    lo = min(min(r[2] for r in rows), 0.0 if zero_line else min(r[2] for r in rows))
    hi = max(max(r[3] for r in rows), 0.0 if zero_line else max(r[3] for r in rows))
    if pct_axis and not zero_line:
        lo, hi = max(0.0, lo - 0.05), min(1.0, hi + 0.05)
    ticks = _nice_ticks(lo, hi, 6)
    x0, x1 = ticks[0], ticks[-1]

    def sx(x: float) -> float:
        return ml + (x - x0) / ((x1 - x0) or 1) * (w - ml - mr)

    parts = [
        f'<svg class="chart wide" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{_e(title)}">',
        f'<text x="8" y="18" class="ct">{_e(title)}</text>',
    ]
    bottom = mt + row_h * len(rows)
    for i in range(0, len(rows), 2):
        parts.append(f'<rect x="0" y="{mt + row_h * i}" width="{w}" height="{row_h}" class="band"/>')
    for t in ticks:
        parts.append(f'<line x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{mt}" y2="{bottom}" class="grid"/>')
        label = _fmt_tick(t, 100, "%" if not zero_line else " pp") if pct_axis else _fmt_tick(t)
        parts.append(
            f'<text x="{sx(t):.1f}" y="{bottom + 16}" text-anchor="middle" class="tick">{_e(label)}</text>'
        )
    if zero_line and x0 <= 0 <= x1:
        parts.append(f'<line x1="{sx(0):.1f}" x2="{sx(0):.1f}" y1="{mt - 4}" y2="{bottom}" class="zero"/>')
    for i, (label, v, lo_, hi_, color) in enumerate(rows):
        cy = mt + row_h * i + row_h / 2
        parts.append(f'<text x="{ml - 10}" y="{cy + 4:.1f}" text-anchor="end" class="lab">{_e(label)}</text>')
        parts.append(
            f'<line x1="{sx(lo_):.1f}" x2="{sx(hi_):.1f}" y1="{cy:.1f}" y2="{cy:.1f}" stroke="{color}" stroke-width="2.5"/>'
        )
        for xv in (lo_, hi_):
            parts.append(
                f'<line x1="{sx(xv):.1f}" x2="{sx(xv):.1f}" y1="{cy - 5:.1f}" y2="{cy + 5:.1f}" stroke="{color}" stroke-width="2"/>'
            )
        parts.append(
            f'<circle cx="{sx(v):.1f}" cy="{cy:.1f}" r="5" fill="{color}" stroke="#fff" stroke-width="1.5"/>'
        )
    parts.append("</svg>")
    return "".join(parts)


def svg_status_bars(arms: list[dict]) -> str:
    rows = [a for a in arms if a.get("status_counts")]
    if not rows:
        return ""
    statuses = [s for s in STATUS_ORDER if any(s in a["status_counts"] for a in rows)]
    statuses += sorted({s for a in rows for s in a["status_counts"]} - set(statuses))
    w, ml, mr, row_h, mt = 1000, 220, 24, 24, 34
    h = mt + row_h * len(rows) + 8
    parts = [
        f'<svg class="chart wide" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="status breakdown">'
    ]
    lx = 8
    for s in statuses:
        color = STATUS_COLORS.get(s, "#64748b")
        parts.append(f'<rect x="{lx}" y="8" width="11" height="11" rx="2" fill="{color}"/>')
        parts.append(f'<text x="{lx + 15}" y="18" class="tick">{_e(s)}</text>')
        lx += 24 + 7 * len(s)
    for i, a in enumerate(rows):
        total = sum(a["status_counts"].values()) or 1
        cy = mt + row_h * i
        parts.append(
            f'<text x="{ml - 10}" y="{cy + row_h / 2 + 4:.1f}" text-anchor="end" class="lab">{_e(a["name"])}</text>'
        )
        x = float(ml)
        for s in statuses:
            c = a["status_counts"].get(s, 0)
            if not c:
                continue
            bw = c / total * (w - ml - mr)
            parts.append(
                f'<rect x="{x:.1f}" y="{cy + 3}" width="{bw:.1f}" height="{row_h - 6}" fill="{STATUS_COLORS.get(s, "#64748b")}">'
                f"<title>{_e(a['name'])}: {_e(s)} {c}</title></rect>"
            )
            if bw > 26:
                parts.append(
                    f'<text x="{x + bw / 2:.1f}" y="{cy + row_h / 2 + 4:.1f}" text-anchor="middle" class="barlab">{c}</text>'
                )
            x += bw
    parts.append("</svg>")
    return "".join(parts)


# ---------------------------------------------------------------------------------------------------------
# HTML

CSS = """
:root{--fg:#111827;--muted:#6b7280;--line:#e5e7eb;--bg:#f8fafc;--card:#fff;--ok:#15803d;--bad:#b91c1c}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.5 -apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1120px;margin:0 auto;padding:28px 24px 60px}
h1{font-size:24px;margin:0 0 4px}
h2{font-size:17px;margin:0 0 12px;padding-bottom:6px;border-bottom:1px solid var(--line)}
h3{font-size:14px;margin:16px 0 8px}
.sub{color:var(--muted);margin:0 0 18px}
section{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:18px 20px;margin:0 0 18px}
.verdict{border-width:2px}
.verdict.ok{border-color:var(--ok);background:#f0fdf4}
.verdict.no{border-color:var(--bad);background:#fef2f2}
.badge{display:inline-block;font-weight:700;letter-spacing:.04em;padding:4px 12px;border-radius:999px;color:#fff;font-size:15px}
.ok .badge{background:var(--ok)} .no .badge{background:var(--bad)}
.verdict p{margin:10px 0 6px}
.verdict ul{margin:6px 0 0;padding-left:20px}
.verdict li{margin:3px 0}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{padding:6px 9px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{background:#f3f4f6;font-weight:600;vertical-align:bottom}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
td.n{white-space:nowrap}
tbody tr:nth-child(even){background:#fafafa}
.pass{color:var(--ok);font-weight:600}.fail{color:var(--bad);font-weight:600}
.muted{color:var(--muted);fill:var(--muted)}
.note{color:var(--muted);font-size:12.5px;margin:8px 0 0}
.warn{color:#92400e;background:#fffbeb;border:1px solid #fde68a;border-radius:6px;padding:6px 10px;margin:8px 0}
.swatch{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px;vertical-align:middle}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
.grid2{display:flex;flex-wrap:wrap;gap:10px}
.chart{background:#fff;max-width:100%;height:auto}
.chart.wide{width:100%}
.chart .ct{font-size:12.5px;font-weight:600;fill:var(--fg)}
.chart .tick{font-size:10.5px;fill:var(--muted)}
.chart .axis{font-size:10.5px;fill:var(--muted)}
.chart .lab{font-size:12px;fill:var(--fg)}
.chart .barlab{font-size:10.5px;fill:#fff;font-weight:600}
.chart .grid{stroke:#eef0f3;stroke-width:1}
.chart .axisline{stroke:#9ca3af;stroke-width:1}
.chart .zero{stroke:#111827;stroke-width:1.2;stroke-dasharray:4 3}
.chart .band{fill:#f9fafb}
.legend{margin:4px 0 10px;font-size:12.5px}.legend span{margin-right:16px}
.ex{border:1px solid var(--line);border-radius:8px;padding:8px 12px;margin:8px 0;background:#fcfcfd}
.ex pre{white-space:pre-wrap;word-break:break-word;margin:4px 0;background:#f3f4f6;padding:6px 8px;border-radius:5px}
a{color:#1d4ed8}
.scroll{overflow-x:auto}
"""


def _table(headers: list[str], rows: list[list[str]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    th = "".join(
        f'<th class="n">{h}</th>' if i in numeric else f"<th>{h}</th>" for i, h in enumerate(headers)
    )
    body = []
    for r in rows:
        body.append(
            "<tr>"
            + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(r))
            + "</tr>"
        )
    return (
        f'<div class="scroll"><table><thead><tr>{th}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'
    )


def _arm_label(arm: dict, colors: dict) -> str:
    return f'<span class="swatch" style="background:{colors[arm["name"]]}"></span>{_e(arm["name"])}'


def _question_of(traj: dict) -> str | None:
    for key in ("question",):
        if isinstance(traj.get(key), str):
            return traj[key]
    for key in ("task", "public"):
        sub = traj.get(key)
        if isinstance(sub, dict) and isinstance(sub.get("question"), str):
            return sub["question"]
    return None


def _examples_html(analysis: dict, row: dict, limit: int = 4) -> str:
    exp: Experiment = analysis["_exp"]
    ra = {str(r.get("task_id")): r for r in exp.results(row["a"]) or []}
    rb = {str(r.get("task_id")): r for r in exp.results(row["b"]) or []}
    qs = {}
    for t in exp.trajectories(row["b"]) or []:
        if isinstance(t, dict) and "task_id" in t:
            q = _question_of(t)
            if q:
                qs[str(t["task_id"])] = q
    gains = [
        t for t in sorted(set(ra) & set(rb)) if ra[t].get("correct") is False and rb[t].get("correct") is True
    ]
    losses = [
        t for t in sorted(set(ra) & set(rb)) if ra[t].get("correct") is True and rb[t].get("correct") is False
    ]
    out = []
    for title, ids in (
        (f"{row['b']} right, {row['a']} wrong", gains),
        (f"{row['a']} right, {row['b']} wrong", losses),
    ):
        shown = f"first {min(limit, len(ids))} shown" if ids else "none"
        out.append(f"<h3>{_e(title)}: {len(ids)} tasks ({shown})</h3>")
        for t in ids[:limit]:
            out.append(
                '<div class="ex">'
                f"<div><b class=mono>{_e(t)}</b> <span class=muted>db {_e(rb[t].get('db_id'))}</span></div>"
                + (f"<div>{_e(qs[t])}</div>" if t in qs else "")
                + f"<div class=muted>{_e(row['a'])} ({_e(ra[t].get('status'))}):</div><pre>{_e(ra[t].get('final_sql') or '(no SQL)')}</pre>"
                f"<div class=muted>{_e(row['b'])} ({_e(rb[t].get('status'))}):</div><pre>{_e(rb[t].get('final_sql') or '(no SQL)')}</pre>"
                "</div>"
            )
    return "".join(out)


def render_html(analysis: dict, links: dict[str, dict[str, str]]) -> str:
    v = analysis["verdict"]
    e = analysis["experiment"]
    colors = analysis["colors"]
    arms = analysis["arms"]
    params = analysis["params"]
    level = int(round(100 * params["ci"]))
    flags = [f for f, on in e["flags"].items() if on]
    out = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        f"<title>sqlrl report: {_e(e['name'])}</title><style>{CSS}</style></head><body><main>",
        f"<h1>sqlrl report: {_e(e['name'])}</h1>",
        f'<p class="sub">experiment folder <code>{_e(e["dir"])}</code> · split {_e(e.get("split") or "-")} · '
        f"dataset fingerprint <code>{_e(_short(e.get('fingerprint'), 16))}</code>"
        + (f" · <b>{_e(', '.join(flags))}</b>" if flags else "")
        + "</p>",
    ]
    # Verdict
    if v.claim_allowed:
        out.append(
            '<section class="verdict ok" id="verdict"><span class="badge">CLAIM ALLOWED</span>'
            "<p>Every evidence check passed: the comparisons below may be stated as a learning result "
            "(with their confidence intervals).</p>"
        )
    else:
        out.append(
            '<section class="verdict no" id="verdict"><span class="badge">NO CLAIM</span>'
            "<p>The evidence gate did not pass. The numbers below describe this folder but are <b>not</b> a "
            f"learning result. Missing ({len(v.missing)}):</p><ul>"
            + "".join(f"<li>{_e(m)}</li>" for m in v.missing)
            + "</ul>"
        )
    rows = [
        [
            f"<code>{_e(c.name)}</code>",
            '<span class="pass">✓ pass</span>' if c.passed else '<span class="fail">✗ fail</span>',
            _e(c.detail),
        ]
        for c in v.checks
    ]
    out.append("<h3>Evidence checks</h3>" + _table(["check", "result", "detail"], rows) + "</section>")

    # Accuracy
    acc_rows = []
    for arm in arms:
        ts = arm.get("test_suite")
        excl = arm.get("excluded") or {}
        acc_rows.append(
            [
                _arm_label(arm, colors),
                _e(arm["kind"]),
                _e(arm["turns"]),
                _e(_acc_ci(arm)),
                _e(_pct(ts["value"])) if ts else "-",
                _e(_pct(arm.get("executable_rate"))),
                _e(arm.get("n", "-")),
                _e(", ".join(f"{k} {c}" for k, c in excl.items()) or "0"),
            ]
        )
    out.append(
        '<section id="accuracy"><h2>Accuracy per arm</h2>'
        + _table(
            [
                "arm",
                "kind",
                "turns",
                f"execution match ({level}% CI)",
                "test-suite match",
                "executable",
                "n scored",
                "excluded",
            ],
            acc_rows,
            {3, 4, 5, 6},
        )
    )
    chart_rows = [
        (
            a["name"],
            a["accuracy"]["value"],
            a["accuracy"]["ci_low"],
            a["accuracy"]["ci_high"],
            colors[a["name"]],
        )
        for a in arms
        if a.get("accuracy")
    ]
    out.append(
        svg_interval_chart(
            chart_rows, title=f"Execution match, {level}% bootstrap CI", zero_line=False, pct_axis=True
        )
    )
    notes = [f"{a['name']}: {n}" for a in arms for n in a["notes"]]
    out += [f'<div class="warn">{_e(n)}</div>' for n in notes]
    out.append(
        f'<p class="note">Execution match over scored tasks (tasks with an unscorable gold or an infrastructure '
        f"failure are excluded and counted). Percentile bootstrap, {params['n_boot']} resamples, seed {params['seed']}. "
        "Test-suite match is the literature metric, where recorded.</p></section>"
    )

    # Paired comparisons
    cmp_rows, forest = [], []
    for row in analysis["comparisons"]:
        label = f"{row['b']} vs {row['a']}"
        flag = ' <span class="muted">(different turns)</span>' if row.get("turns_differ") else ""
        if row.get("available"):
            cmp_rows.append(
                [
                    _e(label) + flag,
                    _e(row["n"]),
                    _e(_pct(row["mean_a"])),
                    _e(_pct(row["mean_b"])),
                    f"<b>{_e(_pp(row['diff']))}</b>",
                    _e(f"{100 * row['ci_low']:+.1f} to {100 * row['ci_high']:+.1f}"),
                    _e(row["b_only"]),
                    _e(row["a_only"]),
                    _e(_fmt_p(row["p_value"])),
                    _e(row["dropped_excluded"]),
                ]
            )
            forest.append((label, row["diff"], row["ci_low"], row["ci_high"], colors[row["b"]]))
        else:
            cmp_rows.append([_e(label) + flag] + ["-"] * 8 + [_e(row.get("reason", ""))])
    out.append(
        '<section id="paired"><h2>Paired differences</h2>'
        + _table(
            [
                "comparison (b vs a)",
                "n pairs",
                "acc a",
                "acc b",
                "Δ = b − a",
                f"{level}% CI",
                "b right, a wrong",
                "a right, b wrong",
                "McNemar exact p",
                "dropped (excluded)",
            ],
            cmp_rows,
            set(range(1, 10)),
        )
        + svg_interval_chart(
            forest,
            title=f"Paired difference in execution match, {level}% bootstrap CI",
            zero_line=True,
            pct_axis=True,
        )
        + '<p class="note">Pairs are tasks scored in both arms, matched by task id; a task excluded in either arm is '
        "dropped from that pair (counted in the last column). The bootstrap resamples tasks jointly for both arms. "
        "p-values are not corrected for multiple comparisons.</p></section>"
    )

    # Repair decomposition
    rep = [
        r for r in analysis["comparisons"] if r.get("available") and r["a"] == analysis["base_of"].get(r["b"])
    ]
    if rep:
        rep_rows = []
        for r in rep:
            d = r["repair"]
            rep_rows.append(
                [
                    _e(r["b"]),
                    f"<b>{_e(_pp(d['delta']))}</b>",
                    _e(_pp(d["repair_part"])),
                    _e(_pp(d["answer_part"])),
                    _e(d["repair_gains"]),
                    _e(d["breakages"]),
                    _e(d["answer_gains"]),
                    _e(d["answer_losses"]),
                    _e(d["became_executable"]),
                    _e(d["became_nonexecutable"]),
                ]
            )
        out.append(
            '<section id="repair"><h2>Where the change comes from: format/validity repair vs answers</h2>'
            '<p class="note" style="margin-top:0">Over the paired tasks, each scored outcome is one of <b>match</b>, '
            "<b>mismatch</b> (executed, wrong answer) or <b>non-executable</b> (no_sql, exec_error, timeout). "
            "Δ vs base = <b>repair part</b> + <b>answer part</b>, where repair part = (non-executable→match − "
            "match→non-executable)/n and answer part = (mismatch→match − match→mismatch)/n. A gain that is mostly "
            "repair means the arm learned to emit runnable SQL more than it learned to answer better.</p>"
            + _table(
                [
                    "arm vs its base",
                    "Δ",
                    "repair part",
                    "answer part",
                    "non-exec→match",
                    "match→non-exec",
                    "mismatch→match",
                    "match→mismatch",
                    "became executable",
                    "became non-executable",
                ],
                rep_rows,
                set(range(1, 10)),
            )
        )
        g = next((r for r in rep if analysis["_exp"].arms[r["b"]].kind == "grpo"), None)
        if g is not None:
            groups = ("match", "mismatch", NONEXEC)
            t = g["repair"]["transitions"]
            trows = [[f"<b>{_e(ga)}</b>"] + [_e(t[ga][gb]) for gb in groups] for ga in groups]
            out.append(
                f"<h3>Transitions {_e(g['a'])} (rows) → {_e(g['b'])} (columns)</h3>"
                + _table([f"{_e(g['a'])} \\ {_e(g['b'])}", *groups], trows, {1, 2, 3})
            )
        out.append("</section>")

    # Turn use (multi-turn arms)
    tu = turn_use_rows(analysis)
    if tu:
        out.append(
            '<section id="turn-use"><h2>Turn use (multi-turn arms)</h2>'
            f'<p class="note" style="margin-top:0">{_e(TURN_USE_NOTE)}</p>'
            + _table(
                list(map(_e, TURN_USE_HEADERS)),
                [[_e(c) for c in r] for r in tu],
                set(range(1, len(TURN_USE_HEADERS))),
            )
            + "</section>"
        )

    # Training curves
    curves = analysis["curves"]
    if curves:
        legend = "".join(
            f'<span><span class="swatch" style="background:{colors[a]}"></span>{_e(a)}</span>' for a in curves
        )
        charts = []
        for key, title in CURVE_METRICS:
            series = {
                a: [(float(s.get("step", i + 1)), _num(s.get(key))) for i, s in enumerate(st)]
                for a, st in curves.items()
            }
            charts.append(svg_line_chart(title, series, colors))
        out.append(
            f'<section id="training"><h2>Training curves</h2><div class="legend">{legend}</div>'
            f'<div class="grid2">{"".join(charts)}</div>'
            '<p class="note">From each trained arm\'s train/steps.jsonl, one point per optimizer step.</p></section>'
        )

    # Status breakdown
    statuses = [s for s in STATUS_ORDER if any(s in (a.get("status_counts") or {}) for a in arms)]
    statuses += sorted({s for a in arms for s in (a.get("status_counts") or {})} - set(statuses))
    srows = [
        [_arm_label(a, colors)]
        + [_e((a.get("status_counts") or {}).get(s, 0)) for s in statuses]
        + [_e(a.get("n_total", "-"))]
        for a in arms
    ]
    out.append(
        '<section id="status"><h2>Outcome status per arm</h2>'
        + svg_status_bars(arms)
        + _table(["arm", *map(_e, statuses), "total"], srows, set(range(1, len(statuses) + 2)))
        + "</section>"
    )

    # Per database
    dbs = sorted({d for a in arms for d in (a.get("per_db") or {})})
    if dbs:
        drows = []
        for d in dbs:
            cells = [f"<code>{_e(d)}</code>"]
            for a in arms:
                c = (a.get("per_db") or {}).get(d)
                cells.append(
                    f"{_e(_pct(c[0] / c[1], 0))} <span class=muted>({c[0]}/{c[1]})</span>" if c else "-"
                )
            drows.append(cells)
        out.append(
            '<section id="per-db"><h2>Accuracy per database</h2>'
            + _table(["database", *[_e(a["name"]) for a in arms]], drows, set(range(1, len(arms) + 1)))
            + "</section>"
        )

    # Examples
    main_cmp = None
    if analysis["base"]:
        exp: Experiment = analysis["_exp"]
        g = exp.primary("grpo")
        main_cmp = _find_cmp(analysis, analysis["base"], g.name) if g else None
    if main_cmp and main_cmp.get("available"):
        out.append(
            f'<section id="examples"><h2>Tasks that changed: {_e(main_cmp["b"])} vs {_e(main_cmp["a"])}</h2>'
            + _examples_html(analysis, main_cmp)
            + "</section>"
        )

    # Provenance
    prow = []
    for a in arms:
        t = a.get("train") or {}
        lk = links.get(a["name"], {})
        files = " · ".join(f'<a href="{_e(quote(p))}">{_e(k)}</a>' for k, p in lk.items()) or "-"
        prow.append(
            [
                _arm_label(a, colors),
                f"<code>{_e(_short((a['model'] or {}).get('identity'), 16))}</code><br><span class=muted>{_e((a['model'] or {}).get('name', '-'))}</span>",
                _e(_machine_str(a["machine"])),
                _e(_machine_str(t.get("machine"))) if t else "-",
                f"<code>{_e(_short(a['fingerprint'], 16))}</code>",
                f"<span class=mono>{_e(_budgets_str(a['budgets']))}</span>",
                _e(_gpu_str(a)),
                _e(t.get("steps") if t.get("steps") is not None else "-"),
                files,
            ]
        )
    out.append(
        '<section id="provenance"><h2>Provenance: which model, machine and budget produced each number</h2>'
        + _table(
            [
                "arm",
                "model identity (weights hash)",
                "eval machine",
                "train machine",
                "fingerprint",
                "budgets",
                "GPU min",
                "steps",
                "raw files",
            ],
            prow,
            {6, 7},
        )
        + '<p class="note">Model identity and machine as recorded in each eval run\'s summary.json / run.json. '
        "GPU minutes from train run.json, or (marked ~) the sum of step times. Links are relative to this report.</p></section>"
    )
    out.append(
        f'<p class="note">Generated by <code>sqlrl report</code>. Bootstrap: {params["n_boot"]} resamples, seed '
        f"{params['seed']}, {level}% percentile intervals.</p></main></body></html>"
    )
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------------
# Entry points


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
    exp_dir: str | Path, out_dir: str | Path | None = None, *, n_boot: int = 10000, seed: int = 0
) -> dict:
    """Write verdict.json, report.md, report.html; return {"verdict", "markdown", "html"} paths + "claim_allowed"."""
    analysis = analyze(exp_dir, n_boot=n_boot, seed=seed)
    exp: Experiment = analysis["_exp"]
    out = Path(out_dir) if out_dir is not None else exp.dir
    out.mkdir(parents=True, exist_ok=True)
    links = _links(exp, out)
    paths = {"verdict": out / "verdict.json", "markdown": out / "report.md", "html": out / "report.html"}
    write_json_atomic(paths["verdict"], analysis["verdict"].to_dict())
    write_bytes_atomic(paths["markdown"], render_markdown(analysis, links).encode("utf-8"))
    write_bytes_atomic(paths["html"], render_html(analysis, links).encode("utf-8"))
    return {**paths, "claim_allowed": analysis["verdict"].claim_allowed}
