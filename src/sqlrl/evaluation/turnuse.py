"""How an evaluated agent used its turns: the one definition of "turn use".

`turn_use(results, trajectories)` is the `turn_use` block of an evaluation's summary.json and the turn-use
figures of `sqlrl report` (`evidence/analysis.py`), over the scored tasks (results.jsonl rows with a
reward; infra errors and unscorable golds are left out). `trajectories` are `Trajectory` objects (during
an evaluation) or trajectories.jsonl rows (dicts, in the report): both give the same numbers.
From results.jsonl: `n`, `stop_reasons` (count per `stop_reason`, most frequent first: `final` = the
policy replied FINAL, `max_turns` = it ran out of turns, ...) and `mean_turns`. From the trajectories:
- `turns_used`: {turns: trajectories} (a reply that cost a turn counts, whatever its action);
- `with_sql`: trajectories that proposed at least one query; `revised`: the final SQL differs from the
  first query proposed (the answer changed after feedback), `revised_correct` of them correct;
  `repeated`: two or more queries proposed, all identical;
- `repeat_first`: trajectories with >= 2 queries proposed in which a later query is identical to the
  first, out of `multi_query` such trajectories; `reinspect_first`: those in which the identical query
  was executed again (a later inspect turn), the turns spent re-running one query rather than FINAL;
- `after_error`: inspect turns whose execution failed (sandbox status not ok) and that were followed
  by a reply: `n`, `final` (that reply was FINAL), `final_unchanged` (FINAL keeping the failed query:
  no SQL, or the same SQL), `rewritten` (a different query, inspect or FINAL);
- `accuracy_by_turns`: {turns: {n, correct, accuracy}} by execution match.
Queries are compared whitespace-normalised, trailing semicolons ignored. Rates are given beside their
counts (None when the count is 0). Without trajectories the trajectory figures are None.
The checker turn (`agent.checker`) is left out: turns, `mean_turns` and `revised` (of the answer before
the checker reply and its `first_correct`) are the turns'; `accuracy_by_turns` is the final answer's.
What is not covered: why a policy repeated itself; these are descriptive counts only.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlrl.evaluation.outcome import outcome


def norm_sql(sql: Any) -> str | None:
    """`sql` whitespace-normalised without trailing semicolons; None for no query."""
    if not isinstance(sql, str):
        return None
    text = " ".join(sql.split()).rstrip(";").strip()
    return text or None


def _get(obj: Any, key: str) -> Any:
    """A field of a `Trajectory` / `Turn` or of its trajectories.jsonl dict."""
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def _rate(k: int, n: int) -> float | None:
    return k / n if n else None


def _checked(r: dict) -> bool:
    """A results.jsonl row whose trajectory has a checker reply (one reply more in its `turns`)."""
    return bool((r.get("checker") or {}).get("checked"))


def _from_results(scored: list[dict]) -> dict:
    stops = Counter(str(r.get("stop_reason")) for r in scored)
    turns = [r["turns"] - _checked(r) for r in scored if isinstance(r.get("turns"), int)]
    return {
        "n": len(scored),
        "stop_reasons": dict(sorted(stops.items(), key=lambda kv: -kv[1])),
        "mean_turns": sum(turns) / len(turns) if turns else None,
    }


NO_TRAJECTORIES = dict.fromkeys(
    ("turns_used", "with_sql", "revised", "revised_correct", "repeated", "multi_query", "repeat_first")
    + ("repeat_first_rate", "reinspect_first", "reinspect_first_rate", "after_error", "accuracy_by_turns")
)


def turn_use(results: list[dict], trajectories: list | None) -> dict:
    """The turn-use block (module docstring) of `results` (results.jsonl rows) and their trajectories
    (`Trajectory` objects or trajectories.jsonl dicts; None: only what results.jsonl says)."""
    scored = {str(r.get("task_id")): r for r in results if r.get("reward") is not None}
    out = _from_results(list(scored.values()))
    if trajectories is None:
        return {**out, **NO_TRAJECTORIES}
    used: Counter = Counter()
    by_turns: dict[int, dict] = {}
    with_sql = revised = revised_correct = repeated = multi = repeat = rerun = 0
    err_n = err_final = err_kept = err_rewritten = 0
    for tr in trajectories:
        r = scored.get(str(_get(tr, "task_id")))
        if r is None:
            continue
        turns = [t for t in _get(tr, "turns") or [] if t is not None and _get(t, "action") != "check"]
        k = len(turns)
        used[k] += 1
        cell = by_turns.setdefault(k, {"n": 0, "correct": 0})
        cell["n"] += 1
        cell["correct"] += outcome(r) == 1
        sqls = [q for q in (norm_sql(_get(t, "sql")) for t in turns) if q]
        if sqls:
            with_sql += 1
            checker = _get(tr, "checker")
            answer = checker["first_sql"] if checker else _get(tr, "final_sql")
            final = norm_sql(answer)
            if final is not None and final != sqls[0]:
                revised += 1
                right = (r.get("checker") or {}).get("first_correct", r.get("correct"))
                revised_correct += right is True
        if len(sqls) >= 2:
            multi += 1
            repeat += int(sqls[0] in sqls[1:])
            repeated += int(len(set(sqls)) == 1)
            rerun += int(
                any(_get(t, "action") == "inspect" and norm_sql(_get(t, "sql")) == sqls[0] for t in turns[1:])
            )
        for prev, nxt in zip(turns, turns[1:]):
            status = (_get(prev, "sql_result") or {}).get("status")
            if _get(prev, "action") != "inspect" or status in (None, "ok"):
                continue
            err_n += 1
            same = norm_sql(_get(nxt, "sql")) is None or norm_sql(_get(nxt, "sql")) == norm_sql(
                _get(prev, "sql")
            )
            if _get(nxt, "action") == "final":
                err_final += 1
                err_kept += int(same)
            err_rewritten += int(not same)
    for cell in by_turns.values():
        cell["accuracy"] = cell["correct"] / cell["n"]
    return {
        **out,
        "turns_used": {str(k): used[k] for k in sorted(used)},
        "with_sql": with_sql,
        "revised": revised,
        "revised_correct": revised_correct,
        "repeated": repeated,
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
