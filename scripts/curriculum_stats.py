"""Paired comparisons between the models a `sqlrl curriculum` run evaluated (same tasks, greedy).

    python scripts/curriculum_stats.py RESULTS_DIR      # writes RESULTS_DIR/paired_stats.json

For each evaluated turn count: base -> sft, sft -> grpo-single, grpo-single -> grpo-multi and
base -> grpo-multi on the tasks both scored (solved or not), with the exact McNemar test and a paired
bootstrap CI of the difference in solved rate (10,000 resamples, seed 0), from `sqlrl.evidence.stats`.
These are comparisons between stages of one run; a curriculum run has no No-update or validity-only
control arm, so none of them is an evidence-gated learning claim.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sqlrl.evidence.stats import mcnemar_exact, paired_bootstrap

PAIRS = [("base", "sft"), ("sft", "grpo-single"), ("grpo-single", "grpo-multi"), ("base", "grpo-multi")]


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not (Path(argv[0]) / "evals").is_dir():
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    root = Path(argv[0])
    turns = sorted({int(p.name.rsplit("-t", 1)[1]) for p in (root / "evals").iterdir() if "-t" in p.name})
    out = []
    for t in turns:
        res = {}
        for a in {x for pair in PAIRS for x in pair}:
            f = root / "evals" / f"{a}-t{t}" / "results.jsonl"
            if f.is_file():
                res[a] = {r["task_id"]: r for r in map(json.loads, f.open())}
        for a, b in PAIRS:
            if a not in res or b not in res:
                continue
            keep = sorted(
                i for i in res[a] if i in res[b] and None not in (res[a][i]["solved"], res[b][i]["solved"])
            )
            x = [bool(res[a][i]["solved"]) for i in keep]
            y = [bool(res[b][i]["solved"]) for i in keep]
            m = mcnemar_exact(x, y)
            bs = paired_bootstrap(x, y, n_boot=10000, seed=0)
            out.append({"turns": t, "a": a, "b": b, "n": len(keep), "mcnemar": m, "bootstrap": bs})
            print(
                f"{t} turn(s)  {a:>11} -> {b:<11}  n={len(keep)}  {bs['mean_a']:.3f} -> {bs['mean_b']:.3f}"
                f"  ({bs['diff']:+.3f}, 95% CI {bs['ci_low']:+.3f} to {bs['ci_high']:+.3f};"
                f" only a {m['n10']}, only b {m['n01']}, McNemar p = {m['p_value']:.3g})"
            )
    (root / "paired_stats.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
