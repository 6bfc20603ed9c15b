"""The reward's cost in a GRPO run, from its steps.jsonl: share of step time, slowest step, deadline hits.

    python scripts/score_share.py RUN/steps.jsonl [--steps N] [--json OUT]

Reads every step record (a step written twice, by a run resumed from an earlier checkpoint, counts
once: its last record) and prints: the steps read; the summed step, rollout, scoring and update
seconds; the reward's share of step time (sum of `time_score_s` / sum of `time_step_s`); the slowest
step's scoring (`time_score_s`) and how many steps scored for over 2 s; the predictions scored
`timeout` (`score_timeouts`: they ran into `grpo.score_timeout_s`) and the longest single
prediction (`score_max_exec_s`); and the issue #18 targets (share <= 10 %, no step's scoring over
2 s). `--steps N`: exit 1 when the file holds fewer than N steps (an unfinished run). Exit 2 when the
file is missing or holds no step. Records from before `score_timeouts` existed count them as None.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SHARE_TARGET = 0.10
STEP_SCORE_TARGET_S = 2.0


def summarize(records: list[dict]) -> dict:
    """The figures above from step records (one per step, any order)."""
    by_step = {r["step"]: r for r in records}  # the last record of a step wins
    rows = [by_step[k] for k in sorted(by_step)]
    tot = {
        k: sum(r.get(k) or 0.0 for r in rows)
        for k in ("time_step_s", "time_rollout_s", "time_score_s", "time_update_s")
    }
    slowest = max(rows, key=lambda r: r.get("time_score_s") or 0.0)
    timeouts = [r.get("score_timeouts") for r in rows]
    max_exec = [r["score_max_exec_s"] for r in rows if r.get("score_max_exec_s") is not None]
    share = tot["time_score_s"] / tot["time_step_s"] if tot["time_step_s"] > 0 else None
    over = sum((r.get("time_score_s") or 0.0) > STEP_SCORE_TARGET_S for r in rows)
    return {
        "steps": len(rows),
        "first_step": rows[0]["step"],
        "last_step": rows[-1]["step"],
        **{k: round(v, 3) for k, v in tot.items()},
        "score_share": None if share is None else round(share, 4),
        "max_step_score_s": slowest.get("time_score_s"),
        "max_step_score_at": slowest["step"],
        "steps_scoring_over_2s": over,
        "score_timeouts": None if any(t is None for t in timeouts) else sum(timeouts),
        "max_prediction_exec_s": max(max_exec) if max_exec else None,
        "target_share_le_10pct": None if share is None else share <= SHARE_TARGET,
        "target_no_step_scoring_over_2s": over == 0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("steps_jsonl", help="a GRPO run's steps.jsonl")
    ap.add_argument("--steps", type=int, default=None, help="the steps the run should have (exit 1 if fewer)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    a = ap.parse_args(argv)
    f = Path(a.steps_jsonl)
    if not f.is_file():
        print(f"score_share: {f} does not exist; pass a GRPO run folder's steps.jsonl", file=sys.stderr)
        return 2
    records = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    if not records:
        print(f"score_share: {f} holds no step yet; run the training first", file=sys.stderr)
        return 2
    s = summarize(records)
    share = "n/a" if s["score_share"] is None else f"{s['score_share']:.1%}"
    print(
        f"{f}: steps {s['first_step']}-{s['last_step']} ({s['steps']} steps)\n"
        f"  step time {s['time_step_s']:.1f} s = rollout {s['time_rollout_s']:.1f} + scoring "
        f"{s['time_score_s']:.1f} + update {s['time_update_s']:.1f} s (+ the rest)\n"
        f"  reward share of step time: {share} (target <= 10 %: "
        f"{'met' if s['target_share_le_10pct'] else 'NOT met'})\n"
        f"  slowest step's scoring: {s['max_step_score_s']} s at step {s['max_step_score_at']}; "
        f"steps scoring over 2 s: {s['steps_scoring_over_2s']} (target 0: "
        f"{'met' if s['target_no_step_scoring_over_2s'] else 'NOT met'})\n"
        f"  predictions scored timeout (training deadline): {s['score_timeouts']}; longest single "
        f"prediction: {s['max_prediction_exec_s']} s"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(s, indent=1) + "\n")
    if a.steps is not None and s["steps"] < a.steps:
        print(
            f"score_share: {s['steps']} of {a.steps} steps so far; the run is not finished", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
