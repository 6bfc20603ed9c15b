"""The quickstart's evaluation in float32 and in bfloat16 on CPU, side by side in one run.

    python bench/bench_quickstart_dtype.py [--model qwen2.5-coder-0.5b-instruct] [--rounds 2]

Each round evaluates the quickstart's 4 validation tasks (its budgets: 1 turn, 64 new tokens, schema
<= 1000 chars) once per dtype, in turns, with the model loaded fresh each time. Printed: generation
seconds per round and dtype, the median float32 / bfloat16 ratio, whether every bfloat16 round gave
the same tokens and log-probs (bit-reproducible), and on how many tasks bfloat16 wrote the same tokens
as float32. On a shared machine the load changes between rounds: read the ratio, not the seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from sqlrl.agent.loop import Budgets
from sqlrl.evaluation.runner import load_policy, run_eval
from sqlrl.experiment.matrix import QUICKSTART, load_experiment, packaged_config


def one_eval(model: str, dtype: str, cfg, out: Path) -> tuple[float, list]:
    policy = load_policy(model, device="cpu", dtype=dtype, engine=cfg.run.gen_engine, max_batch=64)
    run_eval(
        model=model,
        data="embedded",
        split=cfg.data.eval_split,
        out=out,
        budgets=Budgets.from_config(cfg.agent),
        limit=cfg.data.max_eval_tasks,
        seed=cfg.data.split_seed,
        split_seed=cfg.data.split_seed,
        val_fraction=cfg.data.val_fraction,
        policy=policy,
        sandbox_workers=1,
    )
    summary = json.loads((out / "summary.json").read_text())
    trajs = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines() if x.strip()]
    return summary["generation_s"], [(t["token_ids"], t["logprobs"]) for t in trajs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args(argv)
    cfg, _ = load_experiment(packaged_config(QUICKSTART))
    secs: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    outs: dict[str, list] = {"float32": [], "bfloat16": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for dtype in ("float32", "bfloat16"):
                s, o = one_eval(a.model, dtype, cfg, Path(tmp) / f"{dtype}-{r}")
                secs[dtype].append(s)
                outs[dtype].append(o)
                print(f"round {r} {dtype}: generation {s:.1f} s")
    ratio = statistics.median(f / b for f, b in zip(secs["float32"], secs["bfloat16"]))
    same_bf16 = all(o == outs["bfloat16"][0] for o in outs["bfloat16"])
    tokens_f32 = [t for t, _ in outs["float32"][0]]
    tokens_bf16 = [t for t, _ in outs["bfloat16"][0]]
    agree = sum(x == y for x, y in zip(tokens_f32, tokens_bf16))
    print(f"float32 / bfloat16 generation time, median of {a.rounds} rounds: {ratio:.2f}x")
    print(f"bfloat16 rounds bit-identical (tokens and log-probs): {same_bf16}")
    print(f"tasks where bfloat16 wrote float32's tokens: {agree} of {len(tokens_f32)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
