"""Scoring under the GRPO training deadline, step by step on real training streams, against the same
limit without the training rule for repeats.

    python bench/bench_score_deadline.py [--data ../shared/data/spider] [--run RESULTS_FOLDER]
        [--arms grpo,no_update,validity] [--workers 8] [--timeout 1.0] [--steps N] [--json OUT]

Workload: `arms/<arm>/train/sql.jsonl.gz` of a committed experiment (default
`results/2026-12-01-spider-0.5b-single-turn-seed3`, 24 steps x 256 samples per arm, with predictions
that run for seconds; `--run results/2026-12-02-spider-0.5b-sft-grpo100 --arms grpo_sft`: 100 steps),
one `score_many` per step, as the GRPO trainer scores it.

Both ways per step, in alternating order, each on its own sandbox of `--workers` workers (default 8,
the GPU config's `run.sandbox_workers`; on a 2-core machine 8 workers oversubscribe the cores):
- training: `Evaluator(timeout_s=--timeout)` (`grpo.score_timeout_s`): the repeats of a prediction
  cut at the deadline get copies of its timeout;
- limit only: a sandbox whose own limit is `--timeout`, `Evaluator` without `timeout_s` (what
  evaluation does): those repeats are scored again, in one more call.
The gold cache is warm and each step's gold cuts fetched before the clock starts (the trainer's gold
audit and prefetch). Printed per arm and overall: total seconds, slowest step, steps over 2 s, and
whether the verdicts agree (they may differ only where a repeat of a timeout finished on its rerun).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bench_reward_stream import load_stream  # noqa: E402
from sqlrl.reward.evaluator import Evaluator  # noqa: E402
from sqlrl.sql.sandbox import Sandbox  # noqa: E402
from sqlrl.tasks.data import SpiderData  # noqa: E402
from sqlrl.tasks.goldcache import GoldCache  # noqa: E402

RUN = "results/2026-12-01-spider-0.5b-single-turn-seed3"


def measure_arm(calls: list, tasks: dict, gc, kind: str, workers: int, timeout: float) -> dict:
    per = {"one": [], "two": []}  # "one": training rule, "two": limit only
    agree = True
    with Sandbox(workers=workers) as sb_train, Sandbox(workers=workers, timeout_s=timeout) as sb_limit:
        evs = {
            "one": Evaluator(sb_train, gc, kind=kind, test_suite=False, timeout_s=timeout),
            "two": Evaluator(sb_limit, gc, kind=kind, test_suite=False),
        }
        first = tasks[calls[0][0]["task_id"]].public.db_path
        for sb in (sb_train, sb_limit):
            sb.execute_many([(first, "SELECT 1")] * workers)
        for n, call in enumerate(calls):
            pairs = [(r["final_sql"], tasks[r["task_id"]]) for r in call]
            evs["one"].prefetch([t for _, t in pairs])
            verdicts = {}
            for way in ("one", "two") if n % 2 else ("two", "one"):
                t0 = time.perf_counter()
                got = evs[way].score_many(pairs)
                per[way].append(time.perf_counter() - t0)
                verdicts[way] = [(r.status, r.value) for r in got]
            agree = agree and verdicts["one"] == verdicts["two"]
    return {way: summary(v) for way, v in per.items()} | {"verdicts_agree": agree, "steps": len(calls)}


def summary(times: list[float]) -> dict:
    slow = max(range(len(times)), key=times.__getitem__)
    return {
        "total_s": round(sum(times), 3),
        "slowest_s": round(times[slow], 3),
        "slowest_step": slow + 1,
        "steps_over_2s": sum(t > 2.0 for t in times),
        "per_step_s": [round(t, 3) for t in times],
    }


def line(name: str, r: dict) -> str:
    o, t = r["one"], r["two"]
    return (
        f"{name}: training {o['total_s']:.2f} s, slowest step {o['slowest_s']:.2f} s (step {o['slowest_step']}), "
        f"{o['steps_over_2s']} over 2 s | limit only {t['total_s']:.2f} s, slowest {t['slowest_s']:.2f} s "
        f"(step {t['slowest_step']}), {t['steps_over_2s']} over 2 s | slowest limit-only/training "
        f"{t['slowest_s'] / max(o['slowest_s'], 1e-9):.2f}; verdicts agree: {r['verdicts_agree']}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "spider"))
    ap.add_argument("--run", default=str(ROOT / RUN))
    ap.add_argument("--arms", default="grpo,no_update,validity")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=1.0, help="the training deadline, seconds")
    ap.add_argument("--steps", type=int, default=None, help="only the first N steps of each arm")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    run = Path(args.run)
    tasks = {t.public.task_id: t for t in SpiderData(args.data).load("train_spider")}
    out: dict = {"run": str(run), "workers": args.workers, "cpu_count": os.cpu_count(), "arms": {}}
    out["timeout_s"] = args.timeout
    with tempfile.TemporaryDirectory() as tmp, GoldCache(Path(tmp) / "gold", workers=2) as gc:
        for arm in [a for a in args.arms.split(",") if a]:
            kind = json.loads((run / "arms" / arm / "train" / "config.json").read_text())["grpo"]["reward"]
            calls = load_stream(run, arm, args.steps)
            gc.get_many(
                sorted(
                    {
                        (tasks[r["task_id"]].public.db_path, tasks[r["task_id"]].gold_sql)
                        for c in calls
                        for r in c
                    }
                )
            )
            out["arms"][arm] = r = measure_arm(calls, tasks, gc, kind, args.workers, args.timeout)
            print(line(arm, r), flush=True)
    one = [s for r in out["arms"].values() for s in r["one"]["per_step_s"]]
    two = [s for r in out["arms"].values() for s in r["two"]["per_step_s"]]
    out["all"] = {"one": summary(one), "two": summary(two)}  # steps numbered over the arms, in order
    out["all"]["verdicts_agree"] = all(r["verdicts_agree"] for r in out["arms"].values())
    print(line("all arms (steps numbered across the arms)", out["all"] | {"steps": len(one)}))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
