"""`sqlrl reward`: score one predicted SQL against a gold SQL on one database."""

from __future__ import annotations

import argparse
import json
import os
import sys

from sqlrl.reward.evaluator import Evaluator


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="sqlrl reward",
        description="Score a predicted SQL against a gold SQL on one SQLite database (execution match, "
        "validity, and the test-suite metric). Prints value, status and parts as JSON.",
    )
    ap.add_argument("--db", required=True, help="path of the .sqlite database")
    ap.add_argument("--gold", required=True, help="the gold SQL")
    ap.add_argument("--pred", required=True, help="the predicted SQL ('' for none)")
    ap.add_argument("--kind", choices=("execution", "validity"), default="execution")
    ap.add_argument("--json", action="store_true", help="one compact JSON object on one line")
    return ap


def cli_main(argv: list[str] | None = None) -> int:
    ap = _parser()
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    if not os.path.isfile(args.db):
        print(f"sqlrl reward: database not found: {args.db}", file=sys.stderr)
        return 2
    from sqlrl.tasks.dbcheck import database_problem

    problem = database_problem(args.db)
    if problem is not None:
        print(f"sqlrl reward: database {args.db} is damaged: {problem}; restore the file", file=sys.stderr)
        return 2
    if not args.gold.strip():
        print("sqlrl reward: --gold is empty", file=sys.stderr)
        return 2
    from sqlrl.sql.sandbox import Sandbox
    from sqlrl.tasks.data import PrivateTask, PublicTask
    from sqlrl.tasks.goldcache import GoldCache

    db = os.path.abspath(args.db)
    task = PrivateTask(
        public=PublicTask(
            task_id="cli/00000",
            db_id=os.path.splitext(os.path.basename(db))[0],
            question="",
            schema="",
            evidence="",
            db_path=db,
        ),
        gold_sql=args.gold,
    )
    with Sandbox(workers=1) as sandbox, GoldCache(workers=1) as gold_cache:
        reward = Evaluator(sandbox, gold_cache, kind=args.kind).score(args.pred, task)
        if reward.status == "gold_unscorable":  # say why: the gold's own error, not just its reason
            why = getattr(gold_cache.get(db, args.gold), "message", "") or "no rows"
            print(
                f"sqlrl reward: the gold is excluded ({reward.parts.get('reason')}): {why[:500]}",
                file=sys.stderr,
            )
    out = {"value": reward.value, "status": reward.status, "parts": reward.parts}
    print(json.dumps(out, default=str) if args.json else json.dumps(out, indent=2, default=str))
    return 0
