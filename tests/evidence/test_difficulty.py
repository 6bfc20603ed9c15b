"""Report section: BIRD's metric and accuracy by BIRD difficulty, from hand-set results rows."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sqlrl.artifacts import write_jsonl
from sqlrl.evidence.analysis import analyze
from sqlrl.evidence.report import write_report

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from make_experiment import make_experiment  # noqa: E402

DIFF = ["simple", "simple", "moderate", "moderate", "challenging", "challenging"]
# (ours, BIRD) per task; None: excluded
BASE = [(None, None), (True, True), (False, True), (True, True), (False, False), (False, True)]
GRPO = [(None, None), (True, True), (True, True), (True, True), (True, True), (False, True)]


def _rows(outcomes: list) -> list[dict]:
    return [
        {
            "task_id": f"dev/{i:05d}",
            "db_id": "dorm_1",
            "final_sql": "SELECT 1",
            "status": "gold_unscorable" if c is None else "match" if c else "mismatch",
            "correct": c,
            "reward": None if c is None else float(c),
            "bird_correct": b,
            "difficulty": DIFF[i],
        }
        for i, (c, b) in enumerate(outcomes)
    ]


@pytest.fixture()
def exp(tmp_path: Path) -> Path:
    e = make_experiment(tmp_path / "exp", n_tasks=6)
    for arm in ("base", "no_update", "validity"):
        write_jsonl(e / f"arms/{arm}/eval/results.jsonl", _rows(BASE))
    write_jsonl(e / "arms/grpo/eval/results.jsonl", _rows(GRPO))
    return e


def test_difficulty_breakdown_counts_both_metrics_and_pairs_vs_base(exp) -> None:
    d = analyze(exp, n_boot=200)["breakdown"]["difficulty"]
    base = d["arms"]["base"]
    assert (base["bird"]["correct"], base["bird"]["n"]) == (4, 5)
    got = {
        c: (v["ours"]["correct"], v["ours"]["n"], v["bird"]["correct"], v["excluded"])
        for c, v in base["classes"].items()
    }
    assert got == {"simple": (1, 1, 1, 1), "moderate": (1, 2, 2, 0), "challenging": (0, 2, 1, 0)}
    assert d["arms"]["grpo"]["bird"]["correct"] == 5
    vs = d["vs_base"]["grpo"]
    assert (vs["challenging"]["diff"], vs["challenging"]["b_only"], vs["simple"]["diff"]) == (0.5, 1, 0.0)


def test_difficulty_section_in_both_reports(exp) -> None:
    paths = write_report(exp, n_boot=200)
    md = Path(paths["markdown"]).read_text(encoding="utf-8")
    assert "## BIRD metric and accuracy by BIRD difficulty" in md
    assert "| all (BIRD metric) | 80.0% (4/5) [" in md and "| moderate (BIRD) | 100.0% (2/2) [" in md
    assert "| challenging | +50.0 pp (n 2; +1 / −0) |" in md
    html = Path(paths["html"]).read_text(encoding="utf-8")
    sec = html[html.index('id="difficulty"') :]
    assert "0.0% (0/2)" in sec and "+50.0 pp (n 2; +1 / −0)" in sec


def test_a_spider_experiment_has_no_difficulty_section(tmp_path) -> None:
    e = make_experiment(tmp_path / "exp", n_tasks=6)
    assert analyze(e, n_boot=50)["breakdown"]["difficulty"] == {}
    assert "BIRD difficulty" not in Path(write_report(e, n_boot=50)["markdown"]).read_text(encoding="utf-8")
