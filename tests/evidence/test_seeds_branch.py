"""`sqlrl seeds`' "grpo_sft vs its SFT start": the report's branch comparison per seed and across seeds.

Folders from test_branch_start (base, sft, grpo_sft; 11 tasks) with run.seed set. Seed 0 has that file's
pattern: n = 10, start 3/10 → grpo_sft 7/10, Δ = +40 pp, gained 5, lost 1, McNemar p = 0.21875, repair
part +30 pp, answer part +10 pp. Seed 1 (SEED1 below): task 10 excluded in the branch, so n = 10; start
5/10 → grpo_sft 4/10, Δ = -10 pp, gained 1 (task 3, an answer change), lost 2 (task 4 broken to an
exec_error, task 5 an answer loss), McNemar p = 2 (C(3,0) + C(3,1)) / 2^3 = 1, repair part (0 - 1) / 10 =
-10 pp, answer part (1 - 1) / 10 = 0. Across the two: mean Δ (40 - 10) / 2 = +15 pp, range -10 to +40,
one seed above and one below zero, none ahead with p < 0.01; tasks 0-9 are scored in every run of both,
so the hierarchical point estimate is (7 + 4) / 20 - (3 + 5) / 20 = +15 pp; mean repair part +10 pp,
mean answer part +5 pp.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_branch_start import _folder
from test_seeds import with_sft

from conftest import status_rows
from sqlrl.artifacts import read_json, write_json_atomic, write_jsonl
from sqlrl.evidence.seeds import render_html, render_markdown, summarize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from make_experiment import make_experiment  # noqa: E402

# (branch status, grpo_sft status) per task
SEED1 = [
    ("match", "match"),
    ("match", "match"),
    ("match", "match"),
    ("mismatch", "match"),  # gained: an answer change
    ("match", "exec_error"),  # lost: a breakage
    ("match", "mismatch"),  # lost: an answer loss
    ("exec_error", "exec_error"),
    ("exec_error", "exec_error"),
    ("mismatch", "mismatch"),
    ("mismatch", "mismatch"),
    ("infra_error", "match"),  # excluded in the branch: dropped from the pairs
]


def _set_seed(p: Path, k: int) -> Path:
    meta = read_json(p / "experiment.json")
    meta["config"] = {"run": {"seed": k}}
    write_json_atomic(p / "experiment.json", meta)
    return p


def _seed(root: Path, k: int, *, with_branch: bool = True) -> Path:
    p = _set_seed(_folder(root / f"seed{k}", with_branch=with_branch), k)
    if k == 1 and with_branch:
        write_jsonl(p / "arms/sft/branch_eval/results.jsonl", status_rows(SEED1, 0))
        write_jsonl(p / "arms/grpo_sft/eval/results.jsonl", status_rows(SEED1, 1))
    return p


def test_per_seed_rows_and_the_across_seed_summary_are_the_hand_derived_ones(tmp_path: Path) -> None:
    s = summarize([_seed(tmp_path, 0), _seed(tmp_path, 1)], n_boot=2000)
    b = s["grpo_sft_vs_sft_start"]
    r0, r1 = b["runs"]
    assert (r0["run_seed"], r0["label"]) == (0, "grpo_sft vs its SFT start (sft at step 240)")
    assert (r0["n"], r0["b_only"], r0["a_only"], r0["dropped_excluded"]) == (10, 5, 1, 1)
    assert r0["diff"] == pytest.approx(0.4) and r0["p_value"] == pytest.approx(0.21875, abs=1e-12)
    assert (r1["n"], r1["b_only"], r1["a_only"], r1["dropped_excluded"]) == (10, 1, 2, 1)
    assert (r1["mean_a"], r1["mean_b"]) == (pytest.approx(0.5), pytest.approx(0.4))
    assert r1["diff"] == pytest.approx(-0.1) and r1["p_value"] == pytest.approx(1.0)
    rep = r1["repair"]
    assert (rep["repair_gains"], rep["breakages"], rep["answer_gains"], rep["answer_losses"]) == (0, 1, 1, 1)
    assert (rep["repair_part"], rep["answer_part"]) == (pytest.approx(-0.1), pytest.approx(0.0))
    assert r0["folder"].endswith("arms/sft/branch_eval") and isinstance(r0["folder"], str)
    a = b["across"]
    assert a["available"] and a["seeds"] == 2
    assert (a["mean_diff"], a["min_diff"], a["max_diff"]) == (
        pytest.approx(0.15),
        pytest.approx(-0.1),
        pytest.approx(0.4),
    )
    assert (a["seeds_above_zero"], a["seeds_below_zero"], a["seeds_ahead_p_lt_0.01"]) == (1, 1, 0)
    h = a["hierarchical"]
    assert h["n"] == 10 and h["diff"] == pytest.approx(0.15) and h["ci_low"] <= 0.15 <= h["ci_high"]
    assert (h["mean_a"], h["mean_b"]) == (pytest.approx(0.4), pytest.approx(0.55))
    assert (a["mean_repair_part"], a["mean_answer_part"]) == (pytest.approx(0.1), pytest.approx(0.05))
    assert b["line"].startswith("grpo_sft vs its SFT start across seeds: Δ +15.0 pp (hierarchical 95% CI ")
    assert b["line"].endswith(
        ", 10 tasks); Δ > 0 in 1 of 2 seeds, ahead with p < 0.01 in 0 of 2; information, not a claim"
    )
    md = render_markdown(s)
    assert "## grpo_sft vs its SFT start (information, not a claim)" in md
    line = next(
        x for x in md.splitlines() if x.startswith("| 1 | grpo_sft vs its SFT start (sft at step 240) |")
    )
    assert " | 10 | 50.0% → 40.0% | -10.0 pp (" in line and line.endswith(
        " | 1 | 2 | 1.000 | -10.0 pp | +0.0 pp |"
    )
    assert "| 2 | +15.0 pp | -10.0 pp to +40.0 pp | 1 / 1 | 0 of 2 | +15.0 pp (" in md
    assert md.count("| +10.0 pp / +5.0 pp |  |") == 1
    html = render_html(s)
    assert (
        'id="sft-start"' in html and "grpo_sft minus its SFT start" in html and html.count("<svg") == 1
    )  # no grpo arm: no chart of GRPO vs controls


def test_folders_without_a_branch_evaluation_get_a_row_saying_why(tmp_path: Path) -> None:
    dirs = [_seed(tmp_path, 0), _seed(tmp_path, 1), _seed(tmp_path, 2, with_branch=False)]
    own = _set_seed(_folder(tmp_path / "seed3"), 3)  # grpo_sft with its own SFT stage
    meta = read_json(own / "experiment.json")
    meta["arms"]["grpo_sft"]["init_run"] = "arms/grpo_sft/sft_init"
    write_json_atomic(own / "experiment.json", meta)
    old = _set_seed(_folder(tmp_path / "seed4", with_branch=False), 4)  # start not recorded
    meta = read_json(old / "experiment.json")
    del meta["arms"]["grpo_sft"]["init_run"]
    write_json_atomic(old / "experiment.json", meta)
    other = _set_seed(_folder(tmp_path / "seed5"), 5)  # a branch of another step than grpo_sft's start
    run = read_json(other / "arms/grpo_sft/train/run.json")
    run["init_sft"]["step"] = 100
    write_json_atomic(other / "arms/grpo_sft/train/run.json", run)
    b = summarize([*dirs, own, old, other], n_boot=200)["grpo_sft_vs_sft_start"]
    assert [r["available"] for r in b["runs"]] == [True, True, False, False, False, False]
    why = [r.get("reason") for r in b["runs"][2:]]
    assert why == [
        "no branch evaluation of sft (no run.json in arms/sft/branch_eval)",
        "grpo_sft started from arms/grpo_sft/sft_init (its own SFT stage), not from an sft arm's training run",
        "grpo_sft's start is not recorded (no init_run in experiment.json)",
        "grpo_sft started from step 100, the evaluated branch is step 240",
    ]
    assert all("diff" not in r and r["n"] == 0 for r in b["runs"][2:])
    assert b["across"] == {
        "available": False,
        "reason": "; ".join(f"run.seed {k}: {w}" for k, w in zip((2, 3, 4, 5), why)),
    }
    assert b["line"] == f"grpo_sft vs its SFT start across seeds: no numbers ({b['across']['reason']})"
    md = render_markdown(summarize(dirs, n_boot=200))
    assert "| 2 | grpo_sft vs its SFT start | 0 | - | - | - | - | - | - | no branch evaluation of sft" in md
    assert "| - | - | - | - | - | - | - | - | run.seed 2: no branch evaluation of sft" in md
    # no grpo_sft arm at all (the core matrix): a row per seed, no chart
    plain = [_set_seed(make_experiment(tmp_path / f"core{k}", synthetic=False, seed=k), k) for k in range(2)]
    s = summarize(plain, n_boot=200)
    assert [r["reason"] for r in s["grpo_sft_vs_sft_start"]["runs"]] == ["no grpo_sft arm"] * 2
    assert render_html(s).count("<svg") == 1


def _branch_from_sft(d: Path) -> Path:
    """with_sft's folder with grpo_sft started from the sft arm's run at step 240, whose branch evaluation
    gave exactly the sft arm's own answers."""
    shutil.copytree(d / "arms/sft/eval", d / "arms/sft/branch_eval")
    meta = read_json(d / "experiment.json")
    meta["arms"]["grpo_sft"]["init_run"] = "arms/sft/train"
    meta["arms"]["sft"].update(branch_eval_run="arms/sft/branch_eval", branch_step=240)
    write_json_atomic(d / "experiment.json", meta)
    run = read_json(d / "arms/grpo_sft/train/run.json")
    run["init_sft"] = {"run": "arms/sft/train", "step": 240}
    write_json_atomic(d / "arms/grpo_sft/train/run.json", run)
    return d


def test_the_verdict_and_exit_code_do_not_read_it(tmp_path: Path) -> None:
    before = summarize([with_sft(tmp_path, k) for k in range(2)], n_boot=200)
    dirs = [_branch_from_sft(with_sft(tmp_path / "b", k)) for k in range(2)]
    after = summarize(dirs, n_boot=200)
    assert before["claim_allowed"] and after["claim_allowed"]
    assert (after["verdict"], after["problems"]) == (before["verdict"], before["problems"])
    # the branch answered as the sft arm: the same pairs as RL over SFT's grpo_sft vs sft
    for row, run in zip(after["grpo_sft_vs_sft_start"]["runs"], after["runs"]):
        c = run["rl_over_sft"]["comparisons"]["grpo_sft"]
        assert row["available"] and (row["n"], row["b_only"], row["a_only"]) == (
            c["n"],
            c["b_only"],
            c["a_only"],
        )
        assert row["diff"] == pytest.approx(c["diff"], abs=1e-12)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "sqlrl.cli", "seeds", *map(str, dirs), "--out", str(out), "--n-boot", "200"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "grpo_sft vs its SFT start across seeds: Δ " in p.stdout
    s = json.loads((out / "seeds.json").read_text())
    assert s["grpo_sft_vs_sft_start"]["across"]["seeds"] == 2
    assert "## grpo_sft vs its SFT start" in (out / "seeds.md").read_text()
    html = (out / "seeds.html").read_text()
    assert 'id="sft-start"' in html and html.count("<svg") == 2 and html.endswith("</html>")
