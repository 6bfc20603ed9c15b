"""Peak GPU memory of each GRPO update pass, with and without `grpo.micro_batch_tokens` and with the
rollout engine's cache held or dropped, at the prompt lengths of configs/spider-0.5b-gpu-sv3.toml.

    bash scripts/gpu.sh setup   (as scripts/gpu.sh says), then
    GPU_CONFIG=configs/spider-0.5b-gpu-sv3.toml bash scripts/gpu.sh updmem --out $OUT/update_memory.json
    (= python3 scripts/gpu_update_memory.py --config configs/spider-0.5b-gpu-sv3.toml --out FILE
       [--prompt-tokens 500,800,1100,1400,1700,2000,2400,2816] [--completion-tokens 16,32,64,96]
       [--budgets 8192,16384,32768] [--modes held,released,budget])

The models are the trainer's (`build_models`: float32 master weights, a bfloat16 generation copy with
the config's engine and `run.gen_max_batch`), AdamW state allocated by one real update first. Then the
policy generates for `prompts_per_step` x `group_size` synthetic prompts of the given lengths (cycled;
64 new tokens), so the static engine's KV cache and CUDA graphs exist as after a training step's
rollouts, and `update.update_policy` runs on synthetic trajectories (prompt + completion of the given
lengths, advantages +-1), once per mode: `held` (engine kept, the config's caps: the trainer before
this change), `released` (engine dropped, the config's caps), `budget` (engine dropped, each of
`--budgets` as `micro_batch_tokens`). Per pass: trajectories, padded length, logit columns and
`torch.cuda.max_memory_allocated`; per mode: memory allocated before the update, out-of-memory retries
and their adjustments, the error if the update failed, and generation seconds with a new engine
(`generate_cold_s`) and, in `held`, a kept one (`generate_warm_s`: the cost of dropping it per step).
Written to --out (JSON). Exit 1 when an update with the engine dropped failed.
The lengths are synthetic (the real sv3 distribution was not available where this was written); prompts
are capped at agent.max_context_tokens - agent.max_new_tokens as the agent caps them. Needs CUDA (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _trajectories(n_prompts: int, group: int, prompt_lens: list[int], completion_lens: list[int], vocab: int):
    """`n_prompts` x `group` trajectories: prompt lengths cycled per prompt, completion lengths per sample."""
    import random
    from types import SimpleNamespace as NS

    rng = random.Random(0)
    out = []
    for i in range(n_prompts):
        p = prompt_lens[i % len(prompt_lens)]
        prompt = [rng.randrange(100, vocab - 100) for _ in range(p)]
        for j in range(group):
            c = completion_lens[(i + j) % len(completion_lens)]
            gen = [rng.randrange(100, vocab - 100) for _ in range(c)]
            out.append(
                NS(
                    token_ids=prompt + gen,
                    loss_mask=[0] * p + [1] * c,
                    logprobs=[0.0] * p + [-1.0] * c,
                    generated_tokens=c,
                )
            )
    return out


def _measure(learner, trajs, adv, g, caps, step: int) -> dict:
    """One update with a peak-memory reading per pass (each pass starts with `build_batch`)."""
    import torch

    from sqlrl.training import update as U

    passes: list[dict] = []
    real_build = U.build_batch

    def close_pass():
        if passes and "peak_gb" not in passes[-1]:
            passes[-1]["peak_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)

    def build(mb, a, device, pad):
        close_pass()
        torch.cuda.reset_peak_memory_stats()
        b = real_build(mb, a, device, pad)
        t = b["input_ids"].shape
        passes.append({"trajectories": t[0], "padded_length": t[1], "logit_columns": b["keep"]})
        return b

    U.build_batch = build
    before = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    res: dict = {"allocated_before_update_gb": round(before / 1e9, 2), "error": None}
    try:
        u = U.update_policy(learner, trajs, adv, g, step, caps)
        close_pass()
        res.update(oom_retries=u.oom_retries, memory_adjustments=u.memory_adjustments)
        res["caps_used"] = {
            "micro_batch_logit_tokens": u.caps.logit_tokens,
            "micro_batch_tokens": u.caps.tokens,
        }
    except Exception as e:  # noqa: BLE001 - reported
        close_pass()
        res["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        U.build_batch = real_build
    res["update_s"] = round(time.perf_counter() - t0, 2)
    res["passes"] = passes
    res["peak_gb"] = max((p.get("peak_gb", 0.0) for p in passes), default=0.0)
    return res


def _timed(policy, prompts) -> float:
    """Seconds of one rollout-like generation (64 new tokens, temperature 1)."""
    import torch

    t0 = time.perf_counter()
    policy.generate(prompts, max_new_tokens=64, temperature=1.0, seed=0)
    torch.cuda.synchronize()
    return round(time.perf_counter() - t0, 2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--config", default="configs/spider-0.5b-gpu-sv3.toml")
    ap.add_argument("--prompt-tokens", default="500,800,1100,1400,1700,2000,2400,2816")
    ap.add_argument("--completion-tokens", default="16,32,64,96")
    ap.add_argument("--budgets", default="8192,16384,32768")
    ap.add_argument("--modes", default="held,released,budget")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("gpu_update_memory: needs a CUDA GPU", file=sys.stderr)
        return 2
    from sqlrl import config as C
    from sqlrl.generation.device import free_memory
    from sqlrl.training.trainer import build_models, make_optimizer, pad_token_id
    from sqlrl.training.update import Learner, PassCaps, update_policy

    cfg = C.load(args.config, ['run.device="cuda"'])
    g, a = cfg.grpo, cfg.agent
    limit = a.max_context_tokens - a.max_new_tokens
    prompt_lens = [min(p, limit) for p in _ints(args.prompt_tokens)]
    m = build_models(cfg, "cuda", "bfloat16")
    params = [p for p in m.train.parameters() if p.requires_grad]
    optimizer, scheduler = make_optimizer(params, g.lr, g.weight_decay, g.warmup_steps, betas=g.betas)
    learner = Learner(
        m.train, m.ref, optimizer, scheduler, params, "cuda", pad_token_id(m.tokenizer), torch.bfloat16
    )
    vocab = m.train.config.vocab_size
    trajs = _trajectories(g.prompts_per_step, g.group_size, prompt_lens, _ints(args.completion_tokens), vocab)
    adv = torch.tensor([1.0 if i % 2 else -1.0 for i in range(len(trajs))])
    update_policy(learner, trajs[:2], adv[:2], g, 0, PassCaps(0, 0))  # AdamW state exists from now on
    m.sync()
    prompts = [t.token_ids[: len(t.token_ids) - t.generated_tokens] for t in trajs]
    config_caps = PassCaps(g.micro_batch_logit_tokens, g.micro_batch_tokens)
    runs = []
    for mode in args.modes.split(","):
        for budget in _ints(args.budgets) if mode == "budget" else [None]:
            m.policy.release_memory()
            times = {"generate_cold_s": _timed(m.policy, prompts)}  # engine and graphs built anew
            if mode == "held":
                times["generate_warm_s"] = _timed(m.policy, prompts)  # what keeping them saves
            else:
                m.policy.release_memory()
            caps = config_caps if budget is None else PassCaps(g.micro_batch_logit_tokens, budget)
            r = _measure(learner, trajs, adv, g, caps, len(runs) + 1)
            runs.append({"mode": mode, "micro_batch_tokens": caps.tokens, **times, **r})
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "passes"}), flush=True)
            m.sync()
            free_memory()
    out = {
        "config": args.config,
        "model": cfg.model.name,
        "gpu": torch.cuda.get_device_name(0),
        "gpu_total_gb": round(torch.cuda.get_device_properties(0).total_memory / 1e9, 1),
        "engine": m.policy.engine,
        "gen_max_batch": cfg.run.gen_max_batch,
        "micro_batch": g.micro_batch,
        "gradient_checkpointing": cfg.model.gradient_checkpointing,
        "trajectories": len(trajs),
        "prompt_tokens": prompt_lens,
        "completion_tokens": _ints(args.completion_tokens),
        "runs": runs,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0 if all(r["error"] is None for r in runs if r["mode"] != "held") else 1


if __name__ == "__main__":
    sys.exit(main())
