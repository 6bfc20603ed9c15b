"""Report: verdict at the top, self-contained HTML, numbers equal to stats.py, renders in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

from sqlrl.artifacts import read_json, read_jsonl
from sqlrl.evidence import stats
from sqlrl.evidence.analysis import analyze
from sqlrl.evidence.report import results_table_md, write_report

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from make_experiment import make_experiment  # noqa: E402

ARMS = ("base", "grpo", "no_update", "validity", "base_t3", "grpo_t3", "no_update_t3", "validity_t3")
N_BOOT = 2000


@pytest.fixture(scope="module")
def synthetic_report(tmp_path_factory) -> tuple[Path, dict]:
    exp = make_experiment(tmp_path_factory.mktemp("r") / "exp", arms=ARMS)
    return exp, write_report(exp, n_boot=N_BOOT)


def test_writes_all_files(synthetic_report) -> None:
    exp, paths = synthetic_report
    for key in ("verdict", "markdown", "html"):
        assert Path(paths[key]).is_file() and Path(paths[key]).parent == exp
    assert paths["claim_allowed"] is False
    v = read_json(paths["verdict"])
    assert v["verdict"] == "no claim" and any("synthetic" in m for m in v["missing"])


def test_html_verdict_at_top_and_every_arm(synthetic_report) -> None:
    _, paths = synthetic_report
    text = Path(paths["html"]).read_text(encoding="utf-8")
    assert text.index("NO CLAIM") < text.index('id="accuracy"')
    assert "synthetic runs never become claims" in text
    for arm in ARMS:
        assert f">{arm}<" in text or f"{arm}</" in text, arm
    for section in ("accuracy", "paired", "repair", "training", "status", "per-db", "provenance"):
        assert f'id="{section}"' in text


def test_html_is_self_contained(synthetic_report) -> None:
    _, paths = synthetic_report
    text = Path(paths["html"]).read_text(encoding="utf-8")
    assert "<script" not in text.lower()
    assert "<link" not in text.lower()
    assert "@import" not in text and "url(" not in text
    for attr in re.findall(r'(?:src|href)\s*=\s*"([^"]*)"', text, flags=re.I):
        assert not re.match(r"(?i)^(https?:)?//", attr), attr
    assert "<svg" in text


def test_html_escapes_artifact_text(synthetic_report) -> None:
    _, paths = synthetic_report
    text = Path(paths["html"]).read_text(encoding="utf-8")
    assert "a</script><b>" not in text
    assert "a&lt;/script&gt;&lt;b&gt;" in text
    assert "v &lt; 9 AND n = &#x27;a&amp;b&#x27;" in text


def test_links_resolve_from_another_out_dir(tmp_path: Path) -> None:
    exp = make_experiment(tmp_path / "exp")
    out = tmp_path / "elsewhere" / "report"
    paths = write_report(exp, out, n_boot=200)
    text = Path(paths["html"]).read_text(encoding="utf-8")
    hrefs = [h for h in re.findall(r'href="([^"]+)"', text) if not h.startswith("#")]
    assert any(h.endswith("grpo/eval/trajectories.jsonl") for h in hrefs)
    for h in hrefs:
        assert not Path(unquote(h)).is_absolute()
        assert (out / unquote(h)).resolve().is_file(), h


def _pairs(exp: Path, a: str, b: str) -> tuple[list[int], list[int], int]:
    ra = {r["task_id"]: r for r in read_jsonl(exp / f"arms/{a}/eval/results.jsonl")}
    rb = {r["task_id"]: r for r in read_jsonl(exp / f"arms/{b}/eval/results.jsonl")}
    xs, ys, dropped = [], [], 0
    for t in sorted(set(ra) & set(rb)):
        if ra[t]["correct"] is None or rb[t]["correct"] is None:
            dropped += 1
            continue
        xs.append(int(ra[t]["correct"]))
        ys.append(int(rb[t]["correct"]))
    return xs, ys, dropped


def test_paired_stats_match_stats_module(synthetic_report) -> None:
    exp, paths = synthetic_report
    analysis = analyze(exp, n_boot=N_BOOT)
    md = Path(paths["markdown"]).read_text(encoding="utf-8")
    html_text = Path(paths["html"]).read_text(encoding="utf-8")
    expected_pairs = {
        ("base", "grpo"),
        ("base", "no_update"),
        ("base", "validity"),
        ("base_t3", "grpo_t3"),
        ("base_t3", "no_update_t3"),
        ("base_t3", "validity_t3"),
        ("no_update", "grpo"),
        ("validity", "grpo"),
        ("no_update_t3", "grpo_t3"),
        ("validity_t3", "grpo_t3"),
    }
    got = {(r["a"], r["b"]): r for r in analysis["comparisons"]}
    assert set(got) == expected_pairs
    for (a, b), row in got.items():
        xs, ys, dropped = _pairs(exp, a, b)
        boot = stats.paired_bootstrap(xs, ys, n_boot=N_BOOT, seed=0)
        mc = stats.mcnemar_exact(xs, ys)
        assert row["n"] == len(xs) and row["dropped_excluded"] == dropped
        assert row["diff"] == pytest.approx(boot["diff"], abs=0)
        assert (row["ci_low"], row["ci_high"]) == (boot["ci_low"], boot["ci_high"])
        assert row["p_value"] == mc["p_value"]
        assert (row["b_only"], row["a_only"]) == (mc["n01"], mc["n10"])
        # The same numbers are what the documents print.
        diff_txt = (
            f"{100 * boot['diff']:+.1f} pp ({100 * boot['ci_low']:+.1f} to {100 * boot['ci_high']:+.1f})"
        )
        assert diff_txt in md
        assert f"{100 * boot['ci_low']:+.1f} to {100 * boot['ci_high']:+.1f}" in html_text
        # Repair decomposition adds up exactly to the paired difference.
        rep = row["repair"]
        assert rep["repair_part"] + rep["answer_part"] == pytest.approx(boot["diff"], abs=1e-12)
    # The grpo arm has an infra_error task in the fixture: dropped from its pairs, counted.
    assert got[("base", "grpo")]["dropped_excluded"] == 2
    assert got[("base", "validity")]["dropped_excluded"] == 1


def test_lone_multi_turn_arm_falls_back_to_primary_base(tmp_path: Path) -> None:
    exp = make_experiment(tmp_path / "e", arms=("base", "grpo", "no_update", "validity", "grpo_mt"))
    analysis = analyze(exp, n_boot=200)
    row = next(r for r in analysis["comparisons"] if r["b"] == "grpo_mt" and r["a"] == "base")
    assert row["turns_differ"] is True and row["available"]
    assert not next(r for r in analysis["comparisons"] if r["b"] == "grpo" and r["a"] == "base")[
        "turns_differ"
    ]
    md = Path(write_report(exp, n_boot=200)["markdown"]).read_text(encoding="utf-8")
    assert "grpo_mt vs base (different turns)" in md


def test_accuracy_matches_stats_module(synthetic_report) -> None:
    exp, _ = synthetic_report
    analysis = analyze(exp, n_boot=N_BOOT)
    for arm in analysis["arms"]:
        recs = sorted(read_jsonl(exp / f"arms/{arm['name']}/eval/results.jsonl"), key=lambda r: r["task_id"])
        xs = [int(r["correct"]) for r in recs if r["correct"] is not None]
        ref = stats.accuracy_ci(xs, n_boot=N_BOOT, seed=0)
        assert arm["accuracy"] == {
            "value": ref["accuracy"],
            "ci_low": ref["ci_low"],
            "ci_high": ref["ci_high"],
        }
        assert arm["n"] == len(xs)
        assert arm["notes"] == []  # summary.json agrees with results.jsonl


def test_results_table_md(synthetic_report) -> None:
    exp, _ = synthetic_report
    table = results_table_md(exp, n_boot=N_BOOT)
    lines = table.strip().splitlines()
    assert lines[0] == "| arm | accuracy (95% CI) | Δ vs Base (95% CI) | McNemar p | device minutes | steps |"
    assert len(lines) == 2 + len(ARMS)
    for name in ("base", "base_t3"):
        base = next(line for line in lines if line.startswith(f"| {name} |"))
        assert base.endswith("| - | - | - | - |")
    grpo_t3 = next(line for line in lines if line.startswith("| grpo_t3 |"))
    row = analyze(exp, n_boot=N_BOOT)
    cmp_t3 = next(r for r in row["comparisons"] if (r["a"], r["b"]) == ("base_t3", "grpo_t3"))
    assert f"{100 * cmp_t3['diff']:+.1f} pp" in grpo_t3
    grpo = next(line for line in lines if line.startswith("| grpo |"))
    # 12 steps x 30 s, on the GPU the train run recorded
    assert grpo.split("|")[5].strip() == "6.0 GPU min (SYNTHETIC H200)" and grpo.split("|")[6].strip() == "12"


def test_gpu_minutes_fall_back_to_step_timings(tmp_path: Path) -> None:
    exp = make_experiment(tmp_path / "exp")
    run = read_json(exp / "arms/grpo/train/run.json")
    del run["gpu_minutes"]
    (exp / "arms/grpo/train/run.json").write_text(__import__("json").dumps(run))
    table = results_table_md(exp, n_boot=200)
    grpo = next(line for line in table.splitlines() if line.startswith("| grpo |"))
    assert grpo.split("|")[5].strip() == "~6.0 GPU min (SYNTHETIC H200)"


def test_device_minutes_name_the_cpu_of_a_cpu_run(tmp_path: Path) -> None:
    """A CPU run (no gpu_minutes; the machine may still have a GPU) is counted in CPU minutes, with the
    cores and architecture the run recorded."""
    exp = make_experiment(tmp_path / "exp")
    run = read_json(exp / "arms/grpo/train/run.json")
    del run["gpu_minutes"]
    run["device"] = "cpu"
    run["machine"] = {**run["machine"], "cpu_count": 2, "platform": "Linux-6.8.0-x86_64-with-glibc2.39"}
    (exp / "arms/grpo/train/run.json").write_text(__import__("json").dumps(run))
    paths = write_report(exp, n_boot=200)
    md = Path(paths["markdown"]).read_text(encoding="utf-8")
    grpo = next(line for line in md.splitlines() if line.startswith("| grpo |"))
    assert grpo.split("|")[5].strip() == "~6.0 CPU min (2-core x86_64)"
    html = Path(paths["html"]).read_text(encoding="utf-8")
    assert "~6.0 CPU min (2-core x86_64)" in html and "GPU min" in html  # the other arms ran on the GPU
    assert "GPU minutes" not in md and "GPU minutes" not in html


def test_claim_report_and_incomplete_report(tmp_path: Path) -> None:
    good = make_experiment(tmp_path / "good", synthetic=False)
    text = Path(write_report(good, n_boot=200)["html"]).read_text(encoding="utf-8")
    assert "CLAIM ALLOWED" in text and "NO CLAIM" not in text
    # A badly incomplete folder still gets a report that says "no claim".
    bad = make_experiment(tmp_path / "bad")
    (bad / "arms/validity/eval/results.jsonl").unlink()
    shutil.rmtree(bad / "arms/grpo/train")
    (bad / "leakage.json").unlink()
    paths = write_report(bad, n_boot=200)
    text = Path(paths["html"]).read_text(encoding="utf-8")
    assert "NO CLAIM" in text and "leakage.json missing" in text
    assert "results.jsonl missing for validity" in text


CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


def _render(binary: str, page: Path, png: Path, profile: Path) -> tuple[int, list[str]]:
    cmd = [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        f"--screenshot={png}",
        "--window-size=1200,2000",
        page.resolve().as_uri(),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    # Chromium logs every page console message (errors and uncaught exceptions included) as ":CONSOLE".
    console = [line for line in r.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    return r.returncode, console


@pytest.mark.slow
@pytest.mark.skipif(_chromium() is None, reason="no chromium binary on PATH (apt-get install -y chromium)")
def test_renders_in_headless_chromium(synthetic_report, tmp_path: Path) -> None:
    binary = _chromium()
    assert binary
    # Positive control: the console capture must see errors on a page that has them.
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body>x<script>console.error('boom'); nope();</script></body></html>")
    rc, console = _render(binary, bad, tmp_path / "bad.png", tmp_path / "profile-bad")
    assert rc == 0 and any("Uncaught" in c for c in console), (
        "console-error capture does not work with this chromium"
    )

    _, paths = synthetic_report
    png = tmp_path / "report.png"
    rc, console = _render(binary, Path(paths["html"]), png, tmp_path / "profile")
    assert rc == 0
    assert console == [], console
    assert png.is_file() and png.stat().st_size > 50_000
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1200, 2000)
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(png) as im:  # a blank or broken page has only a handful of colours
        assert len(im.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 50


def test_turn_use_counts_by_hand() -> None:
    from sqlrl.evidence.analysis import turn_use

    results = [
        {"task_id": "a", "correct": True, "reward": 1.0, "turns": 2, "stop_reason": "final"},
        {"task_id": "b", "correct": False, "reward": 0.0, "turns": 3, "stop_reason": "max_turns"},
        {"task_id": "c", "correct": True, "reward": 1.0, "turns": 3, "stop_reason": "max_turns"},
        {"task_id": "d", "correct": False, "reward": 0.0, "turns": 1, "stop_reason": "no_sql"},
        {"task_id": "x", "correct": None, "reward": None, "turns": 0, "stop_reason": None},  # excluded
    ]
    q1, q2 = "SELECT 1", "SELECT  2"
    trajs = [
        # revised after feedback (final differs from the first query), correct
        {"task_id": "a", "turns": [{"sql": q1}, {"sql": None}], "final_sql": "SELECT 2"},
        # one query repeated three times (whitespace differences do not count)
        {"task_id": "b", "turns": [{"sql": q1}, {"sql": "SELECT   1"}, {"sql": q1}], "final_sql": q1},
        # two different queries, then the first again as the answer: not revised, not repeated
        {"task_id": "c", "turns": [{"sql": q1}, {"sql": q2}, {"sql": None}], "final_sql": q1},
        {"task_id": "d", "turns": [{"sql": None}], "final_sql": None},
        {"task_id": "x", "turns": [{"sql": q1}], "final_sql": q2},
    ]
    u = turn_use(results, trajs)
    assert u["n"] == 4 and u["stop_reasons"] == {"max_turns": 2, "final": 1, "no_sql": 1}
    assert u["mean_turns"] == pytest.approx(9 / 4)
    assert (u["with_sql"], u["revised"], u["revised_correct"], u["repeated"]) == (3, 1, 1, 1)
    assert turn_use(results, None)["revised"] is None  # no trajectories: only what results.jsonl says


def test_turn_use_section_only_for_multi_turn_arms(synthetic_report) -> None:
    exp, paths = synthetic_report
    md = Path(paths["markdown"]).read_text(encoding="utf-8")
    section = md.split("## Turn use (multi-turn arms)")[1].split("## Provenance")[0]
    names = [
        line.split("|")[1].strip()
        for line in section.splitlines()
        if line.startswith("| ") and "---" not in line
    ]
    assert names[1:] == ["base_t3", "grpo_t3", "no_update_t3", "validity_t3"]  # names[0] is the header
    assert 'id="turn-use"' in Path(paths["html"]).read_text(encoding="utf-8")
    analysis = analyze(exp, n_boot=200)
    assert all((a["turn_use"] is None) == (a["turns"] == 1) for a in analysis["arms"])


def test_training_section_plots_step_and_scoring_time(synthetic_report) -> None:
    """Step time and the reward's scoring time per step are charted (the seed-3 run's scoring stall at
    step 7 is the kind of thing they show); steps.jsonl written before time_score_s existed (as this
    synthetic one) gets an honest 'not recorded' for that chart, not an empty axis."""
    _, paths = synthetic_report
    text = Path(paths["html"]).read_text(encoding="utf-8")
    training = text[text.index('id="training"') :]
    training = training[: training.index("</section>")]
    assert "step time (s)" in training and "reward scoring time (s)" in training
    scoring = training[training.index('aria-label="reward scoring time (s)"') :]
    assert scoring[: scoring.index("</svg>")].count("not recorded") == 1
    step = training[training.index('aria-label="step time (s)"') :]
    assert "not recorded" not in step[: step.index("</svg>")] and "<polyline" in step[: step.index("</svg>")]


def test_context_cells_are_compared_and_tabled_within_themselves(tmp_path: Path) -> None:
    arms = tuple(f"{k}_c{c}" for c in (2048, 4096) for k in ("base", "grpo", "no_update", "validity"))
    exp = make_experiment(tmp_path / "e", arms=(*arms, "grpo_mt"))
    analysis = analyze(exp, n_boot=200)
    assert (
        analysis["base_of"]["grpo_c4096"] == "base_c4096"
        and analysis["base_of"]["grpo_c2048"] == "base_c2048"
    )
    pairs = {(r["a"], r["b"]) for r in analysis["comparisons"]}
    assert ("no_update_c4096", "grpo_c4096") in pairs and ("no_update_c2048", "grpo_c4096") not in pairs
    # grpo_mt (turns 3, no context axis) has no base in its cell: the primary base, flagged
    lone = next(r for r in analysis["comparisons"] if r["b"] == "grpo_mt")
    assert lone["a"] == "base_c2048" and lone["turns_differ"] and lone["context_differs"]
    lines = results_table_md(analysis).strip().splitlines()
    assert lines[0].startswith("| arm | turns | context tokens | accuracy (95% CI) |")
    assert next(x for x in lines if x.startswith("| grpo_c4096 |")).startswith("| grpo_c4096 | 1 | 4096 | ")
    assert next(x for x in lines if x.startswith("| grpo_mt |")).startswith("| grpo_mt | 3 | - | ")
    md = Path(write_report(exp, n_boot=200)["markdown"]).read_text(encoding="utf-8")
    assert "grpo_mt vs base_c2048 (different turns and context)" in md
    assert "| base_c4096 | base | 1 | 4096 | `" in md  # provenance


def test_no_context_axis_keeps_the_tables(synthetic_report) -> None:
    exp, _ = synthetic_report
    md = Path(write_report(exp, n_boot=200)["markdown"]).read_text(encoding="utf-8")
    assert "context" not in md


def test_turn_use_rows_show_the_evaluation_figures_after_errors_and_by_turns() -> None:
    from sqlrl.evidence.analysis import TURN_USE_HEADERS, turn_use_rows

    u = {"n": 4, "stop_reasons": {"final": 3, "max_turns": 1}, "mean_turns": 1.75, "revised": 1}
    u.update(revised_correct=1, repeated=0)
    ev = {
        "after_error": {"n": 2, "final": 1, "rewritten": 2},
        "accuracy_by_turns": {"1": {"n": 2, "accuracy": 0.5}, "3": {"n": 2, "accuracy": 1.0}},
    }
    arms = [
        {"name": "grpo_t3", "turns": 3, "turn_use": {**u, "eval": ev}},
        {"name": "base_t3", "turns": 3, "turn_use": u},
    ]
    rows = turn_use_rows({"arms": arms})
    assert len(rows[0]) == len(TURN_USE_HEADERS)
    assert rows[0][-2:] == ["2: FINAL 1, rewritten 2", "1: 50% of 2, 3: 100% of 2"]
    assert rows[1][-2:] == ["-", "-"]  # an evaluation written before summary.json had turn_use


def test_a_passed_gate_states_each_grpo_comparison_with_its_reading(tmp_path: Path) -> None:
    """A claim is what the comparisons say: here GRPO's evaluation is Base's (copied), so every line reads
    "no difference at p < 0.01" (Δ +0.0 pp, McNemar p 1.000), never that GRPO helped."""
    exp = make_experiment(tmp_path / "exp", synthetic=False)
    for name in ("results.jsonl", "trajectories.jsonl"):
        shutil.copyfile(exp / "arms/base/eval" / name, exp / "arms/grpo/eval" / name)
    write_report(exp, n_boot=200)
    md = (exp / "report.md").read_text()
    assert "**Verdict: CLAIM ALLOWED.**" in md
    assert "- grpo vs base: +0.0 pp (+0.0 to +0.0), McNemar p 1.000: no difference at p < 0.01" in md
    assert "- grpo vs no_update: " in md and "- grpo vs validity: " in md
    assert "GRPO better" not in md
    html = (exp / "report.html").read_text()
    assert (
        "<li>grpo vs base: +0.0 pp (+0.0 to +0.0), McNemar p 1.000: no difference at p &lt; 0.01</li>" in html
    )
