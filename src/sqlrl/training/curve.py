"""The learning curve: greedy validation accuracy of the policy being trained, every N steps.

With `run.eval_every` = N > 0 the trainer (GRPO's, and SFT's through `sft_loop.SFTCurve`) evaluates
its rollout policy greedily, with the run's agent budgets, on the validation split (`data.eval_split`,
or a seeded subset of `run.eval_tasks` tasks) after every N-th step and after the last one, exactly as
`sqlrl eval` scores (gold audit, exclusions, test-suite metric), and appends one line per point to
`curve.jsonl`: step, execution_match, executable_rate, scored and excluded tasks, seconds.

What is covered:
- the evaluation never reaches the update: greedy generation on the validation databases (never
  training tasks), and every rollout step reseeds its own sampling, so a run with a curve trains
  exactly as one without;
- the points' time is kept out of the run's `train_seconds` (run.json says how much it was);
- a resumed run drops the points of steps after its checkpoint and evaluates them again.

What is not:
- picking the best step by this curve makes that step's validation figure optimistic: report it as
  chosen on validation, and check it on data the choice never saw;
- Text-to-SQL tasks only (`data.kind = "text2sql"`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from sqlrl.artifacts import append_jsonl

__all__ = ["Curve"]


class Curve:
    """`curve(step, policy, last)` evaluates when `step` is due; `seconds` is the time spent so far."""

    def __init__(self, cfg: Any, out: Path, env: Any, budgets: Any, resumed_at: int | None = None):
        self.every = cfg.run.eval_every
        self.path = out / "curve.jsonl"
        self.env, self.budgets, self.seconds = env, budgets, 0.0
        self.tasks: list = []
        if self.every <= 0:
            return
        from sqlrl.tasks.data import select_tasks

        d = cfg.data
        self.tasks = select_tasks(
            env.ds.load(d.eval_split, seed=d.split_seed, val_fraction=d.val_fraction), cfg.run.eval_tasks, 0
        )
        if resumed_at is not None and self.path.exists():
            keep = [
                line
                for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] <= resumed_at
            ]
            self.path.write_text("".join(line + "\n" for line in keep))

    def due(self, step: int, last: bool) -> bool:
        """Whether `step` gets a point: every `run.eval_every`-th step and the last one."""
        return self.every > 0 and (step % self.every == 0 or last)

    def __call__(self, step: int, policy: Any, last: bool) -> dict | None:
        if not self.due(step, last):
            return None
        from sqlrl.evaluation.runner import evaluate_tasks

        t0 = time.perf_counter()
        s = evaluate_tasks(
            self.tasks, policy, self.env.sandbox, self.env.gold_cache, self.budgets, progress=False
        ).summary
        spent = time.perf_counter() - t0
        self.seconds += spent
        point = {
            "step": step,
            "execution_match": s["execution_match"],
            "executable_rate": s["executable_rate"],
            "test_suite_match": s.get("test_suite_match"),
            "n": s["n"],
            "n_tasks": s["n_tasks"],
            "excluded": s["excluded"],
            "seconds": round(spent, 3),
        }
        append_jsonl(self.path, point)
        return point
