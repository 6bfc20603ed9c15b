"""Benchmark sqlrl's decode engines against plain HF generate, side by side in one run.

Runs (a) ``generate_reference`` (plain ``model.generate``) greedy, (b) ``fastgen.generate_fast`` greedy,
(c) ``staticgen.generate_static`` greedy on the same prompts, (d) ``generate_static`` GRPO-style sampling
(G prompts x S samples, temperature 1.0; the 10,000 tok/s target), (e) ``generate_fast`` on the same
sampling job, then a float32 greedy identity check (plain vs static, plain vs fast) on a prompt subset.
Prints a human table plus one JSON line (``--out FILE`` also writes the JSON). Generated tokens are
counted up to and including the first eos. The static engine's one-time CUDA-graph capture is done in
a warm-up call and reported as ``warmup_static_s``.

GPU (H200)::

    python bench/bench_generate.py --model qwen2.5-coder-0.5b-instruct --prompts-from data/spider \\
        --out bench_generate.json

CPU smoke test with a tiny random model::

    python bench/bench_generate.py --tiny --n-prompts 8 --max-new-tokens 16 --group-prompts 4 \\
        --samples 2 --sample-max-new-tokens 16 --device cpu --dtype float32
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import sys
import time
from pathlib import Path

SYSTEM = (
    "You are an expert SQLite assistant. Given a database schema and a question, "
    "write one SQLite query that answers the question. Reply with the SQL only."
)


def _load(args):
    import torch
    import transformers

    dtype = getattr(torch, args.dtype)
    tok = None
    if args.tiny:
        torch.manual_seed(0)
        cfg = transformers.Qwen2Config(
            vocab_size=2048,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=4096,
        )
        model = transformers.Qwen2ForCausalLM(cfg)
        name = "tiny-random-qwen2"
    elif args.path:
        model = transformers.AutoModelForCausalLM.from_pretrained(args.path, dtype=dtype)
        tok = transformers.AutoTokenizer.from_pretrained(args.path)
        name = args.path
    else:
        from sqlrl.generation.models import load_model

        try:
            loaded = load_model(args.model, device=args.device, dtype=args.dtype)
        except TypeError:  # older signature
            loaded = load_model(args.model)
        if isinstance(loaded, tuple):
            model, tok = loaded[0], (loaded[1] if len(loaded) > 1 else None)
        elif isinstance(loaded, dict):
            model, tok = loaded["model"], loaded.get("tokenizer")
        else:
            model, tok = getattr(loaded, "model", loaded), getattr(loaded, "tokenizer", None)
        name = args.model
    model = model.to(device=args.device, dtype=dtype).eval()
    return model, tok, name


def _schema(db_path: Path) -> str:
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid").fetchall()
    finally:
        con.close()
    return "\n".join(r[0].strip() + ";" for r in rows)


def _spider_prompts(root: Path, split: str, n: int, tok, seed: int) -> list[list[int]]:
    items = json.loads((root / f"{split}.json").read_text())
    random.Random(seed).shuffle(items)
    cache: dict[str, str] = {}
    out: list[list[int]] = []
    for it in items:
        if len(out) >= n:
            break
        db = it["db_id"]
        if db not in cache:
            path = root / "database" / db / f"{db}.sqlite"
            if not path.exists():
                continue
            cache[db] = _schema(path)
        msgs = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Schema:\n{cache[db]}\n\nQuestion: {it['question']}"},
        ]
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        out.append(list(tok(text, add_special_tokens=False)["input_ids"]))
    return out


def _synthetic_prompts(n: int, vocab: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def _identity(a, b) -> dict:
    same = sum(x[0] == y[0] for x, y in zip(a, b))
    prefix = []
    for x, y in zip(a, b):
        k = 0
        while k < min(len(x[0]), len(y[0])) and x[0][k] == y[0][k]:
            k += 1
        prefix.append(k / max(1, max(len(x[0]), len(y[0]))))
    return {
        "identical": same,
        "n": len(a),
        "identity_rate": same / max(1, len(a)),
        "mean_common_prefix_frac": sum(prefix) / max(1, len(prefix)),
    }


def _parse_args(argv: list[str] | None, cuda: bool):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument(
        "--model", default="qwen2.5-coder-0.5b-instruct", help="name for sqlrl.generation.models.load_model"
    )
    src.add_argument("--path", help="local Hugging Face model folder")
    src.add_argument("--tiny", action="store_true", help="tiny random Qwen2 (smoke test)")
    ap.add_argument("--prompts-from", type=Path, help="Spider-layout folder (<split>.json + database/)")
    ap.add_argument("--split", default="dev")
    ap.add_argument("--n-prompts", type=int, default=128, help="prompts for the greedy runs (a, b)")
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--batch-size", type=int, default=128, help="batch of the plain generate run")
    ap.add_argument("--max-batch", type=int, default=256, help="max rows of generate_fast")
    ap.add_argument("--check-every", type=int, default=8)
    ap.add_argument("--prefill-tokens", type=int, default=32768)
    ap.add_argument("--group-prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--sample-max-new-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--synthetic-min-len", type=int, default=300)
    ap.add_argument("--synthetic-max-len", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if cuda else "cpu")
    ap.add_argument("--dtype", default="bfloat16" if cuda else "float32")
    ap.add_argument("--skip-reference", action="store_true")
    ap.add_argument("--skip-fast-sampling", action="store_true", help="skip (e) fast-engine sampling")
    ap.add_argument("--static-slots", type=int, default=512, help="KV-cache slots of generate_static")
    ap.add_argument(
        "--fp32-identity",
        type=int,
        default=32,
        help="prompts for the float32 greedy identity check (0: skip)",
    )
    ap.add_argument("--out", type=Path)
    return ap.parse_args(argv)


def _prompts_and_ids(args, model, tok):
    """(prompts, prompt_source, eos_ids, pad) for the runs."""
    n_needed = max(args.n_prompts, args.group_prompts)
    prompt_source = "synthetic"
    if args.prompts_from and tok is not None:
        prompts = _spider_prompts(args.prompts_from, args.split, n_needed, tok, args.seed)
        prompt_source = f"spider:{args.prompts_from}/{args.split}"
    else:
        if args.prompts_from:
            print("no tokenizer available: falling back to synthetic prompts", file=sys.stderr)
        hi = min(
            args.synthetic_max_len, model.config.max_position_embeddings - args.sample_max_new_tokens - 1
        )
        lo = min(args.synthetic_min_len, hi)
        prompts = _synthetic_prompts(n_needed, model.config.vocab_size, lo, hi, args.seed)
    if tok is not None:
        eos = {tok.eos_token_id}
        gc = getattr(model, "generation_config", None)
        ge = getattr(gc, "eos_token_id", None) if gc is not None else None
        eos |= set(ge if isinstance(ge, list) else [ge]) if ge is not None else set()
        eos_ids = sorted(e for e in eos if e is not None)
        pad = tok.pad_token_id if tok.pad_token_id is not None else eos_ids[0]
    else:
        eos_ids, pad = [1], 0
    return prompts, prompt_source, eos_ids, pad


def _engine_kwargs(args) -> tuple[dict, dict]:
    fast_kw = dict(max_batch=args.max_batch, check_every=args.check_every, prefill_tokens=args.prefill_tokens)
    return fast_kw, dict(fast_kw, max_batch=args.static_slots)


def _run_engines(args, model, prompts, common: dict) -> tuple[dict, dict]:
    """Warm-up, then runs (a)-(e); returns (runs: key -> stats dict, outputs: key -> results)."""
    from sqlrl.generation import fastgen, staticgen

    greedy_prompts = prompts[: args.n_prompts]
    group = [p for p in prompts[: args.group_prompts] for _ in range(args.samples)]
    fast_kw, static_kw = _engine_kwargs(args)
    samp = dict(
        max_new_tokens=args.sample_max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
    )

    # warm-up: CUDA context, kernels, allocator; the static engine captures its decode graphs for the
    # shapes used below (a one-time cost per process, reported separately as warmup_s)
    fastgen.generate_fast(model, prompts[:2], max_new_tokens=4, **common, **fast_kw)
    if not args.skip_reference:
        fastgen.generate_reference(model, prompts[:2], max_new_tokens=4, batch_size=2, **common)
    t = time.perf_counter()
    staticgen.generate_static(
        model, greedy_prompts, max_new_tokens=args.max_new_tokens, **common, **static_kw
    )
    staticgen.generate_static(model, group, **samp, **common, **static_kw)
    warmup_static_s = time.perf_counter() - t

    runs: dict[str, dict] = {}
    outputs: dict[str, list] = {}

    def run(key: str, fn, *a, **kw):
        st = fastgen.GenStats()
        t0 = time.perf_counter()
        out = fn(*a, stats=st, **kw)
        runs[key] = st.to_dict()
        runs[key]["extra"]["elapsed_s"] = time.perf_counter() - t0
        outputs[key] = out
        return out

    def sample_stats(key: str, sampled) -> None:
        lens = sorted(len(s[0]) for s in sampled)
        runs[key]["extra"].update(
            median_len=lens[len(lens) // 2],
            stop_rate=sum(s[2] == "stop" for s in sampled) / len(sampled),
            distinct_in_group=sum(
                len({tuple(s[0]) for s in sampled[g * args.samples : (g + 1) * args.samples]})
                for g in range(args.group_prompts)
            )
            / max(1, args.group_prompts),
        )

    if not args.skip_reference:
        run(
            "a_reference_greedy",
            fastgen.generate_reference,
            model,
            greedy_prompts,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            **common,
        )
    run(
        "b_fast_greedy",
        fastgen.generate_fast,
        model,
        greedy_prompts,
        max_new_tokens=args.max_new_tokens,
        **common,
        **fast_kw,
    )
    run(
        "c_static_greedy",
        staticgen.generate_static,
        model,
        greedy_prompts,
        max_new_tokens=args.max_new_tokens,
        **common,
        **static_kw,
    )
    runs["c_static_greedy"]["extra"]["warmup_static_s"] = warmup_static_s
    sampled = run("d_static_sampling", staticgen.generate_static, model, group, **samp, **common, **static_kw)
    sample_stats("d_static_sampling", sampled)
    if not args.skip_fast_sampling:
        fs = run("e_fast_sampling", fastgen.generate_fast, model, group, **samp, **common, **fast_kw)
        sample_stats("e_fast_sampling", fs)
    return runs, outputs


def _fp32_identity(args, model, greedy_prompts, common: dict) -> dict | None:
    """Exact-identity check in float32 on a fixed prompt subset (bf16 argmax near-ties can flip)."""
    from sqlrl.generation import fastgen, staticgen

    if not (args.fp32_identity > 0 and not args.skip_reference):
        return None
    fast_kw, static_kw = _engine_kwargs(args)
    m32 = model.float() if args.dtype == "float32" else __import__("copy").deepcopy(model).float()
    sub = greedy_prompts[: args.fp32_identity]
    r32 = fastgen.generate_reference(
        m32, sub, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, **common
    )
    s32 = staticgen.generate_static(m32, sub, max_new_tokens=args.max_new_tokens, **common, **static_kw)
    f32 = fastgen.generate_fast(m32, sub, max_new_tokens=args.max_new_tokens, **common, **fast_kw)
    fp32 = {"plain_vs_static": _identity(r32, s32), "plain_vs_fast": _identity(r32, f32)}
    staticgen.release(m32)
    del m32
    return fp32


def _print_report(args, result: dict, runs: dict, plens: list[int], fp32: dict | None) -> None:
    """The human table and summary lines."""
    name, prompt_source = result["model"], result["prompt_source"]
    print(f"\nmodel={name} device={result['device_name']} dtype={args.dtype} prompts={prompt_source}")
    print(f"prompt tokens min/mean/max = {min(plens)}/{sum(plens) / len(plens):.0f}/{max(plens)}")
    print(f"{'run':<22}{'seqs':>6}{'gen tokens':>12}{'wall s':>10}{'tok/s':>11}{'peak GB':>9}")
    for k, r in runs.items():
        print(
            f"{k:<22}{r['n_prompts']:>6}{r['tokens_generated']:>12}{r['wall_s']:>10.2f}"
            f"{r['tokens_per_s']:>11.1f}{r['peak_memory_gb']:>9.2f}"
        )
    if "greedy_identity" in result:
        print(f"speedup fast/plain (greedy): {result['speedup_fast_over_plain_greedy']:.2f}x")
        print(f"speedup static/plain (greedy): {result['speedup_static_over_plain_greedy']:.2f}x")
        print(
            "static GRPO sampling vs plain greedy tok/s: "
            f"{result['speedup_static_sampling_over_plain_greedy']:.2f}x"
        )
        for key, label in (
            ("greedy_identity", "a vs b (fast)"),
            ("greedy_identity_static", "a vs c (static)"),
        ):
            gi = result[key]
            print(
                f"greedy token identity {label}, {args.dtype}: {gi['identical']}/{gi['n']} = "
                f"{gi['identity_rate']:.3f} (mean common-prefix fraction {gi['mean_common_prefix_frac']:.3f})"
            )
    if fp32 is not None:
        for k, gi in fp32.items():
            print(
                f"greedy token identity {k}, float32: {gi['identical']}/{gi['n']} = {gi['identity_rate']:.3f}"
            )
    met = result["static_sampling_tok_s"] >= 10000
    print(
        f"GRPO sampling ({args.group_prompts} x {args.samples}, T={args.temperature}): "
        f"{result['static_sampling_tok_s']:.0f} tok/s; target 10,000: {'MET' if met else 'NOT met'}"
    )


def main(argv: list[str] | None = None) -> int:
    import torch

    args = _parse_args(argv, torch.cuda.is_available())
    model, tok, name = _load(args)
    prompts, prompt_source, eos_ids, pad = _prompts_and_ids(args, model, tok)
    greedy_prompts = prompts[: args.n_prompts]
    common = dict(eos_token_ids=eos_ids, pad_token_id=pad)
    runs, outputs = _run_engines(args, model, prompts, common)
    ref = outputs.get("a_reference_greedy")
    fast, static = outputs["b_fast_greedy"], outputs["c_static_greedy"]
    fp32 = _fp32_identity(args, model, greedy_prompts, common)

    plens = [len(p) for p in greedy_prompts]
    result = {
        "model": name,
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "dtype": args.dtype,
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "prompt_source": prompt_source,
        "prompt_len": {"min": min(plens), "mean": sum(plens) / len(plens), "max": max(plens)},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "runs": runs,
    }
    if ref is not None:
        plain = max(1e-9, runs["a_reference_greedy"]["tokens_per_s"])
        result["greedy_identity"] = _identity(ref, fast)
        result["greedy_identity_static"] = _identity(ref, static)
        result["speedup_fast_over_plain_greedy"] = runs["b_fast_greedy"]["tokens_per_s"] / plain
        result["speedup_static_over_plain_greedy"] = runs["c_static_greedy"]["tokens_per_s"] / plain
        result["speedup_static_sampling_over_plain_greedy"] = (
            runs["d_static_sampling"]["tokens_per_s"] / plain
        )
    if fp32 is not None:
        result["greedy_identity_fp32"] = fp32
    result["target_sampling_tok_s"] = 10000
    result["static_sampling_tok_s"] = runs["d_static_sampling"]["tokens_per_s"]

    _print_report(args, result, runs, plens, fp32)
    line = json.dumps(result, sort_keys=True)
    print(line)
    if args.out:
        args.out.write_text(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
