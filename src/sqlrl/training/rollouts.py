"""The sample of one GRPO step: rollouts of fresh tasks, scored, grouped, with advantages.

What is covered:
- Tasks come from the run's sampler (`sqlrl.training.sampling`: an epoch permutation, or weighted by
  pass rate, fed each scored reward); the sampling seed of round r of
  step s is `seed * 1_000_003 + s + r * 10_000_019`, so round 0 is the step's seed of a run without
  dynamic sampling.
- Trajectories excluded for infrastructure reasons (reward value None) are left out of the groups and
  counted, never scored 0.
- Dynamic sampling (`grpo.dynamic_sampling_rounds` > 0, DAPO): groups whose rewards are all equal are
  dropped from the update and replaced from extra rounds on fresh tasks (at most that many rounds; the
  update may still have fewer than `prompts_per_step` groups). The step's reward, accuracy and group
  metrics describe the first round only.
- `run.log_sql`: every trajectory the reward scored, every round, one line in sql.jsonl.
- What scoring cost, over all rounds: its wall time (including any wait for the environment's
  `prefetch` of the round's golds, run in a thread beside generation), the trajectories scored
  `timeout` (a prediction that ran into `grpo.score_timeout_s`) and the sandbox's longest time on
  one final SQL.

What is not: a learning signal in any group (that is what `informative` and the metrics report).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlrl.artifacts import append_jsonl_many

logger = logging.getLogger(__name__)


def _start(fn: Any, tasks: list) -> threading.Thread | None:
    """`fn(tasks)` in a daemon thread (None when there is no `fn`). It only warms a cache: an exception
    is logged and left for scoring, which meets the same failure and reports it per trajectory."""
    if fn is None:
        return None

    def run() -> None:
        try:
            fn(tasks)
        except Exception as e:  # noqa: BLE001 - scoring reports it per trajectory
            logger.debug("gold prefetch failed (scoring will report it): %s: %s", type(e).__name__, e)

    th = threading.Thread(target=run, name="sqlrl-gold-prefetch", daemon=True)
    th.start()
    return th


def scored_groups(trajs: list) -> list[list]:
    """The scored trajectories (reward value not None) of one rollout call, grouped by task, in first-seen
    task order; a task whose every trajectory was excluded has no group."""
    groups: dict[str, list] = {}
    for tr in trajs:
        if tr.reward["value"] is not None:
            groups.setdefault(tr.task_id, []).append(tr)
    return list(groups.values())


def informative(group: list) -> bool:
    """A group carries a learning signal: at least two scored trajectories whose rewards differ (the
    complement of `grpo.group_advantages`' zero-variance groups, singletons included)."""
    values = [tr.reward["value"] for tr in group]
    return len(values) >= 2 and max(values) != min(values)


def sql_record(step: int, round_: int, tr: Any) -> dict:
    """One line of train/sql.jsonl: what the reward scored for one training trajectory, without text or
    token ids (step, dynamic-sampling round, task, sample, the SQL of every turn, final SQL, reward, and
    the sandbox's milliseconds on the final SQL when scoring it: which model SQL is slow)."""
    rw = tr.reward or {}
    parts = rw.get("parts") or {}
    return {
        "step": step,
        "round": round_,
        "task_id": tr.task_id,
        "db_id": tr.db_id,
        "sample": tr.sample,
        "turn_sql": [t.sql for t in tr.turns],
        "final_sql": tr.final_sql,
        "value": rw.get("value"),
        "status": rw.get("status"),
        "exec_ms": rw.get("exec_ms"),
        "execution_match": parts.get("execution_match"),
        "infra_error": tr.infra_error,
    }


@dataclass
class StepSample:
    """The trajectories of one step: the first round (`trajs`, `accs`: what the metrics describe), the
    groups the update trains on, and everything generated over all rounds."""

    trajs: list = field(default_factory=list)
    accs: list = field(default_factory=list)
    first_groups: list = field(default_factory=list)
    train_groups: list = field(default_factory=list)
    generated: list = field(default_factory=list)
    ds_rounds: int = 0
    t_roll: float = 0.0
    t_score: float = 0.0
    score_timeouts: int = 0  # trajectories of all rounds scored `timeout` (the statement limit hit)
    score_max_exec_ms: float = 0.0  # the sandbox's longest time on one trajectory's final SQL

    @property
    def valid(self) -> list:
        """The first round's scored trajectories."""
        return [tr for tr in self.trajs if tr.reward["value"] is not None]

    @property
    def train_valid(self) -> list:
        """The trajectories of the trained groups, group by group."""
        return [tr for grp in self.train_groups for tr in grp]


@dataclass
class RolloutSource:
    """What a step's rollouts need: environment, tasks and their sampler, policy, budgets, settings."""

    env: Any
    tasks: list
    sampler: Any
    policy: Any
    budgets: Any
    grpo: Any
    seed: int
    sql_log: Path | None  # sql.jsonl, when run.log_sql

    def round(self, sample: StepSample, step: int, r: int) -> tuple[list, list]:
        """Rollouts of `prompts_per_step` fresh tasks (round r of this step), scored."""
        from sqlrl.agent.loop import Sampling

        g = self.grpo
        picked = self.sampler.next(g.prompts_per_step)
        batch_tasks = [self.tasks[i] for i in picked]
        # the golds are fetched beside generation: scoring then pays for the predictions only
        warm = _start(getattr(self.env, "prefetch", None), batch_tasks)
        t_r = time.perf_counter()
        sampling_seed = self.seed * 1_000_003 + step + r * 10_000_019
        try:
            got = self.env.rollout(
                batch_tasks,
                self.policy,
                self.budgets,
                Sampling(temperature=g.temperature, top_p=g.top_p, seed=sampling_seed),
                g.group_size,
            )
        except Exception:  # no fetch outlives the round (the caller may close the environment)
            if warm is not None:
                warm.join()
            raise
        sample.t_roll += time.perf_counter() - t_r
        t_s = time.perf_counter()
        if warm is not None:
            warm.join()  # (what it did not finish, scoring does: the wait counts as scoring time)
        scored = self.env.score(got)
        sample.t_score += time.perf_counter() - t_s
        for tr in got:
            rw = tr.reward or {}
            sample.score_timeouts += rw.get("status") == "timeout"
            sample.score_max_exec_ms = max(sample.score_max_exec_ms, rw.get("exec_ms") or 0.0)
        observe = getattr(self.sampler, "observe", None)
        if observe is not None:  # a pass-rate sampler learns each task's rewards
            index = {self.tasks[i].task_id: i for i in picked}
            for tr in got:
                observe(index[tr.task_id], [tr.reward["value"]])
        if self.sql_log is not None:
            append_jsonl_many(self.sql_log, (sql_record(step, r, tr) for tr in got))
        return got, scored

    def sample(self, step: int) -> StepSample:
        """The step's first round, then dynamic-sampling rounds while informative groups are missing."""
        g = self.grpo
        s = StepSample()
        s.trajs, s.accs = self.round(s, step, 0)
        s.first_groups = scored_groups(s.trajs)
        s.train_groups = s.first_groups
        s.generated = list(s.trajs)
        if g.dynamic_sampling_rounds > 0:
            s.train_groups = [grp for grp in s.first_groups if informative(grp)]
            while len(s.train_groups) < g.prompts_per_step and s.ds_rounds < g.dynamic_sampling_rounds:
                s.ds_rounds += 1
                more, _ = self.round(s, step, s.ds_rounds)
                s.generated += more
                s.train_groups += [grp for grp in scored_groups(more) if informative(grp)]
            s.train_groups = s.train_groups[: g.prompts_per_step]
        return s


def advantages(train_groups: list, g):
    """Group-relative advantages of the trained groups' trajectories, in `StepSample.train_valid` order."""
    import torch

    from sqlrl.training.grpo import group_advantages

    train_valid = [tr for grp in train_groups for tr in grp]
    rewards = torch.tensor([tr.reward["value"] for tr in train_valid], dtype=torch.float32)
    gids = torch.tensor([k for k, grp in enumerate(train_groups) for _ in grp], dtype=torch.long)
    return group_advantages(rewards, gids, scale=g.adv_scale)[0] if len(train_valid) else torch.zeros(0)
