"""The hand-written SVG charts: one number format per axis, and overlapping curves told apart."""

from __future__ import annotations

import re

from sqlrl.evidence.charts import axis_labels, svg_legend_entry, svg_line_chart


def y_ticks(svg: str) -> list[str]:
    return re.findall(r'text-anchor="end" class="tick">([^<]*)</text>', svg)


def test_every_tick_of_an_axis_has_the_same_format():
    # ticks 0, 0.0025, ..., 0.01 (step 0.0025): four decimals each, never "2.5e-03" beside "0.01"
    svg = svg_line_chart("loss", {"grpo": [(1, 0.0), (2, 0.005), (3, 0.01)]}, {})
    assert y_ticks(svg) == ["0.0000", "0.0025", "0.0050", "0.0075", "0.0100"]
    assert axis_labels([0.0, 0.25, 0.5]) == (["0.00", "0.25", "0.50"], "")
    assert axis_labels([0.0, 50000.0, 100000.0]) == (["0.0", "0.5", "1.0"], "×1e5")
    assert axis_labels([0.0, 0.5, 1.0], 100, "%") == (["0%", "50%", "100%"], "")


def test_tiny_values_share_a_power_of_ten_in_the_title():
    # a constant lr of 1e-6: ticks 9e-7, 1e-6, 1.1e-6
    svg = svg_line_chart("learning rate", {"grpo": [(1, 1e-6), (2, 1e-6), (3, 1e-6)]}, {})
    assert y_ticks(svg) == ["0.9", "1.0", "1.1"]
    assert 'class="ct">learning rate (×1e-6)</text>' in svg


def test_identical_curves_stay_distinguishable():
    """GRPO under an identical No-update curve: a different dash pattern and marker shape each."""
    same = [(1, 0.5), (2, 0.25), (3, 0.5)]
    svg = svg_line_chart("reward", {"grpo": same, "no_update": same}, {"grpo": "#111", "no_update": "#222"})
    lines = re.findall(r"<polyline [^>]*/>", svg)
    assert len(lines) == 2
    assert 'stroke="#111"' in lines[0] and "stroke-dasharray" not in lines[0]
    assert 'stroke="#222"' in lines[1] and 'stroke-dasharray="7 4"' in lines[1]
    assert len(re.findall(r'<circle [^>]*stroke="#111"', svg)) == 3  # grpo: circles at its 3 points
    assert len(re.findall(r'<rect [^>]*stroke="#222"', svg)) == 3  # no_update: squares
    legend = svg_legend_entry("no_update", "#222", 1)
    assert 'stroke-dasharray="7 4"' in legend and "<rect" in legend and legend.endswith(" no_update</span>")
