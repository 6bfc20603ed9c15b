"""The run-folder reader: a read-only view of an experiment folder (layout: docs/DESIGN.md, "Run folders").

`Experiment(exp_dir)` reads experiment.json and resolves each arm's train and eval run folders (declared
paths relative to the folder or the working directory, else `arms/<arm>/{train,eval}`). Its readers
(`results`, `trajectories`, `summary`, `eval_run`, `train_run`, `steps`, `audit`, ...) are cached and
tolerant: an absent or unreadable file reads as None. Unreadable: not JSON, a JSON file that is not an
object, a JSONL file with a line that is not an object, a corrupt gzip file. A large JSONL file may be
stored gzipped (`x.jsonl.gz`); whichever exists is read, here and by `has_eval`.

What is covered:
- a folder that is not an experiment folder (missing, not a directory, no experiment.json, one that is
  not a JSON object, `arms` not a mapping of objects, `config` or `git` not an object, `tasks` not a
  list, an arm whose `turns` or `context_tokens` is not a whole number or whose `train_run`, `eval_run`
  or `branch_eval_run` is not a path) raises `ExperimentError` (CLI exit 2);
- `has_train` / `has_eval`: the run.json is a readable object (and, for eval, results.jsonl or
  results.jsonl.gz exists), so the gate's checks name an unreadable one as a missing run;
- arm lookups by kind and cell (`primary`, `same_cell`, `base_for`), used by the gate, the report and
  `sqlrl seeds` alike. An arm's cell is its (turns, context_tokens) from experiment.json; context_tokens
  is None for an arm of a matrix without a context axis (and for every folder written before it existed).

What is not:
- no file is validated beyond being JSON; judging the contents is the evidence gate's job;
- nothing is written, and no hash is recomputed.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlrl.artifacts import read_json, read_jsonl

RUN_FLAGS = ("smoke", "synthetic", "partial")
# Arms trained with GRPO from the base model and held to base and the controls of their cell
GRPO_KINDS = ("grpo", "grpo_checker")
# Budget settings an arm kind sets itself (its treatment), with the value it must record: the only way
# its budgets may differ from the other arms of its cell
TREATMENT_BUDGETS = {"grpo_checker": {"checker": True}}


class ExperimentError(ValueError):
    """The folder is not an experiment folder at all (CLI exit code 2)."""


@dataclass
class Arm:
    """One arm of experiment.json: its kind, cell (turns, context_tokens), declared budgets and run folders."""

    name: str
    kind: str
    budgets: dict | None
    turns: Any
    train_dir: Path | None
    eval_dir: Path | None
    spec: dict
    context_tokens: Any = None

    @property
    def cell(self) -> tuple[str, str]:
        """The comparison group: arms are compared, and must have equal budgets, within one cell."""
        return json.dumps(self.turns, sort_keys=True, default=str), json.dumps(
            self.context_tokens, default=str
        )

    @property
    def cell_label(self) -> str:
        """`turns=3`, or `turns=3, context_tokens=2048` for an arm of a context axis."""
        ctx = "" if self.context_tokens is None else f", context_tokens={self.context_tokens!r}"
        return f"turns={self.turns!r}{ctx}"


def _resolve_run(exp_dir: Path, spec: dict, key: str, arm: str, sub: str) -> Path | None:
    default = exp_dir / "arms" / arm / sub
    if key not in spec:
        return default if default.is_dir() else None
    value = spec[key]
    if value is None:
        return None
    p = Path(value)
    if p.is_absolute():
        return p
    for cand in (exp_dir / p, Path.cwd() / p):
        if cand.is_dir():
            return cand
    # Declared but absent: fall back to the conventional place, else report the declared path.
    return default if default.is_dir() else exp_dir / p


class Experiment:
    """Read-only view of an experiment folder with cached, tolerant readers (None when absent/bad)."""

    def __init__(self, exp_dir: str | Path):
        self.dir = Path(exp_dir)
        if not self.dir.exists():
            raise ExperimentError(f"{self.dir}: no such folder")
        if not self.dir.is_dir():
            raise ExperimentError(f"{self.dir}: not a folder")
        meta_path = self.dir / "experiment.json"
        if not meta_path.is_file():
            raise ExperimentError(f"{self.dir}: no experiment.json (is this an experiment folder?)")
        try:
            self.meta = read_json(meta_path)
        except (OSError, ValueError, RecursionError) as e:  # ValueError: bad JSON or not UTF-8
            raise ExperimentError(f"{meta_path}: not valid JSON ({e})") from None
        if not isinstance(self.meta, dict):
            raise ExperimentError(f"{meta_path}: not a JSON object")
        if not isinstance(self.meta.get("arms", {}), dict):
            raise ExperimentError(f"{meta_path}: 'arms' is not a mapping")
        for key, kind, words in (
            ("config", dict, "an object"),
            ("git", dict, "an object"),
            ("tasks", list, "a list"),
        ):
            if self.meta.get(key) is not None and not isinstance(self.meta[key], kind):
                raise ExperimentError(f"{meta_path}: {key!r} is not {words}")
        self.arms: dict[str, Arm] = {}
        for name, spec in (self.meta.get("arms") or {}).items():
            _check_spec(meta_path, name, spec)
            self.arms[name] = Arm(
                name=name,
                kind=str(spec.get("kind", "")),
                budgets=spec.get("budgets") if isinstance(spec.get("budgets"), dict) else None,
                turns=spec.get("turns"),
                train_dir=_resolve_run(self.dir, spec, "train_run", name, "train"),
                eval_dir=_resolve_run(self.dir, spec, "eval_run", name, "eval"),
                spec=spec,
                context_tokens=spec.get("context_tokens"),
            )
        self._cache: dict[tuple, Any] = {}

    @property
    def name(self) -> str:
        return str(self.meta.get("name") or self.dir.name)

    def flags(self) -> dict[str, bool]:
        return {f: bool(self.meta.get(f)) for f in RUN_FLAGS}

    def arms_of(self, kind: str) -> list[Arm]:
        return [a for a in self.arms.values() if a.kind == kind]

    def grpo_arms(self) -> list[Arm]:
        """The arms of a `GRPO_KINDS` kind (grpo, grpo_checker), in experiment.json order."""
        return [a for a in self.arms.values() if a.kind in GRPO_KINDS]

    def primary(self, kind: str) -> Arm | None:
        """The arm named like its kind if there is one, else the first arm of that kind."""
        arm = self.arms.get(kind)
        if arm is not None and arm.kind == kind:
            return arm
        arms = self.arms_of(kind)
        return arms[0] if arms else None

    def same_cell(self, arm: Arm, kind: str) -> list[Arm]:
        """Arms of `kind` evaluated in the same cell (turns and context length) as `arm`."""
        return [a for a in self.arms.values() if a.kind == kind and a.cell == arm.cell]

    def base_for(self, arm: Arm) -> Arm | None:
        """The base arm `arm` is compared against: the primary base if it is in the same cell, else the
        first base arm in the same cell, else None."""
        primary = self.primary("base")
        if primary is not None and primary.cell == arm.cell:
            return primary
        bases = self.same_cell(arm, "base")
        return bases[0] if bases else None

    def _json(self, path: Path | None) -> dict | None:
        """The JSON object at `path`; None when absent, not JSON or not an object."""
        if path is None:
            return None
        key = ("json", str(path))
        if key not in self._cache:
            try:
                value = read_json(path) if path.is_file() else None
            except (OSError, ValueError):
                value = None
            self._cache[key] = value if isinstance(value, dict) else None
        return self._cache[key]

    def _jsonl(self, path: Path | None) -> list[dict] | None:
        """The records at `path` (plain or gzipped); None when absent, unreadable or a record is not an
        object."""
        if path is None:
            return None
        key = ("jsonl", str(path))
        if key not in self._cache:
            try:
                rows = list(read_jsonl(path)) if path.is_file() else None
            except (OSError, ValueError, EOFError, zlib.error):  # EOFError, zlib.error: a corrupt .gz
                rows = None
            self._cache[key] = rows if rows is None or all(isinstance(r, dict) for r in rows) else None
        return self._cache[key]

    def eval_file(self, arm: str, name: str) -> Path | None:
        d = self.arms[arm].eval_dir
        return maybe_gz(d / name) if d is not None else None

    def train_file(self, arm: str, name: str) -> Path | None:
        d = self.arms[arm].train_dir
        return maybe_gz(d / name) if d is not None else None

    def eval_run(self, arm: str) -> dict | None:
        return self._json(self.eval_file(arm, "run.json"))

    def summary(self, arm: str) -> dict | None:
        return self._json(self.eval_file(arm, "summary.json"))

    def results(self, arm: str) -> list[dict] | None:
        return self._jsonl(self.eval_file(arm, "results.jsonl"))

    def trajectories(self, arm: str) -> list[dict] | None:
        return self._jsonl(self.eval_file(arm, "trajectories.jsonl"))

    def train_run(self, arm: str) -> dict | None:
        return self._json(self.train_file(arm, "run.json"))

    def steps(self, arm: str) -> list[dict] | None:
        return self._jsonl(self.train_file(arm, "steps.jsonl"))

    def curve(self, arm: str) -> list[dict] | None:
        return self._jsonl(self.train_file(arm, "curve.jsonl"))

    def run_curve(self, run_dir: Path) -> list[dict] | None:
        """curve.jsonl of a training run folder that is no arm's own (grpo_sft's SFT stage)."""
        return self._jsonl(maybe_gz(run_dir / "curve.jsonl"))

    def branch_eval_dir(self, arm: str) -> Path | None:
        """The evaluation folder of an sft arm's branch weights (experiment.json `branch_eval_run`, else
        `arms/<arm>/branch_eval`), None when it holds no run.json."""
        spec = self.arms[arm].spec
        d = _resolve_run(self.dir, spec, "branch_eval_run", arm, "branch_eval")
        return d if d is not None and (d / "run.json").is_file() else None

    def run_results(self, run_dir: Path) -> list[dict] | None:
        """results.jsonl of an evaluation folder that is no arm's own (an sft arm's branch evaluation)."""
        return self._jsonl(maybe_gz(run_dir / "results.jsonl"))

    def run_json(self, run_dir: Path, name: str = "run.json") -> dict | None:
        """A JSON file of a run folder that is no arm's own."""
        return self._json(run_dir / name)

    def train_config(self, arm: str) -> dict | None:
        return self._json(self.train_file(arm, "config.json"))

    def self_consistency(self, arm: str) -> dict | None:
        return self._json(self.eval_file(arm, "self_consistency.json"))

    def self_consistency_results(self, arm: str) -> list[dict] | None:
        return self._jsonl(self.eval_file(arm, "self_consistency.jsonl"))

    def audit(self, name: str) -> dict | None:
        return self._json(self.dir / name)

    def has_train(self, arm: str) -> bool:
        """The arm's train run.json is a readable JSON object."""
        return self.train_run(arm) is not None

    def has_eval(self, arm: str) -> bool:
        """The arm's eval run.json is a readable JSON object and results.jsonl (or .gz) exists."""
        path = self.eval_file(arm, "results.jsonl")
        return self.eval_run(arm) is not None and path is not None and path.is_file()

    def fingerprint(self, arm: str) -> str | None:
        for src in (self.summary(arm), self.eval_run(arm)):
            if isinstance(src, dict):
                for key in ("fingerprint", "dataset_fingerprint"):
                    if src.get(key):
                        return str(src[key])
        return None

    def eval_budgets(self, arm: str) -> dict | None:
        for src in (self.eval_run(arm), self.summary(arm)):
            if isinstance(src, dict) and isinstance(src.get("budgets"), dict):
                return src["budgets"]
        return None


def _check_spec(meta_path: Path, name: str, spec: Any) -> None:
    """Raise ExperimentError for an arm entry of experiment.json that cannot be read as an arm."""
    if not isinstance(spec, dict):
        raise ExperimentError(f"{meta_path}: arm {name!r} is not an object")
    for key in ("turns", "context_tokens"):
        v = spec.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ExperimentError(f"{meta_path}: arm {name!r}: {key} is {v!r}, not a whole number >= 1")
    for key in ("train_run", "eval_run", "branch_eval_run"):
        v = spec.get(key)
        if v is not None and not isinstance(v, str):
            raise ExperimentError(f"{meta_path}: arm {name!r}: {key} is {v!r}, not a path")


def maybe_gz(path: Path) -> Path:
    """Committed results keep large JSONL files gzipped (`x.jsonl.gz`); read whichever exists."""
    if not path.exists() and path.suffix == ".jsonl":
        gz = path.with_name(path.name + ".gz")
        if gz.exists():
            return gz
    return path
