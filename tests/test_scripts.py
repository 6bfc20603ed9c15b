"""The shell scripts parse, gpu.sh answers an unknown command with its usage and exit code 2, and
curriculum_stats.py computes its paired tests on hand-made outcomes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "scripts").glob("*.sh")))
def test_shell_scripts_parse(script):
    r = subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_gpu_sh_usage(tmp_path):
    env = {**os.environ, "SQLRL_SCRATCH": str(tmp_path / "scratch")}
    r = subprocess.run(
        ["bash", "scripts/gpu.sh", "no-such-command"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert r.returncode == 2 and "preflight" in r.stderr and "go DEST" in r.stderr


def _results(folder: Path, solved: dict[str, list]) -> None:
    folder.mkdir(parents=True)
    with (folder / "results.jsonl").open("w") as f:
        for i, s in enumerate(solved):
            f.write(json.dumps({"task_id": f"t{i}", "solved": s}) + "\n")


def test_curriculum_stats(tmp_path):
    """Hand-made outcomes: base solves 2 of 6, sft 5 of 6 (gains t2, t3, t4; loses none); t5 excluded
    (None) for grpo-single, so sft -> grpo-single pairs 5 tasks. McNemar on 3 discordant pairs, all one
    way: p = 2 * 0.5**3 = 0.25."""
    ev = tmp_path / "evals"
    _results(ev / "base-t1", [True, True, False, False, False, False])
    _results(ev / "sft-t1", [True, True, True, True, True, False])
    _results(ev / "grpo-single-t1", [True, True, True, True, True, None])
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "curriculum_stats.py"), str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "paired_stats.json").read_text())
    got = {(x["a"], x["b"]): x for x in rows}
    assert set(got) == {("base", "sft"), ("sft", "grpo-single")}  # grpo-multi was not evaluated
    bs = got[("base", "sft")]
    assert bs["n"] == 6 and bs["mcnemar"]["n01"] == 3 and bs["mcnemar"]["n10"] == 0
    assert bs["mcnemar"]["p_value"] == pytest.approx(0.25, abs=1e-12)
    assert bs["bootstrap"]["diff"] == pytest.approx(0.5, abs=1e-12)
    assert got[("sft", "grpo-single")]["n"] == 5 and got[("sft", "grpo-single")]["mcnemar"]["discordant"] == 0
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "curriculum_stats.py")], capture_output=True)
    assert bad.returncode == 2
