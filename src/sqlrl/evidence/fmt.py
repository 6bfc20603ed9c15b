"""Text formatting shared by the report (Markdown and HTML) and `sqlrl seeds`: percentages, p-values,
intervals, provenance strings, Markdown cells and HTML escaping.

What is covered: one spelling of every number across report.md, report.html and the seeds files; `-`
for a missing value.
What is not: any rounding of the data itself (the analysis keeps full precision).
"""

from __future__ import annotations

import html
import json
import re
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


def device_str(m: Any, device: str | None = None) -> str:
    """The device of a machine record: `GPU: 2× NVIDIA H200`, or `CPU: 2-core x86_64` (cores and
    architecture as recorded). `device` ("cuda" / "cpu", as a train run.json records it) says which of
    the machine's devices ran; without it a recorded accelerator is taken as the device."""
    if not isinstance(m, dict) or not m:
        return "device not recorded"
    gpu = m.get("accelerator")
    if gpu and device != "cpu":
        return f"GPU: {m['gpu_count']}× {gpu}" if m.get("gpu_count") else f"GPU: {gpu}"
    arch = re.search(r"x86_64|amd64|aarch64|arm64|ppc64le|s390x", str(m.get("platform") or ""))
    cores = f"{m['cpu_count']}-core" if m.get("cpu_count") else ""
    return "CPU: " + (" ".join(x for x in (cores, arch.group(0) if arch else "") if x) or "unknown")


def machine_str(m: Any) -> str:
    """A machine record as `GPU: 2× H200 on host`, or `CPU: 2-core x86_64 on host`."""
    if not isinstance(m, dict) or not m:
        return "-"
    return device_str(m) + (f" on {m['hostname']}" if m.get("hostname") else "")


def budgets_str(b: Any) -> str:
    """Budgets as `key=value, ...`."""
    if not isinstance(b, dict):
        return "-"
    return ", ".join(f"{k}={json.dumps(v) if isinstance(v, dict | list) else v}" for k, v in b.items())


def device_minutes_str(arm: dict) -> str:
    """An arm's training minutes on its device, named as its train run recorded it: `6.0 GPU min (NVIDIA
    H200)`, `~1.6 CPU min (2-core x86_64)`; `~` marks a sum of step times."""
    t = arm.get("train")
    if not t or t.get("gpu_minutes") is None:
        return "-"
    kind, _, name = device_str(t.get("machine"), t.get("device")).partition(": ")
    where = f"{kind} min ({name})" if name else "min (device not recorded)"
    return ("~" if t["gpu_minutes_source"] == "steps" else "") + f"{t['gpu_minutes']:.1f} {where}"


DEVICE_MINUTES_NOTE = (
    "Device minutes: training time of each trained arm on the device its train run.json records (GPU name, "
    "or CPU cores and architecture), or (marked ~) the sum of its step times."
)


def md_cell(s: Any) -> str:
    """Text safe inside a Markdown table cell."""
    return str(s).replace("|", "\\|").replace("\n", " ")


def esc(s: Any) -> str:
    """HTML-escaped text (quotes included)."""
    return html.escape(str(s), quote=True)


def html_table(headers: list[str], rows: list[list[str]], numeric: set[int] | None = None) -> str:
    """A scrollable table of already-escaped cells; columns in `numeric` are right-aligned."""
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


def arm_label(arm: dict, colors: dict) -> str:
    """An arm's name after a swatch of its colour (HTML)."""
    return f'<span class="swatch" style="background:{colors[arm["name"]]}"></span>{esc(arm["name"])}'
