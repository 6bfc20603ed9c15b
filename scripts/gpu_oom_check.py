"""Exercise `HFPolicy`'s out-of-memory retry on a real GPU: a real `torch.OutOfMemoryError`, then the
same prompts again with half the batch, until they fit.

    python scripts/gpu_oom_check.py --model qwen2.5-coder-0.5b-instruct --out OOM.json
        [--engine static] [--n-prompts 512] [--prompt-tokens 1500] [--max-new-tokens 64]
        [--memory-gb 8] [--reference-batch 16]

1. Reference: greedy generation of every prompt with `--reference-batch` sequences per batch (fits).
2. The GPU is capped at `--memory-gb` for this process (`torch.cuda.set_per_process_memory_fraction`,
   so the caching allocator raises a real OutOfMemoryError past it), and a fresh `HFPolicy` with
   `max_batch = --n-prompts` generates the same prompts: the static engine's KV cache for all of them
   does not fit, the policy halves its batch after each OutOfMemoryError and goes on.
Written to --out (JSON) and printed: the batch sizes tried (`memory_adjustments`), the batch that fitted,
peak allocated memory, times, and how many generations are token-identical to the reference (greedy;
bfloat16 logits can differ in the last bits with the batch composition, so a few may differ: counted,
not asserted). Exit 1 when no out-of-memory error happened (the cap was too generous: nothing was
exercised) or the retry failed; 0 otherwise. Needs CUDA; refuses to run without it (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    """`n` distinct chat prompts of about `length` tokens: a long synthetic schema and a question."""
    cols = ", ".join(f"col_{i} INTEGER" for i in range(40))
    schema = "\n".join(f"CREATE TABLE t_{k} ({cols});" for k in range(200))
    base = tokenizer(schema, add_special_tokens=False)["input_ids"]
    out = []
    for i in range(n):
        question = f"\nQuestion {i}: how many rows of t_{i % 200} have col_{i % 40} greater than {i}? Answer with SQL."
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": tokenizer.decode(base[: max(1, length - 40)]) + question}],
            tokenize=True,
            add_generation_prompt=True,
        )
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--engine", default="static", choices=["static", "fast", "hf"])
    ap.add_argument("--n-prompts", type=int, default=512)
    ap.add_argument("--prompt-tokens", type=int, default=1500)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--memory-gb", type=float, default=8.0, help="memory cap for this process (GB)")
    ap.add_argument("--reference-batch", type=int, default=16)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("gpu_oom_check: needs a CUDA GPU", file=sys.stderr)
        return 2
    from sqlrl.generation.models import load_model
    from sqlrl.generation.policy import HFPolicy

    loaded = load_model(args.model, device="cuda", dtype="bfloat16")
    prompts = _prompts(loaded.tokenizer, args.n_prompts, args.prompt_tokens)
    lens = sorted(len(p) for p in prompts)
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=0.0)

    ref_policy = HFPolicy(
        loaded, engine=args.engine, max_batch=args.reference_batch, batch_size=args.reference_batch
    )
    t0 = time.perf_counter()
    ref = ref_policy.generate(prompts, **kw)
    t_ref = time.perf_counter() - t0
    del ref_policy
    from sqlrl.generation import staticgen
    from sqlrl.generation.device import free_memory

    staticgen.release(loaded.model)
    free_memory()

    total = torch.cuda.get_device_properties(0).total_memory
    fraction = min(1.0, args.memory_gb * 1e9 / total)
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    torch.cuda.reset_peak_memory_stats()
    policy = HFPolicy(loaded, engine=args.engine, max_batch=args.n_prompts, batch_size=args.n_prompts)
    t0 = time.perf_counter()
    error = None
    try:
        got = policy.generate(prompts, **kw)
    except Exception as e:  # noqa: BLE001 - reported
        got, error = None, f"{type(e).__name__}: {e}"
    t_cap = time.perf_counter() - t0
    same = sum(a.token_ids == b.token_ids for a, b in zip(ref, got or []))
    out = {
        "model": args.model,
        "engine": policy.engine,
        "gpu": torch.cuda.get_device_name(0),
        "gpu_total_gb": round(total / 1e9, 1),
        "memory_cap_gb": round(fraction * total / 1e9, 2),
        "n_prompts": len(prompts),
        "prompt_tokens_min_median_max": [lens[0], lens[len(lens) // 2], lens[-1]],
        "max_new_tokens": args.max_new_tokens,
        "reference_batch": args.reference_batch,
        "reference_s": round(t_ref, 2),
        "capped_first_batch": args.n_prompts,
        "memory_adjustments": policy.memory_adjustments,
        "batch_that_fitted": getattr(policy, policy.batch_attr),
        "capped_s": round(t_cap, 2),
        "peak_allocated_gb_capped": round(torch.cuda.max_memory_allocated() / 1e9, 2),
        "error": error,
        "token_identical_to_reference": f"{same}/{len(prompts)}",
        "generated_tokens": sum(len(g.token_ids) for g in got or []),
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))
    if error is not None:
        print("gpu_oom_check: the retry did not recover", file=sys.stderr)
        return 1
    if not policy.memory_adjustments:
        print("gpu_oom_check: no out-of-memory error happened; lower --memory-gb", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
