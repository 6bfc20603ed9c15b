"""The gold audit: which tasks of a split can be scored, and why the others cannot.

`audit_golds(tasks, cache)` checks each task's database once (`sqlrl.tasks.dbcheck`), then executes
(or looks up) every gold of the usable databases in a `sqlrl.tasks.goldcache.GoldCache`, and returns a
`GoldAudit`: per task None (scorable) or the reason it is excluded: `database_damaged` (the file failed
the check; its golds are not run), else the gold's `GoldResult.unscorable_reason` (`gold_error`,
`gold_timeout`, `gold_empty`, `gold_too_many_rows`, `gold_too_large`, `gold_unstable`). Re-exported by
`sqlrl.tasks.goldcache`. `no_bars()`: no audit draws its tqdm bar meanwhile (an experiment's one progress
line).
"""

from __future__ import annotations

import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlrl.tasks.data import PrivateTask
from sqlrl.tasks.dbcheck import DAMAGED_REASON, database_problem

__all__ = ["GoldAudit", "audit_golds", "no_bars"]

_NO_BARS: list[bool] = []  # non-empty inside `no_bars()`


@contextmanager
def no_bars():
    """Within: `audit_golds` draws no tqdm bar unless a caller asks for one (`progress=True`), and logs a
    line before and after executing 100 golds or more; for the whole process, every thread included."""
    _NO_BARS.append(True)
    try:
        yield
    finally:
        _NO_BARS.pop()


@dataclass
class GoldAudit:
    n: int
    scorable: int
    excluded: Counter = field(default_factory=Counter)  # reason -> count
    per_task: dict[str, str | None] = field(default_factory=dict)  # task_id -> reason | None
    cache_hits: int = 0  # golds served without executing (cache, or a duplicate (db, sql) in the batch)
    executed: int = 0  # golds executed by this audit
    elapsed_s: float = 0.0
    damaged: dict[str, str] = field(default_factory=dict)  # database path -> problem (its tasks excluded)

    def to_dict(self) -> dict:
        return {
            "n": self.n,
            "scorable": self.scorable,
            "excluded": dict(sorted(self.excluded.items())),
            "per_task": dict(self.per_task),
            "cache_hits": self.cache_hits,
            "executed": self.executed,
            "elapsed_s": round(self.elapsed_s, 3),
            "damaged_databases": dict(sorted(self.damaged.items())),
        }


def audit_golds(tasks: list[PrivateTask], cache: Any, *, progress: bool | None = None) -> GoldAudit:
    """Execute (or look up) every task's gold and count which are unscorable, by reason.

    Each database is first checked (`sqlrl.tasks.dbcheck.database_problem`, once per process); the
    tasks of a damaged one are excluded as `database_damaged` without running their golds, and the
    audit's `damaged` names each such file with its problem.
    Shows a tqdm bar on stderr when at least 100 golds need executing; inside `no_bars()` a log line
    before and after instead (override with `progress`).
    """
    quiet = progress is None and bool(_NO_BARS)  # a line before and after a long audit instead of a bar
    for t in tasks:
        if not isinstance(t, PrivateTask):
            raise TypeError(f"audit_golds needs PrivateTask (it needs the gold), got {type(t).__name__}")
    t0 = time.perf_counter()
    hits_before, misses_before = cache.hits, cache.misses
    problems: dict[str, str | None] = {}
    for t in tasks:
        if t.public.db_path not in problems:
            problems[t.public.db_path] = database_problem(t.public.db_path)
    usable = [t for t in tasks if problems[t.public.db_path] is None]
    results = cache.get_many(
        [(t.public.db_path, t.gold_sql) for t in usable],
        progress=False if quiet else progress,
        desc="gold audit",
        log_long=quiet,
    )
    by_id = {t.task_id: r for t, r in zip(usable, results)}
    per_task: dict[str, str | None] = {}
    excluded: Counter = Counter()
    for t in tasks:
        r = by_id.get(t.task_id)
        reason = DAMAGED_REASON if r is None else r.unscorable_reason
        per_task[t.task_id] = reason
        if reason is not None:
            excluded[reason] += 1
    return GoldAudit(
        n=len(tasks),
        scorable=sum(1 for r in results if r.scorable),
        damaged={p: why for p, why in problems.items() if why is not None},
        excluded=excluded,
        per_task=per_task,
        cache_hits=cache.hits - hits_before,
        executed=cache.misses - misses_before,
        elapsed_s=time.perf_counter() - t0,
    )
