"""The one rollout loop: a policy acting as a SQL agent under fixed, recorded budgets.

Shapes: single-turn (write SQL, done) and multi-turn (write -> execute -> check -> rewrite until the
policy says FINAL or a budget ends). The loop is batched: each turn, all live trajectories of a chunk
are sent to `policy.generate` in one call, and their SQL goes to the sandbox in one `execute_many`.

Guarantees:
- Only `PublicTask`s are accepted: a `PrivateTask` (which holds the gold) is refused by type at the
  start, and again per task right before its prompt is built. Nothing the policy sees, and no stopping
  decision, depends on the gold: the evaluator receives the finished trajectory afterwards.
- Budgets (`Budgets`) are explicit, fixed for a run and written into every trajectory; two runs are
  comparable only if their budgets are equal (`Budgets.__eq__`).
- Token-in/token-out: a trajectory is one token sequence (first prompt, then for each turn the
  generated ids exactly as produced and the observation delta). `loss_mask` is 1 exactly on generated
  tokens; `logprobs` holds the generation-time log-probabilities there (0.0 elsewhere).
- A policy infrastructure failure marks the trajectory `infra_error`; it is excluded from scoring,
  never counted as a wrong answer.

Not guaranteed: the same trajectories under a different batch composition in bf16 (kernel choice
can flip near-tie argmaxes); use float32 when bit-reproducibility across batch shapes matters.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlrl.agent.prompts import INVALID_MESSAGE, ChatFormat, Parser, build_messages, observation_message
from sqlrl.config import AgentConfig
from sqlrl.tasks.data import PrivateTask, PublicTask, ensure_public

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
    action: str  # inspect | final | invalid
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


def _check_public(tasks: Sequence[Any]) -> list[PublicTask]:
    out = []
    for t in tasks:
        if isinstance(t, PrivateTask):
            raise TypeError(
                f"run_agent received a PrivateTask ({t.public.task_id}): the rollout accepts only public tasks, "
                "so that the gold can never reach the policy. Pass `task.public` and score with the evaluator."
            )
        out.append(ensure_public(t))
    return out


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
    """Run every task `n_samples` times; returns trajectories grouped task-major (task0 s0..sK, task1 ...)."""
    public = _check_public(tasks)
    chat = ChatFormat(policy.tokenizer)
    model_info = {"name": getattr(policy, "name", None), "identity": getattr(policy, "identity", None)}
    items = [(t, s) for t in public for s in range(n_samples)]
    out: list[Trajectory] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(items), desc=progress if isinstance(progress, str) else "rollouts", unit="traj")
    for start in range(0, len(items), chunk_size):
        chunk = items[start : start + chunk_size]
        out.extend(_run_chunk(chunk, policy, sandbox, budgets, sampling, chat, model_info, chunk_seed=start))
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()
    return out


def _run_chunk(
    chunk, policy, sandbox, budgets: Budgets, sampling: Sampling, chat: ChatFormat, model_info, chunk_seed
):
    trajs: list[Trajectory] = []
    histories: list[list[dict]] = []
    for task, s in chunk:
        ensure_public(task)  # run-time check right before anything is shown to the policy
        messages = build_messages(task, turns=budgets.turns, max_schema_chars=budgets.max_schema_chars)
        tr = Trajectory.from_prompt(
            chat,
            messages,
            task_id=task.task_id,
            db_id=task.db_id,
            question=task.question,
            sample=s,
            model=model_info,
            budgets=budgets.to_dict(),
        )
        trajs.append(tr)
        histories.append(messages)
    tasks = [t for t, _ in chunk]
    multi = budgets.multi_turn
    eos_ids = set(getattr(policy, "eos_token_ids", []) or [])
    for turn in range(1, budgets.turns + 1):
        live = [i for i, tr in enumerate(trajs) if not tr.done]
        if not live:
            break
        ready = []
        for i in live:
            if len(trajs[i].token_ids) + budgets.max_new_tokens > budgets.max_context_tokens:
                trajs[i].final_sql = trajs[i].last_inspected_sql
                trajs[i].stop_reason = "context_budget"
            else:
                ready.append(i)
        if not ready:
            break
        out = generate_turn(policy, [trajs[i] for i in ready], budgets, sampling, turn, chunk_seed)
        if out is None:
            break
        gens, gen_s = out
        to_exec: list[int] = []
        for i, g in zip(ready, gens):
            tr = trajs[i]
            action = Parser.parse(g.text, multi_turn=multi)
            tr.add_completion(g, action.kind, action.sql, gen_s / len(ready))
            if not multi:
                tr.final_sql = action.sql
                tr.stop_reason = "single_turn"
            elif action.kind == "final":
                tr.final_sql = action.sql or tr.last_inspected_sql
                tr.stop_reason = "final"
            elif turn == budgets.turns:
                tr.final_sql = action.sql or tr.last_inspected_sql
                tr.stop_reason = "max_turns"
            elif action.kind == "inspect":
                if tr.n_executions >= budgets.max_sql_executions:
                    tr.final_sql = action.sql
                    tr.stop_reason = "sql_budget"
                else:
                    to_exec.append(i)
            # invalid: observation below, costs the turn
        if to_exec:
            t0 = time.perf_counter()
            results = sandbox.execute_many([(tasks[i].db_path, trajs[i].turns[-1].sql) for i in to_exec])
            exec_s = time.perf_counter() - t0
            for i, res in zip(to_exec, results):
                trajs[i].timings["exec_s"] += exec_s / len(to_exec)
                trajs[i].add_sql_result(res, budgets, "sandbox")
        if multi and turn < budgets.turns:
            for i in ready:
                tr = trajs[i]
                if tr.done:
                    continue
                last = tr.turns[-1]
                if last.action == "inspect":
                    obs = observation_message(last.observation, turn, budgets.turns)
                else:
                    obs = INVALID_MESSAGE
                histories[i] = tr.add_observation(chat, histories[i], obs, eos_ids)
    for tr in trajs:
        if not tr.done:  # defensive: loop ended without a decision
            tr.final_sql = tr.last_inspected_sql
            tr.stop_reason = "max_turns"
    return trajs


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
