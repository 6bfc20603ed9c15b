"""The update pass's memory settings on CPU: passes bounded by padded tokens (`grpo.micro_batch_tokens`),
the out-of-memory retry that first drops the rollout engine's cache, then halves that budget, and
resuming with a changed or lowered cap.

Out-of-memory errors are simulated: `sequence_logprobs` raises `torch.OutOfMemoryError` when a pass holds
more than a given number of padded tokens (B x T), the way activation memory grows on a GPU. Real GPU
memory per pass is measured by scripts/gpu_update_memory.py, not here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from conftest import oom_while_engine_cached
from sqlrl import config as C
from sqlrl.training import update as U
from sqlrl.training.update import PassCaps, micro_batches, resumed_caps

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_trainer import Alternating, steps, tiny_cfg, tiny_factory  # noqa: E402


def test_passes_are_bounded_by_padded_tokens_prompt_included():
    # lengths 10, 20, 30, 40 under 60 tokens: 2 x 20 = 40 fits; 3 x 30 = 90 does not; 2 x 40 = 80 does not
    assert micro_batches([3, 3, 5, 4], 8, 0, [10, 20, 30, 40], 60) == [(0, 2), (2, 3), (3, 4)]
    # under 80: 3 x 30 = 90 does not fit; 2 x 40 = 80 does
    assert micro_batches([3, 3, 5, 4], 8, 0, [10, 20, 30, 40], 80) == [(0, 2), (2, 4)]
    # equal logit spans, long prompts: the logit cap alone (4 x 2 = 8) keeps all four in one pass,
    # the token cap (2 x 1000 = 2000) splits them in two
    assert micro_batches([2, 2, 2, 2], 8, 8) == [(0, 4)]
    assert micro_batches([2, 2, 2, 2], 8, 8, [1000] * 4, 2000) == [(0, 2), (2, 4)]
    # an item above the cap runs alone, and the next pass is measured from it
    assert micro_batches([2, 2, 2], 8, 0, [5, 100, 5], 50) == [(0, 1), (1, 2), (2, 3)]
    # every cap applies: logit 25 splits at 3 x 10, tokens 15 splits at 2 x 10, count 1 at 2 items
    assert micro_batches([10, 10, 10], 8, 25, [10, 10, 10], 100) == [(0, 2), (2, 3)]
    assert micro_batches([10, 10, 10], 8, 25, [10, 10, 10], 15) == [(0, 1), (1, 2), (2, 3)]
    assert micro_batches([10, 10, 10], 1, 0, [10, 10, 10], 1000) == [(0, 1), (1, 2), (2, 3)]
    assert micro_batches([4, 4], 8, 0, [10, 10], 0) == [(0, 2)]  # 0 = no token cap
    with pytest.raises(ValueError, match="one length per item"):
        micro_batches([1, 2], 8, 0, None, 10)
    with pytest.raises(ValueError, match="one length per item"):
        micro_batches([1, 2], 8, 0, [5], 10)


def test_a_lowered_cap_halves_the_failing_pass():
    # no token cap: the logit-token cap halves (15 x 16 / 2), as before
    assert PassCaps(4096, 0).lowered(15, 16, 2000) == (PassCaps(120, 0), {"micro_batch_logit_tokens": 120})
    # with a token cap: that one halves (15 x 2000 / 2); the logit cap stays
    assert PassCaps(4096, 32768).lowered(15, 16, 2000) == (
        PassCaps(4096, 15000),
        {"micro_batch_tokens": 15000},
    )
    assert PassCaps(0, 5).lowered(2, 3, 1) == (PassCaps(0, 1), {"micro_batch_tokens": 1})


def test_resumed_caps_keep_each_lowered_cap_unless_the_resume_sets_it():
    g = NS(micro_batch_logit_tokens=4096, micro_batch_tokens=32768)
    adj = [
        {"step": 2, "micro_batch_logit_tokens": 1040},
        {"step": 3, "micro_batch_tokens": 16000},
        {"step": 5, "micro_batch_tokens": 8000},
    ]
    assert resumed_caps(g, [], []) == PassCaps(4096, 32768)
    assert resumed_caps(g, adj, []) == PassCaps(1040, 8000)
    g2 = NS(micro_batch_logit_tokens=4096, micro_batch_tokens=20000)
    assert resumed_caps(g2, adj, ["grpo.micro_batch_tokens: 32768 -> 20000"]) == PassCaps(1040, 20000)
    assert resumed_caps(g2, adj, ["grpo.micro_batch_logit_tokens: 0 -> 4096"]) == PassCaps(4096, 8000)


def _learner_and_trajs():
    """A tiny Qwen2 learner and four trajectories of 10, 12, 20 and 30 tokens, 3 generated each."""
    import torch

    model, tok, _, _ = tiny_factory()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    learner = U.Learner(model, None, opt, None, params, "cpu", 0, None)
    trajs = []
    for i, n in enumerate((10, 12, 20, 30)):
        ids = [(7 * i + k) % 40 + 3 for k in range(n)]
        trajs.append(
            NS(token_ids=ids, loss_mask=[0] * (n - 3) + [1] * 3, logprobs=[-1.0] * n, generated_tokens=3)
        )
    g = NS(
        micro_batch=8,
        micro_batch_logit_tokens=0,
        micro_batch_tokens=100,
        kl_coef=0.0,
        temperature=1.0,
        clip_low=0.2,
        clip_high=0.28,
        loss_agg="token-mean",
    )
    return learner, trajs, torch.tensor([1.0, -1.0, 1.0, -1.0]), g


def _fake_memory(monkeypatch, limit: int, seen: list):
    """Passes of more than `limit` padded tokens (B x T) 'run out of GPU memory'."""
    import torch

    real = U.sequence_logprobs

    def logprobs(model, batch, *a, **k):
        b, t = batch["input_ids"].shape
        seen.append((b, t))
        if b * t > limit:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, batch, *a, **k)

    monkeypatch.setattr(U, "sequence_logprobs", logprobs)


def _grad_norm(learner) -> float:
    return sum(float((p.grad**2).sum()) for p in learner.params if p.grad is not None) ** 0.5


def test_out_of_memory_halves_the_token_budget_and_keeps_the_sum(monkeypatch):
    learner, trajs, adv, g = _learner_and_trajs()
    ref, _, _, _, _ = U.accumulate_gradients(learner, trajs, adv, g, 7, PassCaps(0, 0))  # one pass, no limit
    ref_norm = _grad_norm(learner)
    seen: list = []
    _fake_memory(monkeypatch, 40, seen)
    # cap 100: passes [10, 12, 20] (3 x 20 = 60 > 40: out of memory) and [30];
    # halved: 3 x 20 // 2 = 30 -> [10, 12] (24), [20], [30] (30): all fit
    acc, retries, caps, adj, _ = U.accumulate_gradients(learner, trajs, adv, g, 7, PassCaps(0, 100))
    assert seen == [(3, 20), (2, 12), (1, 20), (1, 30)]
    assert (retries, caps, adj) == (1, PassCaps(0, 30), [{"step": 7, "micro_batch_tokens": 30}])
    assert acc.tokens == ref.tokens == 12
    assert acc.loss == pytest.approx(ref.loss, rel=1e-5, abs=1e-7)
    assert _grad_norm(learner) == pytest.approx(ref_norm, rel=1e-5)


def test_without_a_token_budget_the_logit_cap_halves_as_before(monkeypatch):
    learner, trajs, adv, g = _learner_and_trajs()
    seen: list = []
    _fake_memory(monkeypatch, 40, seen)
    # logit span 4 each. No cap: one pass of 4 x 30 (OOM) -> cap 4 x 4 // 2 = 8: [10, 12] (24), [20, 30]
    # (2 x 30 = 60: OOM) -> cap 2 x 4 // 2 = 4: one trajectory a pass
    _, retries, caps, adj, _ = U.accumulate_gradients(learner, trajs, adv, g, 7, PassCaps(0, 0))
    assert seen == [(4, 30), (2, 12), (2, 30), (1, 10), (1, 12), (1, 20), (1, 30)]
    assert (retries, caps) == (2, PassCaps(4, 0))
    assert adj == [{"step": 7, "micro_batch_logit_tokens": 8}, {"step": 7, "micro_batch_logit_tokens": 4}]


def test_one_trajectory_that_does_not_fit_names_the_token_budget(monkeypatch):
    learner, trajs, adv, g = _learner_and_trajs()
    _fake_memory(monkeypatch, 25, [])
    # cap 100 -> OOM at 3 x 20 -> cap 30 -> [10, 12] fits, [20] fits, [30] alone does not
    with pytest.raises(RuntimeError, match=r"after 1 retries.*1 trajectories x 4 logit columns \(30 padded"):
        U.accumulate_gradients(learner, trajs, adv, g, 7, PassCaps(0, 100))
    with pytest.raises(RuntimeError, match=r"grpo\.micro_batch_tokens \(now 100; e\.g\. 16384\)"):
        U.accumulate_gradients(learner, trajs, adv, g, 7, PassCaps(0, 100))


def test_micro_batch_tokens_is_validated():
    base = {"model": {"name": "m"}, "data": {"path": "embedded"}}
    assert C.from_dict({**base, "grpo": {"micro_batch_tokens": 16384}}).grpo.micro_batch_tokens == 16384
    assert C.from_dict(base).grpo.micro_batch_tokens == 0
    with pytest.raises(C.ConfigError, match=r"grpo\.micro_batch_tokens = -1: use 0 \(no cap\)"):
        C.from_dict({**base, "grpo": {"micro_batch_tokens": -1}})


def test_micro_batch_tokens_is_memory_only_and_absent_means_off():
    from sqlrl.training.runfolder import config_changes

    saved = {"grpo": {"lr": 1e-6, "micro_batch": 32}}  # a run from before the setting existed
    assert config_changes(saved, {"grpo": {"lr": 1e-6, "micro_batch": 32, "micro_batch_tokens": 0}}) == (
        [],
        [],
    )
    blocking, memory = config_changes(
        saved, {"grpo": {"lr": 1e-6, "micro_batch": 32, "micro_batch_tokens": 8}}
    )
    assert blocking == [] and memory == ["grpo.micro_batch_tokens: None -> 8"]


def test_token_budget_lowered_by_out_of_memory_is_kept_and_resumed(tmp_path, monkeypatch):
    """Every pass of more than one trajectory 'runs out of memory': step 1 halves the token budget until
    passes hold one trajectory; step 2 and a resumed run keep it, without a new retry."""
    import torch

    from sqlrl.training import trainer as T

    real = U.sequence_logprobs
    seen: list = []

    def one_at_a_time(model, batch, *a, **k):
        seen.append(batch["input_ids"].shape[0])
        if batch["input_ids"].shape[0] > 1:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, batch, *a, **k)

    monkeypatch.setattr(U, "sequence_logprobs", one_at_a_time)
    kw = dict(policy_factory=tiny_factory, evaluator_factory=Alternating, progress=False)
    run = tmp_path / "r"
    T.train(tiny_cfg(steps=3, micro_batch_tokens=10**6), run, stop_after=2, **kw)
    st = steps(run)
    assert st[0]["oom_retries"] >= 1 and st[1]["oom_retries"] == 0
    used = st[0]["micro_batch_tokens_used"]
    assert 0 < used < 10**6 and st[1]["micro_batch_tokens_used"] == used
    assert st[0]["micro_batch_logit_tokens_used"] == st[1]["micro_batch_logit_tokens_used"] == 0
    adj = json.loads((run / "run.json").read_text())["memory_adjustments"]
    assert adj and all(set(a) == {"step", "micro_batch_tokens"} for a in adj)
    assert adj[-1] == {"step": 1, "micro_batch_tokens": used}
    n = len(seen)
    T.train(tiny_cfg(steps=3, micro_batch_tokens=10**6), run, resume=True, **kw)
    assert [s["step"] for s in steps(run)] == [1, 2, 3]
    assert steps(run)[2]["oom_retries"] == 0 and steps(run)[2]["micro_batch_tokens_used"] == used
    assert len(seen) > n and set(seen[n:]) == {1}


def test_resume_may_set_a_token_budget_and_records_it(tmp_path):
    from sqlrl.training import trainer as T

    kw = dict(policy_factory=tiny_factory, evaluator_factory=Alternating, progress=False)
    run = tmp_path / "r"
    T.train(tiny_cfg(steps=2), run, stop_after=1, **kw)
    T.train(tiny_cfg(steps=2, micro_batch_tokens=64), run, resume=True, **kw)
    info = json.loads((run / "run.json").read_text())
    assert info["resume_changes"] == ["grpo.micro_batch_tokens: 0 -> 64"]
    assert json.loads((run / "config.json").read_text())["grpo"]["micro_batch_tokens"] == 64
    assert [s["micro_batch_tokens_used"] for s in steps(run)] == [0, 64]


def test_out_of_memory_first_releases_then_retries_with_the_same_caps(monkeypatch):
    """With `Learner.release`, the first out-of-memory pass calls it and redoes the update with the same
    caps; only a second failure in the step halves a cap."""
    learner, trajs, adv, g = _learner_and_trajs()
    freed: list = []
    limit = {"padded": 40}

    def release():
        freed.append(1)
        limit["padded"] = 70  # the released cache leaves room for [10, 12, 20] (3 x 20 = 60)

    learner.release = release
    seen: list = []
    import torch

    real = U.sequence_logprobs

    def logprobs(model, batch, *a, **k):
        b, t = batch["input_ids"].shape
        seen.append((b, t))
        if b * t > limit["padded"]:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, batch, *a, **k)

    monkeypatch.setattr(U, "sequence_logprobs", logprobs)
    acc, retries, caps, adj, released = U.accumulate_gradients(learner, trajs, adv, g, 7, PassCaps(0, 100))
    assert seen == [(3, 20), (3, 20), (1, 30)]  # the same passes again after the release
    assert (retries, caps, adj, released, freed) == (1, PassCaps(0, 100), [], True, [1])
    # still too little after the release: the cap halves as without one (release called once a step)
    learner2, trajs2, adv2, g2 = _learner_and_trajs()
    learner2.release = lambda: freed.append(2)
    _fake_memory(monkeypatch, 40, seen := [])
    _, retries, caps, adj, released = U.accumulate_gradients(learner2, trajs2, adv2, g2, 7, PassCaps(0, 100))
    assert (retries, caps, released, len(freed)) == (2, PassCaps(0, 30), True, 2)
    assert adj == [{"step": 7, "micro_batch_tokens": 30}]


def _engine_spy(monkeypatch):
    """(whether the static engine's cache was on the model after each generation, at each update)."""
    from sqlrl.generation import policy as P
    from sqlrl.generation import staticgen
    from sqlrl.training import trainer as T

    after_generate, at_update = [], []
    real_generate, real_update = P.HFPolicy.generate, T.update_policy

    def generate(self, *a, **k):
        out = real_generate(self, *a, **k)
        after_generate.append(hasattr(staticgen._hf_model(self.model), "_sqlrl_static"))
        return out

    def update(learner, *a, **k):
        at_update.append(hasattr(staticgen._hf_model(learner.model), "_sqlrl_static"))
        return real_update(learner, *a, **k)

    monkeypatch.setattr(P.HFPolicy, "generate", generate)
    monkeypatch.setattr(T, "update_policy", update)
    return after_generate, at_update


def test_the_rollout_engine_cache_is_kept_while_memory_suffices(tmp_path, monkeypatch):
    """The static engine keeps its KV cache (and on CUDA its graphs) on the model between calls: kept
    through an update that fits, so the next step's generation need not rebuild it."""
    from sqlrl.training import trainer as T

    after_generate, at_update = _engine_spy(monkeypatch)
    cfg = tiny_cfg(steps=2).replace(run={"gen_engine": "static"})
    T.train(cfg, tmp_path / "r", policy_factory=tiny_factory, evaluator_factory=Alternating, progress=False)
    assert after_generate and all(after_generate)  # float32 on CPU: the trained model generates itself
    assert at_update == [True, True]
    assert [s["gen_cache_dropped"] for s in steps(tmp_path / "r")] == [False, False]


def test_an_update_out_of_memory_drops_the_engine_cache_for_the_rest_of_the_run(tmp_path, monkeypatch):
    """Step 1's update runs out of memory while the engine's cache is on the model: the cache is dropped,
    the update redone with the same caps; every later update starts without it (steps.jsonl says so)."""

    from sqlrl.training import trainer as T

    after_generate, at_update = _engine_spy(monkeypatch)
    oom_while_engine_cached(monkeypatch)
    cfg = tiny_cfg(steps=3).replace(run={"gen_engine": "static"})
    T.train(cfg, tmp_path / "r", policy_factory=tiny_factory, evaluator_factory=Alternating, progress=False)
    st = steps(tmp_path / "r")
    assert at_update == [True, False, False] and all(after_generate)
    assert [s["oom_retries"] for s in st] == [1, 0, 0]
    assert [s["gen_cache_dropped"] for s in st] == [True, True, True]
    assert [s["micro_batch_logit_tokens_used"] for s in st] == [cfg.grpo.micro_batch_logit_tokens] * 3
    assert json.loads((tmp_path / "r" / "run.json").read_text()).get("memory_adjustments", []) == []


def test_gpu_memory_script_records_each_pass(monkeypatch):
    """scripts/gpu_update_memory.py on CPU with the CUDA memory readings faked: one record per pass, in
    the passes a 100-token budget makes of lengths 23, 23, 25, 25 | 43, 43 | 45, 45 (4 x 25 = 100 fits)."""
    import importlib.util

    import torch

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location(
        "gpu_update_memory", root / "scripts" / "gpu_update_memory.py"
    )
    G = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(G)
    readings = iter(range(1, 100))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: next(readings) * 1e9)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 0.5e9)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: None)
    learner, _, _, g = _learner_and_trajs()
    g.max_grad_norm, g.control = 1.0, "none"
    learner.scheduler = torch.optim.lr_scheduler.LambdaLR(learner.optimizer, lambda s: 1.0)
    trajs = G._trajectories(4, 2, [20, 40], [3, 5], learner.model.config.vocab_size)
    assert sorted(len(t.token_ids) for t in trajs) == [23, 23, 25, 25, 43, 43, 45, 45]
    r = G._measure(learner, trajs, torch.tensor([1.0, -1.0] * 4), g, PassCaps(0, 100), 1)
    assert r["error"] is None and r["oom_retries"] == 0 and r["allocated_before_update_gb"] == 0.5
    got = [(p["trajectories"], p["padded_length"], p["peak_gb"]) for p in r["passes"]]
    assert got == [(4, 25, 1.0), (2, 43, 2.0), (2, 45, 3.0)] and r["peak_gb"] == 3.0


def test_a_release_that_frees_nothing_goes_straight_to_a_smaller_cap(monkeypatch):
    """`Learner.release` returning False (no engine cache on the model) is no reason to redo the update
    with the same caps: the same passes would run out of memory again."""
    learner, trajs, adv, g = _learner_and_trajs()
    calls: list = []

    def release():
        calls.append(1)
        return False

    learner.release = release
    seen: list = []
    _fake_memory(monkeypatch, 40, seen)
    acc, retries, caps, adj, released = U.accumulate_gradients(learner, trajs, adv, g, 7, PassCaps(0, 100))
    assert seen == [(3, 20), (2, 12), (1, 20), (1, 30)]  # as without a release (the halving test above)
    assert (retries, caps, released, calls) == (1, PassCaps(0, 30), False, [1])
    assert adj == [{"step": 7, "micro_batch_tokens": 30}]


def test_one_trajectory_out_of_memory_after_a_release_tried_no_smaller_pass(monkeypatch):
    learner, trajs, adv, g = _learner_and_trajs()
    learner.release = lambda: True
    _fake_memory(monkeypatch, 5, [])
    with pytest.raises(RuntimeError) as e:
        U.accumulate_gradients(learner, trajs[:1], adv[:1], g, 7, PassCaps(0, 100))
    assert "out of GPU memory in the update of step 7: a micro-batch of 1 trajectories" in str(e.value)
    assert "retries with smaller passes" not in str(e.value)


def test_the_engine_releases_report_whether_a_cache_was_dropped():
    from sqlrl.generation.policy import HFPolicy

    model, tok, _, _ = tiny_factory()
    fast = HFPolicy(model, tok, engine="fast")
    assert fast.release_memory() is False  # the fast engine keeps nothing between calls
    static = HFPolicy(model, tok, engine="static")
    assert static.release_memory() is False  # nothing generated yet
    static.generate([[5, 6, 7]], max_new_tokens=2)
    assert static.release_memory() is True and static.release_memory() is False


def test_later_updates_out_of_memory_halve_a_cap_without_a_futile_retry(tmp_path, monkeypatch):
    """Step 1 runs out of memory with the engine's cache on the model (dropped, then it fits); from step 2
    every pass of more than one trajectory runs out of memory: the cache is already dropped before each
    update, so every retry of step 2 lowers a cap (none redoes the same passes), and step 3 needs none."""
    import torch

    from sqlrl.generation import staticgen
    from sqlrl.training import trainer as T

    real, real_update = U.sequence_logprobs, T.update_policy
    at: dict = {}

    def update(learner, trajs, adv, g, step, caps):
        at["step"] = step
        return real_update(learner, trajs, adv, g, step, caps)

    def logprobs(model, batch, *a, **k):
        if hasattr(staticgen._hf_model(model), "_sqlrl_static") or (
            at["step"] >= 2 and batch["input_ids"].shape[0] > 1
        ):
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, batch, *a, **k)

    monkeypatch.setattr(U, "sequence_logprobs", logprobs)
    monkeypatch.setattr(T, "update_policy", update)
    cfg = tiny_cfg(steps=3).replace(run={"gen_engine": "static"})
    T.train(cfg, tmp_path / "r", policy_factory=tiny_factory, evaluator_factory=Alternating, progress=False)
    st = steps(tmp_path / "r")
    adj = json.loads((tmp_path / "r" / "run.json").read_text())["memory_adjustments"]
    assert [s["oom_retries"] for s in st] == [1, len([a for a in adj if a["step"] == 2]), 0]
    assert st[1]["oom_retries"] >= 1 and [s["gen_cache_dropped"] for s in st] == [True] * 3
