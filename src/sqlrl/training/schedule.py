"""The learning-rate schedule of a training run: linear warm-up, then constant or a decay.

`lr_factor(step, ...)` is the multiplier of the base learning rate used by optimizer step `step`
(1-based, the step whose update it scales):
- warm-up: `step / warmup_steps` while `step <= warmup_steps` (no warm-up: 1.0);
- "constant": 1.0 after the warm-up;
- "linear" / "cosine": from 1.0 at the end of the warm-up down to `min_ratio` at step `total_steps`,
  along a straight line or a half cosine of the fraction `(step - warmup_steps) / (total_steps -
  warmup_steps)`; steps after `total_steps` keep `min_ratio`.

What is covered: the factor as a pure function of the step, so a resumed run (whose scheduler state
holds how many steps it took) continues the schedule where it stopped.
What is not: schedules with restarts, or a warm-up that is not linear.
"""

from __future__ import annotations

import math

__all__ = ["LR_SCHEDULES", "lr_factor"]

LR_SCHEDULES = ("constant", "cosine", "linear")


def lr_factor(
    step: int, warmup_steps: int, schedule: str = "constant", total_steps: int = 0, min_ratio: float = 0.0
) -> float:
    """The base learning rate's multiplier at optimizer step `step` (1-based); see the module docstring."""
    warm = max(0, warmup_steps)
    if warm and step <= warm:
        return min(1.0, step / warm)
    if schedule == "constant":
        return 1.0
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown learning-rate schedule {schedule!r}; choose among {list(LR_SCHEDULES)}")
    if total_steps <= warm:
        raise ValueError(
            f"a {schedule} decay needs total_steps ({total_steps}) > warmup_steps ({warm}): nothing to decay over"
        )
    frac = min(1.0, max(0.0, (step - warm) / (total_steps - warm)))
    shape = 1.0 - frac if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * frac))
    return min_ratio + (1.0 - min_ratio) * shape
