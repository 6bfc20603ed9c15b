"""A results.jsonl row's outcome: the one reading of `correct` that every reader of per-task results uses.

`outcome(row)` is 1 for a correct answer (`correct` is the JSON `true`), 0 for a wrong one (`false`), and
None for a row that is not scored: `correct` null, absent or anything but a JSON boolean (a string
"false", a number), a row whose `status` is one the evaluator gives excluded tasks (`EXCLUDED_STATUSES`:
an unscorable gold, an infrastructure failure; their reward is None, never 0 or 1), and a row that is
not a JSON object. `outcome(row, "test_suite_correct")` (or `bird_correct`, `pass_at_k`) reads another
boolean field of the row the same way.

What is not covered: whether the row's other fields agree with its `correct` (e.g. status `match` with
`correct: false`); a scored row is read as it is written.
"""

from __future__ import annotations

from typing import Any

# statuses of results.jsonl rows excluded from scoring (`reward.evaluator`, `evaluation.runner`)
EXCLUDED_STATUSES = ("gold_unscorable", "infra_error")


def outcome(row: Any, key: str = "correct") -> int | None:
    """1 when `row[key]` is true, 0 when it is false, None when the row is not scored (module docstring)."""
    if not isinstance(row, dict) or row.get("status") in EXCLUDED_STATUSES:
        return None
    value = row.get(key)
    if value is True:
        return 1
    if value is False:
        return 0
    return None


def scored_rows(rows: list[dict] | None) -> list[dict]:
    """The rows with an outcome (0 or 1), in their order."""
    return [r for r in rows or [] if outcome(r) is not None]
