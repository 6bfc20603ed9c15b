"""Multi-turn SFT traces (`training/sft_traces.py`) on a Spider folder's training golds: how many of each
kind are built, how long building takes, and how long the traces are beside the single-turn examples.

    python bench/sft_trace_lengths.py SPIDER_DIR TOKENIZER_DIR [--config FILE.toml] [--out LENS.json]

The run file's [data], [agent], [run] and [sft] tables (default configs/spider-0.5b-gpu-mt-warm.toml)
decide the tasks, budgets and mix, as `sqlrl sft` would. Printed: traces per kind, drop and move counts,
seconds per trace, and mean / median / max sequence tokens (prompt + target) of the traces and of the
single-turn examples of the same golds, with their ratio (SFT step time grows with it). `--out`
writes [prompt tokens, target tokens] per trace for `bench/bench_sft_step.py --lengths`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("spider_dir")
    ap.add_argument("tokenizer_dir")
    ap.add_argument("--config", default="configs/spider-0.5b-gpu-mt-warm.toml")
    ap.add_argument("--out")
    a = ap.parse_args(argv)

    from transformers import AutoTokenizer

    from sqlrl.agent.loop import Budgets
    from sqlrl.experiment.arms import sft_run_config
    from sqlrl.experiment.matrix import load_experiment
    from sqlrl.training.sft_data import build_text2sql_examples, load_text2sql_sft
    from sqlrl.training.sft_traces import build_text2sql_traces, trace_env

    cfg, exp = load_experiment(a.config, [f'data.path="{a.spider_dir}"'])
    cfg = sft_run_config(cfg, exp.turns[0])
    tok = AutoTokenizer.from_pretrained(a.tokenizer_dir)
    budgets = Budgets.from_config(cfg.agent)
    with tempfile.TemporaryDirectory() as tmp:
        tasks, _, _, audit, source = load_text2sql_sft(cfg, Path(tmp))
        single, _ = build_text2sql_examples(tasks, tok, budgets)
        with trace_env(cfg, source.gold_cache) as env:
            t0 = time.perf_counter()
            traces, dropped, mix = build_text2sql_traces(tasks, tok, budgets, exp.sft, env, cfg.run.seed)
            secs = time.perf_counter() - t0

    def lengths(examples):
        return [len(e["prompt_ids"]) + len(e["target_ids"]) for e in examples]

    lt, ls = lengths(traces), lengths(single)
    print(f"training golds (scorable): {len(tasks)} of {audit['n']}")
    print(f"traces built: {len(traces)}  mix requested {mix['requested']}  built {mix['built']}")
    print(f"moved (a kind could not use the task): {mix['moved']}  dropped: {dropped}")
    print(f"building: {secs:.1f} s, {1000 * secs / max(1, len(tasks)):.1f} ms per gold")
    for name, xs in (("traces", lt), ("single-turn", ls)):
        print(
            f"{name}: mean {statistics.mean(xs):.0f}  median {statistics.median(xs):.0f}  max {max(xs)} tokens"
        )
    print(
        f"ratio traces / single-turn (mean sequence tokens): {statistics.mean(lt) / statistics.mean(ls):.2f}"
    )
    if a.out:
        Path(a.out).write_text(json.dumps([[len(e["prompt_ids"]), len(e["target_ids"])] for e in traces]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
