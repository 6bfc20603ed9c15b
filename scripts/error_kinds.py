"""Why an experiment's arms fail: each arm's evaluation statuses and its execution errors by kind.

    python scripts/error_kinds.py EXPERIMENT_DIR [--json OUT]

Reads every `arms/<arm>/eval/trajectories.jsonl` (or `.jsonl.gz`) of the folder and counts, per arm, the
reward statuses of the scored tasks (`match`, `mismatch`, `exec_error`, `no_sql`, `timeout`, ...;
`gold_unscorable` apart) and the execution errors by the kind of their SQLite message: the message up to
its first ": " (`no such column`, `no such table`, `ambiguous column name`), a syntax error (`near "X"`)
as `syntax error`, the rest as written up to 40 characters (`sqlrl.evaluation.errorkinds`). It reads
the trajectories, so it works on folders evaluated before results.jsonl held each error. Exit 2 when
the folder holds no evaluation.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import Counter
from pathlib import Path

from sqlrl.evaluation.errorkinds import error_kind


def _trajectories(eval_dir: Path) -> list[dict]:
    plain, packed = eval_dir / "trajectories.jsonl", eval_dir / "trajectories.jsonl.gz"
    opener = (lambda: plain.open()) if plain.is_file() else (lambda: gzip.open(packed, "rt"))
    with opener() as f:
        return [json.loads(line) for line in f if line.strip()]


def summarize(exp_dir: Path) -> dict:
    """{arm: {"scored", "statuses", "exec_errors"}} for every evaluated arm of `exp_dir`."""
    out = {}
    for eval_dir in sorted(exp_dir.glob("arms/*/eval")):
        if not any((eval_dir / f).is_file() for f in ("trajectories.jsonl", "trajectories.jsonl.gz")):
            continue
        statuses, errors = Counter(), Counter()
        for t in _trajectories(eval_dir):
            status = t["reward"]["status"]
            statuses[status] += 1
            if status == "exec_error":
                errors[error_kind(t["reward"]["parts"].get("message") or "")] += 1
        scored = sum(n for s, n in statuses.items() if s != "gold_unscorable")
        out[eval_dir.parent.name] = {
            "scored": scored,
            "statuses": dict(statuses.most_common()),
            "exec_errors": dict(errors.most_common()),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment", type=Path)
    ap.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = ap.parse_args(argv)
    arms = summarize(args.experiment)
    if not arms:
        print(f"error_kinds: no arms/*/eval with trajectories under {args.experiment}", file=sys.stderr)
        return 2
    for arm, s in arms.items():
        n = s["scored"]
        shares = ", ".join(
            f"{k} {v} ({v / n:.1%})" for k, v in s["statuses"].items() if k != "gold_unscorable"
        )
        print(f"{arm}: {n} scored: {shares}")
        if s["exec_errors"]:
            print("  exec_error: " + ", ".join(f"{k} {v}" for k, v in s["exec_errors"].items()))
    if args.json:
        args.json.write_text(json.dumps(arms, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
