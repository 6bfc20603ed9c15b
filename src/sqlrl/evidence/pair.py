"""Paired comparison of two evaluation runs (`sqlrl compare A B`): the numbers `sqlrl report` gives an arm
pair, for any two `sqlrl eval` folders (or experiment arms' `eval/` folders).

What is covered:
- a run is a folder holding results.jsonl or results.jsonl.gz, or that file itself;
- pairing by task_id over records scored in both runs (`analysis.paired_outcomes`); tasks excluded in
  either run and tasks in one run only are counted, not compared;
- diff = accuracy(B) - accuracy(A) with a paired percentile bootstrap CI, the exact McNemar test, the
  discordant counts, and the repair decomposition (execution repair vs answer change);
- what differs between the runs' run.json: model, task set (fingerprint), budgets (schema view, turns,
  tokens), sampling, engine. Listed so a reader sees what the comparison varies; a side without a
  readable run.json is named and nothing is compared.

What is not:
- no check that the difference is the only one intended: the listed settings are the caller's to read;
- no gate: a comparison of two evaluations is not a training claim (use `sqlrl report` on a matrix);
- no correction for multiple comparisons.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlrl.evidence.rundir import maybe_gz

# run.json fields whose differences are listed (dotted paths into run.json)
COMPARED_SETTINGS = ("model.name", "model.identity", "fingerprint", "budgets", "sampling", "engine")


class CompareError(ValueError):
    """A run folder that cannot be compared (missing or unreadable results.jsonl)."""


@dataclass(frozen=True)
class RunSide:
    """One side of the comparison: folder, accuracy over its own scored tasks."""

    path: str
    scored: int
    correct: int
    excluded: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.scored if self.scored else 0.0


@dataclass(frozen=True)
class Comparison:
    """B against A on the tasks scored in both (`diff` = accuracy(B) - accuracy(A) there)."""

    a: RunSide
    b: RunSide
    n: int
    """Tasks scored in both runs."""
    mean_a: float
    mean_b: float
    diff: float
    ci_low: float
    ci_high: float
    ci: float
    p_value: float
    b_only: int
    """Tasks B gets right and A wrong."""
    a_only: int
    dropped_excluded: int
    """Tasks in both runs but excluded (unscorable gold) in at least one."""
    unpaired: int
    """Tasks in one run only."""
    repair: dict
    """`analysis.repair_decomposition` of the paired outcomes."""
    differences: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    """Setting -> (A's value, B's value) for every run.json setting that differs."""
    no_run_json: tuple[str, ...] = ()
    """Sides ("A", "B") without a readable run.json: settings not compared, `differences` empty."""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["a"]["accuracy"], d["b"]["accuracy"] = self.a.accuracy, self.b.accuracy
        d["differences"] = {k: list(v) for k, v in self.differences.items()}
        return d


def _results(folder: Path) -> list[dict]:
    from sqlrl.artifacts import read_jsonl

    path = maybe_gz(folder / "results.jsonl") if folder.is_dir() else folder
    if not path.is_file():
        raise CompareError(
            f"{folder}: no results.jsonl or results.jsonl.gz (an `sqlrl eval` folder, or an arm's eval/ folder)"
        )
    try:
        rows = list(read_jsonl(path))
    except (OSError, ValueError, EOFError, zlib.error) as e:  # EOFError, zlib.error: a corrupt .gz
        raise CompareError(f"{path}: unreadable results.jsonl ({e})") from e
    if not rows or any(not isinstance(r, dict) or "task_id" not in r for r in rows):
        raise CompareError(f"{path}: not a results.jsonl of per-task records with a task_id")
    return rows


def _run_json(folder: Path) -> dict | None:
    """The folder's run.json, or None when it is missing, unreadable or not an object."""
    from sqlrl.artifacts import read_json

    path = (folder if folder.is_dir() else folder.parent) / "run.json"
    try:
        run = read_json(path) if path.is_file() else None
    except (OSError, ValueError):
        return None
    return run if isinstance(run, dict) else None


def _get(d: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(part)
    return d


def setting_differences(run_a: dict, run_b: dict) -> dict[str, tuple[Any, Any]]:
    """{setting: (a, b)} for the `COMPARED_SETTINGS` that differ; a dict setting (budgets, sampling) is
    compared key by key, so `budgets.schema_sample_values` shows up alone."""
    out: dict[str, tuple[Any, Any]] = {}
    for key in COMPARED_SETTINGS:
        va, vb = _get(run_a, key), _get(run_b, key)
        if isinstance(va, dict) and isinstance(vb, dict):
            for sub in sorted(set(va) | set(vb)):
                if va.get(sub) != vb.get(sub):
                    out[f"{key}.{sub}"] = (va.get(sub), vb.get(sub))
        elif va != vb:
            out[key] = (va, vb)
    return out


def _side(path: Path, rows: list[dict]) -> RunSide:
    from sqlrl.evaluation.outcome import outcome

    outs = [x for x in map(outcome, rows) if x is not None]
    return RunSide(str(path), len(outs), sum(outs), len(rows) - len(outs))


def compare_runs(
    a: str | Path, b: str | Path, *, n_boot: int = 10000, seed: int = 0, ci: float = 0.95
) -> Comparison:
    """Paired comparison of evaluation run `b` against `a` (folders holding results.jsonl, or the files)."""
    from sqlrl.evidence.analysis import paired_outcomes, paired_statistics

    pa, pb = Path(a), Path(b)
    ra, rb = _results(pa), _results(pb)
    p = paired_outcomes(ra, rb)
    if not p["a"]:
        raise CompareError(f"{pa} and {pb} have no task scored in both")
    st = paired_statistics(p, n_boot=n_boot, seed=seed, ci=ci)
    run_a, run_b = _run_json(pa), _run_json(pb)
    missing = tuple(side for side, run in (("A", run_a), ("B", run_b)) if run is None)
    return Comparison(
        a=_side(pa, ra),
        b=_side(pb, rb),
        n=len(p["a"]),
        mean_a=st["mean_a"],
        mean_b=st["mean_b"],
        diff=st["diff"],
        ci_low=st["ci_low"],
        ci_high=st["ci_high"],
        ci=ci,
        p_value=st["p_value"],
        b_only=st["b_only"],
        a_only=st["a_only"],
        dropped_excluded=p["dropped_excluded"],
        unpaired=p["unpaired"],
        repair=st["repair"],
        differences={} if missing else setting_differences(run_a or {}, run_b or {}),
        no_run_json=missing,
    )


def _shown(v: Any) -> str:
    """A setting's value as printed; absent from run.json (a budget at its default is not recorded)."""
    return "(not recorded: default)" if v is None else repr(v)


def format_comparison(c: Comparison) -> str:
    """The text `sqlrl compare` prints."""

    def pct(x: float) -> str:
        return f"{100 * x:.1f}%"

    def pp(x: float) -> str:
        return f"{100 * x:+.1f} pp"

    r = c.repair
    lines = [
        f"A: {c.a.path}: {pct(c.a.accuracy)} ({c.a.correct}/{c.a.scored} scored, {c.a.excluded} excluded)",
        f"B: {c.b.path}: {pct(c.b.accuracy)} ({c.b.correct}/{c.b.scored} scored, {c.b.excluded} excluded)",
        f"paired on {c.n} tasks scored in both ({c.dropped_excluded} excluded in either, "
        f"{c.unpaired} in one run only): A {pct(c.mean_a)}, B {pct(c.mean_b)}",
        f"B - A: {pp(c.diff)} ({round(100 * c.ci)}% CI {pp(c.ci_low)} to {pp(c.ci_high)}), "
        f"exact McNemar p = {c.p_value:.2g}; B right and A wrong: {c.b_only}, A right and B wrong: {c.a_only}",
        f"of which execution repair {pp(r['repair_part'])} (non-executable -> match {r['repair_gains']}, "
        f"match -> non-executable {r['breakages']}), answer change {pp(r['answer_part'])} "
        f"(mismatch -> match {r['answer_gains']}, match -> mismatch {r['answer_losses']})",
    ]
    if c.no_run_json:
        lines.append(
            f"settings not compared: no readable run.json in {' and '.join(c.no_run_json)} "
            "(what the runs vary is unknown)"
        )
    elif c.differences:
        lines.append("settings that differ (A -> B):")
        lines += [f"  {k}: {_shown(va)} -> {_shown(vb)}" for k, (va, vb) in c.differences.items()]
    else:
        lines.append("settings that differ: none recorded (same model, tasks, budgets, sampling, engine)")
    return "\n".join(lines)
