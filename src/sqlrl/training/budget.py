"""Time budgets of long commands (`deadline` = a `time.monotonic()` value): when to stop, and the
`Unfinished` exception a rerun of the same command resumes from. Nothing here measures or kills."""

from __future__ import annotations

import math
import time


class Unfinished(Exception):
    """The time budget ran out; rerunning the same command resumes where this one stopped."""


def budget_problem(seconds: float | None) -> str | None:
    """Why `--time-budget SECONDS` is no usable budget (None when it is one, or is absent: no limit)."""
    if seconds is None or 0 < seconds < math.inf:
        return None
    return f"--time-budget {seconds}: give a finite number of seconds > 0, or leave it out for no limit"


def check_time(deadline: float | None, need_s: float, what: str) -> None:
    """Raise `Unfinished` when less than `need_s` seconds are left for `what`."""
    if deadline is not None and time.monotonic() + need_s > deadline:
        raise Unfinished(f"not enough time left for {what}")


def out_of_time(deadline: float | None, last_step_s: float) -> bool:
    """The time-budget rule of the training loops (`train`, `sft.train_sft`): stop before a step when
    the next one would probably end less than 30 s before `deadline` (a `time.monotonic()` value),
    judged from the last step's duration (1.5x); never before a step has been measured."""
    return deadline is not None and last_step_s > 0 and time.monotonic() + 1.5 * last_step_s + 30 > deadline
