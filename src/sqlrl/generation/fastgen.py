"""Fast batched decoding for GRPO rollouts (the path ``HFPolicy`` uses on GPU).

Two functions with the same contract::

    generate_reference(model, prompts, *, max_new_tokens, temperature=0.0, top_p=1.0, seed=None,
                       eos_token_ids, pad_token_id, batch_size=64)
    generate_fast(model, prompts, *, max_new_tokens, temperature=0.0, top_p=1.0, seed=None,
                  eos_token_ids, pad_token_id, max_batch=256, prefill_tokens=32768, check_every=8,
                  refill=True, stats=None)
    -> list[(token_ids, logprobs, finish_reason)]     # one per prompt, in input order

``token_ids`` are the generated ids truncated after the first eos (the eos is included);
``logprobs[i]`` is ``log_softmax(logits / temperature)[token_ids[i]]`` in float32 for sampling and
``log_softmax(logits)[token_ids[i]]`` for greedy (temperature 0), i.e. the *untruncated* (no top-p
renormalisation) distribution, which is what the GRPO trainer uses as old log-probs.
``finish_reason`` is ``"stop"`` (an eos was produced) or ``"length"``.

``generate_reference`` is plain Hugging Face ``model.generate`` (left padding, ``output_logits``), kept as
the yardstick. ``generate_fast`` is an own decode loop over the model's ``forward`` with a ``DynamicCache``:

* identical prompts are prefilled once (GRPO groups: 64 prompts x 8 samples -> 64 prefills) and their
  KV rows are replicated; under greedy decoding the copies simply share one decoded sequence;
* prompts are sorted by length (longest first) and admitted in prefill chunks of at most
  ``prefill_tokens`` padded tokens; only the last position's logits are computed (``logits_to_keep=1``);
* finished rows are dropped from the batch every ``check_every`` steps (KV rows compacted with
  ``index_select``; leading all-padding KV columns trimmed) and, with ``refill=True``, freed slots are
  refilled with waiting prompts (their prefilled KV is left-padded to the running length and
  concatenated), so the batch stays near ``max_batch`` rows (continuous batching at chunk granularity);
* the host synchronises with the device only every ``check_every`` steps.

Guarantees and non-guarantees
-----------------------------
* Identity with ``generate_reference`` (greedy): the mathematics is the same (same mask/position
  handling, same argmax, first-index tie-break), but batch composition and padding differ, so floating
  point sums differ in the last bits. In float32 this essentially never flips an argmax (the CPU test
  suite checks exact identity on tiny models); in bfloat16 near-ties can flip and the sequences then
  diverge. Measure it with ``bench/bench_generate.py`` (reports the identity rate); use float32 where
  exact identity matters.
* Determinism of sampling: the uniform number used to draw token ``k`` of the sequence for input
  position ``i`` is a pure hash of ``(seed, i, k)`` (inverse-CDF sampling), computed on the device. It does
  not depend on batch size, scheduling, refill order or global RNG state; two calls with the same seed,
  prompts and logits give identical samples. Logits themselves are only reproducible for an identical
  batch schedule on the same hardware/library versions (bf16 GEMMs are not batch-invariant), so
  bitwise reproducibility across ``max_batch`` values holds only as far as the logits do. Permuting
  the input list changes which random stream a prompt gets. ``seed=None`` draws a seed from torch's global RNG
  (so ``torch.manual_seed`` makes it reproducible). ``generate_reference`` uses torch's global RNG via
  HF and is *not* stream-compatible with ``generate_fast``.
* top-p: tokens are kept in descending probability while the probability mass *before* them is
  < top_p (at least one token is kept), the kept mass is renormalised for sampling only; the returned
  log-prob is still under the full softmax(logits / temperature). HF's TopP warper differs only at exact
  boundary ties.
* Memory: KV cache of at most ``max_batch`` rows x (longest admitted prompt + ``max_new_tokens``) columns
  plus, during a refill, one prefill chunk (``prefill_tokens`` padded tokens of activations) and a
  transient copy of the KV cache (concatenation). For Qwen2.5-0.5B (24 layers, 2 KV heads, head dim 64,
  bf16) one cached token costs 12 KiB: 256 rows x 1800 columns ~ 5.3 GiB. ``DynamicCache`` grows by
  concatenation, so each decode step copies the cache once (memory traffic, not capacity, x2 transiently).
* Requirements: a decoder-only HF model whose ``DynamicCache`` layers expose ``keys``/``values`` tensors of shape
  ``[batch, heads, seq, dim]`` (transformers 5.x ``DynamicLayer``; checked at run time). Sliding-window
  layers are not supported by the fast path (a ``RuntimeError`` is raised). Works with the ``cache=`` keyword
  (transformers >= 5.2x) and the older ``past_key_values=`` keyword (detected from the signature).
* Not implemented: CUDA graphs / torch.compile of the decode step (no static cache); sampling filters other
  than temperature/top-p (no top-k, repetition penalty, min-p).

Statistics of the last call are in ``fastgen.last_stats`` (a ``GenStats``); pass ``stats=GenStats()`` to
receive them in an object of your own.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import asdict, dataclass, field

__all__ = ["GenStats", "generate_fast", "generate_reference", "last_stats"]

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


last_stats: GenStats | None = None


# ----------------------------------------------------------------------------------------------- helpers
def _device_of(model):
    return next(model.parameters()).device


def _cache_kwarg(model) -> str:
    """transformers renamed ``past_key_values`` to ``cache`` in the forward signatures (5.2x)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def _reset_peak(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gb(device) -> float:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return 0.0


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _left_pad(prompts: list[list[int]], pad_token_id: int, device):
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for r, p in enumerate(prompts):
        if p:
            ids[r, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[r, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


def _truncate(tokens: list[int], logprobs: list[float], eos: set[int], max_new_tokens: int):
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1], logprobs[: i + 1], "stop"
    return tokens[:max_new_tokens], logprobs[:max_new_tokens], "length"


def _check_args(prompts, max_new_tokens, temperature, top_p, eos_token_ids):
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


# ------------------------------------------------------------------------------ shared by the engines
class _Run:
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
        res = _truncate(tokens[:ngen], logprobs[:ngen], self.eos, max_new)
        if self.greedy:
            for out_i in self.jobs[job][2]:
                self.results[out_i] = (list(res[0]), list(res[1]), res[2])
        else:
            self.results[seq_id] = res

    def finish(self, t0: float, name: str, extra: dict) -> list[tuple[list[int], list[float], str]]:
        """Close the statistics and return the results; each engine publishes `self.st` as its own
        module's `last_stats`."""
        _sync(self.device)
        st = self.st
        st.wall_s = time.perf_counter() - t0
        assert all(r is not None for r in self.results), f"{name}: internal error, missing results"
        st.tokens_generated = sum(len(r[0]) for r in self.results)  # type: ignore[index]
        st.tokens_per_s = st.tokens_generated / st.wall_s if st.wall_s > 0 else 0.0
        st.peak_memory_gb = _peak_gb(self.device)
        st.extra = {"seed": self.seed, **extra}
        return self.results  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------- reference
def generate_reference(
    model,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    eos_token_ids: list[int],
    pad_token_id: int,
    batch_size: int = 64,
    stats: GenStats | None = None,
) -> list[tuple[list[int], list[float], str]]:
    """Plain HF ``model.generate`` in input-order batches of ``batch_size`` with left padding."""
    import torch

    global last_stats
    _check_args(prompts, max_new_tokens, temperature, top_p, eos_token_ids)
    device = _device_of(model)
    st = stats if stats is not None else GenStats()
    st.method = "reference"
    st.n_prompts = len(prompts)
    st.n_unique_prompts = len({tuple(p) for p in prompts})
    st.prompt_tokens = sum(len(p) for p in prompts)
    eos = set(int(e) for e in eos_token_ids)
    greedy = temperature == 0.0
    if seed is not None:
        torch.manual_seed(seed)
    gen_kwargs = dict(
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        do_sample=not greedy,
        num_beams=1,
        eos_token_id=list(eos_token_ids),
        pad_token_id=pad_token_id,
        return_dict_in_generate=True,
        output_logits=True,
        use_cache=True,
        # neutralise whatever the checkpoint's generation_config sets
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
    )
    if not greedy:
        gen_kwargs.update(temperature=temperature, top_p=top_p, top_k=0, typical_p=1.0, min_p=None)
    _reset_peak(device)
    _sync(device)
    t0 = time.perf_counter()
    results: list[tuple[list[int], list[float], str]] = []
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for start in range(0, len(prompts), batch_size):
                chunk = prompts[start : start + batch_size]
                ids, mask = _left_pad(chunk, pad_token_id, device)
                out = model.generate(input_ids=ids, attention_mask=mask, **gen_kwargs)
                st.batches += 1
                gen = out.sequences[:, ids.shape[1] :]
                steps = gen.shape[1]
                lps = torch.empty(gen.shape, dtype=torch.float32, device=gen.device)
                for k in range(steps):
                    logits = out.logits[k].float()
                    if not greedy:
                        logits = logits / temperature
                    lps[:, k] = torch.log_softmax(logits, dim=-1).gather(1, gen[:, k : k + 1]).squeeze(1)
                gen_l, lps_l = gen.tolist(), lps.tolist()
                for r in range(len(chunk)):
                    results.append(_truncate(gen_l[r], lps_l[r], eos, max_new_tokens))
                st.decode_steps += steps
    finally:
        model.train(was_training)
    _sync(device)
    st.wall_s = time.perf_counter() - t0
    st.tokens_generated = sum(len(r[0]) for r in results)
    st.tokens_per_s = st.tokens_generated / st.wall_s if st.wall_s > 0 else 0.0
    st.peak_memory_gb = _peak_gb(device)
    last_stats = st
    return results


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


def _uniform(seed: int, seq_ids, steps):
    """u in [0, 1) (float64) as a pure function of (seed, sequence id, step)."""
    s_lo, s_hi = seed & _M32, (seed >> 32) & _M32
    base = _mix32(_mix32(seq_ids * 0 + s_lo) ^ _mix32(seq_ids * 0 + (s_hi + 0x3C6EF372)))
    h = _mix32(base ^ _mix32(seq_ids + 0x61C88647))
    h = _mix32(h ^ _mix32(steps + 0x2545F491))
    h2 = _mix32(h ^ 0x68E31DA4)
    # 53 random bits -> exact double in [0, 1)
    return ((h << 21) | (h2 >> 11)).double() / float(2**53)


def _choose(logits, temperature: float, top_p: float, seed: int, seq_ids, steps):
    """Pick one token per row; return (tokens int64 [B], logprobs float32 [B])."""
    import torch

    logits = logits.float()
    if temperature == 0.0:
        tok = logits.argmax(dim=-1)
        lp = torch.log_softmax(logits, dim=-1).gather(1, tok[:, None]).squeeze(1)
        return tok, lp
    logp = torch.log_softmax(logits / temperature, dim=-1)
    u = _uniform(seed, seq_ids, steps)
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


# ------------------------------------------------------------------------------------------- KV cache
def _kv_layers(cache) -> list:
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise RuntimeError("fastgen needs a transformers 5.x DynamicCache (cache.layers[i].keys/values)")
    for layer in layers:
        if getattr(layer, "is_sliding", False) or not hasattr(layer, "keys") or not hasattr(layer, "values"):
            raise RuntimeError(f"fastgen: unsupported cache layer {type(layer).__name__}")
    return layers


_GROW = 64  # spare KV columns allocated at a time by the in-place decode update


def _grow_update(layer, key_states, value_states, *args, **kwargs):
    """``DynamicLayer.update`` that appends in place into a buffer with spare columns.

    The stock update concatenates (a full copy of the layer's cache every step). Here ``layer.keys`` /
    ``layer.values`` stay views of a larger buffer; whenever they are replaced by someone else (prefill,
    compaction, trim, merge) the views no longer match the buffer and a new buffer is allocated.
    """
    import torch

    if not getattr(layer, "is_initialized", False) or layer.keys.numel() == 0:
        layer.lazy_initialization(key_states, value_states)
        layer.keys, layer.values = key_states, value_states
        layer._fg_buf = None
        return layer.keys, layer.values
    b, h, t, d = layer.keys.shape
    q = key_states.shape[-2]
    buf = getattr(layer, "_fg_buf", None)
    ok = (
        buf is not None
        and buf[0].shape[0] == b
        and buf[0].shape[1] == h
        and buf[0].shape[2] >= t + q
        and layer.keys.data_ptr() == buf[0].data_ptr()
        and layer.values.data_ptr() == buf[1].data_ptr()
        and layer.keys.stride() == buf[0].stride()
    )
    if not ok:
        cap = t + q + _GROW
        kb = torch.empty((b, h, cap, d), dtype=layer.keys.dtype, device=layer.keys.device)
        vb = torch.empty(
            (b, h, cap, layer.values.shape[-1]), dtype=layer.values.dtype, device=layer.values.device
        )
        kb[:, :, :t] = layer.keys
        vb[:, :, :t] = layer.values
        buf = layer._fg_buf = (kb, vb)
    buf[0][:, :, t : t + q] = key_states
    buf[1][:, :, t : t + q] = value_states
    layer.keys = buf[0][:, :, : t + q]
    layer.values = buf[1][:, :, : t + q]
    return layer.keys, layer.values


def _install_grow_update(cache) -> None:
    import types

    for layer in _kv_layers(cache):
        layer.update = types.MethodType(_grow_update, layer)


def _kv_select(cache, idx) -> None:
    for layer in _kv_layers(cache):
        layer.keys = layer.keys.index_select(0, idx)
        layer.values = layer.values.index_select(0, idx)


def _kv_trim(cache, start: int) -> None:
    for layer in _kv_layers(cache):
        layer.keys = layer.keys[:, :, start:]
        layer.values = layer.values[:, :, start:]


def _left_pad_cols(x, n: int, dim: int):
    import torch

    if n == 0:
        return x
    shape = list(x.shape)
    shape[dim] = n
    return torch.cat([torch.zeros(shape, dtype=x.dtype, device=x.device), x], dim=dim)


def _kv_merge(dst, src) -> None:
    """Append the rows of cache ``src`` to ``dst`` (in place on dst), left-padding to a common length."""
    import torch

    for a, b in zip(_kv_layers(dst), _kv_layers(src), strict=True):
        ta, tb = a.keys.shape[2], b.keys.shape[2]
        t = max(ta, tb)
        a.keys = torch.cat([_left_pad_cols(a.keys, t - ta, 2), _left_pad_cols(b.keys, t - tb, 2)], dim=0)
        a.values = torch.cat(
            [_left_pad_cols(a.values, t - ta, 2), _left_pad_cols(b.values, t - tb, 2)], dim=0
        )


# ------------------------------------------------------------------------------------------- fast path
class _Rows:
    """Per-row device state of the running batch."""

    def __init__(self, cache, mask, pos, tok, ngen, finished, gen_tok, gen_lp, seq_ids, owner):
        self.cache = cache
        self.mask = mask  # [B, T] long, 1 = real token
        self.pos = pos  # [B] next position id
        self.tok = tok  # [B] last sampled token (input of the next step)
        self.ngen = ngen  # [B] tokens generated so far
        self.finished = finished  # [B] bool
        self.gen_tok = gen_tok  # [B, max_new + 1] (last column = sink for finished rows)
        self.gen_lp = gen_lp  # [B, max_new + 1] float32
        self.seq_ids = seq_ids  # [B] int64 stream id (input index)
        self.owner = owner  # host list: job index per row

    @property
    def size(self) -> int:
        return len(self.owner)

    def select(self, idx, keep: list[int]) -> None:
        _kv_select(self.cache, idx)
        for name in ("mask", "pos", "tok", "ngen", "finished", "gen_tok", "gen_lp", "seq_ids"):
            setattr(self, name, getattr(self, name).index_select(0, idx))
        self.owner = [self.owner[i] for i in keep]

    def merge(self, other: _Rows) -> None:
        import torch

        _kv_merge(self.cache, other.cache)
        ta, tb = self.mask.shape[1], other.mask.shape[1]
        t = max(ta, tb)
        self.mask = torch.cat([_left_pad_cols(self.mask, t - ta, 1), _left_pad_cols(other.mask, t - tb, 1)])
        for name in ("pos", "tok", "ngen", "finished", "gen_tok", "gen_lp", "seq_ids"):
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        self.owner = self.owner + other.owner


def generate_fast(
    model,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    eos_token_ids: list[int],
    pad_token_id: int,
    max_batch: int = 256,
    prefill_tokens: int = 32768,
    check_every: int = 8,
    refill: bool = True,
    stats: GenStats | None = None,
) -> list[tuple[list[int], list[float], str]]:
    """Fast batched generation; same contract as :func:`generate_reference` (see the module docstring)."""
    import torch
    from transformers import DynamicCache

    global last_stats
    _check_args(prompts, max_new_tokens, temperature, top_p, eos_token_ids)
    if max_batch < 1 or check_every < 1:
        raise ValueError("max_batch and check_every must be >= 1")
    device = _device_of(model)
    run = _Run(
        "fast",
        prompts,
        temperature=temperature,
        seed=seed,
        eos_token_ids=eos_token_ids,
        max_batch=max_batch,
        device=device,
        stats=stats,
    )
    seed, eos_t, st, jobs = run.seed, run.eos_t, run.st, run.jobs
    cache_kw = _cache_kwarg(model)
    waiting = list(run.order)
    wpos = 0

    def prefill(job_ids: list[int]) -> _Rows:
        plist = [jobs[j][0] for j in job_ids]
        ids, mask = _left_pad(plist, pad_token_id, device)
        pos = (mask.cumsum(-1) - 1).clamp_(min=0)
        cache = DynamicCache()
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            logits_to_keep=1,
            **{cache_kw: cache},
        )
        _install_grow_update(cache)
        logits = out.logits[:, -1, :]
        reps = [len(jobs[j][1]) for j in job_ids]
        owner = [j for j, r in zip(job_ids, reps) for _ in range(r)]
        seq_ids = torch.tensor([s for j in job_ids for s in jobs[j][1]], dtype=torch.long, device=device)
        if any(r > 1 for r in reps):
            rep_idx = torch.tensor(
                [k for k, r in enumerate(reps) for _ in range(r)], dtype=torch.long, device=device
            )
            _kv_select(cache, rep_idx)
            mask, logits = mask.index_select(0, rep_idx), logits.index_select(0, rep_idx)
        b = len(owner)
        lengths = mask.sum(-1)
        ngen = torch.zeros(b, dtype=torch.long, device=device)
        tok, lp = _choose(logits, temperature, top_p, seed, seq_ids, ngen)
        gen_tok = torch.full((b, max_new_tokens + 1), pad_token_id, dtype=torch.long, device=device)
        gen_lp = torch.zeros((b, max_new_tokens + 1), dtype=torch.float32, device=device)
        gen_tok[:, 0] = tok
        gen_lp[:, 0] = lp
        ngen += 1
        finished = torch.isin(tok, eos_t) | (ngen >= max_new_tokens)
        st.batches += 1
        return _Rows(cache, mask, lengths, tok, ngen, finished, gen_tok, gen_lp, seq_ids, owner)

    def admit(rows: _Rows | None) -> _Rows | None:
        nonlocal wpos
        free = max_batch - (rows.size if rows is not None else 0)
        t_prefill = time.perf_counter()
        while wpos < len(waiting) and free >= len(jobs[waiting[wpos]][1]):
            chunk: list[int] = []
            width = len(jobs[waiting[wpos]][0])  # longest first -> first job is the widest
            while wpos < len(waiting):
                j = waiting[wpos]
                need = len(jobs[j][1])
                if need > free or (chunk and (len(chunk) + 1) * width > prefill_tokens):
                    break
                chunk.append(j)
                free -= need
                wpos += 1
            new = prefill(chunk)
            if rows is None:
                rows = new
            else:
                rows.merge(new)
                st.refills += 1
        st.prefill_s += time.perf_counter() - t_prefill
        return rows

    def harvest(rows: _Rows, done: list[int]) -> None:
        idx = torch.tensor(done, dtype=torch.long, device=device)
        toks = rows.gen_tok.index_select(0, idx).tolist()
        lps = rows.gen_lp.index_select(0, idx).tolist()
        ngens = rows.ngen.index_select(0, idx).tolist()
        sids = rows.seq_ids.index_select(0, idx).tolist()
        for r, row in enumerate(done):
            run.store(rows.owner[row], int(sids[r]), toks[r], lps[r], ngens[r], max_new_tokens)

    _reset_peak(device)
    _sync(device)
    t0 = time.perf_counter()
    was_training = model.training
    model.eval()
    rows: _Rows | None = None
    try:
        with torch.inference_mode():
            while True:
                if rows is None or (refill and rows.size <= max_batch - max(1, max_batch // 4)):
                    if wpos < len(waiting):
                        rows = admit(rows)
                if rows is None:
                    break
                # ---- sync point: harvest finished rows, compact the batch, trim all-padding KV columns
                fin_l = rows.finished.tolist()
                done = [r for r, f in enumerate(fin_l) if f]
                active = rows.size - len(done)
                want_refill = refill and wpos < len(waiting) and active <= max_batch - max(1, max_batch // 4)
                # compaction copies the KV cache once: do it when >= 1/16 of the rows are dead (or to refill)
                if done and (16 * len(done) >= rows.size or not active or want_refill):
                    harvest(rows, done)
                    keep = [r for r, f in enumerate(fin_l) if not f]
                    if not keep:
                        rows = None
                        continue
                    rows.select(torch.tensor(keep, dtype=torch.long, device=device), keep)
                    st.compactions += 1
                    start = int(rows.mask.any(0).long().argmax().item())
                    if start > 0:
                        _kv_trim(rows.cache, start)
                        rows.mask = rows.mask[:, start:]
                    if refill and wpos < len(waiting) and rows.size <= max_batch - max(1, max_batch // 4):
                        continue  # refill before decoding further
                st.max_active = max(st.max_active, rows.size)
                # ---- check_every decode steps without a host sync
                ones = torch.ones((rows.size, 1), dtype=rows.mask.dtype, device=device)
                for _ in range(check_every):
                    rows.mask = torch.cat([rows.mask, ones], dim=1)
                    out = model(
                        input_ids=rows.tok[:, None],
                        attention_mask=rows.mask,
                        position_ids=rows.pos[:, None],
                        use_cache=True,
                        logits_to_keep=1,
                        **{cache_kw: rows.cache},
                    )
                    st.decode_steps += 1
                    st.row_steps += rows.size
                    rows.pos += 1
                    tok, lp = _choose(out.logits[:, -1, :], temperature, top_p, seed, rows.seq_ids, rows.ngen)
                    fin = rows.finished
                    tok = torch.where(fin, torch.full_like(tok, pad_token_id), tok)
                    col = torch.where(fin, torch.full_like(rows.ngen, max_new_tokens), rows.ngen)[:, None]
                    rows.gen_tok.scatter_(1, col, tok[:, None])
                    rows.gen_lp.scatter_(1, col, lp[:, None])
                    rows.ngen += (~fin).long()
                    rows.finished = fin | torch.isin(tok, eos_t) | (rows.ngen >= max_new_tokens)
                    rows.tok = tok
    finally:
        model.train(was_training)
    out = run.finish(t0, "fastgen", {"max_batch": max_batch, "check_every": check_every, "refill": refill})
    last_stats = run.st
    return out
