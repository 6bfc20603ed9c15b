"""Task samplers: the epoch permutation's contract lives in test_trainer.py; here the pass-rate sampler."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from sqlrl.training.sampling import PassRateSampler, TaskSampler, make_sampler


def test_weights_are_the_stated_formula():
    s = PassRateSampler(4, seed=0)
    s.observe(0, [1.0] * 8)  # p = 9/10
    s.observe(1, [0.0] * 8)  # p = 1/10
    s.observe(2, [1.0] * 100)  # p = 101/102: under the floor
    s.observe(3, [1.0, 0.0, None])  # None is excluded: p = 2/4
    assert s.weight(0) == pytest.approx(0.09)
    assert s.weight(1) == pytest.approx(0.09)
    assert s.weight(2) == pytest.approx(0.02)
    assert s.weight(3) == pytest.approx(0.25)
    assert s.counts == [8, 8, 100, 2]
    assert s.stats() == {"tasks_seen": 4, "tasks_mid": 1}


def test_draws_follow_the_weights():
    # tasks 0-4 solved 16 of 16 (p = 17/18, weight 17/324 = 0.0525), tasks 5-9 unseen (weight 0.25):
    # one draw picks an unseen task with probability 1.25 / (1.25 + 5 * 17/324) = 0.8264
    s = PassRateSampler(10, seed=1)
    for i in range(5):
        s.observe(i, [1.0] * 16)
    draws = [s.next(1)[0] for _ in range(2000)]
    share = sum(d >= 5 for d in draws) / len(draws)
    assert share == pytest.approx(0.8264, abs=0.04)  # 4.7 standard deviations of a binomial share
    assert set(Counter(draws)) == set(range(10))  # every task stays drawable


def test_batches_are_distinct_and_resume_draws_the_same():
    a = PassRateSampler(6, seed=7)
    b0 = a.next(4)
    assert len(set(b0)) == 4
    assert sorted(a.next(9)[:6]) == list(range(6))  # k > n: every task once, then again in draw order
    a.observe(b0[0], [1.0, 0.0])
    state = json.loads(json.dumps(a.state_dict()))  # as the checkpoint's side file holds it
    after = [a.next(3) for _ in range(5)]
    b = PassRateSampler(6, seed=7)
    b.load_state_dict(state)
    assert [b.next(3) for _ in range(5)] == after
    with pytest.raises(ValueError, match="epoch sampler"):
        b.load_state_dict(TaskSampler(6, 7).state_dict())


def test_make_sampler():
    assert isinstance(make_sampler("epoch", 3, 0), TaskSampler)
    assert isinstance(make_sampler("pass_rate", 3, 0), PassRateSampler)
    with pytest.raises(ValueError, match="pass_rate"):
        make_sampler("bogus", 3, 0)


def test_trainer_feeds_the_pass_rate_sampler_and_resumes(tmp_path):
    from tests.training.test_trainer import Alternating, steps, tiny_cfg, tiny_factory

    from sqlrl.training.trainer import train

    cfg = tiny_cfg(steps=3, task_sampling="pass_rate")
    full = tmp_path / "full"
    train(cfg, full, policy_factory=tiny_factory, evaluator_factory=Alternating, progress=False)
    rows = steps(full)
    # 2 tasks x 4 rollouts a step, all scored: after step 1 two tasks are seen, never more than 6
    assert rows[0]["tasks_seen"] == 2 and all(2 <= r["tasks_seen"] <= 6 for r in rows)
    part = tmp_path / "part"
    train(cfg, part, policy_factory=tiny_factory, evaluator_factory=Alternating, progress=False, stop_after=1)
    train(cfg, part, resume=True, policy_factory=tiny_factory, evaluator_factory=Alternating, progress=False)
    again = steps(part)
    assert [r["tasks_seen"] for r in again] == [r["tasks_seen"] for r in rows]
    assert [r["reward_mean"] for r in again] == [r["reward_mean"] for r in rows]
