"""BIRD's official execution metric: the predicted result's set of rows equals the gold's.

BIRD's `evaluation.py` scores a prediction as `set(predicted_res) == set(ground_truth_res)` over the
`fetchall()` rows of the two queries: column order matters, row order and duplicate rows do not, values
compare with Python equality (so `1 == 1.0`, and no float tolerance). `bird_set_match` is that rule on
the rows sqlrl's sandbox returns; it sits beside `execution_match` as the reward part `bird_match`
(1.0 / 0.0; 0.0 when the prediction did not execute) and the summary's `bird_execution_match`.

Not covered: BIRD's own 30 s timeout (sqlrl's sandbox limits apply), and results cut at the sandbox's
`max_rows` (the prediction is then `exec_error`, as for our metric). Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["bird_set_match"]


def bird_set_match(gold_rows: Iterable, pred_rows: Iterable) -> bool:
    """`set(pred_rows) == set(gold_rows)` with each row as a tuple (rows may arrive as lists)."""
    return {tuple(r) for r in pred_rows} == {tuple(r) for r in gold_rows}
