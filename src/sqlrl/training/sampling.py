"""Which training tasks a GRPO step draws: `PassRateSampler` favours tasks the policy solves sometimes.

A group of rollouts on a task teaches nothing when all its rewards are equal (always solved, or never).
`PassRateSampler` keeps, per task, the sum and count of the rewards its scored rollouts got, estimates
the task's pass rate with a uniform prior, p = (sum + 1) / (count + 2), and draws a step's tasks without
replacement with weight max(p (1 - p), floor): an unseen task has p = 0.5 (the largest weight), a task
solved 8 of 8 times has p = 0.9 (weight 0.09), after 16 of 16 p = 0.94 (0.05); the floor (0.02) keeps
every task drawable.

What is covered:
- the draw is a seeded function of the run seed, the number of draws so far and the statistics, so a
  resumed run (`state_dict` holds all three) draws what an uninterrupted one draws;
- rewards of excluded rollouts (value None) are never counted; values are taken as given (the
  execution reward is 0/1; a validity-only arm tracks its own reward);
- `make_sampler(kind, n, seed)`: "epoch" is `TaskSampler` (a seeded permutation per epoch, no task
  twice in a batch).

What is not:
- the statistics come from the policy as it was when each rollout was sampled (older steps count as
  much as the last one); no claim that this sampling learns faster: that is for a matrix to show.
"""

from __future__ import annotations

import math
import random
from typing import Any

__all__ = ["PassRateSampler", "TaskSampler", "make_sampler"]

FLOOR = 0.02


class TaskSampler:
    """Seeded epoch permutations over task indices; `state_dict()` is the data cursor."""

    def __init__(self, n: int, seed: int):
        if n <= 0:
            raise ValueError("no training tasks to sample from")
        self.n, self.seed, self.epoch, self.pos = n, seed, 0, 0
        self._perm = self._make_perm()

    def _make_perm(self) -> list[int]:
        perm = list(range(self.n))
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(perm)
        return perm

    def next(self, k: int) -> list[int]:
        """`k` task indices; no index twice in one batch while k <= n (a batch that straddles an epoch
        boundary takes the new epoch's first indices that are not already in the batch)."""
        out: list[int] = []
        while len(out) < k:
            if self.pos >= self.n:
                self.epoch += 1
                self.pos = 0
                self._perm = self._make_perm()
                self._reordered = False
                if out and k <= self.n:
                    taken = set(out)
                    self._perm = [i for i in self._perm if i not in taken] + [
                        i for i in self._perm if i in taken
                    ]
                    self._reordered = True
            out.append(self._perm[self.pos])
            self.pos += 1
        return out

    def state_dict(self) -> dict:
        perm = list(self._perm) if getattr(self, "_reordered", False) else None
        return {"epoch": self.epoch, "pos": self.pos, "n": self.n, "seed": self.seed, "perm": perm}

    def load_state_dict(self, s: dict) -> None:
        if s["n"] != self.n or s["seed"] != self.seed:
            raise ValueError(
                f"data cursor is for {s['n']} tasks / seed {s['seed']}, this run has {self.n} / {self.seed}"
            )
        self.epoch, self.pos = s["epoch"], s["pos"]
        self._perm = list(s["perm"]) if s.get("perm") else self._make_perm()
        self._reordered = bool(s.get("perm"))


class PassRateSampler:
    """Draws tasks by estimated pass rate; `observe` feeds it the scored rewards of each task."""

    def __init__(self, n: int, seed: int, floor: float = FLOOR):
        if n <= 0:
            raise ValueError("no training tasks to sample from")
        self.n, self.seed, self.floor = n, seed, floor
        self.draws = 0
        self.sums = [0.0] * n
        self.counts = [0] * n

    def weight(self, i: int) -> float:
        p = (self.sums[i] + 1.0) / (self.counts[i] + 2.0)
        return max(p * (1.0 - p), self.floor)

    def next(self, k: int) -> list[int]:
        """`k` distinct task indices (all n, repeated in draw order, when k > n), weighted without
        replacement (Efraimidis-Spirakis: the k largest u ** (1 / w), u uniform in (0, 1))."""
        rng = random.Random(self.seed * 1_000_003 + self.draws * 7_919)
        self.draws += 1
        keys = [(math.log(rng.random() or 1e-300) / self.weight(i), i) for i in range(self.n)]
        keys.sort(reverse=True)
        order = [i for _, i in keys]
        return [order[j % self.n] for j in range(k)]

    def observe(self, index: int, values: list[float]) -> None:
        """Count the scored rewards (None = excluded, skipped) of rollouts of task `index`."""
        for v in values:
            if v is not None:
                self.sums[index] += float(v)
                self.counts[index] += 1

    def stats(self) -> dict[str, float]:
        """Seen tasks, and among them the share whose estimated pass rate is in [0.1, 0.9]."""
        seen = [i for i in range(self.n) if self.counts[i]]
        mid = [i for i in seen if 0.1 <= self.sums[i] / self.counts[i] <= 0.9]
        return {"tasks_seen": len(seen), "tasks_mid": len(mid)}

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": "pass_rate",
            "n": self.n,
            "seed": self.seed,
            "draws": self.draws,
            "sums": list(self.sums),
            "counts": list(self.counts),
        }

    def load_state_dict(self, s: dict) -> None:
        if s.get("kind") != "pass_rate" or s["n"] != self.n or s["seed"] != self.seed:
            raise ValueError(
                f"data cursor is a {s.get('kind', 'epoch')} sampler for {s['n']} tasks / seed {s['seed']}, "
                f"this run has a pass_rate sampler for {self.n} / {self.seed}"
            )
        self.draws = int(s["draws"])
        self.sums = [float(x) for x in s["sums"]]
        self.counts = [int(x) for x in s["counts"]]


def make_sampler(kind: str, n: int, seed: int) -> Any:
    """The task sampler `grpo.task_sampling` names: "epoch" or "pass_rate"."""
    if kind == "pass_rate":
        return PassRateSampler(n, seed)
    if kind == "epoch":
        return TaskSampler(n, seed)
    raise ValueError(f"grpo.task_sampling = {kind!r}: use 'epoch' or 'pass_rate'")
