"""How the checker turn (`agent.checker`) changed the answers: the `checker` block of summary.json.

After a trajectory ended and was scored, `score_first_answers` scores the answer the checker turn
replaced (`Trajectory.checker["first_sql"]`) with the same evaluator, for the trajectories whose answer
changed, into `reward["first_answer"]` = {value, status} (scoring only: the policy never sees it).
`checker_row(tr, correct)` is a results.jsonl row's `checker` field and `checker_summary(results)` the
block over the scored tasks:
- `n` (scored tasks), `checked` (a checker reply was generated), `not_checked` {reason: tasks} (the
  stop reason, `no_sql`, `sql_budget`, `context_budget` or `infra_error`);
- `replies` {confirm, correct, no_final} of the checked tasks;
- `changed` (the answer's SQL differs from the first, whitespace-normalised), split by execution match
  of the first and the final answer: `changed_to_right` (wrong -> right), `changed_to_wrong` (right ->
  wrong), `changed_both_right`, `changed_both_wrong`, `changed_unscored` (the first answer's score is
  an infrastructure failure);
- `execution_match_first`: accuracy had every first answer stood, over `n_first` tasks whose first
  answer was scored.
What is not covered: the split by correctness for reward kinds other than execution (left None).
"""

from __future__ import annotations

from collections import Counter


def score_first_answers(trajectories: list, private: dict, evaluator) -> None:
    """Write `reward["first_answer"]` for each scored trajectory whose checker turn changed the answer."""
    todo = [
        tr
        for tr in trajectories
        if tr.checker
        and tr.checker.get("changed")
        and tr.reward is not None
        and tr.reward.get("value") is not None
    ]
    items = [(tr.checker["first_sql"], private[tr.task_id]) for tr in todo]
    if hasattr(evaluator, "score_many"):
        rewards = evaluator.score_many(items)
    else:
        rewards = [evaluator.score(sql, task) for sql, task in items]
    for tr, r in zip(todo, rewards):
        tr.reward["first_answer"] = {"value": r.value, "status": r.status}


def checker_row(tr, correct: bool | None) -> dict | None:
    """A results.jsonl row's `checker` field: checked, reply, changed and `first_correct` (the first
    answer's execution match; None when unknown). None without agent.checker."""
    c = tr.checker
    if c is None:
        return None
    first = correct
    if c.get("changed"):
        fa = (tr.reward or {}).get("first_answer") or {}
        first = None if correct is None or fa.get("value") is None else bool(fa["value"] >= 1.0)
    return {
        "checked": bool(c.get("checked")),
        "reason": c.get("reason"),
        "reply": c.get("reply"),
        "changed": bool(c.get("changed")),
        "first_correct": first,
    }


def checker_summary(results: list[dict]) -> dict:
    """The `checker` block (module docstring) of results.jsonl rows with a `checker` field."""
    rows = [r for r in results if r.get("reward") is not None and r.get("checker")]
    checks = [r["checker"] for r in rows]
    changed = [r for r in rows if r["checker"]["changed"]]
    execution = all(r.get("correct") is not None for r in rows)

    def split(first: bool, final: bool) -> int | None:
        if not execution:
            return None
        return sum(r["checker"]["first_correct"] is first and bool(r["correct"]) is final for r in changed)

    firsts = [r["checker"]["first_correct"] for r in rows if r["checker"]["first_correct"] is not None]
    return {
        "n": len(rows),
        "checked": sum(c["checked"] for c in checks),
        "not_checked": dict(Counter(c["reason"] for c in checks if not c["checked"])),
        "replies": {k: sum(c["reply"] == k for c in checks) for k in ("confirm", "correct", "no_final")},
        "changed": len(changed),
        "changed_to_right": split(False, True),
        "changed_to_wrong": split(True, False),
        "changed_both_right": split(True, True),
        "changed_both_wrong": split(False, False),
        "changed_unscored": sum(r["checker"]["first_correct"] is None for r in changed)
        if execution
        else None,
        "n_first": len(firsts),
        "execution_match_first": sum(firsts) / len(firsts) if execution and firsts else None,
    }
