"""Our TOML run config mapped onto veRL's GRPO config, checked by veRL itself.

``build_verl_config`` loads veRL's own ``ppo_trainer.yaml`` from the installed package (hydra
compose), merges ``verl_overrides`` in struct mode and runs veRL's checks (``validate_config`` and the
dataclass conversion ``omega_conf_to_dataclass`` of the actor, rollout, model, algorithm and optimizer
sections), plus the driver's own lookups of the agent-loop manager class and advantage estimator.
``write_agent_loop_registry`` writes the registry file (``<out>.agent_loops.yaml``) the config points to.

What is covered:
- A key veRL does not know is an error (struct-mode merge), never silently ignored.
- A setting veRL's trainer cannot honour (``grpo.dynamic_sampling_rounds``) is refused, not dropped.
- The reward function is this package's ``reward.py`` (veRL loads it by file path).
- The actor/ref attention (``attn_implementation``: ``auto`` picks flash_attention_2 only where
  ``flash_attn`` imports, else sdpa; anything but flash_attention_2 turns ``use_remove_padding`` off).
- ``SQLRL_*`` variables (and ``VLLM_USE_FLASHINFER_SAMPLER=0`` without flashinfer) go to every Ray
  worker through ``ray_kwargs.ray_init.runtime_env.env_vars``, which veRL's ``run_ppo`` passes to ray.init.
- Dual-clip off: ``clip_ratio_c`` = ``DUAL_CLIP_OFF`` (1e9) exceeds veRL's largest ratio (exp(20)), so
  veRL's loss is sqlrl's clipped objective (``sqlrl.training.grpo.policy_loss``), which has no dual clip.

What is not:
- Versions other than ``verl==0.9.1`` (keys may be renamed: the merge then fails loudly).
- ``model.lora_rank > 0`` with vLLM is only validated where vLLM is importable.
- A GPU run: the sdpa path and the workers' environment ran only on CPU (veRL's HFModelConfig, run_ppo).
- The log-ratio clamp: veRL clamps it to +-20 before exp, sqlrl's native loss to +-10.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlrl.integrations.verl import reward
from sqlrl.integrations.verl.common import (
    ADV_ESTIMATOR,
    AGENT_LOOP_CLASS,
    AGENT_NAME,
    MANAGER_CLASS,
    require_verl,
)

ATTN_IMPLEMENTATIONS = ("auto", "flash_attention_2", "sdpa", "eager")
# veRL's dual-clip PPO bounds the loss of a token with a negative advantage at clip_ratio_c * |A|; it binds
# only where the ratio exceeds clip_ratio_c, and veRL clamps the log-ratio to +-20 before exp (ratio at
# most exp(20) ~ 4.85e8, core_algos.compute_policy_loss_vanilla), so 1e9 never binds.
DUAL_CLIP_OFF = 1e9


def _importable(name: str) -> bool:
    """Whether `import name` succeeds here (a wheel built for another torch or CUDA fails at import)."""
    try:
        importlib.import_module(name)
    except Exception:  # ImportError, or OSError / RuntimeError from a broken compiled extension
        return False
    return True


def resolve_attn_implementation(choice: str = "auto") -> str:
    """The HF attention implementation for veRL's actor and ref models.

    "auto": flash_attention_2 where `flash_attn` is importable on this (the launching) machine, else sdpa.
    """
    if choice not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation {choice!r} is not one of {', '.join(ATTN_IMPLEMENTATIONS)}; pick one "
            "(auto uses flash_attention_2 where flash_attn imports, else sdpa)"
        )
    if choice != "auto":
        return choice
    return "flash_attention_2" if _importable("flash_attn") else "sdpa"


def worker_env_vars(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment every Ray worker of the veRL run gets: the `SQLRL_*` variables of `environ` (default:
    this process's environment), plus `VLLM_USE_FLASHINFER_SAMPLER=0` where flashinfer is not importable
    (vLLM's sampler would otherwise try its kernels); a value already in `environ` is kept."""
    environ = os.environ if environ is None else environ
    env = {k: str(v) for k, v in sorted(environ.items()) if k.startswith("SQLRL_")}
    if "VLLM_USE_FLASHINFER_SAMPLER" in environ:
        env["VLLM_USE_FLASHINFER_SAMPLER"] = str(environ["VLLM_USE_FLASHINFER_SAMPLER"])
    elif not _importable("flashinfer"):
        env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    return env


def _token_lengths(agent) -> tuple[int, int]:
    """(max_prompt_length, max_response_length) for veRL from sqlrl budgets.

    The first prompt can be at most `max_context_tokens - max_new_tokens` long (a longer one cannot
    generate under our context budget). Single-turn: the response is one completion. Multi-turn: the
    response holds every completion and observation; run_agent stops before a turn that would exceed
    `max_context_tokens`, so the response fits in `max_context_tokens` (the agent loop cuts a trailing
    observation past that; it is masked out anyway).
    """
    prompt = agent.max_context_tokens - agent.max_new_tokens
    response = agent.max_new_tokens if agent.turns == 1 else agent.max_context_tokens
    return prompt, response


def _model_overrides(m, model_path: str | None, attn_implementation: str) -> dict:
    """`actor_rollout_ref.model`: veRL's HFModelConfig, which the actor uses and the ref deep-copies."""
    attn = resolve_attn_implementation(attn_implementation)
    model: dict[str, Any] = {
        "path": model_path or m.name,
        "enable_gradient_checkpointing": True,
        # remove-padding packs sequences for flash-attn's varlen kernels: only with flash_attention_2
        "use_remove_padding": attn == "flash_attention_2",
        # HFModelConfig passes it to AutoConfig.from_pretrained (its default: flash_attention_2)
        "override_config": {"attn_implementation": attn},
        "lora_rank": int(m.lora_rank),
    }
    if m.lora_rank > 0:
        model.update(lora_alpha=int(m.lora_alpha), target_modules=list(m.lora_targets))
    return model


def verl_overrides(
    cfg,
    *,
    model_path: str | None = None,
    train_files: str | list[str] = "data/sqlrl_verl/train.parquet",
    val_files: str | list[str] = "data/sqlrl_verl/validation.parquet",
    n_gpus_per_node: int = 8,
    nnodes: int = 1,
    agent_loop_config_path: str | None = None,
    project_name: str = "sqlrl",
    experiment_name: str = "grpo",
    default_local_dir: str | None = None,
    rollout_name: str = "vllm",
    tensor_model_parallel_size: int = 1,
    gpu_memory_utilization: float = 0.5,
    attn_implementation: str = "auto",
    worker_env: Mapping[str, str] | None = None,
) -> dict:
    """The veRL keys sqlrl sets, as a nested dict (merged over veRL's defaults by `build_verl_config`).

    `attn_implementation`: see `resolve_attn_implementation`. `worker_env`: the Ray workers' environment
    (default `worker_env_vars()`, read now).
    """
    g, a, m, r = cfg.grpo, cfg.agent, cfg.model, cfg.run
    if g.dynamic_sampling_rounds:
        raise ValueError(
            f"grpo.dynamic_sampling_rounds = {g.dynamic_sampling_rounds} is not mapped to veRL: its main "
            "GRPO trainer has no dynamic sampling (veRL's DAPO recipe has its own `filter_groups`). Set "
            "grpo.dynamic_sampling_rounds = 0 for the veRL backend, or train on one machine with `sqlrl train`."
        )
    if a.checker:
        raise ValueError(
            "agent.checker is not mapped to veRL: its response lengths are sized for agent.turns replies, "
            "not the checker's extra one. Set agent.checker = false for the veRL backend, or train on one "
            "machine with `sqlrl train`."
        )
    prompt_len, response_len = _token_lengths(a)
    lr = 0.0 if g.control == "no-update" else float(g.lr)
    loss_agg = {"token-mean": "token-mean", "seq-mean": "seq-mean-token-mean"}[g.loss_agg]
    loggers = ["console"] + [lg for lg in r.loggers if lg in ("tensorboard", "wandb", "swanlab")]
    reward_fn = {"path": str(Path(reward.__file__).resolve()), "name": "compute_score"}
    micro = int(g.micro_batch)
    env = worker_env_vars() if worker_env is None else {k: str(v) for k, v in worker_env.items()}
    return {
        "algorithm": {
            "adv_estimator": ADV_ESTIMATOR,  # GRPO with excluded trajectories left out (see module doc)
            "norm_adv_by_std_in_grpo": g.adv_scale == "std",
            "use_kl_in_reward": False,
        },
        "data": {
            "train_files": train_files,
            "val_files": val_files,
            "prompt_key": "prompt",
            "max_prompt_length": prompt_len,
            "max_response_length": response_len,
            "train_batch_size": int(g.prompts_per_step),
            "return_raw_chat": True,
            "filter_overlong_prompts": False,  # the agent loop builds its own prompt ids
            "truncation": "error",
            "seed": int(r.seed),
        },
        "actor_rollout_ref": {
            "model": _model_overrides(m, model_path, attn_implementation),
            "actor": {
                "strategy": "fsdp",
                "ppo_mini_batch_size": int(g.prompts_per_step),  # one optimizer step per rollout step
                "ppo_micro_batch_size_per_gpu": micro,
                "ppo_epochs": 1,
                "use_dynamic_bsz": False,
                "clip_ratio": float(g.clip_low),
                "clip_ratio_low": float(g.clip_low),
                "clip_ratio_high": float(g.clip_high),
                "clip_ratio_c": DUAL_CLIP_OFF,  # sqlrl's objective has no dual clip
                "loss_agg_mode": loss_agg,
                "entropy_coeff": 0.0,
                "use_kl_loss": g.kl_coef > 0,
                "kl_loss_coef": float(g.kl_coef),
                "kl_loss_type": "low_var_kl",  # k3
                "grad_clip": float(g.max_grad_norm),
                "optim": {
                    "lr": lr,
                    "weight_decay": float(g.weight_decay),
                    "betas": [float(b) for b in g.betas],
                    "lr_warmup_steps": int(g.warmup_steps) if g.warmup_steps > 0 else -1,
                    "lr_scheduler_type": "constant",
                    "clip_grad": float(g.max_grad_norm),
                },
                "fsdp_config": {"param_offload": False, "optimizer_offload": False, "model_dtype": "fp32"},
                "checkpoint": {"save_contents": ["model", "optimizer", "extra"]},
            },
            "ref": {"log_prob_micro_batch_size_per_gpu": micro},
            "rollout": {
                "name": rollout_name,
                "mode": "async",
                "n": int(g.group_size),
                "temperature": float(g.temperature),
                "top_p": float(g.top_p),
                "top_k": -1,
                "prompt_length": prompt_len,
                "response_length": response_len,
                "max_model_len": prompt_len + response_len,
                "tensor_model_parallel_size": int(tensor_model_parallel_size),
                "gpu_memory_utilization": float(gpu_memory_utilization),
                "log_prob_micro_batch_size_per_gpu": micro,
                "calculate_log_probs": True,
                "val_kwargs": {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "do_sample": False, "n": 1},
                "multi_turn": {
                    "enable": a.turns > 1,
                    "max_assistant_turns": int(a.turns),
                    "max_user_turns": int(a.turns),
                },
                "agent": {
                    "default_agent_loop": AGENT_NAME,
                    "agent_loop_config_path": agent_loop_config_path,
                    "agent_loop_manager_class": MANAGER_CLASS,  # masks excluded trajectories (driver)
                },
            },
        },
        "critic": {"enable": False},
        "custom_reward_function": dict(reward_fn),
        "reward": {"custom_reward_function": dict(reward_fn), "reward_manager": {"name": "naive"}},
        "trainer": {
            "project_name": project_name,
            "experiment_name": experiment_name,
            "logger": loggers,
            "n_gpus_per_node": int(n_gpus_per_node),
            "nnodes": int(nnodes),
            "total_training_steps": int(g.steps),
            "total_epochs": 1_000_000,  # the step count decides; epochs only bound the data loader
            "save_freq": int(r.checkpoint_every),
            "max_actor_ckpt_to_keep": int(r.keep_checkpoints),
            "resume_mode": "auto",
            "test_freq": -1,
            "val_before_train": False,
            "critic_warmup": 0,
            # veRL's PPO trainer (main_ppo_v0), which builds the configured agent loop manager and takes
            # the batch its generate_sequences returns; the V1 trainer (veRL's default) reads rollouts from
            # a TransferQueue instead, which SqlrlAgentLoopManager does not write
            "use_v1": False,
            **({"default_local_dir": default_local_dir} if default_local_dir else {}),
        },
        # veRL's run_ppo merges this over its own runtime env and passes it to ray.init: every worker
        "ray_kwargs": {"ray_init": {"runtime_env": {"env_vars": env}}},
    }


def _load_default_config():
    """veRL's own `ppo_trainer.yaml`, composed by hydra from the installed package."""
    verl = require_verl()
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf, open_dict

    config_dir = str(Path(verl.__file__).resolve().parent / "trainer" / "config")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(config_name="ppo_trainer")
    # veRL's AgentLoopConfig dataclass declares `agent_loop_manager_class` (read by the trainer with
    # .get()), but its YAML omits it, so struct mode would refuse it; add only that key (value None), and
    # the dataclass conversion in `validate_verl_config` checks it is a real field.
    with open_dict(config.actor_rollout_ref.rollout.agent):
        config.actor_rollout_ref.rollout.agent.agent_loop_manager_class = None
    # `ray_kwargs.ray_init.runtime_env` is Ray's runtime_env (main_ppo.run_ppo merges it over
    # get_ppo_ray_runtime_env() and calls ray.init with it); its YAML lists only `py_executable`, so open
    # exactly `env_vars` (Ray's own field), empty. `model.override_config` is a free-form dict
    # (HFModelConfig.override_config) whose YAML is `{}`: open it for `attn_implementation`.
    with open_dict(config.ray_kwargs.ray_init.runtime_env):
        config.ray_kwargs.ray_init.runtime_env.env_vars = {}
    OmegaConf.set_struct(config.ray_kwargs.ray_init.runtime_env.env_vars, False)  # any variable name
    with open_dict(config.actor_rollout_ref.model.override_config):
        config.actor_rollout_ref.model.override_config.attn_implementation = "flash_attention_2"
    return config


def validate_verl_config(config) -> None:
    """Run veRL's own checks on a composed config (DictConfig); raises on the first problem."""
    require_verl()
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    resolved = OmegaConf.create(OmegaConf.to_container(config, resolve=True))
    lora_rank = resolved.actor_rollout_ref.model.get("lora_rank", 0)
    if lora_rank > 0 and resolved.actor_rollout_ref.rollout.name == "vllm":
        try:
            import vllm  # noqa: F401
        except ImportError:  # veRL's LoRA-rank check imports vLLM; skip only that check
            resolved.actor_rollout_ref.model.lora_rank = 0
    validate_config(
        resolved, use_reference_policy=need_reference_policy(resolved), use_critic=need_critic(resolved)
    )
    ar = resolved.actor_rollout_ref
    omega_conf_to_dataclass(ar.actor.optim)
    omega_conf_to_dataclass(ar.rollout)
    omega_conf_to_dataclass(resolved.algorithm)
    omega_conf_to_dataclass(ar.rollout.multi_turn)
    omega_conf_to_dataclass(ar.rollout.agent)
    _check_driver_imports(resolved)


def _check_driver_imports(config) -> None:
    """Resolve the agent-loop manager class and the advantage estimator the way veRL's trainer driver does
    (`load_class_from_fqn`, then `get_adv_estimator_fn` in `compute_advantage`); raises ValueError."""
    from verl.experimental.agent_loop import AgentLoopManager
    from verl.trainer.ppo.core_algos import AdvantageEstimator, get_adv_estimator_fn
    from verl.utils.import_utils import load_class_from_fqn

    fqn = config.actor_rollout_ref.rollout.agent.get("agent_loop_manager_class")
    if fqn:
        cls = load_class_from_fqn(fqn, "AgentLoopManager")
        if not (isinstance(cls, type) and issubclass(cls, AgentLoopManager)):
            raise ValueError(f"rollout.agent.agent_loop_manager_class {fqn} is not an AgentLoopManager")
    name = config.algorithm.adv_estimator
    if name not in {e.value for e in AdvantageEstimator}:
        get_adv_estimator_fn(name)  # ValueError("Unknown advantage estimator ...") if not registered
    if name == ADV_ESTIMATOR and fqn != MANAGER_CLASS:
        raise ValueError(
            f"algorithm.adv_estimator = {ADV_ESTIMATOR} needs rollout.agent.agent_loop_manager_class = "
            f"{MANAGER_CLASS}: it masks the excluded trajectories and registers the estimator in the driver"
        )


def build_verl_config(cfg, *, validate: bool = True, **kwargs) -> dict:
    """veRL's default GRPO-capable config with sqlrl's settings merged in, validated by veRL; a plain dict.

    `kwargs` go to `verl_overrides` (model_path, train_files, val_files, n_gpus_per_node, nnodes,
    agent_loop_config_path, project_name, experiment_name, default_local_dir, ...).
    """
    from omegaconf import OmegaConf

    base = _load_default_config()
    merged = OmegaConf.merge(
        base, OmegaConf.create(verl_overrides(cfg, **kwargs))
    )  # struct: unknown key = error
    if validate:
        validate_verl_config(merged)
    return OmegaConf.to_container(merged, resolve=True)


def agent_loop_registry(cfg, *, sandbox_workers: int | None = None) -> list[dict]:
    """veRL agent-loop registry entries (`rollout.agent.agent_loop_config_path`): our loop and its budgets."""
    from sqlrl.agent.loop import Budgets

    return [
        {
            "name": AGENT_NAME,
            "_target_": AGENT_LOOP_CLASS,
            "budgets": Budgets.from_config(cfg.agent).to_dict(),
            "sandbox_workers": int(sandbox_workers or cfg.run.sandbox_workers),
        }
    ]


def write_agent_loop_registry(cfg, path: str | os.PathLike) -> Path:
    """Write `agent_loop_registry(cfg)` as YAML to `path`; returns it."""
    import yaml

    path = Path(path)
    path.write_text(yaml.safe_dump(agent_loop_registry(cfg), sort_keys=False), encoding="utf-8")
    return path
