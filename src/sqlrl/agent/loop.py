"""The one rollout loop: a policy acting as an agent in an environment, under fixed, recorded budgets.

`run_episodes(env, items, policy, budgets, sampling)` drives an `Environment` through its hooks (modelled on
verifiers' MultiTurnEnv): `initial` (the first prompt), `setup` (side effects before the first turn),
`parse` (a reply -> an action), `execute` (the actions' SQL, batched), `observation` (the next user
message), `finish` (the answer and stop reason); with `agent.checker`, `execute_answers` and
`checker_observation`. Scoring is not a hook of the loop: an environment scores the finished
trajectories afterwards. Environments: `sqlrl.agent.text2sql`, `sqlrl.agent.debugging`.

What is covered:
- Batching: each turn, all live trajectories of the call go to `policy.generate` in one call, in item
  order, with a sampling seed that is a function of (seed, turn, seed_offset) only.
- Stopping rules are the loop's, for every environment: single-turn, final action, last turn, SQL
  execution budget, context budget; an invalid reply costs a turn.
- Budgets (`Budgets`) are explicit, fixed for a run and written into every trajectory; two runs are
  comparable only if their budgets are equal (`Budgets.__eq__`).
- Token-in/token-out: a trajectory is one token sequence (first prompt, then for each turn the
  generated ids exactly as produced and the observation delta). `loss_mask` is 1 exactly on generated
  tokens; `logprobs` holds the generation-time log-probabilities there (0.0 elsewhere).
- A policy infrastructure failure marks the trajectory `infra_error`; it is excluded from scoring,
  never counted as a wrong answer.
- Checker (`agent.checker`): one extra turn after the answer, under the same budgets (`_checker_turn`).

What is not: the same trajectories under a different batch composition in bf16 (kernel choice can flip
near-tie argmaxes); use float32 when bit-reproducibility across batch shapes matters.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlrl.agent.prompts import ChatFormat
from sqlrl.config import AgentConfig

# The budgets of a run are the `[agent]` section of its config: one definition, one doc line per field.
Budgets = AgentConfig


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = 0


@dataclass
class Turn:
    context_tokens: int  # tokens in the sequence when this turn started
    completion_text: str
    completion_ids: list[int]
    finish_reason: str
    action: str  # inspect | final | invalid | check (the checker turn's reply)
    sql: str | None
    observation: str | None = None
    observation_ids: list[int] = field(default_factory=list)
    sql_result: dict | None = None
    gen_s: float = 0.0


@dataclass
class Trajectory:
    task_id: str
    db_id: str
    question: str
    sample: int
    model: dict
    budgets: dict
    prompt_text: str
    prompt_ids: list[int]
    turns: list[Turn] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    final_sql: str | None = None
    stop_reason: str | None = None
    n_executions: int = 0
    infra_error: str | None = None
    timings: dict = field(default_factory=dict)
    reward: dict | None = None  # written by the evaluator after the trajectory ended
    # agent.checker only: {checked, reason (why not checked), first_sql, reply (confirm | correct |
    # no_final), changed (the answer's whitespace-normalised SQL differs from first_sql)}
    checker: dict | None = None

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    @property
    def last_inspected_sql(self) -> str | None:
        for t in reversed(self.turns):
            if t.action == "inspect" and t.sql:
                return t.sql
        return None

    @property
    def generated_tokens(self) -> int:
        return sum(self.loss_mask)

    @classmethod
    def from_prompt(cls, chat, messages: list[dict], *, timings: dict | None = None, **fields):
        """A new trajectory whose sequence is the rendered first prompt (loss mask 0)."""
        ids = chat.prompt_ids(messages)
        return cls(
            prompt_text=chat.render(messages, add_generation_prompt=True),
            prompt_ids=ids,
            token_ids=list(ids),
            loss_mask=[0] * len(ids),
            logprobs=[0.0] * len(ids),
            timings={"gen_s": 0.0, "exec_s": 0.0, **(timings or {})},
            **fields,
        )

    def add_completion(self, g, action: str, sql: str | None, gen_s: float) -> Turn:
        """Record a generated turn: its ids as produced (loss mask 1) and their generation-time log-probs."""
        turn = Turn(
            context_tokens=len(self.token_ids),
            completion_text=g.text,
            completion_ids=list(g.token_ids),
            finish_reason=g.finish_reason,
            action=action,
            sql=sql,
            gen_s=gen_s,
        )
        self.turns.append(turn)
        self.token_ids.extend(g.token_ids)
        self.loss_mask.extend([1] * len(g.token_ids))
        self.logprobs.extend(float(x) for x in g.logprobs)
        self.timings["gen_s"] += gen_s
        return turn

    def add_sql_result(self, res, budgets, source: str) -> None:
        """Record an execution of the last turn's SQL; a crashed worker ends the trajectory as infra_error
        (never a wrong answer), anything else becomes the rendered observation."""
        self.n_executions += 1
        last = self.turns[-1]
        last.sql_result = {
            "status": res.status,
            "row_count": res.row_count,
            "elapsed_ms": res.elapsed_ms,
            "message": res.message,
        }
        if res.status == "worker_crash":
            self.infra_error = f"{source}: {res.message}"
            self.stop_reason = "infra_error"
            return
        last.observation = res.render(max_rows=budgets.observation_rows, max_chars=budgets.observation_chars)

    def add_observation(self, chat, history: list[dict], obs: str, eos_ids: set[int]) -> list[dict]:
        """Append the observation delta (end of turn, user message, next assistant header; loss mask 0) after
        the last completion; returns the chat history extended by that exchange."""
        last = self.turns[-1]
        last.observation = obs
        ended = bool(last.completion_ids) and last.completion_ids[-1] in eos_ids
        obs_ids = chat.observation_ids(history, obs, completion_ended_with_eos=ended)
        last.observation_ids = obs_ids
        self.token_ids.extend(obs_ids)
        self.loss_mask.extend([0] * len(obs_ids))
        self.logprobs.extend([0.0] * len(obs_ids))
        return history + [
            {"role": "assistant", "content": last.completion_text},
            {"role": "user", "content": obs},
        ]

    def to_dict(self, with_tokens: bool = True) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if not with_tokens:
            for k in ("prompt_ids", "token_ids", "loss_mask", "logprobs"):
                d.pop(k)
            for t in d["turns"]:
                t.pop("completion_ids")
                t.pop("observation_ids")
        else:
            d["logprobs"] = [round(x, 6) for x in d["logprobs"]]
        return d


class PolicyInfraError(RuntimeError):
    """Raised by a policy backend when generation failed for infrastructure reasons."""


def generate_turn(policy, trajs: list, budgets, sampling: Sampling, turn: int, seed_offset: int = 0):
    """One batched `policy.generate` call for these live trajectories (their token ids as they are).

    Returns (generations, seconds), or None after marking every trajectory `infra_error` when the policy
    failed for infrastructure reasons. The sampling seed is a function of (seed, turn, offset) only."""
    seed = None if sampling.seed is None else sampling.seed + 1000003 * turn + seed_offset
    t0 = time.perf_counter()
    try:
        gens = policy.generate(
            [tr.token_ids for tr in trajs],
            max_new_tokens=budgets.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=seed,
        )
    except PolicyInfraError as e:
        for tr in trajs:
            tr.infra_error = f"policy: {e}"
            tr.stop_reason = "infra_error"
        return None
    return gens, time.perf_counter() - t0


class Environment:
    """The hooks `run_episodes` drives. Subclasses set `EXECUTE` (the action kind whose SQL is executed)
    and `FINAL` / `FINAL_REASON` (the action kind that ends the episode, and the stop reason it records),
    and implement the hooks below; `setup` and `abort` are optional."""

    EXECUTE = "execute"
    FINAL = "final"
    FINAL_REASON = "final"
    CHECKER = False  # supports agent.checker (implements execute_answers and checker_observation)
    _owned: list  # resources this environment closes (set by the subclass's __init__)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close what this environment built (what it was handed stays open)."""
        for obj in self._owned:
            obj.close()
        self._owned.clear()

    def initial(self, task, sample: int, chat: ChatFormat, model: dict, budgets) -> tuple[Trajectory, list]:
        """The new trajectory (its first prompt rendered) and the chat messages of that prompt; refuses a
        task that is not public."""
        raise NotImplementedError

    def setup(self, tr: Trajectory, task, budgets) -> None:
        """Side effects before the first turn (e.g. lease a replica); may end the trajectory."""

    def parse(self, tr: Trajectory, text: str, multi_turn: bool) -> Any:
        """The action of a reply: an object with `kind` and `sql`."""
        raise NotImplementedError

    def finish(self, tr: Trajectory, reason: str, action: Any = None, text: str | None = None) -> None:
        """End the trajectory: set its answer and `stop_reason = reason`. `action` / `text` are those of the
        last reply, None when the episode ends without one (context budget, defensive end)."""
        raise NotImplementedError

    def execute(self, pairs: list[tuple[Trajectory, Any]], budgets) -> None:
        """Execute the last turn's SQL of each (trajectory, task) and record the results."""
        raise NotImplementedError

    def observation(self, tr: Trajectory, turn: int, budgets) -> str:
        """The next user message after `turn` for a trajectory still running."""
        raise NotImplementedError

    def execute_answers(self, pairs: list[tuple[Trajectory, Any]], budgets) -> None:
        """agent.checker: execute each (trajectory, task)'s answer (`final_sql`) and record the result on
        its last turn, as `execute` does."""
        raise NotImplementedError

    def checker_observation(self, tr: Trajectory, budgets) -> str:
        """agent.checker: the checker turn's user message, after `execute_answers` recorded the result."""
        raise NotImplementedError

    def abort(self, trajs: list[Trajectory]) -> None:
        """Called with the trajectories built so far when the loop raises, before the exception propagates."""


def run_episodes(
    env: Environment,
    items: Sequence[tuple[Any, int]],
    policy,
    budgets: Budgets,
    sampling: Sampling,
    *,
    seed_offset: int = 0,
    chat: ChatFormat | None = None,
) -> list[Trajectory]:
    """Roll out every (task, sample) of `items` as one batch; returns the finished trajectories in order."""
    if budgets.checker and not env.CHECKER:
        raise ValueError(
            f"agent.checker is set but {type(env).__name__} has no checker turn; set agent.checker = false"
        )
    chat = chat or ChatFormat(policy.tokenizer)
    model_info = {"name": getattr(policy, "name", None), "identity": getattr(policy, "identity", None)}
    trajs: list[Trajectory] = []
    try:
        histories: list[list[dict]] = []
        for task, s in items:
            tr, messages = env.initial(task, s, chat, model_info, budgets)
            trajs.append(tr)
            histories.append(messages)
            env.setup(tr, task, budgets)
        tasks = [t for t, _ in items]
        _turns(env, trajs, histories, tasks, policy, budgets, sampling, chat, seed_offset)
        if budgets.checker:
            _checker_turn(env, trajs, histories, tasks, policy, budgets, sampling, chat, seed_offset)
    except BaseException:
        env.abort(trajs)
        raise
    return trajs


def _turns(env: Environment, trajs, histories, tasks, policy, budgets, sampling, chat, seed_offset) -> None:
    multi = budgets.multi_turn
    eos_ids = set(getattr(policy, "eos_token_ids", []) or [])
    for turn in range(1, budgets.turns + 1):
        ready = []
        for i, tr in enumerate(trajs):
            if tr.done:
                continue
            if len(tr.token_ids) + budgets.max_new_tokens > budgets.max_context_tokens:
                env.finish(tr, "context_budget")
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
            action = env.parse(tr, g.text, multi)
            tr.add_completion(g, action.kind, action.sql, gen_s / len(ready))
            if not multi:
                env.finish(tr, "single_turn", action, g.text)
            elif action.kind == env.FINAL:
                env.finish(tr, env.FINAL_REASON, action, g.text)
            elif turn == budgets.turns:
                env.finish(tr, "max_turns", action, g.text)
            elif action.kind == env.EXECUTE:
                if tr.n_executions >= budgets.max_sql_executions:
                    env.finish(tr, "sql_budget", action, g.text)
                else:
                    to_exec.append(i)
            # invalid: observation below, costs the turn
        if to_exec:
            env.execute([(trajs[i], tasks[i]) for i in to_exec], budgets)
        if multi and turn < budgets.turns:
            for i in ready:
                tr = trajs[i]
                if not tr.done:
                    obs = env.observation(tr, turn, budgets)
                    histories[i] = tr.add_observation(chat, histories[i], obs, eos_ids)
    for tr in trajs:
        if not tr.done:  # defensive: loop ended without a decision
            env.finish(tr, "max_turns")


# Stop reasons whose answer the checker turn checks: the policy's own answer
CHECKED_STOPS = ("single_turn", "final", "max_turns")


def _norm_sql(sql: str | None) -> str | None:
    return " ".join(sql.split()).rstrip(";").strip() if sql else None


def _not_checked(tr: Trajectory, budgets) -> str | None:
    """Why `tr`'s answer gets no checker turn (a stop reason or budget name), or None."""
    if tr.stop_reason not in CHECKED_STOPS:
        return tr.stop_reason
    if tr.final_sql is None:
        return "no_sql"
    if tr.n_executions >= budgets.max_sql_executions:
        return "sql_budget"
    if len(tr.token_ids) + budgets.max_new_tokens > budgets.max_context_tokens:
        return "context_budget"
    return None


def _checker_turn(env: Environment, trajs, histories, tasks, policy, budgets, sampling, chat, seed_offset):
    """agent.checker, after the turns: a trajectory that ended with the policy's own answer (stop reason
    single_turn, final or max_turns; SQL present) has that SQL executed (one of `max_sql_executions`;
    none left: no check) and, if the context budget then leaves `max_new_tokens` of room, exactly one
    more reply (`action` "check", one batch, sampling turn index `turns + 1`) to the environment's
    checker message. A reply with FINAL and SQL becomes the answer; any other reply (FINAL alone, SQL
    without FINAL, neither) keeps the first. The stop reason stays; `Trajectory.checker` records it."""
    eos_ids = set(getattr(policy, "eos_token_ids", []) or [])
    todo = []
    for i, tr in enumerate(trajs):
        reason = _not_checked(tr, budgets)
        tr.checker = {
            "checked": False,
            "reason": reason,
            "first_sql": tr.final_sql,
            "reply": None,
            "changed": False,
        }
        if reason is None:
            todo.append(i)
    if todo:
        env.execute_answers([(trajs[i], tasks[i]) for i in todo], budgets)
    ready = []
    for i in todo:
        tr = trajs[i]
        if tr.infra_error:  # the execution's worker crashed: excluded from scoring
            tr.checker["reason"] = "infra_error"
            continue
        histories[i] = tr.add_observation(chat, histories[i], env.checker_observation(tr, budgets), eos_ids)
        if len(tr.token_ids) + budgets.max_new_tokens > budgets.max_context_tokens:
            tr.checker["reason"] = "context_budget"
        else:
            ready.append(i)
    if not ready:
        return
    out = generate_turn(policy, [trajs[i] for i in ready], budgets, sampling, budgets.turns + 1, seed_offset)
    if out is None:
        for i in ready:
            trajs[i].checker["reason"] = "infra_error"
        return
    gens, gen_s = out
    for i, g in zip(ready, gens):
        tr = trajs[i]
        action = env.parse(tr, g.text, True)
        tr.add_completion(g, "check", action.sql, gen_s / len(ready))
        first = tr.final_sql
        if action.kind == env.FINAL and action.sql:
            tr.final_sql = action.sql
        changed = _norm_sql(tr.final_sql) != _norm_sql(first)
        reply = "correct" if changed else "confirm" if action.kind == env.FINAL else "no_final"
        tr.checker.update(checked=True, reply=reply, changed=changed)
