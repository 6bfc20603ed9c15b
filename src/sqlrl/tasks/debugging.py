"""Stateful SQL-debugging tasks (BIRD-Critic / BIRD-RL style): the task types and their JSONL file.

A user describes a problem, shows the schema and their buggy SQL; the agent submits a fixed solution;
hidden test cases (SQL run after the solution) decide success. Episodes and scoring:
`sqlrl.tasks.debug_episode`; the task builder: `sqlrl.tasks.debug_build`.

What is covered:
- `DebugTaskPublic` (the policy may see it): task_id, db_id, category (query | management |
  personalization), description, schema, buggy_sql, preprocess_sql (tuple), db_path. Nothing
  reachable from it holds the solution or the tests (a plain frozen dataclass of strings / tuples of
  strings; no back reference, no cache keyed on it).
- `DebugTaskPrivate(public, solution_sql, test_cases, clean_up_sql)` is NOT a subclass of the public
  type; `ensure_public_debug` rejects it.
- JSONL (`save_debug_tasks` / `load_debug_tasks`): one object per line, `{"version": 1, "split": ...,
  "public": {...}, "solution_sql": [...], "test_cases": [...], "clean_up_sql": [...], "meta": {...}}`
  with sorted keys, so the same tasks give byte-identical files; a relative `db_path` is resolved
  against the JSONL file's folder.

What is not:
- that the description alone pins down the intended solution (as in Spider, values and column
  choices can be ambiguous); success is defined by the tests only.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CATEGORIES",
    "DEBUG_FORMAT_VERSION",
    "DebugTaskPrivate",
    "DebugTaskPublic",
    "debug_demo_root",
    "ensure_public_debug",
    "load_debug_tasks",
    "resolve_debug_file",
    "save_debug_tasks",
]

DEBUG_FORMAT_VERSION = 1
CATEGORIES = ("query", "management", "personalization")

# --------------------------------------------------------------------------------------------- types


@dataclass(frozen=True)
class DebugTaskPublic:
    """Everything the policy may see. Holds no solution and no test case."""

    task_id: str
    db_id: str
    category: str  # query | management | personalization
    description: str
    schema: str
    buggy_sql: str
    preprocess_sql: tuple[str, ...]
    db_path: str

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"category must be one of {CATEGORIES}, got {self.category!r}")
        object.__setattr__(self, "preprocess_sql", tuple(self.preprocess_sql))


@dataclass(frozen=True)
class DebugTaskPrivate:
    """A public debugging task plus its reference solution, hidden tests and clean-up. Not a subclass."""

    public: DebugTaskPublic
    solution_sql: tuple[str, ...]
    test_cases: tuple[str, ...]
    clean_up_sql: tuple[str, ...] = ()
    split: str = ""
    meta: dict = field(default_factory=dict, compare=False)  # builder provenance (e.g. mutation kind)

    def __post_init__(self) -> None:
        for name in ("solution_sql", "test_cases", "clean_up_sql"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def task_id(self) -> str:
        return self.public.task_id

    @property
    def category(self) -> str:
        return self.public.category


def ensure_public_debug(task: Any) -> DebugTaskPublic:
    """Return `task` if it is a DebugTaskPublic; TypeError for a DebugTaskPrivate or anything else."""
    if isinstance(task, DebugTaskPrivate):
        raise TypeError(
            "ensure_public_debug: got a DebugTaskPrivate (it carries the solution and the tests); pass "
            "`task.public` to the policy instead."
        )
    if type(task) is not DebugTaskPublic:
        raise TypeError(f"ensure_public_debug: expected DebugTaskPublic, got {type(task).__qualname__}")
    return task


# ---------------------------------------------------------------------------------------------- JSONL


def _to_record(t: DebugTaskPrivate, db_path: str | None = None) -> dict:
    p = t.public
    pub = {
        "task_id": p.task_id,
        "db_id": p.db_id,
        "category": p.category,
        "description": p.description,
        "schema": p.schema,
        "buggy_sql": p.buggy_sql,
        "preprocess_sql": list(p.preprocess_sql),
        "db_path": p.db_path if db_path is None else db_path,
    }
    return {
        "version": DEBUG_FORMAT_VERSION,
        "split": t.split,
        "public": pub,
        "solution_sql": list(t.solution_sql),
        "test_cases": list(t.test_cases),
        "clean_up_sql": list(t.clean_up_sql),
        "meta": t.meta,
    }


def save_debug_tasks(
    tasks: list[DebugTaskPrivate], path: str | os.PathLike, *, relative_to: str | None = None
):
    """Write tasks as JSONL (sorted keys, UTF-8). With `relative_to`, db paths are stored relative to it."""
    lines = []
    for t in tasks:
        dbp = None
        if relative_to is not None:
            dbp = os.path.relpath(t.public.db_path, relative_to).replace(os.sep, "/")
        lines.append(json.dumps(_to_record(t, dbp), sort_keys=True, ensure_ascii=False))
    Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def load_debug_tasks(path: str | os.PathLike) -> list[DebugTaskPrivate]:
    """Read a JSONL written by `save_debug_tasks`; relative db paths resolve against the file's folder."""
    path = Path(path)
    base = path.resolve().parent
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        rec = json.loads(line)
        if rec.get("version") != DEBUG_FORMAT_VERSION:
            raise ValueError(f"{path}:{i + 1}: unsupported debug task version {rec.get('version')!r}")
        pub = dict(rec["public"])
        if not os.path.isabs(pub["db_path"]):
            pub["db_path"] = str((base / pub["db_path"]).resolve())
        out.append(
            DebugTaskPrivate(
                public=DebugTaskPublic(**pub),
                solution_sql=rec["solution_sql"],
                test_cases=rec["test_cases"],
                clean_up_sql=rec.get("clean_up_sql", []),
                split=rec.get("split", ""),
                meta=rec.get("meta", {}),
            )
        )
    return out


def debug_demo_root() -> Path:
    """The embedded demo slice (debug_tasks.jsonl + copied databases; Spider, CC BY-SA 4.0)."""
    return Path(__file__).resolve().parents[1] / "embedded" / "debug_demo"


def resolve_debug_file(path: str | os.PathLike | None) -> Path:
    """`data.path` of a debug run -> the task file: `embedded` (the demo slice), a folder holding
    `debug_tasks.jsonl`, or a `.jsonl` file (as `envs.DebugEnv` reads it). FileNotFoundError if absent."""
    p = Path(debug_demo_root() if path in ("embedded", "", None) else path)
    file = p / "debug_tasks.jsonl" if p.is_dir() else p
    if not file.is_file():
        raise FileNotFoundError(f"no debugging tasks at {file}; build them with bench/make_debug_tasks.py")
    return file
