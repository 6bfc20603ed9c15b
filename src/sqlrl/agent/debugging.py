"""The SQL-debugging environment: a policy fixes a user's buggy SQL on its own writable replica.

`DebugEnv` supplies the hooks of `sqlrl.agent.loop.run_episodes` over a `ReplicaPool` (build it with
`sqlrl.agent.envs.make_env(kind="debug", ...)`); a `DebugTrajectory` is a `Trajectory` plus `extra`
(category, trajectory id, replica, submission, preprocess and scoring notes). Protocol (in the system
prompt): a reply with SQL and without the word SUBMIT is `execute_sql` (one statement, run on the
trajectory's own replica, its writes persisting there); a reply with SUBMIT is `submit_solution` (for
`query` tasks the last SQL block, else all blocks in order; a query task without SQL falls back to the
last executed SQL). Single-turn or on the last turn any SQL is the submission; neither SQL nor SUBMIT
is `invalid` and costs a turn. Preprocess SQL does not count against `max_sql_executions`.

What is covered:
- Only `DebugTaskPublic` reaches the rollout (TypeError before any lease or generation otherwise; each
  task is checked again right before its prompt is built). The gold (solution, tests) is used only by
  `score_debug_trajectories`, after the episode, on a FRESH temporary copy of the database
  (`run_episode_offline`), never on the explored replica: the score depends only on task and submission.
- Isolation: one replica per trajectory for its whole life; trajectory ids are unique within a call and
  a call never asks for more replicas of a database than the pool has (ValueError up front).
- Scoring releases the replica (dirty on an infrastructure error); an exception inside the rollout
  releases every lease it took (dirty). Infrastructure failures (policy, pool worker crash, failing
  preprocess SQL, unbuildable reference) give `infra_error`, reward None, never a wrong answer.

What is not: a submission that needs the agent's earlier writes fails (it must hold the whole fix);
leases of trajectories neither scored nor released (`release_debug_trajectories`) leak.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlrl.agent.loop import Budgets, Environment, Sampling, Trajectory, run_episodes
from sqlrl.agent.prompts import ChatFormat, Parser, truncate_schema
from sqlrl.sql.guard import split_statements
from sqlrl.tasks.debug_episode import ReferenceStates, run_episode_offline
from sqlrl.tasks.debugging import DebugTaskPrivate, DebugTaskPublic, ensure_public_debug

__all__ = [
    "ACTION_EXECUTE",
    "ACTION_INVALID",
    "ACTION_SUBMIT",
    "DebugAction",
    "DebugEnv",
    "DebugTrajectory",
    "build_debug_messages",
    "parse_debug_action",
    "release_debug_trajectories",
    "run_debug_agent",
    "score_debug_trajectories",
]

ACTION_EXECUTE = "execute_sql"
ACTION_SUBMIT = "submit_solution"
ACTION_INVALID = "invalid"

SYSTEM_DEBUG_SINGLE = (
    "You are an expert in SQLite helping a user fix their SQL. Given the database schema, the user's "
    "problem and their buggy SQL, reply with the corrected SQL in ```sql code block(s) and nothing else. "
    "For a query task give exactly one SELECT; for other tasks give the statement(s) that perform the "
    "requested change, in order."
)

SYSTEM_DEBUG_MULTI = (
    "You are an expert in SQLite helping a user fix their SQL. You work on your own writable copy of the "
    "user's database. Each turn, do exactly one of:\n"
    "1. execute_sql: write ONE SQL statement in a ```sql code block (without the word SUBMIT). It is "
    "executed on your copy and you see its result or its error. A statement that changes data or schema "
    "changes your copy for the rest of the task; that is for trying things out, it is not your solution.\n"
    "2. submit_solution: write the word SUBMIT followed by your corrected SQL in ```sql code block(s). "
    "This ends the task: your submission alone is applied to a fresh copy of the user's database (none "
    "of the statements you executed), then hidden tests check the result. For a query task submit "
    "exactly one SELECT; for other tasks submit all the statement(s) that perform the requested change, "
    "in order.\n"
    "You have {turns} turns and at most {executions} executions; on the last turn any SQL you write is "
    "your submission."
)

INVALID_DEBUG_MESSAGE = (
    "No SQL found. Write one statement in a ```sql code block to execute it, or reply SUBMIT followed by "
    "your solution in ```sql code block(s)."
)

_SUBMIT = re.compile(r"\bSUBMIT\b")
_FENCE_SQL = re.compile(r"```\s*sql\s*\n?(.*?)(?:```|$)", re.S | re.I)
_FENCE_ANY = re.compile(r"```[a-zA-Z]*\s*\n?(.*?)(?:```|$)", re.S)


# ------------------------------------------------------------------------------------------- records


@dataclass
class DebugTrajectory(Trajectory):
    """A `sqlrl.agent.loop.Trajectory` (question = the task description) plus debugging fields in `extra`:
    kind, category, trajectory_id, replica {worker, replica, path}, leased, submission (list of SQL),
    preprocess (statuses), n_preprocess, and after scoring: released_dirty, scoring_error."""

    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class DebugAction:
    kind: str  # execute_sql | submit_solution | invalid
    sql: str | None  # the statement to execute (execute_sql), else the last SQL block
    submission: tuple[str, ...] = ()  # the solution statements (submit_solution / last turn)


# ------------------------------------------------------------------------------------------- prompts


def build_debug_messages(task: DebugTaskPublic, budgets: Budgets) -> list[dict]:
    """The chat messages of the first prompt for a public debugging task."""
    ensure_public_debug(task)
    if budgets.turns == 1:
        system = SYSTEM_DEBUG_SINGLE
    else:
        system = SYSTEM_DEBUG_MULTI.format(turns=budgets.turns, executions=budgets.max_sql_executions)
    user = (
        f"Task category: {task.category}\n\n"
        f"Database schema:\n{truncate_schema(task.schema.strip(), budgets.max_schema_chars)}\n\n"
        f"Problem: {task.description.strip()}\n\n"
        f"My buggy SQL:\n```sql\n{task.buggy_sql.strip()}\n```"
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def debug_observation_message(result_text: str, turn: int, turns: int) -> str:
    tail = (
        "This is your last turn: reply with SUBMIT and your solution SQL."
        if turns - turn == 1
        else "Explore further with another ```sql block, or reply SUBMIT with your solution SQL."
    )
    return f"Execution result:\n{result_text}\n\n{tail}"


def _sql_blocks(text: str) -> list[str]:
    blocks = [b.strip() for b in _FENCE_SQL.findall(text) if b.strip()]
    if not blocks:
        blocks = [b.strip() for b in _FENCE_ANY.findall(text) if b.strip()]
    if not blocks:
        sql = Parser.extract_sql(text)  # bare SELECT / WITH
        blocks = [sql] if sql else []
    return blocks


def _submission(text: str, category: str) -> tuple[str, ...]:
    blocks = _sql_blocks(text)
    if category == "query":
        sql = Parser.extract_sql(text)
        return (sql,) if sql else ()
    return tuple(b for b in blocks if b.strip().strip(";").strip())


def parse_debug_action(text: str, *, multi_turn: bool, category: str) -> DebugAction:
    """Read a reply into a `DebugAction`. Deterministic and total: never raises."""
    sql = Parser.extract_sql(text)
    if not multi_turn or _SUBMIT.search(text):
        return DebugAction(ACTION_SUBMIT, sql, _submission(text, category))
    if sql:
        return DebugAction(ACTION_EXECUTE, sql)
    return DebugAction(ACTION_INVALID, None)


# ------------------------------------------------------------------------------------- the environment


def _check_public_debug(tasks: Sequence[Any]) -> list[DebugTaskPublic]:
    out = []
    for t in tasks:
        if isinstance(t, DebugTaskPrivate):
            raise TypeError(
                f"run_debug_agent received a DebugTaskPrivate ({t.task_id}): the rollout accepts only public "
                "tasks, so that the solution and the tests can never reach the policy. Pass `task.public` "
                "and score with score_debug_trajectories."
            )
        out.append(ensure_public_debug(t))
    return out


def _executed_sqls(tr: DebugTrajectory) -> list[str]:
    return [t.sql for t in tr.turns if t.action == ACTION_EXECUTE and t.sql_result is not None and t.sql]


def _finish(tr: DebugTrajectory, submission: Sequence[str], reason: str) -> None:
    sub = [s for s in submission if s and s.strip()]
    if not sub and tr.extra["category"] == "query":
        ex = _executed_sqls(tr)
        if ex:
            sub = [ex[-1]]
    tr.extra["submission"] = sub
    tr.final_sql = ";\n".join(sub) if sub else None
    tr.stop_reason = reason


class DebugEnv(Environment):
    """SQL-debugging episodes on per-trajectory replicas of `pool`; `close()` closes the resources listed
    in `owned` (those the factory built)."""

    EXECUTE = ACTION_EXECUTE
    FINAL = ACTION_SUBMIT
    FINAL_REASON = "submit"

    def __init__(self, pool, *, owned: Sequence[Any] = ()):
        self.pool = pool
        self._owned = list(owned)

    def capacity(self, db_id: str) -> int:
        """How many replicas of `db_id` the pool has (ValueError for a database it does not serve)."""
        try:
            return len(self.pool.replica_state(db_id))
        except KeyError:
            raise ValueError(f"the replica pool has no template for db_id {db_id!r}") from None

    # ------------------------------------------------------------------------------- loop hooks

    def initial(self, task, sample: int, chat: ChatFormat, model: dict, budgets) -> tuple[Trajectory, list]:
        ensure_public_debug(task)  # run-time check right before anything is shown to the policy
        messages = build_debug_messages(task, budgets)
        tr = DebugTrajectory.from_prompt(
            chat,
            messages,
            timings={"preprocess_s": 0.0},
            task_id=task.task_id,
            db_id=task.db_id,
            question=task.description,
            sample=sample,
            model=model,
            budgets=budgets.to_dict(),
            extra={
                "kind": "debug",
                "category": task.category,
                "trajectory_id": f"{task.task_id}#{sample}",
                "leased": False,
                "submission": [],
                "preprocess": [],
            },
        )
        return tr, messages

    def setup(self, tr: Trajectory, task, budgets) -> None:
        """Lease the trajectory's replica and run the task's preprocess SQL on it (through the pool)."""
        lease = self.pool.lease(tr.extra["trajectory_id"], task.db_id)
        tr.extra["leased"] = True
        tr.extra["replica"] = {"worker": lease.worker, "replica": lease.replica, "path": lease.path}
        t0 = time.perf_counter()
        for block in task.preprocess_sql:
            for stmt in split_statements(block):
                res = self.pool.execute(tr.extra["trajectory_id"], stmt, timeout_s=budgets.sql_timeout_s)
                tr.extra["preprocess"].append({"status": res.status, "message": res.message})
                if res.status != "ok":
                    tr.infra_error = f"preprocess: {res.status}: {res.message}"
                    tr.stop_reason = "infra_error"
                    break
            if tr.done:
                break
        tr.timings["preprocess_s"] = time.perf_counter() - t0

    def parse(self, tr: Trajectory, text: str, multi_turn: bool) -> DebugAction:
        return parse_debug_action(text, multi_turn=multi_turn, category=tr.extra["category"])

    def finish(self, tr: Trajectory, reason: str, action=None, text: str | None = None) -> None:
        if action is None:
            sub: Sequence[str] = ()
        elif reason in ("single_turn", self.FINAL_REASON):
            sub = action.submission
        else:  # last turn or SQL budget: the reply's SQL is the submission
            sub = _submission(text or "", tr.extra["category"])
        _finish(tr, sub, reason)

    def execute(self, pairs: list[tuple[Trajectory, Any]], budgets) -> None:
        for tr, _ in pairs:
            t0 = time.perf_counter()
            res = self.pool.execute(
                tr.extra["trajectory_id"], tr.turns[-1].sql, timeout_s=budgets.sql_timeout_s
            )
            tr.timings["exec_s"] += time.perf_counter() - t0
            tr.add_sql_result(res, budgets, "pool")

    def observation(self, tr: Trajectory, turn: int, budgets) -> str:
        last = tr.turns[-1]
        if last.action == self.EXECUTE:
            return debug_observation_message(last.observation or "", turn, budgets.turns)
        return INVALID_DEBUG_MESSAGE

    def abort(self, trajs: list[Trajectory]) -> None:
        release_debug_trajectories(trajs, self.pool, crashed=True)

    # ------------------------------------------------------------------------------- rollout, scoring

    def rollout(
        self,
        tasks: Sequence[DebugTaskPublic],
        policy,
        budgets: Budgets,
        sampling: Sampling = Sampling(),
        *,
        n_samples: int = 1,
        seed_offset: int = 0,
    ) -> list[DebugTrajectory]:
        """Run every task `n_samples` times (task-major order) as one batch; each trajectory leases its
        own replica, so the pool must have as many replicas of each database as trajectories on it.

        The returned trajectories still hold their leases: `score` them (or release them with
        `release_debug_trajectories`)."""
        public = _check_public_debug(tasks)
        if n_samples < 1:
            raise ValueError("n_samples must be >= 1")
        ids = [t.task_id for t in public]
        dup = [k for k, c in Counter(ids).items() if c > 1]
        if dup:
            raise ValueError(
                f"task ids must be unique within a call (trajectory ids would collide): {dup[:3]}"
            )
        for db_id, n in Counter(t.db_id for t in public).items():
            cap = self.capacity(db_id)
            if n * n_samples > cap:
                raise ValueError(
                    f"{n * n_samples} trajectories on {db_id!r} but the pool has {cap} replicas of it; "
                    "run fewer tasks per call (evaluate_debug splits into waves)"
                )
        items = [(t, s) for t in public for s in range(n_samples)]
        return run_episodes(self, items, policy, budgets, sampling, seed_offset=seed_offset)

    def score(self, trajs: Sequence[DebugTrajectory], private_by_id: dict, **kw) -> None:
        """`score_debug_trajectories` on this environment's pool (`timeout_s`, `threads`)."""
        score_debug_trajectories(trajs, private_by_id, self.pool, **kw)


def run_debug_agent(
    tasks: Sequence[DebugTaskPublic],
    policy,
    pool,
    budgets: Budgets,
    sampling: Sampling = Sampling(),
    *,
    n_samples: int = 1,
    seed_offset: int = 0,
) -> list[DebugTrajectory]:
    """`DebugEnv(pool).rollout(...)`: every task `n_samples` times, task-major, each on its own replica."""
    return DebugEnv(pool).rollout(
        tasks, policy, budgets, sampling, n_samples=n_samples, seed_offset=seed_offset
    )


# ------------------------------------------------------------------------------------------- scoring


def release_debug_trajectories(trajs: Sequence[DebugTrajectory], pool, *, crashed: bool = True) -> None:
    """Release the leases still held by `trajs` without scoring (dirty by default)."""
    for tr in trajs:
        if tr.extra.get("leased"):
            try:
                tr.extra["released_dirty"] = pool.release(tr.extra["trajectory_id"], crashed=crashed)
            except KeyError:
                pass
            tr.extra["leased"] = False


def _reward(r: dict) -> dict:
    return {
        "value": r["value"],
        "status": r["status"],
        "parts": {"passed": r["passed"], "total": r["total"], "message": r["message"]},
    }


def score_debug_trajectories(
    trajs: Sequence[DebugTrajectory],
    private_by_id: dict[str, DebugTaskPrivate],
    pool,
    *,
    timeout_s: float = 10.0,
    threads: int | None = None,
) -> None:
    """After the trajectories ended: score each submission on a fresh temporary copy of its task's
    database (`run_episode_offline`: preprocess, the submission applied once, hidden tests), never on
    the explored replica; write `traj.reward` = {value, status, parts: {passed, total, message}};
    release the replica (dirty only on an infrastructure error; otherwise the pool decides).
    Every trajectory and its task are checked before anything is scored or released. Submissions are
    scored in `threads` threads (default: up to 8, one per CPU; SQLite and file copies run outside the
    GIL) with each task's reference end state built once (`sqlrl.tasks.debugging.ReferenceStates`); the replicas
    are released afterwards, in order, from the calling thread."""
    for tr in trajs:
        if not tr.done:
            raise RuntimeError(f"trajectory {tr.task_id}#{tr.sample} is not finished; score only ended ones")
    tasks = []
    for tr in trajs:
        task = private_by_id.get(tr.task_id)
        if not isinstance(task, DebugTaskPrivate) or task.public.task_id != tr.task_id:
            raise TypeError(f"private_by_id[{tr.task_id!r}] must be the DebugTaskPrivate of that task")
        tasks.append(task)

    def score_one(tr: DebugTrajectory, task: DebugTaskPrivate, refs: ReferenceStates) -> tuple[dict, bool]:
        """(reward dict, infrastructure failure)."""
        if tr.infra_error:
            return _infra(tr.infra_error), True
        if not tr.extra.get("leased"):
            return _infra("no replica"), True
        try:
            sub = list(tr.extra.get("submission") or [])  # [] -> no_sql
            r = run_episode_offline(task, sub, timeout_s=timeout_s, references=refs)
            return r, r["status"] == "infra_error"
        except (OSError, sqlite3.Error) as e:
            tr.extra["scoring_error"] = f"{type(e).__name__}: {e}"
            return _infra(str(e)), True

    from concurrent.futures import ThreadPoolExecutor

    n = max(1, min(len(trajs), threads or min(8, os.cpu_count() or 1)))
    scored: list[tuple[dict, bool] | None] = [None] * len(trajs)
    try:
        with (
            ReferenceStates(timeout_s) as refs,
            ThreadPoolExecutor(n, thread_name_prefix="sqlrl-debugscore") as ex,
        ):
            for k, got in enumerate(ex.map(score_one, trajs, tasks, [refs] * len(trajs))):
                scored[k] = got
    finally:
        for tr, got in zip(trajs, scored):
            r, infra = got if got is not None else (_infra("scoring did not finish"), True)
            if tr.extra.get("leased"):
                # `crashed=True` is the pool's only way to force a dirty release (after an infrastructure
                # error the replica's state is not known)
                tr.extra["released_dirty"] = pool.release(tr.extra["trajectory_id"], crashed=infra)
                tr.extra["leased"] = False
            tr.reward = _reward(r)


def _infra(message: str) -> dict:
    return {"value": None, "status": "infra_error", "passed": 0, "total": 0, "message": message}
