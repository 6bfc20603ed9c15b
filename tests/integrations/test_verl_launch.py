"""`sqlrl train CONFIG --engine verl`: without veRL a clear error; with veRL (.venv-verl) a validated config,
datasets and the exact main_ppo command (dry run: nothing is launched on a CPU machine)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPIDER = ROOT.parent / "shared" / "data" / "spider"
HAVE_VERL = importlib.util.find_spec("verl") is not None


def run(*args, gold_cache=None):
    env = dict(os.environ)
    if gold_cache is not None:  # the data writer's gold audit, not the user's ~/.cache
        env["SQLRL_GOLD_CACHE"] = str(gold_cache)
    return subprocess.run(
        [sys.executable, "-m", "sqlrl.cli", "train", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
    )


@pytest.mark.skipif(HAVE_VERL, reason="checks the message shown when veRL is not installed")
def test_engine_verl_without_verl_is_a_clear_error(tmp_path):
    r = run("configs/quickstart.toml", "--engine", "verl", "--out", str(tmp_path), "--dry-run")
    assert r.returncode == 2 and "scripts/verl-env.sh" in (r.stdout + r.stderr)


@pytest.mark.skipif(not HAVE_VERL, reason="veRL not importable; run scripts/verl-env.sh --test")
def test_engine_verl_dry_run_writes_a_validated_launch(tmp_path):
    if not SPIDER.is_dir():
        pytest.skip("../shared/data/spider not found")
    r = run(
        "configs/spider-0.5b-gpu.toml",
        "--set",
        f'data.path="{SPIDER}"',
        "--engine",
        "verl",
        "--out",
        str(tmp_path),
        "--dry-run",
        "--model-path",
        "/models/qwen2.5-coder-0.5b-instruct",
        gold_cache=tmp_path / "gc",
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "verl.trainer.main_ppo --config-path" in r.stdout
    for f in ("verl.yaml", "verl.agent_loops.yaml", "data/train.parquet", "data/validation.parquet"):
        assert (tmp_path / f).is_file(), f
    # unscorable golds are left out of the data, counted by reason next to it, and printed
    audit = json.loads((tmp_path / "data" / "gold_audit.json").read_text())
    for name in ("train", "validation"):
        rep = audit["splits"][name]
        assert rep["written"] + sum(rep["excluded"].values()) == rep["tasks"] and rep["excluded"]
        assert f"veRL data {name} ({name}): {rep['tasks']} tasks, {rep['written']} written" in r.stdout
    # veRL's validation refuses a batch that does not fit the GPUs, and sqlrl says so
    r = run(
        "configs/quickstart.toml",
        "--engine",
        "verl",
        "--out",
        str(tmp_path / "bad"),
        "--dry-run",
        gold_cache=tmp_path / "gc",
    )
    assert r.returncode == 2 and "veRL rejected the generated config" in r.stdout
