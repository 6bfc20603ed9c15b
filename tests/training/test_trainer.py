"""GRPO trainer on CPU with a tiny random model: real AdamW steps on real rollout batches.

The tiny model cannot write SQL, so these tests score with a scripted reward (alternating 0/1 inside
every group) to guarantee a learning signal; the real reward path is covered by the slow SmolLM2 test.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sqlrl import config as C
from sqlrl.reward.match import Reward

TINY_DRIVER = r"""
import sys
sys.path.insert(0, {tests!r})
from test_trainer import tiny_cfg, tiny_factory, Alternating
from sqlrl.training.trainer import train
train(tiny_cfg(steps={steps}, lr={lr}), {out!r}, resume={resume}, policy_factory=tiny_factory,
      evaluator_factory=Alternating, progress=False)
"""


class Alternating:
    """Scripted reward: 0, 1, 0, 1, ... in call order (so every even-sized group has variance)."""

    def __init__(self, sandbox, gold_cache, kind):
        self.n = 0

    def score(self, final_sql, task):
        self.n += 1
        v = float(self.n % 2)
        return Reward(v, "match" if v else "mismatch", {})


def tiny_factory():
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from sqlrl.generation.models import weights_hash
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
    )
    model = Qwen2ForCausalLM(cfg).float()
    with torch.no_grad():  # dequantized GGUF weights hold many -0.0; keep some so bit-level checks see them
        for p in model.parameters():
            if p.dim() == 2:
                p.view(-1)[::97] = -0.0
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok, "tiny-qwen2", weights_hash(model)


def tiny_cfg(steps=2, lr=1e-3, **grpo):
    control = "no-update" if lr == 0 else "none"
    return C.from_dict(
        {
            "model": {"name": "tiny"},
            "data": {"path": "embedded", "max_train_tasks": 6},
            "agent": {"max_new_tokens": 12, "max_schema_chars": 300, "max_context_tokens": 2048},
            "grpo": {
                "steps": steps,
                "prompts_per_step": 2,
                "group_size": 4,
                "lr": lr,
                "micro_batch": 3,
                "control": control,
                **grpo,
            },
            "run": {
                "device": "cpu",
                "checkpoint_every": 1,
                "loggers": [],
                "gen_engine": "fast",
                "sandbox_workers": 1,
            },
        }
    )


def final_hash(run: Path) -> str:
    return json.loads((run / "final" / "identity.json").read_text())["weights_hash"]


def steps(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines() if line.strip()]


def test_grpo_steps_change_weights_and_record_everything(tmp_path):
    from sqlrl.training.trainer import train

    run = tmp_path / "grpo"
    res = train(
        tiny_cfg(steps=2), run, policy_factory=tiny_factory, evaluator_factory=Alternating, progress=False
    )
    assert res["finished"] and res["steps"] == 2
    base = tiny_factory()[3]
    assert final_hash(run) != base
    st = steps(run)
    assert [s["step"] for s in st] == [1, 2]
    for s in st:
        assert s["grad_norm"] > 0 and s["zero_var_groups"] == 0 and s["groups"] == 2
        assert s["n_trajectories"] == 8 and s["trained_tokens"] > 0 and abs(s["reward_mean"] - 0.5) < 1e-9
        assert 0 <= s["time_score_s"] <= s["time_step_s"] - s["time_rollout_s"]
        assert s["reward_status_counts"] == {"match": 4, "mismatch": 4}  # Alternating, 8 trajectories
    for f in ("config.json", "run.json", "split.json", "checkpoints/manifest.json", "rollouts.jsonl"):
        assert (run / f).exists(), f
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "finished" and info["arm"] == "grpo" and info["model"]["base_identity"] == base
    # sql.jsonl: every scored trajectory, compact, with the reward the update used
    sql = [json.loads(line) for line in (run / "sql.jsonl").read_text().splitlines()]
    assert [(r["step"], r["round"]) for r in sql] == [(1, 0)] * 8 + [(2, 0)] * 8
    assert [r["value"] for r in sql] == [1.0, 0.0] * 8  # Alternating (1, 0, 1, ...), in scoring order
    assert all(r["status"] in ("match", "mismatch") and "prompt_text" not in r for r in sql)
    assert all(r["exec_ms"] is None for r in sql)  # the scripted reward executes nothing
    logged = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    by_key = {(r["step"], r["task_id"], r["sample"]): r for r in sql}
    for r in logged:
        k = by_key[(r["step"], r["task_id"], r["sample"])]
        assert k["final_sql"] == r["final_sql"] and k["turn_sql"] == [t["sql"] for t in r["turns"]]
        assert k["value"] == r["reward"]["value"]
    # the exported model reloads with transformers and keeps its identity
    from transformers import AutoModelForCausalLM

    from sqlrl.generation.models import weights_hash

    assert weights_hash(AutoModelForCausalLM.from_pretrained(run / "final")) == final_hash(run)


def test_no_update_control_is_bit_identical(tmp_path):
    from sqlrl.training.trainer import train

    run = tmp_path / "noupd"
    train(
        tiny_cfg(steps=2, lr=0.0),
        run,
        policy_factory=tiny_factory,
        evaluator_factory=Alternating,
        progress=False,
    )
    assert final_hash(run) == tiny_factory()[3]
    st = steps(run)
    assert all(s["grad_norm"] > 0 for s in st)  # gradients flowed; the learning rate kept the weights
    assert not any(s["update_applied"] for s in st)
    assert json.loads((run / "run.json").read_text())["arm"] == "no_update"
    # bit-identical to the base: final/ records every tensor's hash, not a second copy of the weights
    import hashlib

    ident = json.loads((run / "final" / "identity.json").read_text())
    assert sorted(p.name for p in (run / "final").iterdir()) == ["identity.json"]
    assert ident["weights_stored"] is False and ident["weights_in"] == "tiny"
    base = tiny_factory()[0]
    w = base.state_dict()["model.layers.0.mlp.up_proj.weight"]
    rec = ident["tensor_hashes"]["model.layers.0.mlp.up_proj.weight"]
    assert rec == {
        "dtype": "float32",
        "shape": [64, 32],
        "sha256": hashlib.sha256(w.contiguous().numpy().tobytes()).hexdigest(),
    }
    assert set(ident["tensor_hashes"]) == set(base.state_dict())


def test_last_checkpoint_is_skipped_when_the_run_prunes_at_end():
    from sqlrl.training.trainer import checkpoint_due

    def due(every, prune, steps=4):
        cfg = tiny_cfg(steps=steps).replace(
            run={"checkpoint_every": every, "prune_checkpoints_at_end": prune}
        )
        return [s for s in range(1, steps + 1) if checkpoint_due(cfg, s)]

    assert due(1, False) == [1, 2, 3, 4]
    assert due(1, True) == [1, 2, 3]  # the final export replaces the last one at once
    assert due(2, True) == [2]
    assert due(4, True) == []
    assert due(3, False) == [3, 4]


def test_zero_variance_groups_give_no_gradient(tmp_path):
    from sqlrl.training.trainer import train

    class Constant(Alternating):
        def score(self, final_sql, task):
            return Reward(0.0, "mismatch", {})

    run = tmp_path / "const"
    train(tiny_cfg(steps=1), run, policy_factory=tiny_factory, evaluator_factory=Constant, progress=False)
    [s] = steps(run)
    assert s["zero_var_groups"] == 2 and s["grad_norm"] == 0.0 and s["trained_tokens"] == 0
    assert final_hash(run) == tiny_factory()[3]  # AdamW with zero gradients from fresh state moves nothing


def test_scored_groups_and_informative():
    from types import SimpleNamespace as NS

    from sqlrl.training.rollouts import informative, scored_groups

    def tr(tid, v):
        return NS(task_id=tid, reward={"value": v})

    trajs = [
        tr("a", 0.0),
        tr("a", 1.0),
        tr("b", 1.0),
        tr("b", 1.0),
        tr("c", None),
        tr("c", 1.0),
        tr("d", None),
    ]
    groups = scored_groups(trajs)
    assert [[t.task_id for t in g] for g in groups] == [["a", "a"], ["b", "b"], ["c"]]  # d: all excluded
    assert [informative(g) for g in groups] == [True, False, False]  # equal rewards; a singleton
    assert informative([tr("e", 0.5), tr("e", 0.5), tr("e", 0.25)])


class FirstRoundDead(Alternating):
    """The tasks of the first 8 scored trajectories (step 1's first round: 2 tasks x 4) always score 0
    (zero-variance groups); every other task alternates 0/1 (informative). Records task ids in call order."""

    seen: list[str] = []

    def score(self, final_sql, task):
        tid = task.public.task_id
        FirstRoundDead.seen.append(tid)
        if tid in FirstRoundDead.seen[:8]:
            return Reward(0.0, "mismatch", {})
        return super().score(final_sql, task)


def test_dynamic_sampling_replaces_zero_variance_groups(tmp_path):
    from sqlrl.training.trainer import train

    FirstRoundDead.seen = []
    off = tmp_path / "off"
    train(
        tiny_cfg(steps=1), off, policy_factory=tiny_factory, evaluator_factory=FirstRoundDead, progress=False
    )
    [s] = steps(off)
    assert s["zero_var_groups"] == 2 and s["trained_groups"] == 2 and s["ds_rounds"] == 0
    assert s["grad_norm"] == 0.0 and s["trained_tokens"] == 0  # nothing to learn from

    FirstRoundDead.seen = []
    on = tmp_path / "on"
    cfg = tiny_cfg(steps=2, dynamic_sampling_rounds=2)
    train(cfg, on, policy_factory=tiny_factory, evaluator_factory=FirstRoundDead, progress=False)
    seen = FirstRoundDead.seen
    s1, s2 = steps(on)
    # step 1: round 0 = 2 dead groups; one extra round on 2 fresh tasks (6 tasks, one epoch) fills the update
    assert set(seen[8:16]).isdisjoint(seen[:8]) and len(set(seen[8:16])) == 2
    assert s1["zero_var_groups"] == 2 and s1["groups"] == 2  # the first round's, as without dynamic sampling
    assert s1["reward_mean"] == 0.0 and s1["accuracy"] == 0.0
    assert s1["ds_rounds"] == 1 and s1["ds_trajectories"] == 16 and s1["trained_groups"] == 2
    assert s1["grad_norm"] > 0 and s1["trained_tokens"] > 0
    assert s1["n_trajectories"] == 8 and s1["gen_tokens"] >= s1["trained_tokens"]
    # step 2: the last 2 fresh tasks of the epoch, both informative: no extra round
    assert len(seen) == 24 and set(seen[16:24]).isdisjoint(seen[:16])
    assert s2["ds_rounds"] == 0 and s2["trained_groups"] == 2 and s2["zero_var_groups"] == 0
    sql = [json.loads(line) for line in (on / "sql.jsonl").read_text().splitlines()]
    assert [(r["step"], r["round"]) for r in sql] == [(1, 0)] * 8 + [(1, 1)] * 8 + [(2, 0)] * 8
    assert [r["task_id"] for r in sql] == seen  # every round's trajectories, in scoring order

    # every round on dead tasks: the extra rounds are capped and the update is empty
    class AllDead(Alternating):
        def score(self, final_sql, task):
            return Reward(0.0, "mismatch", {})

    capped = tmp_path / "capped"
    train(
        tiny_cfg(steps=1, dynamic_sampling_rounds=2),
        capped,
        policy_factory=tiny_factory,
        evaluator_factory=AllDead,
        progress=False,
    )
    [s] = steps(capped)
    assert s["ds_rounds"] == 2 and s["ds_trajectories"] == 24 and s["trained_groups"] == 0
    assert s["grad_norm"] == 0.0 and final_hash(capped) == tiny_factory()[3]


def test_resume_gives_the_same_next_step(tmp_path, caplog):
    import logging

    from sqlrl.training.trainer import train

    full = tmp_path / "full"
    train(tiny_cfg(steps=3), full, policy_factory=tiny_factory, evaluator_factory=Alternating, progress=False)
    part = tmp_path / "part"
    r = train(
        tiny_cfg(steps=3),
        part,
        policy_factory=tiny_factory,
        evaluator_factory=Alternating,
        progress=False,
        stop_after=1,
    )
    assert not r["finished"]
    # a half-written checkpoint of the next step is left behind, as by a kill during the save
    (part / "checkpoints" / ".step_000002.tmp-999").mkdir()
    (part / "checkpoints" / ".step_000002.tmp-999" / "model.safetensors").write_bytes(b"partial")
    with caplog.at_level(logging.INFO, logger="sqlrl"):
        train(
            tiny_cfg(steps=3),
            part,
            resume=True,
            policy_factory=tiny_factory,
            evaluator_factory=Alternating,
            progress=False,
        )
    assert f"resuming training {part} from step 1 of 3" in caplog.messages
    assert not (part / "checkpoints" / ".step_000002.tmp-999").exists()  # removed on resume
    a, b = steps(full), steps(part)
    assert [s["step"] for s in b] == [1, 2, 3]
    for x, y in zip(a, b):
        for k in ("reward_mean", "loss", "grad_norm", "trained_tokens", "gen_tokens"):
            assert x[k] == pytest.approx(y[k], rel=1e-6, abs=1e-9), (x["step"], k)
    assert final_hash(full) == final_hash(part)


def test_resume_refuses_a_different_config(tmp_path):
    from sqlrl.training.trainer import train

    run = tmp_path / "r"
    train(tiny_cfg(steps=1), run, policy_factory=tiny_factory, evaluator_factory=Alternating, progress=False)
    with pytest.raises(C.ConfigError, match="differs"):
        train(
            tiny_cfg(steps=2, lr=2e-3),
            run,
            resume=True,
            policy_factory=tiny_factory,
            evaluator_factory=Alternating,
            progress=False,
        )
    with pytest.raises(C.ConfigError, match=r"not empty; .* --resume .* \(Python API: .*resume=True\)"):
        train(
            tiny_cfg(steps=1), run, policy_factory=tiny_factory, evaluator_factory=Alternating, progress=False
        )


def test_a_run_another_process_holds_is_refused_untouched_then_resumes(tmp_path, hold_run_lock):
    """Two writers of one run folder: the second is refused before it writes; the run resumes later."""
    from sqlrl.artifacts import RunFolderLocked
    from sqlrl.training.trainer import train

    run = tmp_path / "r"
    kw = {"policy_factory": tiny_factory, "evaluator_factory": Alternating, "progress": False}
    train(tiny_cfg(steps=2), run, stop_after=1, **kw)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    holder = hold_run_lock(run)
    try:
        with pytest.raises(RunFolderLocked, match=f"PID {holder.pid},"):
            train(tiny_cfg(steps=2), run, resume=True, **kw)
        with pytest.raises(RunFolderLocked, match=f"PID {holder.pid},"):
            train(tiny_cfg(steps=2), run, **kw)
        after = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".sqlrl.lock"}
        assert after == before
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert train(tiny_cfg(steps=2), run, resume=True, **kw)["finished"]
    assert [s["step"] for s in steps(run)] == [1, 2]


def test_kill_minus_9_then_resume(tmp_path):
    """A real SIGKILL in the middle of a run; resuming finishes it with the uninterrupted result."""
    tests = str(Path(__file__).resolve().parent)
    run = tmp_path / "killed"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    code = TINY_DRIVER.format(tests=tests, steps=4, lr=1e-3, out=str(run), resume=False)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if (run / "steps.jsonl").exists() and len(steps(run)) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    from sqlrl.artifacts import RUN_LOCK_FILE

    # the killed writer's lock file stays, holding its PID; the OS released the lock with the process
    assert (run / RUN_LOCK_FILE).read_text() == f"{proc.pid}\n"
    done = subprocess.run(
        [sys.executable, "-c", TINY_DRIVER.format(tests=tests, steps=4, lr=1e-3, out=str(run), resume=True)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (run / RUN_LOCK_FILE).exists()  # removed by the resume when it ended
    assert [s["step"] for s in steps(run)] == [1, 2, 3, 4]
    # a step scored before the kill but not checkpointed is dropped from sql.jsonl, then scored again once
    sql = [json.loads(line) for line in (run / "sql.jsonl").read_text().splitlines()]
    assert [r["step"] for r in sql] == [1] * 8 + [2] * 8 + [3] * 8 + [4] * 8
    ref = tmp_path / "ref"
    from sqlrl.training.trainer import train

    train(tiny_cfg(steps=4), ref, policy_factory=tiny_factory, evaluator_factory=Alternating, progress=False)
    assert final_hash(run) == final_hash(ref)


def test_lora_run_trains_adapters_and_exports_merged(tmp_path):
    from sqlrl.training.trainer import train

    run = tmp_path / "lora"
    cfg = tiny_cfg(steps=1).replace(
        model={"lora_rank": 4, "lora_alpha": 8, "lora_targets": ["q_proj", "v_proj"]}
    )
    res = train(cfg, run, policy_factory=tiny_factory, evaluator_factory=Alternating, progress=False)
    assert res["finished"]
    [s] = steps(run)
    assert s["grad_norm"] > 0
    ident = json.loads((run / "final" / "identity.json").read_text())
    assert ident["lora_merged"] is True and ident["weights_hash"] != tiny_factory()[3]
    side = json.loads((run / "checkpoints" / "step_000001" / "sidecar.json").read_text())
    assert side["weights_kind"] == "lora_adapter"
    from transformers import AutoModelForCausalLM

    from sqlrl.generation.models import weights_hash

    merged = AutoModelForCausalLM.from_pretrained(run / "final")
    assert not any("lora" in n for n, _ in merged.named_parameters())
    assert weights_hash(merged) == ident["weights_hash"]


def test_sampler_never_repeats_a_task_within_a_batch_and_resumes():
    from sqlrl.training.sampling import TaskSampler

    s = TaskSampler(5, seed=3)
    batches = [s.next(3) for _ in range(6)]  # 18 draws over 5 tasks: batches straddle epochs
    assert all(len(set(b)) == 3 for b in batches)
    state = s.state_dict()
    a = [s.next(3) for _ in range(4)]
    r = TaskSampler(5, seed=3)
    r.load_state_dict(state)
    assert [r.next(3) for _ in range(4)] == a


def test_grpo_loop_runs_on_debugging_tasks(tmp_path):
    """data.kind = 'debug': the same trainer, rollouts on pooled writable replicas, hidden-test reward."""
    from sqlrl.training.trainer import train

    cfg = tiny_cfg(steps=1).replace(
        data={"kind": "debug", "path": "embedded", "max_train_tasks": 4},
        agent={"max_schema_chars": 300, "max_new_tokens": 8},
    )
    run = tmp_path / "debug"
    res = train(cfg, run, policy_factory=tiny_factory, progress=False)
    assert res["finished"]
    [s] = steps(run)
    assert s["n_trajectories"] == 8 and s["n_excluded"] == 0
    info = json.loads((run / "run.json").read_text())
    assert info["data_kind"] == "debug" and info["status"] == "finished"
    rolled = [json.loads(x) for x in (run / "rollouts.jsonl").read_text().splitlines()]
    assert rolled and all(
        r["reward"]["status"] in ("solved", "partial", "failed", "no_sql", "exec_error") for r in rolled
    )
    split = json.loads((run / "split.json").read_text())
    assert split["train_tasks"] == 4 and split["train_fingerprint"]


def test_nonfinite_gradient_skips_the_update_and_records_why(tmp_path, monkeypatch):
    """A NaN factor on the log-probs in step 1 poisons the gradient: no update, step recorded as skipped
    with diagnostics; step 2 is finite and applied. (A NaN log-prob alone would not: the loss's clamp
    passes no gradient through NaN.)"""
    import torch

    from sqlrl.training import trainer as T
    from sqlrl.training import update as U

    real = U.sequence_logprobs
    calls = {"n": 0}

    def poisoned(model, batch, temperature, autocast_dtype):
        out = real(model, batch, temperature, autocast_dtype)
        calls["n"] += torch.is_grad_enabled()
        if calls["n"] == 1 and torch.is_grad_enabled():
            out = out * torch.where(torch.arange(out.shape[1]) == out.shape[1] - 1, float("nan"), 1.0)
        return out

    monkeypatch.setattr(U, "sequence_logprobs", poisoned)
    run = tmp_path / "nan"
    res = T.train(
        tiny_cfg(steps=2), run, policy_factory=tiny_factory, evaluator_factory=Alternating, progress=False
    )
    assert res["finished"]
    st = steps(run)
    assert (
        st[0]["skipped_nonfinite"] is True and st[0]["update_applied"] is False and st[0]["grad_norm"] is None
    )
    diag = st[0]["nonfinite_diagnostics"]
    assert diag["logprobs_at_loss_tokens"] >= 1 and diag["micro_batches_with_nonfinite_loss"] >= 1
    assert diag["params_with_nonfinite_grad"] > 0 and diag["first_params"]
    assert st[1]["skipped_nonfinite"] is False and st[1]["update_applied"] is True
    assert st[1]["nonfinite_diagnostics"] is None
    assert final_hash(run) != tiny_factory()[3]


def test_micro_batches_split_by_count_and_by_logit_tokens():
    from sqlrl.training.update import micro_batches

    assert micro_batches([10, 10, 10], 2) == [(0, 2), (2, 3)]
    # cap 600: [100, 200] -> 2 x 200 = 400 fits; adding 300 -> 3 x 300 = 900 does not; [300, 400] -> 800 does not
    assert micro_batches([100, 200, 300, 400], 8, 600) == [(0, 2), (2, 3), (3, 4)]
    # an item above the cap on its own still runs, alone
    assert micro_batches([50, 700, 50], 8, 600) == [(0, 1), (1, 2), (2, 3)]
    assert micro_batches([5, 5, 5, 5], 3, 0) == [(0, 3), (3, 4)]  # 0 = no token cap
    assert micro_batches([], 4, 100) == []
    with pytest.raises(ValueError):
        micro_batches([1], 0)


def test_logit_span_is_the_keep_of_build_batch():
    from types import SimpleNamespace as NS

    from sqlrl.training.update import build_batch, logit_span

    a = NS(token_ids=list(range(1, 11)), loss_mask=[0] * 6 + [1] * 4, logprobs=[0.0] * 10)  # 10 - 6 + 1
    b = NS(token_ids=list(range(1, 6)), loss_mask=[0, 1, 1, 0, 1], logprobs=[0.0] * 5)  # 5 - 1 + 1
    c = NS(token_ids=list(range(1, 21)), loss_mask=[0] * 17 + [1] * 3, logprobs=[0.0] * 20)  # 20 - 17 + 1
    assert [logit_span(t) for t in (a, b, c)] == [5, 5, 4]
    for group in ([a], [b], [c], [a, b, c], [a, c], [c, b]):
        got = build_batch(group, [1.0] * len(group), "cpu", 0)["keep"]
        assert got == max(logit_span(t) for t in group)


def test_logit_token_cap_changes_the_passes_not_the_update(tmp_path):
    """A cap of 2 logit tokens puts every trajectory in a pass of its own: same loss and gradient norm
    as micro-batches of 3 (token-mean over the whole step either way), and weights within 1 % of the
    step (AdamW's first step, lr * g / (|g| + eps), amplifies float noise where |g| ~ eps)."""
    from safetensors.torch import load_file

    from sqlrl.training.trainer import train

    a, b = tmp_path / "a", tmp_path / "b"
    train(tiny_cfg(steps=1), a, policy_factory=tiny_factory, evaluator_factory=Alternating, progress=False)
    train(
        tiny_cfg(steps=1, micro_batch_logit_tokens=2),
        b,
        policy_factory=tiny_factory,
        evaluator_factory=Alternating,
        progress=False,
    )
    sa, sb = steps(a)[0], steps(b)[0]
    assert sa["trained_tokens"] == sb["trained_tokens"] > 0
    assert sb["loss"] == pytest.approx(sa["loss"], rel=1e-5, abs=1e-7)
    assert sb["grad_norm"] == pytest.approx(sa["grad_norm"], rel=1e-5)
    wa, wb = (
        load_file(str(a / "final" / "model.safetensors")),
        load_file(str(b / "final" / "model.safetensors")),
    )
    base = tiny_factory()[0].state_dict()
    for k in wa:
        moved = (wa[k] - base[k]).abs().max().item()
        assert (wa[k] - wb[k]).abs().max().item() <= 1e-2 * max(moved, 1e-6), k  # AdamW step 1 ~ lr * sign(g)


def test_resume_may_change_memory_only_settings_and_records_it(tmp_path):
    from sqlrl.training.trainer import train

    run = tmp_path / "r"
    r = train(
        tiny_cfg(steps=2),
        run,
        policy_factory=tiny_factory,
        evaluator_factory=Alternating,
        progress=False,
        stop_after=1,
    )
    assert not r["finished"]
    train(
        tiny_cfg(steps=2, micro_batch=1, micro_batch_logit_tokens=64),
        run,
        resume=True,
        policy_factory=tiny_factory,
        evaluator_factory=Alternating,
        progress=False,
    )
    info = json.loads((run / "run.json").read_text())
    assert info["resume_changes"] == [
        "grpo.micro_batch: 3 -> 1",
        "grpo.micro_batch_logit_tokens: 0 -> 64",
    ]
    saved = json.loads((run / "config.json").read_text())["grpo"]
    assert (saved["micro_batch"], saved["micro_batch_logit_tokens"]) == (1, 64)
    assert [s["step"] for s in steps(run)] == [1, 2]


def test_out_of_memory_in_the_update_says_what_to_change(tmp_path, monkeypatch):
    import torch

    from sqlrl.training import trainer as T
    from sqlrl.training import update as U

    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 18.33 GiB")

    monkeypatch.setattr(U, "sequence_logprobs", oom)
    # every pass fails: the update is retried with smaller passes down to one trajectory, then it stops
    with pytest.raises(
        RuntimeError,
        match=r"retries with smaller passes\): a micro-batch of 1 trajectories.*"
        r"grpo\.micro_batch \(now 3\).*micro_batch_logit_tokens \(now 0",
    ):
        T.train(
            tiny_cfg(steps=1),
            tmp_path / "o",
            policy_factory=tiny_factory,
            evaluator_factory=Alternating,
            progress=False,
        )


def test_out_of_memory_retries_the_update_with_smaller_passes(tmp_path, monkeypatch):
    """A pass of more than one trajectory 'runs out of memory': the step is redone with a halved logit-token
    cap, and gives the same loss and gradient norm as a run that never ran out (the objective is normalised
    over the whole step, so passes only split the sum); the new cap is recorded and kept."""
    import torch

    from sqlrl.training import trainer as T
    from sqlrl.training import update as U

    a, b = tmp_path / "a", tmp_path / "b"
    T.train(tiny_cfg(steps=2), a, policy_factory=tiny_factory, evaluator_factory=Alternating, progress=False)
    real = U.sequence_logprobs
    calls = {"oom": 0}

    def small_only(model, batch, *args, **kw):
        if batch["input_ids"].shape[0] > 1:
            calls["oom"] += 1
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, batch, *args, **kw)

    monkeypatch.setattr(U, "sequence_logprobs", small_only)
    T.train(tiny_cfg(steps=2), b, policy_factory=tiny_factory, evaluator_factory=Alternating, progress=False)
    sa, sb = steps(a), steps(b)
    assert calls["oom"] >= 1 and sb[0]["oom_retries"] >= 1
    assert sb[1]["oom_retries"] == 0  # the lowered cap is kept: step 2 needs no retry
    assert sb[0]["micro_batch_logit_tokens_used"] == sb[1]["micro_batch_logit_tokens_used"] > 0
    assert sa[0]["micro_batch_logit_tokens_used"] == 0 and sa[0]["oom_retries"] == 0
    for x, y in zip(sa, sb):
        assert y["trained_tokens"] == x["trained_tokens"] > 0
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-5, abs=1e-7)
        assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=1e-4)
    # a run stopped after the lowered step resumes with the lowered cap: no second retry
    c = tmp_path / "c"
    T.train(
        tiny_cfg(steps=2),
        c,
        policy_factory=tiny_factory,
        evaluator_factory=Alternating,
        progress=False,
        stop_after=1,
    )
    n_oom = calls["oom"]
    T.train(
        tiny_cfg(steps=2),
        c,
        resume=True,
        policy_factory=tiny_factory,
        evaluator_factory=Alternating,
        progress=False,
    )
    assert calls["oom"] == n_oom and steps(c)[1]["oom_retries"] == 0
    assert steps(c)[1]["micro_batch_logit_tokens_used"] == sb[1]["micro_batch_logit_tokens_used"]
    assert (
        json.loads((c / "run.json").read_text())["memory_adjustments"]
        == json.loads((b / "run.json").read_text())["memory_adjustments"]
    )
    adj = json.loads((b / "run.json").read_text())["memory_adjustments"]
    assert (
        adj
        and adj[0]["step"] == 1
        and adj[-1]["micro_batch_logit_tokens"] == sb[0]["micro_batch_logit_tokens_used"]
    )


def test_training_attention_excludes_the_cudnn_kernel_on_cuda_only(monkeypatch):
    import torch.nn.attention as A

    from sqlrl.training.update import train_attention_context

    seen = []

    def record(backends):
        seen.append(list(backends))
        return contextlib.nullcontext()

    monkeypatch.setattr(A, "sdpa_kernel", record)
    with train_attention_context("cpu"):
        pass
    assert seen == []
    with train_attention_context("cuda"):
        pass
    assert len(seen) == 1
    assert A.SDPBackend.CUDNN_ATTENTION not in seen[0]
    assert {A.SDPBackend.EFFICIENT_ATTENTION, A.SDPBackend.MATH} <= set(seen[0])


def test_config_changes_splits_memory_only_settings_from_blocking_ones():
    from sqlrl.training.runfolder import config_changes

    saved = {"grpo": {"lr": 1e-6, "micro_batch": 32, "micro_batch_logit_tokens": 16384}, "old": {"x": 1}}
    mine = {"grpo": {"lr": 1e-6, "micro_batch": 32, "micro_batch_logit_tokens": 4096}, "run": {"seed": 0}}
    blocking, memory = config_changes(saved, mine)
    assert memory == ["grpo.micro_batch_logit_tokens: 16384 -> 4096"]
    assert sorted(blocking) == ["old", "run.seed"]
    assert config_changes(saved, saved) == ([], [])
    blocking, _ = config_changes({"grpo": {"lr": 1e-6, "extra": 1}}, {"grpo": {"lr": 1e-6}})
    assert blocking == ["grpo.extra"]


def test_a_setting_added_later_does_not_block_resuming_an_older_run():
    from sqlrl.training.runfolder import config_changes

    before = {"grpo": {"lr": 1e-6}}  # a config.json written before grpo.dynamic_sampling_rounds existed
    assert config_changes(before, {"grpo": {"lr": 1e-6, "dynamic_sampling_rounds": 0}}) == ([], [])
    blocking, _ = config_changes(before, {"grpo": {"lr": 1e-6, "dynamic_sampling_rounds": 2}})
    assert blocking == ["grpo.dynamic_sampling_rounds"]  # a different behaviour is still a change
    # run.log_sql (added later, on by default) writes a record only: an older run resumes, recorded
    older = {"run": {"seed": 0, "log_rollouts": 4}}
    assert config_changes(older, {"run": {"seed": 0, "log_rollouts": 4, "log_sql": True}}) == (
        [],
        ["run.log_sql: None -> True"],
    )


def test_out_of_memory_in_generation_retries_with_half_the_batch(tmp_path, monkeypatch):
    """The first rollout generation of the run runs out of GPU memory (simulated): the step goes on with
    half the batch, and steps.jsonl / run.json record it."""
    import torch

    from sqlrl.generation import fastgen
    from sqlrl.training.trainer import train

    real = fastgen.generate_fast
    seen = []

    def flaky(model, prompts, **kw):
        seen.append(kw["max_batch"])
        if len(seen) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, prompts, **kw)

    monkeypatch.setattr(fastgen, "generate_fast", flaky)
    run = tmp_path / "genoom"
    train(tiny_cfg(steps=2), run, policy_factory=tiny_factory, evaluator_factory=Alternating, progress=False)
    s1, s2 = steps(run)
    assert seen[0] > seen[1] == min(seen[0], 8) // 2  # 2 tasks x 4 samples = 8 prompts in the first call
    assert s1["gen_oom_retries"] == 1 and s2["gen_oom_retries"] == 0
    assert s1["gen_max_batch_used"] == s2["gen_max_batch_used"] == seen[1]
    info = json.loads((run / "run.json").read_text())
    assert info["generation_memory_adjustments"] == [{"engine": "fast", "max_batch": seen[1]}]
    assert s1["grad_norm"] > 0  # the step trained as usual


def _toml(cfg) -> str:
    """A run file for `cfg` (JSON scalars and lists are TOML values)."""
    return "".join(
        f"[{sec}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in vals.items())
        for sec, vals in cfg.resolve().items()
    )


def test_cli_resume_with_a_corrupt_latest_checkpoint(tmp_path, monkeypatch, capsys):
    """Refused in one line (exit 2) naming the corrupt and the valid older checkpoint and the flag;
    with --resume-from-valid the run resumes from step 1 and says so; interrupted saves are removed."""
    import functools

    import sqlrl.cli.train as cli_train
    from sqlrl.cli import main
    from sqlrl.training.trainer import train

    run = tmp_path / "run"
    r = train(
        tiny_cfg(steps=3),
        run,
        policy_factory=tiny_factory,
        evaluator_factory=Alternating,
        progress=False,
        stop_after=2,
    )
    assert not r["finished"]
    ckdir = run / "checkpoints"
    weights = ckdir / "step_000002" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    (ckdir / ".step_000003.tmp-999").mkdir()
    (ckdir / ".step_000003.tmp-999" / "model.safetensors").write_bytes(b"partial")
    toml = tmp_path / "tiny.toml"
    toml.write_text(_toml(tiny_cfg(steps=3)), encoding="utf-8")
    real = functools.partial(
        train, policy_factory=tiny_factory, evaluator_factory=Alternating, progress=False
    )
    monkeypatch.setattr(cli_train, "train", real)
    monkeypatch.setattr(cli_train, "check_model", lambda name: None)  # "tiny" comes from policy_factory
    capsys.readouterr()

    assert main(["train", str(toml), "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "removed 1 interrupted checkpoint save(s)" in err[0] and ".step_000003.tmp-999" in err[0]
    assert not (ckdir / ".step_000003.tmp-999").exists()
    line = err[-1]
    assert line.startswith(
        f"sqlrl train: corrupt checkpoint {ckdir / 'step_000002'}: model.safetensors: size 100"
    )
    assert f"newest valid older checkpoint is {ckdir / 'step_000001'} (step 1)" in line
    assert "--resume-from-valid" in line and len(err) == 2
    assert [s["step"] for s in steps(run)] == [1, 2]  # nothing changed

    assert main(["train", str(toml), "--resume", str(run), "--resume-from-valid"]) == 0
    err = capsys.readouterr().err
    assert f"resuming from the newest valid older checkpoint {ckdir / 'step_000001'} (step 1)" in err
    assert [s["step"] for s in steps(run)] == [1, 2, 3]


def test_no_update_step_runs_without_warnings(tmp_path):
    """The No-update control skips `optimizer.step()` on purpose; its steps (and the scheduler's) raise no
    warning, and the weights stay bit-identical."""
    import warnings

    from sqlrl.training.trainer import train

    run = tmp_path / "noupd"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train(
            tiny_cfg(steps=2, lr=0.0),
            run,
            policy_factory=tiny_factory,
            evaluator_factory=Alternating,
            progress=False,
        )
    assert final_hash(run) == tiny_factory()[3]
    assert [s["lr"] for s in steps(run)] == [0.0, 0.0]


def test_run_without_checkpoints_restarts_to_the_same_weights(tmp_path):
    """The quickstart's setting: no checkpoint inside the run and none after the last step (the final
    export replaces it); an interrupted run restarts from its first step and ends with the same weights."""
    from sqlrl.training.trainer import train

    cfg = tiny_cfg(steps=2).replace(run={"checkpoint_every": 2, "prune_checkpoints_at_end": True})
    kw = {"policy_factory": tiny_factory, "evaluator_factory": Alternating, "progress": False}
    full = tmp_path / "full"
    train(cfg, full, **kw)
    assert not (full / "checkpoints").exists()  # nothing written, so nothing to prune
    part = tmp_path / "part"
    assert not train(cfg, part, stop_after=1, **kw)["finished"]
    assert not (part / "checkpoints").exists()
    res = train(cfg, part, resume=True, **kw)
    assert res["finished"] and [s["step"] for s in steps(part)] == [1, 2]
    assert final_hash(full) == final_hash(part) != tiny_factory()[3]
