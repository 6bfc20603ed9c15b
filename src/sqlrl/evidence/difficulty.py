"""BIRD's two metrics per arm and accuracy by BIRD difficulty, as data (`difficulty_breakdown`) and as
report sections (`difficulty_markdown`, `difficulty_html`).

- Per arm, from its results.jsonl: our execution match and BIRD's set match (`bird_correct`,
  `sqlrl.reward.bird`) over the scored tasks, each with its percentile bootstrap CI; per difficulty
  (simple / moderate / challenging, from the rows' `difficulty`, written by `sqlrl eval` on BIRD
  splits) n scored, both accuracies with CIs, and the excluded count.
- Paired vs base per difficulty (our metric): tasks scored in both arms, Δ, wins and losses.
- Shown only when some arm's results carry a difficulty (a BIRD split); Spider reports are unchanged.
What is not: nothing is re-executed; an arm evaluated before `bird_correct` existed shows "-" for it.
"""

from __future__ import annotations

from typing import Any

from sqlrl.evaluation.outcome import outcome
from sqlrl.evidence.breakdown import _paired_by_class
from sqlrl.evidence.fmt import arm_label, esc, html_table, md_cell, pct, pp
from sqlrl.evidence.rundir import Experiment
from sqlrl.tasks.bird import BIRD_DIFFICULTIES

__all__ = ["difficulty_breakdown", "difficulty_html", "difficulty_markdown"]

NOTE = (
    "Execution match (ours) and BIRD's official metric (set of result rows equal, as BIRD's "
    "evaluation.py) over the scored tasks, by BIRD's difficulty label of each question; percentile "
    "bootstrap CI in brackets. Paired Δ vs base uses our metric."
)


def _rate(xs: list[int], **kw: Any) -> dict:
    from sqlrl.evidence import stats

    row: dict[str, Any] = {"n": len(xs), "correct": sum(xs), "accuracy": None}
    if xs:
        ci = stats.accuracy_ci(xs, **kw)
        row.update(accuracy=ci["accuracy"], ci_low=ci["ci_low"], ci_high=ci["ci_high"])
    return row


def _arm(results: list[dict], **kw: Any) -> dict:
    ours: dict[str, list[int]] = {}
    bird: dict[str, list[int]] = {}
    excluded: dict[str, int] = {}
    all_bird: list[int] = []
    for r in results:
        cls = str(r.get("difficulty") or "unlabelled")
        if outcome(r) is None:
            excluded[cls] = excluded.get(cls, 0) + 1
            continue
        ours.setdefault(cls, []).append(outcome(r))
        if outcome(r, "bird_correct") is not None:
            bird.setdefault(cls, []).append(outcome(r, "bird_correct"))
            all_bird.append(outcome(r, "bird_correct"))
    classes = {}
    for cls in [*BIRD_DIFFICULTIES, *sorted(set(ours) | set(excluded) - set(BIRD_DIFFICULTIES))]:
        classes[cls] = {
            "ours": _rate(ours.get(cls, []), **kw),
            "bird": _rate(bird.get(cls, []), **kw),
            "excluded": excluded.get(cls, 0),
        }
    return {"bird": _rate(all_bird, **kw), "classes": classes}


def difficulty_breakdown(exp: Experiment, base_of: dict[str, str], **kw: Any) -> dict:
    """{"arms": arm -> {"bird": overall BIRD metric, "classes": difficulty -> {"ours", "bird",
    "excluded"}}, "vs_base": arm -> difficulty -> paired row}; {} when no arm has a difficulty."""
    results = {a: exp.results(a) or [] for a in exp.arms}
    if not any(r.get("difficulty") for rows in results.values() for r in rows):
        return {}
    arms = {a: _arm(rows, **kw) for a, rows in results.items() if rows}
    vs_base = {}
    for b, a in base_of.items():
        if a in arms and b in arms:
            of = {str(r.get("task_id")): str(r.get("difficulty") or "unlabelled") for r in results[a]}
            vs_base[b] = _paired_by_class(exp, a, b, of)
    return {"arms": arms, "vs_base": vs_base}


def _cell(row: dict | None) -> str:
    if not row or not row.get("n"):
        return "-"
    ci = f" [{100 * row['ci_low']:.1f}–{100 * row['ci_high']:.1f}]" if row.get("ci_low") is not None else ""
    return f"{pct(row['accuracy'])} ({row['correct']}/{row['n']}){ci}"


def _vs(d: dict | None) -> str:
    return "-" if not d else f"{pp(d['diff'])} (n {d['n']}; +{d['b_only']} / −{d['a_only']})"


def _rows(analysis: dict) -> tuple[list[str], list[list[str]], list[str], list[list[str]]]:
    """(arm names, table rows, vs-base heads, vs-base rows) of the section, as plain text."""
    d = analysis["breakdown"]["difficulty"]
    names = [a["name"] for a in analysis["arms"] if a["name"] in d["arms"]]
    classes = list(next(iter(d["arms"].values()))["classes"]) if d["arms"] else []
    rows = [["all (BIRD metric)"] + [_cell(d["arms"][a]["bird"]) for a in names]]
    for cls in classes:
        for metric in ("ours", "bird"):
            rows.append(
                [f"{cls} ({'ours' if metric == 'ours' else 'BIRD'})"]
                + [_cell(d["arms"][a]["classes"].get(cls, {}).get(metric)) for a in names]
            )
    heads = [f"{a} − {analysis['base_of'][a]}" for a in d["vs_base"]]
    vrows = [[cls] + [_vs(d["vs_base"][a].get(cls)) for a in d["vs_base"]] for cls in classes]
    return names, rows, heads, vrows


def difficulty_markdown(analysis: dict) -> list[str]:
    """report.md section (empty when the breakdown has no difficulty)."""
    if not analysis["breakdown"].get("difficulty"):
        return []
    names, rows, heads, vrows = _rows(analysis)
    out = ["", "## BIRD metric and accuracy by BIRD difficulty", "", NOTE, ""]
    out += ["| difficulty | " + " | ".join(md_cell(n) for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    out += ["| " + " | ".join(md_cell(c) for c in r) + " |" for r in rows]
    if heads:
        out += [
            "",
            "| difficulty | " + " | ".join(md_cell(h) for h in heads) + " |",
            "|---" * (len(heads) + 1) + "|",
        ]
        out += ["| " + " | ".join(md_cell(c) for c in r) + " |" for r in vrows]
    return out


def difficulty_html(analysis: dict) -> list[str]:
    """report.html section (empty when the breakdown has no difficulty)."""
    if not analysis["breakdown"].get("difficulty"):
        return []
    names, rows, heads, vrows = _rows(analysis)
    by_name = {a["name"]: a for a in analysis["arms"]}
    labels = [arm_label(by_name[n], analysis["colors"]) for n in names]
    out = ['<section id="difficulty"><h2>BIRD metric and accuracy by BIRD difficulty</h2>']
    out.append(
        html_table(
            ["difficulty", *labels], [[esc(c) for c in r] for r in rows], set(range(1, len(names) + 1))
        )
    )
    if heads:
        out.append(
            "<h3>Paired difference vs base, by difficulty</h3>"
            + html_table(["difficulty", *[esc(h) for h in heads]], [[esc(c) for c in r] for r in vrows])
        )
    out.append(f'<p class="note">{esc(NOTE)}</p></section>')
    return out
