"""`sqlrl seeds`: the across-seed verdict over experiment folders that differ only in run.seed.

Takes no run-folder lock (`artifacts.lock_run_folder`): it only reads the experiment folders, and the
summary files it writes are rewritten whole (atomically) from them, the same for every invocation.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sqlrl.evidence.rundir import Experiment, ExperimentError
from sqlrl.evidence.seeds import summarize, write_summary


def cli_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="sqlrl seeds",
        description="Summarise one experiment matrix run with several training seeds (run.seed): consistency "
        "checks, each folder's evidence gate, per-seed and across-seed comparisons, RL over the SFT-only control "
        "(a separate claim that does not change the exit code) and grpo_sft vs its SFT start (information). "
        "Writes seeds.json, seeds.md and seeds.html. "
        "Exit 0 if a claim across seeds is allowed, 1 if not (the files are still written), 2 for bad folders.",
    )
    ap.add_argument(
        "exp_dirs", nargs="+", metavar="EXP_DIR", help="experiment folders, one per training seed"
    )
    ap.add_argument(
        "--out", metavar="DIR", required=True, help="folder for seeds.json, seeds.md and seeds.html"
    )
    ap.add_argument("--n-boot", type=int, default=10000, help="bootstrap resamples (default 10000)")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    args = ap.parse_args(argv)
    problem = None
    if args.n_boot < 1:
        problem = f"--n-boot must be >= 1, got {args.n_boot}"
    elif args.seed < 0:
        problem = f"--seed {args.seed}: the bootstrap seed must be 0 or more"
    elif Path(args.out).exists() and not Path(args.out).is_dir():
        problem = f"--out {args.out}: exists and is not a folder"
    else:
        real = [os.path.realpath(d) for d in args.exp_dirs]
        twice = [d for i, d in enumerate(args.exp_dirs) if real[i] in real[:i]]
        if twice:
            problem = f"{twice[0]} is given twice (the same folder); give each seed's experiment folder once"
    if problem is not None:
        print(f"sqlrl seeds: {problem}", file=sys.stderr)
        return 2
    try:
        for d in args.exp_dirs:
            if not Experiment(d).arms:
                raise ExperimentError(
                    f"{d}: its experiment.json lists no arms; give experiment folders `sqlrl experiment` wrote"
                )
        s = summarize(args.exp_dirs, n_boot=args.n_boot, seed=args.seed)
    except ExperimentError as e:
        print(f"sqlrl seeds: {e}", file=sys.stderr)
        return 2
    paths = write_summary(s, args.out)
    print(f"verdict across seeds: {s['verdict'].upper()}")
    for p in s["problems"]:
        print(f"  {p}")
    print(s["rl_over_sft"]["line"])
    print(s["grpo_sft_vs_sft_start"]["line"])
    for path in paths.values():
        print(f"wrote {path}")
    return 0 if s["claim_allowed"] else 1
