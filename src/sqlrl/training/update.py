"""The update pass of one GRPO step: micro-batches, out-of-memory retry, non-finite gradients.

What is covered:
- Trajectories with advantage 0 (and `grpo.kl_coef` = 0) or no generated token are left out; the rest
  run shortest first, in passes (`grpo.micro_batch`, `micro_batch_logit_tokens`, `micro_batch_tokens`)
  that only split the step's sum: the objective is normalised over the whole step (`grpo.policy_loss`).
- Token ids and log-probs are those of generation time; the update never re-tokenizes text. Batches
  are left-padded with explicit position ids, so `logits_to_keep` covers every generated token.
- A pass that runs out of GPU memory makes the update start again: first (once a step, when it frees
  something) with the same caps after `Learner.release` (the trainer's drops the rollout engine's
  cache), then with a halved cap: the token cap when `micro_batch_tokens` is set, else the logit-token
  cap (kept for the run, recorded); a single trajectory that does not fit raises a RuntimeError that names the settings to change.
- GPU memory of a pass (docs/LOG.md, 2026-12-07): every layer's saved activations cover all B x T padded
  columns, prompt included (~1.8 MB a token for Qwen2.5-0.5B under bf16 autocast, estimated), beside
  fp32 weights, grads and AdamW state (~7.9 GB) and the rollout engine's cache unless dropped.
- A non-finite gradient norm never reaches the weights: the step is recorded as skipped, with
  diagnostics (non-finite log-probs, passes with a non-finite loss, parameters with non-finite grads).
- `grpo.control = "no-update"` runs everything except `optimizer.step()`: AdamW with lr = 0 changes no
  value but turns -0.0 into +0.0, which the bit-level weight audit must not excuse.

What is not: the same float summation order under different caps (results agree up to rounding),
bit-identical GPU kernels between runs, measured GPU memory (scripts/gpu_update_memory.py measures it).
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

from sqlrl.generation.device import free_memory

log = logging.getLogger(__name__)


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
    """Attention kernels for training forward/backward passes: on CUDA every SDPA kernel but cuDNN's,
    which gave non-finite gradients on left-padded batches (fully masked query rows); elsewhere no change.
    `scripts/nan_probe.py` counts such batches per kernel."""
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


def micro_batches(
    spans: list[int],
    max_seqs: int,
    max_logit_tokens: int = 0,
    lengths: list[int] | None = None,
    max_tokens: int = 0,
) -> list[tuple[int, int]]:
    """Split consecutive items (already in batch order) into [start, end) micro-batches.

    A micro-batch holds at most `max_seqs` items; when `max_logit_tokens` > 0, at most that many
    items x largest span (the padded logit block the log-prob pass materialises); when `max_tokens` > 0,
    at most that many items x longest of `lengths` (the padded batch every layer's activations cover).
    An item above a cap on its own still gets a micro-batch of its own (it cannot be split).
    """
    if max_seqs < 1:
        raise ValueError(f"max_seqs must be >= 1, got {max_seqs}")
    if max_tokens > 0 and (lengths is None or len(lengths) != len(spans)):
        raise ValueError("max_tokens needs one length per item")
    lens = lengths if lengths is not None else [0] * len(spans)
    out: list[tuple[int, int]] = []
    start, widest, longest = 0, 0, 0
    for i, span in enumerate(spans):
        w, t = max(widest, span), max(longest, lens[i])
        n = i - start + 1
        over = (
            n > max_seqs
            or (max_logit_tokens > 0 and n * w > max_logit_tokens)
            or (max_tokens > 0 and n * t > max_tokens)
        )
        if n > 1 and over:
            out.append((start, i))
            start, w, t = i, span, lens[i]
        widest, longest = w, t
    if start < len(spans):
        out.append((start, len(spans)))
    return out


@dataclass(frozen=True)
class PassCaps:
    """The caps that split an update into passes (0 = none): `grpo.micro_batch_logit_tokens` and
    `grpo.micro_batch_tokens`, or what out-of-memory retries lowered them to."""

    logit_tokens: int = 0
    tokens: int = 0

    @classmethod
    def of(cls, g) -> PassCaps:
        """The caps the config `g` (`grpo`) sets."""
        return cls(g.micro_batch_logit_tokens, g.micro_batch_tokens)

    @classmethod
    def named(cls, caps: dict) -> PassCaps:
        """The caps of a `to_dict` record."""
        return cls(caps["micro_batch_logit_tokens"], caps["micro_batch_tokens"])

    def to_dict(self) -> dict:
        """The caps under their setting names (as in `memory_adjustments`)."""
        return {"micro_batch_logit_tokens": self.logit_tokens, "micro_batch_tokens": self.tokens}

    def lowered(self, n: int, width: int, length: int) -> tuple[PassCaps, dict]:
        """The caps after a pass of `n` trajectories x `width` logit columns x `length` padded columns ran
        out of memory: that pass halved, in the token cap when one is set, else in the logit-token cap;
        and the adjustment to record (without its step)."""
        if self.tokens > 0:
            new = replace(self, tokens=max(1, n * length // 2))
            return new, {"micro_batch_tokens": new.tokens}
        new = replace(self, logit_tokens=max(1, n * width // 2))
        return new, {"micro_batch_logit_tokens": new.logit_tokens}


def resumed_caps(g, adjustments: list[dict], changes: list[str]) -> PassCaps:
    """The caps a resumed run starts with: per cap, the last value an earlier invocation lowered it to
    (`adjustments`, as in run.json), unless the resume sets that setting anew (`changes`)."""
    caps = PassCaps.of(g).to_dict()
    for key in caps:
        lowered = [int(a[key]) for a in adjustments if key in a]
        if lowered and not any(c.startswith(f"grpo.{key}:") for c in changes):
            caps[key] = lowered[-1]
    return PassCaps.named(caps)


@dataclass
class PassMemory:
    """A run's update-pass memory state: the caps in force (`caps`), the config's caps they came from
    (`config`), and the run's out-of-memory cap changes so far (`adjustments`, [{"step", cap: value}],
    those of earlier invocations up to the step resumed from first)."""

    caps: PassCaps
    """The caps the next update uses."""
    config: PassCaps
    """The caps the run's config sets (what `caps` are, until an update runs out of memory)."""
    adjustments: list[dict] = field(default_factory=list)
    """Every cap change of the run so far, oldest first (run.json `memory_adjustments`)."""

    @classmethod
    def start(cls, g) -> PassMemory:
        """A new run's: the caps of the config `g` (`grpo`), no change yet."""
        return cls(PassCaps.of(g), PassCaps.of(g))

    def after(self, u: UpdateResult) -> None:
        """The update `u` ran: its caps stay in force, its cap changes are the run's."""
        self.caps = u.caps
        self.adjustments += u.memory_adjustments

    def sidecar(self) -> dict:
        """A checkpoint's record of it (sidecar `extra`): `pass_caps` in force, `pass_caps_config`,
        `memory_adjustments` so far."""
        return {
            "pass_caps": self.caps.to_dict(),
            "pass_caps_config": self.config.to_dict(),
            "memory_adjustments": [dict(a) for a in self.adjustments],
        }


def oom_message(step: int, n: int, keep: int, g, retries: int = 0, length: int = 0) -> str:
    """The error of an update that does not fit even one trajectory per pass: what to change, how to resume."""
    tried = f" (after {retries} retries with smaller passes)" if retries else ""
    return (
        f"out of GPU memory in the update of step {step}{tried}: a micro-batch of {n} trajectories x {keep} "
        f"logit columns ({length} padded columns). Lower grpo.micro_batch (now {g.micro_batch}), cap "
        f"grpo.micro_batch_tokens (now {g.micro_batch_tokens}; e.g. 16384) or "
        f"grpo.micro_batch_logit_tokens (now {g.micro_batch_logit_tokens}; e.g. 4096), or turn on "
        "model.gradient_checkpointing, then resume from the last checkpoint: `sqlrl train ... --resume "
        "RUN_DIR`, or for `sqlrl experiment` / `sqlrl curriculum` the same command with the new setting "
        "(the grpo ones are memory-only settings, which a resume may change)"
    )


@dataclass
class Passes:
    """Sums over the passes of one attempt at the update (and where it ran out of memory, if it did)."""

    loss: float = 0.0
    kl: float = 0.0  # token-weighted
    clip: float = 0.0  # token-weighted
    tokens: float = 0
    nonfinite_logp: int = 0  # diagnostics for a skipped (non-finite) update
    nonfinite_loss_mb: int = 0
    oom_at: tuple[int, int, int] | None = None  # (trajectories, logit columns, padded length) of the pass


@dataclass
class UpdateResult:
    """What one step's update did (the update part of the step's metrics)."""

    loss: float
    kl: float
    clip_frac: float
    tokens: float
    grad_norm: float
    skipped: bool
    nonfinite: dict | None
    applied: bool
    oom_retries: int
    caps: PassCaps
    memory_adjustments: list[dict] = field(default_factory=list)
    released: bool = False  # `Learner.release` freed memory after an out-of-memory pass of this step


@dataclass
class Learner:
    """The models and optimizer the update pass works on. `release`, when given, frees memory the
    update does not need (the trainer: the rollout engine's KV cache and graphs) and returns False when
    there was nothing to free; the first out-of-memory pass of a step calls it and, unless it returned
    False, retries with the same caps before any cap is lowered."""

    model: Any
    ref_model: Any
    optimizer: Any
    scheduler: Any
    params: list
    device: str
    pad_id: int
    autocast: Any
    release: Any = None


def _run_passes(learner: Learner, active: list, g, caps: PassCaps, total_tokens, n_seqs, acc):
    """Forward and backward every micro-batch of `active`, accumulating into `acc` (a `Passes`)."""
    import torch

    from sqlrl.training.grpo import policy_loss

    spans = [logit_span(x[0]) for x in active]
    lengths = [len(x[0].token_ids) for x in active]
    for mb_start, mb_end in micro_batches(spans, g.micro_batch, caps.logit_tokens, lengths, caps.tokens):
        mb = active[mb_start:mb_end]
        acc.oom_at = (len(mb), max(spans[mb_start:mb_end]), max(lengths[mb_start:mb_end]))
        batch = build_batch([x[0] for x in mb], [x[1] for x in mb], learner.device, learner.pad_id)
        keep = batch["keep"]
        logp = sequence_logprobs(learner.model, batch, g.temperature, learner.autocast)  # [b, keep-1]
        m = batch["loss_mask"][:, -keep + 1 :]
        old = batch["old_logprobs"][:, -keep + 1 :]
        ref = None
        if learner.ref_model is not None:
            with torch.no_grad():
                ref = sequence_logprobs(learner.ref_model, batch, g.temperature, learner.autocast)
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
            acc.nonfinite_logp += int((~torch.isfinite(logp) & (m != 0)).sum().item())
            acc.nonfinite_loss_mb += int(not bool(torch.isfinite(loss).item()))
        loss.backward()
        ntok = float(m.sum().item())
        acc.loss += float(loss.item())
        acc.kl += lm.get("kl", 0.0) * ntok
        acc.clip += lm.get("clip_frac", 0.0) * ntok
        acc.tokens += ntok
    acc.oom_at = None


def accumulate_gradients(learner: Learner, trajs: list, adv, g, step: int, caps: PassCaps):
    """Gradients of the step's loss over `trajs` (advantages `adv`), in passes; an out-of-memory pass
    makes it start again, first with the same caps after `learner.release()` (once, when given, unless
    it freed nothing), then with a halved cap. Returns (sums, retries, caps used, cap adjustments,
    whether the release freed memory)."""
    import torch

    learner.model.train()
    total_tokens = sum(tr.generated_tokens for tr in trajs)
    n_seqs = len(trajs)
    active = [
        (tr, float(a))
        for tr, a in zip(trajs, adv.tolist())
        if (a != 0.0 or g.kl_coef > 0) and tr.generated_tokens > 0
    ]
    active.sort(key=lambda x: len(x[0].token_ids))
    oom_retries = 0
    adjustments: list[dict] = []
    released = tried_release = False
    while True:  # once, unless a pass runs out of GPU memory (then again with smaller passes)
        learner.optimizer.zero_grad(set_to_none=True)
        acc = Passes()
        try:
            _run_passes(learner, active, g, caps, total_tokens, n_seqs, acc)
        except torch.OutOfMemoryError:
            pass  # handled below, outside the except block, so that its frames free their tensors
        if acc.oom_at is None:
            return acc, oom_retries, caps, adjustments, released
        learner.optimizer.zero_grad(set_to_none=True)
        free_memory()
        n_mb, width, length = acc.oom_at
        if learner.release is not None and not tried_release:
            tried_release = True
            if learner.release() is not False:  # False: nothing freed, the same passes would fail again
                released, oom_retries = True, oom_retries + 1
                log.warning(
                    f"sqlrl train: step {step}: out of GPU memory in a pass of {n_mb} trajectories x {length} "
                    "padded columns; dropped the rollout engine's cache, redoing the update with the same "
                    "passes (dropped before every later update of this run)"
                )
                continue
        if n_mb <= 1:  # one trajectory per pass already: nothing smaller to try
            raise RuntimeError(oom_message(step, n_mb, width, g, len(adjustments), length))
        # The passes only split the step's token sum (the objective is normalised over the whole
        # step), so a smaller cap changes memory, not what is computed (up to float summation
        # order). Halve the failing pass; the cap stays for the rest of the run.
        caps, change = caps.lowered(n_mb, width, length)
        oom_retries += 1
        adjustments.append({"step": step, **change})
        key, value = next(iter(change.items()))
        log.warning(
            f"sqlrl train: step {step}: out of GPU memory in a pass of {n_mb} trajectories x {width} "
            f"logit columns x {length} padded columns; redoing the update with {key} = {value} "
            "(memory only; kept for the rest of the run, recorded in steps.jsonl and run.json)"
        )


def step_schedule(scheduler, *, optimizer_stepped: bool) -> None:
    """Advance the learning-rate schedule by one step, also when the optimizer step was skipped on purpose
    (the No-update control, a non-finite gradient), so that step k has the same learning rate in every
    arm. PyTorch warns when a schedule advances before any `optimizer.step()` (its guess at a forgotten
    call); that one warning is silenced for a deliberate skip, and only for this call."""
    if optimizer_stepped:
        scheduler.step()
        return
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`"
        )
        scheduler.step()


def update_policy(learner: Learner, trajs: list, adv, g, step: int, caps: PassCaps) -> UpdateResult:
    """One step's update: gradients, clipping, the optimizer step (unless the gradient norm is not
    finite, or the run is the No-update control), the scheduler step."""
    import torch

    acc, oom_retries, caps, adjustments, released = accumulate_gradients(learner, trajs, adv, g, step, caps)
    params, optimizer = learner.params, learner.optimizer
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, g.max_grad_norm).item()) if params else 0.0
    skipped = not math.isfinite(grad_norm)
    nonfinite_diag = None
    if skipped:  # never apply a non-finite update; the step is recorded as skipped
        bad = [
            n
            for n, p in learner.model.named_parameters()
            if p.grad is not None and not bool(torch.isfinite(p.grad).all().item())
        ]
        nonfinite_diag = {
            "logprobs_at_loss_tokens": acc.nonfinite_logp,
            "micro_batches_with_nonfinite_loss": acc.nonfinite_loss_mb,
            "params_with_nonfinite_grad": len(bad),
            "first_params": bad[:8],
        }
        optimizer.zero_grad(set_to_none=True)
        log.warning(f"sqlrl train: step {step}: non-finite gradient norm; update skipped ({nonfinite_diag})")
    applied = not skipped and g.control != "no-update"
    if applied:  # the No-update control takes every step except the parameter write
        optimizer.step()
    step_schedule(learner.scheduler, optimizer_stepped=applied)
    optimizer.zero_grad(set_to_none=True)
    return UpdateResult(
        loss=acc.loss,
        kl=acc.kl / acc.tokens if acc.tokens else 0.0,
        clip_frac=acc.clip / acc.tokens if acc.tokens else 0.0,
        tokens=acc.tokens,
        grad_norm=grad_norm,
        skipped=skipped,
        nonfinite=nonfinite_diag,
        applied=bool(applied),
        oom_retries=oom_retries,
        caps=caps,
        memory_adjustments=adjustments,
        released=released,
    )
