"""Agent Lightning (0.3.x) adapter: a ``LitAgent`` whose rollout is sqlrl's own agent and reward.

Targets ``agentlightning==0.3.0`` (Python 3.11; 1.0.x needs >= 3.12) in its own venv
(``scripts/agl-env.sh``: it pulls litellm[proxy], agentops and opentelemetry). One rollout
(``SqlrlLitAgent.rollout``): the task is a dict made by ``task_to_agl`` (the public task fields plus a
reference to the gold: data folder, split, task id); the LLM resource Agent Lightning hands out
(``LLM``, or ``ProxyLLM`` with its per-rollout URL) becomes a ``sqlrl.generation.policy.OpenAIPolicy``
(token-in/token-out ``/v1/completions``); ``sqlrl.agent.text2sql.run_agent`` runs the trajectory; then
the gold is resolved (``private_lookup(ref)``, default: the Spider-layout data folder) and sqlrl's
``Evaluator`` scores ``final_sql``; its value is the rollout's final reward.

What is covered:
- Nothing the policy sees depends on the gold: the agent only ever gets the ``PublicTask``, and the
  gold SQL is never in the task.
- A policy or evaluator infrastructure failure raises ``RolloutInfraError`` (Agent Lightning marks the
  attempt failed and retries it per its config) instead of recording a wrong answer; an unscorable
  gold returns ``None`` (no reward).
- The LLM resource's ``sampling_parameters`` (``temperature``, ``top_p``, ``seed``) override the
  agent's sampling defaults; budgets come from ``AgentConfig``; the last trajectory (with ``reward``)
  is kept in ``self.last_trajectory``.

What is not:
- That Agent Lightning's LLM proxy forwards ``/v1/completions`` with token-id prompts and returns token
  ids (vLLM behind it does); the contract test talks to a fake OpenAI-compatible server.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# litellm (imported by agentlightning) fetches a model price map from GitHub at import time unless told
# to use its bundled copy; a training node may have no internet access.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

try:  # agentlightning is optional: the module imports without it (LitAgent is then a plain base)
    from agentlightning import LLM, LitAgent, ProxyLLM

    AGL_ERROR: str | None = None
except Exception as e:  # noqa: BLE001 -- ImportError, or errors from its heavy dependencies
    AGL_ERROR = f"agentlightning not importable ({type(e).__name__}: {e}); run scripts/agl-env.sh"
    LLM = ProxyLLM = None  # type: ignore[assignment,misc]

    class LitAgent:  # type: ignore[no-redef]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise ImportError(AGL_ERROR)

        def __class_getitem__(cls, item: Any) -> type:
            return cls


PUBLIC_FIELDS = ("task_id", "db_id", "question", "schema", "evidence", "db_path")


class RolloutInfraError(RuntimeError):
    """The rollout failed for infrastructure reasons (LLM endpoint, sandbox): not a wrong answer."""


# ------------------------------------------------------------------------------------------------ tasks


def task_to_agl(
    task: Any,
    *,
    data_root: str | os.PathLike | None = None,
    split: str | None = None,
    split_seed: int = 0,
    val_fraction: float = 0.1,
    reward_kind: str = "execution",
) -> dict:
    """An Agent Lightning task (JSON-able dict) for a sqlrl task: the public fields plus a reference to
    the gold ({data, split, split_seed, val_fraction, task_id, kind}); the gold SQL is never copied."""
    from sqlrl.tasks.data import PrivateTask, ensure_public

    public = ensure_public(task.public if isinstance(task, PrivateTask) else task)
    return {
        "sqlrl_task": {k: getattr(public, k) for k in PUBLIC_FIELDS},
        "sqlrl_ref": {
            "data": str(data_root) if data_root is not None else None,
            "split": split,
            "split_seed": int(split_seed),
            "val_fraction": float(val_fraction),
            "task_id": public.task_id,
            "kind": reward_kind,
        },
    }


def public_from_agl(task: dict):
    from sqlrl.tasks.data import PublicTask

    d = task["sqlrl_task"]
    return PublicTask(**{k: d[k] for k in PUBLIC_FIELDS})


_PRIVATE_CACHE: dict[str, dict] = {}
_LOCK = threading.Lock()


def load_private_task(ref: dict):
    """The PrivateTask (with the gold) named by a `task_to_agl` reference, from its Spider-layout folder."""
    from sqlrl.tasks.bird import open_data

    if not ref.get("data") or not ref.get("split"):
        raise ValueError("task reference without data folder/split: pass private_lookup to SqlrlLitAgent")
    kw = {"seed": int(ref.get("split_seed", 0)), "val_fraction": float(ref.get("val_fraction", 0.1))}
    key = f"{ref['data']}|{ref['split']}|{kw['seed']}|{kw['val_fraction']}"
    with _LOCK:
        tasks = _PRIVATE_CACHE.get(key)
        if tasks is None:
            tasks = {t.public.task_id: t for t in open_data(ref["data"]).load(ref["split"], **kw)}
            _PRIVATE_CACHE[key] = tasks
    return tasks[ref["task_id"]]


# ------------------------------------------------------------------------------------------------ agent


class SqlrlLitAgent(LitAgent):
    """Agent Lightning ``LitAgent`` running `sqlrl.agent.text2sql.run_agent` + sqlrl's `Evaluator`.

    ``tokenizer``: the policy model's tokenizer (prompts are token ids rendered with its chat template).
    ``budgets``: `sqlrl.config.AgentConfig` (default: its defaults). ``sampling``: `sqlrl.agent.loop.Sampling`
    defaults (overridden by the LLM resource's sampling_parameters). ``llm_resource``: the resource name
    (default: the first LLM resource). ``sandbox`` / ``evaluator``: shared objects (default: built on
    first use and owned by this agent; `close()` closes them). ``private_lookup(ref) -> PrivateTask``:
    where the gold comes from (default: `load_private_task`)."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        budgets: Any = None,
        sampling: Any = None,
        llm_resource: str | None = None,
        sandbox: Any = None,
        evaluator: Any = None,
        reward_kind: str | None = None,
        private_lookup: Callable[[dict], Any] | None = None,
        gold_cache_dir: str | os.PathLike | None = None,
        request_timeout_s: float = 300.0,
        trained_agents: str | None = None,
    ) -> None:
        super().__init__(trained_agents=trained_agents)
        from sqlrl.agent.loop import Sampling
        from sqlrl.config import AgentConfig

        self.tokenizer = tokenizer
        self.budgets = budgets if budgets is not None else AgentConfig()
        self.sampling = sampling if sampling is not None else Sampling()
        self.llm_resource = llm_resource
        self._sandbox = sandbox
        self._evaluator = evaluator
        self._owned: list[Any] = []
        self.reward_kind = reward_kind
        self.private_lookup = private_lookup or load_private_task
        self.gold_cache_dir = gold_cache_dir
        self.request_timeout_s = float(request_timeout_s)
        self.last_trajectory: Any = None
        self._init_lock = threading.Lock()

    # -- shared resources
    def _get_sandbox(self):
        with self._init_lock:
            if self._sandbox is None:
                from sqlrl.agent.envs import make_env

                env = make_env(workers=2, timeout_s=float(self.budgets.sql_timeout_s))
                self._sandbox = env.sandbox
                self._owned.append(env)
            return self._sandbox

    def _get_evaluator(self, kind: str):
        with self._init_lock:
            if self._evaluator is None:
                from sqlrl.agent.envs import make_env

                env = make_env(workers=2, timeout_s=5.0, gold_dir=self.gold_cache_dir, reward=kind)
                self._owned.append(env)
                self._evaluator = env.evaluator
            return self._evaluator

    def close(self) -> None:
        for obj in reversed(self._owned):
            try:
                obj.close()
            except Exception:  # noqa: BLE001 -- best effort at shutdown
                log.exception("closing %r failed", obj)
        self._owned.clear()

    # -- the LLM resource -> policy
    def _llm(self, resources: dict) -> Any:
        if self.llm_resource is not None:
            if self.llm_resource not in resources:
                raise KeyError(f"resource {self.llm_resource!r} not in {sorted(resources)}")
            return resources[self.llm_resource]
        for res in resources.values():
            if LLM is not None and isinstance(res, LLM):
                return res
        raise KeyError(f"no LLM resource among {sorted(resources)}")

    def make_policy(self, llm: Any, rollout: Any):
        from sqlrl.generation.policy import OpenAIPolicy

        if ProxyLLM is not None and isinstance(llm, ProxyLLM):
            attempt = getattr(rollout, "attempt", None)
            if attempt is not None:
                base_url = llm.get_base_url(rollout.rollout_id, attempt.attempt_id)
            else:
                base_url = llm.get_base_url(None, None)
        else:
            base_url = llm.get_base_url()
        return OpenAIPolicy(
            base_url,
            llm.model,
            api_key=llm.api_key,
            timeout=self.request_timeout_s,
            tokenizer=self.tokenizer,
            identity=f"agl:{base_url}#{llm.model}",
        )

    def _sampling_for(self, llm: Any):
        import dataclasses

        sp = dict(getattr(llm, "sampling_parameters", None) or {})
        kw = {k: sp[k] for k in ("temperature", "top_p", "seed") if k in sp}
        return dataclasses.replace(self.sampling, **kw) if kw else self.sampling

    # -- the rollout
    def rollout(self, task: dict, resources: dict, rollout: Any) -> float | None:
        from sqlrl.agent.text2sql import run_agent

        if isinstance(task, str):
            task = json.loads(task)
        public = public_from_agl(task)
        ref = dict(task.get("sqlrl_ref") or {}, task_id=public.task_id)
        llm = self._llm(resources)
        policy = self.make_policy(llm, rollout)
        traj = run_agent([public], policy, self._get_sandbox(), self.budgets, self._sampling_for(llm))[0]
        self.last_trajectory = traj
        if traj.infra_error or traj.stop_reason == "infra_error":
            raise RolloutInfraError(f"{public.task_id}: policy infrastructure failure: {traj.infra_error}")
        private = self.private_lookup(ref)  # the gold is touched only after the trajectory ended
        if private.public.task_id != public.task_id:
            raise ValueError(f"private_lookup returned {private.public.task_id} for {public.task_id}")
        kind = self.reward_kind or ref.get("kind") or "execution"
        reward = self._get_evaluator(kind).score(traj.final_sql, private)
        traj.reward = {**reward.to_dict(), "exec_ms": getattr(reward, "exec_ms", None)}  # as in evaluate.py
        if reward.status == "infra_error":
            raise RolloutInfraError(f"{public.task_id}: evaluator infrastructure failure: {reward.parts}")
        return None if reward.value is None else float(reward.value)


def default_data_root() -> str:
    from sqlrl.tasks.data import embedded_root

    return str(Path(embedded_root()))
