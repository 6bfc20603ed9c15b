"""`sqlrl seeds`: one matrix run with several training seeds. Consistency checks that refuse, the per-seed
and across-seed numbers recomputed by hand from results.jsonl, the CLI's files and exit codes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from sqlrl.artifacts import read_json, read_jsonl, write_json_atomic, write_jsonl
from sqlrl.evidence.gate import SFT_MISSING
from sqlrl.evidence.seeds import render_html, render_markdown, summarize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from make_experiment import MACHINE_GPU, make_experiment  # noqa: E402

CORE = ("base", "grpo", "no_update", "validity")


def seeded(root: Path, k: int, **config) -> Path:
    """The synthetic matrix with outcome seed k and run.seed k in its resolved configuration (400 tasks,
    so the fixture's GRPO arm is ahead of both controls with p < 0.01 in every seed), its Base evaluation
    that of outcome seed 0 (greedy on the same weights: identical in every seed)."""
    d = make_experiment(root / f"seed{k}", synthetic=False, n_tasks=400, seed=k, base_seed=0)
    meta = read_json(d / "experiment.json")
    meta["config"] = {"run": {"seed": k}, "data": {"path": f"/data/{k}"}, "grpo": {"lr": 2e-6}, **config}
    meta["git"] = {"commit": "abc"}
    write_json_atomic(d / "experiment.json", meta)
    return d


def acc(d: Path, arm: str) -> list[tuple[str, int]]:
    rows = read_jsonl(d / "arms" / arm / "eval" / "results.jsonl")
    return sorted((r["task_id"], int(r["correct"])) for r in rows if r["correct"] is not None)


def test_consistent_seeds_allow_a_claim_and_numbers_match_a_hand_count(tmp_path):
    dirs = [seeded(tmp_path, k) for k in range(3)]
    s = summarize(dirs, n_boot=500)
    assert s["claim_allowed"], s["problems"]
    assert s["run_seeds"] == [0, 1, 2] and s["notes"] == []
    diffs = []
    for d, run in zip(dirs, s["runs"]):
        g, b = dict(acc(d, "grpo")), dict(acc(d, "base"))
        common = sorted(set(g) & set(b))
        want = sum(g[t] for t in common) / len(common) - sum(b[t] for t in common) / len(common)
        assert run["comparisons"]["base"]["diff"] == pytest.approx(want, abs=1e-12)
        assert run["comparisons"]["base"]["n"] == len(common)
        assert run["gate"] == "claim"
        diffs.append(want)
    a = s["across_seeds"]["base"]
    assert a["mean_diff"] == pytest.approx(sum(diffs) / 3, abs=1e-12)
    assert a["min_diff"] == pytest.approx(min(diffs)) and a["max_diff"] == pytest.approx(max(diffs))
    # the hierarchical point estimate is over the tasks scored in every run of both arms
    runs = [(dict(acc(d, "base")), dict(acc(d, "grpo"))) for d in dirs]
    tasks = sorted(set.intersection(*(set(x) & set(y) for x, y in runs)))
    want_h = sum(sum(y[t] for t in tasks) - sum(x[t] for t in tasks) for x, y in runs) / (3 * len(tasks))
    h = a["hierarchical"]
    assert h["diff"] == pytest.approx(want_h, abs=1e-12) and h["n"] == len(tasks)
    assert h["ci_low"] < h["diff"] < h["ci_high"] and h["runs_a"] == h["runs_b"] == 3
    assert s["base_evaluations_identical"] is True


def test_identical_base_evaluations_are_recognised(tmp_path):
    dirs = [seeded(tmp_path, k) for k in range(2)]
    for name in ("results.jsonl", "trajectories.jsonl"):
        src = dirs[0] / "arms" / "base" / "eval" / name
        write_jsonl(dirs[1] / "arms" / "base" / "eval" / name, read_jsonl(src))
    assert summarize(dirs, n_boot=200)["base_evaluations_identical"] is True


@pytest.mark.parametrize(
    "break_it, needle",
    [
        ("same_seed", "run.seed values are not all different"),
        ("setting", "setting differs between folders: grpo.lr"),
        ("fingerprint", "dataset fingerprints"),
        ("tasks", "task lists differ"),
        ("synthetic", "its evidence gate refused a claim"),
        ("not_ahead", "GRPO is ahead of no_update with McNemar p < 0.01 in 1 of 2 seeds"),
    ],
)
def test_inconsistent_or_weak_seeds_refuse_a_claim(tmp_path, break_it, needle):
    a, b = seeded(tmp_path, 0), seeded(tmp_path, 1)
    meta = read_json(b / "experiment.json")
    if break_it == "same_seed":
        meta["config"]["run"]["seed"] = 0
    elif break_it == "setting":
        meta["config"]["grpo"]["lr"] = 3e-6
    elif break_it == "fingerprint":
        meta["fingerprint"] = "0" * 64
    elif break_it == "tasks":
        meta["tasks"] = meta["tasks"][:-1]
    elif break_it == "synthetic":
        meta["synthetic"] = True
    elif break_it == "not_ahead":  # seed 1's GRPO answers exactly as its No-update arm
        for name in ("results.jsonl", "trajectories.jsonl"):
            src = b / "arms" / "no_update" / "eval" / name
            write_jsonl(b / "arms" / "grpo" / "eval" / name, read_jsonl(src))
    write_json_atomic(b / "experiment.json", meta)
    s = summarize([a, b], n_boot=200)
    assert not s["claim_allowed"] and s["verdict"] == "no claim"
    assert any(needle in p for p in s["problems"]), s["problems"]


def test_one_folder_is_not_a_seed_comparison_and_new_settings_are_only_noted(tmp_path):
    a = seeded(tmp_path, 0)
    s = summarize([a], n_boot=200)
    assert not s["claim_allowed"] and any("at least two" in p for p in s["problems"])
    b = seeded(tmp_path, 1, sft={"steps": 5})  # a setting a newer sqlrl added: noted, not failed
    meta = read_json(b / "experiment.json")
    meta["git"] = {"commit": "def"}
    write_json_atomic(b / "experiment.json", meta)
    s = summarize([a, b], n_boot=200)
    assert s["claim_allowed"], s["problems"]
    assert s["settings_in_some_folders_only"] == ["sft.steps"]
    assert any("2 code versions: abc, def" in n for n in s["notes"])


def test_cli_writes_files_and_exit_codes(tmp_path):
    dirs = [str(seeded(tmp_path, k)) for k in range(2)]
    run = [
        sys.executable,
        "-m",
        "sqlrl.cli",
        "seeds",
        *dirs,
        "--out",
        str(tmp_path / "out"),
        "--n-boot",
        "200",
    ]
    p = subprocess.run(run, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    s = json.loads((tmp_path / "out" / "seeds.json").read_text())
    md = (tmp_path / "out" / "seeds.md").read_text()
    assert s["verdict"] == "claim" and "Verdict across seeds: CLAIM" in md and "| no_update | 2 |" in md
    p = subprocess.run(run[:4] + [dirs[0]] + run[6:], capture_output=True, text=True)
    assert p.returncode == 1 and "at least two" in p.stdout
    p = subprocess.run(run[:4] + [dirs[0], dirs[0]] + run[6:], capture_output=True, text=True)
    assert p.returncode == 2 and f"{dirs[0]} is given twice (the same folder)" in p.stderr
    p = subprocess.run(run[:4] + [str(tmp_path / "nope"), dirs[0]] + run[6:], capture_output=True, text=True)
    assert p.returncode == 2 and "no such folder" in p.stderr


def _fake_run(calls, rc_at=None):
    """Stands in for `experiment._run` (one matrix): records the call and writes the synthetic matrix for
    the seed it was given, or returns `rc_at[seed]`."""

    def run(config, out, overrides, report, command, time_budget=None):
        seed = int(next(o for o in overrides if o.startswith("run.seed=")).split("=")[1])
        calls.append((out, list(overrides), time_budget))
        if rc_at and seed in rc_at:
            return rc_at[seed]
        d = make_experiment(out, synthetic=False, n_tasks=400, seed=seed, base_seed=0)
        meta = read_json(d / "experiment.json")
        meta["config"] = {"run": {"seed": seed}, "grpo": {"lr": 2e-6}}
        write_json_atomic(d / "experiment.json", meta)
        return 0

    return run


def test_experiment_seeds_runs_each_seed_then_the_summary(tmp_path, monkeypatch, capsys):
    import sqlrl.cli.experiment as ex

    calls: list = []
    monkeypatch.setattr(ex, "_run", _fake_run(calls))
    out = tmp_path / "exp"
    rc = ex.cli_main(
        ["cfg.toml", "--out", str(out), "--seeds", "0,1,2", "--set", "grpo.lr=2e-6", "--time-budget", "900"]
    )
    assert rc == 0
    assert [c[0] for c in calls] == [str(out / f"seed{k}") for k in range(3)]
    assert all(c[1] == ["grpo.lr=2e-6", f"run.seed={k}"] for k, c in enumerate(calls))
    assert all(c[2] is not None and 0 < c[2] <= 900 for c in calls)  # one budget shared by the seeds
    s = json.loads((out / "seeds.json").read_text())
    assert s["verdict"] == "claim" and s["run_seeds"] == [0, 1, 2]
    assert "verdict across 3 seeds: claim" in capsys.readouterr().out
    # a rerun skips the seeds whose matrix finished (experiment.json "finished") and redoes the summary
    for k in (0, 2):
        meta = read_json(out / f"seed{k}" / "experiment.json")
        meta["finished"] = "2026-11-29T00:00:00+0000"
        write_json_atomic(out / f"seed{k}" / "experiment.json", meta)
    cfg = tmp_path / "cfg.toml"
    cfg.write_text('[experiment]\narms = ["base", "grpo", "no_update", "validity"]\nturns = [1]\n')
    calls.clear()
    assert ex.cli_main([str(cfg), "--out", str(out), "--seeds", "0,1,2"]) == 0
    assert [c[0] for c in calls] == [str(out / "seed1")]
    # a finished matrix without every arm asked for now (here the 3-turn cell) is resumed, not skipped
    calls.clear()
    assert (
        ex.cli_main([str(cfg), "--out", str(out), "--seeds", "0,1,2", "--set", "experiment.turns=[1, 3]"])
        == 0
    )
    assert [c[0] for c in calls] == [str(out / f"seed{k}") for k in range(3)]


def test_experiment_seeds_stops_at_the_budget_and_refuses_bad_input(tmp_path, monkeypatch):
    import sqlrl.cli.experiment as ex

    calls: list = []
    monkeypatch.setattr(ex, "_run", _fake_run(calls, rc_at={1: 3}))
    out = tmp_path / "exp"
    assert ex.cli_main(["cfg.toml", "--out", str(out), "--seeds", "0,1,2"]) == 3  # seed 1 ran out of time
    assert len(calls) == 2 and not (out / "seeds.json").exists()
    for bad in (
        ["--seeds", "0,x"],
        ["--seeds", "1,1"],
        ["--seeds", ","],
        ["--seeds", "0,1", "--set", "run.seed=4"],
    ):
        calls.clear()
        assert ex.cli_main(["cfg.toml", "--out", str(out), *bad]) == 2
        assert calls == []


def test_no_task_scored_in_every_run_refuses_without_crashing(tmp_path):
    # each seed's GRPO arm scored a different half of the tasks: every per-seed comparison exists, but no
    # task is scored in every run
    dirs = [seeded(tmp_path, k) for k in range(2)]
    for k, d in enumerate(dirs):
        f = d / "arms" / "grpo" / "eval" / "results.jsonl"
        rows = list(read_jsonl(f))
        for i, r in enumerate(rows):
            if i % 2 == k:
                r["correct"], r["status"] = None, "infra_error"
        write_jsonl(f, rows)
    s = summarize(dirs, n_boot=200)
    assert not s["claim_allowed"]
    assert s["across_seeds"]["no_update"] == {
        "available": False,
        "reason": "no task scored in every run of both arms",
    }
    assert any("no GRPO vs no_update comparison in every folder" in p for p in s["problems"])


def test_html_summary_is_self_contained_and_escaped(tmp_path):
    from sqlrl.evidence.seeds import write_summary

    root = tmp_path / 'odd <b>"name"</b> & co'
    dirs = [seeded(root, k) for k in range(2)]
    paths = write_summary(summarize(dirs, n_boot=200), tmp_path / "out")
    html = paths["html"].read_text()
    assert html.startswith("<!doctype html>") and html.endswith("</html>")
    assert "CLAIM ACROSS SEEDS" in html and html.count("<svg") == 1
    # 3 controls x (2 seeds + the across-seed row) whiskers in the chart
    assert html.count("grpo − ") >= 9
    assert '<b>"name"</b>' not in html and "&lt;b&gt;" in html
    assert "<script" not in html and "http://" not in html and "https://" not in html
    assert paths["markdown"].read_text().startswith("# sqlrl seeds")


def test_seeds_of_a_context_axis_matrix_compare_the_first_cell(tmp_path):
    arms = tuple(f"{k}_c{c}" for c in (2048, 4096) for k in ("base", "grpo", "no_update", "validity"))
    dirs = []
    for k in range(2):
        d = make_experiment(
            tmp_path / f"seed{k}", synthetic=False, n_tasks=400, seed=k, arms=arms, base_seed=0
        )
        meta = read_json(d / "experiment.json")
        meta["config"] = {"run": {"seed": k}, "grpo": {"lr": 2e-6}}
        write_json_atomic(d / "experiment.json", meta)
        dirs.append(d)
    s = summarize(dirs, n_boot=200)
    assert s["problems"] == [] and [r["gate"] for r in s["runs"]] == ["claim", "claim"]
    for d, run in zip(dirs, s["runs"]):
        g, b = dict(acc(d, "grpo_c2048")), dict(acc(d, "base_c2048"))
        common = sorted(set(g) & set(b))
        want = sum(g[t] for t in common) / len(common) - sum(b[t] for t in common) / len(common)
        assert run["comparisons"]["base"]["diff"] == pytest.approx(want, abs=1e-12)


def _mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts, by the binomial sum."""
    k, n = min(b, c), b + c
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def with_sft(root: Path, k: int, device: dict | None = None) -> Path:
    """seeded(k) plus an sft arm (10.00 min) and a grpo_sft arm with its own 2.50 min SFT stage and
    6.00 min of GRPO: an equal-time control; `device` moves grpo_sft's two runs to another machine."""
    d = make_experiment(
        root / f"seed{k}", synthetic=False, n_tasks=400, seed=k, arms=(*CORE, "sft", "grpo_sft"), base_seed=0
    )
    meta = read_json(d / "experiment.json")
    meta["config"] = {"run": {"seed": k}}
    meta["arms"]["grpo_sft"]["init_run"] = "arms/grpo_sft/sft_init"
    write_json_atomic(d / "experiment.json", meta)
    stage = {"kind": "sft", "status": "finished", "steps": 5, "train_seconds": 150.0, "machine": MACHINE_GPU}
    write_json_atomic(d / "arms/grpo_sft/sft_init/run.json", stage)
    edits = [("arms/sft/train", {"train_seconds": 600.0})]
    if device is not None:
        edits += [
            ("arms/grpo_sft/train", {"machine": device}),
            ("arms/grpo_sft/sft_init", {"machine": device}),
        ]
    for run, new in edits:
        write_json_atomic(d / run / "run.json", {**read_json(d / run / "run.json"), **new})
    return d


def test_rl_over_sft_per_seed_needs_the_sft_control_and_p_below_001(tmp_path):
    dirs = [with_sft(tmp_path, k) for k in range(3)]
    s = summarize(dirs, n_boot=200)
    assert s["claim_allowed"], s["problems"]  # the GRPO claim is separate from RL over SFT
    for d, run in zip(dirs, s["runs"]):
        o = run["rl_over_sft"]
        assert o["allowed"] and o["line"].startswith("RL over SFT: may be claimed (")
        assert sorted(o["comparisons"]) == ["grpo", "grpo_sft"]
        sft = dict(acc(d, "sft"))
        for kind, c in o["comparisons"].items():
            g = dict(acc(d, kind))
            common = sorted(set(g) & set(sft))
            b_only = sum(1 for t in common if g[t] and not sft[t])
            a_only = sum(1 for t in common if sft[t] and not g[t])
            assert (c["n"], c["b_only"], c["a_only"]) == (len(common), b_only, a_only)
            assert c["diff"] == pytest.approx((b_only - a_only) / len(common), abs=1e-12)
            assert c["p_value"] == pytest.approx(_mcnemar_exact(b_only, a_only), rel=1e-9)
            assert c["holds"] is c["ahead"] is (b_only > a_only and c["p_value"] < 0.01)
    # by hand from results.jsonl: grpo beats sft with p < 0.01 in seeds 0 and 2 only (seed 1: 34 vs 19
    # discordant tasks, p = 0.053); grpo_sft in all three
    assert [r["rl_over_sft"]["comparisons"]["grpo"]["holds"] for r in s["runs"]] == [True, False, True]
    assert [r["rl_over_sft"]["comparisons"]["grpo"]["b_only"] for r in s["runs"]][1] == 34
    rs = s["rl_over_sft"]
    assert rs["kinds"] == {
        "grpo": {"seeds": 3, "seeds_ahead": 2, "seeds_holding": 2, "allowed": False},
        "grpo_sft": {"seeds": 3, "seeds_ahead": 3, "seeds_holding": 3, "allowed": True},
    }
    assert rs["line"] == (
        "RL over SFT across seeds: may be claimed for grpo_sft; grpo holds in 2 of 3 seeds, grpo_sft "
        "holds in 3 of 3 seeds"
    )
    assert rs["problems"] == ["grpo is ahead of sft with McNemar p < 0.01 in 2 of 3 seeds"]
    md = render_markdown(s)
    assert "## RL over SFT (the SFT-only control: a separate claim)" in md
    assert "| 1 | passed | +3.8 pp, p = 0.053 | +12.8 pp, p = 9.1e-10 (holds) |" in md


def test_rl_over_sft_fails_in_a_seed_whose_control_ran_on_another_device(tmp_path):
    h100 = {**MACHINE_GPU, "accelerator": "SYNTHETIC H100"}
    dirs = [with_sft(tmp_path, 0), with_sft(tmp_path, 1, device=h100)]
    s = summarize(dirs, n_boot=200)
    assert s["claim_allowed"], s["problems"]
    o = s["runs"][1]["rl_over_sft"]
    assert not o["allowed"] and "trained on different devices" in o["line"]
    assert o["comparisons"]["grpo_sft"]["ahead"] and not o["comparisons"]["grpo_sft"]["holds"]
    rs = s["rl_over_sft"]
    assert rs["kinds"]["grpo_sft"] == {"seeds": 2, "seeds_ahead": 2, "seeds_holding": 1, "allowed": False}
    assert rs["line"].startswith("RL over SFT across seeds: no claim; ")
    assert rs["problems"][0] == (
        "run.seed 1: RL over SFT: no claim: 'sft' vs 'grpo_sft': trained on different devices (arms/sft/train "
        "on GPU: SYNTHETIC H200; arms/grpo_sft/train on GPU: SYNTHETIC H100; arms/grpo_sft/sft_init on GPU: "
        "SYNTHETIC H100), and training times on different devices are not comparable: train 'sft' on the "
        "device 'grpo_sft' trained on (GPU: SYNTHETIC H100), or train all of these runs on one device"
    )
    assert "| 1 | no claim: 'sft' vs 'grpo_sft': trained on different devices" in render_markdown(s)
    html = render_html(s)
    assert "<h2>RL over SFT (the SFT-only control: a separate claim)</h2>" in html
    assert "no claim: &#x27;sft&#x27; vs &#x27;grpo_sft&#x27;: trained on different devices" in html


def test_rl_over_sft_without_sft_arms_is_not_answered_and_needs_consistent_folders(tmp_path):
    s = summarize([seeded(tmp_path / "a", k) for k in range(2)], n_boot=200)
    assert s["claim_allowed"] and s["rl_over_sft"] == {
        "answered": False,
        "kinds": {},
        "problems": [SFT_MISSING],
        "line": SFT_MISSING,
    }
    assert f"## RL over SFT (the SFT-only control: a separate claim)\n\n{SFT_MISSING}\n" in render_markdown(s)
    d0, d1 = with_sft(tmp_path / "b", 0), with_sft(tmp_path / "b", 1)
    meta = read_json(d1 / "experiment.json")
    meta["config"]["sft"] = {"steps": 3}  # only in seed 1's folder: noted; differing: refused
    write_json_atomic(d1 / "experiment.json", meta)
    assert summarize([d0, d1], n_boot=200)["rl_over_sft"]["kinds"]["grpo_sft"]["allowed"]
    meta = read_json(d0 / "experiment.json")
    meta["config"]["sft"] = {"steps": 4}
    write_json_atomic(d0 / "experiment.json", meta)
    rs = summarize([d0, d1], n_boot=200)["rl_over_sft"]
    assert not rs["kinds"]["grpo_sft"]["allowed"] and rs["kinds"]["grpo_sft"]["seeds_holding"] == 2
    assert rs["problems"][0] == "the folders are not one matrix with different seeds (see problems)"
