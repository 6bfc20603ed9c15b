"""The branch point of an SFT run: its weights after step N, exported as a loadable model folder.

The matrix's `sft` arm with `sft.init_from = "control"` exports `RUN/branch_step_<N>` (N = sft.init_steps)
right after step N, before that step's checkpoint: weights and tokenizer with identity.json, as a final
(`runfolder.export_final`: final dtype, a patch over the base when smaller; no optimizer state), plus
branch.json {step, of_steps, train_seconds, lr (of step N's update), lr_schedule, same_as_n_step_run,
identity}. grpo_sft then trains GRPO from it instead of running an SFT stage of its own. `train_seconds` is the run's
training time up to and including step N, as run.json counts it (earlier invocations included, curve
points and the export itself left out).

Whether the branch equals the final of an N-step run: the examples and their order (`TaskSampler`,
seeded by run.seed) do not depend on sft.steps, and neither does the warm-up; with
`lr_schedule = "constant"` every step's learning rate is the same in both runs, so the weights are the
same (tests/training/test_sft_branch.py checks it bit for bit on CPU). With a `cosine` / `linear` decay
the learning rate at step k depends on sft.steps, so the branch is "the control's weights at step N",
not an N-step run's: still a valid design (grpo_sft forks from the control's trajectory), recorded as
branch.json `same_as_n_step_run: false`.
Not covered: a branch step the run resumed past without exporting it (the folder is then missing;
the matrix says so, naming the folder, rather than guessing it from a checkpoint).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlrl.artifacts import read_json, write_json_atomic

BRANCH_JSON = "branch.json"


def branch_dir(run_dir: Path, step: int) -> Path:
    """The branch folder of the SFT run in `run_dir` at `step`: `run_dir/branch_step_000240`."""
    return Path(run_dir) / f"branch_step_{step:06d}"


def read_branch(folder: Path) -> dict | None:
    """branch.json of a branch folder, or None when absent or unreadable."""
    try:
        data = read_json(Path(folder) / BRANCH_JSON)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass
class Branch:
    """Exports the weights of the run in `out` after step `step` (`__call__` after every step, acts at
    that one; `step` None: never). `seconds` is the time spent exporting, which the run keeps out of its
    `train_seconds` (`run_info`)."""

    out: Path
    step: int | None
    cfg: Any
    sft: Any
    tokenizer: Any
    base_identity: str | None
    seconds: float = 0.0
    _clock: Callable[[], float] | None = None

    def start(self, clock: Callable[[], float]) -> None:
        """Training has started; `clock()` is the run's training seconds so far (`sessions.TrainClock`,
        which must leave this export's `seconds` out)."""
        self._clock = clock

    @property
    def folder(self) -> Path:
        return branch_dir(self.out, self.step or 0)

    def __call__(self, step: int, model) -> None:
        if self.step is None or step != self.step:
            return
        from sqlrl.training.export import export_hf
        from sqlrl.training.runfolder import final_dtype
        from sqlrl.training.schedule import lr_factor

        t0 = time.perf_counter()
        train_s = self._clock() if self._clock is not None else None
        ident = export_hf(
            model,
            self.tokenizer,
            self.folder,
            merge_lora=True,
            step=step,
            dtype=final_dtype(self.cfg),
            base=self.cfg.model.name,
            base_identity=self.base_identity,
        )
        write_json_atomic(
            self.folder / BRANCH_JSON,
            {
                "step": step,
                "of_steps": self.sft.steps,
                "train_seconds": round(train_s, 2) if train_s is not None else None,
                "lr": self.sft.lr  # the learning rate of step N's update
                * lr_factor(
                    step, self.sft.warmup_steps, self.sft.lr_schedule, self.sft.steps, self.sft.min_lr_ratio
                ),
                "lr_schedule": self.sft.lr_schedule,
                "same_as_n_step_run": self.sft.lr_schedule == "constant",
                "identity": ident.get("weights_hash"),
            },
        )
        self.seconds += time.perf_counter() - t0

    def run_info(self) -> dict:
        """run.json's `branch_seconds` and `branch` (the folder's name and its branch.json, None before it
        exists); {} without a branch step."""
        if self.step is None:
            return {}
        data = read_branch(self.folder)
        return {
            "branch_seconds": round(self.seconds, 2),
            "branch": None if data is None else {"folder": self.folder.name, **data},
        }
