"""A run's training time, machines and GRPO pass caps across invocations (`training/sessions.py`), on CPU.

The tiny random Qwen2 of test_trainer.py; the clock `TrainClock` reads is replaced by one that moves
only inside a training step (10 s per step), so every expected `train_seconds` is a count of steps.
A crash is an exception raised inside a step after a checkpoint; a resume then continues from the
seconds and the pass caps that checkpoint recorded. Out of memory is simulated: an update pass of more
than one trajectory under the configured `grpo.micro_batch_tokens` raises `torch.OutOfMemoryError`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import oom_while_engine_cached
from sqlrl import config_tables as T

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_sft_text2sql import _cfg as sft_cfg  # noqa: E402
from test_trainer import Alternating, steps, tiny_cfg, tiny_factory  # noqa: E402

STEP_S = 10.0


class Crash(RuntimeError):
    """The simulated crash."""


class StepClock:
    """The fake clock: `t` moves by STEP_S in every training step; `crash_at` = the step (counted from 1
    in this process) whose update raises `Crash` after its time passed."""

    def __init__(self, monkeypatch, t: float = 1000.0):
        from sqlrl.training.sessions import TrainClock

        self.t, self.calls, self.crash_at = t, 0, None
        monkeypatch.setattr(TrainClock, "now", staticmethod(lambda: self.t))

    def step(self) -> None:
        self.t += STEP_S
        self.calls += 1
        if self.calls == self.crash_at:
            raise Crash(f"simulated crash in step call {self.calls}")

    def session(self, crash_at: int | None = None) -> None:
        """A new process: its own step count, the clock elsewhere."""
        self.t, self.calls, self.crash_at = self.t + 5000.0, 0, crash_at


def _run(out: Path) -> dict:
    return json.loads((out / "run.json").read_text())


def _sidecar_seconds(out: Path, step: int) -> float:
    side = json.loads((out / "checkpoints" / f"step_{step:06d}" / "sidecar.json").read_text())
    return side["extra"]["train_seconds"]


def _machines(run: dict) -> list:
    return [(m["steps"], m["machine"]["hostname"], m["device"]) for m in run["machines"]]


@pytest.fixture
def grpo_clock(monkeypatch):
    """GRPO: the clock moves in `update_policy`; trainer.machine_info names the session's host."""
    import sqlrl.training.trainer as trainer

    clock = StepClock(monkeypatch)
    real = trainer.update_policy
    clock.host = "host-1"

    def update(*a, **k):
        clock.step()
        return real(*a, **k)

    monkeypatch.setattr(trainer, "update_policy", update)
    monkeypatch.setattr(trainer, "machine_info", lambda: {"hostname": clock.host})
    return clock


def test_grpo_crash_after_a_checkpoint_resumes_from_the_checkpoints_seconds(tmp_path, grpo_clock):
    from sqlrl.training.trainer import train

    cfg = tiny_cfg(steps=4).replace(run={"checkpoint_every": 2})
    kw = {"policy_factory": tiny_factory, "evaluator_factory": Alternating, "progress": False}
    out = tmp_path / "r"
    grpo_clock.session(crash_at=3)  # steps 1, 2 (checkpoint at 2), then step 3 crashes in its update
    with pytest.raises(Crash):
        train(cfg, out, **kw)
    run = _run(out)
    # the crashed invocation's run.json: the time and the steps of its last checkpoint (2 x 10 s)
    assert run["status"] == "running" and run["train_seconds"] == 20.0 == _sidecar_seconds(out, 2)
    assert _machines(run) == [([1, 2], "host-1", "cpu")]

    grpo_clock.session()
    grpo_clock.host = "host-2"
    res = train(cfg, out, resume=True, **kw)  # steps 3 and 4 again: 20 s (checkpoint) + 2 x 10 s
    assert res["finished"]
    run = _run(out)
    assert run["resumed_from_step"] == 2 and run["train_seconds"] == 40.0 == _sidecar_seconds(out, 4)
    assert _machines(run) == [([1, 2], "host-1", "cpu"), ([3, 4], "host-2", "cpu")]
    assert run["machine"] == {"hostname": "host-2"}  # this invocation's, as before


def test_grpo_steps_after_the_last_checkpoint_are_not_counted_twice(tmp_path, grpo_clock):
    from sqlrl.training.trainer import train

    cfg = tiny_cfg(steps=4).replace(run={"checkpoint_every": 2})
    kw = {"policy_factory": tiny_factory, "evaluator_factory": Alternating, "progress": False}
    out = tmp_path / "r"
    train(cfg, out, stop_after=3, **kw)  # a clean stop after step 3; its last checkpoint is step 2's
    run = _run(out)
    assert run["status"] == "stopped" and run["train_seconds"] == 30.0 and _sidecar_seconds(out, 2) == 20.0
    assert _machines(run) == [([1, 3], "host-1", "cpu")]
    grpo_clock.session()
    train(cfg, out, resume=True, **kw)  # resumes at step 2: step 3 is trained again, counted once
    run = _run(out)
    assert run["train_seconds"] == 40.0  # 20 s + 2 x 10 s, not 30 s + 2 x 10 s
    assert _machines(run) == [([1, 2], "host-1", "cpu"), ([3, 4], "host-1", "cpu")]


def test_sft_crash_after_a_checkpoint_resumes_from_the_checkpoints_seconds(tmp_path, monkeypatch):
    import sqlrl.training.sft as sft_mod
    import sqlrl.training.sft_loop as loop
    from sqlrl.training.sft import train_sft

    clock = StepClock(monkeypatch)
    real = loop.sft_step

    def step(*a, **k):
        clock.step()
        return real(*a, **k)

    monkeypatch.setattr(loop, "sft_step", step)
    import sqlrl.training.checkpoint as ck

    real_files = ck.files_record

    def files(*a, **k):  # a checkpoint save takes 1 s, before its sidecar is written: counted in it
        clock.t += 1.0
        return real_files(*a, **k)

    monkeypatch.setattr(ck, "files_record", files)
    hosts = iter(["host-1", "host-2"])
    monkeypatch.setattr(sft_mod, "machine_info", lambda: {"hostname": next(hosts)})
    sft = T.sft_from_dict({"steps": 5, "batch_size": 2, "micro_batch": 2, "lr": 1e-3, "checkpoint_every": 2})
    out = tmp_path / "s"
    kw = {"policy_factory": tiny_factory, "progress": False}
    clock.session(crash_at=4)  # steps 1-3 (checkpoint at 2: 2 x 10 s + its 1 s save), step 4 crashes
    with pytest.raises(Crash):
        train_sft(sft_cfg(), sft, out, **kw)
    run = _run(out)
    assert run["status"] == "running" and run["train_seconds"] == 21.0 == _sidecar_seconds(out, 2)
    assert _machines(run) == [([1, 2], "host-1", "cpu")]
    clock.session()
    res = train_sft(sft_cfg(), sft, out, resume=True, **kw)  # steps 3, 4, 5, saves at 4 and 5
    assert res["finished"]
    run = _run(out)
    assert _sidecar_seconds(out, 4) == 21.0 + 2 * STEP_S + 1.0
    assert run["train_seconds"] == 21.0 + 3 * STEP_S + 2 * 1.0 == 53.0 == _sidecar_seconds(out, 5)
    assert _machines(run) == [([1, 2], "host-1", "cpu"), ([3, 5], "host-2", "cpu")]


def test_resumed_seconds_come_from_the_checkpoint_else_run_json():
    from sqlrl.training.sessions import resumed_seconds

    assert resumed_seconds({"step": 4, "extra": {"train_seconds": 12.5}}, {"train_seconds": 99.0}) == 12.5
    # a checkpoint that does not record them: run.json's
    assert resumed_seconds({"step": 4, "extra": {}}, {"train_seconds": 99.0}) == 99.0
    assert resumed_seconds({"step": 4}, {}) == 0.0
    # no checkpoint: every step is trained again, none counted before
    assert resumed_seconds(None, {"train_seconds": 99.0}) == 0.0


def test_kept_machines_end_at_the_checkpoint_resumed_from():
    from sqlrl.training.sessions import kept_machines

    a, b = {"hostname": "a"}, {"hostname": "b"}
    prev = {"machines": [{"steps": [1, 4], "machine": a}, {"steps": [5, 9], "machine": b}]}
    assert kept_machines(prev, 9) == prev["machines"]
    assert kept_machines(prev, 6) == [{"steps": [1, 4], "machine": a}, {"steps": [5, 6], "machine": b}]
    assert kept_machines(prev, 4) == [{"steps": [1, 4], "machine": a}]
    assert kept_machines(prev, 0) == []
    # a run.json without `machines`: its own machine, for the steps its invocation took
    old = {"machine": a, "device": "cuda", "resumed_from_step": 3, "steps": 8, "started": "t"}
    assert kept_machines(old, 6) == [{"steps": [4, 6], "machine": a, "device": "cuda", "started": "t"}]
    assert kept_machines({**old, "resumed_from_step": None}, 9) == [
        {"steps": [1, 8], "machine": a, "device": "cuda", "started": "t"}
    ]
    assert kept_machines({}, 5) == []


def _sidecar(out: Path, step: int) -> dict:
    return json.loads((out / "checkpoints" / f"step_{step:06d}" / "sidecar.json").read_text())


def test_grpo_crash_after_a_checkpoint_keeps_the_lowered_pass_cap(tmp_path, grpo_clock, monkeypatch):
    """Step 1 runs out of memory under the configured token cap and halves it; step 2 checkpoints; step 3
    crashes. The checkpoint and the crashed run's run.json hold the change; the resume starts with the
    lowered cap (no second out-of-memory retry) and run.json lists the change once."""
    import torch

    from sqlrl.training import update as U
    from sqlrl.training.trainer import train

    configured = 10**6
    real_batches, real_logprobs = U.micro_batches, U.sequence_logprobs
    cap: dict = {}

    def micro_batches(spans, max_seqs, max_logit_tokens=0, lengths=None, max_tokens=0):
        cap["tokens"] = max_tokens
        return real_batches(spans, max_seqs, max_logit_tokens, lengths, max_tokens)

    def logprobs(model, batch, *a, **k):
        if cap["tokens"] == configured and batch["input_ids"].shape[0] > 1:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_logprobs(model, batch, *a, **k)

    monkeypatch.setattr(U, "micro_batches", micro_batches)
    monkeypatch.setattr(U, "sequence_logprobs", logprobs)
    cfg = tiny_cfg(steps=4, micro_batch_tokens=configured).replace(run={"checkpoint_every": 2})
    kw = {"policy_factory": tiny_factory, "evaluator_factory": Alternating, "progress": False}
    out = tmp_path / "r"
    grpo_clock.session(crash_at=3)
    with pytest.raises(Crash):
        train(cfg, out, **kw)
    first = steps(out)
    lowered = first[0]["micro_batch_tokens_used"]
    assert [s["oom_retries"] for s in first] == [1, 0]  # one halving of the 3-trajectory first pass
    assert 0 < lowered < configured and first[1]["micro_batch_tokens_used"] == lowered
    change = [{"step": 1, "micro_batch_tokens": lowered}]
    side = _sidecar(out, 2)["extra"]
    assert side["memory_adjustments"] == change
    assert side["pass_caps"] == {"micro_batch_logit_tokens": 0, "micro_batch_tokens": lowered}
    assert side["pass_caps_config"] == {"micro_batch_logit_tokens": 0, "micro_batch_tokens": configured}
    run = _run(out)
    assert run["status"] == "running" and run["memory_adjustments"] == change

    grpo_clock.session()
    assert train(cfg, out, resume=True, **kw)["finished"]
    st = steps(out)
    assert [s["step"] for s in st] == [1, 2, 3, 4]
    assert [s["micro_batch_tokens_used"] for s in st] == [lowered] * 4
    assert [s["oom_retries"] for s in st] == [1, 0, 0, 0]
    run = _run(out)
    assert run["resumed_from_step"] == 2 and run["memory_adjustments"] == change
    assert _sidecar(out, 4)["extra"]["memory_adjustments"] == change


def test_resumed_memory_takes_the_checkpoints_caps_else_run_json():
    from types import SimpleNamespace as NS

    from sqlrl.training.sessions import resumed_memory
    from sqlrl.training.update import PassCaps

    g = NS(micro_batch_logit_tokens=4096, micro_batch_tokens=32768)
    then = {"micro_batch_logit_tokens": 4096, "micro_batch_tokens": 32768}
    adj = [{"step": 1, "micro_batch_tokens": 9000}, {"step": 3, "micro_batch_logit_tokens": 1000}]
    side = {
        "step": 3,
        "extra": {
            "pass_caps": {"micro_batch_logit_tokens": 1000, "micro_batch_tokens": 9000},
            "pass_caps_config": then,
            "memory_adjustments": adj,
        },
    }
    later = [*adj, {"step": 5, "micro_batch_tokens": 10}]  # run.json of a later, clean stop
    m = resumed_memory(side, {"memory_adjustments": later}, 3, g, [])
    assert (m.caps, m.config, m.adjustments) == (PassCaps(1000, 9000), PassCaps(4096, 32768), adj)
    # a cap set anew since the checkpoint (by this resume, or an earlier one that crashed before saving)
    g2 = NS(micro_batch_logit_tokens=4096, micro_batch_tokens=20000)
    assert resumed_memory(side, {}, 3, g2, []).caps == PassCaps(1000, 20000)
    # a checkpoint without them: run.json's changes up to its step, as `update.resumed_caps`
    m = resumed_memory({"step": 3, "extra": {}}, {"memory_adjustments": later}, 3, g, [])
    assert (m.caps, m.adjustments) == (PassCaps(1000, 9000), adj)
    m = resumed_memory({"step": 3}, {"memory_adjustments": later}, 3, g2, ["grpo.micro_batch_tokens: x"])
    assert m.caps == PassCaps(1000, 20000)
    # no checkpoint: the config's caps, no change kept
    m = resumed_memory(None, {"memory_adjustments": later}, 0, g, [])
    assert (m.caps, m.adjustments) == (PassCaps(4096, 32768), [])


def test_grpo_resume_tries_the_rollout_engines_cache_again(tmp_path, grpo_clock, monkeypatch):
    """An update runs out of memory whenever the static engine's cache is on the model. Step 1 drops the
    cache and redoes its update (then every later update goes without it); a resume after a crash in
    step 3 starts with the cache kept again: its first update pays one retry, lowers no cap, and drops
    the cache for the rest of that invocation."""

    from sqlrl.training.trainer import train

    oom_while_engine_cached(monkeypatch)
    cfg = tiny_cfg(steps=4).replace(run={"checkpoint_every": 2, "gen_engine": "static"})
    kw = {"policy_factory": tiny_factory, "evaluator_factory": Alternating, "progress": False}
    out = tmp_path / "r"
    grpo_clock.session(crash_at=3)
    with pytest.raises(Crash):
        train(cfg, out, **kw)
    grpo_clock.session()
    train(cfg, out, resume=True, **kw)
    st = steps(out)
    assert [s["oom_retries"] for s in st] == [1, 0, 1, 0]
    assert [s["gen_cache_dropped"] for s in st] == [True] * 4
    assert [s["micro_batch_logit_tokens_used"] for s in st] == [cfg.grpo.micro_batch_logit_tokens] * 4
    assert _run(out)["memory_adjustments"] == [] == _sidecar(out, 4)["extra"]["memory_adjustments"]


def _gen_memory_limit(monkeypatch, fits: int) -> list:
    """Generation runs out of memory (simulated) whenever a batch of more than `fits` sequences would
    run; returns the list of `max_batch` values each `fastgen.generate_fast` call got."""
    import torch

    from sqlrl.generation import fastgen

    real, seen = fastgen.generate_fast, []

    def limited(model, prompts, **kw):
        seen.append(kw["max_batch"])
        if min(kw["max_batch"], len(prompts)) > fits:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, prompts, **kw)

    monkeypatch.setattr(fastgen, "generate_fast", limited)
    return seen


def test_grpo_crash_after_a_checkpoint_keeps_the_lowered_generation_batch(tmp_path, grpo_clock, monkeypatch):
    """Generation fits 4 sequences at a time. Step 1's first call (2 tasks x 4 samples = 8 prompts,
    `run.gen_max_batch` 256) runs out of memory and halves the batch to 4; step 2 checkpoints; step 3
    crashes. The checkpoint and the crashed run's run.json hold the change; the resume generates with
    4 from its first call (no second out-of-memory retry) and run.json lists the change once."""
    from sqlrl.training.trainer import train

    seen = _gen_memory_limit(monkeypatch, fits=4)
    cfg = tiny_cfg(steps=4).replace(run={"checkpoint_every": 2})
    assert cfg.run.gen_max_batch == 256
    kw = {"policy_factory": tiny_factory, "evaluator_factory": Alternating, "progress": False}
    out = tmp_path / "r"
    grpo_clock.session(crash_at=3)
    with pytest.raises(Crash):
        train(cfg, out, **kw)
    first = steps(out)
    assert [s["gen_oom_retries"] for s in first] == [1, 0]
    assert [s["gen_max_batch_used"] for s in first] == [4, 4]
    change = [{"engine": "fast", "max_batch": 4}]
    side = _sidecar(out, 2)["extra"]
    assert side["generation_memory_adjustments"] == change
    assert side["gen_batch"] == {"engine": "fast", "max_batch": 4}
    assert side["gen_batch_config"] == {"engine": "fast", "max_batch": 256}
    run = _run(out)
    assert run["status"] == "running" and run["generation_memory_adjustments"] == change

    grpo_clock.session()
    del seen[:]
    assert train(cfg, out, resume=True, **kw)["finished"]
    assert seen and set(seen) == {4}  # every call of the resumed invocation, the first one included
    st = steps(out)
    assert [s["step"] for s in st] == [1, 2, 3, 4]
    assert [s["gen_oom_retries"] for s in st] == [1, 0, 0, 0]
    assert [s["gen_max_batch_used"] for s in st] == [4] * 4
    run = _run(out)
    assert run["resumed_from_step"] == 2 and run["generation_memory_adjustments"] == change
    assert _sidecar(out, 4)["extra"]["generation_memory_adjustments"] == change


def test_resumed_generation_batch_takes_the_checkpoints_unless_the_setting_changed():
    from types import SimpleNamespace as NS

    from sqlrl.training.sessions import GenMemory

    def policy(max_batch=256, engine="fast"):
        return NS(engine=engine, batch_attr="max_batch", max_batch=max_batch, memory_adjustments=[])

    adj = [{"engine": "fast", "max_batch": 128}, {"engine": "fast", "max_batch": 64}]
    side = {
        "step": 3,
        "extra": {
            "gen_batch": {"engine": "fast", "max_batch": 64},
            "gen_batch_config": {"engine": "fast", "max_batch": 256},
            "generation_memory_adjustments": adj,
        },
    }
    p = policy()
    GenMemory.resumed(side, p)
    assert (p.max_batch, p.memory_adjustments) == (64, adj)
    # run.gen_max_batch or the engine set anew since the checkpoint: the config's batch, the changes kept
    for p in (policy(max_batch=512), policy(engine="static")):
        start = p.max_batch
        GenMemory.resumed(side, p)
        assert (p.max_batch, p.memory_adjustments) == (start, adj)
    # a checkpoint without them, or none: the config's batch, no change
    for s in ({"step": 3, "extra": {"train_seconds": 1.0}}, None):
        p = policy()
        m = GenMemory.resumed(s, p)
        assert (p.max_batch, p.memory_adjustments, m.config) == (
            256,
            [],
            {"engine": "fast", "max_batch": 256},
        )
