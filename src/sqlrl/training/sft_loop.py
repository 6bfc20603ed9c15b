"""The step loop of `sqlrl sft` (`sft.train_sft`): batches, optimizer steps, steps.jsonl, the curve.

What is covered:
- `collate`, `answer_loss_sum`, `sft_step`: one optimizer step on a batch in micro-batches, cross-entropy
  on target tokens only, averaged over the step's answer tokens; a non-finite gradient norm skips the
  parameter write but not the learning-rate schedule (`update.step_schedule`).
- `run_steps`: the steps after the checkpoint up to `sft.steps`, a steps.jsonl line each, a checkpoint
  every `sft.checkpoint_every` (else `run.checkpoint_every`) steps and at the last, the time budget;
  with a branch step, its weights exported before that step's checkpoint (`sft_branch.py`).
- `SFTCurve`: with `run.eval_every` = N > 0 (text-to-SQL), the GRPO trainer's learning curve
  (`curve.Curve`: greedy validation accuracy after every N-th and the last step, curve.jsonl, points
  after a resumed run's checkpoint dropped and measured again), on the weights being trained; a full
  fine-tune generates with a copy in the generation dtype (`trainer.rollout_policy`), refreshed at
  each point, as GRPO's rollouts do; the rollout engine's cache is dropped after each point (SFT steps
  need that GPU memory). The time of the points (refresh and drop included) is counted apart, so
  that it stays out of the run's `train_seconds`.

What is not: the points never reach the update (greedy decoding draws no random numbers and the
sampler has its own seeded generator), but a point's value depends on the generation dtype's
rounding, as GRPO's does.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlrl.artifacts import append_jsonl
from sqlrl.config_tables import SFTConfig
from sqlrl.training.curve import Curve
from sqlrl.training.runfolder import stop_for_time
from sqlrl.training.update import step_schedule

log = logging.getLogger(__name__)


def collate(examples: list[dict], pad_id: int, device):
    """Right-padded input ids, attention mask and labels (-100 on prompt, padding, and target tokens
    whose `target_mask` entry is 0)."""
    import torch

    T = max(len(e["prompt_ids"]) + len(e["target_ids"]) for e in examples)
    B = len(examples)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    labels = torch.full((B, T), -100, dtype=torch.long)
    for b, e in enumerate(examples):
        seq = e["prompt_ids"] + e["target_ids"]
        n, p = len(seq), len(e["prompt_ids"])
        ids[b, :n] = torch.tensor(seq)
        attn[b, :n] = 1
        tgt = torch.tensor(e["target_ids"])
        if e.get("target_mask") is not None:  # multi-turn traces: observations are not trained
            tgt = tgt.masked_fill(torch.tensor(e["target_mask"]) == 0, -100)
        labels[b, p:n] = tgt
    return ids.to(device), attn.to(device), labels.to(device)


def trained_tokens(example: dict) -> int:
    """Target tokens the loss covers: all of them, or those with `target_mask` 1."""
    mask = example.get("target_mask")
    return len(example["target_ids"]) if mask is None else sum(mask)


def answer_loss_sum(model, ids, attn, labels, autocast_dtype=None):
    """(sum of token cross-entropies over answer tokens, number of answer tokens, correct argmax tokens)."""
    import torch
    import torch.nn.functional as F

    from sqlrl.training.update import train_attention_context

    ctx = (
        torch.autocast("cuda", dtype=autocast_dtype)
        if autocast_dtype is not None
        else contextlib.nullcontext()
    )
    # the trainer's kernel rule (no cuDNN SDPA on CUDA), which SFT on padded batches needs as well
    with ctx, train_attention_context(ids.device.type):
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits
    logits = logits[:, :-1, :].float()
    tgt = labels[:, 1:]
    mask = tgt != -100
    loss = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100, reduction="sum"
    )
    with torch.no_grad():
        correct = int(((logits.argmax(-1) == tgt) & mask).sum().item())
    return loss, int(mask.sum().item()), correct


def sft_step(model, optimizer, scheduler, params, batch, sft: SFTConfig, pad_id: int, device, autocast):
    """One optimizer step on `batch` in micro-batches, the loss averaged over all answer tokens of the
    step; a non-finite gradient norm skips the parameter write. Returns (loss sum, correct tokens,
    answer tokens, gradient norm)."""
    import torch

    n_tok = sum(trained_tokens(e) for e in batch)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss_sum, correct, counted = 0.0, 0, 0
    for k in range(0, len(batch), sft.micro_batch):
        ids, attn, labels = collate(batch[k : k + sft.micro_batch], pad_id, device)
        loss, ntok, corr = answer_loss_sum(model, ids, attn, labels, autocast)
        (loss / n_tok).backward()
        loss_sum += float(loss.item())
        correct += corr
        counted += ntok
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, sft.max_grad_norm).item())
    stepped = math.isfinite(grad_norm)
    if stepped:
        optimizer.step()
    step_schedule(scheduler, optimizer_stepped=stepped)
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, correct, counted, grad_norm


class SFTCurve:
    """The learning curve of an SFT run (`curve.Curve` over `env`, a `Text2SQLTraining`, with `budgets`);
    off when `run.eval_every` = 0. `with curve:` opens the environment's sandbox when it is on;
    `curve(step, last)` measures a due point; `seconds` is the time spent on points so far."""

    def __init__(self, cfg, out: Path, env, budgets, resumed_at: int | None, model, loaded: tuple):
        self.curve = Curve(cfg, out, env, budgets, resumed_at)
        self.env, self.model, self.out, self.extra_s = env, model, out, 0.0
        self.policy = self.gen = None
        if self.curve.every > 0:
            from sqlrl.training.trainer import rollout_policy

            tokenizer, base_name, self.base_identity, gen_dtype = loaded
            t0 = time.perf_counter()
            gen, self.policy, separate = rollout_policy(
                cfg, model, tokenizer, base_name, self.base_identity, gen_dtype
            )
            self.gen = gen if separate else None
            self.extra_s += time.perf_counter() - t0

    @property
    def seconds(self) -> float:
        return self.curve.seconds + self.extra_s

    def __enter__(self) -> SFTCurve:
        if self.policy is not None:
            self.env.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.policy is not None:
            self.env.__exit__(*exc)

    def __call__(self, step: int, last: bool) -> dict | None:
        if not self.curve.due(step, last):
            return None
        from sqlrl.training.trainer import sync_weights

        t0 = time.perf_counter()
        self.model.eval()  # the next sft_step sets train mode again
        if self.gen is not None:
            sync_weights(self.gen, self.model)
        self.policy.identity = f"{self.base_identity}@{self.out.name}:step{step}"
        self.extra_s += time.perf_counter() - t0
        point = self.curve(step, self.policy, last)
        t0 = time.perf_counter()
        self.policy.release_memory()  # SFT steps never generate: its engine's memory goes back to them
        self.extra_s += time.perf_counter() - t0
        return point


@dataclass
class StepLoop:
    """What `run_steps` trains and with what: model, optimizer state, examples and their sampler, the
    run's checkpointer and curve, and the step settings."""

    model: Any
    optimizer: Any
    scheduler: Any
    params: list
    examples: list[dict]
    sampler: Any
    checkpoint: Any
    curve: SFTCurve
    sft: SFTConfig
    pad_id: int
    device: str
    autocast: Any
    every: int
    branch: Any = None
    """`sft_branch.Branch` (called after every step, before its checkpoint), or None."""


def run_steps(
    loop: StepLoop, out: Path, start_step: int, bar, deadline: float | None, stop_after: int | None
) -> int:
    """Train steps `start_step` + 1 .. `sft.steps` (fewer with `stop_after` or `deadline`); returns the
    last step taken."""
    sft = loop.sft
    last, done, last_step_s = start_step, 0, 0.0
    for step in range(start_step + 1, sft.steps + 1):
        if stop_for_time(deadline, last_step_s, last, start_step, loop.every, loop.checkpoint):
            log.warning(f"sqlrl sft: stopping before step {step} to meet the time budget")
            break
        t0 = time.perf_counter()
        batch = [loop.examples[i] for i in loop.sampler.next(sft.batch_size)]
        loss_sum, correct, counted, grad_norm = sft_step(
            loop.model,
            loop.optimizer,
            loop.scheduler,
            loop.params,
            batch,
            sft,
            loop.pad_id,
            loop.device,
            loop.autocast,
        )
        skipped = not math.isfinite(grad_norm)
        if skipped:
            log.warning(f"sqlrl sft: step {step}: non-finite gradient norm; update skipped")
        metrics = {
            "step": step,
            "loss": loss_sum / counted if counted else None,
            "token_accuracy": correct / counted if counted else None,
            "answer_tokens": counted,
            "n_examples": len(batch),
            "task_ids": [e["task_id"] for e in batch],
            "grad_norm": grad_norm if not skipped else None,
            "skipped_nonfinite": skipped,
            "lr": loop.scheduler.get_last_lr()[0],
            "time_step_s": round(time.perf_counter() - t0, 3),
        }
        append_jsonl(out / "steps.jsonl", metrics)
        if bar is not None:
            bar.set_postfix(loss=f"{metrics['loss']:.4f}", gn=f"{grad_norm:.3g}")
            bar.update(1)
        if loop.branch is not None:  # before the checkpoint: a checkpoint past the branch implies it
            loop.branch(step, loop.model)
        if step % loop.every == 0 or step == sft.steps:
            loop.checkpoint(step)
        loop.curve(step, step == sft.steps)
        last, done, last_step_s = step, done + 1, time.perf_counter() - t0
        if stop_after is not None and done >= stop_after:
            break
    return last
