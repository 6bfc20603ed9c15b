"""veRL 0.9.1 integration: the same environment, agent and reward, trained by veRL past one machine.

sqlrl never writes its own distributed engine. Past one machine, veRL (FSDP actor + vLLM rollout + Ray)
runs the GRPO update, and sqlrl supplies:

- ``config``: ``build_verl_config(cfg, ...)``, our TOML run config mapped onto veRL's GRPO config and
  validated by veRL, and the agent-loop registry file (``sqlrl verl-config`` writes both);
- ``data``: the train/validation parquet files (public tasks; unscorable golds left out and counted);
- ``rollout``: ``SqlrlAgentLoop``, sqlrl's own ``run_agent`` against veRL's server manager;
- ``reward``: ``compute_score``, sqlrl's ``Evaluator`` on the agent's final SQL (veRL loads the file);
- ``advantage``: ``SqlrlAgentLoopManager`` and the ``sqlrl_grpo`` estimator, which keep excluded
  trajectories (infra errors, unscorable golds) out of the update instead of scoring them as wrong.

What is covered:
- ``import sqlrl.integrations.verl`` works without veRL: veRL, torch, omegaconf and hydra are imported
  lazily; ``SqlrlAgentLoop`` and ``SqlrlAgentLoopManager`` are built (and registered) on first access
  of these names here, which is how veRL's hydra ``_target_`` and ``load_class_from_fqn`` find them.

What is not:
- Versions other than ``verl==0.9.1``. veRL pins transformers<5.11, so it lives in its own venv
  (``scripts/verl-env.sh`` -> ``.venv-verl``).
"""

from __future__ import annotations

from sqlrl.integrations.verl.advantage import (
    compute_sqlrl_grpo_advantage,
    excluded_rows,
    make_manager_class,
    mask_excluded,
    register_advantage_estimator,
)
from sqlrl.integrations.verl.common import (
    ADV_ESTIMATOR,
    AGENT_LOOP_CLASS,
    AGENT_NAME,
    DATA_SOURCE,
    GOLD_AUDIT_FILE,
    MANAGER_CLASS,
    VERL_VERSION,
    VerlUnavailable,
    require_verl,
)
from sqlrl.integrations.verl.config import (
    ATTN_IMPLEMENTATIONS,
    DUAL_CLIP_OFF,
    agent_loop_registry,
    build_verl_config,
    resolve_attn_implementation,
    validate_verl_config,
    verl_overrides,
    worker_env_vars,
    write_agent_loop_registry,
)
from sqlrl.integrations.verl.data import task_to_row, write_dataset
from sqlrl.integrations.verl.reward import compute_score
from sqlrl.integrations.verl.rollout import ServerPolicy, make_agent_loop_class, trajectory_to_output_fields

__all__ = [
    "ADV_ESTIMATOR",
    "AGENT_LOOP_CLASS",
    "AGENT_NAME",
    "ATTN_IMPLEMENTATIONS",
    "DATA_SOURCE",
    "DUAL_CLIP_OFF",
    "GOLD_AUDIT_FILE",
    "MANAGER_CLASS",
    "VERL_VERSION",
    "ServerPolicy",
    "VerlUnavailable",
    "agent_loop_registry",
    "build_verl_config",
    "compute_score",
    "compute_sqlrl_grpo_advantage",
    "excluded_rows",
    "mask_excluded",
    "register_advantage_estimator",
    "require_verl",
    "task_to_row",
    "trajectory_to_output_fields",
    "resolve_attn_implementation",
    "validate_verl_config",
    "verl_overrides",
    "worker_env_vars",
    "write_agent_loop_registry",
    "write_dataset",
]


def __getattr__(name: str):
    # `SqlrlAgentLoop` is built (and registered with veRL) on first access, so importing this package
    # needs no veRL; veRL's hydra `_target_: sqlrl.integrations.verl.SqlrlAgentLoop` resolves through here.
    # `SqlrlAgentLoopManager` likewise (veRL's driver loads it with `load_class_from_fqn`), and building
    # it registers the `sqlrl_grpo` advantage estimator in that process.
    makers = {"SqlrlAgentLoop": make_agent_loop_class, "SqlrlAgentLoopManager": make_manager_class}
    if name in makers:
        cls = makers[name]()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
