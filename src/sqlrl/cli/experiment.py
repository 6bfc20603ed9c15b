"""`sqlrl experiment` (the equal-budget arm matrix, `--seeds`) and `sqlrl quickstart`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from sqlrl.artifacts import check_out_folder, check_out_path, read_json
from sqlrl.cli.outdir import check_outside_data
from sqlrl.config import ConfigError
from sqlrl.experiment.matrix import (
    QUICKSTART,
    finished_matrix,
    load_experiment,
    packaged_config,
    run_experiment,
)
from sqlrl.training.budget import Unfinished, budget_problem


def cli_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="sqlrl experiment", description="Run the equal-budget arm matrix.")
    p.add_argument("config", help="TOML experiment file (run sections + [experiment])")
    p.add_argument("--out", help="experiment folder (default runs/<config stem>)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--no-report", action="store_true")
    p.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop cleanly (checkpointed) before this many seconds; rerun the same command to resume",
    )
    p.add_argument(
        "--seeds",
        default=None,
        metavar="K,K,...",
        help="run the matrix once per training seed (run.seed) into OUT/seed<K>/, then `sqlrl seeds` over them",
    )
    a = p.parse_args(argv)
    if (why := budget_problem(a.time_budget)) is not None:
        print(f"sqlrl experiment: {why}", file=sys.stderr)
        return 2
    if a.seeds is not None:
        return _run_seeds(a, argv)
    return _run(
        a.config,
        a.out or f"runs/{Path(a.config).stem}",
        a.set,
        not a.no_report,
        ["sqlrl", "experiment", *argv],
        a.time_budget,
    )


def _run(
    config: str | Path,
    out: str,
    overrides: list[str],
    report: bool,
    command: list[str],
    time_budget: float | None = None,
) -> int:
    t0 = time.perf_counter()
    deadline = time.monotonic() + time_budget if time_budget else None
    try:
        check_out_path(out)
        check_out_folder(out, command[1], "an experiment")
        cfg, exp = load_experiment(config, overrides)
        check_outside_data(out, cfg.data.path, "data.path")
        res = run_experiment(cfg, exp, out, command=command, report=report, deadline=deadline)
    except Unfinished as e:
        print(f"sqlrl: time budget reached ({e}); rerun the same command to resume -> {out}", file=sys.stderr)
        return 3
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"sqlrl: {e}", file=sys.stderr)
        return 2
    took = time.perf_counter() - t0
    print(f"experiment finished in {took / 60:.1f} min -> {out}")
    rep = res.get("report") or {}
    if rep:
        print(f"report: {rep.get('html', '')} (the same as text: {rep.get('markdown', '')})")
        verdict = read_json(Path(out) / "verdict.json") if (Path(out) / "verdict.json").exists() else {}
        print(verdict_line(verdict))
    return 0


def verdict_line(verdict: dict) -> str:
    """The last line of an experiment: the gate's verdict and, without a claim, why (verdict.json)."""
    if verdict.get("claim_allowed"):
        return "verdict: claim allowed (every evidence check passed; the report has the numbers and caveats)"
    missing = list(verdict.get("missing") or [])
    smoke = [m for m in missing if m.startswith("real_run: smoke run")]
    others = len(missing) - len(smoke)
    if smoke:
        why = "as expected: this is a smoke run (experiment.smoke = true), which never becomes a claim"
        more = f"; {others} other check(s) failed too" if others else ""
    elif missing:
        why, more = f"missing: {missing[0]}", (f"; {others - 1} more" if others > 1 else "")
    else:
        why, more = "the evidence gate did not pass", ""
    return f"verdict: no claim, {why}{more} (the report says what each check needs)"


def _parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(
            f"--seeds {text!r}: expected integers separated by commas, e.g. --seeds 0,1,2"
        ) from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text!r}: give at least one seed, each once (e.g. --seeds 0,1,2)")
    return seeds


def _run_seeds(a: argparse.Namespace, argv: list[str]) -> int:
    """`--seeds`: the matrix per seed into OUT/seed<k>/ under one time budget, then the seeds summary.
    Exit 3 when the budget ran out (rerun the same command: finished seeds and arms are skipped)."""
    out = Path(a.out or f"runs/{Path(a.config).stem}")
    try:
        seeds = _parse_seeds(a.seeds)
        if any(o.replace(" ", "").startswith("run.seed=") for o in a.set):
            raise ValueError("--seeds sets run.seed for each matrix: drop --set run.seed=...")
    except ValueError as e:
        print(f"sqlrl: {e}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    dirs = []
    for k in seeds:
        left = None
        if a.time_budget is not None:
            left = a.time_budget - (time.monotonic() - t0)
            if left <= 0:
                print(
                    f"sqlrl: time budget reached before seed {k}; rerun the same command to resume -> {out}",
                    file=sys.stderr,
                )
                return 3
        sub = out / f"seed{k}"
        dirs.append(sub)
        meta = sub / "experiment.json"
        if meta.exists() and read_json(meta).get("finished"):
            try:  # finished with every arm asked for now? (arms or turns may have been added since)
                _, exp = load_experiment(a.config, [*a.set, f"run.seed={k}"])
            except (ConfigError, ValueError, FileNotFoundError) as e:
                print(f"sqlrl: {e}", file=sys.stderr)
                return 2
            if finished_matrix(sub, exp):
                print(f"[experiment] seed {k} finished before -> {sub}")
                continue
        print(f"[experiment] seed {k} -> {sub}")
        rc = _run(
            a.config,
            str(sub),
            [*a.set, f"run.seed={k}"],
            not a.no_report,
            ["sqlrl", "experiment", *argv],
            left,
        )
        if rc != 0:
            return rc
    if len(dirs) < 2:
        print("sqlrl: one seed: no across-seed summary (give two or more with --seeds)")
        return 0
    from sqlrl.evidence.seeds import summarize, write_summary

    summary = summarize(dirs)
    write_summary(summary, out)
    print(f"verdict across {len(dirs)} seeds: {summary['verdict']} -> {out / 'seeds.md'}")
    for problem in summary["problems"]:
        print(f"  {problem}")
    return 0


def cli_quickstart(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="sqlrl quickstart",
        description="The main job on embedded defaults: the quickstart experiment (Base, GRPO, No-update, "
        "validity-only) on the embedded Spider demo subset with the default model, ending with the report.",
    )
    p.add_argument("--out", default="runs/quickstart", help="experiment folder (default runs/quickstart)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override, e.g. --set model.name=smollm2-135m-instruct",
    )
    a = p.parse_args(argv)
    return _run(packaged_config(QUICKSTART), a.out, a.set, True, ["sqlrl", "quickstart", *argv])
