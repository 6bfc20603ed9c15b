"""Supervised fine-tuning on text-to-SQL training golds (the `sft` arm's training), on CPU.

The embedded Spider demo slice (train: 7 databases, validation: driving_school), the byte-level test
tokenizer and the tiny random Qwen2 of test_trainer.py; the SmolLM2-135M run is marked slow.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from sqlrl import config as C
from sqlrl import config_tables as T
from sqlrl.agent.loop import Budgets
from sqlrl.agent.prompts import ChatFormat, Parser, build_messages
from sqlrl.generation.scripted import make_chat_tokenizer
from sqlrl.tasks.data import PrivateTask, SpiderData, embedded_root
from sqlrl.training.sft_data import (
    build_text2sql_examples,
    check_reference_databases,
    text2sql_target_text,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_trainer import tiny_factory  # noqa: E402

SINGLE = Budgets(turns=1, max_new_tokens=256, max_context_tokens=30000, max_schema_chars=300)


@pytest.fixture(scope="module")
def train_tasks():
    return SpiderData(embedded_root()).load("train")[:12]


def test_target_is_the_gold_in_one_sql_block_and_round_trips_through_the_agent_parser(train_tasks):
    assert (
        text2sql_target_text(" SELECT vehicle_id FROM Vehicles; ")
        == "```sql\nSELECT vehicle_id FROM Vehicles\n```"
    )
    tok = make_chat_tokenizer()
    examples, dropped = build_text2sql_examples(train_tasks, tok, SINGLE)
    assert len(examples) == 12 and dropped == {}
    first = train_tasks[0]
    assert first.gold_sql == "SELECT count(DISTINCT allergy) FROM Allergy_type"
    text = tok.decode(examples[0]["target_ids"], skip_special_tokens=True)
    assert text == "```sql\nSELECT count(DISTINCT allergy) FROM Allergy_type\n```"
    for t, e in zip(train_tasks, examples):
        text = tok.decode(e["target_ids"], skip_special_tokens=True)
        act = Parser.parse(text, multi_turn=False)
        assert act.kind == "final" and act.sql == t.gold_sql.strip().rstrip(";").strip()
        assert e["target_ids"][-1] == tok.eos_token_id  # ends as a generation that stops
        # exactly the text-to-SQL agent's single-turn prompt
        want = ChatFormat(tok).prompt_ids(build_messages(t.public, turns=1, max_schema_chars=300))
        assert e["prompt_ids"] == want and e["task_id"] == t.task_id


def test_examples_that_do_not_round_trip_or_fit_are_dropped_and_counted(train_tasks):
    tok = make_chat_tokenizer()
    pub = train_tasks[0].public
    odd = [
        PrivateTask(public=pub, gold_sql="SELECT 1 ```sql SELECT 2"),  # parser reads another SQL
        PrivateTask(public=pub, gold_sql="  ;  "),  # nothing to learn
        PrivateTask(public=pub, gold_sql="SELECT 1"),
    ]
    _, dropped = build_text2sql_examples(odd, tok, SINGLE)
    assert dropped == {"format_roundtrip": 1, "no_gold": 1}
    # "```sql\nSELECT 1\n```" is 19 bytes (+ end of turn) with the byte-level tokenizer
    _, dropped = build_text2sql_examples(odd[2:], tok, dataclasses.replace(SINGLE, max_new_tokens=19))
    assert dropped == {"answer_over_max_new_tokens": 1}
    with pytest.raises(C.ConfigError, match="single-turn"):
        build_text2sql_examples(odd, tok, dataclasses.replace(SINGLE, turns=3))


def test_reference_check_refuses_equal_splits_and_shared_databases():
    check_reference_databases({"a", "b"}, {"c"}, train_split="train", eval_split="validation")
    with pytest.raises(ValueError, match="different splits"):
        check_reference_databases({"a"}, {"c"}, train_split="train", eval_split="train")
    with pytest.raises(ValueError, match=r"\['b'\].*split must be by database"):
        check_reference_databases({"a", "b"}, {"b", "c"}, train_split="train", eval_split="dev")


def _cfg(**data):
    return C.from_dict(
        {
            "model": {"name": "tiny"},
            "data": {"kind": "text2sql", "path": "embedded", "max_train_tasks": 4, **data},
            "agent": {"max_new_tokens": 256, "max_schema_chars": 300, "max_context_tokens": 4096},
            "run": {"device": "cpu", "checkpoint_every": 1, "loggers": [], "sandbox_workers": 1},
        }
    )


def test_sft_on_text2sql_golds_moves_weights_and_records_the_run(tmp_path):
    from sqlrl.training.sft import train_sft

    sft = T.sft_from_dict({"steps": 2, "batch_size": 2, "micro_batch": 1, "lr": 1e-3})
    res = train_sft(_cfg(), sft, tmp_path / "sft", policy_factory=tiny_factory, progress=False)
    assert res["finished"] and res["weights_changed"]
    run = json.loads((tmp_path / "sft" / "run.json").read_text())
    assert run["data_kind"] == "text2sql" and run["examples"] == 4 and run["train_tasks"] == 4
    assert run["gold_audit"]["n"] == 664 and "per_task" not in run["gold_audit"]
    assert run["dropped"].get("gold_unscorable", 0) == 664 - run["gold_audit"]["scorable"]
    assert isinstance(run["train_seconds"], float) and run["gpu_minutes"] is None  # CPU run
    split = json.loads((tmp_path / "sft" / "split.json").read_text())
    assert split["eval_db_ids"] == ["driving_school"] and "driving_school" not in split["train_db_ids"]
    assert len(split["task_ids"]) == 4


def test_sft_on_text2sql_refuses_the_evaluation_split_before_loading_a_model(tmp_path):
    from sqlrl.training.sft import train_sft

    with pytest.raises(ValueError, match="different splits"):
        train_sft(
            _cfg(eval_split="train"),
            T.sft_from_dict({}),
            tmp_path / "r",
            policy_factory=lambda: pytest.fail("model loaded"),
            progress=False,
        )
    with pytest.raises(C.ConfigError, match="submit_turns"):
        train_sft(
            _cfg(),
            T.sft_from_dict({"submit_turns": 3}),
            tmp_path / "r2",
            policy_factory=lambda: pytest.fail("model loaded"),
            progress=False,
        )


def test_sft_checkpoint_interval_is_its_own_and_old_run_folders_still_resume(tmp_path):
    from sqlrl.training.checkpoint import load_latest
    from sqlrl.training.runfolder import config_changes
    from sqlrl.training.sft import train_sft

    sft = T.sft_from_dict({"steps": 3, "batch_size": 2, "micro_batch": 2, "lr": 1e-3, "checkpoint_every": 2})
    cfg = _cfg().replace(run={"keep_checkpoints": 5})
    train_sft(cfg, sft, tmp_path / "s", policy_factory=tiny_factory, progress=False, stop_after=2)
    assert load_latest(tmp_path / "s").step == 2  # run.checkpoint_every = 1 would also have saved step 1
    assert sorted(p.name for p in (tmp_path / "s" / "checkpoints").iterdir() if p.is_dir()) == ["step_000002"]
    # a run folder written before sft.checkpoint_every existed resumes (it behaved as 0)
    assert config_changes({"sft": {"steps": 3}}, {"sft": {"steps": 3, "checkpoint_every": 0}}) == ([], [])
    with pytest.raises(C.ConfigError, match="checkpoint_every = -1"):
        T.sft_from_dict({"checkpoint_every": -1})


@pytest.mark.slow
def test_sft_with_smollm2_lowers_the_target_loss_and_moves_weights(tmp_path):
    """SmolLM2-135M-Instruct (fetched on first use), 4 training golds of the embedded slice, 6 steps of
    LoRA (rank 16; a full fine-tune's AdamW state would take this CPU test over 3 GB), merged at export."""
    import torch

    from sqlrl.generation.models import load_model
    from sqlrl.training.sft import answer_loss_sum, collate

    cfg = _cfg(max_train_tasks=4).replace(model={"name": "smollm2-135m-instruct", "lora_rank": 16})
    sft = T.sft_from_dict({"steps": 6, "batch_size": 4, "micro_batch": 1, "lr": 2e-3})
    from sqlrl.training.sft import train_sft

    res = train_sft(cfg, sft, tmp_path / "sft", progress=False)
    assert res["finished"] and res["weights_changed"]

    def loss(name: str) -> float:
        m = load_model(name, device="cpu", dtype="float32")
        tasks = [
            t
            for t in SpiderData(embedded_root()).load("train")
            if t.task_id in json.loads((tmp_path / "sft" / "split.json").read_text())["task_ids"]
        ]
        examples, _ = build_text2sql_examples(tasks, m.tokenizer, Budgets.from_config(cfg.agent))
        assert len(examples) == 4
        with torch.no_grad():
            total, n, _ = answer_loss_sum(m.model, *collate(examples, m.tokenizer.eos_token_id, "cpu"))
        return float(total) / n

    before, after = loss("smollm2-135m-instruct"), loss(res["final"])
    assert after < 0.5 * before, (before, after)
    steps = [json.loads(x) for x in (tmp_path / "sft" / "steps.jsonl").read_text().splitlines()]
    assert steps[-1]["loss"] < steps[0]["loss"]


def test_sft_resume_refuses_examples_other_than_the_ones_it_trained_on(tmp_path):
    """run.json records the examples' hash; a resume whose freshly built examples differ (a multi-turn
    trace's live observation, changed data) would let the checkpoint's sampler point at other examples,
    so it stops with a config error; the same examples resume to the end."""
    from sqlrl.training.sft import examples_hash, train_sft

    sft = T.sft_from_dict({"steps": 3, "batch_size": 2, "micro_batch": 2, "lr": 1e-3, "checkpoint_every": 1})
    out = tmp_path / "s"
    train_sft(_cfg(), sft, out, policy_factory=tiny_factory, progress=False, stop_after=2)
    run = json.loads((out / "run.json").read_text())
    assert run["examples_hash"].startswith("sha256:")
    # the hash follows the token ids: one changed id changes it
    e = [{"task_id": "t", "format": "single", "prompt_ids": [1, 2], "target_ids": [3]}]
    assert examples_hash(e) != examples_hash([{**e[0], "target_ids": [4]}])
    good = run["examples_hash"]
    (out / "run.json").write_text(json.dumps({**run, "examples_hash": "sha256:other"}))
    with pytest.raises(C.ConfigError, match="SFT examples built now differ"):
        train_sft(_cfg(), sft, out, resume=True, policy_factory=tiny_factory, progress=False)
    (out / "run.json").write_text(json.dumps({**run, "examples_hash": good}))
    res = train_sft(_cfg(), sft, out, resume=True, policy_factory=tiny_factory, progress=False)
    assert res["finished"]
