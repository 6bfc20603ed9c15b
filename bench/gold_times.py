"""Bare execution time of every Spider train gold: how long a correct prediction may need.

    python bench/gold_times.py [--data ../shared/data/spider] [--split train_spider]

Each gold executed once on an open read-only connection (reward_scorers.bare_exec, 10 s deadline),
slowest first: the figure `grpo.score_timeout_s` (training's statement limit on predictions) is set
against (default 1 s: about twice the slowest gold on a loaded 2-core CPU).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from reward_scorers import bare_exec  # noqa: E402
from sqlrl.tasks.data import SpiderData  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "spider"))
    ap.add_argument("--split", default="train_spider")
    a = ap.parse_args(argv)
    tasks = SpiderData(a.data).load(a.split)
    conns: dict = {}
    times = sorted(
        (
            (*bare_exec(conns, t.public.db_path, t.gold_sql, 10.0), t.public.task_id, t.gold_sql)
            for t in tasks
        ),
        key=lambda x: -x[0],
    )
    print(
        f"{len(times)} golds of {a.split}; over 0.1 s: {sum(d > 0.1 for d, *_ in times)}, over 0.5 s: "
        f"{sum(d > 0.5 for d, *_ in times)}, over 1 s: {sum(d > 1 for d, *_ in times)}"
    )
    for dt, ok, tid, sql in times[:5]:
        print(f"  {dt:.3f} s {'ok' if ok else 'FAILED'} {tid}: {sql[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
