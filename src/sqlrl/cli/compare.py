"""`sqlrl compare A B`: paired comparison of two evaluation runs (`sqlrl.evidence.pair`). Reads only."""

from __future__ import annotations

import argparse
import json
import sys


def cli_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="sqlrl compare",
        description="Compare evaluation run B against A on the tasks scored in both: accuracy difference with a "
        "paired bootstrap CI, exact McNemar test, format-repair vs answer-change split, and the run.json "
        "settings that differ. Exit 0, or 2 for a folder that cannot be compared.",
    )
    ap.add_argument(
        "a", metavar="A", help="`sqlrl eval` folder (or an arm's eval/ folder, or its results.jsonl)"
    )
    ap.add_argument("b", metavar="B", help="the run compared against A (same forms)")
    ap.add_argument("--json", metavar="FILE", help="also write the comparison as JSON to FILE")
    ap.add_argument("--n-boot", type=int, default=10000, help="bootstrap resamples (default 10000)")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    args = ap.parse_args(argv)
    if args.n_boot < 1:
        ap.error(f"--n-boot must be >= 1, got {args.n_boot}")
    from sqlrl.cli.outdir import check_report_file
    from sqlrl.evidence.pair import CompareError, compare_runs, format_comparison

    try:
        if args.seed < 0:
            raise ValueError(f"--seed {args.seed}: the bootstrap seed must be 0 or more")
        if args.json:
            check_report_file(args.json, "--json")
        c = compare_runs(args.a, args.b, n_boot=args.n_boot, seed=args.seed)
    except (CompareError, ValueError) as e:
        print(f"sqlrl compare: {e}", file=sys.stderr)
        return 2
    print(format_comparison(c))
    if args.json:
        from sqlrl.artifacts import write_json_atomic

        try:
            write_json_atomic(args.json, json.loads(json.dumps(c.to_dict())))
        except OSError as e:  # what `check_report_file` cannot foresee, e.g. a folder that cannot be made
            print(
                f"sqlrl compare: --json {args.json}: cannot write it ({e.strerror}); give another path",
                file=sys.stderr,
            )
            return 2
        print(f"wrote {args.json}")
    return 0
