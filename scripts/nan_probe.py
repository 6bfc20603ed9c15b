"""Probe: do left-padded GRPO-style backward passes give non-finite gradients on this GPU, and with
which SDPA kernel? Random-init Qwen2 layers with the 0.5B model's attention shapes (no weights needed).

    python scripts/nan_probe.py [--batches 24] [--layers 4]

For each SDPA backend (default choice, math, efficient, cudnn) and for the default with a 4D mask in
which fully padded query rows attend to themselves, it runs the same random left-padded batches
(bf16 autocast over float32 weights, logits on the last columns only, as in sqlrl.training.update) and counts
batches whose gradients contain a non-finite value.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import Qwen2Config, Qwen2ForCausalLM


def batches(n: int, seed: int, device: str):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        b = int(torch.randint(4, 33, (1,), generator=g))
        lens = torch.randint(80, 1600, (b,), generator=g)
        t = int(lens.max())
        ids = torch.randint(0, 151000, (b, t), generator=g)
        attn = torch.zeros(b, t, dtype=torch.long)
        for i, n_i in enumerate(lens.tolist()):
            attn[i, t - n_i :] = 1
        ids = ids * attn
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        keep = int(min(t, int(torch.randint(40, 900, (1,), generator=g))))
        yield ids.to(device), attn.to(device), pos.to(device), keep


def mask4d(attn):
    b, t = attn.shape
    causal = torch.ones(t, t, dtype=torch.bool, device=attn.device).tril()  # [T,T]
    m = causal[None] & attn.bool()[:, None, :]  # [B,T,T]
    m = m | torch.eye(t, dtype=torch.bool, device=attn.device)[None]  # every row sees itself
    return m[:, None]  # [B,1,T,T]


def run(model, data, backend, use_4d):
    bad = 0
    for ids, attn, pos, keep in data:
        model.zero_grad(set_to_none=True)
        am = mask4d(attn) if use_4d else attn
        ctx = sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()
        with ctx, torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(
                input_ids=ids, attention_mask=am, position_ids=pos, logits_to_keep=keep, use_cache=False
            )
        logits = out.logits[:, :-1].float()  # [B,keep-1,V]
        tgt = ids[:, -keep + 1 :]
        lp = logits.gather(-1, tgt[..., None]).squeeze(-1) - torch.logsumexp(logits, -1)
        w = attn[:, -keep + 1 :].float()
        loss = -(lp * w).sum() / w.sum()
        loss.backward()
        finite = all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        bad += 0 if finite else 1
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=24)
    ap.add_argument("--layers", type=int, default=4)
    a = ap.parse_args()
    cfg = Qwen2Config(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=a.layers,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).cuda().float()
    print("torch", torch.__version__, "attn", model.config._attn_implementation, torch.cuda.get_device_name())
    data = list(batches(a.batches, 0, "cuda"))
    cases = [
        ("default", None, False),
        ("math", SDPBackend.MATH, False),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION, False),
        ("cudnn", SDPBackend.CUDNN_ATTENTION, False),
        ("default+4d self-row mask", None, True),
    ]
    for name, be, use4d in cases:
        t0 = time.time()
        try:
            bad = run(model, data, be, use4d)
            print(
                f"{name:28s} non-finite-grad batches {bad}/{len(data)}  ({time.time() - t0:.1f} s)",
                flush=True,
            )
        except Exception as e:  # noqa: BLE001
            print(f"{name:28s} error: {type(e).__name__}: {str(e)[:160]}", flush=True)


if __name__ == "__main__":
    main()
