"""Report section "What does not execute": per arm, its non-executable share of the scored tasks and its
execution errors by kind (`evaluation.errorkinds`), as Markdown (`nonexec_markdown`) and HTML
(`nonexec_html`).

What is covered: the counts are the analysis's (`status_counts`, `exec_error_kinds` over results.jsonl,
each error's message from its row, else from its trajectory; `not recorded` when neither has it).
What is not: no_sql and timeout are counted, not broken down; nothing is re-executed.
"""

from __future__ import annotations

from sqlrl.evaluation.errorkinds import NON_EXECUTABLE
from sqlrl.evidence.fmt import esc, html_table, md_cell

NONEXEC_NOTE = (
    "Scored tasks whose final SQL did not execute (no_sql, exec_error, timeout), and the execution errors "
    "by the kind of their SQLite message (`no such column`: a column the table does not have)."
)
HEADERS = ["arm", "scored", "non-executable", "no_sql", "timeout", "exec_error by kind"]
TOP = 4  # kinds named per arm; the rest summed as "other"


def _kinds_text(kinds: dict[str, int]) -> str:
    items = list(kinds.items())
    shown = [f"{k} {n}" for k, n in items[:TOP]]
    rest = sum(n for _, n in items[TOP:])
    return ", ".join(shown + ([f"other {rest}"] if rest else [])) or "-"


def nonexec_rows(analysis: dict) -> list[list[str]]:
    """One row per arm with scored results: the cells of HEADERS, as text."""
    rows = []
    for arm in analysis["arms"]:
        n, counts = arm.get("n"), arm.get("status_counts") or {}
        if not n:
            continue
        bad = sum(counts.get(s, 0) for s in NON_EXECUTABLE)
        rows.append(
            [
                arm["name"],
                str(n),
                f"{bad} ({bad / n:.1%})",
                str(counts.get("no_sql", 0)),
                str(counts.get("timeout", 0)),
                _kinds_text(arm.get("exec_error_kinds") or {}),
            ]
        )
    return rows


def nonexec_markdown(analysis: dict) -> list[str]:
    rows = nonexec_rows(analysis)
    if not rows:
        return []
    out = ["", "## What does not execute", "", NONEXEC_NOTE, ""]
    out += ["| " + " | ".join(HEADERS) + " |", "|" + " --- |" * len(HEADERS)]
    return out + ["| " + " | ".join(md_cell(c) for c in r) + " |" for r in rows]


def nonexec_html(analysis: dict) -> list[str]:
    rows = nonexec_rows(analysis)
    if not rows:
        return []
    return [
        '<section id="nonexec"><h2>What does not execute</h2>'
        f'<p class="note" style="margin-top:0">{esc(NONEXEC_NOTE)}</p>'
        + html_table(HEADERS, [[esc(c) for c in r] for r in rows], numeric={1, 2, 3, 4})
        + "</section>"
    ]
