"""What the decode engines (``fastgen``, ``staticgen``) share: arguments, jobs, sampling, statistics.

Every engine returns ``list[(token_ids, logprobs, finish_reason)]``, one per prompt, in input order:
``token_ids`` truncated after the first eos (included), ``finish_reason`` ``"stop"`` or ``"length"``.

What is covered:
- ``choose``: greedy is argmax (first index on ties); sampling is inverse-CDF with a uniform that is a
  pure hash of ``(seed, input index, step)`` computed on the device, so it does not depend on batch
  size, scheduling, refill order or torch's global RNG. ``seed=None`` draws one from torch's RNG.
- The returned log-prob is ``log_softmax(logits / temperature)`` (raw logits when greedy), never
  renormalised by top-p; top-p keeps tokens while the mass *before* them is < top_p (at least one).
- ``DecodeRun``: identical prompts share one prefill; under greedy decoding their copies share one
  decoded row; sampled copies get one row each, split into jobs of at most ``max_batch`` rows; jobs
  run longest first.

What is not:
- Equal samples across engines need equal logits, and logits are only reproducible for an identical
  batch schedule on the same hardware and library versions (bf16 GEMMs are not batch-invariant).
- Permuting the input list changes which random stream a prompt gets.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import asdict, dataclass, field

__all__ = [
    "DecodeRun",
    "GenStats",
    "cache_kwarg",
    "check_args",
    "choose",
    "device_of",
    "kv_layers",
    "left_pad",
    "peak_gb",
    "reset_peak",
    "sync",
    "truncate",
    "uniform",
]

_M32 = 0xFFFFFFFF


@dataclass
class GenStats:
    """Counters of one generation call (``tokens_generated`` counts up to and including eos)."""

    method: str = ""
    n_prompts: int = 0
    n_unique_prompts: int = 0
    prompt_tokens: int = 0
    tokens_generated: int = 0
    wall_s: float = 0.0
    tokens_per_s: float = 0.0
    prefill_s: float = 0.0
    batches: int = 0  # prefill chunks (fast) or generate() calls (reference)
    decode_steps: int = 0
    row_steps: int = 0  # sum over decode steps of the batch size (incl. finished rows not yet dropped)
    compactions: int = 0
    refills: int = 0
    max_active: int = 0
    peak_memory_gb: float = 0.0
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------------------------- helpers
def device_of(model):
    """The device of the model's first parameter."""
    return next(model.parameters()).device


def cache_kwarg(model) -> str:
    """transformers renamed ``past_key_values`` to ``cache`` in the forward signatures (5.2x)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def reset_peak(device) -> None:
    """Reset the CUDA peak-memory counter (no-op elsewhere)."""
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gb(device) -> float:
    """Peak CUDA memory allocated since the last reset, in GiB (0.0 elsewhere)."""
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return 0.0


def sync(device) -> None:
    """Wait for the CUDA device (no-op elsewhere)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def left_pad(prompts: list[list[int]], pad_token_id: int, device):
    """``(input_ids, attention_mask)`` of the prompts, left-padded to the longest, on ``device``."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for r, p in enumerate(prompts):
        if p:
            ids[r, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[r, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


def truncate(tokens: list[int], logprobs: list[float], eos: set[int], max_new_tokens: int):
    """``(tokens, logprobs, finish_reason)`` cut after the first eos (``"stop"``) or at the limit."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1], logprobs[: i + 1], "stop"
    return tokens[:max_new_tokens], logprobs[:max_new_tokens], "length"


def check_args(prompts, max_new_tokens, temperature, top_p, eos_token_ids):
    """Raise ValueError on arguments no engine accepts."""
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    if temperature < 0:
        raise ValueError("temperature must be >= 0")
    if not 0.0 < top_p <= 1.0:
        raise ValueError("top_p must be in (0, 1]")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("empty prompt")
    if not eos_token_ids:
        raise ValueError("eos_token_ids must not be empty")


def kv_layers(cache) -> list:
    """The layers of a transformers 5.x ``DynamicCache``; RuntimeError for unsupported layers."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise RuntimeError("fastgen needs a transformers 5.x DynamicCache (cache.layers[i].keys/values)")
    for layer in layers:
        if getattr(layer, "is_sliding", False) or not hasattr(layer, "keys") or not hasattr(layer, "values"):
            raise RuntimeError(f"fastgen: unsupported cache layer {type(layer).__name__}")
    return layers


# ------------------------------------------------------------------------------ shared by the engines
class DecodeRun:
    """Per-call state shared by ``generate_fast`` and ``staticgen.generate_static``: resolved seed, eos
    sets, statistics, the jobs (one per unique prompt; greedy copies share one row, sampled copies get
    one row each, split to <= ``max_batch`` rows) in longest-first order, and the results list."""

    def __init__(self, method, prompts, *, temperature, seed, eos_token_ids, max_batch, device, stats):
        import torch

        self.greedy = temperature == 0.0
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())
        self.seed = int(seed) & ((1 << 64) - 1)
        self.eos = set(int(e) for e in eos_token_ids)
        self.eos_t = torch.tensor(sorted(self.eos), dtype=torch.long, device=device)
        self.device = device
        st = stats if stats is not None else GenStats()
        st.method = method
        st.n_prompts = len(prompts)
        st.prompt_tokens = sum(len(p) for p in prompts)
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, p in enumerate(prompts):
            groups.setdefault(tuple(int(t) for t in p), []).append(i)
        st.n_unique_prompts = len(groups)
        # (prompt, stream ids of its rows, output indices)
        self.jobs: list[tuple[list[int], list[int], list[int]]] = []
        for key, idxs in groups.items():
            if self.greedy:
                self.jobs.append((list(key), [idxs[0]], idxs))  # one row, fanned out to all copies
            else:
                for s in range(0, len(idxs), max_batch):
                    part = idxs[s : s + max_batch]
                    self.jobs.append((list(key), part, part))
        self.order = sorted(range(len(self.jobs)), key=lambda j: (-len(self.jobs[j][0]), j))  # longest first
        self.results: list[tuple[list[int], list[float], str] | None] = [None] * len(prompts)
        self.st = st

    def store(self, job: int, seq_id: int, tokens: list[int], logprobs: list[float], ngen: int, max_new: int):
        """Record one finished row (truncated after the first eos) for its output position(s)."""
        res = truncate(tokens[:ngen], logprobs[:ngen], self.eos, max_new)
        if self.greedy:
            for out_i in self.jobs[job][2]:
                self.results[out_i] = (list(res[0]), list(res[1]), res[2])
        else:
            self.results[seq_id] = res

    def finish(self, t0: float, name: str, extra: dict) -> list[tuple[list[int], list[float], str]]:
        """Close the statistics and return the results; each engine publishes `self.st` as its own
        module's `last_stats`."""
        sync(self.device)
        st = self.st
        st.wall_s = time.perf_counter() - t0
        assert all(r is not None for r in self.results), f"{name}: internal error, missing results"
        st.tokens_generated = sum(len(r[0]) for r in self.results)  # type: ignore[index]
        st.tokens_per_s = st.tokens_generated / st.wall_s if st.wall_s > 0 else 0.0
        st.peak_memory_gb = peak_gb(self.device)
        st.extra = {"seed": self.seed, **extra}
        return self.results  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------- sampling
def _mix32(h):
    """A 32-bit integer hash on int64 tensors; every product stays below 2**63 (no overflow)."""
    h = h & _M32
    h = h ^ (h >> 16)
    h = (h * 0x7FEB352D) & _M32
    h = h ^ (h >> 15)
    h = (h * 0x5BD1E995) & _M32
    h = h ^ (h >> 16)
    return h


def uniform(seed: int, seq_ids, steps):
    """u in [0, 1) (float64) as a pure function of (seed, sequence id, step)."""
    s_lo, s_hi = seed & _M32, (seed >> 32) & _M32
    base = _mix32(_mix32(seq_ids * 0 + s_lo) ^ _mix32(seq_ids * 0 + (s_hi + 0x3C6EF372)))
    h = _mix32(base ^ _mix32(seq_ids + 0x61C88647))
    h = _mix32(h ^ _mix32(steps + 0x2545F491))
    h2 = _mix32(h ^ 0x68E31DA4)
    # 53 random bits -> exact double in [0, 1)
    return ((h << 21) | (h2 >> 11)).double() / float(2**53)


def choose(logits, temperature: float, top_p: float, seed: int, seq_ids, steps):
    """Pick one token per row; return (tokens int64 [B], logprobs float32 [B])."""
    import torch

    logits = logits.float()
    if temperature == 0.0:
        tok = logits.argmax(dim=-1)
        lp = torch.log_softmax(logits, dim=-1).gather(1, tok[:, None]).squeeze(1)
        return tok, lp
    logp = torch.log_softmax(logits / temperature, dim=-1)
    u = uniform(seed, seq_ids, steps)
    if top_p < 1.0:
        sp, si = torch.sort(logp.exp(), dim=-1, descending=True)
        before = sp.cumsum(dim=-1) - sp
        sp = torch.where(before < top_p, sp, torch.zeros_like(sp))
        cdf = sp.double().cumsum(dim=-1)
        pick = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(1)
        pick = pick.clamp_(max=cdf.shape[1] - 1)
        tok = si.gather(1, pick[:, None]).squeeze(1)
    else:
        cdf = logp.exp().double().cumsum(dim=-1)
        tok = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(1)
        tok = tok.clamp_(max=cdf.shape[1] - 1)
    lp = logp.gather(1, tok[:, None]).squeeze(1)
    return tok, lp
