"""The HTML page of `sqlrl report`: `render_html(analysis, links)` -> one self-contained document.

Sections, in order: verdict and evidence checks, accuracy per arm, paired differences, grpo_sft vs
its SFT start (`branchstart`), repair decomposition, turn use (multi-turn arms), accuracy by Spider
hardness, validation learning curve, self-consistency beside greedy (`sections`), training curves,
outcome statuses, accuracy per database, tasks that changed (base vs the primary GRPO arm),
provenance. `CSS` is shared with the `sqlrl seeds` page.

What is covered: inline CSS, charts as inline SVG (`charts`), no JavaScript and no external resource (the
page opens offline); every piece of text from the artifacts is HTML-escaped; links to raw files are the
relative paths given in `links`.
What is not: the numbers are the analysis' (`analysis.analyze`); nothing is recomputed here.
"""

from __future__ import annotations

from urllib.parse import quote

from sqlrl.evaluation.outcome import outcome
from sqlrl.evidence.analysis import (
    NONEXEC,
    TURN_USE_HEADERS,
    TURN_USE_NOTE,
    base_comparisons,
    cell_flag,
    claim_lines,
    find_comparison,
    has_context_axis,
    num,
    turn_use_rows,
)
from sqlrl.evidence.branchstart import branch_start_html
from sqlrl.evidence.charts import (
    STATUS_ORDER,
    svg_interval_chart,
    svg_legend_entry,
    svg_line_chart,
    svg_status_bars,
)
from sqlrl.evidence.difficulty import difficulty_html
from sqlrl.evidence.fmt import (
    DEVICE_MINUTES_NOTE,
    acc_ci,
    arm_label,
    budgets_str,
    device_minutes_str,
    esc,
    fmt_p,
    html_table,
    machine_str,
    pct,
    pp,
    short,
)
from sqlrl.evidence.nonexec import nonexec_html
from sqlrl.evidence.rundir import Experiment
from sqlrl.evidence.sections import curve_html, hardness_html, self_consistency_html

CURVE_METRICS = [
    ("reward_mean", "reward (mean)"),
    ("accuracy", "train accuracy"),
    ("kl", "KL to reference"),
    ("grad_norm", "grad norm"),
    ("loss", "loss"),
    ("time_step_s", "step time (s)"),
    ("time_score_s", "reward scoring time (s)"),
]

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
    gains = [t for t in sorted(set(ra) & set(rb)) if outcome(ra[t]) == 0 and outcome(rb[t]) == 1]
    losses = [t for t in sorted(set(ra) & set(rb)) if outcome(ra[t]) == 1 and outcome(rb[t]) == 0]
    out = []
    for title, ids in (
        (f"{row['b']} right, {row['a']} wrong", gains),
        (f"{row['a']} right, {row['b']} wrong", losses),
    ):
        shown = f"first {min(limit, len(ids))} shown" if ids else "none"
        out.append(f"<h3>{esc(title)}: {len(ids)} tasks ({shown})</h3>")
        for t in ids[:limit]:
            out.append(
                '<div class="ex">'
                f"<div><b class=mono>{esc(t)}</b> <span class=muted>db {esc(rb[t].get('db_id'))}</span></div>"
                + (f"<div>{esc(qs[t])}</div>" if t in qs else "")
                + f"<div class=muted>{esc(row['a'])} ({esc(ra[t].get('status'))}):</div><pre>{esc(ra[t].get('final_sql') or '(no SQL)')}</pre>"
                f"<div class=muted>{esc(row['b'])} ({esc(rb[t].get('status'))}):</div><pre>{esc(rb[t].get('final_sql') or '(no SQL)')}</pre>"
                "</div>"
            )
    return "".join(out)


def _head(analysis: dict) -> list[str]:
    """The document head, the title and the experiment line."""
    e = analysis["experiment"]
    flags = [f for f, on in e["flags"].items() if on]
    out = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        f"<title>sqlrl report: {esc(e['name'])}</title><style>{CSS}</style></head><body><main>",
        f"<h1>sqlrl report: {esc(e['name'])}</h1>",
        f'<p class="sub">experiment folder <code>{esc(e["dir"])}</code> · split {esc(e.get("split") or "-")} · '
        f"dataset fingerprint <code>{esc(short(e.get('fingerprint'), 16))}</code>"
        + (f" · <b>{esc(', '.join(flags))}</b>" if flags else "")
        + "</p>",
    ]
    return out


def _verdict_section(analysis: dict) -> list[str]:
    """The verdict: the badge, what is missing, the table of evidence checks."""
    v = analysis["verdict"]
    out: list[str] = []
    if v.claim_allowed:
        out.append(
            '<section class="verdict ok" id="verdict"><span class="badge">CLAIM ALLOWED</span>'
            "<p>Every evidence check passed: the comparisons below may be stated as a learning result "
            "(with their confidence intervals):</p><ul>"
            + "".join(f"<li>{esc(line)}</li>" for line in claim_lines(analysis))
            + "</ul>"
        )
    else:
        out.append(
            '<section class="verdict no" id="verdict"><span class="badge">NO CLAIM</span>'
            "<p>The evidence gate did not pass. The numbers below describe this folder but are <b>not</b> a "
            f"learning result. Missing ({len(v.missing)}):</p><ul>"
            + "".join(f"<li>{esc(m)}</li>" for m in v.missing)
            + "</ul>"
        )
    out.append(f"<p><b>{esc(v.rl_over_sft_line)}</b></p>")  # the SFT-only control's claim (gate.py)
    rows = [
        [
            f"<code>{esc(c.name)}</code>",
            '<span class="pass">✓ pass</span>' if c.passed else '<span class="fail">✗ fail</span>',
            esc(c.detail),
        ]
        for c in v.checks
    ]
    out.append("<h3>Evidence checks</h3>" + html_table(["check", "result", "detail"], rows) + "</section>")
    return out


def _accuracy_section(analysis: dict) -> list[str]:
    """Accuracy per arm: table, interval chart, disagreement notes."""
    colors = analysis["colors"]
    arms = analysis["arms"]
    params = analysis["params"]
    level = int(round(100 * params["ci"]))
    out: list[str] = []
    acc_rows = []
    axis = has_context_axis(analysis)  # the context column only for a matrix with that axis
    for arm in arms:
        ts = arm.get("test_suite")
        excl = arm.get("excluded") or {}
        acc_rows.append(
            [
                arm_label(arm, colors),
                esc(arm["kind"]),
                esc(arm["turns"]),
                *([esc(arm["context_tokens"] or "-")] if axis else []),
                esc(acc_ci(arm)),
                esc(pct(ts["value"])) if ts else "-",
                esc(pct(arm.get("executable_rate"))),
                esc(arm.get("n", "-")),
                esc(", ".join(f"{k} {c}" for k, c in excl.items()) or "0"),
            ]
        )
    out.append(
        '<section id="accuracy"><h2>Accuracy per arm</h2>'
        + html_table(
            [
                "arm",
                "kind",
                "turns",
                *(["context tokens"] if axis else []),
                f"execution match ({level}% CI)",
                "test-suite match",
                "executable",
                "n scored",
                "excluded",
            ],
            acc_rows,
            {3, 4, 5, 6, 7} if axis else {3, 4, 5, 6},
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
    out += [f'<div class="warn">{esc(n)}</div>' for n in notes]
    out.append(
        f'<p class="note">Execution match over scored tasks (tasks with an unscorable gold or an infrastructure '
        f"failure are excluded and counted). Percentile bootstrap, {params['n_boot']} resamples, seed {params['seed']}. "
        "Test-suite match is the literature metric, where recorded.</p></section>"
    )
    return out


def _paired_section(analysis: dict) -> list[str]:
    """Paired differences: table and interval chart of every comparison."""
    colors = analysis["colors"]
    level = int(round(100 * analysis["params"]["ci"]))
    out: list[str] = []
    cmp_rows, forest = [], []
    for row in analysis["comparisons"]:
        label = f"{row['b']} vs {row['a']}"
        flag = f' <span class="muted">{cell_flag(row)}</span>' if cell_flag(row) else ""
        if row.get("available"):
            cmp_rows.append(
                [
                    esc(label) + flag,
                    esc(row["n"]),
                    esc(pct(row["mean_a"])),
                    esc(pct(row["mean_b"])),
                    f"<b>{esc(pp(row['diff']))}</b>",
                    esc(f"{100 * row['ci_low']:+.1f} to {100 * row['ci_high']:+.1f}"),
                    esc(row["b_only"]),
                    esc(row["a_only"]),
                    esc(fmt_p(row["p_value"])),
                    esc(row["dropped_excluded"]),
                ]
            )
            forest.append((label, row["diff"], row["ci_low"], row["ci_high"], colors[row["b"]]))
        else:
            cmp_rows.append([esc(label) + flag] + ["-"] * 8 + [esc(row.get("reason", ""))])
    out.append(
        '<section id="paired"><h2>Paired differences</h2>'
        + html_table(
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
    return out


def _repair_section(analysis: dict) -> list[str]:
    """Repair decomposition of each arm vs its base, and the GRPO arm's transitions."""
    out: list[str] = []
    rep = base_comparisons(analysis)
    if rep:
        rep_rows = []
        for r in rep:
            d = r["repair"]
            rep_rows.append(
                [
                    esc(r["b"]),
                    f"<b>{esc(pp(d['delta']))}</b>",
                    esc(pp(d["repair_part"])),
                    esc(pp(d["answer_part"])),
                    esc(d["repair_gains"]),
                    esc(d["breakages"]),
                    esc(d["answer_gains"]),
                    esc(d["answer_losses"]),
                    esc(d["became_executable"]),
                    esc(d["became_nonexecutable"]),
                ]
            )
        out.append(
            '<section id="repair"><h2>Where the change comes from: execution repair vs answers</h2>'
            '<p class="note" style="margin-top:0">Over the paired tasks, each scored outcome is one of <b>match</b>, '
            "<b>mismatch</b> (executed, wrong answer) or <b>non-executable</b> (no_sql, exec_error, timeout). "
            "Δ vs base = <b>repair part</b> + <b>answer part</b>, where repair part = (non-executable→match − "
            "match→non-executable)/n and answer part = (mismatch→match − match→mismatch)/n. A gain that is mostly "
            "repair means the arm learned to emit runnable SQL more than it learned to answer better.</p>"
            + html_table(
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
            trows = [[f"<b>{esc(ga)}</b>"] + [esc(t[ga][gb]) for gb in groups] for ga in groups]
            out.append(
                f"<h3>Transitions {esc(g['a'])} (rows) → {esc(g['b'])} (columns)</h3>"
                + html_table([f"{esc(g['a'])} \\ {esc(g['b'])}", *groups], trows, {1, 2, 3})
            )
        out.append("</section>")
    return out


def _turn_use_section(analysis: dict) -> list[str]:
    """Turn use of the multi-turn arms."""
    out: list[str] = []
    tu = turn_use_rows(analysis)
    if tu:
        out.append(
            '<section id="turn-use"><h2>Turn use (multi-turn arms)</h2>'
            f'<p class="note" style="margin-top:0">{esc(TURN_USE_NOTE)}</p>'
            + html_table(
                list(map(esc, TURN_USE_HEADERS)),
                [[esc(c) for c in r] for r in tu],
                set(range(1, len(TURN_USE_HEADERS))),
            )
            + "</section>"
        )
    return out


def _curves_section(analysis: dict) -> list[str]:
    """Training curves of the trained arms."""
    colors = analysis["colors"]
    out: list[str] = []
    curves = analysis["curves"]
    if curves:
        styles = {a: i for i, a in enumerate(curves)}
        legend = "".join(svg_legend_entry(a, colors[a], styles[a]) for a in curves)
        charts = []
        for key, title in CURVE_METRICS:
            series = {
                a: [(float(s.get("step", i + 1)), num(s.get(key))) for i, s in enumerate(st)]
                for a, st in curves.items()
            }
            charts.append(svg_line_chart(title, series, colors, styles))
        out.append(
            f'<section id="training"><h2>Training curves</h2><div class="legend">{legend}</div>'
            f'<div class="grid2">{"".join(charts)}</div>'
            '<p class="note">From each trained arm\'s train/steps.jsonl, one point per optimizer step.</p></section>'
        )
    return out


def _status_section(analysis: dict) -> list[str]:
    """Outcome status counts per arm: stacked bars and table."""
    colors = analysis["colors"]
    arms = analysis["arms"]
    out: list[str] = []
    statuses = [s for s in STATUS_ORDER if any(s in (a.get("status_counts") or {}) for a in arms)]
    statuses += sorted({s for a in arms for s in (a.get("status_counts") or {})} - set(statuses))
    srows = [
        [arm_label(a, colors)]
        + [esc((a.get("status_counts") or {}).get(s, 0)) for s in statuses]
        + [esc(a.get("n_total", "-"))]
        for a in arms
    ]
    out.append(
        '<section id="status"><h2>Outcome status per arm</h2>'
        + svg_status_bars(arms)
        + html_table(["arm", *map(esc, statuses), "total"], srows, set(range(1, len(statuses) + 2)))
        + "</section>"
    )
    return out


def _per_db_section(analysis: dict) -> list[str]:
    """Accuracy per database and arm."""
    arms = analysis["arms"]
    out: list[str] = []
    dbs = sorted({d for a in arms for d in (a.get("per_db") or {})})
    if dbs:
        drows = []
        for d in dbs:
            cells = [f"<code>{esc(d)}</code>"]
            for a in arms:
                c = (a.get("per_db") or {}).get(d)
                cells.append(
                    f"{esc(pct(c[0] / c[1], 0))} <span class=muted>({c[0]}/{c[1]})</span>" if c else "-"
                )
            drows.append(cells)
        out.append(
            '<section id="per-db"><h2>Accuracy per database</h2>'
            + html_table(["database", *[esc(a["name"]) for a in arms]], drows, set(range(1, len(arms) + 1)))
            + "</section>"
        )
    return out


def _examples_section(analysis: dict) -> list[str]:
    """Tasks that changed between the base and the primary GRPO arm."""
    out: list[str] = []
    main_cmp = None
    if analysis["base"]:
        exp: Experiment = analysis["_exp"]
        g = exp.primary("grpo")
        main_cmp = find_comparison(analysis, analysis["base"], g.name) if g else None
    if main_cmp and main_cmp.get("available"):
        out.append(
            f'<section id="examples"><h2>Tasks that changed: {esc(main_cmp["b"])} vs {esc(main_cmp["a"])}</h2>'
            + _examples_html(analysis, main_cmp)
            + "</section>"
        )
    return out


def _provenance_section(analysis: dict, links: dict[str, dict[str, str]]) -> list[str]:
    """Provenance per arm (model, machines, budgets, raw files) and the footer."""
    colors = analysis["colors"]
    arms = analysis["arms"]
    params = analysis["params"]
    level = int(round(100 * params["ci"]))
    out: list[str] = []
    prow = []
    for a in arms:
        t = a.get("train") or {}
        lk = links.get(a["name"], {})
        files = " · ".join(f'<a href="{esc(quote(p))}">{esc(k)}</a>' for k, p in lk.items()) or "-"
        prow.append(
            [
                arm_label(a, colors),
                f"<code>{esc(short((a['model'] or {}).get('identity'), 16))}</code><br><span class=muted>{esc((a['model'] or {}).get('name', '-'))}</span>",
                esc(machine_str(a["machine"])),
                esc(machine_str(t.get("machine"))) if t else "-",
                f"<code>{esc(short(a['fingerprint'], 16))}</code>",
                f"<span class=mono>{esc(budgets_str(a['budgets']))}</span>",
                esc(device_minutes_str(a)),
                esc(t.get("steps") if t.get("steps") is not None else "-"),
                files,
            ]
        )
    out.append(
        '<section id="provenance"><h2>Provenance: which model, machine and budget produced each number</h2>'
        + html_table(
            [
                "arm",
                "model identity (weights hash)",
                "eval machine",
                "train machine",
                "fingerprint",
                "budgets",
                "device minutes",
                "steps",
                "raw files",
            ],
            prow,
            {6, 7},
        )
        + '<p class="note">Model identity and machine as recorded in each eval run\'s summary.json / run.json. '
        + esc(DEVICE_MINUTES_NOTE)
        + " Links are relative to this report.</p></section>"
    )
    out.append(
        f'<p class="note">Generated by <code>sqlrl report</code>. Bootstrap: {params["n_boot"]} resamples, seed '
        f"{params['seed']}, {level}% percentile intervals.</p></main></body></html>"
    )
    return out


def render_html(analysis: dict, links: dict[str, dict[str, str]]) -> str:
    """The whole page for `analysis` (from `analysis.analyze`), linking raw files by `links` (arm -> name -> path)."""
    out = _head(analysis)
    out += _verdict_section(analysis)
    out += _accuracy_section(analysis)
    out += _paired_section(analysis)
    out += branch_start_html(analysis)
    out += _repair_section(analysis)
    out += nonexec_html(analysis)
    out += _turn_use_section(analysis)
    out += hardness_html(analysis)
    out += difficulty_html(analysis)
    out += curve_html(analysis)
    out += self_consistency_html(analysis)
    out += _curves_section(analysis)
    out += _status_section(analysis)
    out += _per_db_section(analysis)
    out += _examples_section(analysis)
    out += _provenance_section(analysis, links)
    return "\n".join(out)
