"""GRPO training's statement limit on predictions when the reward scores them (`grpo.score_timeout_s`),
against evaluation's (`agent.sql_timeout_s`), with a scripted policy on the embedded Spider slice."""

from __future__ import annotations

import json

from sqlrl import config as C
from sqlrl.agent.envs import make_env
from sqlrl.agent.loop import Budgets
from sqlrl.evaluation.runner import evaluate_tasks
from sqlrl.generation.scripted import ScriptedPolicy
from sqlrl.tasks.goldcache import GoldCache
from sqlrl.training.rollouts import RolloutSource, StepSample
from sqlrl.training.sampling import TaskSampler

# never ends on its own: only a statement limit stops it
ENDLESS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


def cfg(**grpo):
    return C.from_dict(
        {
            "model": {"name": "tiny"},
            "data": {"path": "embedded", "max_train_tasks": 2},
            "agent": {"sql_timeout_s": 1.5},
            "grpo": {"prompts_per_step": 1, "group_size": 2, **grpo},
            "run": {"device": "cpu", "loggers": [], "sandbox_workers": 1},
        }
    )


def endless(text, turn):
    return f"```sql\n{ENDLESS}\n```"


def test_slow_prediction_is_cut_at_the_training_deadline_and_evaluation_keeps_its_limit(tmp_path):
    c = cfg(score_timeout_s=0.25)
    policy = ScriptedPolicy(endless)
    budgets = Budgets.from_config(c.agent)
    with make_env(c, tmp_path / "run") as env:
        src = RolloutSource(env, env.tasks, TaskSampler(len(env.tasks), 0), policy, budgets, c.grpo, 0, None)
        sample = StepSample()
        trajs, accs = src.round(sample, 1, 0)
        task = env.tasks[0]
    assert [tr.final_sql for tr in trajs] == [ENDLESS, ENDLESS]
    assert [(tr.reward["status"], tr.reward["value"]) for tr in trajs] == [("timeout", 0.0)] * 2
    assert all("time limit of 0.25 s" in tr.reward["parts"]["message"] for tr in trajs)
    assert accs == [0.0, 0.0]
    assert sample.score_timeouts == 2 and sample.score_max_exec_ms >= 250  # recorded in steps.jsonl

    # the same prediction in evaluation: the evaluation limit (agent.sql_timeout_s), not training's
    with make_env(workers=1, timeout_s=budgets.sql_timeout_s) as ev_env:
        out = evaluate_tasks(
            [task], policy, ev_env.sandbox, GoldCache(tmp_path / "gc"), budgets, progress=False
        )
    (r,) = out.results
    assert (r["status"], r["reward"]) == ("timeout", 0.0) and r["exec_ms"] >= 1500
    assert "time limit of 1.5 s" in out.trajectories[0].reward["parts"]["message"]


def test_score_timeout_zero_means_the_agents_limit(tmp_path):
    c = cfg(score_timeout_s=0)
    with make_env(c, tmp_path / "run") as env:
        assert env.evaluator.timeout_s is None and env.sandbox.timeout_s == 1.5
    assert cfg().grpo.score_timeout_s == 1.0


def test_negative_score_timeout_is_refused():
    import pytest

    with pytest.raises(C.ConfigError, match="grpo.score_timeout_s must be >= 0"):
        cfg(score_timeout_s=-1)


def test_a_run_saved_before_the_setting_resumes_only_with_its_behaviour():
    """A config.json without grpo.score_timeout_s scored with the agent's limit: it resumes with 0
    (that behaviour) and is refused with the 1 s default (its rewards would change mid-run)."""
    from sqlrl.training.runfolder import config_changes

    mine = json.loads(json.dumps(cfg(score_timeout_s=0).resolve()))
    saved = json.loads(json.dumps(mine))
    del saved["grpo"]["score_timeout_s"]
    assert config_changes(saved, mine) == ([], [])
    assert config_changes(saved, json.loads(json.dumps(cfg().resolve())))[0] == ["grpo.score_timeout_s"]


def test_the_batch_golds_are_fetched_beside_generation_and_scoring_waits_for_them(tmp_path):
    import threading
    import time

    c = cfg()
    events: list = []
    with make_env(c, tmp_path / "run") as env:
        real_prefetch, real_score = env.prefetch, env.score

        def prefetch(batch):
            events.append(("prefetch", [t.task_id for t in batch], hasattr(batch[0], "gold_sql")))
            time.sleep(0.3)  # still running when generation (scripted: instant) ends
            real_prefetch(batch)
            events.append(("prefetched", threading.current_thread().name))

        def score(trajs):
            events.append(("score", len(trajs)))
            return real_score(trajs)

        env.prefetch, env.score = prefetch, score
        sampler = TaskSampler(len(env.tasks), 0)
        src = RolloutSource(
            env,
            env.tasks,
            sampler,
            ScriptedPolicy(lambda t, n: "```sql\nSELECT 1\n```"),
            Budgets.from_config(c.agent),
            c.grpo,
            0,
            None,
        )
        sample = StepSample()
        trajs, _ = src.round(sample, 1, 0)
        misses = env.evaluator.gold_cache.misses
        env.prefetch = lambda batch: 1 / 0  # a failing prefetch only loses the warm-up
        trajs2, _ = src.round(StepSample(), 2, 0)
    (kind, ids, private), (done, thread), scored = events[:3]
    assert (kind, private, done, thread, scored) == (
        "prefetch",
        True,
        "prefetched",
        "sqlrl-gold-prefetch",
        ("score", 2),
    )
    assert ids == [trajs[0].task_id]
    assert misses >= 1 and all(tr.reward["status"] in ("match", "mismatch") for tr in trajs + trajs2)


def test_a_failing_generation_leaves_no_prefetch_running():
    """Generation raises while the golds are being fetched: the round waits for the fetch before the
    exception leaves it, so no thread of the round still reads the gold cache when the caller closes
    the environment."""
    import threading

    import pytest

    started, release, done = threading.Event(), threading.Event(), []

    class Env:
        def prefetch(self, batch):
            started.set()
            release.wait(1.0)  # nothing sets it: the fetch ends 1 s after it began
            done.append(len(batch))

        def rollout(self, *args):
            started.wait(5.0)
            raise RuntimeError("generation failed")

    c = cfg()
    src = RolloutSource(Env(), ["t0"], TaskSampler(1, 0), None, None, c.grpo, 0, None)
    with pytest.raises(RuntimeError, match="generation failed"):
        src.round(StepSample(), 1, 0)
    assert done == [1]
    assert not [t for t in threading.enumerate() if t.name == "sqlrl-gold-prefetch"]
