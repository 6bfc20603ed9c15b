"""veRL 0.8.0 integration: the same environment, agent and reward, trained by veRL past one machine.

sqlrl never writes its own distributed engine. Past one machine, veRL (FSDP actor + vLLM rollout +
Ray) runs the GRPO update, and sqlrl supplies three things:

1. `build_verl_config(cfg, ...)`: our TOML run config mapped onto veRL's GRPO config. veRL's own default
   `ppo_trainer.yaml` is loaded from the installed package (hydra compose), our overrides are merged in
   struct mode (a key veRL does not know is an error, never silently ignored), and the result goes
   through veRL's own checks (`verl.utils.config.validate_config` and the dataclass conversion
   `omega_conf_to_dataclass` of the actor, rollout, model, algorithm and optimizer sections).
   `cli_main(argv)` is `sqlrl verl-config CONFIG.toml -o verl.yaml`; it also writes the agent-loop
   registry file (`<out>.agent_loops.yaml`) that the config points to.
2. `SqlrlAgentLoop`: a veRL agent loop (registered as `sqlrl_agent`) that runs `sqlrl.agent.loop.run_agent`
   itself, for one trajectory, with a policy adapter whose `generate` is one call of veRL's server
   manager `generate(request_id, prompt_ids=..., sampling_params=...)` per turn. So prompt ids,
   observation deltas, loss mask (observation tokens 0), budgets and stopping rules are *the same code*
   as in the single-machine trainer, not a re-implementation. Observation SQL runs in sqlrl's sandbox.
3. `compute_score(data_source, solution_str, ground_truth, extra_info)`: veRL's custom reward function.
   The gold never enters the rollout batch: the dataset row's `reward_model.ground_truth` is only a
   reference (data folder, split, task id); the reward worker (trainer side) loads the `PrivateTask`
   from the data folder itself and scores the agent's `final_sql` (passed from the agent loop through
   `extra_fields` -> `extra_info`) with sqlrl's `Evaluator`.

Exclusions (an infrastructure failure is never scored as a wrong answer; an unscorable gold is excluded
and counted, never scored):
- Unscorable golds are known before training: `write_dataset` runs the gold audit (`audit_golds`, same
  gold cache as the reward workers) and leaves those tasks out of the train and validation parquet files;
  the counts by reason are written to `gold_audit.json` beside them and printed.
- Runtime exclusions (a sandbox infra error during the rollout or while scoring; a gold that turns out
  unscorable on the reward worker anyway) are removed from the update by two pieces, both selected by the
  config `build_verl_config` writes: `SqlrlAgentLoopManager` (veRL's `rollout.agent.agent_loop_manager_class`,
  instantiated in the trainer driver) zeroes the `response_mask` of every trajectory whose reward says
  `sqlrl_excluded = 1`, so none of its tokens is in the policy loss, the KL or entropy terms or the
  token/sequence counts that normalize them; and the advantage estimator `sqlrl_grpo`
  (`compute_sqlrl_grpo_advantage`, `algorithm.adv_estimator`) computes each group's mean and std over
  the trajectories with a non-zero mask only and gives the excluded ones advantage 0. A group left with
  one valid trajectory is treated the way veRL's GRPO treats a singleton group (mean 0, std 1).
  Importing the manager class (veRL does it by name in the driver, `load_class_from_fqn`) registers the
  estimator in that process, which is where veRL computes advantages.

veRL, torch, omegaconf and hydra are imported lazily: `import sqlrl.integrations.verl` works without
them. veRL 0.8.0 pins numpy<2, so it lives in its own venv (`scripts/verl-env.sh` -> `.venv-verl`).

Not guaranteed / known gaps:
- Only `verl==0.8.0` is checked; other versions may rename config keys (the struct-mode merge then fails
  loudly) or change the agent-loop API.
- An excluded trajectory still carries reward 0.0 in veRL's tensors (veRL needs a finite reward); it is
  neutralized in the update as above, but veRL's own `critic/score/*` and validation `reward` means count
  it as 0. The verdict metrics it returns (`acc`, `sqlrl_executable`) are NaN for it, so a validation
  `acc` mean is NaN, not lower, when something was excluded; `sqlrl_excluded` counts them.
- A policy-server failure is re-raised (it fails the step), not excluded.
- `model.lora_rank > 0` with vLLM is only validated where vLLM is importable.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

VERL_VERSION = "0.8.0"
AGENT_NAME = "sqlrl_agent"
DATA_SOURCE = "sqlrl"
ADV_ESTIMATOR = "sqlrl_grpo"
MANAGER_CLASS = f"{__name__}.SqlrlAgentLoopManager"
GOLD_AUDIT_FILE = "gold_audit.json"

__all__ = [
    "ADV_ESTIMATOR",
    "AGENT_NAME",
    "MANAGER_CLASS",
    "VERL_VERSION",
    "build_verl_config",
    "compute_score",
    "compute_sqlrl_grpo_advantage",
    "mask_excluded",
    "register_advantage_estimator",
    "task_to_row",
    "verl_overrides",
    "write_agent_loop_registry",
]


class VerlUnavailable(ImportError):
    """veRL (or one of its imports) is not installed in this environment."""


def _require_verl():
    try:
        import verl
    except Exception as e:  # ImportError, or a broken dependency raising something else at import time
        raise VerlUnavailable(
            f"veRL is not importable here ({type(e).__name__}: {e}); it lives in a separate venv because "
            "verl 0.8.0 pins numpy<2: run scripts/verl-env.sh and use .venv-verl/bin/python"
        ) from e
    return verl


# ---------------------------------------------------------------------------------------------------
# 1. Config mapping


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
) -> dict:
    """The veRL keys sqlrl sets, as a nested dict (merged over veRL's defaults by `build_verl_config`)."""
    g, a, m, r = cfg.grpo, cfg.agent, cfg.model, cfg.run
    if g.dynamic_sampling_rounds:
        raise ValueError(
            f"grpo.dynamic_sampling_rounds = {g.dynamic_sampling_rounds} is not mapped to veRL: its main "
            "GRPO trainer has no dynamic sampling (veRL's DAPO recipe has its own `filter_groups`). Set "
            "grpo.dynamic_sampling_rounds = 0 for the veRL backend, or train on one machine with `sqlrl train`."
        )
    prompt_len, response_len = _token_lengths(a)
    lr = 0.0 if g.control == "no-update" else float(g.lr)
    loss_agg = {"token-mean": "token-mean", "seq-mean": "seq-mean-token-mean"}[g.loss_agg]
    loggers = ["console"] + [lg for lg in r.loggers if lg in ("tensorboard", "wandb", "swanlab")]
    reward_fn = {"path": str(Path(__file__).resolve()), "name": "compute_score"}
    micro = int(g.micro_batch)
    lora: dict[str, Any] = {"lora_rank": int(m.lora_rank)}
    if m.lora_rank > 0:
        lora.update(lora_alpha=int(m.lora_alpha), target_modules=list(m.lora_targets))
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
            "model": {
                "path": model_path or m.name,
                "enable_gradient_checkpointing": True,
                "use_remove_padding": True,
                **lora,
            },
            "actor": {
                "strategy": "fsdp",
                "ppo_mini_batch_size": int(g.prompts_per_step),  # one optimizer step per rollout step
                "ppo_micro_batch_size_per_gpu": micro,
                "ppo_epochs": 1,
                "use_dynamic_bsz": False,
                "clip_ratio": float(g.clip_low),
                "clip_ratio_low": float(g.clip_low),
                "clip_ratio_high": float(g.clip_high),
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
            **({"default_local_dir": default_local_dir} if default_local_dir else {}),
        },
    }


def _load_default_config():
    """veRL's own `ppo_trainer.yaml`, composed by hydra from the installed package."""
    verl = _require_verl()
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    config_dir = str(Path(verl.__file__).resolve().parent / "trainer" / "config")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(config_name="ppo_trainer")
    # veRL's AgentLoopConfig dataclass declares `agent_loop_manager_class` (read by the trainer with
    # .get()), but its YAML omits it, so struct mode would refuse it; add only that key (value None), and
    # the dataclass conversion in `validate_verl_config` checks it is a real field.
    with open_dict(config.actor_rollout_ref.rollout.agent):
        config.actor_rollout_ref.rollout.agent.agent_loop_manager_class = None
    return config


def validate_verl_config(config) -> None:
    """Run veRL's own checks on a composed config (DictConfig); raises on the first problem."""
    _require_verl()
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
            "_target_": f"{__name__}.SqlrlAgentLoop",
            "budgets": Budgets.from_config(cfg.agent).to_dict(),
            "sandbox_workers": int(sandbox_workers or cfg.run.sandbox_workers),
        }
    ]


def write_agent_loop_registry(cfg, path: str | os.PathLike) -> Path:
    import yaml

    path = Path(path)
    path.write_text(yaml.safe_dump(agent_loop_registry(cfg), sort_keys=False), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------
# Data: dataset rows for veRL (public task only; the gold is referenced, never copied)


def task_to_row(
    task,
    *,
    data_root: str,
    split: str,
    index: int,
    turns: int,
    max_schema_chars: int,
    split_seed: int = 0,
    val_fraction: float = 0.1,
    reward_kind: str = "execution",
) -> dict:
    """One veRL dataset row for a task. Accepts a PrivateTask but writes only its public part; the gold
    is referenced (folder, split and its settings, task id), never copied."""
    from sqlrl.agent.prompts import build_messages
    from sqlrl.tasks.data import PrivateTask, ensure_public

    public = ensure_public(task.public if isinstance(task, PrivateTask) else task)
    ref = {
        "data": str(data_root),
        "split": split,
        "split_seed": int(split_seed),
        "val_fraction": float(val_fraction),
        "task_id": public.task_id,
        "kind": reward_kind,
    }
    return {
        "data_source": DATA_SOURCE,
        "agent_name": AGENT_NAME,
        "prompt": build_messages(public, turns=turns, max_schema_chars=max_schema_chars),
        "reward_model": {"style": "rule", "ground_truth": json.dumps(ref, sort_keys=True)},
        "extra_info": {"index": index, "split": split, "sqlrl_task": _public_dict(public)},
    }


def _gold_cache_dir() -> str:
    """The gold cache shared by `write_dataset`'s audit and the reward workers (`SQLRL_GOLD_CACHE`)."""
    return os.environ.get("SQLRL_GOLD_CACHE", str(Path.home() / ".cache" / "sqlrl" / "verl-goldcache"))


def write_dataset(cfg, out_dir: str | os.PathLike, *, quiet: bool = False) -> dict[str, str]:
    """Write train/validation parquet files for veRL from the run config's data section.

    Every gold is audited first (`sqlrl.tasks.goldcache.audit_golds`, in the gold cache the reward workers use,
    `SQLRL_GOLD_CACHE`): a task whose gold errors, times out or returns no rows is left out of the files,
    so it never enters a veRL batch. `gold_audit.json` beside the files records, per split, how many tasks
    there were, how many were written and how many were excluded by reason; the same is printed unless
    `quiet`. A split left with no scorable task is a ValueError. Returns the paths (`train`,
    `validation`, `gold_audit`). `data.max_train_tasks` / `data.max_eval_tasks` then pick the same seeded
    subset of the scorable tasks as sqlrl's own trainer (`sqlrl.evaluation.runner.select_tasks`, seed `run.seed`).
    """
    import pandas as pd

    from sqlrl.artifacts import write_json_atomic
    from sqlrl.tasks.data import SpiderData, embedded_root, select_tasks
    from sqlrl.tasks.goldcache import GoldCache, audit_golds

    d, a = cfg.data, cfg.agent
    root = str(embedded_root()) if d.path == "embedded" else str(Path(d.path).expanduser().resolve())
    data = SpiderData(root)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, str] = {}
    report: dict[str, Any] = {"data": root, "gold_cache": _gold_cache_dir(), "splits": {}}
    with GoldCache(_gold_cache_dir()) as cache:
        for name, split in (("train", d.train_split), ("validation", d.eval_split)):
            tasks = data.load(split, seed=d.split_seed, val_fraction=d.val_fraction)
            audit = audit_golds(tasks, cache)
            scorable = [t for t in tasks if audit.per_task.get(t.public.task_id) is None]
            limit = d.max_train_tasks if name == "train" else d.max_eval_tasks
            kept = select_tasks(scorable, limit, cfg.run.seed)
            report["splits"][name] = {
                "split": split,
                "tasks": len(tasks),
                "scorable": len(scorable),
                "limit": limit,
                "written": len(kept),
                "excluded": dict(sorted(audit.excluded.items())),
                "excluded_task_ids": sorted(k for k, v in audit.per_task.items() if v is not None),
            }
            if not quiet:
                why = ", ".join(f"{k} {v}" for k, v in sorted(audit.excluded.items())) or "none"
                cap = f" (limit {limit} of {len(scorable)} scorable)" if len(kept) < len(scorable) else ""
                print(
                    f"veRL data {name} ({split}): {len(tasks)} tasks, {len(kept)} written{cap}, "
                    f"{len(tasks) - len(scorable)} excluded (unscorable gold: {why})"
                )
            if not kept:
                raise ValueError(f"veRL data: no task of split {split!r} has a scorable gold ({root})")
            rows = [
                task_to_row(
                    t,
                    data_root=root,
                    split=split,
                    index=i,
                    turns=a.turns,
                    max_schema_chars=a.max_schema_chars,
                    split_seed=d.split_seed,
                    val_fraction=d.val_fraction,
                    reward_kind=cfg.grpo.reward,
                )
                for i, t in enumerate(kept)
            ]
            path = out / f"{name}.parquet"
            pd.DataFrame(rows).to_parquet(path)
            paths[name] = str(path)
    audit_path = out / GOLD_AUDIT_FILE
    write_json_atomic(audit_path, report)
    paths["gold_audit"] = str(audit_path)
    return paths


def _public_dict(public) -> dict:
    return {
        "task_id": public.task_id,
        "db_id": public.db_id,
        "question": public.question,
        "schema": public.schema,
        "evidence": public.evidence,
        "db_path": public.db_path,
    }


def _public_from_row(extra_info: Any):
    from sqlrl.tasks.data import PublicTask

    d = dict(extra_info["sqlrl_task"])
    return PublicTask(**{k: d[k] for k in ("task_id", "db_id", "question", "schema", "evidence", "db_path")})


# ---------------------------------------------------------------------------------------------------
# 2. Agent loop


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


def _make_agent_loop_class():
    _require_verl()
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

    @register(AGENT_NAME)
    class SqlrlAgentLoop(AgentLoopBase):
        """sqlrl's rollout loop (`run_agent`) for one trajectory against veRL's server manager."""

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

            task = _public_from_row(kwargs["extra_info"])  # only the public task; the gold is not in the row
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


def __getattr__(name: str):
    # `SqlrlAgentLoop` is built (and registered with veRL) on first access, so importing this module
    # needs no veRL; veRL's hydra `_target_: sqlrl.integrations.verl.SqlrlAgentLoop` resolves through here.
    # `SqlrlAgentLoopManager` likewise (veRL's driver loads it with `load_class_from_fqn`), and building
    # it registers the `sqlrl_grpo` advantage estimator in that process.
    makers = {"SqlrlAgentLoop": _make_agent_loop_class, "SqlrlAgentLoopManager": _make_manager_class}
    if name in makers:
        cls = makers[name]()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------------------------
# 3. Reward (trainer side)


_EVAL_STATE: dict[str, Any] = {}
_EVAL_LOCK = threading.Lock()


def _private_task(ref: dict):
    from sqlrl.tasks.data import SpiderData

    kw = {"seed": int(ref.get("split_seed", 0)), "val_fraction": float(ref.get("val_fraction", 0.1))}
    key = f"{ref['data']}|{ref['split']}|{kw['seed']}|{kw['val_fraction']}"
    with _EVAL_LOCK:
        tasks = _EVAL_STATE.get(key)
        if tasks is None:
            tasks = {t.public.task_id: t for t in SpiderData(ref["data"]).load(ref["split"], **kw)}
            _EVAL_STATE[key] = tasks
    return tasks[ref["task_id"]]


def _evaluator(kind: str):
    from sqlrl.agent.envs import make_env

    with _EVAL_LOCK:
        ev = _EVAL_STATE.get(f"evaluator:{kind}")
        if ev is None:
            cache_dir = _gold_cache_dir()
            env = make_env(
                workers=int(os.environ.get("SQLRL_REWARD_WORKERS", "2")),
                timeout_s=float(os.environ.get("SQLRL_SQL_TIMEOUT_S", "5.0")),
                gold_dir=cache_dir,
                reward=kind,
            )
            ev = _EVAL_STATE[f"evaluator:{kind}"] = env.evaluator
        return ev


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """veRL custom reward function: sqlrl's Evaluator on the agent's final SQL.

    `ground_truth` is the JSON reference written by `task_to_row` (data folder, split, task id); the
    PrivateTask (with the gold) is loaded here, on the reward worker. `extra_info["sqlrl_final_sql"]` is
    the agent's decision (from SqlrlAgentLoop's extra_fields); without it (another agent loop) the last
    SQL block of `solution_str` is used.

    An excluded trajectory (unscorable gold, sandbox infra error during the rollout or the scoring) gets
    `sqlrl_excluded = 1` and score 0.0 only because veRL needs a finite reward: `SqlrlAgentLoopManager`
    zeroes its response mask and the `sqlrl_grpo` estimator leaves it out of its group's statistics and
    gives it advantage 0, so it does not count as a wrong answer in the update. Its verdict metrics
    (`acc`, `sqlrl_executable`) are NaN: no verdict, rather than a wrong one.
    """
    from sqlrl.agent.prompts import Parser

    extra_info = dict(extra_info or {})
    ref = json.loads(ground_truth) if isinstance(ground_truth, str) else dict(ground_truth)
    task = _private_task(ref)
    if "sqlrl_final_sql" in extra_info:
        final_sql = extra_info["sqlrl_final_sql"]
    else:
        final_sql = Parser.extract_sql(solution_str or "")
    kind = os.environ.get("SQLRL_REWARD_KIND") or ref.get("kind") or "execution"
    if extra_info.get("sqlrl_infra_error"):
        value, status = None, "infra_error"
    else:
        rw = _evaluator(kind).score(final_sql, task)
        value, status = rw.value, rw.status
    if value is None:
        nan = float("nan")
        return {"score": 0.0, "acc": nan, "sqlrl_excluded": 1.0, "sqlrl_executable": nan}
    return {
        "score": float(value),
        "acc": 1.0 if status == "match" else 0.0,
        "sqlrl_excluded": 0.0,
        "sqlrl_executable": 1.0 if status in ("match", "mismatch") else 0.0,
    }


# ---------------------------------------------------------------------------------------------------
# 4. Runtime exclusions: the trajectory is masked out (driver) and left out of its GRPO group


def compute_sqlrl_grpo_advantage(
    token_level_rewards,
    response_mask,
    index,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config=None,
    **kwargs,
):
    """veRL's GRPO outcome advantage (`core_algos.compute_grpo_outcome_advantage`, 0.8.0) over the
    trajectories that are not excluded; registered with veRL as `sqlrl_grpo`.

    A trajectory is excluded when its `response_mask` is all zero: `SqlrlAgentLoopManager` zeroes it for
    every trajectory whose reward is excluded (and a trajectory that generated nothing has no token to
    train either: its whole group shares the prompt, so the group is all such trajectories and gets
    advantage 0 under plain GRPO as well). Per group (same `index`): mean and unbiased std (`torch.std`)
    of the scores of the valid trajectories only; a group with one valid trajectory gets mean 0 and
    std 1, as veRL's GRPO does for a singleton group; advantage = (score - mean) / (std + epsilon), or
    score - mean when `norm_adv_by_std_in_grpo` is False (Dr. GRPO). Excluded trajectories get exactly
    0. veRL's generic estimator call does not pass `norm_adv_by_std_in_grpo`, so it is read from
    `config` (`algorithm`) when not given. Returns (advantages, returns), both (bs, response_length).
    """
    import torch

    if norm_adv_by_std_in_grpo is None:
        norm_adv_by_std_in_grpo = True
        if config is not None:
            get = config.get if hasattr(config, "get") else lambda k, d: getattr(config, k, d)
            norm_adv_by_std_in_grpo = bool(get("norm_adv_by_std_in_grpo", True))
    scores = token_level_rewards.sum(dim=-1)
    valid = (response_mask.sum(dim=-1) > 0).tolist()
    with torch.no_grad():
        groups: dict[Any, list[int]] = {}
        for i, ok in enumerate(valid):
            if ok:
                groups.setdefault(index[i], []).append(i)
        adv = torch.zeros_like(scores)
        for rows in groups.values():
            s = scores[rows]
            if len(rows) == 1:
                mean, std = torch.tensor(0.0), torch.tensor(1.0)
            else:
                mean, std = torch.mean(s), torch.std(s)
            adv[rows] = (s - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else s - mean
        adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


def register_advantage_estimator() -> None:
    """Register `compute_sqlrl_grpo_advantage` as veRL's `sqlrl_grpo` in this process (idempotent)."""
    _require_verl()
    from verl.trainer.ppo import core_algos

    import sqlrl.integrations.verl as canonical  # one function object, even if veRL loaded this file again

    fn = canonical.compute_sqlrl_grpo_advantage
    if core_algos.ADV_ESTIMATOR_REGISTRY.get(ADV_ESTIMATOR) is not fn:
        core_algos.register_adv_est(ADV_ESTIMATOR)(fn)  # raises if another function holds the name


def excluded_rows(data):
    """Boolean numpy array: which trajectories of a veRL DataProto are excluded (reward extra info
    `sqlrl_excluded`, or the agent loop's `sqlrl_infra_error` when the reward has not been merged)."""
    import numpy as np

    nt = data.non_tensor_batch
    n = len(data)
    out = np.zeros(n, dtype=bool)
    if "sqlrl_excluded" in nt:
        out |= np.asarray(nt["sqlrl_excluded"], dtype=float) > 0
    if "sqlrl_infra_error" in nt:
        out |= np.array([bool(x) for x in nt["sqlrl_infra_error"]], dtype=bool)
    return out


def mask_excluded(data) -> int:
    """Zero `response_mask` (in place) for the excluded trajectories of a DataProto; returns how many.

    veRL's losses use `response_mask` as the loss mask: a zero row is in no policy-gradient, KL or entropy
    term, nor in the token (token-mean) or sequence (seq-mean-*) counts that normalize them."""
    import torch

    rows = excluded_rows(data)
    if rows.any():
        data.batch["response_mask"][torch.from_numpy(rows)] = 0
    return int(rows.sum())


def _make_manager_class():
    _require_verl()
    from verl.experimental.agent_loop import AgentLoopManager
    from verl.utils.ray_utils import auto_await

    register_advantage_estimator()  # the driver imports this class by name: the estimator is then there

    class SqlrlAgentLoopManager(AgentLoopManager):
        """veRL's AgentLoopManager (runs in the trainer driver) that masks excluded trajectories out of
        the batch it returns (`mask_excluded`), for training and validation alike."""

        @auto_await
        async def generate_sequences(self, prompts):
            output = await AgentLoopManager.generate_sequences.__wrapped__(self, prompts)
            n = mask_excluded(output)
            if n:
                print(f"sqlrl: {n} of {len(output)} trajectories excluded (masked out of the update)")
            return output

    SqlrlAgentLoopManager.__qualname__ = "SqlrlAgentLoopManager"  # picklable by reference
    return SqlrlAgentLoopManager


# ---------------------------------------------------------------------------------------------------
# CLI: sqlrl verl-config CONFIG.toml -o verl.yaml
