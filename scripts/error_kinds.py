"""Why an experiment's arms fail: each arm's evaluation statuses and its execution errors by kind.

    python scripts/error_kinds.py EXPERIMENT_DIR [--data SPIDER_DIR] [--json OUT]

Reads every `arms/<arm>/eval/results.jsonl` of the folder and counts, per arm, the statuses of the
scored tasks (`match`, `mismatch`, `exec_error`, `no_sql`, `timeout`; the `n` of summary.json), the
excluded ones by status apart, and the execution errors by kind, as the report's "What does not
execute" counts them (`sqlrl.evaluation.errorkinds`: a row's `error`, else its trajectory's message
from trajectories.jsonl or .jsonl.gz, for an older folder). With `--data` (the evaluation's data folder)
also where each `no such column` error's column is in its database (`missing_column_place`: in a table
the query names, only in tables it does not name, in no table). Exit 2 when the folder holds no
evaluation.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import Counter
from pathlib import Path

from sqlrl.evaluation.errorkinds import exec_error_kinds, exec_errors, missing_column_place


def _jsonl(plain: Path) -> list[dict]:
    packed = plain.with_name(plain.name + ".gz")
    if not plain.is_file() and not packed.is_file():
        return []
    with plain.open() if plain.is_file() else gzip.open(packed, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def missing_columns(rows: list[dict], trajectories, data) -> dict[str, int]:
    """{place: count} over the `no such column` errors of `rows` (`data`: a SpiderData)."""
    from sqlrl.tasks.schemainfo import schema_info

    places: Counter = Counter()
    for r, message in exec_errors(rows, trajectories):
        if not (message or "").startswith("no such column"):
            continue
        units = schema_info(data.db_path(r["db_id"])).units
        places[
            missing_column_place(message, r.get("final_sql") or "", {u.name: u.columns for u in units})
        ] += 1
    return dict(places.most_common())


def summarize(exp_dir: Path, data=None) -> dict:
    """{arm: {"scored", "statuses", "excluded", "exec_errors"[, "missing_columns"]}} for every evaluated
    arm of `exp_dir` (`missing_columns` with `data`, a SpiderData)."""
    out = {}
    for eval_dir in sorted(exp_dir.glob("arms/*/eval")):
        rows = _jsonl(eval_dir / "results.jsonl")
        if not rows:
            continue
        scored = [r for r in rows if r.get("reward") is not None]
        trajectories = eval_dir / "trajectories.jsonl"
        out[eval_dir.parent.name] = {
            "scored": len(scored),
            "statuses": dict(Counter(r["status"] for r in scored).most_common()),
            "excluded": dict(Counter(r["status"] for r in rows if r.get("reward") is None).most_common()),
            "exec_errors": exec_error_kinds(scored, lambda p=trajectories: _jsonl(p)),
        }
        if data is not None:
            out[eval_dir.parent.name]["missing_columns"] = missing_columns(
                scored, lambda p=trajectories: _jsonl(p), data
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment", type=Path)
    ap.add_argument("--data", type=Path, help="the evaluation's data folder: where missing columns are")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = ap.parse_args(argv)
    from sqlrl.tasks.data import DataError, SpiderData

    try:
        arms = summarize(args.experiment, None if args.data is None else SpiderData(args.data))
    except DataError as e:  # no such data folder, or it lacks a database an evaluation used
        print(f"error_kinds: {e}", file=sys.stderr)
        return 2
    if not arms:
        print(f"error_kinds: no arms/*/eval/results.jsonl under {args.experiment}", file=sys.stderr)
        return 2
    for arm, s in arms.items():
        n = s["scored"]
        shares = ", ".join(f"{k} {v} ({v / n:.1%})" for k, v in s["statuses"].items())
        print(f"{arm}: {n} scored: {shares}")
        if s["exec_errors"]:
            print("  exec_error: " + ", ".join(f"{k} {v}" for k, v in s["exec_errors"].items()))
        if s.get("missing_columns"):
            print("  no such column: " + ", ".join(f"{k} {v}" for k, v in s["missing_columns"].items()))
    if args.json:
        args.json.write_text(json.dumps(arms, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
