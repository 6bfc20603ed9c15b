"""Text formatting shared by the report (Markdown and HTML) and `sqlrl seeds`: percentages, p-values,
intervals, provenance strings, Markdown cells and HTML escaping.

What is covered: one spelling of every number across report.md, report.html and the seeds files; `-`
for a missing value.
What is not: any rounding of the data itself (the analysis keeps full precision).
"""

from __future__ import annotations

import html
import json
from typing import Any


def pct(x: float | None, digits: int = 1) -> str:
    """A fraction as a percentage (`0.5` -> `50.0%`)."""
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def pp(x: float | None) -> str:
    """A difference of fractions in percentage points (`0.05` -> `+5.0 pp`)."""
    return "-" if x is None else f"{100 * x:+.1f} pp"


def fmt_p(p: float | None) -> str:
    """A p-value: three decimals, or scientific notation below 0.001."""
    if p is None:
        return "-"
    if p >= 0.001:
        return f"{p:.3f}"
    return f"{p:.1e}"


def acc_ci(arm: dict) -> str:
    """An arm's accuracy with its interval: `55.0% (41.2–67.5)`."""
    acc = arm.get("accuracy")
    if not acc:
        return "-"
    return f"{pct(acc['value'])} ({100 * acc['ci_low']:.1f}–{100 * acc['ci_high']:.1f})"


def diff_ci(row: dict | None) -> str:
    """A comparison's difference with its interval, in percentage points."""
    if not row or not row.get("available"):
        return "-"
    return f"{pp(row['diff'])} ({100 * row['ci_low']:+.1f} to {100 * row['ci_high']:+.1f})"


def short(h: Any, n: int = 12) -> str:
    """The first `n` characters of a hash."""
    return "-" if not h else str(h)[:n]


def machine_str(m: Any) -> str:
    """A machine record as `2× H200 on host`, or `CPU only`."""
    if not isinstance(m, dict) or not m:
        return "-"
    parts = [str(m.get("accelerator") or "CPU only")]
    if m.get("gpu_count"):
        parts[0] = f"{m['gpu_count']}× {parts[0]}"
    if m.get("hostname"):
        parts.append(f"on {m['hostname']}")
    return " ".join(parts)


def budgets_str(b: Any) -> str:
    """Budgets as `key=value, ...`."""
    if not isinstance(b, dict):
        return "-"
    return ", ".join(f"{k}={json.dumps(v) if isinstance(v, dict | list) else v}" for k, v in b.items())


def gpu_str(arm: dict) -> str:
    """An arm's GPU minutes; `~` marks a sum of step times."""
    t = arm.get("train")
    if not t or t.get("gpu_minutes") is None:
        return "-"
    return ("~" if t["gpu_minutes_source"] == "steps" else "") + f"{t['gpu_minutes']:.1f}"


def md_cell(s: Any) -> str:
    """Text safe inside a Markdown table cell."""
    return str(s).replace("|", "\\|").replace("\n", " ")


def esc(s: Any) -> str:
    """HTML-escaped text (quotes included)."""
    return html.escape(str(s), quote=True)
