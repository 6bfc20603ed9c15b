"""`sqlrl train CONFIG.toml`: the GRPO loop.

Per step: sample `prompts_per_step` training tasks -> `group_size` rollouts each with the current
policy through the agent loop (`agent.run_agent`, public tasks only) -> the evaluator scores each
trajectory after it ended -> group-relative advantages -> clipped-surrogate update on the generated
tokens only (prompt and observation tokens are masked) -> metrics, checkpoint.

Guarantees:
- Unscorable golds are excluded before sampling (counted in run.json); trajectories that failed for
  infrastructure reasons (policy or sandbox) are excluded from the batch and counted, never scored 0.
- `control = "no-update"` runs every step (rollouts, reward, loss, backward, gradient norm) with
  learning rate 0 and does not call `optimizer.step()`: with lr = 0 the step changes no value but
  AdamW's `p + (-0.0 * x)` turns -0.0 into +0.0, which a bit-level audit must not excuse. The weight
  audit then checks the weights are bit-identical to the base. `reward = "validity"` rewards any SQL that executes.
- Full fine-tuning keeps float32 master weights; on CUDA rollouts use a bfloat16 copy that is
  re-synced after every optimizer step (updates of ~1e-6 would be lost if accumulated in bf16).
- Token ids and log-probs come from generation time; the update never re-tokenizes text.
- Memory: the update runs in passes (`grpo.micro_batch`, `grpo.micro_batch_logit_tokens`) that only
  split the step's sum; a pass that runs out of GPU memory makes the trainer redo that step's update
  with a halved logit-token cap (recorded; a single trajectory that does not fit stops the run with a
  message naming the settings). Rollout generation that runs out of GPU memory is redone with half the
  batch (`HFPolicy`; `gen_oom_retries`, `gen_max_batch_used` in steps.jsonl,
  `generation_memory_adjustments` in run.json; a resumed run starts again from `run.gen_max_batch`).
- Dynamic sampling (`grpo.dynamic_sampling_rounds` > 0, DAPO): groups whose rewards are all equal are
  dropped from the update and replaced from extra rollout rounds on fresh tasks (at most that many
  rounds; the update may still have fewer than `prompts_per_step` groups). The step's reward, accuracy
  and group metrics are the first round's; `trained_groups`, `ds_rounds`, `ds_trajectories` and
  `gen_tokens` (all rounds) record the rest. Off by default.
- `run.log_sql` (on by default): every trajectory the reward scored, every round, one compact line in
  sql.jsonl (step, round, task, sample, each turn's SQL, final SQL, reward value and status): the
  full stream of what training scored (rollouts.jsonl keeps text and token ids of a few per step).
- Determinism: tasks come from a seeded epoch permutation (cursor saved in checkpoints), sampling
  seeds are a function of (run seed, step, round), RNG states are checkpointed. On CPU in float32 a resumed
  run takes the same next step as an uninterrupted one (tested); on GPU, kernels may differ.

Not guaranteed: a useful learning signal at any size; that is what the controls and the evidence
gate are for.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from sqlrl.artifacts import (
    append_jsonl,
    append_jsonl_many,
    git_commit,
    machine_info,
    read_json,
    read_jsonl,
    write_json_atomic,
    write_jsonl,
)
from sqlrl.config import Config, ConfigError
from sqlrl.generation.device import device_and_dtypes, free_memory
from sqlrl.training.budget import out_of_time


def scored_groups(trajs: list) -> list[list]:
    """The scored trajectories (reward value not None) of one rollout call, grouped by task, in first-seen
    task order; a task whose every trajectory was excluded has no group."""
    groups: dict[str, list] = {}
    for tr in trajs:
        if tr.reward["value"] is not None:
            groups.setdefault(tr.task_id, []).append(tr)
    return list(groups.values())


def informative(group: list) -> bool:
    """A group carries a learning signal: at least two scored trajectories whose rewards differ (the
    complement of `grpo.group_advantages`' zero-variance groups, singletons included)."""
    values = [tr.reward["value"] for tr in group]
    return len(values) >= 2 and max(values) != min(values)


class TaskSampler:
    """Seeded epoch permutations over task indices; `state_dict()` is the data cursor."""

    def __init__(self, n: int, seed: int):
        if n <= 0:
            raise ValueError("no training tasks to sample from")
        self.n, self.seed, self.epoch, self.pos = n, seed, 0, 0
        self._perm = self._make_perm()

    def _make_perm(self) -> list[int]:
        perm = list(range(self.n))
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(perm)
        return perm

    def next(self, k: int) -> list[int]:
        """`k` task indices; no index twice in one batch while k <= n (a batch that straddles an epoch
        boundary takes the new epoch's first indices that are not already in the batch)."""
        out: list[int] = []
        while len(out) < k:
            if self.pos >= self.n:
                self.epoch += 1
                self.pos = 0
                self._perm = self._make_perm()
                self._reordered = False
                if out and k <= self.n:
                    taken = set(out)
                    self._perm = [i for i in self._perm if i not in taken] + [
                        i for i in self._perm if i in taken
                    ]
                    self._reordered = True
            out.append(self._perm[self.pos])
            self.pos += 1
        return out

    def state_dict(self) -> dict:
        perm = list(self._perm) if getattr(self, "_reordered", False) else None
        return {"epoch": self.epoch, "pos": self.pos, "n": self.n, "seed": self.seed, "perm": perm}

    def load_state_dict(self, s: dict) -> None:
        if s["n"] != self.n or s["seed"] != self.seed:
            raise ValueError(
                f"data cursor is for {s['n']} tasks / seed {s['seed']}, this run has {self.n} / {self.seed}"
            )
        self.epoch, self.pos = s["epoch"], s["pos"]
        self._perm = list(s["perm"]) if s.get("perm") else self._make_perm()
        self._reordered = bool(s.get("perm"))


class MetricSinks:
    """TensorBoard always (when installed); W&B / SwanLab only when the config asks for them.

    Every sink gets the same scalars (numbers, not booleans) under the same step. W&B and SwanLab runs
    are named after the run folder, carry the resolved config, and follow their own settings for
    where the data goes (e.g. WANDB_MODE=offline, SWANLAB_MODE=offline): sqlrl itself makes no
    network call. Asking for one that is not installed is a ConfigError that says what to install.
    """

    def __init__(self, cfg: Config, out_dir: Path):
        self.writers = []
        name, project = out_dir.as_posix(), cfg.run.tracker_project
        for sink in cfg.run.loggers:
            if sink == "tensorboard":
                try:
                    from torch.utils.tensorboard import SummaryWriter

                    self.writers.append(("tb", SummaryWriter(log_dir=str(out_dir / "tb"))))
                except ImportError:
                    print(
                        "sqlrl: tensorboard not installed; TensorBoard logging off (pip install tensorboard)",
                        file=sys.stderr,
                    )
            elif sink == "wandb":
                wandb = _import_tracker("wandb")
                run = wandb.init(project=project, name=name, dir=str(out_dir), config=cfg.resolve())
                self.writers.append(("wandb", run))
            elif sink == "swanlab":
                swanlab = _import_tracker("swanlab")
                run = swanlab.init(project=project, name=name, log_dir=str(out_dir), config=cfg.resolve())
                self.writers.append(("swanlab", run))

    def log(self, metrics: dict, step: int) -> None:
        scalars = {k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        for kind, w in self.writers:
            if kind == "tb":
                for k, v in scalars.items():
                    w.add_scalar(f"train/{k}", v, step)
                w.flush()
            elif kind == "wandb":
                w.log(scalars, step=step)
            elif kind == "swanlab":
                w.log(scalars, step=step)

    def close(self) -> None:
        for kind, w in self.writers:
            with contextlib.suppress(Exception):
                w.close() if kind == "tb" else w.finish()


def _import_tracker(name: str):
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise ConfigError(
            f"run.loggers asks for {name} but it is not installed: pip install {name} "
            f"(or pip install 'sqlrl[trackers]'), or remove it from run.loggers"
        ) from None


def gpu_telemetry() -> dict:
    try:
        import torch

        if not torch.cuda.is_available():
            return {}
        out = {
            "gpu_mem_gb": round(torch.cuda.max_memory_allocated() / 2**30, 3),
            "gpu_mem_reserved_gb": round(torch.cuda.memory_reserved() / 2**30, 3),
        }
        with contextlib.suppress(Exception):
            out["gpu_util"] = float(torch.cuda.utilization())
        torch.cuda.reset_peak_memory_stats()
        return out
    except Exception:
        return {}


def build_batch(trajs, advantages, device, pad_id: int):
    """Left-pad token sequences so every trajectory ends at the last column (so `logits_to_keep` can cover
    all generated tokens), with explicit position ids."""
    import torch

    T = max(len(t.token_ids) for t in trajs)
    B = len(trajs)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.float32)
    old = torch.zeros((B, T), dtype=torch.float32)
    first_gen = T
    for b, t in enumerate(trajs):
        n = len(t.token_ids)
        ids[b, T - n :] = torch.tensor(t.token_ids, dtype=torch.long)
        attn[b, T - n :] = 1
        mask[b, T - n :] = torch.tensor(t.loss_mask, dtype=torch.float32)
        old[b, T - n :] = torch.tensor(t.logprobs, dtype=torch.float32)
        gen_pos = [i for i, m in enumerate(t.loss_mask) if m]
        if gen_pos:
            first_gen = min(first_gen, T - n + gen_pos[0])
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    adv = torch.tensor(advantages, dtype=torch.float32)
    keep = T - first_gen + 1  # logits for positions first_gen-1 .. T-1
    return {
        "input_ids": ids.to(device),  # [B, T]
        "attention_mask": attn.to(device),  # [B, T]
        "position_ids": pos.to(device),  # [B, T]
        "loss_mask": mask.to(device),  # [B, T]
        "old_logprobs": old.to(device),  # [B, T]
        "advantages": adv.to(device),  # [B]
        "keep": max(2, min(keep, T)),
    }


def train_attention_context(device_type: str):
    """Attention kernels for the training forward/backward passes.

    On CUDA the cuDNN SDPA kernel is excluded (flash, memory-efficient and math remain). Batches are
    left-padded, so padding query rows are fully masked; on an H200 (torch 2.11, cuDNN SDPA) such
    batches occasionally gave non-finite gradients in every parameter while the loss was finite
    (GRPO runs of 2026-11-29; reproduced on random weights by `scripts/nan_probe.py`: cuDNN 1 of 150
    batches, math and memory-efficient 0 of the same 150). Elsewhere: no change.
    """
    if device_type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def sequence_logprobs(model, batch, temperature: float, autocast_dtype):
    """Log-probs of each sequence's own next tokens on the last `keep` columns: [B, keep-1]."""
    import torch

    from sqlrl.training.grpo import token_logprobs

    keep = batch["keep"]
    ctx = (
        torch.autocast("cuda", dtype=autocast_dtype)
        if autocast_dtype is not None
        else contextlib.nullcontext()
    )
    with ctx, train_attention_context(batch["input_ids"].device.type):
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
            logits_to_keep=keep,
            use_cache=False,
        )
    logits = out.logits[:, :-1, :].float()  # [B, keep-1, V]: predicts tokens at columns T-keep+1 .. T-1
    targets = batch["input_ids"][:, -keep + 1 :]  # [B, keep-1]
    return token_logprobs(logits, targets, temperature=temperature)  # [B, keep-1]


def logit_span(traj) -> int:
    """Logit columns `build_batch` keeps for this trajectory: from its first generated token to its
    end, plus one (at least 2, as in `build_batch`)."""
    gen = next((i for i, m in enumerate(traj.loss_mask) if m), None)
    return 2 if gen is None else max(2, len(traj.token_ids) - gen + 1)


def micro_batches(spans: list[int], max_seqs: int, max_logit_tokens: int = 0) -> list[tuple[int, int]]:
    """Split consecutive items (already in batch order) into [start, end) micro-batches.

    A micro-batch holds at most `max_seqs` items and, when `max_logit_tokens` > 0, at most that many
    items x largest span (the padded logit block the log-prob pass materialises). An item whose own
    span is above the cap still gets a micro-batch of its own (it cannot be split).
    """
    if max_seqs < 1:
        raise ValueError(f"max_seqs must be >= 1, got {max_seqs}")
    out: list[tuple[int, int]] = []
    start, widest = 0, 0
    for i, span in enumerate(spans):
        w = max(widest, span)
        n = i - start + 1
        if n > 1 and (n > max_seqs or (max_logit_tokens > 0 and n * w > max_logit_tokens)):
            out.append((start, i))
            start, w = i, span
        widest = w
    if start < len(spans):
        out.append((start, len(spans)))
    return out


def _oom_message(step: int, n: int, keep: int, g, retries: int = 0) -> str:
    tried = f" (after {retries} retries with smaller passes)" if retries else ""
    return (
        f"out of GPU memory in the update of step {step}{tried}: a micro-batch of {n} trajectories x {keep} "
        f"logit columns. Lower grpo.micro_batch (now {g.micro_batch}) or cap "
        f"grpo.micro_batch_logit_tokens (now {g.micro_batch_logit_tokens}; e.g. 4096), then resume from "
        "the last checkpoint: `sqlrl train ... --resume RUN_DIR`, or for `sqlrl experiment` / `sqlrl "
        "curriculum` the same command with the new setting (both are memory-only settings, which a resume "
        "may change)"
    )


# Settings that change only how an update is split into passes (memory), never what is computed: a
# resumed run may change them, e.g. after running out of GPU memory.
MEMORY_ONLY_KEYS = {("grpo", "micro_batch"), ("grpo", "micro_batch_logit_tokens")}
# Settings that change only what is written for inspection (never what is computed): a resume may change
# them too (recorded like the memory-only ones); sql.jsonl of a run resumed with log_sql turned on
# starts at the resumed step
RECORD_ONLY_KEYS = {("run", "log_sql"), ("run", "log_rollouts")}
_RESUMABLE_CHANGES = MEMORY_ONLY_KEYS | RECORD_ONLY_KEYS
# settings added after run folders were first written, with the value that behaves as before they
# existed: a saved config without one of them is read as having that value (so older runs resume)
ADDED_KEYS = {("grpo", "dynamic_sampling_rounds"): 0, ("sft", "submit_turns"): 0}


def config_changes(saved: dict, mine: dict) -> tuple[list[str], list[str]]:
    """Compare two resolved configs (section -> key -> value) for a resume: (the "section.key" names
    that differ outside `MEMORY_ONLY_KEYS` and `RECORD_ONLY_KEYS`, which block it; those changes as
    "section.key: old -> new", which are allowed and should be recorded). A section present on one
    side only blocks, by its name. A key of `ADDED_KEYS` missing from `saved` counts as its listed value."""

    def old(s: str, k: str):
        sec = saved.get(s, {})
        return sec[k] if k in sec else ADDED_KEYS.get((s, k))

    changed = [(s, k) for s in mine for k in mine[s] if old(s, k) != mine[s][k]]
    changed += [(s, k) for s in saved if s in mine for k in saved[s] if k not in mine[s]]
    blocking = [f"{s}.{k}" for s, k in changed if (s, k) not in _RESUMABLE_CHANGES]
    blocking += [s for s in saved if s not in mine]
    memory = [
        f"{s}.{k}: {saved.get(s, {}).get(k)} -> {mine[s].get(k)}"
        for s, k in changed
        if (s, k) in _RESUMABLE_CHANGES
    ]
    return blocking, memory


def check_run_folder(out: Path, mine: dict, resume: bool, command: str) -> list[str]:
    """Check a run folder before training: with `resume`, its config.json must equal `mine` (the
    resolved config as JSON) except for `MEMORY_ONLY_KEYS`, whose changes are returned (as
    "section.key: old -> new"); without, the folder must be new or empty. `command` names the
    command in the error (``train``, ``sft``). Creates nothing."""
    if resume:
        if not (out / "config.json").is_file():
            raise ConfigError(f"--resume {out}: no config.json there; is this a sqlrl {command} run folder?")
        diff, memory = config_changes(read_json(out / "config.json"), mine)
        if diff:
            raise ConfigError(
                f"--resume {out}: the config differs from the run's config.json in {diff}; "
                "resume with the same config file (or start a new run folder)"
            )
        return memory
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"run folder {out} is not empty; choose a new --out or pass --resume {out}")
    return []


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


def train(
    cfg: Config,
    out_dir: str | Path,
    *,
    resume: bool = False,
    policy_factory=None,
    progress: bool = True,
    command: list[str] | None = None,
    stop_after: int | None = None,
    deadline: float | None = None,
    evaluator_factory=None,
) -> dict:
    """Run GRPO. `stop_after` ends the process-local loop after that many steps (for kill/resume tests);
    `deadline` (a `time.monotonic()` value) stops cleanly, with a checkpoint, before a step that would
    probably end after it, so a time-limited session can resume the run later. `policy_factory` ->
    (model, tokenizer, name, identity) and `evaluator_factory(sandbox, gold_cache, kind)` replace the
    model loading and the reward (tests use them for tiny models and scripted rewards)."""
    import torch

    from sqlrl.agent.envs import make_env
    from sqlrl.agent.loop import Budgets, Sampling
    from sqlrl.evaluation.runner import EXECUTABLE_FAIL
    from sqlrl.generation.policy import HFPolicy
    from sqlrl.training.checkpoint import (
        capture_rng,
        export_hf,
        load_latest,
        restore_checkpoint,
        restore_rng,
        save_checkpoint,
    )
    from sqlrl.training.grpo import group_advantages, policy_loss

    out = Path(out_dir)
    g = cfg.grpo
    # tuples -> lists, as in the saved JSON
    resume_changes = check_run_folder(out, json.loads(json.dumps(cfg.resolve())), resume, "train")
    out.mkdir(parents=True, exist_ok=True)

    seed = cfg.run.seed
    random.seed(seed)
    torch.manual_seed(seed)
    device, gen_dtype = device_and_dtypes(cfg)
    budgets = Budgets.from_config(cfg.agent)

    # ---- data: the environment decides where tasks come from and how they are rolled out and scored ----
    env = make_env(cfg, out, evaluator_factory=evaluator_factory)
    tasks = env.tasks
    sampler = TaskSampler(len(tasks), seed)

    # ---- model ----
    train_model, tokenizer, base_name, base_identity = load_trainable(cfg, device, gen_dtype, policy_factory)
    separate_gen = cfg.model.lora_rank == 0 and device == "cuda" and gen_dtype != "float32"
    if separate_gen:
        import copy

        gen_model = copy.deepcopy(train_model).to(getattr(torch, gen_dtype)).eval()
    else:
        gen_model = train_model
    policy = HFPolicy(
        gen_model,
        tokenizer,
        engine=cfg.run.gen_engine,
        max_batch=cfg.run.gen_max_batch,
        name=base_name,
        identity=base_identity,
    )
    ref_model = None
    if g.kl_coef > 0:
        import copy

        ref_model = copy.deepcopy(gen_model if separate_gen else train_model).eval()
        for p in ref_model.parameters():
            p.requires_grad_(False)

    params = [p for p in train_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=g.lr, betas=g.betas, weight_decay=g.weight_decay)
    warm = max(0, g.warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0
    )

    start_step = 0
    prev_train_s = 0.0
    earlier_adjustments: list[dict] = []  # out-of-memory cap changes of earlier invocations (kept steps)
    if resume:
        prev_run: dict = {}
        with contextlib.suppress(Exception):
            prev_run = read_json(out / "run.json")
        with contextlib.suppress(Exception):
            prev_train_s = float(prev_run.get("train_seconds") or 0.0)
        with contextlib.suppress(Exception):
            earlier_adjustments = list(prev_run.get("memory_adjustments") or [])
        info = load_latest(out)
        if info is not None:
            side = restore_checkpoint(info, train_model, optimizer, scheduler)
            sampler.load_state_dict(side["data_cursor"])
            restore_rng(side["rng"])
            start_step = int(side["step"])
            if separate_gen:
                _sync(gen_model, train_model)
        if resume_changes:  # memory-only settings changed: recorded in config.json and run.json
            print(f"sqlrl train: resuming with {resume_changes}", file=sys.stderr)
            write_json_atomic(out / "config.json", cfg.resolve())
        # drop metrics of steps after the checkpoint (the run was killed after logging them)
        for name in ("steps.jsonl", "rollouts.jsonl", "sql.jsonl"):
            if (out / name).exists():
                kept = [r for r in read_jsonl(out / name) if r["step"] <= start_step]
                write_jsonl(out / name, kept)
        earlier_adjustments = [a for a in earlier_adjustments if a.get("step", 0) <= start_step]
    else:
        write_json_atomic(out / "config.json", cfg.resolve())
        write_json_atomic(out / "split.json", env.split_info())
    run_info = {
        "command": command or sys.argv,
        "git": git_commit(),
        "machine": machine_info(),
        "device": device,
        "gen_dtype": gen_dtype,
        "model": {"name": base_name, "base_identity": base_identity},
        "config_hash": cfg.config_hash(),
        "data": str(getattr(env, "root", None) or getattr(env, "file", "")),
        "data_kind": env.kind,
        "train_tasks": len(tasks),
        "gold_audit": env.gold_audit,
        "budgets": budgets.to_dict(),
        "arm": arm_kind(cfg),
        "resumed_from_step": start_step if resume else None,
        "resume_changes": resume_changes,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "status": "running",
    }
    write_json_atomic(out / "run.json", run_info)

    autocast = torch.bfloat16 if device == "cuda" else None
    sinks = MetricSinks(cfg, out)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=g.steps, initial=start_step, desc=f"grpo[{arm_kind(cfg)}]", unit="step")
    t_train0 = time.perf_counter()
    steps_done = 0
    last_step = start_step
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with env:
        last_step_s = 0.0

        def checkpoint(at_step: int) -> None:
            save_checkpoint(
                out,
                at_step,
                model=train_model,
                optimizer=optimizer,
                scheduler=scheduler,
                rng_state=capture_rng(),
                data_cursor=sampler.state_dict(),
                config_hash=cfg.config_hash(),
                keep_last=cfg.run.keep_checkpoints,
            )

        logit_cap = g.micro_batch_logit_tokens  # lowered for the rest of the run if a pass runs out of memory
        if earlier_adjustments and not any(
            c.startswith("grpo.micro_batch_logit_tokens:") for c in resume_changes
        ):
            # a resumed run keeps the cap an earlier invocation lowered (unless the resume sets a new one)
            logit_cap = int(earlier_adjustments[-1]["micro_batch_logit_tokens"])
        memory_adjustments: list[dict] = []
        for step in range(start_step + 1, g.steps + 1):
            if out_of_time(deadline, last_step_s):
                if last_step > start_step and last_step % cfg.run.checkpoint_every != 0:
                    checkpoint(last_step)
                print(
                    f"sqlrl train: stopping before step {step} to meet the time budget; resume with --resume {out}",
                    file=sys.stderr,
                )
                break
            t0 = time.perf_counter()
            gen_adjustments_before = len(policy.memory_adjustments)
            train_model.eval()
            policy.identity = f"{base_identity}@{out.name}:step{step - 1}"
            t_roll = t_score = 0.0

            def sample_round(r: int, step: int = step) -> tuple[list, list]:
                """Rollouts of `prompts_per_step` fresh tasks (round r of this step), scored."""
                nonlocal t_roll, t_score
                batch_tasks = [tasks[i] for i in sampler.next(g.prompts_per_step)]
                t_r = time.perf_counter()
                # round 0's seed is the step's seed of a run without dynamic sampling
                sampling_seed = seed * 1_000_003 + step + r * 10_000_019
                got = env.rollout(
                    batch_tasks,
                    policy,
                    budgets,
                    Sampling(temperature=g.temperature, top_p=g.top_p, seed=sampling_seed),
                    g.group_size,
                )
                t_roll += time.perf_counter() - t_r
                t_s = time.perf_counter()
                scored = env.score(got)
                t_score += time.perf_counter() - t_s
                if cfg.run.log_sql:
                    append_jsonl_many(out / "sql.jsonl", (sql_record(step, r, tr) for tr in got))
                return got, scored

            trajs, accs = sample_round(0)  # the step's sample: its metrics describe the policy
            valid = [tr for tr in trajs if tr.reward["value"] is not None]
            n_excl = len(trajs) - len(valid)
            first_groups = scored_groups(trajs)
            train_groups = first_groups
            generated = list(trajs)
            ds_rounds = 0
            if g.dynamic_sampling_rounds > 0:
                train_groups = [grp for grp in first_groups if informative(grp)]
                while len(train_groups) < g.prompts_per_step and ds_rounds < g.dynamic_sampling_rounds:
                    ds_rounds += 1
                    more, _ = sample_round(ds_rounds)
                    generated += more
                    train_groups += [grp for grp in scored_groups(more) if informative(grp)]
                train_groups = train_groups[: g.prompts_per_step]
            train_valid = [tr for grp in train_groups for tr in grp]
            rewards = torch.tensor([tr.reward["value"] for tr in train_valid], dtype=torch.float32)
            gids = torch.tensor([k for k, grp in enumerate(train_groups) for _ in grp], dtype=torch.long)
            adv = (
                group_advantages(rewards, gids, scale=g.adv_scale)[0] if len(train_valid) else torch.zeros(0)
            )

            # ---- update ----
            t1 = time.perf_counter()
            train_model.train()
            total_tokens = sum(tr.generated_tokens for tr in train_valid)
            n_seqs = len(train_valid)
            active = [
                (tr, float(a))
                for tr, a in zip(train_valid, adv.tolist())
                if (a != 0.0 or g.kl_coef > 0) and tr.generated_tokens > 0
            ]
            active.sort(key=lambda x: len(x[0].token_ids))
            spans = [logit_span(x[0]) for x in active]
            oom_retries = 0
            while True:  # once, unless a pass runs out of GPU memory (then again with smaller passes)
                optimizer.zero_grad(set_to_none=True)
                loss_sum, kl_sum, clip_sum, tok_sum = 0.0, 0.0, 0.0, 0
                nonfinite_logp, nonfinite_loss_mb = 0, 0  # diagnostics for a skipped (non-finite) update
                oom_at = None
                batch = logp = loss = ref = m = old = None
                try:
                    for mb_start, mb_end in micro_batches(spans, g.micro_batch, logit_cap):
                        mb = active[mb_start:mb_end]
                        oom_at = (len(mb), max(spans[mb_start:mb_end]))
                        batch = build_batch([x[0] for x in mb], [x[1] for x in mb], device, pad_id)
                        keep = batch["keep"]
                        logp = sequence_logprobs(train_model, batch, g.temperature, autocast)  # [b, keep-1]
                        m = batch["loss_mask"][:, -keep + 1 :]
                        old = batch["old_logprobs"][:, -keep + 1 :]
                        ref = None
                        if ref_model is not None:
                            with torch.no_grad():
                                ref = sequence_logprobs(ref_model, batch, g.temperature, autocast)
                        loss, lm = policy_loss(
                            logp,
                            old,
                            batch["advantages"],
                            m,
                            clip_low=g.clip_low,
                            clip_high=g.clip_high,
                            ref_logprobs=ref,
                            kl_coef=g.kl_coef,
                            agg=g.loss_agg,
                            loss_scale_tokens=float(total_tokens) if g.loss_agg == "token-mean" else None,
                            loss_scale_seqs=float(n_seqs) if g.loss_agg == "seq-mean" else None,
                        )
                        with torch.no_grad():
                            nonfinite_logp += int((~torch.isfinite(logp) & (m != 0)).sum().item())
                            nonfinite_loss_mb += int(not bool(torch.isfinite(loss).item()))
                        loss.backward()
                        ntok = float(m.sum().item())
                        loss_sum += float(loss.item())
                        kl_sum += lm.get("kl", 0.0) * ntok
                        clip_sum += lm.get("clip_frac", 0.0) * ntok
                        tok_sum += ntok
                    oom_at = None
                except torch.OutOfMemoryError:
                    pass  # handled below, outside the except block, so that its frames free their tensors
                if oom_at is None:
                    break
                batch = logp = loss = ref = m = old = None
                optimizer.zero_grad(set_to_none=True)
                free_memory()
                n_mb, width = oom_at
                if n_mb <= 1:  # one trajectory per pass already: nothing smaller to try
                    raise RuntimeError(_oom_message(step, n_mb, width, g, oom_retries))
                # The passes only split the step's token sum (the objective is normalised over the whole
                # step), so a smaller cap changes memory, not what is computed (up to float summation
                # order). Halve the failing pass; the cap stays for the rest of the run.
                logit_cap = max(1, n_mb * width // 2)
                oom_retries += 1
                memory_adjustments.append({"step": step, "micro_batch_logit_tokens": logit_cap})
                print(
                    f"sqlrl train: step {step}: out of GPU memory in a pass of {n_mb} trajectories x {width} "
                    f"logit columns; redoing the update with micro_batch_logit_tokens = {logit_cap} "
                    "(memory only; kept for the rest of the run, recorded in steps.jsonl and run.json)",
                    file=sys.stderr,
                )
            grad_norm = (
                float(torch.nn.utils.clip_grad_norm_(params, g.max_grad_norm).item()) if params else 0.0
            )
            skipped = not math.isfinite(grad_norm)
            nonfinite_diag = None
            if skipped:  # never apply a non-finite update; the step is recorded as skipped
                bad = [
                    n
                    for n, p in train_model.named_parameters()
                    if p.grad is not None and not bool(torch.isfinite(p.grad).all().item())
                ]
                nonfinite_diag = {
                    "logprobs_at_loss_tokens": nonfinite_logp,
                    "micro_batches_with_nonfinite_loss": nonfinite_loss_mb,
                    "params_with_nonfinite_grad": len(bad),
                    "first_params": bad[:8],
                }
                optimizer.zero_grad(set_to_none=True)
                print(
                    f"sqlrl train: step {step}: non-finite gradient norm; update skipped ({nonfinite_diag})",
                    file=sys.stderr,
                )
            # The No-update control takes every step except the parameter write: AdamW with lr = 0 leaves
            # every value unchanged but still flips signed zeros (-0.0 + (-0.0 * negative) = +0.0), which
            # the bit-level audit rightly reports (seen on the dequantized Qwen weights, 2026-11-29).
            if not skipped and g.control != "no-update":
                optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            if separate_gen:
                _sync(gen_model, train_model)
            t_upd = time.perf_counter() - t1
            rv = [tr.reward["value"] for tr in valid]
            metrics = {
                "step": step,
                "reward_mean": sum(rv) / len(rv) if rv else None,
                "reward_std": float(torch.tensor(rv).std(unbiased=False)) if len(rv) > 1 else 0.0,
                "accuracy": sum(accs) / len(accs) if accs else None,
                "executable_rate": (
                    sum(tr.reward["status"] not in EXECUTABLE_FAIL for tr in valid) / len(valid)
                )
                if valid
                else None,
                # the first round's reward statuses, excluded ones included (e.g. how many timed out)
                "reward_status_counts": dict(Counter(str(tr.reward.get("status")) for tr in trajs)),
                "loss": loss_sum,
                "kl": kl_sum / tok_sum if tok_sum else 0.0,
                "clip_frac": clip_sum / tok_sum if tok_sum else 0.0,
                "entropy": None,
                "grad_norm": grad_norm if not skipped else None,
                "skipped_nonfinite": skipped,
                "nonfinite_diagnostics": nonfinite_diag,
                "update_applied": bool(not skipped and g.control != "no-update"),
                "lr": scheduler.get_last_lr()[0],
                "n_trajectories": len(trajs),
                "n_excluded": n_excl,
                "groups": float(len(first_groups)) if first_groups else None,
                "zero_var_groups": float(sum(not informative(grp) for grp in first_groups))
                if first_groups
                else None,
                "trained_groups": len(train_groups),
                "ds_rounds": ds_rounds,
                "ds_trajectories": len(generated),
                "trained_tokens": int(tok_sum),
                "oom_retries": oom_retries,
                "micro_batch_logit_tokens_used": logit_cap,
                "gen_oom_retries": len(policy.memory_adjustments) - gen_adjustments_before,
                "gen_max_batch_used": getattr(policy, policy.batch_attr),
                "gen_tokens": sum(tr.generated_tokens for tr in generated),
                "mean_turns": sum(len(tr.turns) for tr in trajs) / len(trajs),
                "time_rollout_s": round(t_roll, 3),
                "time_score_s": round(t_score, 3),
                "time_update_s": round(t_upd, 3),
                "time_step_s": round(time.perf_counter() - t0, 3),
                **gpu_telemetry(),
            }
            append_jsonl(out / "steps.jsonl", metrics)
            if cfg.run.log_rollouts:
                for tr in trajs[: cfg.run.log_rollouts]:
                    append_jsonl(out / "rollouts.jsonl", {"step": step, **tr.to_dict(with_tokens=True)})
            sinks.log(metrics, step)
            if bar is not None:
                bar.set_postfix(
                    reward=f"{metrics['reward_mean'] or 0:.3f}",
                    acc=f"{metrics['accuracy'] or 0:.3f}",
                    loss=f"{loss_sum:.4f}",
                    gn=f"{grad_norm:.3g}",
                    s=f"{metrics['time_step_s']:.1f}",
                )
                bar.update(1)
            if step % cfg.run.checkpoint_every == 0 or step == g.steps:
                checkpoint(step)
            steps_done += 1
            last_step = step
            last_step_s = time.perf_counter() - t0
            if stop_after is not None and steps_done >= stop_after:
                break
    if bar is not None:
        bar.close()
    sinks.close()
    train_s = time.perf_counter() - t_train0
    finished = last_step >= g.steps
    result = {"steps": last_step, "finished": finished}
    if finished:
        export = export_hf(train_model, tokenizer, out / "final", merge_lora=True)
        result["final"] = str(out / "final")
        result["final_identity"] = export.get("weights_hash")
        if cfg.run.prune_checkpoints_at_end:
            _prune_checkpoints(out)
    total_s = prev_train_s + train_s
    run_info.update(
        {
            "status": "finished" if finished else "stopped",
            "memory_adjustments": earlier_adjustments + memory_adjustments,
            "generation_memory_adjustments": list(policy.memory_adjustments),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "train_seconds": round(total_s, 2),
            "gpu_minutes": round(total_s / 60.0, 3) if device == "cuda" else None,
            **result,
        }
    )
    write_json_atomic(out / "run.json", run_info)
    return result


def sql_record(step: int, round_: int, tr: Any) -> dict:
    """One line of train/sql.jsonl: what the reward scored for one training trajectory, without text or
    token ids (step, dynamic-sampling round, task, sample, the SQL of every turn, final SQL, reward, and
    the sandbox's milliseconds on the final SQL when scoring it: which model SQL is slow)."""
    rw = tr.reward or {}
    parts = rw.get("parts") or {}
    return {
        "step": step,
        "round": round_,
        "task_id": tr.task_id,
        "db_id": tr.db_id,
        "sample": tr.sample,
        "turn_sql": [t.sql for t in tr.turns],
        "final_sql": tr.final_sql,
        "value": rw.get("value"),
        "status": rw.get("status"),
        "exec_ms": rw.get("exec_ms"),
        "execution_match": parts.get("execution_match"),
        "infra_error": tr.infra_error,
    }


def _prune_checkpoints(out: Path) -> None:
    """Delete checkpoint folders of a finished, exported run; keep the manifest and mark it pruned."""
    import shutil

    ck = out / "checkpoints"
    if not ck.is_dir():
        return
    for d in ck.iterdir():
        if d.is_dir():
            shutil.rmtree(d, ignore_errors=True)
    mp = ck / "manifest.json"
    if mp.exists():
        m = read_json(mp)
        m["pruned"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        m["pruned_reason"] = "run finished and exported to final/; run.prune_checkpoints_at_end = true"
        write_json_atomic(mp, m)


def _sync(dst, src) -> None:
    import torch

    with torch.no_grad():
        for pd, ps in zip(dst.parameters(), src.parameters()):
            pd.copy_(ps)


def arm_kind(cfg: Config) -> str:
    if cfg.grpo.control == "no-update":
        return "no_update"
    if cfg.grpo.reward == "validity":
        return "validity"
    return "grpo"
