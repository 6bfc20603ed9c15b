"""Seconds per supervised fine-tuning step (`training.sft.sft_step`) at the real example lengths, to size
`sft.steps` so that the sft arm gets at least the GRPO arm's training time.

    python bench/bench_sft_step.py --model-config CONFIG.json --lengths LENS.json [--batch 32] \
        [--micro 8 16] [--steps 12]

`--model-config`: a Hugging Face config.json (e.g. the 0.5B's from the model cache); the model is built
with random weights (time per step does not depend on the values), float32 master weights and bf16
autocast as `sqlrl sft` trains on CUDA. `--lengths`: a JSON list of [prompt tokens, target tokens] per
SFT example (`build_text2sql_examples` on the real training tasks). Each micro-batch size runs
`--steps` steps of `--batch` examples drawn in a fixed order (seed 0) after 2 warm-up steps. Printed per
micro-batch size: median and mean seconds per step, examples per second, peak GPU memory, and the steps
that fit into `--match` seconds (the GRPO arm's train_seconds; default 152.64, seed 3 of the 0.5B).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-config", required=True)
    ap.add_argument("--lengths", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--micro", type=int, nargs="+", default=[8])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--match", type=float, default=152.64)
    a = ap.parse_args(argv)

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from sqlrl.config_tables import SFTConfig
    from sqlrl.training.sft import sft_step
    from sqlrl.training.trainer import make_optimizer

    lens = json.load(open(a.lengths))
    mcfg = AutoConfig.from_pretrained(a.model_config)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(mcfg, torch_dtype=torch.float32).to("cuda")
    params = [p for p in model.parameters() if p.requires_grad]
    rng = random.Random(0)
    V = mcfg.vocab_size
    for micro in a.micro:
        sft = SFTConfig(batch_size=a.batch, micro_batch=micro)
        opt, sched = make_optimizer(params, 1e-5, 0.0, 0)
        torch.cuda.reset_peak_memory_stats()
        times = []
        for i in range(a.steps + 2):
            batch = []
            for p, t in rng.sample(lens, a.batch):
                batch.append(
                    {
                        "prompt_ids": [rng.randrange(V) for _ in range(p)],
                        "target_ids": [rng.randrange(V) for _ in range(t)],
                    }
                )
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            sft_step(model, opt, sched, params, batch, sft, 0, "cuda", torch.bfloat16)
            torch.cuda.synchronize()
            if i >= 2:
                times.append(time.perf_counter() - t0)
        med, mean = statistics.median(times), statistics.fmean(times)
        print(
            json.dumps(
                {
                    "micro_batch": micro,
                    "batch": a.batch,
                    "s_per_step_median": round(med, 4),
                    "s_per_step_mean": round(mean, 4),
                    "examples_per_s": round(a.batch / mean, 1),
                    "peak_gpu_gb": round(torch.cuda.max_memory_allocated() / 2**30, 1),
                    "steps_in_match_s": int(a.match / mean),
                    "epoch_steps": len(lens) // a.batch,
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
