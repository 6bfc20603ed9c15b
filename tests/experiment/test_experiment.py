"""The experiment matrix end to end on CPU with a tiny random model saved as a local Hugging Face folder.

The model cannot write SQL, so every arm scores 0 and the gate must say "no claim"; the point is
that every artifact the gate and the report need is produced, linked and consistent, and that a
second invocation resumes (skips finished arms) instead of redoing them.
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

import pytest

from sqlrl import config as C
from sqlrl.experiment.matrix import ExperimentConfig, run_experiment


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> str:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from sqlrl.generation.scripted import make_chat_tokenizer

    tok = make_chat_tokenizer()
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = Qwen2ForCausalLM(cfg).float()
    out = tmp_path_factory.mktemp("tiny") / "tiny-qwen2"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def test_matrix_end_to_end_and_resume(tiny_model_dir, tmp_path, caplog):
    cfg = C.from_dict(
        {
            "model": {"name": tiny_model_dir},
            "data": {"path": "embedded", "max_train_tasks": 6, "max_eval_tasks": 4},
            "agent": {"max_new_tokens": 8, "max_schema_chars": 300, "max_context_tokens": 2048},
            "grpo": {"steps": 1, "prompts_per_step": 2, "group_size": 2, "micro_batch": 4},
            "run": {"device": "cpu", "loggers": [], "sandbox_workers": 1, "checkpoint_every": 1},
        }
    )
    exp = ExperimentConfig(name="tiny", leakage_tasks=2, smoke=True)
    out = tmp_path / "exp"
    # progress lines are log records of the matrix (the CLI prints them on stderr); the handler sits on the
    # module's logger because an in-process `sqlrl.cli.main` stops propagation at the `sqlrl` logger
    matrix_log = logging.getLogger("sqlrl.experiment.matrix")
    caplog.set_level(logging.INFO, logger="sqlrl")
    progress_log = logging.getLogger("sqlrl.progress")  # the progress line, as log records off a terminal
    matrix_log.addHandler(caplog.handler)
    progress_log.addHandler(caplog.handler)
    try:
        run_experiment(cfg, exp, out, report=True)
    finally:
        matrix_log.removeHandler(caplog.handler)
        progress_log.removeHandler(caplog.handler)
    progress = caplog.messages
    assert f"[experiment] grpo: training -> {out / 'arms' / 'grpo' / 'train'}" in progress
    assert f"[experiment] base: evaluating on 4 tasks -> {out / 'arms' / 'base' / 'eval'}" in progress
    lines = [m for m in progress if m.startswith("[tiny] ")]
    # each part's first and last line: arm i of 4, its unit s of S, elapsed, ETA over the whole plan (a
    # lower bound while a kind of unit left to do, here training steps, has not been timed)
    assert re.fullmatch(
        r"\[tiny\] arm 1 of 4 base: evaluate task 0 of 4 \| 0:\d\d elapsed \| ETA \?", lines[0]
    )
    assert any(
        re.match(r"\[tiny\] arm 2 of 4 grpo: train step 0 of 1 \| \d+:\d\d elapsed \| ETA >= ", x)
        for x in lines
    )
    assert any(
        re.match(r"\[tiny\] arm 4 of 4 validity: evaluate task 4 of 4 \| .* \| ETA \d+:\d\d", x)
        for x in lines
    )
    assert re.match(r"\[tiny\] leakage audit \(turns 1\): task 4 of 4 \| .* \| ETA 0:00$", lines[-1])
    e = json.loads((out / "experiment.json").read_text())
    assert set(e["arms"]) == {"base", "grpo", "no_update", "validity"} and e["finished"]
    assert len(e["tasks"]) == 4 and e["fingerprint"]
    for name, arm in e["arms"].items():
        s = json.loads((out / arm["eval_run"] / "summary.json").read_text())
        assert s["n_tasks"] == 4 and s["budgets"] == arm["budgets"] and s["fingerprint"] == e["fingerprint"]
        assert (out / arm["eval_run"] / "trajectories.jsonl").stat().st_size > 0
        if name != "base":
            assert json.loads((out / arm["train_run"] / "run.json").read_text())["status"] == "finished"
    # every arm evaluated the same locked tasks
    ids = {
        n: [
            json.loads(x)["task_id"] for x in (out / a["eval_run"] / "results.jsonl").read_text().splitlines()
        ]
        for n, a in e["arms"].items()
    }
    assert len({tuple(v) for v in ids.values()}) == 1
    leak = json.loads((out / "leakage.json").read_text())
    assert leak["passed"] and leak["tasks"] == 2
    wa = json.loads((out / "weights_audit.json").read_text())
    assert wa["verdicts"]["no_update_identical"] is True and wa["verdicts"]["reloaded_identity"] is True
    # No-update stores its tensor hashes (checked by the audit), not a second copy; the trained arms their weights
    assert wa["sources"]["no_update"]["kind"] == "hashes"
    assert [p.name for p in (out / "arms" / "no_update" / "train" / "final").iterdir()] == ["identity.json"]
    for arm in ("grpo", "validity"):  # dense, or a patch over the base when smaller
        final = out / "arms" / arm / "train" / "final"
        assert (final / "model.safetensors").is_file() or (final / "patch.safetensors").is_file()
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["claim_allowed"] is False  # a smoke run never becomes a claim
    assert any("smoke" in m for m in verdict["missing"])
    html = (out / "report.html").read_text()
    assert "no claim" in html.lower() and "validity" in html
    # resumable: a second run finds every arm finished and does not train or evaluate again
    t0 = time.perf_counter()
    mtime = (out / "arms" / "grpo" / "eval" / "summary.json").stat().st_mtime
    caplog.clear()
    matrix_log.addHandler(caplog.handler)
    try:
        run_experiment(cfg, exp, out, report=False)
    finally:
        matrix_log.removeHandler(caplog.handler)
    assert "[experiment] grpo: training finished before, kept" in caplog.messages
    assert "[experiment] base: evaluation finished before, kept" in caplog.messages
    assert (out / "arms" / "grpo" / "eval" / "summary.json").stat().st_mtime == mtime
    assert time.perf_counter() - t0 < 60
    # a memory-only setting (how updates are split into passes) may change on resume: recorded, no retraining
    mem = cfg.replace(grpo={"micro_batch_logit_tokens": 64})
    caplog.clear()
    matrix_log.addHandler(caplog.handler)
    try:
        run_experiment(mem, exp, out, report=False)
    finally:
        matrix_log.removeHandler(caplog.handler)
    assert "[experiment] resuming with ['grpo.micro_batch_logit_tokens: 0 -> 64']" in caplog.messages
    e = json.loads((out / "experiment.json").read_text())
    assert e["resume_changes"][-1]["changes"] == ["grpo.micro_batch_logit_tokens: 0 -> 64"]
    assert (out / "arms" / "grpo" / "eval" / "summary.json").stat().st_mtime == mtime
    # anything else is refused, naming the setting
    with pytest.raises(C.ConfigError, match=r"different config \(differs in \['grpo.lr'\]"):
        run_experiment(mem.replace(grpo={"lr": 0.5}), exp, out, report=False)


def test_experiment_refuses_a_changed_config(tiny_model_dir, tmp_path):
    out = tmp_path / "exp"
    out.mkdir()
    (out / "experiment.json").write_text(json.dumps({"config": {"grpo": {"steps": 99}}}))
    cfg = C.from_dict({"model": {"name": tiny_model_dir}, "run": {"device": "cpu"}})
    with pytest.raises(C.ConfigError, match="different config"):
        run_experiment(cfg, ExperimentConfig(), out)


def test_unknown_arm_is_a_config_error(tmp_path):
    from sqlrl.experiment.matrix import load_experiment

    p = tmp_path / "e.toml"
    p.write_text("[experiment]\narms = ['base', 'magic']\n")
    with pytest.raises(C.ConfigError, match="unknown arm 'magic'"):
        load_experiment(p)
    assert Path(p).exists()


def test_disk_needed_counts_stored_arms_and_checkpoints():
    from sqlrl.experiment.matrix import disk_needed

    exp = ExperimentConfig(name="q")  # base, grpo, no_update, validity; one turn budget
    p = 1_000_000_000  # float32 weights 4 GB, a checkpoint (weights + AdamW m and v) 12 GB

    def need(**run):
        cfg = C.from_dict({"grpo": {"steps": 2}, "run": run})
        return disk_needed(cfg, exp, p)[0]

    # No-update stores hashes: GRPO and validity-only store 4 GB each, + 0.2 GB logs
    assert need(checkpoint_every=2, prune_checkpoints_at_end=True) == 8_200_000_000
    # one checkpoint after step 1 (the last one is replaced by the final export)
    assert need(checkpoint_every=1, keep_checkpoints=1, prune_checkpoints_at_end=True) == 20_200_000_000
    # kept checkpoints: 2 at each step while training, 2 left by each of the 2 earlier trained arms
    assert need(checkpoint_every=1, keep_checkpoints=2, prune_checkpoints_at_end=False) == 80_200_000_000


def test_disk_needed_counts_finals_in_their_dtype():
    """Finals are stored in the generation dtype when it is surely bfloat16 (at most 2 bytes a parameter:
    the quickstart's case), in float32 otherwise or with run.final_dtype = "float32"."""
    from sqlrl.experiment.matrix import disk_needed

    exp = ExperimentConfig(name="q")  # GRPO and validity-only store finals
    p = 1_000_000_000
    run = {"checkpoint_every": 2, "prune_checkpoints_at_end": True}

    def need(model, **more):
        cfg = C.from_dict({"grpo": {"steps": 2}, "model": model, "run": {**run, **more}})
        return disk_needed(cfg, exp, p)

    assert need({"dtype": "bfloat16"})[0] == 4_200_000_000
    assert "bfloat16" in need({"dtype": "bfloat16"})[1]
    assert need({"dtype": "auto"}, device="cuda")[0] == 4_200_000_000
    assert need({"dtype": "auto"})[0] == 8_200_000_000  # device auto: maybe a CPU, float32
    assert need({"dtype": "bfloat16"}, final_dtype="float32")[0] == 8_200_000_000


def test_quickstart_refuses_a_full_disk_before_writing(tiny_model_dir, tmp_path, monkeypatch, capsys):
    import shutil

    from sqlrl.cli.experiment import cli_quickstart

    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**12, 10**12 - 1000, 1000))
    out = tmp_path / "runs" / "q"
    rc = cli_quickstart(["--out", str(out), "--set", f"model.name={tiny_model_dir!r}".replace("'", '"')])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert f"not enough free disk for {out}" in err and "0.0 GB are free" in err
    assert "2 stored arm(s)" in err
    assert not out.exists()  # the run lock removes the folder it created
