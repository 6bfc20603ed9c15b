"""Analysis behind `sqlrl report`: everything the report shows, as plain data (`analyze`).

Numbers are recomputed from the raw per-task files, never copied from summaries:
- accuracy per arm: mean of `evaluation.outcome.outcome` over the scored results.jsonl records (`correct`
  a JSON boolean and a status that is not an excluded one; the rest counted apart as excluded), percentile bootstrap CI (`stats.accuracy_ci`); a summary.json that disagrees
  becomes a note.
- paired comparisons (`compare_arms`): tasks scored in both arms, by task_id; diff = mean(b) - mean(a),
  paired bootstrap and exact McNemar. Every non-base arm is compared with the base arm of its cell (turns
  and context length), every GRPO arm with the controls of its cell; without one, the primary arm is used,
  flagged "different turns" or "different context".
- repair decomposition: scored outcomes grouped as match, mismatch, non-executable; Δ = (repair gains -
  breakages)/n + (answer gains - answer losses)/n exactly (non-executable -> match, match ->
  non-executable, mismatch -> match, match -> mismatch).
- turn use (arms with more than one turn): `evaluation.turnuse.turn_use` over results.jsonl and
  trajectories.jsonl (the definition the evaluation's summary.json uses). Descriptive counts only.
- GPU minutes: train run.json `gpu_minutes`, else the sum of steps.jsonl `time_step_s` / 60 ("steps").
- accuracy by Spider hardness, learning curves (curve.jsonl), self-consistency: `breakdown.breakdown`.

What is covered: deterministic output for a given folder and (n_boot, seed, ci).
What is not: percentile intervals may under-cover (see stats.py); no correction for multiple
comparisons; provenance (machine, model identity) is taken from run.json/summary.json as recorded.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sqlrl.evaluation.errorkinds import exec_error_kinds
from sqlrl.evaluation.outcome import outcome, scored_rows
from sqlrl.evaluation.turnuse import turn_use
from sqlrl.evidence.breakdown import breakdown
from sqlrl.evidence.difficulty import difficulty_breakdown
from sqlrl.evidence.fmt import fmt_p
from sqlrl.evidence.gate import evidence_gate
from sqlrl.evidence.rundir import GRPO_KINDS, Experiment

NONEXEC = "non-executable"

ARM_COLORS = ["#6b7280", "#2563eb", "#d97706", "#7c3aed", "#0d9488", "#db2777", "#65a30d", "#0891b2"]
KIND_COLOR = {"base": "#6b7280", "grpo": "#2563eb", "no_update": "#d97706", "validity": "#7c3aed"}


def num(x: Any) -> float | None:
    """`x` as a float when it is a finite int or float (not a bool), else None."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def _obj(*values: Any) -> dict:
    """The first of `values` that is a non-empty JSON object, else {} (a recorded `model` or `machine`
    that is a string or a list is not shown)."""
    return next((v for v in values if isinstance(v, dict) and v), {})


def paired_outcomes(results_a: list[dict], results_b: list[dict]) -> dict:
    """Pair two arms' results by task_id (sorted); drop tasks not scored in either arm (`outcome` None).

    Returns {task_ids, a, b (lists of 0/1), status_a, status_b, dropped_excluded, unpaired}.
    """
    ra = {str(r.get("task_id")): r for r in results_a}
    rb = {str(r.get("task_id")): r for r in results_b}
    common = sorted(set(ra) & set(rb))
    out: dict[str, Any] = {"task_ids": [], "a": [], "b": [], "status_a": [], "status_b": []}
    dropped = 0
    for t in common:
        ca, cb = outcome(ra[t]), outcome(rb[t])
        if ca is None or cb is None:
            dropped += 1
            continue
        out["task_ids"].append(t)
        out["a"].append(ca)
        out["b"].append(cb)
        out["status_a"].append(str(ra[t].get("status")))
        out["status_b"].append(str(rb[t].get("status")))
    out["dropped_excluded"] = dropped
    out["unpaired"] = len(set(ra) ^ set(rb))
    return out


def compare_arms(
    exp: Experiment, a: str, b: str, *, n_boot: int = 10000, seed: int = 0, ci: float = 0.95
) -> dict:
    """Paired comparison of arm b against arm a (diff = acc(b) - acc(a)) on tasks scored in both."""
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
    row.update(available=True, **paired_statistics(p, n_boot=n_boot, seed=seed, ci=ci))
    return row


def paired_statistics(p: dict, *, n_boot: int = 10000, seed: int = 0, ci: float = 0.95) -> dict:
    """The paired numbers of `paired_outcomes` p (b against a): diff with its bootstrap CI, the means, the
    exact McNemar p, the discordant counts (b_only: a wrong, b right) and the repair decomposition."""
    from sqlrl.evidence import stats

    boot = stats.paired_bootstrap(p["a"], p["b"], n_boot=n_boot, seed=seed, ci=ci)
    mc = stats.mcnemar_exact(p["a"], p["b"])
    return {
        "diff": boot["diff"],
        "ci_low": boot["ci_low"],
        "ci_high": boot["ci_high"],
        "mean_a": boot.get("mean_a", sum(p["a"]) / len(p["a"])),
        "mean_b": boot.get("mean_b", sum(p["b"]) / len(p["b"])),
        "p_value": mc.get("p_value", mc.get("p")),
        "b_only": mc["n01"],  # a wrong, b right
        "a_only": mc["n10"],  # a right, b wrong
        "bootstrap": boot,
        "mcnemar": mc,
        "repair": repair_decomposition(p),
    }


def _group(status: str, correct: int) -> str:
    if correct:
        return "match"
    return "mismatch" if status == "mismatch" else NONEXEC


def repair_decomposition(p: dict) -> dict:
    """Split the paired change into execution repair (non-executable -> match) vs answer change (see
    module docstring)."""
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


def _gpu_minutes(exp: Experiment, arm: str) -> tuple[float | None, str]:
    run = exp.train_run(arm)
    if isinstance(run, dict) and num(run.get("gpu_minutes")) is not None:
        return float(run["gpu_minutes"]), "run.json"
    steps = exp.steps(arm)
    if steps:
        t = [num(s.get("time_step_s")) for s in steps]
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
        "context_tokens": arm.context_tokens,
        "budgets": arm.budgets,
        "trained": arm.train_dir is not None,
        "has_results": results is not None,
        "fingerprint": exp.fingerprint(name),
        "split": summary.get("split") or run.get("split"),
        "model": _obj(summary.get("model"), run.get("model")),
        "machine": _obj(summary.get("machine"), run.get("machine")),
        "elapsed_s": num(summary.get("elapsed_s")),
        "notes": [],
    }
    if results is not None:
        ordered = sorted(results, key=lambda r: str(r.get("task_id")))
        scored = scored_rows(ordered)
        excluded: dict[str, int] = {}
        for r in ordered:
            if outcome(r) is None:
                excluded[str(r.get("status"))] = excluded.get(str(r.get("status")), 0) + 1
        status_counts: dict[str, int] = {}
        for r in ordered:
            status_counts[str(r.get("status"))] = status_counts.get(str(r.get("status")), 0) + 1
        info.update(n_total=len(ordered), n=len(scored), excluded=excluded, status_counts=status_counts)
        info["exec_error_kinds"] = exec_error_kinds(scored, lambda: exp.trajectories(name) or [])
        if scored:
            acc = stats.accuracy_ci([outcome(r) for r in scored], n_boot=n_boot, seed=seed, ci=ci)
            info["accuracy"] = {"value": acc["accuracy"], "ci_low": acc["ci_low"], "ci_high": acc["ci_high"]}
            ts = [x for x in (outcome(r, "test_suite_correct") for r in scored) if x is not None]
            info["test_suite"] = {"value": sum(ts) / len(ts), "n": len(ts)} if ts else None
            ex = num(summary.get("executable_rate"))
            if ex is None:
                ex = sum(r.get("status") in ("match", "mismatch") for r in scored) / len(scored)
            info["executable_rate"] = ex
            s_acc = num(summary.get("execution_match"))
            if s_acc is not None and abs(s_acc - acc["accuracy"]) > 1e-9:
                info["notes"].append(
                    f"summary.json execution_match={s_acc:.4f} disagrees with results.jsonl ({acc['accuracy']:.4f})"
                )
        per_db: dict[str, list[int]] = {}
        for r in scored:
            d = per_db.setdefault(str(r.get("db_id")), [0, 0])
            d[0] += outcome(r)
            d[1] += 1
        info["per_db"] = per_db
        info["turn_use"] = turn_use(results, exp.trajectories(name)) if (arm.turns or 1) > 1 else None
        if info["turn_use"] is not None:  # the evaluation's own figures (summary.json), when it has them
            info["turn_use"]["eval"] = _obj(summary.get("turn_use")) or None
    train_run = exp.train_run(name) if arm.train_dir is not None else None
    steps = exp.steps(name) if arm.train_dir is not None else None
    gm, gsrc = _gpu_minutes(exp, name) if arm.train_dir is not None else (None, "")
    info["train"] = (
        {
            "steps": len(steps) if steps is not None else None,
            "gpu_minutes": gm,
            "gpu_minutes_source": gsrc,
            "machine": _obj((train_run or {}).get("machine")),
            "device": (train_run or {}).get("device"),
            "model": _obj((train_run or {}).get("model")),
        }
        if arm.train_dir is not None
        else None
    )
    return info


def _comparison_pairs(exp: Experiment) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """(a, b) arm pairs to compare, and each non-base arm's base: every non-base arm vs the base arm with
    the same cell (else the primary base, flagged), every GRPO arm (grpo, grpo_checker) vs the control
    arms of the same cell (else all controls of that kind, flagged), grpo_checker vs the grpo arm of its
    cell, and every RL arm (grpo*) vs the sft arms."""
    base = exp.primary("base")
    pairs: list[tuple[str, str]] = []
    base_of: dict[str, str] = {}
    for arm in exp.arms.values():
        if arm.kind == "base":
            continue
        b = exp.base_for(arm) or base
        if b is not None:
            base_of[arm.name] = b.name
            pairs.append((b.name, arm.name))
    for g in exp.grpo_arms():
        for kind in ("no_update", "validity"):
            for c in exp.same_cell(g, kind) or exp.arms_of(kind):
                if (c.name, g.name) not in pairs:
                    pairs.append((c.name, g.name))
    for g in exp.arms_of("grpo_checker"):  # the checker turn's effect: the same training without it
        for c in exp.same_cell(g, "grpo"):
            if (c.name, g.name) not in pairs:
                pairs.append((c.name, g.name))
    for g in [a for a in exp.arms.values() if a.kind.startswith("grpo")]:  # RL vs the SFT-only control
        for c in exp.same_cell(g, "sft") or exp.arms_of("sft"):
            if (c.name, g.name) not in pairs:
                pairs.append((c.name, g.name))
    return pairs, base_of


def _arm_colors(exp: Experiment) -> dict[str, str]:
    """The primary arm of each kind gets its kind's colour; every other arm the next spare one."""
    colors = {}
    for a in exp.arms:
        kind_default = KIND_COLOR.get(exp.arms[a].kind)
        colors[a] = kind_default if kind_default and exp.primary(exp.arms[a].kind).name == a else None
    spare = [c for c in ARM_COLORS if c not in colors.values()]
    for a in exp.arms:
        if colors[a] is None:
            colors[a] = spare.pop(0) if spare else "#111827"
    return colors


def analyze(
    exp_dir: str | Path | Experiment,
    *,
    n_boot: int = 10000,
    seed: int = 0,
    ci: float = 0.95,
    data: str | Path | None = None,
) -> dict:
    """Everything the report shows, as plain data. `data`: the Spider folder whose golds give the hardness
    classes (default: the one each eval run.json records). Raises rundir.ExperimentError for a
    non-experiment folder."""
    exp = exp_dir if isinstance(exp_dir, Experiment) else Experiment(exp_dir)
    verdict = evidence_gate(exp)
    arms = [_arm_info(exp, a, n_boot=n_boot, seed=seed, ci=ci) for a in exp.arms]
    base = exp.primary("base")
    pairs, base_of = _comparison_pairs(exp)
    comparisons = []
    for a, b in pairs:
        row = compare_arms(exp, a, b, n_boot=n_boot, seed=seed, ci=ci)
        row["turns_differ"] = exp.arms[a].turns != exp.arms[b].turns
        row["context_differs"] = exp.arms[a].context_tokens != exp.arms[b].context_tokens
        comparisons.append(row)
    curves = {a: exp.steps(a) or [] for a in exp.arms if exp.arms[a].train_dir is not None and exp.steps(a)}
    colors = _arm_colors(exp)
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
        "breakdown": {
            **breakdown(exp, base_of, data=data, n_boot=n_boot, seed=seed, ci=ci),
            "difficulty": difficulty_breakdown(exp, base_of, n_boot=n_boot, seed=seed, ci=ci),
        },
        "_exp": exp,
    }


def has_context_axis(analysis: dict) -> bool:
    """Whether any arm ran in a cell of the `experiment.context_tokens` axis (the tables then show it)."""
    return any(arm.get("context_tokens") is not None for arm in analysis["arms"])


def cell_flag(row: dict) -> str:
    """The note on a comparison across cells: "(different turns)", "(different context)", both, or ""."""
    what = [
        w for w, on in (("turns", row.get("turns_differ")), ("context", row.get("context_differs"))) if on
    ]
    return f"(different {' and '.join(what)})" if what else ""


def find_comparison(analysis: dict, a: str, b: str) -> dict | None:
    """The comparison row of arm b against arm a, or None."""
    for row in analysis["comparisons"]:
        if row["a"] == a and row["b"] == b:
            return row
    return None


def _reading(r: dict, better: str, worse: str) -> str:
    if not r.get("available"):
        return "not comparable: " + str(r.get("reason", ""))
    if r["p_value"] is not None and r["p_value"] < 0.01 and r["ci_low"] > 0:
        return f"{better} (p < 0.01)"
    if r["p_value"] is not None and r["p_value"] < 0.01 and r["ci_high"] < 0:
        return f"{worse} (p < 0.01)"
    return "no difference at p < 0.01"


def claim_lines(analysis: dict) -> list[str]:
    """What a passed gate lets one state, one line per comparison of a GRPO arm (kinds grpo, grpo_checker)
    with its base, No-update and validity-only arms: Δ, CI, McNemar p and the reading (better / worse /
    no difference at p < 0.01). A passed gate with no difference is a claim that GRPO did not help."""
    kinds = {a["name"]: a["kind"] for a in analysis["arms"]}
    return [
        f"{r['b']} vs {r['a']}: {r['diff'] * 100:+.1f} pp ({r['ci_low'] * 100:+.1f} to {r['ci_high'] * 100:+.1f}), "
        f"McNemar p {fmt_p(r['p_value'])}: {_reading(r, 'GRPO better', 'GRPO worse')}"
        if r.get("available")
        else f"{r['b']} vs {r['a']}: {_reading(r, '', '')}"
        for r in analysis["comparisons"]
        if kinds.get(r["b"]) in GRPO_KINDS and kinds.get(r["a"]) in ("base", "no_update", "validity")
    ]


def sft_comparisons(analysis: dict) -> list[dict]:
    """The comparisons of each RL arm (kind grpo*) against the SFT-only control, each with `reading`:
    RL better / SFT better (McNemar p < 0.01 and the CI on that side of 0) or no difference at p < 0.01."""
    kinds = {a["name"]: a["kind"] for a in analysis["arms"]}
    rows = []
    for r in analysis["comparisons"]:
        if kinds.get(r["a"]) != "sft" or not str(kinds.get(r["b"], "")).startswith("grpo"):
            continue
        rows.append({**r, "reading": _reading(r, "RL better than SFT", "SFT better than RL")})
    return rows


def base_comparisons(analysis: dict) -> list[dict]:
    """The available comparisons of each arm against its own base arm (the repair decomposition's rows)."""
    return [
        r for r in analysis["comparisons"] if r.get("available") and r["a"] == analysis["base_of"].get(r["b"])
    ]


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
    "after an error",
    "accuracy by turns used",
]


TURN_USE_NOTE = (
    "Over scored tasks. Revised after feedback: the final SQL differs from the first query proposed (with how "
    "many of those are correct). One query repeated: two or more queries, all identical. Many repeats and few "
    "FINAL replies mean the turns were spent re-running one query, not debugging. After an error: failed "
    "executions followed by a reply, how many of those replies were FINAL and how many wrote another query "
    "(summary.json turn_use; '-' for evaluations without it)."
)


def _eval_turn_use(ev: dict | None) -> tuple[str, str]:
    """The 'after an error' and 'accuracy by turns used' cells from summary.json's turn_use."""
    if not ev:
        return "-", "-"
    ae = ev.get("after_error") or {}
    err = f"{ae['n']}: FINAL {ae['final']}, rewritten {ae['rewritten']}" if ae.get("n") else "none"
    acc = ", ".join(
        f"{k}: {100 * c['accuracy']:.0f}% of {c['n']}" for k, c in (ev.get("accuracy_by_turns") or {}).items()
    )
    return err, acc or "-"


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
                *_eval_turn_use(u.get("eval")),
            ]
        )
    return rows
