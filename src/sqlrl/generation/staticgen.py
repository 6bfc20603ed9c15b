"""Static-KV-cache decoding with CUDA-graph replay (the ``"static"`` generation engine).

Same contract as ``fastgen.generate_fast`` (see ``sqlrl.generation.decoding``). ``generate_fast`` calls
the Hugging Face ``forward`` every decode step (~80 ms per step on an H200 whatever the batch: 4-D
masks, a growing cache, ~1,000 small kernel launches). Here the decode step is a short function over
the model's own sub-modules (embedding, RMSNorms, q/k/v/o projections, MLP, rotary embedding, lm head)
against a preallocated KV cache, captured on CUDA once per (decode rows, context bucket) as a CUDA
graph and replayed: one launch per step (bench/results/generate_h200.txt: 12,521 tok/s for 64 x 8 GRPO
sampling of Spider SQL, 10.0x plain ``generate`` greedy). ``generate_static`` says how slots,
prefill, decode and compaction work.

What is covered:
- Llama and Qwen2 families (``model_type`` ``llama`` / ``qwen2``, full attention, no q/k norms),
  optionally PEFT-wrapped; :func:`supports` says whether a model qualifies (``HFPolicy`` falls back
  to ``fastgen`` otherwise).
- Sampling is ``decoding.choose``: given equal logits both engines draw equal tokens.
- Greedy identity with plain ``generate`` in float32 on the CPU test models (the decode step does the
  model's own operations; attention is eager softmax(q k^T * scale) v with a float32 softmax).
- In-place weight updates (``param.copy_``, optimizer steps) are seen by the next graph replay.

What is not:
- Bitwise identity in bfloat16 (attention kernel, span and batch differ: near-ties can flip).
- Replaced parameter tensors are not seen by captured graphs: call :func:`release` after that.
- Without CUDA (tests, CPU users) the same step runs eagerly, without graphs.
"""

from __future__ import annotations

import heapq
import sys
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
    reset_peak,
    sync,
)

__all__ = ["generate_static", "release", "supports"]

BUCKET = 256  # attention span granularity (columns)
MIN_ROWS = 16  # smallest decode batch (slots) a graph is captured for

last_stats: GenStats | None = None


def _hf_model(model):
    """The underlying ``*ForCausalLM`` (unwraps PEFT)."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model


def supports(model) -> tuple[bool, str]:
    """``(True, "")`` when the static engine can run ``model``, else ``(False, reason)``."""
    m = _hf_model(model)
    cfg = getattr(m, "config", None)
    mtype = getattr(cfg, "model_type", None)
    if mtype not in ("llama", "qwen2"):
        return False, f"model_type {mtype!r} is not llama or qwen2"
    inner = getattr(m, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if inner is None or not all(hasattr(inner, a) for a in needed) or not hasattr(m, "lm_head"):
        return False, "unexpected module layout (model.model.{embed_tokens,layers,norm,rotary_emb}, lm_head)"
    types = getattr(cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in types) or getattr(cfg, "use_sliding_window", False):
        return False, "sliding-window attention layers are not supported"
    for layer in inner.layers:
        attn = layer.self_attn
        if hasattr(attn, "q_norm") or not all(
            hasattr(attn, a) for a in ("q_proj", "k_proj", "v_proj", "o_proj")
        ):
            return False, "attention module without plain q/k/v/o projections"
    return True, ""


class _Engine:
    """Static cache + captured decode graphs for one model, slot count and maximum context.

    The KV cache ``[layers, slots, kv_heads, T_max, head_dim]`` is allocated once per call shape and
    kept on the model between calls (``model._sqlrl_static``), so graphs are captured once per process.
    It costs ``2 x layers x kv_heads x head_dim x bytes`` per slot and column (Qwen2.5-0.5B in bf16:
    12 KiB; 512 slots x 2,304 columns = 13.5 GiB), plus one prefill chunk of activations and the
    graph's workspace (logits of ``slots x vocab``). Graphs read the parameters by address.
    """

    def __init__(self, model, slots: int, t_max: int, use_graphs: bool):
        import torch

        m = _hf_model(model)
        self.model = model
        self.m = m
        inner = m.model
        cfg = m.config
        self.layers = list(inner.layers)
        attn0 = self.layers[0].self_attn
        self.head_dim = int(attn0.head_dim)
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(cfg.num_key_value_heads)
        self.scaling = float(attn0.scaling)
        self.apply_rope = sys.modules[type(attn0).__module__].apply_rotary_pos_emb
        p = next(m.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.slots, self.t_max = int(slots), int(t_max)
        shape = (len(self.layers), self.slots, self.n_kv, self.t_max, self.head_dim)
        self.k = torch.zeros(shape, dtype=self.dtype, device=self.device)  # [L, S, Hkv, T, D]
        self.v = torch.zeros(shape, dtype=self.dtype, device=self.device)  # [L, S, Hkv, T, D]
        self.tok = torch.zeros(self.slots, dtype=torch.long, device=self.device)  # [S] input token
        self.pos = torch.zeros(self.slots, dtype=torch.long, device=self.device)  # [S] its position
        self.want_graphs = bool(use_graphs)
        self.use_graphs = self.want_graphs and self.device.type == "cuda"
        self.graphs: dict[tuple[int, int], tuple] = {}  # (rows, span) -> (graph, logits)
        self.pool = None
        self.graph_error: str | None = None

    def __deepcopy__(self, memo):
        # ``copy.deepcopy(model)`` (reference models, float32 copies) must not copy the KV cache or the
        # CUDA graphs (which cannot be copied): the copy starts without an engine.
        return None

    def __reduce__(self):
        raise TypeError("staticgen engine state is not picklable; call staticgen.release(model) first")

    def fits(self, model, slots: int, t_max: int, use_graphs: bool) -> bool:
        p = next(_hf_model(model).parameters())
        return (
            self.model is model
            and self.slots >= slots
            and self.t_max >= t_max
            and p.device == self.device
            and p.dtype == self.dtype
            and self.want_graphs == bool(use_graphs)
        )

    # ----------------------------------------------------------------------------------- decode step
    def _step(self, span: int, S: int):
        """Logits ``[S, V]`` for the first ``S`` slots' ``tok`` at ``pos``; writes their K/V at column ``pos``."""
        import torch

        H, Hkv, D = self.n_heads, self.n_kv, self.head_dim
        G = H // Hkv
        inner = self.m.model
        tok, pos = self.tok[:S], self.pos[:S]  # [S], [S]
        h = inner.embed_tokens(tok[:, None])  # [S, 1, E]
        cos, sin = inner.rotary_emb(h, pos[:, None])  # [S, 1, D] each
        cols = torch.arange(span, device=self.device)  # [span]
        mask = (cols[None, :] <= pos[:, None])[:, None, None, :]  # [S, 1, 1, span] bool
        rows = torch.arange(S, device=self.device)  # [S]
        for li, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)  # [S, 1, E]
            q = attn.q_proj(x).view(S, 1, H, D).transpose(1, 2)  # [S, H, 1, D]
            k = attn.k_proj(x).view(S, 1, Hkv, D).transpose(1, 2)  # [S, Hkv, 1, D]
            v = attn.v_proj(x).view(S, 1, Hkv, D).transpose(1, 2)  # [S, Hkv, 1, D]
            q, k = self.apply_rope(q, k, cos, sin)
            self.k[li][rows, :, pos] = k[:, :, 0]  # [S, Hkv, D] into column pos of each slot
            self.v[li][rows, :, pos] = v[:, :, 0]
            # grouped-query attention without repeating K/V: query heads j*G..j*G+G-1 read KV head j
            qg = q[:, :, 0].reshape(S, Hkv, G, D)  # [S, Hkv, G, D]
            kc = self.k[li][:S, :, :span]  # [S, Hkv, span, D]
            vc = self.v[li][:S, :, :span]  # [S, Hkv, span, D]
            scores = torch.matmul(qg, kc.transpose(-1, -2)) * self.scaling  # [S, Hkv, G, span]
            scores = scores.float().masked_fill(~mask, float("-inf"))
            probs = torch.softmax(scores, dim=-1).to(vc.dtype)  # [S, Hkv, G, span]
            o = torch.matmul(probs, vc).reshape(S, 1, H * D)  # [S, 1, H*D]
            h = h + attn.o_proj(o)
            h = h + layer.mlp(layer.post_attention_layernorm(h))  # [S, 1, E]
        h = inner.norm(h)
        return self.m.lm_head(h[:, 0])  # [S, V]

    def _capture(self, span: int, rows: int) -> None:
        import torch

        # Warm-up runs write the K/V of the current (tok, pos) -- exactly what the real step writes.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step(span, rows)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self._step(span, rows)
        self.graphs[(rows, span)] = (g, out)

    def step(self, span: int, rows: int):
        """Logits ``[rows, V]`` of one decode step of the first ``rows`` slots over ``span`` columns."""
        import torch

        span = min(self.t_max, span)
        if not self.use_graphs:
            return self._step(span, rows)
        if (rows, span) not in self.graphs:
            try:
                self._capture(span, rows)
            except Exception as exc:  # noqa: BLE001 - any capture failure: run eagerly, say why
                import warnings

                self.use_graphs = False
                self.graph_error = f"{type(exc).__name__}: {exc}"
                warnings.warn(
                    f"staticgen: CUDA graph capture failed, decoding eagerly ({self.graph_error})",
                    stacklevel=2,
                )
                torch.cuda.synchronize(self.device)
                return self._step(span, rows)
        g, out = self.graphs[(rows, span)]
        g.replay()
        return out


def release(model) -> bool:
    """Drop the cached engine (KV cache and graphs) of ``model``; whether there was one."""
    m = _hf_model(model)
    if not hasattr(m, "_sqlrl_static"):
        return False
    del m._sqlrl_static
    return True


def _engine(model, slots: int, t_max: int, use_graphs: bool) -> _Engine:
    m = _hf_model(model)
    eng = getattr(m, "_sqlrl_static", None)
    if eng is not None and eng.fits(model, slots, t_max, use_graphs):
        return eng
    if eng is not None:
        grow_slots, grow_t = max(eng.slots, slots), max(eng.t_max, t_max)
        release(model)
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        slots, t_max = grow_slots, grow_t
    eng = _Engine(model, slots, t_max, use_graphs)
    object.__setattr__(m, "_sqlrl_static", eng)  # not a sub-module, not in state_dict
    return eng


class _StaticDecoder:
    """One ``generate_static`` call over an engine's slots: prefill into free slots, harvests,
    compaction of stragglers into the low slots, and the decode steps."""

    def __init__(self, model, run: DecodeRun, eng: _Engine, *, max_new_tokens, temperature, top_p, opts):
        import torch

        self.model = model
        self.run = run
        self.eng = eng
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.pad_token_id, self.max_batch, self.prefill_tokens, self.check_every = opts
        device = self.device = run.device
        self.cache_kw = cache_kwarg(model)
        S = self.S = eng.slots
        pad_token_id = self.pad_token_id
        self.gen_tok = torch.full((S, max_new_tokens + 1), pad_token_id, dtype=torch.long, device=device)
        self.gen_lp = torch.zeros((S, max_new_tokens + 1), dtype=torch.float32, device=device)
        self.ngen = torch.zeros(S, dtype=torch.long, device=device)
        self.finished = torch.ones(S, dtype=torch.bool, device=device)  # free slots count as finished
        self.seq_ids = torch.zeros(S, dtype=torch.long, device=device)
        self.owner: list[int | None] = [None] * S  # job of each slot
        self.cap = min(S, self.max_batch)  # a reused engine may have more slots than this call may use
        eng.pos.zero_()  # no stale positions from an earlier call (they would widen the span)
        eng.tok.fill_(pad_token_id)
        self.free = list(range(self.cap))  # a min-heap: new sequences take the lowest free slots
        self.waiting = list(run.order)
        self.wpos = 0
        self.spans: set[int] = set()
        self.row_buckets: set[int] = set()

    def prefill(self, job_ids: list[int]) -> None:
        """Prefill the prompts of ``job_ids``, copy their KV into free slots, draw their first tokens."""
        import torch
        from transformers import DynamicCache

        jobs, eng, device, free, owner = self.run.jobs, self.eng, self.device, self.free, self.owner
        plist = [jobs[j][0] for j in job_ids]
        ids, mask = left_pad(plist, self.pad_token_id, device)
        width = ids.shape[1]
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
        layers = kv_layers(cache)
        keys = torch.stack([layer.keys for layer in layers])  # [L, b, Hkv, width, D]
        vals = torch.stack([layer.values for layer in layers])  # [L, b, Hkv, width, D]
        logits = out.logits[:, -1, :]  # [b, V]
        dst, src, plens, sids = [], [], [], []
        for r, j in enumerate(job_ids):
            plen = len(jobs[j][0])
            for sid in jobs[j][1]:
                s = heapq.heappop(free)
                eng.k[:, s, :, :plen] = keys[:, r, :, width - plen :]
                eng.v[:, s, :, :plen] = vals[:, r, :, width - plen :]
                owner[s] = j
                dst.append(s)
                src.append(r)
                plens.append(plen)
                sids.append(sid)
        d = torch.tensor(dst, dtype=torch.long, device=device)
        eng.pos[d] = torch.tensor(plens, dtype=torch.long, device=device)
        self.seq_ids[d] = torch.tensor(sids, dtype=torch.long, device=device)
        sidx = torch.tensor(src, dtype=torch.long, device=device)
        zero = torch.zeros(len(dst), dtype=torch.long, device=device)
        tok, lp = choose(
            logits.index_select(0, sidx), self.temperature, self.top_p, self.run.seed, self.seq_ids[d], zero
        )
        self.gen_tok[d, 0] = tok
        self.gen_lp[d, 0] = lp
        self.ngen[d] = 1
        eng.tok[d] = tok
        self.finished[d] = torch.isin(tok, self.run.eos_t) | (self.max_new_tokens <= 1)
        self.run.st.batches += 1

    def admit(self) -> None:
        """Prefill waiting jobs (longest first, in chunks) into the free slots."""
        jobs, waiting, st = self.run.jobs, self.waiting, self.run.st
        t_prefill = time.perf_counter()
        while self.wpos < len(waiting) and len(self.free) >= len(jobs[waiting[self.wpos]][1]):
            chunk: list[int] = []
            width = len(jobs[waiting[self.wpos]][0])  # longest first -> the first job is the widest
            room = len(self.free)
            while self.wpos < len(waiting):
                j = waiting[self.wpos]
                need = len(jobs[j][1])
                if need > room or (chunk and (len(chunk) + 1) * width > self.prefill_tokens):
                    break
                chunk.append(j)
                room -= need
                self.wpos += 1
            self.prefill(chunk)
            st.refills += 1
        st.prefill_s += time.perf_counter() - t_prefill

    def harvest(self, done: list[int]) -> None:
        """Store the results of the finished slots ``done`` and free them."""
        import torch

        eng, pad = self.eng, self.pad_token_id
        idx = torch.tensor(done, dtype=torch.long, device=self.device)
        toks = self.gen_tok.index_select(0, idx).tolist()
        lps = self.gen_lp.index_select(0, idx).tolist()
        ngens = self.ngen.index_select(0, idx).tolist()
        sids = self.seq_ids.index_select(0, idx).tolist()
        for r, s in enumerate(done):
            self.run.store(self.owner[s], int(sids[r]), toks[r], lps[r], ngens[r], self.max_new_tokens)  # type: ignore[arg-type]
            self.owner[s] = None
            heapq.heappush(self.free, s)
        eng.pos[idx] = 0
        eng.tok[idx] = pad
        self.gen_tok[idx] = pad
        self.ngen[idx] = 0

    def compact(self, live: list[int], rows: int, span: int) -> None:
        """Move the live slots at index >= rows into free slots below rows (KV columns < span)."""
        import torch

        eng, owner, device = self.eng, self.owner, self.device
        movers = [s for s in live if s >= rows]
        targets = sorted(x for x in self.free if x < rows)[: len(movers)]
        src = torch.tensor(movers, dtype=torch.long, device=device)
        dst = torch.tensor(targets, dtype=torch.long, device=device)
        eng.k[:, dst, :, :span] = eng.k[:, src, :, :span]
        eng.v[:, dst, :, :span] = eng.v[:, src, :, :span]
        for t in (eng.pos, eng.tok, self.gen_tok, self.gen_lp, self.ngen, self.finished, self.seq_ids):
            t[dst] = t[src]
        eng.pos[src] = 0
        eng.tok[src] = self.pad_token_id
        self.finished[src] = True
        for a, b in zip(movers, targets):
            owner[b], owner[a] = owner[a], None
        taken = set(targets)
        free = [x for x in self.free if x not in taken] + movers
        heapq.heapify(free)
        self.free = free
        self.run.st.compactions += 1

    def decode(self, span: int, rows: int, n_live: int) -> None:
        """``check_every`` decode steps of the first ``rows`` slots over ``span`` columns."""
        import torch

        eng, st, pad, max_new_tokens = self.eng, self.run.st, self.pad_token_id, self.max_new_tokens
        gen_tok, gen_lp, ngen, finished = self.gen_tok, self.gen_lp, self.ngen, self.finished
        for _ in range(self.check_every):
            logits = eng.step(span, rows)  # [rows, V]
            st.decode_steps += 1
            st.row_steps += n_live
            tok, lp = choose(
                logits, self.temperature, self.top_p, self.run.seed, self.seq_ids[:rows], ngen[:rows]
            )
            fin = finished[:rows].clone()
            nrow = ngen[:rows]
            tok = torch.where(fin, torch.full_like(tok, pad), tok)
            col = torch.where(fin, torch.full_like(nrow, max_new_tokens), nrow)[:, None]
            gen_tok[:rows].scatter_(1, col, tok[:, None])
            gen_lp[:rows].scatter_(1, col, lp[:, None])
            nrow.add_((~fin).long())
            finished[:rows] = fin | torch.isin(tok, self.run.eos_t) | (nrow >= max_new_tokens)
            eng.pos[:rows].add_((~fin).long())
            eng.tok[:rows].copy_(tok)

    def loop(self) -> None:
        """Harvest, refill, pick the span and row bucket, decode, until every job is harvested."""
        S, owner, eng = self.S, self.owner, self.eng
        while True:
            fin_l = self.finished.tolist()
            done = [s for s in range(S) if owner[s] is not None and fin_l[s]]
            if done:
                self.harvest(done)
            waiting_left = self.wpos < len(self.waiting)
            if waiting_left and (len(self.free) >= max(1, self.cap // 8) or len(self.free) == self.cap):
                self.admit()
            live = [s for s in range(S) if owner[s] is not None]
            if not live:
                if self.wpos < len(self.waiting):
                    continue
                break
            self.run.st.max_active = max(self.run.st.max_active, len(live))
            # every live slot's position stays below the span for the next check_every steps
            span = -(-(int(eng.pos.max().item()) + self.check_every + 1) // BUCKET) * BUCKET
            span = min(span, eng.t_max)
            # decode only the first `rows` slots (a power of two >= MIN_ROWS): the batch shrinks
            # as sequences finish, moving stragglers down when that halves the work
            rows = min(S, max(MIN_ROWS, 1 << (len(live) - 1).bit_length()))
            if live[-1] >= rows:
                self.compact(live, rows, span)
            self.spans.add(span)
            self.row_buckets.add(rows)
            self.decode(span, rows, len(live))


def generate_static(
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
    use_graphs: bool | None = None,
    stats: GenStats | None = None,
) -> list[tuple[list[int], list[float], str]]:
    """Static-cache batched generation; same contract as ``fastgen.generate_fast``.

    * Slots: every sequence owns one slot of the engine's KV cache; its prompt KV sits in columns
      ``0..p-1`` (no padding inside a slot), decode step ``k`` writes column ``p+k``; the attention
      mask is ``column <= position``.
    * Prefill runs the model's HF ``forward`` (``DynamicCache``, left padding, explicit position ids,
      ``logits_to_keep=1``) on chunks of at most ``prefill_tokens`` padded tokens, longest first, and
      copies each row's KV into its slot(s); identical prompts are prefilled once.
    * Decode runs ``check_every`` steps between host synchronisations. At a synchronisation finished
      slots are harvested and refilled (continuous batching at slot granularity); the attention span
      is the smallest ``BUCKET``-column bucket covering every live slot. New sequences take the lowest
      free slots and only the first ``rows`` slots are decoded (the smallest power of two >= the live
      count, at least ``MIN_ROWS``): stragglers are moved down so the batch halves as sequences finish.
    * CUDA graphs are captured per (rows, span) on first use when the model is on CUDA and
      ``use_graphs`` is not False; a failed capture warns and decodes eagerly.
    """
    import torch

    global last_stats
    check_args(prompts, max_new_tokens, temperature, top_p, eos_token_ids)
    if max_batch < 1 or check_every < 1:
        raise ValueError("max_batch and check_every must be >= 1")
    ok, why = supports(model)
    if not ok:
        raise ValueError(f"generate_static does not support this model: {why}; use fastgen.generate_fast")
    device = device_of(model)
    run = DecodeRun(
        "static",
        prompts,
        temperature=temperature,
        seed=seed,
        eos_token_ids=eos_token_ids,
        max_batch=max_batch,
        device=device,
        stats=stats,
    )
    n_rows = sum(len(j[1]) for j in run.jobs)
    slots = min(max_batch, n_rows)
    if device.type == "cuda":  # round up so a few graph shapes serve every call
        slots = min(max_batch, 1 << (slots - 1).bit_length())
    longest = max(len(p) for p in prompts)
    t_need = longest + max_new_tokens + check_every + 1
    t_max = -(-t_need // BUCKET) * BUCKET
    if use_graphs is None:
        use_graphs = device.type == "cuda"
    eng = _engine(model, slots, t_max, bool(use_graphs))
    decoder = _StaticDecoder(
        model,
        run,
        eng,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        opts=(pad_token_id, max_batch, prefill_tokens, check_every),
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
    extra = {
        "slots": eng.slots,
        "t_max": eng.t_max,
        "check_every": check_every,
        "cuda_graphs": eng.use_graphs,
        "graphs_captured": len(eng.graphs),
        "graph_error": eng.graph_error,
        "spans": sorted(decoder.spans),
        "row_buckets": sorted(decoder.row_buckets),
    }
    out = run.finish(t0, "staticgen", extra)
    last_stats = run.st
    return out
