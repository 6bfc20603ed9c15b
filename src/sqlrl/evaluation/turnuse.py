"""How an evaluated agent used its turns: the `turn_use` block of an evaluation's summary.json.

`turn_use(results, trajectories)` over the scored tasks (results with a reward; infra errors and
unscorable golds are left out), from the finished trajectories:
- `turns_used`: {turns: trajectories} (a reply that cost a turn counts, whatever its action);
- `repeat_first`: trajectories with >= 2 queries proposed in which a later query is identical to the
  first (whitespace-normalised, trailing semicolons ignored), out of `multi_query` such trajectories;
  `reinspect_first`: those in which the identical query was executed again (a later inspect turn),
  the turns spent re-running one query rather than FINAL with it;
- `after_error`: inspect turns whose execution failed (sandbox status not ok) and that were followed
  by a reply: `n`, `final` (that reply was FINAL), `final_unchanged` (FINAL keeping the failed query:
  no SQL, or the same SQL), `rewritten` (a different query, inspect or FINAL);
- `accuracy_by_turns`: {turns: {n, correct, accuracy}} by execution match.
Rates are given beside their counts (None when the count is 0). Single-turn runs have turns_used
{1: n} and nothing else to say. The checker turn (action `check`, `agent.checker`) is left out here; the
`checker` block (`sqlrl.evaluation.checker`) covers it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


def _norm(sql: Any) -> str | None:
    if not isinstance(sql, str):
        return None
    text = " ".join(sql.split()).rstrip(";").strip()
    return text or None


def _rate(k: int, n: int) -> float | None:
    return k / n if n else None


def turn_use(results: list[dict], trajectories: list) -> dict:
    """The turn-use block (module docstring) of `results` (results.jsonl rows) and their `Trajectory`s."""
    scored = {r["task_id"]: r for r in results if r.get("reward") is not None}
    used: Counter = Counter()
    by_turns: dict[int, dict] = {}
    multi = repeat = rerun = 0
    err_n = err_final = err_kept = err_rewritten = 0
    for tr in trajectories:
        r = scored.get(tr.task_id)
        if r is None:
            continue
        turns = [t for t in tr.turns if t.action != "check"]  # the checker turn: `checker` block
        k = len(turns)
        used[k] += 1
        cell = by_turns.setdefault(k, {"n": 0, "correct": 0})
        cell["n"] += 1
        cell["correct"] += int(bool(r.get("correct")))
        sqls = [_norm(t.sql) for t in turns if _norm(t.sql)]
        if len(sqls) >= 2:
            multi += 1
            repeat += int(sqls[0] in sqls[1:])
            rerun += int(any(t.action == "inspect" and _norm(t.sql) == sqls[0] for t in turns[1:]))
        for prev, nxt in zip(turns, turns[1:]):
            status = (prev.sql_result or {}).get("status")
            if prev.action != "inspect" or status in (None, "ok"):
                continue
            err_n += 1
            same = _norm(nxt.sql) is None or _norm(nxt.sql) == _norm(prev.sql)
            if nxt.action == "final":
                err_final += 1
                err_kept += int(same)
            err_rewritten += int(not same)
    for cell in by_turns.values():
        cell["accuracy"] = cell["correct"] / cell["n"]
    return {
        "n": sum(used.values()),
        "turns_used": {str(k): used[k] for k in sorted(used)},
        "multi_query": multi,
        "repeat_first": repeat,
        "repeat_first_rate": _rate(repeat, multi),
        "reinspect_first": rerun,
        "reinspect_first_rate": _rate(rerun, multi),
        "after_error": {
            "n": err_n,
            "final": err_final,
            "final_rate": _rate(err_final, err_n),
            "final_unchanged": err_kept,
            "rewritten": err_rewritten,
            "rewritten_rate": _rate(err_rewritten, err_n),
        },
        "accuracy_by_turns": {str(k): by_turns[k] for k in sorted(by_turns)},
    }
