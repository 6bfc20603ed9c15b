"""`sqlrl data audit` / `sqlrl data split`: inspect a Spider- or BIRD-layout folder."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from sqlrl.tasks.bird import open_data
from sqlrl.tasks.data import DataError, embedded_root


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sqlrl data", description="Inspect a Spider- or BIRD-layout data folder."
    )
    sub = p.add_subparsers(dest="cmd", metavar="{audit,split}")
    a = sub.add_parser("audit", help="execute every gold once and report which are unscorable and why")
    a.add_argument(
        "--data",
        default=None,
        help="Spider- or BIRD-layout folder, or embedded (the default): the embedded demo subset",
    )
    a.add_argument(
        "--split", default=None, help="split to audit (default: the training file, e.g. train_spider)"
    )
    a.add_argument(
        "--seed", type=int, default=0, help="seed of the by-database split (train/validation only)"
    )
    a.add_argument(
        "--val-fraction", type=float, default=0.1, help="validation fraction (train/validation only)"
    )
    a.add_argument(
        "--cache",
        default=None,
        help="gold cache folder (default: in memory only); keep it outside the data folder",
    )
    a.add_argument("--timeout", type=float, default=60.0, help="per-gold timeout in seconds (default 60)")
    a.add_argument("--workers", type=int, default=2, help="sandbox worker processes (default 2)")
    a.add_argument("--json", action="store_true", help="print JSON")
    a.add_argument("--per-task", action="store_true", help="with --json: include task_id -> reason")
    a.add_argument(
        "--continue-on-damaged",
        action="store_true",
        help="exit 0 when a database is damaged (its tasks are excluded as database_damaged either way; "
        "without this flag the audit then exits 2)",
    )
    s = sub.add_parser("split", help="show the deterministic by-database train/validation split")
    s.add_argument(
        "--data",
        default=None,
        help="Spider-layout folder, or embedded (the default): the embedded demo subset",
    )
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--val-fraction", type=float, default=0.1)
    s.add_argument("--json", action="store_true", help="print JSON (what split.json holds)")
    return p


def _audit(args: argparse.Namespace) -> int:
    from sqlrl.cli.outdir import make_folder
    from sqlrl.tasks.goldcache import GoldCache, audit_golds

    data = open_data(args.data or embedded_root())
    split = args.split or data.training_file()
    if args.cache:
        cache_dir = Path(args.cache).expanduser().resolve()
        if cache_dir == data.root or data.root in cache_dir.parents:
            raise DataError(
                f"--cache {cache_dir} is inside the data folder {data.root}; the gold cache must live "
                "outside any folder the policy can reach. Choose e.g. ~/.cache/sqlrl/gold"
            )
        try:
            make_folder(cache_dir, "--cache")
        except ValueError as e:
            raise DataError(str(e)) from None
    t0 = time.perf_counter()
    tasks = data.load(split, seed=args.seed, val_fraction=args.val_fraction)
    fp = data.fingerprint(split, seed=args.seed, val_fraction=args.val_fraction)
    with GoldCache(args.cache, timeout_s=args.timeout, workers=args.workers) as cache:
        audit = audit_golds(tasks, cache)
    elapsed = time.perf_counter() - t0
    out: dict[str, Any] = {
        "data": str(data.root),
        "split": split,
        "examples": len(tasks),
        "databases": len({t.db_id for t in tasks}),
        "scorable": audit.scorable,
        "excluded": dict(sorted(audit.excluded.items())),
        "fingerprint": fp,
        "cache": str(Path(args.cache).expanduser().resolve()) if args.cache else None,
        "cache_hits": audit.cache_hits,
        "executed": audit.executed,
        "elapsed_s": round(elapsed, 2),
        "damaged_databases": dict(sorted(audit.damaged.items())),
    }
    if args.json:
        if args.per_task:
            out["per_task"] = audit.per_task
        print(json.dumps(out, indent=2))
    else:
        rows = [
            ("data", out["data"]),
            ("split", split),
            ("examples", out["examples"]),
            ("databases", out["databases"]),
            ("scorable", out["scorable"]),
            ("excluded", sum(audit.excluded.values())),
        ]
        rows += [(f"  {k}", v) for k, v in out["excluded"].items()]
        rows += [
            ("fingerprint", fp),
            ("cache", out["cache"] or "(memory only)"),
            ("executed", audit.executed),
            ("elapsed_s", out["elapsed_s"]),
        ]
        width = max(len(k) for k, _ in rows)
        for k, v in rows:
            print(f"{k.ljust(width)}  {v}")
        if audit.damaged:
            print(
                f"\ndamaged databases ({len(audit.damaged)}; their tasks are excluded as database_damaged):"
            )
            for path, problem in sorted(audit.damaged.items()):
                print(f"  {path}: {problem}")
        unscorable = [(tid, r) for tid, r in audit.per_task.items() if r]
        if unscorable:
            print(f"\nfirst unscorable tasks ({min(10, len(unscorable))} of {len(unscorable)}):")
            for tid, r in unscorable[:10]:
                print(f"  {tid}  {r}")
    if audit.damaged and not args.continue_on_damaged:
        names = ", ".join(Path(p).stem for p in sorted(audit.damaged))
        print(
            f"sqlrl data audit: error: {len(audit.damaged)} damaged database(s) ({names}; problems above), "
            f"{audit.excluded.get('database_damaged', 0)} tasks excluded; replace the files, or pass "
            "--continue-on-damaged to accept the exclusion",
            file=sys.stderr,
        )
        return 2
    return 0


def _split(args: argparse.Namespace) -> int:
    data = open_data(args.data or embedded_root())
    info = data.split_info(seed=args.seed, val_fraction=args.val_fraction)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"data        {info['data_root']}")
    print(f"source      {info['source']}  (seed {info['seed']}, val_fraction {info['val_fraction']})")
    for name in ("train", "validation"):
        side = info[name]
        print(
            f"{name.ljust(11)} {side['n_databases']} databases, {side['n_examples']} examples, "
            f"fingerprint {side['fingerprint']}"
        )
        print(f"{''.ljust(11)} {', '.join(side['db_ids'])}")
    return 0


def cli_main(argv: list[str] | None = None) -> int:
    """`sqlrl data audit ...` / `sqlrl data split ...`. Returns the exit code (2 on bad input)."""
    parser = _parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:  # argparse already printed the message
        return int(e.code or 0)
    if args.cmd is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        if args.cmd == "audit":
            if not 0 < args.timeout < math.inf or args.workers < 1:
                raise DataError(
                    f"--timeout {args.timeout} / --workers {args.workers}: give a finite --timeout > 0 "
                    "seconds and --workers >= 1"
                )
            return _audit(args)
        return _split(args)
    except DataError as e:
        print(f"sqlrl data {args.cmd}: error: {e}", file=sys.stderr)
        return 2
