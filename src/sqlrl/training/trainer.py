"""`sqlrl train CONFIG.toml`: the GRPO loop.

Per step: sample `prompts_per_step` training tasks -> `group_size` rollouts each with the current
policy through the agent loop (public tasks only) -> the evaluator scores each trajectory after it
ended -> group-relative advantages (`rollouts.py`) -> clipped-surrogate update on the generated tokens
only (`update.py`) -> metrics (steps.jsonl, metric sinks), checkpoint (`runfolder.py`).

What is covered:
- Unscorable golds are excluded before sampling (counted in run.json); trajectories that failed for
  infrastructure reasons are excluded from the batch and counted, never scored 0.
- `grpo.control = "no-update"` runs every step with learning rate 0 and without `optimizer.step()`
  (the weight audit: bit-identical to the base); `grpo.reward = "validity"` rewards any SQL that runs.
- Full fine-tuning keeps float32 master weights; on CUDA rollouts use a bfloat16 copy that is
  re-synced after every optimizer step (updates of ~1e-6 would be lost if accumulated in bf16).
- GPU memory: the rollout engine's KV cache and CUDA graphs stay between steps and go after a curve
  evaluation; an update out of memory drops them and retries (dropping them before every later update:
  `gen_cache_dropped`), then uses smaller passes (`update.py`); generation out of memory halves its batch
  (`HFPolicy`); steps.jsonl, checkpoints and run.json record each change. A resume keeps its checkpoint's
  pass caps and generation batch (`sessions.py`) and keeps the engine's cache until an update runs out.
- Determinism: tasks come from a seeded epoch permutation (cursor saved in checkpoints), sampling
  seeds are a function of (run seed, step, round), RNG states are checkpointed. On CPU in float32 a
  resumed run takes the same next step as an uninterrupted one (tested).

What is not: a useful learning signal at any size (that is what the controls and the evidence gate
are for); the same GPU kernels across runs.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlrl.artifacts import append_jsonl, git_commit, holds_run_lock, machine_info, write_json_atomic
from sqlrl.config import Config
from sqlrl.evaluation.progress import open_part
from sqlrl.generation.device import device_and_dtypes
from sqlrl.training.curve import Curve
from sqlrl.training.rollouts import RolloutSource, StepSample, advantages, informative
from sqlrl.training.runfolder import (
    Checkpointer,
    MetricSinks,
    check_run_folder,
    drop_steps_after,
    export_final,
    gpu_telemetry,
    previous_run,
    prune_checkpoints,
    restore_latest,
    stop_for_time,
)
from sqlrl.training.sampling import make_sampler
from sqlrl.training.schedule import lr_factor
from sqlrl.training.sessions import (
    GenMemory,
    Sessions,
    TrainClock,
    kept_machines,
    resumed_memory,
    resumed_seconds,
)
from sqlrl.training.update import Learner, PassMemory, UpdateResult, update_policy

log = logging.getLogger(__name__)


def load_trainable(cfg: Config, device: str, gen_dtype: str, policy_factory=None):
    """(model, tokenizer, base name, base identity) ready to train: float32 master weights for a full
    fine-tune (`gen_dtype` under LoRA), the LoRA adapters of `cfg.model`, gradient checkpointing."""
    if policy_factory is not None:
        model, tokenizer, base_name, base_identity = policy_factory()
    else:
        master_dtype = gen_dtype if cfg.model.lora_rank > 0 else "float32"
        from sqlrl.generation.models import load_model

        loaded = load_model(cfg.model.name, device=device, dtype=master_dtype)
        model, tokenizer, base_name, base_identity = (
            loaded.model,
            loaded.tokenizer,
            loaded.name,
            loaded.identity,
        )
    if cfg.model.lora_rank > 0:
        from peft import LoraConfig, get_peft_model

        lcfg = LoraConfig(
            r=cfg.model.lora_rank,
            lora_alpha=cfg.model.lora_alpha,
            lora_dropout=cfg.model.lora_dropout,
            target_modules=list(cfg.model.lora_targets),
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lcfg)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        if hasattr(model, "enable_input_require_grads"):
            model.enable_input_require_grads()
    return model, tokenizer, base_name, base_identity


def seed_and_device(cfg: Config) -> tuple[str, str]:
    """Seed python's and torch's RNGs with `run.seed`; then (device, generation dtype) of the run."""
    import torch

    random.seed(cfg.run.seed)
    torch.manual_seed(cfg.run.seed)
    return device_and_dtypes(cfg)


def make_optimizer(
    params: list,
    lr: float,
    weight_decay: float,
    warmup_steps: int,
    betas=None,
    *,
    schedule: str = "constant",
    total_steps: int = 0,
    min_ratio: float = 0.0,
):
    """(AdamW, LambdaLR with linear warm-up over `warmup_steps`, then `schedule`: constant, or a linear
    or cosine decay to `min_ratio` * lr at step `total_steps`; `schedule.lr_factor`)."""
    import torch

    kw = {} if betas is None else {"betas": betas}
    optimizer = torch.optim.AdamW(params, lr=lr, **kw, weight_decay=weight_decay)
    # LambdaLR's counter s is the number of scheduler steps taken: optimizer step s + 1 comes next
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s + 1, warmup_steps, schedule, total_steps, min_ratio)
    )
    return optimizer, scheduler


def pad_token_id(tokenizer) -> int:
    """The tokenizer's padding id, or its end-of-sequence id when it has none."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def sync_weights(dst, src) -> None:
    """Copy `src`'s parameter values into `dst` (same architecture; dtype converted)."""
    import torch

    with torch.no_grad():
        for pd, ps in zip(dst.parameters(), src.parameters()):
            pd.copy_(ps)


@dataclass
class PolicyModels:
    """The trained model, the copy rollouts generate with (itself unless `separate_gen`), the frozen
    reference (`grpo.kl_coef` > 0) and the rollout policy."""

    train: Any
    gen: Any
    ref: Any
    tokenizer: Any
    base_name: str
    base_identity: str
    policy: Any
    separate_gen: bool

    def sync(self) -> None:
        """Copy the trained weights into the generation copy (when there is one)."""
        if self.separate_gen:
            sync_weights(self.gen, self.train)


def rollout_policy(cfg: Config, train_model, tokenizer, base_name: str, base_identity: str, gen_dtype: str):
    """(generation model, the `HFPolicy` generating with it, whether it is a separate copy): a full
    fine-tune generates with a `gen_dtype` copy unless that is float32 (bfloat16 on CUDA by default; on
    CPU with `model.dtype = "bfloat16"`), which `sync_weights` refreshes; LoRA generates with `train_model`."""
    import copy

    import torch

    from sqlrl.generation.policy import HFPolicy

    separate_gen = cfg.model.lora_rank == 0 and gen_dtype != "float32"
    gen_model = train_model
    if separate_gen:
        gen_model = copy.deepcopy(train_model).to(getattr(torch, gen_dtype)).eval()
    policy = HFPolicy(
        gen_model,
        tokenizer,
        engine=cfg.run.gen_engine,
        max_batch=cfg.run.gen_max_batch,
        name=base_name,
        identity=base_identity,
    )
    return gen_model, policy, separate_gen


def build_models(cfg: Config, device: str, gen_dtype: str, policy_factory=None) -> PolicyModels:
    """The models of a GRPO run (`rollout_policy`; with `grpo.kl_coef` > 0 a frozen reference copy)."""
    import copy

    train_model, tokenizer, base_name, base_identity = load_trainable(cfg, device, gen_dtype, policy_factory)
    gen_model, policy, separate_gen = rollout_policy(
        cfg, train_model, tokenizer, base_name, base_identity, gen_dtype
    )
    ref_model = None
    if cfg.grpo.kl_coef > 0:
        ref_model = copy.deepcopy(gen_model).eval()
        for p in ref_model.parameters():
            p.requires_grad_(False)
    return PolicyModels(
        train_model, gen_model, ref_model, tokenizer, base_name, base_identity, policy, separate_gen
    )


@dataclass
class Resumed:
    """Where a GRPO run continues: last checkpointed step, its training seconds, the pass caps and the
    generation batch to start with and the run's out-of-memory changes of both so far, machines of
    earlier invocations (kept steps)."""

    memory: PassMemory
    gen: GenMemory
    start_step: int = 0
    prev_train_s: float = 0.0
    machines: list[dict] = field(default_factory=list)


def resume_grpo(
    cfg: Config, out: Path, models: PolicyModels, optimizer, scheduler, sampler, changes, from_valid=False
) -> Resumed:
    """Restore a GRPO run from its newest checkpoint; record allowed config `changes`; drop metric lines
    of later steps. A resumed run keeps the pass caps and the generation batch of its checkpoint,
    lowered ones included, unless the resume sets a new one (`sessions.resumed_memory`, `GenMemory`)."""
    prev_run = previous_run(out)
    restored = restore_latest(out, models.train, optimizer, scheduler, sampler, from_valid=from_valid)
    r = Resumed(PassMemory.start(cfg.grpo), GenMemory.resumed(restored, models.policy))
    if restored is not None:
        r.start_step = int(restored["step"])
        models.sync()
    r.prev_train_s = resumed_seconds(restored, prev_run)
    r.machines = kept_machines(prev_run, r.start_step)
    if changes:  # memory-only settings changed: recorded in config.json and run.json
        log.warning(f"sqlrl train: resuming with {changes}")
        write_json_atomic(out / "config.json", cfg.resolve())
    drop_steps_after(out, ("steps.jsonl", "rollouts.jsonl", "sql.jsonl"), r.start_step)
    r.memory = resumed_memory(restored, prev_run, r.start_step, cfg.grpo, changes)
    return r


def run_record(
    cfg: Config, env, models: PolicyModels, budgets, device, gen_dtype, command, resumed_from_step, changes
) -> dict:
    """run.json of a GRPO run while it runs: provenance, data, budgets, arm, where it resumed."""
    return {
        "command": command or sys.argv,
        "git": git_commit(),
        "machine": machine_info(),
        "device": device,
        "gen_dtype": gen_dtype,
        "model": {"name": models.base_name, "base_identity": models.base_identity},
        "config_hash": cfg.config_hash(),
        "data": str(getattr(env, "root", None) or getattr(env, "file", "")),
        "data_kind": env.kind,
        "train_tasks": len(env.tasks),
        "gold_audit": env.gold_audit,
        "budgets": budgets.to_dict(),
        "arm": arm_kind(cfg),
        "resumed_from_step": resumed_from_step,
        "resume_changes": changes,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "status": "running",
    }


def step_metrics(
    step: int, s: StepSample, u: UpdateResult, lr: float, policy, gen_before: int, times
) -> dict:
    """One line of steps.jsonl; `times` = (rollout start, update seconds). Reward, accuracy and group
    metrics describe the step's first round; `trained_*`, `ds_*` and `gen_tokens` all rounds."""
    import torch

    from sqlrl.evaluation.errorkinds import NON_EXECUTABLE

    t0, t_upd = times
    trajs, valid, accs, first_groups = s.trajs, s.valid, s.accs, s.first_groups
    rv = [tr.reward["value"] for tr in valid]
    return {
        "step": step,
        "reward_mean": sum(rv) / len(rv) if rv else None,
        "reward_std": float(torch.tensor(rv).std(unbiased=False)) if len(rv) > 1 else 0.0,
        "accuracy": sum(accs) / len(accs) if accs else None,
        "executable_rate": (sum(tr.reward["status"] not in NON_EXECUTABLE for tr in valid) / len(valid))
        if valid
        else None,
        # the first round's reward statuses, excluded ones included (e.g. how many timed out)
        "reward_status_counts": dict(Counter(str(tr.reward.get("status")) for tr in trajs)),
        "loss": u.loss,
        "kl": u.kl,
        "clip_frac": u.clip_frac,
        "entropy": None,
        "grad_norm": u.grad_norm if not u.skipped else None,
        "skipped_nonfinite": u.skipped,
        "nonfinite_diagnostics": u.nonfinite,
        "update_applied": u.applied,
        "lr": lr,
        "n_trajectories": len(trajs),
        "n_excluded": len(trajs) - len(valid),
        "groups": float(len(first_groups)) if first_groups else None,
        "zero_var_groups": float(sum(not informative(grp) for grp in first_groups)) if first_groups else None,
        "trained_groups": len(s.train_groups),
        "ds_rounds": s.ds_rounds,
        "ds_trajectories": len(s.generated),
        "trained_tokens": int(u.tokens),
        "oom_retries": u.oom_retries,
        "gen_cache_dropped": u.released,
        "micro_batch_logit_tokens_used": u.caps.logit_tokens,
        "micro_batch_tokens_used": u.caps.tokens,
        "gen_oom_retries": len(policy.memory_adjustments) - gen_before,
        "gen_max_batch_used": getattr(policy, policy.batch_attr),
        "gen_tokens": sum(tr.generated_tokens for tr in s.generated),
        "mean_turns": sum(len(tr.turns) for tr in trajs) / len(trajs),
        **checker_metrics(trajs),
        "time_rollout_s": round(s.t_roll, 3),
        "time_score_s": round(s.t_score, 3),
        "score_timeouts": s.score_timeouts,
        "score_max_exec_s": round(s.score_max_exec_ms / 1e3, 3),
        "time_update_s": round(t_upd, 3),
        "time_step_s": round(time.perf_counter() - t0, 3),
        **gpu_telemetry(),
    }


def checker_metrics(trajs: list) -> dict:
    """agent.checker only (else {}): the fractions of the step's first-round trajectories whose answer got
    a checker reply (`checker_checked`) and whose answer it changed (`checker_changed`)."""
    checks = [tr.checker for tr in trajs if tr.checker is not None]
    if not checks:
        return {}
    return {
        "checker_checked": sum(c["checked"] for c in checks) / len(trajs),
        "checker_changed": sum(c["changed"] for c in checks) / len(trajs),
    }


def arm_kind(cfg: Config) -> str:
    """The experiment arm a config runs: "no_update", "validity", "grpo_checker" (agent.checker) or "grpo"."""
    if cfg.grpo.control == "no-update":
        return "no_update"
    if cfg.grpo.reward == "validity":
        return "validity"
    return "grpo_checker" if cfg.agent.checker else "grpo"


def checkpoint_due(cfg: Config, step: int) -> bool:
    """Checkpoint after `step`: every `run.checkpoint_every` steps and at the last one, except the last
    one of a run that prunes its checkpoints at the end (its final export replaces it at once)."""
    if step >= cfg.grpo.steps:
        return not cfg.run.prune_checkpoints_at_end
    return step % cfg.run.checkpoint_every == 0


def save_final(cfg: Config, m: PolicyModels, out: Path) -> dict:
    """RUN/final of a finished run; returns its identity. A No-update run whose weights are bit-identical
    to the base as loaded records only their hashes (`export_unchanged`), not a second copy."""
    if arm_kind(cfg) == "no_update":
        from sqlrl.training.export import export_unchanged

        ident = export_unchanged(
            m.train, out / "final", base=cfg.model.name, base_identity=m.base_identity, step=cfg.grpo.steps
        )
        if ident is not None:
            if cfg.run.prune_checkpoints_at_end:
                prune_checkpoints(out)
            return ident
        log.warning("sqlrl train: the No-update run's weights differ from the base; exporting them in full")
    return export_final(m.train, m.tokenizer, out, cfg=cfg, base_identity=m.base_identity)


def _finish(cfg: Config, m, out: Path, finished: bool, last_step: int) -> dict:
    """The run's result; a finished run's final weights saved (`save_final`)."""
    from sqlrl.training.export import final_weights

    result: dict = {"steps": last_step, "finished": finished}
    if finished:
        export = save_final(cfg, m, out)
        result["final"] = final_weights(out / "final")  # the base itself when No-update stored only hashes
        result["final_identity"] = export.get("weights_hash")
    return result


def make_learner(m: PolicyModels, optimizer, scheduler, params: list, device: str) -> Learner:
    """The update pass's view of the models (bfloat16 autocast on CUDA); out of memory, it may drop the
    rollout engine's cache (`HFPolicy.release_memory`)."""
    import torch

    autocast = torch.bfloat16 if device == "cuda" else None
    pad = pad_token_id(m.tokenizer)
    return Learner(
        m.train, m.ref, optimizer, scheduler, params, device, pad, autocast, m.policy.release_memory
    )


@holds_run_lock("out_dir")
def train(
    cfg: Config,
    out_dir: str | Path,
    *,
    resume: bool = False,
    policy_factory=None,
    progress=True,
    command: list[str] | None = None,
    stop_after: int | None = None,
    deadline: float | None = None,
    evaluator_factory=None,
    resume_from_valid: bool = False,
) -> dict:
    """Run GRPO. With `resume`, a corrupt newest checkpoint stops it (`CheckpointError`) unless
    `resume_from_valid`, which resumes from the newest valid older checkpoint. `stop_after` ends the process-local loop after that many steps (for kill/resume tests);
    `deadline` (a `time.monotonic()` value) stops cleanly, with a checkpoint, before a step that would
    probably end after it, so a time-limited session can resume the run later. `policy_factory` ->
    (model, tokenizer, name, identity) and `evaluator_factory(sandbox, gold_cache, kind)` replace the
    model loading and the reward (tests use them for tiny models and scripted rewards). `progress`: True
    for a progress line of its own, False, or an experiment's opener (`progress.open_part`)."""

    from sqlrl.agent.envs import make_env
    from sqlrl.agent.loop import Budgets

    out = Path(out_dir)
    g = cfg.grpo
    # tuples -> lists, as in the saved JSON
    resume_changes = check_run_folder(out, json.loads(json.dumps(cfg.resolve())), resume, "train")
    out.mkdir(parents=True, exist_ok=True)
    device, gen_dtype = seed_and_device(cfg)
    budgets = Budgets.from_config(cfg.agent)

    # ---- data: the environment decides where tasks come from and how they are rolled out and scored ----
    env = make_env(cfg, out, evaluator_factory=evaluator_factory)
    sampler = make_sampler(cfg.grpo.task_sampling, len(env.tasks), cfg.run.seed)
    m = build_models(cfg, device, gen_dtype, policy_factory)
    params = [p for p in m.train.parameters() if p.requires_grad]
    optimizer, scheduler = make_optimizer(params, g.lr, g.weight_decay, g.warmup_steps, betas=g.betas)
    if resume:
        r = resume_grpo(cfg, out, m, optimizer, scheduler, sampler, resume_changes, resume_from_valid)
    else:
        r = Resumed(PassMemory.start(g), GenMemory.resumed(None, m.policy))
        write_json_atomic(out / "config.json", cfg.resolve())
        write_json_atomic(out / "split.json", env.split_info())
    start_step = r.start_step
    resumed_from = start_step if resume else None
    run_info = run_record(cfg, env, m, budgets, device, gen_dtype, command, resumed_from, resume_changes)
    record = Sessions(out, run_info, TrainClock(r.prev_train_s), start_step, r.machines, r.memory, r.gen)
    record.write(start_step, r.prev_train_s)

    sinks = MetricSinks(cfg, out)
    if resume:
        log.info(f"resuming training {out} from step {start_step} of {g.steps}")
    bar = open_part(
        progress,
        title=f"sqlrl train {arm_kind(cfg)}",
        label="train",
        kind="step",
        total=g.steps,
        initial=start_step,
    )
    record.clock.start(lambda: curve.seconds)
    steps_done, last_step, last_step_s = 0, start_step, 0.0
    learner = make_learner(m, optimizer, scheduler, params, device)
    drop_cache = False  # after an out-of-memory update released the engine's cache: before every update
    source = RolloutSource(
        env,
        env.tasks,
        sampler,
        m.policy,
        budgets,
        g,
        cfg.run.seed,
        out / "sql.jsonl" if cfg.run.log_sql else None,
    )
    checkpoint = Checkpointer(
        out, m.train, optimizer, scheduler, sampler, cfg.config_hash(), cfg.run.keep_checkpoints, record
    )
    curve = Curve(cfg, out, env, budgets, resumed_from)
    with env:
        for step in range(start_step + 1, g.steps + 1):
            if stop_for_time(
                deadline, last_step_s, last_step, start_step, cfg.run.checkpoint_every, checkpoint
            ):
                log.warning(
                    f"sqlrl train: stopping before step {step} to meet the time budget; resume with --resume {out}"
                )
                break
            t0 = time.perf_counter()
            gen_before = len(m.policy.memory_adjustments)
            m.train.eval()
            m.policy.identity = f"{m.base_identity}@{out.name}:step{step - 1}"
            sample = source.sample(step)
            adv = advantages(sample.train_groups, g)
            t1 = time.perf_counter()
            if drop_cache:
                m.policy.release_memory()
            upd = update_policy(learner, sample.train_valid, adv, g, step, r.memory.caps)
            upd.released = drop_cache = drop_cache or upd.released  # dropped for this step's update
            r.memory.after(upd)
            m.sync()
            lr = scheduler.get_last_lr()[0]
            metrics = step_metrics(
                step, sample, upd, lr, m.policy, gen_before, (t0, time.perf_counter() - t1)
            )
            if hasattr(sampler, "stats"):  # pass-rate sampling: tasks seen, and those in the middle
                metrics.update(sampler.stats())
            append_jsonl(out / "steps.jsonl", metrics)
            if cfg.run.log_rollouts:
                for tr in sample.trajs[: cfg.run.log_rollouts]:
                    append_jsonl(out / "rollouts.jsonl", {"step": step, **tr.to_dict(with_tokens=True)})
            sinks.log(metrics, step)
            if bar is not None:
                bar.set_postfix(
                    reward=f"{metrics['reward_mean'] or 0:.3f}",
                    acc=f"{metrics['accuracy'] or 0:.3f}",
                    loss=f"{upd.loss:.4f}",
                )
                bar.update(1)
            if checkpoint_due(cfg, step):
                checkpoint(step)
            point = curve(step, m.policy, step == g.steps)
            if point is not None:
                m.policy.release_memory()  # the curve's batch grew the engine past a step's rollouts
                sinks.log({"val_execution_match": point["execution_match"]}, step)
            steps_done, last_step, last_step_s = steps_done + 1, step, time.perf_counter() - t0
            if stop_after is not None and steps_done >= stop_after:
                break
    if bar is not None:
        bar.close()
    sinks.close()
    total_s = record.clock()
    result = _finish(cfg, m, out, last_step >= g.steps, last_step)
    run_info.update(
        {
            "status": "finished" if result["finished"] else "stopped",
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **record.fields(last_step, total_s),
            "curve_seconds": round(curve.seconds, 2),
            "gpu_minutes": round(total_s / 60.0, 3) if device == "cuda" else None,
            **result,
        }
    )
    write_json_atomic(out / "run.json", run_info)
    return result
