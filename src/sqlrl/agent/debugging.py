"""The SQL-debugging agent: a policy fixes a user's buggy SQL on its own writable replica of the database.

Same budgets (`sqlrl.agent.loop.Budgets`, the `[agent]` config), sampling and trajectory records as the
Text-to-SQL agent (`sqlrl.agent.loop`): a `DebugTrajectory` IS a `Trajectory` plus an `extra` dict (category,
trajectory id, replica, submission, preprocess and scoring notes). Training integration is not here.

Protocol (stated to the model in the system prompt):
- `execute_sql`: a reply with SQL (the last ```sql block, like `Parser`) and without the word SUBMIT
  (upper case, as a word). The statement runs on the trajectory's OWN replica through
  `ReplicaPool.execute` (one statement per call), WITH side effects that persist on that replica for
  the rest of the trajectory (what the agent sees next); the rendered result (or structured error)
  comes back as the next user message. Exploration is not the solution: see scoring below.
- `submit_solution`: a reply containing SUBMIT. Its SQL is the solution: for `query` tasks the last SQL
  block (one SELECT); for other categories all ```sql blocks in order (each may hold several
  statements). SUBMIT without SQL: a query task falls back to the last executed SQL (a SELECT has no
  side effects); other categories get no fallback (which executed statements make up the fix is not
  known) -> no_sql.
- single-turn (`turns == 1`): the reply's SQL is the submission. On the last turn any SQL is the
  submission. A reply with neither SQL nor SUBMIT is `invalid` and costs a turn.
- Budgets: `turns`; `max_new_tokens` per turn; `max_sql_executions` (an execution request beyond it
  ends the trajectory with `sql_budget`, its SQL being the submission, as in agent.py); preprocess SQL
  does not count; `max_context_tokens` (a turn that might not fit ends with `context_budget`);
  `max_schema_chars` (`prompts.truncate_schema`); `observation_rows` / `observation_chars`;
  `sql_timeout_s` per execution.

Life of a trajectory (id `f"{task_id}#{sample}"`): `run_debug_agent` leases a replica
(`pool.lease(id, db_id)`), runs the task's preprocess SQL on it (through the pool), then the turns;
the trajectory is returned STILL HOLDING its lease. `score_debug_trajectories` then scores the
submission on a FRESH temporary copy of the task's database (`debugtasks.run_episode_offline`: copy,
preprocess SQL, the submission applied once, hidden tests against a reference end state built on
another temporary copy, built once per task and call: `debugtasks.ReferenceStates`), in a thread pool,
never on the replica the agent explored, and releases the replica.
`evaluate_debug` does both in waves that fit the pool. (Until 2026-11-29 the submission was applied
to the explored replica; the first GPU curriculum showed why that was wrong: models run their fix
with execute_sql and then submit it, so a write ran twice, e.g. "duplicate column", and 3-turn
management accuracy fell to 19 % from 81 % at 1 turn: results/2026-11-29-debug-curriculum-gpu-submission-as-left.)

Guaranteed:
- Only `DebugTaskPublic` is accepted by `run_debug_agent`: a `DebugTaskPrivate` (or anything else)
  raises TypeError before any lease and before anything reaches the policy; every task is checked
  again with `ensure_public_debug` right before its prompt is built. The gold (solution, tests,
  clean-up) is only used by `score_debug_trajectories`, after the trajectory ended, and never touches
  the replica before then (the reference is built by debugtasks on its own temporary copy).
- Isolation: each trajectory has its own replica for its whole life (the pool leases a replica to at
  most one trajectory at a time), so two trajectories of the same task never see each other's writes.
- The score depends only on the task and the submission: the same submission gets the same reward
  whatever the agent executed before (exploration writes, TEMP objects, a dropped table).
- After scoring, the replica is released; the scorer never writes to it, so the pool's own dirty
  detection decides (writes by `execute_sql` and the preprocess SQL are seen by its authorizer); an
  infrastructure error releases it dirty (`crashed=True`), so it is reset before its next lease.
- Token-in/token-out exactly as agent.py: one token sequence (prompt, then each turn's generated ids as
  produced and the observation delta from `ChatFormat.observation_ids`); `loss_mask` is 1 exactly on
  generated tokens; `logprobs` holds generation log-probabilities there, 0.0 elsewhere.
- Infrastructure failures (policy `PolicyInfraError`, pool worker crash, failing preprocess SQL, a
  reference that cannot be built) give status `infra_error` with reward value None: excluded from
  scoring, never counted as a wrong answer.
- Trajectory ids are unique within a call (a task id given twice is a ValueError), and a call never
  asks for more replicas of a database than the pool has (ValueError up front).

Not guaranteed:
- A submission that needs the agent's earlier writes to work (e.g. it fills a column an executed
  ALTER added) fails: the submission must hold every statement of the fix, as the prompt says.
- Same trajectories under a different batch composition in bf16 (see agent.py).
- `run_debug_agent` leaks leases if the caller never scores / releases the returned trajectories
  (`release_debug_trajectories` releases without scoring); on an exception inside it, every lease it
  took is released (dirty) before the exception propagates.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlrl.agent.loop import Budgets, Sampling, Trajectory, generate_turn
from sqlrl.agent.prompts import ChatFormat, Parser, truncate_schema
from sqlrl.sql.guard import split_statements
from sqlrl.tasks.debug_episode import ReferenceStates, run_episode_offline
from sqlrl.tasks.debugging import DebugTaskPrivate, DebugTaskPublic, ensure_public_debug

__all__ = [
    "ACTION_EXECUTE",
    "ACTION_INVALID",
    "ACTION_SUBMIT",
    "DebugAction",
    "DebugTrajectory",
    "build_debug_messages",
    "evaluate_debug",
    "parse_debug_action",
    "release_debug_trajectories",
    "run_debug_agent",
    "score_debug_trajectories",
    "summarize_debug",
    "write_debug_eval_run",
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


# ----------------------------------------------------------------------------------------- the loop


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


def _capacity(pool, db_id: str) -> int:
    try:
        return len(pool.replica_state(db_id))
    except KeyError:
        raise ValueError(f"the replica pool has no template for db_id {db_id!r}") from None


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
    """Run every task `n_samples` times (task-major order); each trajectory leases its own replica.

    The returned trajectories still hold their leases: score them with `score_debug_trajectories`
    (or release them with `release_debug_trajectories`). All trajectories of one call run as one batch,
    so the pool must have at least as many replicas of each database as trajectories on it.
    """
    public = _check_public_debug(tasks)
    if n_samples < 1:
        raise ValueError("n_samples must be >= 1")
    ids = [t.task_id for t in public]
    dup = [k for k, c in Counter(ids).items() if c > 1]
    if dup:
        raise ValueError(f"task ids must be unique within a call (trajectory ids would collide): {dup[:3]}")
    need = Counter(t.db_id for t in public)
    for db_id, n in need.items():
        cap = _capacity(pool, db_id)
        if n * n_samples > cap:
            raise ValueError(
                f"{n * n_samples} trajectories on {db_id!r} but the pool has {cap} replicas of it; "
                "run fewer tasks per call (evaluate_debug splits into waves)"
            )
    chat = ChatFormat(policy.tokenizer)
    model_info = {"name": getattr(policy, "name", None), "identity": getattr(policy, "identity", None)}
    eos_ids = set(getattr(policy, "eos_token_ids", []) or [])
    trajs: list[DebugTrajectory] = []
    histories: list[list[dict]] = []
    try:
        for task in public:
            for s in range(n_samples):
                ensure_public_debug(task)  # run-time check right before anything is shown to the policy
                messages = build_debug_messages(task, budgets)
                tid = f"{task.task_id}#{s}"
                tr = DebugTrajectory.from_prompt(
                    chat,
                    messages,
                    timings={"preprocess_s": 0.0},
                    task_id=task.task_id,
                    db_id=task.db_id,
                    question=task.description,
                    sample=s,
                    model=model_info,
                    budgets=budgets.to_dict(),
                    extra={
                        "kind": "debug",
                        "category": task.category,
                        "trajectory_id": tid,
                        "leased": False,
                        "submission": [],
                        "preprocess": [],
                    },
                )
                trajs.append(tr)
                histories.append(messages)
                lease = pool.lease(tid, task.db_id)
                tr.extra["leased"] = True
                tr.extra["replica"] = {"worker": lease.worker, "replica": lease.replica, "path": lease.path}
                _preprocess(tr, task, pool, budgets)
        _turns(trajs, histories, policy, pool, budgets, sampling, chat, eos_ids, seed_offset)
    except BaseException:
        release_debug_trajectories(trajs, pool, crashed=True)
        raise
    return trajs


def _preprocess(tr: DebugTrajectory, task: DebugTaskPublic, pool, budgets: Budgets) -> None:
    t0 = time.perf_counter()
    tid = tr.extra["trajectory_id"]
    for block in task.preprocess_sql:
        for stmt in split_statements(block):
            res = pool.execute(tid, stmt, timeout_s=budgets.sql_timeout_s)
            tr.extra["preprocess"].append({"status": res.status, "message": res.message})
            if res.status != "ok":
                tr.infra_error = f"preprocess: {res.status}: {res.message}"
                tr.stop_reason = "infra_error"
                break
        if tr.done:
            break
    tr.timings["preprocess_s"] = time.perf_counter() - t0


def _turns(trajs, histories, policy, pool, budgets: Budgets, sampling: Sampling, chat, eos_ids, seed_offset):
    multi = budgets.multi_turn
    for turn in range(1, budgets.turns + 1):
        ready = []
        for i, tr in enumerate(trajs):
            if tr.done:
                continue
            if len(tr.token_ids) + budgets.max_new_tokens > budgets.max_context_tokens:
                _finish(tr, (), "context_budget")
            else:
                ready.append(i)
        if not ready:
            break
        out = generate_turn(policy, [trajs[i] for i in ready], budgets, sampling, turn, seed_offset)
        if out is None:
            break
        gens, gen_s = out
        to_exec: list[int] = []
        for i, g in zip(ready, gens):
            tr = trajs[i]
            action = parse_debug_action(g.text, multi_turn=multi, category=tr.extra["category"])
            tr.add_completion(g, action.kind, action.sql, gen_s / len(ready))
            if not multi:
                _finish(tr, action.submission, "single_turn")
            elif action.kind == ACTION_SUBMIT:
                _finish(tr, action.submission, "submit")
            elif turn == budgets.turns:
                _finish(tr, _submission(g.text, tr.extra["category"]), "max_turns")
            elif action.kind == ACTION_EXECUTE:
                if tr.n_executions >= budgets.max_sql_executions:
                    _finish(tr, _submission(g.text, tr.extra["category"]), "sql_budget")
                else:
                    to_exec.append(i)
            # invalid: observation below, costs the turn
        for i in to_exec:
            tr = trajs[i]
            t0 = time.perf_counter()
            res = pool.execute(tr.extra["trajectory_id"], tr.turns[-1].sql, timeout_s=budgets.sql_timeout_s)
            tr.timings["exec_s"] += time.perf_counter() - t0
            tr.add_sql_result(res, budgets, "pool")
        if multi and turn < budgets.turns:
            for i in ready:
                tr = trajs[i]
                if tr.done:
                    continue
                last = tr.turns[-1]
                if last.action == ACTION_EXECUTE:
                    obs = debug_observation_message(last.observation or "", turn, budgets.turns)
                else:
                    obs = INVALID_DEBUG_MESSAGE
                histories[i] = tr.add_observation(chat, histories[i], obs, eos_ids)
    for tr in trajs:
        if not tr.done:  # defensive: loop ended without a decision
            _finish(tr, (), "max_turns")


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
    GIL) with each task's reference end state built once (`debugtasks.ReferenceStates`); the replicas
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


# ---------------------------------------------------------------------------------------- evaluation


def _results(trajs: Sequence[DebugTrajectory]) -> list[dict]:
    out = []
    for tr in trajs:
        rw = tr.reward or {}
        value = rw.get("value")
        parts = rw.get("parts") or {}
        out.append(
            {
                "task_id": tr.task_id,
                "sample": tr.sample,
                "db_id": tr.db_id,
                "category": tr.extra.get("category"),
                "final_sql": tr.final_sql,
                "submission": list(tr.extra.get("submission") or []),
                "status": rw.get("status"),
                "reward": value,
                "solved": None if value is None else rw.get("status") == "solved",
                "passed": parts.get("passed"),
                "total": parts.get("total"),
                "turns": len(tr.turns),
                "n_executions": tr.n_executions,
                "stop_reason": tr.stop_reason,
            }
        )
    return out


def summarize_debug(results: Sequence[dict], trajectories: Sequence[DebugTrajectory] = ()) -> dict:
    """n (scored), mean_reward, solved_rate, status_counts, per_category {n, solved, mean_reward}, ..."""
    scored = [r for r in results if r["reward"] is not None]
    n = len(scored)
    per_cat: dict[str, dict] = defaultdict(lambda: {"n": 0, "solved": 0, "reward_sum": 0.0})
    for r in scored:
        d = per_cat[r["category"]]
        d["n"] += 1
        d["solved"] += int(bool(r["solved"]))
        d["reward_sum"] += r["reward"]
    per_category = {
        c: {"n": d["n"], "solved": d["solved"], "mean_reward": d["reward_sum"] / d["n"] if d["n"] else None}
        for c, d in sorted(per_cat.items())
    }
    return {
        "kind": "debug",
        "n": n,
        "n_trajectories": len(results),
        "excluded": sum(r["reward"] is None for r in results),
        "mean_reward": sum(r["reward"] for r in scored) / n if n else None,
        "solved_rate": sum(bool(r["solved"]) for r in scored) / n if n else None,
        "status_counts": dict(Counter(r["status"] for r in results)),
        "per_category": per_category,
        "stop_reasons": dict(Counter(r["stop_reason"] for r in results)),
        "mean_turns": sum(r["turns"] for r in results) / len(results) if results else None,
        "generated_tokens": sum(tr.generated_tokens for tr in trajectories),
        "generation_s": round(sum(tr.timings.get("gen_s", 0.0) for tr in trajectories), 3),
    }


def evaluate_debug(
    tasks_private: Sequence[DebugTaskPrivate],
    policy,
    budgets: Budgets,
    *,
    pool_root: str | Path,
    sampling: Sampling = Sampling(temperature=0.0, seed=0),
    n_samples: int = 1,
    replicas_per_db: int = 4,
    workers: int = 2,
    pool=None,
    timeout_s: float = 10.0,
) -> tuple[list[DebugTrajectory], list[dict], dict]:
    """Roll out and score debugging tasks. Returns (trajectories, results, summary).

    A `ReplicaPool` over the tasks' databases is created under `pool_root` (and closed at the end)
    unless `pool` is given. Tasks run in waves (in order) that fit the pool's replicas; each wave is
    scored, releasing its replicas, before the next starts."""
    from sqlrl.sql.replicas import ReplicaPool

    tasks = list(tasks_private)
    for t in tasks:
        if not isinstance(t, DebugTaskPrivate):
            raise TypeError("evaluate_debug takes DebugTaskPrivate tasks (it scores them)")
    t_start = time.perf_counter()
    own = pool is None
    if own:
        templates = {t.public.db_id: t.public.db_path for t in tasks}
        pool = ReplicaPool(
            templates,
            pool_root,
            replicas_per_db=max(replicas_per_db, n_samples),
            workers=workers,
            timeout_s=budgets.sql_timeout_s,
        )
    try:
        waves: list[list[DebugTaskPrivate]] = []
        used: Counter = Counter()
        for t in tasks:
            db = t.public.db_id
            if waves and used[db] + n_samples <= _capacity(pool, db):
                waves[-1].append(t)
            else:
                waves.append([t])
                used = Counter()
            used[db] += n_samples
        by_id = {t.task_id: t for t in tasks}
        trajs: list[DebugTrajectory] = []
        done = 0
        for wave in waves:
            w = run_debug_agent(
                [t.public for t in wave],
                policy,
                pool,
                budgets,
                sampling,
                n_samples=n_samples,
                seed_offset=done * n_samples,
            )
            score_debug_trajectories(w, by_id, pool, timeout_s=timeout_s)
            trajs.extend(w)
            done += len(wave)
    finally:
        if own:
            pool.close()
    results = _results(trajs)
    summary = summarize_debug(results, trajs)
    summary["n_tasks"] = len(tasks)
    summary["n_samples"] = n_samples
    summary["budgets"] = budgets.to_dict()
    summary["elapsed_s"] = round(time.perf_counter() - t_start, 3)
    return trajs, results, summary


def write_debug_eval_run(
    out_dir: str | Path,
    trajectories: Sequence[DebugTrajectory],
    results: Sequence[dict],
    summary: dict,
    provenance: dict | None = None,
) -> None:
    """Write trajectories.jsonl, results.jsonl, summary.json (and run.json with a provenance)."""
    from sqlrl.artifacts import write_json_atomic, write_jsonl

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "trajectories.jsonl", (tr.to_dict() for tr in trajectories))
    write_jsonl(out / "results.jsonl", list(results))
    summ = dict(summary)
    if provenance:
        for k in ("model", "fingerprint", "split", "machine"):
            if k in provenance:
                summ[k] = provenance[k]
        write_json_atomic(out / "run.json", provenance)
    write_json_atomic(out / "summary.json", summ)


def category_table(results: Sequence[dict]) -> dict:
    """Evaluation by category: for each of query / management / personalization and `all`:
    n_trajectories, n (scored), excluded (reward None, e.g. infra_error), solved, accuracy (= solved / n,
    the solved rate) and mean_pass_fraction (mean fraction of hidden tests passed over scored ones)."""
    from sqlrl.tasks.debugging import CATEGORIES

    out: dict[str, dict] = {}
    for cat in (*CATEGORIES, "all"):
        rows = [r for r in results if cat == "all" or r.get("category") == cat]
        scored = [r for r in rows if r.get("reward") is not None]
        n = len(scored)
        solved = sum(bool(r.get("solved")) for r in scored)
        out[cat] = {
            "n_trajectories": len(rows),
            "n": n,
            "excluded": len(rows) - n,
            "solved": solved,
            "accuracy": solved / n if n else None,
            "mean_pass_fraction": sum(r["reward"] for r in scored) / n if n else None,
        }
    return out


def category_table_md(rows: Sequence[tuple[str, dict]]) -> str:
    """A markdown table: one row per (label, category_table(...)); cells 'solved/n (acc %), pass frac'."""
    from sqlrl.tasks.debugging import CATEGORIES

    cols = (*CATEGORIES, "all")
    lines = [
        "| model | " + " | ".join(cols) + " | excluded |",
        "| --- | " + " | ".join("---" for _ in cols) + " | --- |",
    ]
    for label, tab in rows:
        cells = []
        for c in cols:
            d = tab[c]
            if not d["n"]:
                cells.append("-")
                continue
            cells.append(
                f"{d['solved']}/{d['n']} ({100 * d['accuracy']:.1f}%), pass {d['mean_pass_fraction']:.3f}"
            )
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {tab['all']['excluded']} |")
    return "\n".join(lines) + "\n"
