"""BIRD end to end with the tiny real model (SmolLM2-135M-Instruct, fetched from PyPI on first use), on a
BIRD-layout folder built from the demo databases (tests/fixtures/make_bird.py): two GRPO steps on BIRD
train with evidence in the rollout prompts, then `sqlrl eval` of BIRD dev with both metrics and the
difficulty breakdown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sqlrl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from make_bird import make_bird  # noqa: E402

pytestmark = pytest.mark.slow
MODEL = "smollm2-135m-instruct"
QUICKSTART = Path(sqlrl.__file__).parent / "configs" / "quickstart.toml"


def sqlrl_cli(*args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "sqlrl.cli", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def test_grpo_trains_and_eval_scores_on_a_bird_folder(tmp_path):
    assert sqlrl_cli("model", "fetch", MODEL).returncode == 0
    bird = make_bird(tmp_path / "bird")
    out = tmp_path / "train"
    sets = {
        "model.name": f'"{MODEL}"',
        "model.dtype": '"float32"',
        "data.path": f'"{bird}"',
        "data.train_split": '"train.json"',
        "data.eval_split": '"dev"',
        "grpo.steps": "2",
        "grpo.prompts_per_step": "1",
        "grpo.group_size": "2",
        "agent.max_new_tokens": "24",
        "agent.max_schema_chars": "800",
        "run.device": '"cpu"',
        "run.log_rollouts": "2",
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    r = sqlrl_cli("train", str(QUICKSTART), "--out", str(out), *args)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert len(steps) == 2
    rollouts = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert rollouts and all(str(t["task_id"]).startswith("train/") for t in rollouts)
    assert any("Evidence: hint " in json.dumps(t) for t in rollouts)  # BIRD train's evidence, shown

    ev = tmp_path / "eval"
    r = sqlrl_cli(
        "eval", "--model", MODEL, "--data", str(bird), "--split", "dev", "--limit", "3",
        "--max-new-tokens", "32", "--max-schema-chars", "800", "--device", "cpu", "--out", str(ev),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((ev / "summary.json").read_text())
    assert s["n_tasks"] == 3 and s["bird_execution_match"] is not None
    assert sum(d["n"] + d["excluded"] for d in s["by_difficulty"].values()) == 3
