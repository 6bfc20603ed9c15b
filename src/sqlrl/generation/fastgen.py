"""Fast batched decoding for GRPO rollouts: an own decode loop over the model's ``forward``.

``generate_reference`` is plain Hugging Face ``model.generate`` (left padding, ``output_logits``), kept as
the yardstick. ``generate_fast`` has the same contract (see ``sqlrl.generation.decoding``) and runs its
own loop with a ``DynamicCache``: identical prompts are prefilled once and their KV rows replicated;
prompts are admitted longest first in prefill chunks of at most ``prefill_tokens`` padded tokens
(``logits_to_keep=1``); every ``check_every`` steps finished rows are dropped (KV rows compacted,
all-padding KV columns trimmed) and, with ``refill=True``, freed slots are refilled with waiting
prompts (continuous batching at chunk granularity). The host synchronises only at those points.

What is covered:
- Greedy identity with ``generate_reference`` in float32 on the CPU test models (same mask and
  position handling, same argmax); sampling draws as defined in ``decoding`` (stream-compatible with
  ``staticgen``, not with ``generate_reference``, which uses torch's global RNG through HF).
- Statistics of the last call in ``last_stats`` (a ``GenStats``), or in the ``stats=`` object passed.

What is not:
- Bitwise identity in bfloat16: batch composition and padding change the last bits of the sums, so
  near-ties can flip (``bench/bench_generate.py`` measures the identity rate).
- Sliding-window layers (``RuntimeError``), CUDA graphs or torch.compile, sampling filters other than
  temperature / top-p. Needs a transformers 5.x ``DynamicCache`` (``keys``/``values`` per layer).
"""

from __future__ import annotations

import time

from sqlrl.generation.decoding import (
    DecodeRun,
    GenStats,
    cache_kwarg,
    check_args,
    choose,
    device_of,
    kv_layers,
    left_pad,
    peak_gb,
    reset_peak,
    sync,
    truncate,
)

__all__ = ["GenStats", "generate_fast", "generate_reference", "last_stats"]

last_stats: GenStats | None = None


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
    check_args(prompts, max_new_tokens, temperature, top_p, eos_token_ids)
    device = device_of(model)
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
    reset_peak(device)
    sync(device)
    t0 = time.perf_counter()
    results: list[tuple[list[int], list[float], str]] = []
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for start in range(0, len(prompts), batch_size):
                chunk = prompts[start : start + batch_size]
                ids, mask = left_pad(chunk, pad_token_id, device)
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
                    results.append(truncate(gen_l[r], lps_l[r], eos, max_new_tokens))
                st.decode_steps += steps
    finally:
        model.train(was_training)
    sync(device)
    st.wall_s = time.perf_counter() - t0
    st.tokens_generated = sum(len(r[0]) for r in results)
    st.tokens_per_s = st.tokens_generated / st.wall_s if st.wall_s > 0 else 0.0
    st.peak_memory_gb = peak_gb(device)
    last_stats = st
    return results


# ------------------------------------------------------------------------------------------- KV cache
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

    for layer in kv_layers(cache):
        layer.update = types.MethodType(_grow_update, layer)


def _kv_select(cache, idx) -> None:
    for layer in kv_layers(cache):
        layer.keys = layer.keys.index_select(0, idx)
        layer.values = layer.values.index_select(0, idx)


def _kv_trim(cache, start: int) -> None:
    for layer in kv_layers(cache):
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

    for a, b in zip(kv_layers(dst), kv_layers(src), strict=True):
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


class _FastDecoder:
    """One ``generate_fast`` call: prefill and admission of waiting jobs, harvests, compaction and the
    decode steps, over a running batch of ``_Rows``."""

    def __init__(self, model, run: DecodeRun, *, max_new_tokens, temperature, top_p, pad_token_id, opts):
        self.model = model
        self.run = run
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.pad_token_id = pad_token_id
        self.max_batch, self.prefill_tokens, self.check_every, self.refill = opts
        self.device = run.device
        self.cache_kw = cache_kwarg(model)
        self.waiting = list(run.order)
        self.wpos = 0

    def _waiting_left(self) -> bool:
        return self.wpos < len(self.waiting)

    def _low(self, n: int) -> bool:
        """At most 3/4 of ``max_batch`` rows: time to refill."""
        return n <= self.max_batch - max(1, self.max_batch // 4)

    def prefill(self, job_ids: list[int]) -> _Rows:
        """Prefill the prompts of ``job_ids`` and draw their first tokens; returns their rows."""
        import torch
        from transformers import DynamicCache

        jobs, device, max_new_tokens = self.run.jobs, self.device, self.max_new_tokens
        plist = [jobs[j][0] for j in job_ids]
        ids, mask = left_pad(plist, self.pad_token_id, device)
        pos = (mask.cumsum(-1) - 1).clamp_(min=0)
        cache = DynamicCache()
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_kw: cache},
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
        tok, lp = choose(logits, self.temperature, self.top_p, self.run.seed, seq_ids, ngen)
        gen_tok = torch.full((b, max_new_tokens + 1), self.pad_token_id, dtype=torch.long, device=device)
        gen_lp = torch.zeros((b, max_new_tokens + 1), dtype=torch.float32, device=device)
        gen_tok[:, 0] = tok
        gen_lp[:, 0] = lp
        ngen += 1
        finished = torch.isin(tok, self.run.eos_t) | (ngen >= max_new_tokens)
        self.run.st.batches += 1
        return _Rows(cache, mask, lengths, tok, ngen, finished, gen_tok, gen_lp, seq_ids, owner)

    def admit(self, rows: _Rows | None) -> _Rows | None:
        """Prefill waiting jobs (longest first, in chunks) into the free rows and merge them in."""
        jobs, waiting, st = self.run.jobs, self.waiting, self.run.st
        free = self.max_batch - (rows.size if rows is not None else 0)
        t_prefill = time.perf_counter()
        while self.wpos < len(waiting) and free >= len(jobs[waiting[self.wpos]][1]):
            chunk: list[int] = []
            width = len(jobs[waiting[self.wpos]][0])  # longest first -> first job is the widest
            while self.wpos < len(waiting):
                j = waiting[self.wpos]
                need = len(jobs[j][1])
                if need > free or (chunk and (len(chunk) + 1) * width > self.prefill_tokens):
                    break
                chunk.append(j)
                free -= need
                self.wpos += 1
            new = self.prefill(chunk)
            if rows is None:
                rows = new
            else:
                rows.merge(new)
                st.refills += 1
        st.prefill_s += time.perf_counter() - t_prefill
        return rows

    def harvest(self, rows: _Rows, done: list[int]) -> None:
        """Store the results of the finished rows ``done``."""
        import torch

        idx = torch.tensor(done, dtype=torch.long, device=self.device)
        toks = rows.gen_tok.index_select(0, idx).tolist()
        lps = rows.gen_lp.index_select(0, idx).tolist()
        ngens = rows.ngen.index_select(0, idx).tolist()
        sids = rows.seq_ids.index_select(0, idx).tolist()
        for r, row in enumerate(done):
            self.run.store(rows.owner[row], int(sids[r]), toks[r], lps[r], ngens[r], self.max_new_tokens)

    def sync_point(self, rows: _Rows) -> tuple[_Rows | None, bool]:
        """Harvest finished rows, compact the batch, trim all-padding KV columns. Returns the rows left
        (None when none) and whether to go back to admission before decoding further."""
        import torch

        fin_l = rows.finished.tolist()
        done = [r for r, f in enumerate(fin_l) if f]
        active = rows.size - len(done)
        want_refill = self.refill and self._waiting_left() and self._low(active)
        # compaction copies the KV cache once: do it when >= 1/16 of the rows are dead (or to refill)
        if done and (16 * len(done) >= rows.size or not active or want_refill):
            self.harvest(rows, done)
            keep = [r for r, f in enumerate(fin_l) if not f]
            if not keep:
                return None, True
            rows.select(torch.tensor(keep, dtype=torch.long, device=self.device), keep)
            self.run.st.compactions += 1
            start = int(rows.mask.any(0).long().argmax().item())
            if start > 0:
                _kv_trim(rows.cache, start)
                rows.mask = rows.mask[:, start:]
            if self.refill and self._waiting_left() and self._low(rows.size):
                return rows, True  # refill before decoding further
        return rows, False

    def decode(self, rows: _Rows) -> None:
        """``check_every`` decode steps without a host sync."""
        import torch

        st, max_new_tokens, pad = self.run.st, self.max_new_tokens, self.pad_token_id
        ones = torch.ones((rows.size, 1), dtype=rows.mask.dtype, device=self.device)
        for _ in range(self.check_every):
            rows.mask = torch.cat([rows.mask, ones], dim=1)
            out = self.model(
                input_ids=rows.tok[:, None],
                attention_mask=rows.mask,
                position_ids=rows.pos[:, None],
                use_cache=True,
                logits_to_keep=1,
                **{self.cache_kw: rows.cache},
            )
            st.decode_steps += 1
            st.row_steps += rows.size
            rows.pos += 1
            logits = out.logits[:, -1, :]
            tok, lp = choose(logits, self.temperature, self.top_p, self.run.seed, rows.seq_ids, rows.ngen)
            fin = rows.finished
            tok = torch.where(fin, torch.full_like(tok, pad), tok)
            col = torch.where(fin, torch.full_like(rows.ngen, max_new_tokens), rows.ngen)[:, None]
            rows.gen_tok.scatter_(1, col, tok[:, None])
            rows.gen_lp.scatter_(1, col, lp[:, None])
            rows.ngen += (~fin).long()
            rows.finished = fin | torch.isin(tok, self.run.eos_t) | (rows.ngen >= max_new_tokens)
            rows.tok = tok

    def loop(self) -> None:
        """Admit, sync, decode until every job is harvested."""
        rows: _Rows | None = None
        while True:
            if rows is None or (self.refill and self._low(rows.size)):
                if self._waiting_left():
                    rows = self.admit(rows)
            if rows is None:
                break
            rows, again = self.sync_point(rows)
            if again:
                continue
            self.run.st.max_active = max(self.run.st.max_active, rows.size)
            self.decode(rows)


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
    """Fast batched generation; same contract as :func:`generate_reference` (see the module docstring).

    Memory: a KV cache of at most ``max_batch`` rows x (longest admitted prompt + ``max_new_tokens``)
    columns plus, during a refill, one prefill chunk (``prefill_tokens`` padded tokens of activations)
    and a transient copy of the KV cache (concatenation). For Qwen2.5-0.5B (24 layers, 2 KV heads, head
    dim 64, bf16) one cached token costs 12 KiB: 256 rows x 1800 columns ~ 5.3 GiB. Decode steps append
    into a buffer with spare columns (``_grow_update``) instead of concatenating the cache every step.
    Works with the ``cache=`` keyword (transformers >= 5.2x) and ``past_key_values=`` (from the signature).
    """
    import torch

    global last_stats
    check_args(prompts, max_new_tokens, temperature, top_p, eos_token_ids)
    if max_batch < 1 or check_every < 1:
        raise ValueError("max_batch and check_every must be >= 1")
    device = device_of(model)
    run = DecodeRun(
        "fast",
        prompts,
        temperature=temperature,
        seed=seed,
        eos_token_ids=eos_token_ids,
        max_batch=max_batch,
        device=device,
        stats=stats,
    )
    decoder = _FastDecoder(
        model,
        run,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        pad_token_id=pad_token_id,
        opts=(max_batch, prefill_tokens, check_every, refill),
    )
    reset_peak(device)
    sync(device)
    t0 = time.perf_counter()
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            decoder.loop()
    finally:
        model.train(was_training)
    out = run.finish(t0, "fastgen", {"max_batch": max_batch, "check_every": check_every, "refill": refill})
    last_stats = run.st
    return out
