"""Supervised warm start, the staged curriculum and evaluation by category on debugging tasks.

CPU only: the embedded demo tasks, the byte-level test tokenizer, a scripted policy for evaluation and
the tiny random Qwen2 of test_trainer.py for real optimizer steps. The SmolLM2 end-to-end run is in
test_e2e_curriculum.py (slow).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from sqlrl import config as C
from sqlrl import config_tables as T
from sqlrl.agent.debugging import parse_debug_action
from sqlrl.agent.loop import Budgets
from sqlrl.evaluation.debugging import category_table
from sqlrl.generation.scripted import ScriptedPolicy, make_chat_tokenizer
from sqlrl.tasks.debug_episode import run_episode_offline
from sqlrl.tasks.debugging import debug_demo_root, load_debug_tasks
from sqlrl.training.sft import (
    build_sft_examples,
    check_training_references,
    collate,
    expected_submission,
    sft_target_text,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_trainer import tiny_factory  # noqa: E402

SINGLE = Budgets(turns=1, max_new_tokens=256, max_context_tokens=30000, max_schema_chars=300)


@pytest.fixture(scope="module")
def demo():
    return load_debug_tasks(debug_demo_root() / "debug_tasks.jsonl")


def _resplit(tasks, val_db: str):
    return [
        dataclasses.replace(t, split="validation" if t.public.db_id == val_db else "train") for t in tasks
    ]


def test_sft_target_is_what_the_single_turn_parser_accepts_and_it_solves(demo):
    tok = make_chat_tokenizer()
    examples, dropped = build_sft_examples(demo, tok, SINGLE)
    assert len(examples) == len(demo) and dropped == {}
    for t, e in zip(demo, examples):
        text = tok.decode(e["target_ids"], skip_special_tokens=True)
        assert text == sft_target_text(t)
        sub = parse_debug_action(text, multi_turn=False, category=t.category).submission
        assert sub == expected_submission(t)
        assert run_episode_offline(t, list(sub))["status"] == "solved"
        # the target ends with the chat template's end-of-turn token, as a generation that stops would
        assert e["target_ids"][-1] == tok.eos_token_id
        # the prompt is exactly the agent's single-turn prompt
        from sqlrl.agent.debugging import build_debug_messages
        from sqlrl.agent.prompts import ChatFormat

        assert e["prompt_ids"] == ChatFormat(tok).prompt_ids(build_debug_messages(t.public, SINGLE))


def test_sft_drops_answers_over_the_budget_and_refuses_multi_turn(demo):
    tok = make_chat_tokenizer()
    _, dropped = build_sft_examples(demo, tok, dataclasses.replace(SINGLE, max_new_tokens=16))
    assert dropped == {"answer_over_max_new_tokens": len(demo)}
    with pytest.raises(C.ConfigError, match="single-turn"):
        build_sft_examples(demo, tok, dataclasses.replace(SINGLE, turns=3))


def test_sft_submit_format_teaches_the_multi_turn_protocol(demo, tmp_path):
    """sft.submit_turns = 3: every reference a second time, after the agent's own 3-turn prompt, answered
    SUBMIT + the solution; the real debugging agent, replaying that answer, submits in its first turn and
    solves the task (the single-turn answer would have been read as execute_sql)."""
    from sqlrl.agent.debugging import (
        ACTION_EXECUTE,
        ACTION_SUBMIT,
        build_debug_messages,
        run_debug_agent,
        score_debug_trajectories,
    )
    from sqlrl.agent.prompts import ChatFormat
    from sqlrl.sql.replicas import ReplicaPool

    tok = make_chat_tokenizer()
    examples, dropped = build_sft_examples(demo, tok, SINGLE, submit_turns=3)
    assert dropped == {} and len(examples) == 2 * len(demo)
    single = [e for e in examples if e["format"] == "single"]
    submit = [e for e in examples if e["format"] == "submit"]
    assert single == build_sft_examples(demo, tok, SINGLE)[0]  # the single-turn examples are unchanged
    multi = dataclasses.replace(SINGLE, turns=3)
    for t, e, e1 in zip(demo, submit, single):
        assert e["task_id"] == t.task_id
        assert e["prompt_ids"] == ChatFormat(tok).prompt_ids(build_debug_messages(t.public, multi))
        text = tok.decode(e["target_ids"], skip_special_tokens=True)
        assert text == "SUBMIT\n" + sft_target_text(t)
        act = parse_debug_action(text, multi_turn=True, category=t.category)
        assert act.kind == ACTION_SUBMIT and act.submission == expected_submission(t)
        single_text = tok.decode(e1["target_ids"], skip_special_tokens=True)
        assert parse_debug_action(single_text, multi_turn=True, category=t.category).kind == ACTION_EXECUTE
    by_description = {
        t.public.description: tok.decode(e["target_ids"], skip_special_tokens=True)
        for t, e in zip(demo, submit)
    }

    def script(prompt: str, turn: int) -> str:
        return next(reply for d, reply in by_description.items() if d in prompt)

    picked = demo[:6]
    templates = {t.public.db_id: t.public.db_path for t in picked}
    with ReplicaPool(templates, tmp_path / "pool", replicas_per_db=6, workers=1) as pool:
        trajs = run_debug_agent([t.public for t in picked], ScriptedPolicy(script), pool, multi)
        score_debug_trajectories(trajs, {t.task_id: t for t in picked}, pool)
    assert [(tr.stop_reason, len(tr.turns)) for tr in trajs] == [("submit", 1)] * len(picked)
    assert all(tr.reward["status"] == "solved" for tr in trajs)
    with pytest.raises(C.ConfigError, match="sft.submit_turns = 1"):
        T.sft_from_dict({"submit_turns": 1})


def test_collate_masks_prompt_and_padding():
    ex = [
        {"prompt_ids": [1, 2, 3], "target_ids": [4, 5]},
        {"prompt_ids": [1], "target_ids": [6]},
    ]
    ids, attn, labels = collate(ex, pad_id=0, device="cpu")
    assert ids.tolist() == [[1, 2, 3, 4, 5], [1, 6, 0, 0, 0]]
    assert attn.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert labels.tolist() == [[-100, -100, -100, 4, 5], [-100, 6, -100, -100, -100]]


def test_sft_never_uses_validation_references(demo):
    tasks = _resplit(demo, "book_2")
    train = [t for t in tasks if t.split == "train"]
    val = [t for t in tasks if t.split == "validation"]
    check_training_references(train, tasks, train_split="train", eval_split="validation")
    with pytest.raises(ValueError, match="outside the training split"):
        check_training_references(train + val[:1], tasks, train_split="train", eval_split="validation")
    with pytest.raises(ValueError, match="different splits"):
        check_training_references(train, tasks, train_split="train", eval_split="train")
    # a training task on a database that has validation tasks: the split is not by database
    leaky = [dataclasses.replace(val[0], split="train")]
    with pytest.raises(ValueError, match="split must be by database"):
        check_training_references(leaky, tasks, train_split="train", eval_split="validation")


def test_sft_run_refuses_equal_splits_before_loading_a_model(tmp_path):
    from sqlrl.training.sft import train_sft

    cfg = _tiny_cfg("embedded", max_new_tokens=256).replace(data={"eval_split": "train"})
    with pytest.raises(ValueError, match="different splits"):
        train_sft(
            cfg,
            T.sft_from_dict({}),
            tmp_path / "r",
            policy_factory=lambda: pytest.fail("model loaded"),
            progress=False,
        )


def _tiny_cfg(data_path, **agent):
    return C.from_dict(
        {
            "model": {"name": "tiny"},
            "data": {"kind": "debug", "path": str(data_path), "max_train_tasks": 4, "max_eval_tasks": 4},
            "agent": {"max_new_tokens": 8, "max_schema_chars": 300, "max_context_tokens": 4096, **agent},
            "grpo": {"steps": 1, "prompts_per_step": 2, "group_size": 2, "lr": 1e-3, "micro_batch": 4},
            "run": {
                "device": "cpu",
                "checkpoint_every": 1,
                "loggers": [],
                "gen_engine": "fast",
                "sandbox_workers": 1,
            },
        }
    )


def test_sft_run_moves_weights_and_writes_its_run_folder(tmp_path):
    from sqlrl.training.checkpoint import load_latest
    from sqlrl.training.sft import train_sft

    cfg = _tiny_cfg("embedded", max_new_tokens=256)
    sft = T.sft_from_dict({"steps": 2, "batch_size": 2, "micro_batch": 1, "lr": 1e-3})
    res = train_sft(cfg, sft, tmp_path / "sft", policy_factory=tiny_factory, progress=False)
    run = tmp_path / "sft"
    assert res["finished"] and res["weights_changed"] and res["final_identity"] != res["base_identity"]
    steps = [json.loads(x) for x in (run / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2] and all(
        s["loss"] > 0 and s["answer_tokens"] > 0 for s in steps
    )
    conf = json.loads((run / "config.json").read_text())
    assert conf["sft"]["steps"] == 2 and conf["data"]["kind"] == "debug"
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "finished" and info["kind"] == "sft" and info["examples"] == 4
    assert json.loads((run / "final" / "identity.json").read_text())["weights_hash"] == res["final_identity"]
    assert (run / "checkpoints" / "manifest.json").is_file() and load_latest(run).step == 2
    split = json.loads((run / "split.json").read_text())
    assert len(split["task_ids"]) == 4 and split["train_split"] == "train"


def test_curriculum_config_errors(tmp_path):
    def load(text: str):
        p = tmp_path / "c.toml"
        p.write_text(text)
        from sqlrl.training.curriculum import load_curriculum

        return load_curriculum(p)

    with pytest.raises(C.ConfigError, match='kind = "debug"'):
        load("[curriculum]\n")
    base = '[data]\nkind = "debug"\n'
    cfg, sft, cur = load(base)
    assert [s.name for s in cur.stages] == ["sft", "grpo-single", "grpo-multi"]
    assert [s.turns for s in cur.stages] == [1, 1, 3]
    with pytest.raises(C.ConfigError, match="single-turn answer format"):
        load(base + '[[curriculum.stages]]\nname = "a"\nkind = "sft"\nturns = 3\n')
    with pytest.raises(C.ConfigError, match="used twice"):
        load(base + '[[curriculum.stages]]\nname = "a"\n[[curriculum.stages]]\nname = "a"\n')
    with pytest.raises(C.ConfigError, match="previous stage's final weights"):
        load(base + '[[curriculum.stages]]\nname = "a"\nset = ["model.name=x"]\n')
    with pytest.raises(C.ConfigError, match="did you mean 'steps'"):
        load(base + '[[curriculum.stages]]\nname = "a"\nstepz = 3\n')
    with pytest.raises(C.ConfigError, match="sft.lr"):
        load(base + "[sft]\nlr = 0\n")
    with pytest.raises(C.ConfigError, match="different splits"):
        load(base + 'eval_split = "train"\n')
    # the run-file loader ignores the command tables
    p = tmp_path / "c.toml"
    p.write_text(base + "[sft]\nsteps = 3\n[curriculum]\neval_turns = [1]\n")
    assert C.load(p).data.kind == "debug"


def test_category_table_counts_excluded_and_pass_fraction():
    results = [
        {"category": "query", "reward": 1.0, "solved": True},
        {"category": "query", "reward": 0.5, "solved": False},
        {"category": "management", "reward": None, "solved": None},
        {"category": "management", "reward": 0.0, "solved": False},
    ]
    t = category_table(results)
    assert t["query"] == {
        "n_trajectories": 2,
        "n": 2,
        "excluded": 0,
        "solved": 1,
        "accuracy": 0.5,
        "mean_pass_fraction": 0.75,
    }
    assert t["management"]["excluded"] == 1 and t["management"]["n"] == 1
    assert t["personalization"]["n"] == 0 and t["personalization"]["accuracy"] is None
    assert t["all"]["n"] == 3 and t["all"]["solved"] == 1


def test_debug_eval_by_category_with_a_scripted_policy(tmp_path, demo):
    from sqlrl.training.curriculum import run_debug_eval

    tasks = [t for t in demo if t.public.db_id == "activity_1"]
    by_desc = {t.public.description: t for t in tasks}

    def script(prompt: str, turn: int) -> str:  # the reference for query tasks, the buggy SQL otherwise
        t = next(t for d, t in by_desc.items() if d in prompt)
        return sft_target_text(t) if t.category == "query" else f"```sql\n{t.public.buggy_sql}\n```"

    summ = run_debug_eval(
        tasks=tasks,
        policy=ScriptedPolicy(script),
        budgets=SINGLE,
        out=tmp_path / "ev",
        provenance={"model": {"name": "scripted"}},
    )
    bc = summ["by_category"]
    assert bc["query"]["accuracy"] == 1.0 and bc["query"]["n"] == 3
    assert bc["management"]["solved"] == 0 and bc["personalization"]["solved"] == 0
    s = json.loads((tmp_path / "ev" / "summary.json").read_text())
    assert s["by_category"]["all"]["n"] == 6


def _factory(name: str):
    if Path(name).is_dir():
        from sqlrl.generation.models import load_model

        loaded = load_model(name)  # a previous stage's final: dense, or a patch over its own base
        return loaded.model, loaded.tokenizer, name, loaded.identity
    return tiny_factory()


def test_curriculum_runs_stages_chains_weights_resumes_and_evaluates(tmp_path):
    from sqlrl.training.curriculum import run_curriculum

    cfg = _tiny_cfg("embedded")
    sft = T.sft_from_dict({"steps": 1, "batch_size": 2, "micro_batch": 2, "lr": 1e-3})
    cur = T.curriculum_from_dict(
        {
            "stages": [
                {"name": "sft", "kind": "sft", "set": ["agent.max_new_tokens=256"]},
                {"name": "grpo-single", "kind": "grpo", "turns": 1},
                {"name": "grpo-multi", "kind": "grpo", "turns": 2},
            ],
            "eval_turns": [1, 2],
            "smoke": True,
        }
    )
    out = tmp_path / "cur"
    res = run_curriculum(cfg, sft, cur, out, policy_factory=_factory, progress=False)
    for name in ("01-sft", "02-grpo-single", "03-grpo-multi"):
        assert (out / name / "final" / "identity.json").is_file() and (out / name / "steps.jsonl").is_file()
    st = res["stages"]
    assert st[0]["weights_changed"] and st[0]["turns"] == 1 and st[2]["turns"] == 2
    assert st[1]["base_identity"] == st[0]["final_identity"]
    assert st[2]["base_identity"] == st[1]["final_identity"]
    assert json.loads((out / "02-grpo-single" / "config.json").read_text())["model"]["name"].endswith(
        "01-sft/final"
    )
    # evaluation databases are held out of every stage (the demo slice is re-split by database)
    tasks = load_debug_tasks(out / "tasks" / "debug_tasks.jsonl")
    val_dbs = {t.public.db_id for t in tasks if t.split == "validation"}
    assert val_dbs and not val_dbs & set(
        json.loads((out / "01-sft" / "split.json").read_text())["train_db_ids"]
    )
    assert res["n_eval_tasks"] == 4
    for tk in ("t1", "t2"):
        assert set(res["by_category"][tk]) == {"base", "sft", "grpo-single", "grpo-multi"}
        assert res["by_category"][tk]["base"]["all"]["n_trajectories"] == 4
    md = (out / "eval_by_category.md").read_text()
    assert "Smoke run" in md and "| grpo-multi |" in md
    assert (out / "evals" / "grpo-multi-t2" / "results.jsonl").is_file()

    # rerun: every finished stage is skipped after its checks, evaluations are not repeated
    before = (out / "01-sft" / "run.json").read_text()
    again = run_curriculum(cfg, sft, cur, out, policy_factory=_factory, progress=False)
    assert (out / "01-sft" / "run.json").read_text() == before
    rec = json.loads((out / "curriculum.json").read_text())
    assert all(s["status"].startswith("skipped") for s in rec["stages"])
    assert again["by_category"] == res["by_category"]

    # a memory-only setting may change on resume: finished stages stay skipped, the change is recorded
    mem = cfg.replace(grpo={"micro_batch": 1})
    run_curriculum(mem, sft, cur, out, policy_factory=_factory, progress=False)
    rec = json.loads((out / "curriculum.json").read_text())
    assert all(s["status"].startswith("skipped") for s in rec["stages"])
    assert rec["resume_changes"][-1]["changes"] == [f"grpo.micro_batch: {cfg.grpo.micro_batch} -> 1"]

    # a tampered final/ is refused, so is a changed config
    f = out / "02-grpo-single" / "final" / "config.json"
    f.write_text(f.read_text() + " ")
    with pytest.raises(C.ConfigError, match="does not match identity.json"):
        run_curriculum(cfg, sft, cur, out, policy_factory=_factory, progress=False)
    with pytest.raises(C.ConfigError, match="different config"):
        run_curriculum(cfg, T.sft_from_dict({"steps": 2}), cur, out, policy_factory=_factory, progress=False)


def test_sft_deadline_stops_cleanly_after_a_measured_step(tmp_path):
    """A deadline already past: step 1 runs (no step time measured yet), then the run stops before step 2
    with step 1 checkpointed, unfinished; resuming finishes it."""
    import time

    from sqlrl.training.checkpoint import load_latest
    from sqlrl.training.sft import train_sft

    cfg = _tiny_cfg("embedded", max_new_tokens=256)
    sft = T.sft_from_dict({"steps": 2, "batch_size": 2, "micro_batch": 2, "lr": 1e-3})
    run = tmp_path / "sft"
    res = train_sft(cfg, sft, run, policy_factory=tiny_factory, progress=False, deadline=time.monotonic())
    assert not res["finished"] and res["steps"] == 1 and load_latest(run).step == 1
    res = train_sft(cfg, sft, run, resume=True, policy_factory=tiny_factory, progress=False)
    assert res["finished"] and res["steps"] == 2
    assert [json.loads(x)["step"] for x in (run / "steps.jsonl").read_text().splitlines()] == [1, 2]


def test_curriculum_time_budget_stops_with_unfinished_and_resumes(tmp_path, monkeypatch):
    import time

    from sqlrl.training import budget
    from sqlrl.training.curriculum import run_curriculum

    cfg = _tiny_cfg("embedded")
    sft = T.sft_from_dict({"steps": 2, "batch_size": 2, "micro_batch": 2, "lr": 1e-3})
    cur = T.curriculum_from_dict(
        {
            "stages": [{"name": "sft", "kind": "sft", "set": ["agent.max_new_tokens=256"]}],
            "eval_turns": [1],
            "eval_base": False,
            "smoke": True,
        }
    )
    out = tmp_path / "cur"
    # too little time to start a stage: nothing trained, the record says running
    with pytest.raises(budget.Unfinished, match="stage 01-sft"):
        run_curriculum(cfg, sft, cur, out, policy_factory=_factory, progress=False, deadline=time.monotonic())
    assert not (out / "01-sft" / "steps.jsonl").exists()
    assert json.loads((out / "curriculum.json").read_text())["status"] == "running"
    # the stage check passes (patched) but the deadline is past: the SFT stops after step 1
    monkeypatch.setattr(budget, "check_time", lambda *a: None)
    with pytest.raises(budget.Unfinished, match=r"01-sft stopped at step 1"):
        run_curriculum(cfg, sft, cur, out, policy_factory=_factory, progress=False, deadline=time.monotonic())
    monkeypatch.undo()
    res = run_curriculum(cfg, sft, cur, out, policy_factory=_factory, progress=False)
    steps = [json.loads(x)["step"] for x in (out / "01-sft" / "steps.jsonl").read_text().splitlines()]
    assert steps == [1, 2] and res["stages"][0]["steps"] == 2 and res["n_eval_tasks"] == 4
    assert json.loads((out / "curriculum.json").read_text())["stages"][0]["status"] == "resumed"


def test_sft_forward_uses_the_trainers_attention_kernel_rule(monkeypatch):
    """SFT's forward runs inside `update.train_attention_context` (no cuDNN SDPA on CUDA), like GRPO's."""
    import contextlib
    import types

    import torch

    import sqlrl.training.update as U
    from sqlrl.training.sft import answer_loss_sum

    seen, inside = [], []

    @contextlib.contextmanager
    def record(device_type):
        seen.append(device_type)
        inside.append(True)
        yield
        inside.append(False)

    def model(input_ids, attention_mask, use_cache):
        assert inside[-1] is True  # called within the context
        return types.SimpleNamespace(logits=torch.zeros(*input_ids.shape, 5, requires_grad=True))

    monkeypatch.setattr(U, "train_attention_context", record)
    ids = torch.tensor([[1, 2, 3]])
    loss, n, _ = answer_loss_sum(model, ids, torch.ones_like(ids), torch.tensor([[-100, 2, 3]]))
    assert seen == ["cpu"] and n == 2
    assert abs(loss.item() - 2 * torch.log(torch.tensor(5.0)).item()) < 1e-5


def test_curriculum_resume_from_valid_skips_a_corrupt_newest_checkpoint(tmp_path, monkeypatch):
    import shutil
    import time

    from sqlrl.training import budget
    from sqlrl.training.checkpoint import CheckpointError
    from sqlrl.training.curriculum import run_curriculum

    cfg = _tiny_cfg("embedded")
    sft = T.sft_from_dict({"steps": 2, "batch_size": 2, "micro_batch": 2, "lr": 1e-3})
    cur = T.curriculum_from_dict(
        {
            "stages": [{"name": "sft", "kind": "sft", "set": ["agent.max_new_tokens=256"]}],
            "eval_turns": [1],
            "eval_base": False,
            "smoke": True,
        }
    )
    out = tmp_path / "cur"
    monkeypatch.setattr(budget, "check_time", lambda *a: None)
    with pytest.raises(budget.Unfinished, match=r"01-sft stopped at step 1"):
        run_curriculum(cfg, sft, cur, out, policy_factory=_factory, progress=False, deadline=time.monotonic())
    monkeypatch.undo()
    ckdir = out / "01-sft" / "checkpoints"
    # a newer checkpoint that fails validation (its sidecar says step 1)
    shutil.copytree(ckdir / "step_000001", ckdir / "step_000002")
    with pytest.raises(CheckpointError, match="--resume-from-valid"):
        run_curriculum(cfg, sft, cur, out, policy_factory=_factory, progress=False)
    res = run_curriculum(cfg, sft, cur, out, policy_factory=_factory, progress=False, resume_from_valid=True)
    steps = [json.loads(x)["step"] for x in (out / "01-sft" / "steps.jsonl").read_text().splitlines()]
    assert steps == [1, 2] and res["stages"][0]["steps"] == 2


def test_curriculum_cli_passes_resume_from_valid(tmp_path, monkeypatch):
    from sqlrl.cli import curriculum as cli

    seen = {}

    def fake_run(cfg, sft, cur, out, **kw):
        seen.update(kw)
        raise ValueError("stop here")

    monkeypatch.setattr(cli, "run_curriculum", fake_run)
    config = Path(__file__).resolve().parents[2] / "configs" / "debug-curriculum.toml"
    assert cli.cli_main([str(config), "--out", str(tmp_path / "c"), "--resume-from-valid"]) == 2
    assert seen["resume_from_valid"] is True
    assert cli.cli_main([str(config), "--out", str(tmp_path / "c")]) == 2
    assert seen["resume_from_valid"] is False


def test_a_stage_whose_final_equals_its_base_in_the_final_dtype_did_not_change(tmp_path):
    """A bf16 patch final with no changed element is the base as evaluated, though its hash (bf16) differs
    from the float32 base's: weights_changed is false."""
    from sqlrl.training.curriculum import finished_stage

    folder = tmp_path / "01-grpo"
    (folder / "final").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"run": {"k": 1}}))
    (folder / "run.json").write_text(
        json.dumps({"status": "finished", "steps": 2, "model": {"base_identity": "sha256:f32"}})
    )
    ident = {"weights_hash": "sha256:bf16", "weights_stored": "patch", "changed_elements": 0, "files": {}}
    (folder / "final" / "identity.json").write_text(json.dumps(ident))
    done = finished_stage(folder, {"run": {"k": 1}}, None)
    assert (done["final_identity"], done["weights_changed"]) == ("sha256:bf16", False)
    ident["changed_elements"] = 3
    (folder / "final" / "identity.json").write_text(json.dumps(ident))
    assert finished_stage(folder, {"run": {"k": 1}}, None)["weights_changed"] is True
