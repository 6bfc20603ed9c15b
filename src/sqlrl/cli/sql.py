"""`sqlrl sql`: one statement in the read-only sandbox."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from sqlrl.sql.sandbox import Sandbox


def cli_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="sqlrl sql",
        description="Run one SQL statement on a SQLite file in the hardened read-only sandbox. "
        "Exits 0 whatever the SQL did (the status says what happened); 2 on usage errors.",
    )
    p.add_argument("--db", required=True, help="path of the .sqlite file")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--timeout", type=float, default=5.0, help="time limit in seconds (default 5)")
    p.add_argument("--max-rows", type=int, default=100_000, help="row cap (default 100000)")
    p.add_argument("--show-rows", type=int, default=20, help="rows shown in text mode (default 20)")
    p.add_argument("sql", help="the SQL statement")
    a = p.parse_args(argv)
    if not os.path.isfile(a.db):
        print(f"sqlrl sql: no database file at {a.db}", file=sys.stderr)
        return 2
    if not (math.isfinite(a.timeout) and a.timeout > 0):
        print(
            f"sqlrl sql: --timeout must be a finite number of seconds > 0, got {a.timeout}", file=sys.stderr
        )
        return 2
    if a.max_rows < 0 or a.show_rows < 0:
        print("sqlrl sql: --max-rows and --show-rows must be >= 0", file=sys.stderr)
        return 2
    from sqlrl.tasks.dbcheck import database_problem

    problem = database_problem(a.db)
    if problem is not None:
        print(f"sqlrl sql: database {a.db} is damaged: {problem}; restore the file", file=sys.stderr)
        return 2
    with Sandbox(workers=1, timeout_s=a.timeout, max_rows=a.max_rows) as sb:
        res = sb.execute(a.db, a.sql)
    if a.json:
        print(json.dumps(res.to_dict(), ensure_ascii=False))
    else:
        print(res.render(max_rows=a.show_rows, max_chars=1_000_000))
    return 0
