"""The Text-to-SQL environment: the policy writes SQL for a question; multi-turn, it may inspect results.

`Text2SQLEnv` supplies the hooks of `sqlrl.agent.loop.run_episodes` and owns (or borrows) its resources:
a read-only `Sandbox`, and for scoring a `GoldCache` and an `Evaluator` (build it with
`sqlrl.agent.envs.make_env`). Protocol and prompts: `sqlrl.agent.prompts`.

What is covered:
- Only `PublicTask`s are accepted: a `PrivateTask` (which holds the gold) is refused by type before
  anything reaches the policy, and again per task right before its prompt is built. Nothing the policy
  sees, and no stopping decision, depends on the gold: the evaluator receives the finished trajectory.
- The rollout runs in chunks of `chunk_size` (task, sample) items, task-major; each chunk is one batch of
  the loop, its sampling seeds offset by the chunk's first item index.
- The SQL of a turn goes to the sandbox in one `execute_many` (the chunk's inspect actions, in order).
- Answer: single-turn and `sql_budget` take the reply's SQL; `final`, `max_turns` and `context_budget`
  fall back to the last inspected SQL when the reply has none. With `agent.checker` the answer is
  executed in the sandbox and shown (`checker_message`: its result, never the gold); the
  checker reply may replace it (rule: `sqlrl.agent.loop`).

What is not: scoring during the episode (never), nor closing a borrowed sandbox or gold cache.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlrl.agent.loop import (
    Budgets,
    Environment,
    Sampling,
    Trajectory,
    run_episodes,
)
from sqlrl.agent.prompts import (
    INVALID_MESSAGE,
    ChatFormat,
    Parser,
    build_messages,
    checker_message,
    observation_message,
    prompt_options,
)
from sqlrl.tasks.data import PrivateTask, PublicTask, ensure_public

# Stop reasons whose answer falls back to the last inspected SQL when the reply has none.
_FALLBACK = ("final", "max_turns", "context_budget")


def check_public(tasks: Sequence[Any]) -> list[PublicTask]:
    """The tasks as `PublicTask`s; a `PrivateTask` (or a look-alike) raises TypeError."""
    out = []
    for t in tasks:
        if isinstance(t, PrivateTask):
            raise TypeError(
                f"run_agent received a PrivateTask ({t.public.task_id}): the rollout accepts only public tasks, "
                "so that the gold can never reach the policy. Pass `task.public` and score with the evaluator."
            )
        out.append(ensure_public(t))
    return out


class Text2SQLEnv(Environment):
    """Text-to-SQL episodes on `sandbox`; `gold_cache` and `evaluator` are needed only by `score`.
    `close()` closes the resources listed in `owned` (those the factory built), in order."""

    EXECUTE = "inspect"
    FINAL = "final"
    FINAL_REASON = "final"
    CHECKER = True

    def __init__(self, sandbox, gold_cache=None, evaluator=None, *, owned: Sequence[Any] = ()):
        self.sandbox = sandbox
        self.gold_cache = gold_cache
        self.evaluator = evaluator
        self._owned = list(owned)

    # ------------------------------------------------------------------------------- loop hooks

    def initial(self, task, sample: int, chat: ChatFormat, model: dict, budgets) -> tuple[Trajectory, list]:
        ensure_public(task)  # run-time check right before anything is shown to the policy
        messages = build_messages(task, turns=budgets.turns, **prompt_options(budgets))
        tr = Trajectory.from_prompt(
            chat,
            messages,
            task_id=task.task_id,
            db_id=task.db_id,
            question=task.question,
            sample=sample,
            model=model,
            budgets=budgets.to_dict(),
        )
        return tr, messages

    def parse(self, tr: Trajectory, text: str, multi_turn: bool):
        return Parser.parse(text, multi_turn=multi_turn)

    def finish(self, tr: Trajectory, reason: str, action=None, text: str | None = None) -> None:
        sql = action.sql if action is not None else None
        if reason in _FALLBACK:
            sql = sql or tr.last_inspected_sql
        tr.final_sql = sql
        tr.stop_reason = reason

    def execute(self, pairs: list[tuple[Trajectory, Any]], budgets) -> None:
        self._execute(pairs, [tr.turns[-1].sql for tr, _ in pairs], budgets)

    def execute_answers(self, pairs: list[tuple[Trajectory, Any]], budgets) -> None:
        self._execute(pairs, [tr.final_sql for tr, _ in pairs], budgets)

    def checker_observation(self, tr: Trajectory, budgets) -> str:
        return checker_message(tr.turns[-1].observation)

    def _execute(self, pairs: list[tuple[Trajectory, Any]], sqls: list[str], budgets) -> None:
        t0 = time.perf_counter()
        results = self.sandbox.execute_many([(task.db_path, sql) for (_, task), sql in zip(pairs, sqls)])
        exec_s = time.perf_counter() - t0
        for (tr, _), res in zip(pairs, results):
            tr.timings["exec_s"] += exec_s / len(pairs)
            tr.add_sql_result(res, budgets, "sandbox")

    def observation(self, tr: Trajectory, turn: int, budgets) -> str:
        last = tr.turns[-1]
        if last.action == self.EXECUTE:
            return observation_message(last.observation, turn, budgets.turns)
        return INVALID_MESSAGE

    # ------------------------------------------------------------------------------- rollout, scoring

    def rollout(
        self,
        tasks: Sequence[PublicTask],
        policy,
        budgets: Budgets,
        sampling: Sampling = Sampling(),
        *,
        n_samples: int = 1,
        chunk_size: int = 512,
        progress: bool | str = False,
    ) -> list[Trajectory]:
        """Run every task `n_samples` times; trajectories grouped task-major (task0 s0..sK, task1 ...)."""
        public = check_public(tasks)
        chat = ChatFormat(policy.tokenizer)
        items = [(t, s) for t in public for s in range(n_samples)]
        out: list[Trajectory] = []
        bar = None
        if progress:
            from tqdm.auto import tqdm

            desc = progress if isinstance(progress, str) else "rollouts"
            bar = tqdm(total=len(items), desc=desc, unit="traj")
        for start in range(0, len(items), chunk_size):
            chunk = items[start : start + chunk_size]
            out.extend(run_episodes(self, chunk, policy, budgets, sampling, seed_offset=start, chat=chat))
            if bar is not None:
                bar.update(len(chunk))
        if bar is not None:
            bar.close()
        return out

    def score(self, trajectories: list[Trajectory], tasks_by_id: dict) -> None:
        """`score_trajectories` with this environment's evaluator."""
        score_trajectories(trajectories, tasks_by_id, self.evaluator)


def run_agent(
    tasks: Sequence[PublicTask],
    policy,
    sandbox,
    budgets: Budgets,
    sampling: Sampling = Sampling(),
    *,
    n_samples: int = 1,
    chunk_size: int = 512,
    progress: bool | str = False,
) -> list[Trajectory]:
    """`Text2SQLEnv(sandbox).rollout(...)`: every task `n_samples` times, task-major."""
    return Text2SQLEnv(sandbox).rollout(
        tasks, policy, budgets, sampling, n_samples=n_samples, chunk_size=chunk_size, progress=progress
    )


def score_trajectories(trajectories: list[Trajectory], tasks_by_id: dict, evaluator) -> None:
    """Attach `reward` to each finished trajectory (after it ended; never during)."""
    todo = []
    for tr in trajectories:
        if not tr.done:
            raise RuntimeError(
                f"trajectory {tr.task_id} is not finished; the evaluator only scores ended trajectories"
            )
        if tr.infra_error:
            tr.reward = {"value": None, "status": "infra_error", "parts": {"error": tr.infra_error}}
        else:
            todo.append(tr)
    items = [(tr.final_sql, tasks_by_id[tr.task_id]) for tr in todo]
    if hasattr(evaluator, "score_many"):  # one batched sandbox round trip instead of one per trajectory
        rewards = evaluator.score_many(items)
    else:
        rewards = [evaluator.score(sql, task) for sql, task in items]
    for tr, r in zip(todo, rewards):
        tr.reward = {
            "value": r.value,
            "status": r.status,
            "parts": dict(r.parts),
            "exec_ms": getattr(r, "exec_ms", None),  # diagnostic: the sandbox's time on this SQL
        }
