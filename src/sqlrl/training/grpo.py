"""GRPO objective as pure functions (torch only, no I/O, no model, no optimizer).

Shao et al. 2024 ("DeepSeekMath", eq. 3, outcome supervision), returned as the loss (= -J):
    A_i = (r_i - mean(r)) / std(r) for the G outputs of a group (same advantage for every token)
    J = E[ 1/G sum_i 1/|o_i| sum_t ( min(rho_it A_i, clip(rho_it, 1-eps, 1+eps) A_i) - beta KL_k3,it ) ]
    rho_it = pi_theta / pi_old (of token o_it);  KL_k3 = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1

Deliberate departures (configurable where noted):
1. ``agg="token-mean"`` (default, DAPO): per-token terms summed over the batch's loss tokens / their
   count; the paper's ``1/G sum_i 1/|o_i| sum_t`` is ``agg="seq-mean"``.
2. Separate ``clip_low`` / ``clip_high`` (DAPO clip-higher); defaults 0.2 / 0.2 are the paper's clip.
3. KL (k3, per token inside the aggregation, not clamped) is optional: ``kl_coef`` defaults to 0.0
   (paper 0.04); with ``ref_logprobs`` and ``kl_coef == 0`` it is measured only (no gradient).
4. ``scale="std"`` divides by the *sample* std (ddof=1) + ``eps``, as TRL and verl do; ``scale="none"``
   is Dr. GRPO (Liu et al. 2025). A group whose rewards are all equal (a singleton too) gets exactly 0.
5. Old log-probs are those recorded at generation time (under logits / temperature), not recomputed:
   with one gradient step per batch the ratio is 1 in exact arithmetic (REINFORCE with the group-mean
   baseline): ``ratio_*``/``clip_frac`` measure kernel mismatch. Same temperature; no entropy bonus.

What is covered: masked positions (prompt, observations, padding) get exactly zero gradient, even with
NaN/inf log-probs; advantages, old and reference log-probs are constants (detached); with
``loss_scale_tokens`` / ``loss_scale_seqs`` set to the global count, summed micro-batch gradients equal
the one-big-batch gradient (up to rounding); metrics are plain floats. What is not: anything about the
model, sampling or optimizer; ``logprobs - old_logprobs`` is clamped to +-LOG_RATIO_CLAMP (10) before exp.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = ["group_advantages", "policy_loss", "token_logprobs", "entropy_from_logits"]


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    scale: Literal["std", "none"] = "std",
    eps: float = 1e-6,
) -> tuple[Tensor, dict]:
    """Group-relative advantages.

    ``rewards``: float [N], one scalar reward per trajectory. ``group_ids``: integer [N]; trajectories
    with the same id were sampled for the same prompt. Ids need not be contiguous or sorted.
    Excluded trajectories (``Reward.value is None``: unscorable gold, infra error) are simply not
    passed in; the group statistics are then over the remaining members.

    A_i = r_i - mean(group), divided by (sample std(group), ddof=1) + eps when ``scale="std"``.
    Groups whose rewards are all equal (and groups of size 1) get exactly 0.0.

    Returns ``(advantages [N] in the dtype of rewards (float32 if rewards are not floating), metrics)``.
    Metrics: ``groups``, ``zero_var_groups`` (includes singletons), ``singleton_groups``,
    ``adv_mean``, ``adv_std`` (population std over all N), ``adv_min``, ``adv_max``.
    The result is detached (advantages are constants in the objective).
    """
    if scale not in ("std", "none"):
        raise ValueError(f"scale must be 'std' or 'none', got {scale!r}")
    if rewards.ndim != 1 or group_ids.ndim != 1:
        raise ValueError(
            f"rewards and group_ids must be 1-D, got shapes {tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    if rewards.shape[0] != group_ids.shape[0]:
        raise ValueError(f"rewards has {rewards.shape[0]} entries but group_ids has {group_ids.shape[0]}")
    if group_ids.is_floating_point() or group_ids.is_complex():
        raise ValueError("group_ids must be an integer tensor")
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    r = rewards.detach().to(torch.float64)  # [N]
    if not bool(torch.isfinite(r).all()):
        raise ValueError("rewards must be finite (pass excluded trajectories by leaving them out)")
    n = r.shape[0]
    if n == 0:
        metrics = dict.fromkeys(
            ("groups", "zero_var_groups", "singleton_groups", "adv_mean", "adv_std", "adv_min", "adv_max"),
            0.0,
        )
        return torch.zeros(0, dtype=out_dtype, device=rewards.device), metrics

    _, inv = torch.unique(group_ids, return_inverse=True)  # inv: [N] in 0..G-1
    g = int(inv.max().item()) + 1
    zeros_g = torch.zeros(g, dtype=torch.float64, device=r.device)  # [G]
    counts = zeros_g.index_add(0, inv, torch.ones_like(r))  # [G]
    mean = zeros_g.index_add(0, inv, r) / counts  # [G]
    dev = r - mean[inv]  # [N]
    gmax = torch.full_like(zeros_g, -torch.inf).scatter_reduce(0, inv, r, "amax")  # [G]
    gmin = torch.full_like(zeros_g, torch.inf).scatter_reduce(0, inv, r, "amin")  # [G]
    zero_var = gmax == gmin  # [G] bool, true for singletons too
    if scale == "std":
        ss = zeros_g.index_add(0, inv, dev * dev)  # [G]
        std = torch.sqrt(ss / (counts - 1).clamp(min=1))  # [G] sample std (ddof=1)
        adv = dev / (std[inv] + eps)  # [N]
    else:
        adv = dev  # [N]
    adv = torch.where(zero_var[inv], torch.zeros_like(adv), adv)  # [N]

    metrics = {
        "groups": float(g),
        "zero_var_groups": float(zero_var.sum().item()),
        "singleton_groups": float((counts == 1).sum().item()),
        "adv_mean": float(adv.mean().item()),
        "adv_std": float(adv.std(correction=0).item()),
        "adv_min": float(adv.min().item()),
        "adv_max": float(adv.max().item()),
    }
    return adv.to(out_dtype), metrics


def _aggregate(
    per_token: Tensor,  # [B,T], already zero at masked positions
    m: Tensor,  # [B,T] bool
    agg: str,
    loss_scale_tokens: float | None,
    loss_scale_seqs: float | None,
) -> Tensor:
    if agg == "token-mean":
        ntok = int(m.sum().item())
        denom = float(loss_scale_tokens) if loss_scale_tokens is not None else float(max(ntok, 1))
        return per_token.sum() / denom
    tok_per_seq = m.sum(dim=1)  # [B]
    seq_loss = per_token.sum(dim=1) / tok_per_seq.clamp(min=1).to(per_token.dtype)  # [B]
    nseq = int((tok_per_seq > 0).sum().item())
    denom = float(loss_scale_seqs) if loss_scale_seqs is not None else float(max(nseq, 1))
    return seq_loss.sum() / denom


LOG_RATIO_CLAMP = 10.0


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    agg: Literal["token-mean", "seq-mean"] = "token-mean",
    entropy: Tensor | None = None,
    loss_scale_tokens: float | None = None,
    loss_scale_seqs: float | None = None,
) -> tuple[Tensor, dict]:
    """Clipped GRPO surrogate loss (to minimise) with optional k3 KL to a frozen reference.

    Shapes: ``logprobs``, ``old_logprobs``, ``mask``, ``ref_logprobs``, ``entropy``: [B, T];
    ``advantages``: [B]. ``mask`` is 0/1 (bool or numeric; nonzero = loss token, i.e. a token the
    policy generated). Only ``logprobs`` should carry gradient; everything else is detached.

    Per loss token: ``-min(r*A, clip(r, 1-clip_low, 1+clip_high)*A) + kl_coef * k3`` with
    ``r = exp(logprobs - old_logprobs)`` and ``k3 = exp(ref - logp) - (ref - logp) - 1``.

    Aggregation:
      * ``"token-mean"``: sum over all loss tokens / (``loss_scale_tokens`` if given else the number
        of loss tokens in this call). For gradient accumulation pass the number of loss tokens of the
        whole optimizer batch (all micro-batches) and sum the micro-batch gradients. If gradients are
        additionally *averaged* across W data-parallel ranks, pass global_tokens / W.
      * ``"seq-mean"``: per-sequence mean over its loss tokens, summed over sequences / (``loss_scale_seqs``
        if given else the number of sequences with at least one loss token). Sequences without loss
        tokens contribute 0 and are not counted; ``loss_scale_seqs`` must be the global count of
        sequences with at least one loss token.
    Passing the scale that does not belong to ``agg`` raises ValueError. With no loss tokens and no
    scale the loss is 0.0 (still attached to the graph).

    Metrics (floats): ``loss``; ``pg_loss`` (the surrogate part, same aggregation and scale as ``loss``);
    ``kl`` (masked token mean of k3 in this call, 0.0 without ref); ``clip_frac`` (fraction of loss
    tokens where the clipped branch is active, i.e. zero gradient: A>0 and r>1+clip_high, or A<0 and
    r<1-clip_low), ``clip_frac_low``, ``clip_frac_high``; ``ratio_mean``, ``ratio_max``, ``ratio_min``
    (over loss tokens); ``entropy`` (masked mean, only when ``entropy`` is given); ``tokens`` (loss tokens
    in this call); ``seqs`` (sequences with at least one loss token). Means over zero tokens are 0.0.
    """
    if logprobs.ndim != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {tuple(logprobs.shape)}")
    shape = logprobs.shape
    for name, t in (
        ("old_logprobs", old_logprobs),
        ("mask", mask),
        ("ref_logprobs", ref_logprobs),
        ("entropy", entropy),
    ):
        if t is not None and t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)} like logprobs")
    if advantages.shape != (shape[0],):
        raise ValueError(f"advantages must have shape ({shape[0]},), got {tuple(advantages.shape)}")
    if agg not in ("token-mean", "seq-mean"):
        raise ValueError(f"agg must be 'token-mean' or 'seq-mean', got {agg!r}")
    if agg == "token-mean" and loss_scale_seqs is not None:
        raise ValueError("loss_scale_seqs is only valid with agg='seq-mean'")
    if agg == "seq-mean" and loss_scale_tokens is not None:
        raise ValueError("loss_scale_tokens is only valid with agg='token-mean'")
    for name, v in (("loss_scale_tokens", loss_scale_tokens), ("loss_scale_seqs", loss_scale_seqs)):
        if v is not None and not v > 0:
            raise ValueError(f"{name} must be > 0, got {v}")
    if clip_low < 0 or clip_high < 0 or clip_low >= 1:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")

    m = mask != 0  # [B,T] bool
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    old = old_logprobs.detach().to(logprobs.dtype)  # [B,T]
    adv = advantages.detach().to(logprobs.dtype)[:, None]  # [B,1]

    # torch.where (not multiplication) so NaN/inf at masked positions cannot leak into loss or grad.
    # The log-ratio is clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] before exp: a token sampled at
    # generation time with a tiny bf16 probability (old log-prob ~ -30) would otherwise give an
    # overflowing ratio and a NaN gradient. Inside the clamp nothing changes.
    log_ratio = torch.where(m, (logprobs - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), zero)  # [B,T]
    ratio = torch.exp(log_ratio)  # [B,T]
    surr = ratio * adv  # [B,T]
    surr_clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv  # [B,T]
    pg = torch.where(m, -torch.minimum(surr, surr_clipped), zero)  # [B,T]

    per_token = pg  # [B,T]
    kl_tok = None
    if ref_logprobs is not None:
        d = torch.where(m, ref_logprobs.detach().to(logprobs.dtype) - logprobs, zero)  # [B,T]
        kl_tok = torch.where(m, torch.exp(d) - d - 1.0, zero)  # [B,T] k3 >= 0
        if kl_coef > 0:
            per_token = per_token + kl_coef * kl_tok  # [B,T]

    loss = _aggregate(per_token, m, agg, loss_scale_tokens, loss_scale_seqs)  # []

    with torch.no_grad():
        ntok = int(m.sum().item())
        nseq = int((m.sum(dim=1) > 0).sum().item())
        denom = max(ntok, 1)
        pg_loss = _aggregate(pg, m, agg, loss_scale_tokens, loss_scale_seqs)
        is_high = m & (ratio > 1.0 + clip_high) & (adv > 0)  # [B,T]
        is_low = m & (ratio < 1.0 - clip_low) & (adv < 0)  # [B,T]
        metrics = {
            "loss": float(loss.item()),
            "pg_loss": float(pg_loss.item()),
            "kl": float(kl_tok.sum().item() / denom) if kl_tok is not None else 0.0,
            "clip_frac": float((is_high | is_low).sum().item() / denom),
            "clip_frac_low": float(is_low.sum().item() / denom),
            "clip_frac_high": float(is_high.sum().item() / denom),
            "ratio_mean": float(ratio[m].sum().item() / denom) if ntok else 0.0,
            "ratio_max": float(ratio[m].max().item()) if ntok else 0.0,
            "ratio_min": float(ratio[m].min().item()) if ntok else 0.0,
            "tokens": float(ntok),
            "seqs": float(nseq),
        }
        if entropy is not None:
            ent = torch.where(m, entropy.detach().to(torch.float64), 0.0)  # [B,T]
            metrics["entropy"] = float(ent.sum().item() / denom)
    return loss, metrics


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(
            f"temperature must be > 0 (greedy decoding has no sampling distribution), got {temperature}"
        )


def token_logprobs(
    logits: Tensor, targets: Tensor, temperature: float = 1.0, *, chunk_size: int | None = None
) -> Tensor:
    """log softmax(logits / temperature)[targets], computed in float32, shape [B, T].

    ``logits``: [B, T, V] (any float dtype; position t must already be aligned to predict
    ``targets[:, t]``); ``targets``: integer [B, T]. Use the generation temperature so that the
    result matches ``Generation.logprobs``.

    Memory: computed as ``z[target] - logsumexp(z)`` without materialising a [B, T, V] log-softmax.
    With ``chunk_size`` (rows of the flattened B*T), the float32 upcast and the logsumexp
    temporaries are bounded to ``chunk_size * V`` floats at a time; under ``torch.no_grad()`` (old /
    reference log-probs) that bounds peak extra memory, e.g. 1024 rows x 151k vocab = 0.6 GB.
    With autograd enabled the float32 chunks are saved for backward, so the total saved is still
    ~B*T*V float32 (chunking then only trims the transient peak).
    """
    _check_temperature(temperature)
    if logits.ndim != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(
            f"need logits [B,T,V] and targets [B,T], got {tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    b, t, v = logits.shape
    flat = logits.reshape(b * t, v)  # [B*T,V]
    tgt = targets.reshape(b * t, 1).long()  # [B*T,1]
    step = b * t if chunk_size is None else max(1, int(chunk_size))
    outs = []
    for s in range(0, b * t, step):
        z = flat[s : s + step].float() / temperature  # [c,V]
        picked = z.gather(1, tgt[s : s + step]).squeeze(1)  # [c]
        outs.append(picked - torch.logsumexp(z, dim=1))  # [c]
    if not outs:
        return torch.zeros(b, t, dtype=torch.float32, device=logits.device)
    return torch.cat(outs).reshape(b, t)  # [B,T]


def entropy_from_logits(logits: Tensor, temperature: float = 1.0, *, chunk_size: int = 1024) -> Tensor:
    """Entropy (nats) of softmax(logits / temperature) per position, float32 [B, T], detached.

    Metric only: computed under ``torch.no_grad()``. H = logsumexp(z) - sum softmax(z) * z, processed
    ``chunk_size`` rows of the flattened B*T at a time, so peak extra memory is about
    3 * chunk_size * V float32 (~1.8 GB for 1024 rows x 151k vocab; lower ``chunk_size`` if needed),
    never a full [B, T, V] copy.
    """
    _check_temperature(temperature)
    if logits.ndim != 3:
        raise ValueError(f"need logits [B,T,V], got {tuple(logits.shape)}")
    b, t, v = logits.shape
    flat = logits.detach().reshape(b * t, v)  # [B*T,V]
    step = max(1, int(chunk_size))
    outs = []
    with torch.no_grad():
        for s in range(0, b * t, step):
            z = flat[s : s + step].float() / temperature  # [c,V]
            lse = torch.logsumexp(z, dim=1)  # [c]
            p = torch.softmax(z, dim=1)  # [c,V]
            outs.append(lse - (p * z).sum(dim=1))  # [c]
    if not outs:
        return torch.zeros(b, t, dtype=torch.float32, device=logits.device)
    return torch.cat(outs).reshape(b, t)  # [B,T]
