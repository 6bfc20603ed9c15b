"""SVG charts for the HTML reports, written by hand (no plotting dependency, no JavaScript).

`svg_line_chart` (training curves over optimizer steps), `svg_interval_chart` (dot-and-whisker rows of
value and interval) and `svg_status_bars` (stacked outcome statuses per arm) each return one inline
`<svg>` element as a string.

What is covered: every piece of text is HTML-escaped; a series with no recorded value is drawn as "not
recorded"; gaps (None) break a line; the output is deterministic.
What is not: layout for very long labels or many rows (labels may overlap or be clipped).
"""

from __future__ import annotations

import math

from sqlrl.evidence.fmt import esc

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


def axis_labels(ticks: list[float], scale: float = 1.0, suffix: str = "") -> tuple[list[str], str]:
    """The labels of one axis, all in one format: the fewest decimals that show every tick exactly
    (`0.00 0.25 0.50`). Ticks below 0.01 or from 1e5 up share a power of ten, returned as the axis note
    (`×1e-6`, for the title) while the labels show the mantissas (`0 1 2 3`)."""
    vals = [t * scale for t in ticks]
    big = max((abs(v) for v in vals), default=0.0)
    note = ""
    if big and (big >= 1e5 or big < 0.01):
        e = math.floor(math.log10(big))
        vals = [v / 10**e for v in vals]
        note = f"×1e{e}"
    digits = next(
        (d for d in range(7) if all(abs(round(v, d) - v) <= 1e-9 * max(1.0, abs(v)) for v in vals)), 6
    )
    return [f"{round(v, digits) + 0.0:.{digits}f}{suffix}" for v in vals], note


# per series, by position: a dash pattern and a hollow marker shape, so that series drawn on top of each
# other (e.g. GRPO and No-update when the update changed nothing measurable) stay distinguishable
DASHES = ["", "7 4", "2 3", "9 3 2 3", "4 2"]
MARKERS = ["circle", "square", "triangle", "diamond", "cross"]


def _marker(shape: str, x: float, y: float, color: str, r: float = 3.2) -> str:
    style = f'fill="none" stroke="{color}" stroke-width="1.4"'  # hollow: markers on one point all show
    if shape == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" {style}/>'
    if shape == "square":
        return f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r:.1f}" height="{2 * r:.1f}" {style}/>'
    if shape == "triangle":
        pts = f"{x:.1f},{y - 1.2 * r:.1f} {x - 1.1 * r:.1f},{y + 0.8 * r:.1f} {x + 1.1 * r:.1f},{y + 0.8 * r:.1f}"
        return f'<polygon points="{pts}" {style}/>'
    if shape == "diamond":
        pts = f"{x:.1f},{y - 1.3 * r:.1f} {x + 1.3 * r:.1f},{y:.1f} {x:.1f},{y + 1.3 * r:.1f} {x - 1.3 * r:.1f},{y:.1f}"
        return f'<polygon points="{pts}" {style}/>'
    return (
        f'<path d="M{x - r:.1f},{y - r:.1f}L{x + r:.1f},{y + r:.1f}M{x - r:.1f},{y + r:.1f}L{x + r:.1f},{y - r:.1f}" '
        f'stroke="{color}" stroke-width="1.6"/>'
    )


def line_style(i: int) -> tuple[str, str]:
    """(dash pattern, marker shape) of the `i`-th series."""
    return DASHES[i % len(DASHES)], MARKERS[i % len(MARKERS)]


def svg_legend_entry(name: str, color: str, i: int) -> str:
    """A legend entry: the `i`-th series' line sample (dash and marker) and its name."""
    dash, shape = line_style(i)
    dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
    return (
        f'<span><svg width="34" height="12" viewBox="0 0 34 12" aria-hidden="true">'
        f'<line x1="1" x2="33" y1="6" y2="6" stroke="{color}" stroke-width="1.8"{dash_attr}/>'
        f"{_marker(shape, 17, 6, color)}</svg> {esc(name)}</span>"
    )


def svg_line_chart(
    title: str,
    series: dict[str, list[tuple[float, float | None]]],
    colors: dict[str, str],
    styles: dict[str, int] | None = None,
) -> str:
    """A small line chart of named series of (step, value); None breaks a line. Each series has its color,
    dash pattern and marker (`line_style` of its index in `styles`, else of its position)."""
    w, h = 322, 200
    ml, mr, mt, mb = 52, 12, 30, 34
    pts = [(x, y) for s in series.values() for x, y in s if y is not None]
    if not pts:
        return (
            f'<svg class="chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{esc(title)}">'
            f'<text x="{w / 2}" y="20" text-anchor="middle" class="ct">{esc(title)}</text>'
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

    y_labels, y_note = axis_labels(yt)
    x_labels, _ = axis_labels(xt)
    shown = f"{title} ({y_note})" if y_note else title
    parts = [
        f'<svg class="chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{esc(title)}">',
        f'<text x="{ml}" y="18" class="ct">{esc(shown)}</text>',
    ]
    for t, label in zip(yt, y_labels):
        parts.append(f'<line x1="{ml}" x2="{w - mr}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" class="grid"/>')
        parts.append(
            f'<text x="{ml - 6}" y="{sy(t) + 4:.1f}" text-anchor="end" class="tick">{esc(label)}</text>'
        )
    for t, label in zip(xt, x_labels):
        parts.append(
            f'<text x="{sx(t):.1f}" y="{h - mb + 15}" text-anchor="middle" class="tick">{esc(label)}</text>'
        )
    parts.append(f'<text x="{(ml + w - mr) / 2}" y="{h - 4}" text-anchor="middle" class="axis">step</text>')
    parts.append(f'<line x1="{ml}" x2="{w - mr}" y1="{h - mb}" y2="{h - mb}" class="axisline"/>')
    for pos, (name, s) in enumerate(series.items()):
        segs: list[list[tuple[float, float]]] = [[]]
        for x, y in s:
            if y is None:
                segs.append([])
            else:
                segs[-1].append((sx(x), sy(y)))
        color = colors.get(name, "#111827")
        dash, shape = line_style((styles or {}).get(name, pos))
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        points = [p for seg in segs for p in seg]
        every = max(1, math.ceil(len(points) / 16))  # at most ~16 markers a series
        for seg in segs:
            if len(seg) >= 2:
                d = " ".join(f"{px:.1f},{py:.1f}" for px, py in seg)
                parts.append(
                    f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="1.8"{dash_attr}/>'
                )
        parts += [_marker(shape, px, py, color) for px, py in points[::every]]
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
        f'<svg class="chart wide" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{esc(title)}">',
        f'<text x="8" y="18" class="ct">{esc(title)}</text>',
    ]
    bottom = mt + row_h * len(rows)
    for i in range(0, len(rows), 2):
        parts.append(f'<rect x="0" y="{mt + row_h * i}" width="{w}" height="{row_h}" class="band"/>')
    labels, note = (
        axis_labels(ticks, 100, "%" if not zero_line else " pp") if pct_axis else axis_labels(ticks)
    )
    if note:
        parts[1] = f'<text x="8" y="18" class="ct">{esc(f"{title} ({note})")}</text>'
    for t, label in zip(ticks, labels):
        parts.append(f'<line x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{mt}" y2="{bottom}" class="grid"/>')
        parts.append(
            f'<text x="{sx(t):.1f}" y="{bottom + 16}" text-anchor="middle" class="tick">{esc(label)}</text>'
        )
    if zero_line and x0 <= 0 <= x1:
        parts.append(f'<line x1="{sx(0):.1f}" x2="{sx(0):.1f}" y1="{mt - 4}" y2="{bottom}" class="zero"/>')
    for i, (label, v, lo_, hi_, color) in enumerate(rows):
        cy = mt + row_h * i + row_h / 2
        parts.append(
            f'<text x="{ml - 10}" y="{cy + 4:.1f}" text-anchor="end" class="lab">{esc(label)}</text>'
        )
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
    """One stacked bar of outcome statuses per arm with `status_counts` ('' when there is none)."""
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
        parts.append(f'<text x="{lx + 15}" y="18" class="tick">{esc(s)}</text>')
        lx += 24 + 7 * len(s)
    for i, a in enumerate(rows):
        total = sum(a["status_counts"].values()) or 1
        cy = mt + row_h * i
        parts.append(
            f'<text x="{ml - 10}" y="{cy + row_h / 2 + 4:.1f}" text-anchor="end" class="lab">{esc(a["name"])}</text>'
        )
        x = float(ml)
        for s in statuses:
            c = a["status_counts"].get(s, 0)
            if not c:
                continue
            bw = c / total * (w - ml - mr)
            parts.append(
                f'<rect x="{x:.1f}" y="{cy + 3}" width="{bw:.1f}" height="{row_h - 6}" fill="{STATUS_COLORS.get(s, "#64748b")}">'
                f"<title>{esc(a['name'])}: {esc(s)} {c}</title></rect>"
            )
            if bw > 26:
                parts.append(
                    f'<text x="{x + bw / 2:.1f}" y="{cy + row_h / 2 + 4:.1f}" text-anchor="middle" class="barlab">{c}</text>'
                )
            x += bw
    parts.append("</svg>")
    return "".join(parts)
