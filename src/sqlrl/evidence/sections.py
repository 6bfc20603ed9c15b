"""Report sections for `analysis["breakdown"]`: accuracy by Spider hardness, learning curves,
self-consistency beside greedy; each as HTML (`*_html`, for page.py) and Markdown (`breakdown_markdown`).

What is covered: every number printed is one of the breakdown's (`breakdown.breakdown`); text from the
artifacts is HTML-escaped or made safe for Markdown cells; an arm without the data says why.
What is not: nothing is recomputed here.
"""

from __future__ import annotations

from sqlrl.evidence.charts import svg_interval_chart, svg_legend_entry, svg_line_chart
from sqlrl.evidence.fmt import arm_label, esc, fmt_p, html_table, md_cell, pct, pp
from sqlrl.tasks.hardness import HARDNESS, UNPARSED

HARDNESS_NOTE = (
    "Hardness of each task's gold SQL by the official Spider rules (evaluation.py eval_hardness; "
    "sqlrl.tasks.hardness). Accuracy over scored tasks of the class with its percentile bootstrap CI; "
    "excluded tasks counted apart."
)
VS_BASE_NOTE = (
    "Paired by task over tasks scored in both arms: Δ = accuracy(arm) − accuracy(base) on that class; "
    "+wins / −losses count the tasks only one of the two gets right."
)
CURVE_NOTE = (
    "Greedy execution match of the policy being trained, on the validation tasks of run.eval_tasks "
    "(0 = the whole split), every run.eval_every steps and at the last step (train/curve.jsonl), for GRPO "
    "and SFT runs alike (an SFT arm trains single-turn and is measured at its arm's turns; \"<arm> SFT "
    "stage\" is a grpo_sft arm's own SFT stage, whose steps come before its GRPO steps). A step chosen by "
    "this curve has an optimistic figure on these tasks."
)
SC_NOTE = (
    "Self-consistency: k sampled answers per task, the answer with the most common execution result "
    "wins; pass@k = some sample matches (an oracle bound). Beside greedy, never instead of it; Δ paired by "
    "task over tasks scored by both, with bootstrap CI and exact McNemar p."
)


def _classes(analysis: dict) -> list[str]:
    hard = analysis["breakdown"]["hardness"]
    extra = [UNPARSED] if any(UNPARSED in (h.get("classes") or {}) for h in hard.values()) else []
    return [*HARDNESS, *extra]


def _acc_cell(row: dict | None) -> str:
    """`62.1% (95/153)`, or `-` when the class has no scored task."""
    if not row or not row.get("n"):
        return "-"
    return f"{pct(row['accuracy'])} ({row['correct']}/{row['n']})"


def _ci_cell(row: dict | None) -> str:
    if not row or row.get("ci_low") is None:
        return ""
    return f"{100 * row['ci_low']:.1f}–{100 * row['ci_high']:.1f}"


def _vs_cell(d: dict | None) -> str:
    if not d:
        return "-"
    return f"{pp(d['diff'])} (n {d['n']}; +{d['b_only']} / −{d['a_only']})"


def _hardness_notes(analysis: dict) -> list[str]:
    """Why arms have no hardness or one from summary.json; arms with the same reason share a line."""
    by: dict[str, list[str]] = {}
    for a, h in analysis["breakdown"]["hardness"].items():
        if "unavailable" in h:
            by.setdefault(f"no hardness ({h['unavailable']})", []).append(a)
        elif h.get("source") == "summary.json":
            by.setdefault(f"from its summary.json (no CI): {h.get('note', '')}", []).append(a)
    return [f"{', '.join(arms)}: {why}" for why, arms in by.items()]


def _any_hardness(analysis: dict) -> bool:
    return any("classes" in h for h in analysis["breakdown"]["hardness"].values())


def hardness_html(analysis: dict) -> list[str]:
    """Accuracy by hardness per arm: table, CI chart, paired Δ vs base."""
    b = analysis["breakdown"]
    arms, colors = analysis["arms"], analysis["colors"]
    classes = _classes(analysis)
    rows = []
    for cls in classes:
        cells = [esc(cls)]
        for arm in arms:
            row = (b["hardness"].get(arm["name"], {}).get("classes") or {}).get(cls)
            ci = _ci_cell(row)
            excl = (row or {}).get("excluded")
            cells.append(
                esc(_acc_cell(row))
                + (f"<br><span class=muted>{esc(ci)}</span>" if ci else "")
                + (f"<br><span class=muted>{esc(excl)} excluded</span>" if excl else "")
            )
        rows.append(cells)
    out = ['<section id="hardness"><h2>Accuracy by Spider hardness</h2>']
    if not _any_hardness(analysis):
        out += [f'<div class="warn">{esc(n)}</div>' for n in _hardness_notes(analysis)]
        return out + [f'<p class="note">{esc(HARDNESS_NOTE)}</p></section>']
    out.append(
        html_table(["hardness", *[arm_label(a, colors) for a in arms]], rows, set(range(1, len(arms) + 1)))
    )
    chart = [
        (f"{cls} · {a['name']}", r["accuracy"], r["ci_low"], r["ci_high"], colors[a["name"]])
        for cls in classes
        for a in arms
        for r in [(b["hardness"].get(a["name"], {}).get("classes") or {}).get(cls) or {}]
        if r.get("ci_low") is not None
    ]
    out.append(svg_interval_chart(chart, title="Execution match by hardness", zero_line=False, pct_axis=True))
    vs = b["hardness_vs_base"]
    if vs:
        vrows = [[esc(cls)] + [esc(_vs_cell(vs[a].get(cls))) for a in vs] for cls in classes]
        heads = [f"{esc(a)} − {esc(analysis['base_of'][a])}" for a in vs]
        out.append(
            "<h3>Paired difference vs base, by hardness</h3>" + html_table(["hardness", *heads], vrows)
        )
        out.append(f'<p class="note">{esc(VS_BASE_NOTE)}</p>')
    out += [f'<div class="warn">{esc(n)}</div>' for n in _hardness_notes(analysis)]
    out.append(f'<p class="note">{esc(HARDNESS_NOTE)}</p></section>')
    return out


def _curve_rows(curves: dict) -> list[list[str]]:
    rows = []
    for a, c in curves.items():
        for p in c.get("points") or []:
            rows.append(
                [
                    a,
                    str(p.get("step", "-")),
                    pct(p.get("execution_match")),
                    pct(p.get("executable_rate")),
                    pct(p.get("test_suite_match")),
                    f"{p.get('n', '-')}/{p.get('n_tasks', '-')}",
                    f"{p['seconds']:.1f}" if isinstance(p.get("seconds"), int | float) else "-",
                ]
            )
    return rows


CURVE_HEADERS = [
    "arm",
    "step",
    "execution match",
    "executable",
    "test-suite match",
    "scored/tasks",
    "seconds",
]


def curve_html(analysis: dict) -> list[str]:
    """Validation learning curve of each trained arm (chart + table), or why an arm has none."""
    curves = analysis["breakdown"]["curves"]
    if not curves:
        return []
    # a grpo_sft arm's SFT stage is drawn in its arm's colour, with a line style of its own
    colors = {
        **analysis["colors"],
        **{a: analysis["colors"][c["of"]] for a, c in curves.items() if "of" in c},
    }
    have = {a: c["points"] for a, c in curves.items() if c.get("points")}
    out = ['<section id="learning-curve"><h2>Learning curve (validation accuracy during training)</h2>']
    if have:
        order = [*analysis["curves"], *[a for a in curves if a not in analysis["curves"]]]
        styles = {a: order.index(a) for a in have}  # as in the training curves
        legend = "".join(svg_legend_entry(a, colors[a], styles[a]) for a in have)
        charts = [
            svg_line_chart(
                title,
                {a: [(float(p.get("step", 0)), p.get(key)) for p in pts] for a, pts in have.items()},
                colors,
                styles,
            )
            for key, title in (("execution_match", "execution match"), ("executable_rate", "executable"))
        ]
        out.append(f'<div class="legend">{legend}</div><div class="grid2">{"".join(charts)}</div>')
        out.append(
            html_table(CURVE_HEADERS, [[esc(c) for c in r] for r in _curve_rows(curves)], {1, 2, 3, 4, 5, 6})
        )
    out += [f'<p class="note">{esc(a)}: {esc(c["reason"])}</p>' for a, c in curves.items() if "reason" in c]
    out.append(f'<p class="note">{esc(CURVE_NOTE)}</p></section>')
    return out


def _sc_rows(analysis: dict) -> list[list[str]]:
    accs = {a["name"]: a for a in analysis["arms"]}
    rows = []
    for a, s in analysis["breakdown"]["self_consistency"].items():
        g = accs[a].get("accuracy")
        vs = s.get("vs_greedy")
        rows.append(
            [
                a,
                f"{pct(g['value'])} (n {accs[a].get('n')})" if g else "-",
                f"{pct(s.get('accuracy'))} (n {s.get('n', '-')})",
                pct(s.get("pass_at_k")),
                f"k {s.get('k', '-')}, T {s.get('temperature', '-')}",
                f"{pp(vs['diff'])} ({100 * vs['ci_low']:+.1f} to {100 * vs['ci_high']:+.1f}), n {vs['n']}"
                if vs
                else "-",
                fmt_p(vs["p_value"]) if vs else "-",
            ]
        )
    return rows


SC_HEADERS = ["arm", "greedy", "self-consistency", "pass@k", "samples", "Δ vs greedy (95% CI)", "McNemar p"]


def self_consistency_html(analysis: dict) -> list[str]:
    """Self-consistency accuracy and pass@k beside greedy, for arms with self_consistency.json."""
    rows = _sc_rows(analysis)
    out = ['<section id="self-consistency"><h2>Self-consistency beside greedy</h2>']
    if not rows:
        out.append(
            '<p class="note">No arm has self_consistency.json (written by '
            "<code>sqlrl eval --self-consistency K</code>).</p></section>"
        )
        return out
    out.append(html_table(SC_HEADERS, [[esc(c) for c in r] for r in rows], {1, 2, 3, 5, 6}))
    out.append(f'<p class="note">{esc(SC_NOTE)}</p></section>')
    return out


def _md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(headers) + " |",
        "|" + " --- |" * len(headers),
        *["| " + " | ".join(md_cell(c) for c in r) + " |" for r in rows],
    ]


def breakdown_markdown(analysis: dict) -> list[str]:
    """report.md sections: accuracy by hardness (+ Δ vs base), learning curve, self-consistency."""
    b = analysis["breakdown"]
    arms = analysis["arms"]
    out = ["", "## Accuracy by Spider hardness", "", HARDNESS_NOTE, ""]
    if not _any_hardness(analysis):
        out += [f"- {md_cell(n)}" for n in _hardness_notes(analysis)]
        return out + _curve_and_sc_markdown(analysis)
    rows = []
    for cls in _classes(analysis):
        cells = [cls]
        for arm in arms:
            row = (b["hardness"].get(arm["name"], {}).get("classes") or {}).get(cls)
            ci = _ci_cell(row)
            cells.append(_acc_cell(row) + (f" [{ci}]" if ci else ""))
        rows.append(cells)
    out += _md_table(["hardness", *[a["name"] for a in arms]], rows)
    vs = b["hardness_vs_base"]
    if vs:
        out += ["", VS_BASE_NOTE, ""]
        heads = [f"{a} − {analysis['base_of'][a]}" for a in vs]
        out += _md_table(
            ["hardness", *heads], [[c] + [_vs_cell(vs[a].get(c)) for a in vs] for c in _classes(analysis)]
        )
    out += [""] + [f"- {md_cell(n)}" for n in _hardness_notes(analysis)]
    return out + _curve_and_sc_markdown(analysis)


def _curve_and_sc_markdown(analysis: dict) -> list[str]:
    out: list[str] = []
    curves = analysis["breakdown"]["curves"]
    if curves:
        out += ["", "## Learning curve (validation accuracy during training)", "", CURVE_NOTE, ""]
        have = {a: c for a, c in curves.items() if c.get("points")}
        if have:
            out += _md_table(CURVE_HEADERS, _curve_rows(have))
        out += [""] + [f"- {md_cell(a)}: {md_cell(c['reason'])}" for a, c in curves.items() if "reason" in c]
    out += ["", "## Self-consistency beside greedy", ""]
    sc = _sc_rows(analysis)
    if sc:
        out += [SC_NOTE, ""] + _md_table(SC_HEADERS, sc)
    else:
        out.append("No arm has self_consistency.json (written by `sqlrl eval --self-consistency K`).")
    return out
