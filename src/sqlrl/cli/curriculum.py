"""`sqlrl curriculum`: the staged debugging curriculum, resumable, evaluated by category."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from sqlrl.config import ConfigError
from sqlrl.generation.models import check_model
from sqlrl.training.curriculum import load_curriculum, resolved, run_curriculum


def cli_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="sqlrl curriculum",
        description="Staged curriculum on debugging tasks (sft -> single-turn GRPO -> multi-turn GRPO by default), "
        "each stage its own run folder, then evaluation by category of the base model and every stage. "
        "Rerun the same command to resume.",
    )
    p.add_argument("config", help="TOML run file with [curriculum], e.g. configs/debug-curriculum.toml")
    p.add_argument("--out", help="output folder (default runs/<config stem>)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config value (repeatable)",
    )
    p.add_argument("--print-config", action="store_true", help="print the resolved config as JSON and exit")
    p.add_argument(
        "--resume-from-valid",
        action="store_true",
        help="when a stage resumes and its newest checkpoint is corrupt, resume it from the newest valid "
        "older one",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop cleanly (checkpointed) before this many seconds, exit 3; rerun the same command to resume",
    )
    a = p.parse_args(argv)
    from sqlrl.training.budget import Unfinished, budget_problem

    if (why := budget_problem(a.time_budget)) is not None:
        print(f"sqlrl curriculum: {why}", file=sys.stderr)
        return 2
    deadline = time.monotonic() + a.time_budget if a.time_budget else None
    out = a.out or f"runs/{Path(a.config).stem}"
    try:
        cfg, sft, cur = load_curriculum(a.config, a.set)
        if a.print_config:
            print(json.dumps(resolved(cfg, sft, cur), indent=2))
            return 0
        check_model(cfg.model.name)  # before the output folder exists
        res = run_curriculum(
            cfg,
            sft,
            cur,
            out,
            command=["sqlrl", "curriculum", *argv],
            deadline=deadline,
            resume_from_valid=a.resume_from_valid,
        )
    except Unfinished as e:
        print(
            f"sqlrl curriculum: time budget reached ({e}); rerun the same command to resume -> {out}",
            file=sys.stderr,
        )
        return 3
    except (ConfigError, ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"sqlrl curriculum: {e}", file=sys.stderr)
        return 2
    print((Path(out) / "eval_by_category.md").read_text(encoding="utf-8"))
    print(f"-> {out} ({len(res['stages'])} stages, {res['n_eval_tasks']} evaluation tasks)")
    return 0
