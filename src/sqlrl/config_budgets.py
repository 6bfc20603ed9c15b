"""The agent's budgets that no run can have: one rule set for a run file and for the CLI's flags.

`budget_problems` gives one line per broken rule; `config.validate` names the run file's settings
(`agent.turns = 0`), `cli/eval.check_budget_args` the flags (`--turns 0`), so the two never drift apart.
What is covered: turns, new tokens, context, schema characters, SQL executions (and multi-turn's need of
one). What is not: the other sizes and ranges of a run file (`config.validate`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _setting(field: str, value: Any) -> str:
    return f"agent.{field} = {value}"


def budget_problems(
    turns: int,
    max_new_tokens: int,
    max_context_tokens: int,
    max_schema_chars: int,
    max_sql_executions: int,
    show: Callable[[str, Any], str] = _setting,
) -> list[str]:
    """What no agent can run with, one line each; `show(field, value)` names a setting where it is set
    (a run file's `agent.turns = 0` here, the CLI's `--turns 0` in `cli/eval.check_budget_args`)."""
    rules = [
        (
            turns >= 1,
            f"{show('turns', turns)}: the agent needs at least one turn; give 1 (single-turn) or more",
        ),
        (max_new_tokens >= 8, f"{show('max_new_tokens', max_new_tokens)}: a turn needs at least 8 tokens"),
        (
            max_context_tokens > max_new_tokens,
            f"{show('max_context_tokens', max_context_tokens)} must exceed {show('max_new_tokens', max_new_tokens)}",
        ),
        (max_schema_chars >= 200, f"{show('max_schema_chars', max_schema_chars)}: give 200 or more"),
        (
            max_sql_executions >= 0,
            f"{show('max_sql_executions', max_sql_executions)} is negative: give 0 or more",
        ),
        (
            turns <= 1 or max_sql_executions >= 1,
            f"{show('max_sql_executions', max_sql_executions)}: a multi-turn agent ({show('turns', turns)}) "
            "needs max_sql_executions >= 1",
        ),
    ]
    return [msg for ok, msg in rules if not ok]
