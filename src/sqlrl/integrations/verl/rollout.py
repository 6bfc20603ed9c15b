"""The veRL agent loop: sqlrl's own ``run_agent`` for one trajectory against veRL's server manager.

``SqlrlAgentLoop`` (registered as ``sqlrl_agent``) runs ``sqlrl.agent.text2sql.run_agent`` with a policy
adapter (``ServerPolicy``) whose ``generate`` is one call of veRL's server manager
``generate(request_id, prompt_ids=..., sampling_params=...)`` per turn; observation SQL runs in sqlrl's
sandbox. The agent's ``final_sql`` reaches the reward through ``extra_fields`` -> ``extra_info``.

What is covered:
- Prompt ids, observation deltas, loss mask (observation tokens 0), budgets and stopping rules are the
  same code as in the single-machine trainer, not a re-implementation.
- The request id is fixed per trajectory (a sticky session: the server's prefix cache is reused).
- A policy-server failure is re-raised (it fails the step), not excluded and not scored.

What is not:
- sqlrl's per-turn seed is not forwarded (vLLM seeds itself); sampling comes from veRL.
- A trailing observation past the response budget is cut (it is masked out anyway).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import uuid
from typing import Any

from sqlrl.integrations.verl.common import AGENT_NAME, PACKAGE, public_from_row, require_verl

_SANDBOXES: dict[tuple, Any] = {}
_SANDBOX_LOCK = threading.Lock()
_EXECUTOR: concurrent.futures.ThreadPoolExecutor | None = None


def _shared_sandbox(workers: int, timeout_s: float):
    """One sandbox per process and settings (veRL instantiates an agent loop per trajectory)."""
    from sqlrl.agent.envs import make_env

    key = (int(workers), float(timeout_s))
    with _SANDBOX_LOCK:
        sb = _SANDBOXES.get(key)
        if sb is None:
            sb = _SANDBOXES[key] = make_env(workers=workers, timeout_s=timeout_s).sandbox
        return sb


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _EXECUTOR
    with _SANDBOX_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = concurrent.futures.ThreadPoolExecutor(
                max_workers=512, thread_name_prefix="sqlrl-agent"
            )
        return _EXECUTOR


class ServerPolicy:
    """sqlrl policy interface over veRL's async server manager, for ONE trajectory, called from a thread.

    `generate([ids], max_new_tokens=...)` submits `server_manager.generate(request_id, prompt_ids=ids,
    sampling_params=...)` to the event loop and waits: one server call per turn, token-in/token-out.
    The request id is fixed for the trajectory (veRL routes a sticky session to one server, so the
    prefix cache is reused across turns). Sampling comes from veRL (`sampling_params`); sqlrl's
    per-turn seed is not forwarded (vLLM seeds itself).
    """

    name = "verl-server"
    identity = None

    def __init__(self, server_manager, tokenizer, sampling_params: dict, loop, request_id: str | None = None):
        from sqlrl.agent.prompts import eos_ids

        self.server = server_manager
        self.tokenizer = tokenizer
        self.sampling_params = dict(sampling_params)
        self.loop = loop
        self.request_id = request_id or uuid.uuid4().hex
        self.eos_token_ids = eos_ids(tokenizer)
        self.calls = 0
        self.gen_s = 0.0
        self.error: BaseException | None = None

    def generate(self, prompts, *, max_new_tokens, temperature=0.0, top_p=1.0, seed=None):
        from sqlrl.agent.loop import PolicyInfraError
        from sqlrl.generation.policy import Generation

        out = []
        for ids in prompts:
            params = dict(self.sampling_params)
            params["max_tokens"] = int(max_new_tokens)
            t0 = time.perf_counter()
            coro = self.server.generate(
                request_id=self.request_id, prompt_ids=list(ids), sampling_params=params
            )
            try:
                res = asyncio.run_coroutine_threadsafe(coro, self.loop).result()
            except Exception as e:
                self.error = e
                raise PolicyInfraError(f"{type(e).__name__}: {e}") from e
            self.gen_s += time.perf_counter() - t0
            self.calls += 1
            token_ids = [int(t) for t in res.token_ids][:max_new_tokens]
            logprobs = [float(x) for x in (res.log_probs or [0.0] * len(token_ids))][: len(token_ids)]
            ended = bool(token_ids) and token_ids[-1] in self.eos_token_ids
            finish = "length" if (len(token_ids) >= max_new_tokens and not ended) else "stop"
            text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
            out.append(Generation(token_ids=token_ids, logprobs=logprobs, text=text, finish_reason=finish))
        return out


def trajectory_to_output_fields(tr, *, prompt_length: int, response_length: int) -> dict:
    """AgentLoopOutput fields from a sqlrl Trajectory (prompt / response split, mask, log-probs)."""
    n_prompt = len(tr.prompt_ids)
    prompt_ids = list(tr.prompt_ids)
    response_ids = list(tr.token_ids[n_prompt:])
    response_mask = [int(x) for x in tr.loss_mask[n_prompt:]]
    response_logprobs = [float(x) for x in tr.logprobs[n_prompt:]]
    extra: dict[str, Any] = {
        "sqlrl_final_sql": tr.final_sql,
        "sqlrl_stop_reason": tr.stop_reason,
        "sqlrl_n_executions": tr.n_executions,
        "sqlrl_infra_error": tr.infra_error,
        "sqlrl_task_id": tr.task_id,
        "sqlrl_prompt_truncated": False,
        "sqlrl_response_truncated_trainable": 0,
    }
    if len(prompt_ids) > prompt_length:  # only a context_budget stop (nothing generated) gets here
        prompt_ids = prompt_ids[-prompt_length:]
        extra["sqlrl_prompt_truncated"] = True
    if len(response_ids) > response_length:  # a trailing observation past the budget (mask 0)
        extra["sqlrl_response_truncated_trainable"] = sum(response_mask[response_length:])
        response_ids = response_ids[:response_length]
        response_mask = response_mask[:response_length]
        response_logprobs = response_logprobs[:response_length]
    return {
        "prompt_ids": prompt_ids,
        "response_ids": response_ids,
        "response_mask": response_mask,
        "response_logprobs": response_logprobs,
        "num_turns": 1 + len(tr.turns) + sum(1 for t in tr.turns if t.observation_ids),
        "extra_fields": extra,
    }


def make_agent_loop_class():
    """Build ``SqlrlAgentLoop`` and register it with veRL (needs veRL)."""
    require_verl()
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

    @register(AGENT_NAME)
    class SqlrlAgentLoop(AgentLoopBase):
        """sqlrl's rollout loop (`run_agent`) for one trajectory against veRL's server manager."""

        __module__ = PACKAGE  # veRL and pickle resolve it through the package's lazy attribute

        def __init__(
            self, *args, budgets: dict | None = None, sandbox_workers: int = 2, sandbox=None, **kwargs
        ):
            kwargs.pop("tools", None)  # veRL passes its tool list; sqlrl's only tool is the sandbox
            super().__init__(*args, **kwargs)
            from sqlrl.agent.loop import Budgets

            if budgets is None:
                raise ValueError(
                    "SqlrlAgentLoop needs `budgets`: register it with the registry file written by "
                    "`sqlrl verl-config` (rollout.agent.agent_loop_config_path)"
                )
            b = dict(budgets.items()) if hasattr(budgets, "items") else dict(budgets)
            self.budgets = Budgets(**b)
            self.sandbox = sandbox or _shared_sandbox(sandbox_workers, self.budgets.sql_timeout_s)
            self.prompt_length = self.rollout_config.prompt_length
            self.response_length = self.rollout_config.response_length

        async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
            from sqlrl.agent.loop import Sampling
            from sqlrl.agent.text2sql import run_agent

            task = public_from_row(kwargs["extra_info"])  # only the public task; the gold is not in the row
            loop = asyncio.get_running_loop()
            policy = ServerPolicy(self.server_manager, self.tokenizer, sampling_params, loop)
            sampling = Sampling(
                temperature=float(sampling_params.get("temperature", 1.0)),
                top_p=float(sampling_params.get("top_p", 1.0)),
                seed=None,
            )
            t0 = time.perf_counter()
            [tr] = await loop.run_in_executor(
                _executor(), lambda: run_agent([task], policy, self.sandbox, self.budgets, sampling)
            )
            if tr.stop_reason == "infra_error" and policy.error is not None:
                raise RuntimeError(
                    f"sqlrl agent loop: the rollout server failed: {policy.error}"
                ) from policy.error
            fields = trajectory_to_output_fields(
                tr, prompt_length=self.prompt_length, response_length=self.response_length
            )
            metrics = {"generate_sequences": policy.gen_s, "tool_calls": tr.timings.get("exec_s", 0.0)}
            fields["extra_fields"]["sqlrl_wall_s"] = time.perf_counter() - t0
            return AgentLoopOutput(metrics=metrics, **fields)

    return SqlrlAgentLoop
