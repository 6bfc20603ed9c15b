"""Report sections: accuracy by Spider hardness, validation learning curve, self-consistency beside greedy."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sqlrl.artifacts import read_json, read_jsonl, write_json_atomic, write_jsonl
from sqlrl.evidence.analysis import analyze
from sqlrl.evidence.report import write_report

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from make_experiment import make_experiment  # noqa: E402

DBS = ["concert_singer", "pets_1", "car_1", "world_1", "flight_2"]  # make_experiment's, task i on DBS[i % 5]
GOLDS = [  # task i's gold and its official class
    ("SELECT count(*) FROM singer", "easy"),
    ("SELECT name FROM singer WHERE age > 20", "easy"),
    ("SELECT count(*) FROM pets", "easy"),
    ("SELECT name ,  age FROM singer ORDER BY age", "medium"),
    ("SELECT name FROM singer WHERE name LIKE '%a%'", "medium"),
    ("SELECT name FROM singer WHERE age > 20 ORDER BY age LIMIT 1", "hard"),
    ("SELECT country FROM singer WHERE age > 40 INTERSECT SELECT country FROM singer WHERE age < 30", "hard"),
    ("SELECT name FROM singer WHERE age > (SELECT avg(age) FROM singer) ORDER BY age", "extra"),
    ("SELECT name FROM singer WHERE age > (SELECT avg(age) FROM singer) LIMIT 2", "extra"),
    ("SELECT name FROM singer WHERE age > 20 OR age < 10", "medium"),
]
# greedy correctness per task (None: excluded)
BASE = [None, True, False, True, False, False, False, False, False, False]
GRPO = [None, True, True, True, True, True, False, False, True, False]
SC = [None, True, True, True, True, True, True, False, True, False]
PASS = [None, True, True, True, True, True, True, True, True, False]


def _rows(correct: list) -> list[dict]:
    return [
        {
            "task_id": f"dev/{i:05d}",
            "db_id": DBS[i % 5],
            "final_sql": "SELECT 1",
            "status": "gold_unscorable" if c is None else "match" if c else "mismatch",
            "correct": c,
            "reward": None if c is None else float(c),
        }
        for i, c in enumerate(correct)
    ]


def _edit(path: Path, **kv) -> None:
    d = read_json(path)
    d.update(kv)
    write_json_atomic(path, d)


@pytest.fixture()
def exp(tmp_path: Path) -> tuple[Path, Path]:
    """(experiment folder, its Spider data folder `dev.json`) with hand-set outcomes for base and grpo."""
    e = make_experiment(tmp_path / "exp", n_tasks=10)
    data = tmp_path / "spider"
    data.mkdir()
    ex = [{"db_id": DBS[i % 5], "question": f"q{i}", "query": g} for i, (g, _) in enumerate(GOLDS)]
    (data / "dev.json").write_text(json.dumps(ex), encoding="utf-8")
    write_jsonl(e / "arms/base/eval/results.jsonl", _rows(BASE))
    write_jsonl(e / "arms/grpo/eval/results.jsonl", _rows(GRPO))
    return e, data


def _section(text: str, sid: str) -> str:
    start = text.index(f'id="{sid}"')
    return text[start : text.index("</section>", start)]


def test_hardness_per_arm_and_paired_vs_base(exp) -> None:
    e, data = exp
    a = analyze(e, n_boot=200, data=data)
    hb = a["breakdown"]["hardness"]
    assert hb["base"]["source"] == str(data)
    # easy: tasks 1, 2 scored (task 0 excluded); medium 3, 4, 9; hard 5, 6; extra 7, 8
    assert {k: (v["n"], v["correct"], v["excluded"]) for k, v in hb["base"]["classes"].items()} == {
        "easy": (2, 1, 1),
        "medium": (3, 1, 0),
        "hard": (2, 0, 0),
        "extra": (2, 0, 0),
    }
    assert {k: v["correct"] for k, v in hb["grpo"]["classes"].items()} == {
        "easy": 2,
        "medium": 2,
        "hard": 1,
        "extra": 1,
    }
    vs = a["breakdown"]["hardness_vs_base"]["grpo"]
    assert vs["medium"]["diff"] == pytest.approx(1 / 3) and (
        vs["medium"]["b_only"],
        vs["medium"]["a_only"],
    ) == (1, 0)
    paths = write_report(e, n_boot=200, data=data)
    html = _section(Path(paths["html"]).read_text(encoding="utf-8"), "hardness")
    for cell in ("50.0% (1/2)", "33.3% (1/3)", "0.0% (0/2)", "100.0% (2/2)", "66.7% (2/3)", "1 excluded"):
        assert cell in html, cell
    assert "+33.3 pp (n 3; +1 / −0)" in html and "+50.0 pp (n 2; +1 / −0)" in html
    md = Path(paths["markdown"]).read_text(encoding="utf-8")
    assert "| medium | 33.3% (1/3) [" in md and "| +50.0 pp (n 2; +1 / −0) |" in md


def test_hardness_reads_the_data_folder_of_each_eval_run(exp) -> None:
    e, data = exp
    _edit(e / "arms/base/eval/run.json", data=str(data))
    _edit(e / "arms/grpo/eval/run.json", data=str(e / "nowhere"))
    hb = analyze(e, n_boot=200)["breakdown"]["hardness"]
    assert hb["base"]["classes"]["medium"]["n"] == 3
    assert "not found" in hb["grpo"]["unavailable"] and "--data" in hb["grpo"]["unavailable"]
    assert "records no data folder" in hb["validity"]["unavailable"]


def test_hardness_from_another_data_folder_is_refused(exp) -> None:
    e, data = exp
    ex = json.loads((data / "dev.json").read_text())
    ex[3]["db_id"] = "other_db"
    (data / "dev.json").write_text(json.dumps(ex))
    hb = analyze(e, n_boot=200, data=data)["breakdown"]["hardness"]
    assert "task dev/00003 is on 'world_1'" in hb["base"]["unavailable"]
    assert "another data folder" in hb["base"]["unavailable"]


def test_hardness_falls_back_to_the_eval_summary(exp) -> None:
    e, _ = exp
    by = {"easy": {"n": 4, "correct": 3, "accuracy": 0.75, "excluded": 0}}
    _edit(e / "arms/grpo/eval/summary.json", by_hardness=by)
    paths = write_report(e, n_boot=200)
    html = _section(Path(paths["html"]).read_text(encoding="utf-8"), "hardness")
    assert "75.0% (3/4)" in html and "grpo: from its summary.json (no CI)" in html


def test_learning_curve_and_why_an_arm_has_none(exp) -> None:
    e, _ = exp
    points = [
        {"step": 6, "execution_match": 0.375, "executable_rate": 0.5, "n": 8, "n_tasks": 10, "seconds": 1.25},
        {
            "step": 12,
            "execution_match": 0.625,
            "executable_rate": 0.875,
            "n": 8,
            "n_tasks": 10,
            "seconds": 1.5,
        },
    ]
    write_jsonl(e / "arms/grpo/train/curve.jsonl", points)
    _edit(e / "arms/no_update/train/config.json", run={"eval_every": 4})
    paths = write_report(e, n_boot=200)
    html = _section(Path(paths["html"]).read_text(encoding="utf-8"), "learning-curve")
    assert "<svg" in html
    for cells in (("6", "37.5%", "50.0%", "8/10", "1.2"), ("12", "62.5%", "87.5%", "8/10", "1.5")):
        assert "".join(f'<td class="n">{c}</td>' for c in cells[:3]) in html
    assert "validity: no curve: run.eval_every = 0" in html
    assert "no_update: no curve: run.eval_every = 4 but train/curve.jsonl holds no point" in html
    md = Path(paths["markdown"]).read_text(encoding="utf-8")
    assert "| grpo | 12 | 62.5% | 87.5% | - | 8/10 | 1.5 |" in md


def test_self_consistency_beside_greedy(exp) -> None:
    e, _ = exp
    ev = e / "arms/grpo/eval"
    summary = {"k": 4, "temperature": 0.7, "seed": 0, "n": 9, "execution_match": 7 / 9, "pass_at_k": 8 / 9}
    write_json_atomic(ev / "self_consistency.json", summary)
    rows = [
        {"task_id": f"dev/{i:05d}", "correct": c, "pass_at_k": p, "status": "x"}
        for i, (c, p) in enumerate(zip(SC, PASS))
    ]
    write_jsonl(ev / "self_consistency.jsonl", rows)
    a = analyze(e, n_boot=200)
    sc = a["breakdown"]["self_consistency"]
    assert set(sc) == {"grpo"}
    assert sc["grpo"]["accuracy"] == pytest.approx(7 / 9) and sc["grpo"]["pass_at_k"] == pytest.approx(8 / 9)
    # greedy 6/9, self-consistency 7/9 on the same 9 tasks: one task only self-consistency gets right
    assert sc["grpo"]["vs_greedy"]["n"] == 9 and sc["grpo"]["vs_greedy"]["diff"] == pytest.approx(1 / 9)
    assert sc["grpo"]["vs_greedy"]["p_value"] == pytest.approx(1.0)
    paths = write_report(e, n_boot=200)
    html = _section(Path(paths["html"]).read_text(encoding="utf-8"), "self-consistency")
    for cell in ("66.7% (n 9)", "77.8% (n 9)", "88.9%", "k 4, T 0.7", "+11.1 pp", "1.000"):
        assert cell in html, cell
    # greedy stays the headline: the accuracy section still shows the greedy figure
    acc = _section(Path(paths["html"]).read_text(encoding="utf-8"), "accuracy")
    assert "66.7% (" in acc  # grpo's greedy accuracy with its CI


def test_no_self_consistency_says_how_to_get_it(exp) -> None:
    e, _ = exp
    paths = write_report(e, n_boot=200)
    html = _section(Path(paths["html"]).read_text(encoding="utf-8"), "self-consistency")
    assert "sqlrl eval --self-consistency K" in html


def test_cli_report_data_option(exp, capsys) -> None:
    from sqlrl.cli.report import cli_main

    e, data = exp
    assert cli_main([str(e), "--data", str(e / "nowhere"), "--n-boot", "200"]) == 2
    assert "--data" in capsys.readouterr().err and not (e / "report.html").exists()
    cli_main([str(e), "--data", str(data), "--n-boot", "200"])
    assert "33.3% (1/3)" in _section((e / "report.html").read_text(encoding="utf-8"), "hardness")


def test_no_arm_with_hardness_says_why_once(exp) -> None:
    e, _ = exp
    paths = write_report(e, n_boot=200)
    html = _section(Path(paths["html"]).read_text(encoding="utf-8"), "hardness")
    assert "<table" not in html
    assert html.count("no hardness") == 1
    assert (
        "base, grpo, no_update, validity: no hardness (the eval run.json records no data folder; pass --data)"
        in html
    )


def test_curve_of_an_arm_without_train_run(exp) -> None:
    e, _ = exp
    (e / "arms/validity/train/run.json").unlink()
    curves = analyze(e, n_boot=200)["breakdown"]["curves"]
    assert curves["validity"] == {"reason": "no curve: no train run (no train/run.json)"}
    assert curves["grpo"] == {"reason": "no curve: run.eval_every = 0"}


def test_sft_arm_curve_and_grpo_sft_stage_curve(tmp_path) -> None:
    """The sft arm's train/curve.jsonl is its curve like any trained arm's; a grpo_sft arm that ran its own
    SFT stage (experiment.json init_run) shows that stage's curve as "<arm> SFT stage", in its colour; a
    grpo_sft arm that started from the sft arm's run shows no stage of its own (that is the sft arm's)."""
    e = make_experiment(tmp_path / "exp", n_tasks=10, arms=("base", "sft", "grpo_sft"))
    sft_pts = [
        {"step": 4, "execution_match": 0.5, "executable_rate": 0.75, "n": 8, "n_tasks": 10, "seconds": 2.0},
        {"step": 8, "execution_match": 0.25, "executable_rate": 0.75, "n": 8, "n_tasks": 10, "seconds": 2.0},
    ]
    write_jsonl(e / "arms/sft/train/curve.jsonl", sft_pts)
    meta = read_json(e / "experiment.json")
    meta["arms"]["grpo_sft"]["init_run"] = "arms/sft/train"
    write_json_atomic(e / "experiment.json", meta)
    curves = analyze(e, n_boot=200)["breakdown"]["curves"]
    assert curves["sft"] == {"points": sft_pts} and not any(k.endswith("SFT stage") for k in curves)
    stage = e / "arms/grpo_sft/sft_init"
    stage.mkdir()
    write_json_atomic(stage / "run.json", {"kind": "sft", "train_seconds": 10.0})
    write_jsonl(stage / "curve.jsonl", [{**sft_pts[1], "step": 6, "execution_match": 0.375}, sft_pts[0]])
    meta["arms"]["grpo_sft"]["init_run"] = "arms/grpo_sft/sft_init"
    write_json_atomic(e / "experiment.json", meta)
    a = analyze(e, n_boot=200)
    got = a["breakdown"]["curves"]["grpo_sft SFT stage"]
    assert got["of"] == "grpo_sft" and [(p["step"], p["execution_match"]) for p in got["points"]] == [
        (4, 0.5),
        (6, 0.375),
    ]
    paths = write_report(e, n_boot=200)
    html = _section(Path(paths["html"]).read_text(encoding="utf-8"), "learning-curve")
    assert html.count(a["colors"]["grpo_sft"]) >= 2  # the stage's legend entry and line take its arm's colour
    md = Path(paths["markdown"]).read_text(encoding="utf-8")
    assert "| sft | 8 | 25.0% | 75.0% | - | 8/10 | 2.0 |" in md
    assert "| grpo_sft SFT stage | 6 | 37.5% | 75.0% | - | 8/10 | 2.0 |" in md


def test_what_does_not_execute_per_arm(exp) -> None:
    """base: 3 of its 9 scored tasks did not execute (a missing column named on its row; an older folder's
    row without its message, found in its trajectory; one with neither), grpo: none; the section names
    both arms and the kinds."""
    e, _ = exp
    rows = _rows(BASE)
    rows[2].update(status="exec_error", error="no such column: T1.x")
    rows[3].update(status="exec_error", correct=False, reward=0.0)
    rows[4].update(status="exec_error", correct=False, reward=0.0)
    write_jsonl(e / "arms/base/eval/results.jsonl", rows)
    trajectories = list(read_jsonl(e / "arms/base/eval/trajectories.jsonl"))
    for t in trajectories:
        if t["task_id"] == "dev/00003":
            t["reward"] = {"status": "exec_error", "parts": {"message": "no such table: y"}}
    write_jsonl(e / "arms/base/eval/trajectories.jsonl", trajectories)
    paths = write_report(e, n_boot=200)
    md = Path(paths["markdown"]).read_text()
    part = md[md.index("## What does not execute") :]
    assert "| base | 9 | 3 (33.3%) | 0 | 0 | no such column 1, no such table 1, not recorded 1 |" in part
    assert "| grpo | 9 | 0 (0.0%) | 0 | 0 | - |" in part
    html = Path(paths["html"]).read_text()
    assert "no such column 1, no such table 1, not recorded 1" in _section(html, "nonexec")
