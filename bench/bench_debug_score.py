"""Scoring of debugging-task submissions: a reference per submission vs one reference per task,
serial and threaded, side by side in one run.

    python bench/bench_debug_score.py [--samples 8] [--rounds 3] [--threads 0]

The embedded demo tasks (24 tasks on 4 Spider databases), each task's reference solution submitted
`--samples` times (a GRPO group). Three scorers on the same submissions, in turns within each round:
- per-submission: `run_episode_offline(task, sql)` for each submission, one after another: a fresh
  copy for the submission and another for its own reference end state;
- shared, serial: the same with one `ReferenceStates` for the round (each task's reference built once);
- shared, threaded: `score_debug_trajectories`' way, the same calls in a thread pool (`--threads`,
  0 = its default: up to 8, one per CPU).
Printed: median ms per submission over the rounds for each, and the ratios; the statuses must agree.
Only the scoring is timed (no policy, no replica pool).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from sqlrl.tasks.debug_episode import ReferenceStates, run_episode_offline
from sqlrl.tasks.debugging import debug_demo_root, load_debug_tasks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args(argv)
    tasks = load_debug_tasks(debug_demo_root() / "debug_tasks.jsonl")
    work = [(t, list(t.solution_sql)) for t in tasks for _ in range(a.samples)]
    n_threads = a.threads or min(8, os.cpu_count() or 1)

    def per_submission():
        return [run_episode_offline(t, s)["status"] for t, s in work]

    def shared_serial():
        with ReferenceStates() as refs:
            return [run_episode_offline(t, s, references=refs)["status"] for t, s in work]

    def shared_threaded():
        with ReferenceStates() as refs, ThreadPoolExecutor(n_threads) as ex:
            return list(ex.map(lambda x: run_episode_offline(x[0], x[1], references=refs)["status"], work))

    scorers = [
        ("per-submission reference, serial", per_submission),
        ("shared reference, serial", shared_serial),
        (f"shared reference, {n_threads} threads", shared_threaded),
    ]
    times: dict[str, list[float]] = {name: [] for name, _ in scorers}
    statuses = {}
    for r in range(a.rounds):
        order = scorers if r % 2 == 0 else scorers[::-1]
        for name, fn in order:
            t0 = time.perf_counter()
            statuses[name] = fn()
            times[name].append((time.perf_counter() - t0) / len(work) * 1e3)
    print(
        f"{len(tasks)} demo tasks x {a.samples} submissions = {len(work)} per round, {a.rounds} rounds, "
        f"{os.cpu_count()} CPUs; load average {os.getloadavg()}"
    )
    base = statistics.median(times[scorers[0][0]])
    for name, _ in scorers:
        m = statistics.median(times[name])
        print(f"  {name:<36} {m:7.2f} ms per submission   {base / m:5.2f}x")
    same = len({tuple(v) for v in statuses.values()}) == 1
    print(f"  statuses identical across scorers: {same} ({sorted(set(statuses[scorers[0][0]]))})")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
