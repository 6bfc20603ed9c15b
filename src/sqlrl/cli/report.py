"""`sqlrl report`: the evidence gate over an experiment folder, then report.md / report.html.

Takes no run-folder lock (`artifacts.lock_run_folder`): it only reads the runs, and the report files
it writes are rewritten whole (atomically) from them, so two reports of one folder write the same files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sqlrl.evidence.gate import evidence_gate
from sqlrl.evidence.report import write_report
from sqlrl.evidence.rundir import ExperimentError


def cli_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="sqlrl report",
        description="Apply the evidence gate to an experiment folder and write verdict.json, report.md, report.html. "
        "Exit 0 if a claim is allowed, 1 if not (the report is still written), 2 for a bad folder.",
    )
    ap.add_argument("exp_dir", metavar="EXP_DIR", help="experiment folder (written by `sqlrl experiment`)")
    ap.add_argument("--check", action="store_true", help="only print the verdict JSON; write nothing")
    ap.add_argument("--out", metavar="DIR", default=None, help="where to write the report (default: EXP_DIR)")
    ap.add_argument("--n-boot", type=int, default=10000, help="bootstrap resamples (default 10000)")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    ap.add_argument(
        "--data",
        metavar="DIR",
        default=None,
        help="Spider folder whose golds give accuracy by hardness (default: the one each eval run.json records)",
    )
    args = ap.parse_args(argv)
    problem = None
    if args.data is not None and not Path(args.data).is_dir():
        problem = f"--data {args.data}: no such folder; pass the Spider folder the arms were evaluated on"
    elif args.n_boot < 1:
        problem = f"--n-boot must be >= 1, got {args.n_boot}"
    elif args.seed < 0:
        problem = f"--seed {args.seed}: the bootstrap seed must be 0 or more"
    elif args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        problem = f"--out {args.out}: exists and is not a folder"
    if problem is not None:
        print(f"sqlrl report: {problem}", file=sys.stderr)
        return 2
    try:
        if args.check:
            verdict = evidence_gate(args.exp_dir)
            print(json.dumps(verdict.to_dict(), indent=2, ensure_ascii=False))
            return 0 if verdict.claim_allowed else 1
        paths = write_report(args.exp_dir, args.out, n_boot=args.n_boot, seed=args.seed, data=args.data)
    except ExperimentError as e:
        print(f"sqlrl report: {e}", file=sys.stderr)
        return 2
    verdict = json.loads(Path(paths["verdict"]).read_text(encoding="utf-8"))
    print(f"verdict: {verdict['verdict'].upper()}")
    for m in verdict["missing"]:
        print(f"  missing: {m}")
    if verdict.get("rl_over_sft"):
        print(verdict["rl_over_sft"]["line"])
    for key in ("html", "markdown", "verdict"):
        print(f"wrote {paths[key]}")
    return 0 if verdict["claim_allowed"] else 1
