"""Reading BIRD folders as downloaded, and `open_data`, the reader for any data folder.

Layout (BIRD's own files and nesting): a split file `<stem>.json` beside a `<stem>_databases/` folder
(else the only `*_databases/` folder beside it) holding `<db_id>/<db_id>.sqlite` and, optionally,
`<db_id>/database_description/<table>.csv`. Split files are looked for in the folder given and in its
immediate sub-folders, so each of these works as `--data`:
- the BIRD root holding `train/` (`train.json`, `train_tables.json`, `train_databases/`) and `dev/`
  (`dev.json`, `dev_tables.json`, `dev_databases/`); any sub-folder name works (`dev_20240627/`);
- `train/` or `dev/` alone; BIRD mini-dev's folder (`mini_dev_sqlite.json` beside `dev_databases/`).
`*_tables.json` files are not split files (their content is not needed). Examples need `db_id`,
`question`, `SQL` (the gold); `evidence` (public: shown to the policy unless `agent.show_evidence` is
off) and `difficulty` (private: simple / moderate / challenging, for the breakdown) are optional.

Split names are the file stems: `dev`, `mini_dev_sqlite`, `train.json` (the whole BIRD train file);
`train` / `validation` are the by-database split of `train.json` (`SpiderData`'s rule, for tuning on
BIRD train without touching dev). Task ids are `<stem>/<index, 5 digits>` as for Spider.

Not covered: BIRD's MySQL / PostgreSQL files (`mini_dev_mysql.json`, ...) load as SQLite tasks and are
refused only by their databases; a db id present under two database folders resolves to the first in
sorted folder order.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from sqlrl.tasks.data import (
    DATA_ARG,
    DataError,
    SpiderData,
    _Example,
    check_example,
    embedded_root,
    read_data_json,
)

__all__ = [
    "BIRD_DIFFICULTIES",
    "BirdData",
    "accuracy_by_difficulty",
    "add_column_descriptions",
    "bird_splits",
    "open_data",
]

BIRD_DIFFICULTIES = ("simple", "moderate", "challenging")
_MAX_DESCRIPTION = 200  # characters of one column's description text in the schema


def _db_dir_for(json_path: Path) -> Path | None:
    own = json_path.parent / f"{json_path.stem}_databases"
    if own.is_dir():
        return own
    dirs = sorted(p for p in json_path.parent.glob("*_databases") if p.is_dir())
    return dirs[0] if len(dirs) == 1 else None


def bird_splits(root: Path) -> dict[str, tuple[Path, Path]]:
    """{stem: (split file, its databases folder)} of a BIRD-layout folder (module docstring); raises
    DataError when two files share a stem."""
    out: dict[str, tuple[Path, Path]] = {}
    for folder in [root, *sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))]:
        for p in sorted(folder.glob("*.json")):
            if p.stem.endswith("_tables") or p.stem == "tables" or not p.is_file():
                continue
            db_dir = _db_dir_for(p)
            if db_dir is None:
                continue
            if p.stem in out:
                raise DataError(
                    f"two BIRD split files named {p.name}: {out[p.stem][0]} and {p}; keep one of them "
                    "under the folder given as --data"
                )
            out[p.stem] = (p, db_dir)
    return out


def open_data(root: str | os.PathLike) -> SpiderData:
    """The reader of a data folder: `BirdData` when it holds BIRD split files (and no `tables.json`),
    else `SpiderData` (which explains what a Spider folder needs)."""
    if root in ("embedded", "", None):
        return SpiderData(embedded_root())
    path = Path(root).expanduser()
    if path.is_dir() and not (path / "tables.json").is_file() and bird_splits(path.resolve()):
        return BirdData(path)
    return SpiderData(path)


def accuracy_by_difficulty(results: Iterable[Mapping]) -> dict | None:
    """Per BIRD difficulty (`BIRD_DIFFICULTIES`, then any other label found, then "unlabelled" when some
    rows have none): {"n" scored, "correct", "accuracy", "bird_correct", "bird_accuracy", "excluded"}
    over result rows {"difficulty", "correct" (None = excluded), "bird_correct"}. None when no row has a
    difficulty (a Spider split)."""
    rows = list(results)
    if not any(r.get("difficulty") for r in rows):
        return None
    empty = {"n": 0, "correct": 0, "accuracy": None, "bird_correct": 0, "bird_accuracy": None, "excluded": 0}
    out = {d: dict(empty) for d in BIRD_DIFFICULTIES}
    for r in rows:
        d = out.setdefault(str(r.get("difficulty") or "unlabelled"), dict(empty))
        if r.get("correct") is None:
            d["excluded"] += 1
        else:
            d["n"] += 1
            d["correct"] += int(bool(r["correct"]))
            d["bird_correct"] += int(bool(r.get("bird_correct")))
    for d in out.values():
        d["accuracy"] = d["correct"] / d["n"] if d["n"] else None
        d["bird_accuracy"] = d["bird_correct"] / d["n"] if d["n"] else None
    return out


def _description_rows(csv_path: Path) -> list[tuple[str, str, str]]:
    """(column, description, value description) rows of one `database_description/<table>.csv`."""
    raw = csv_path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:  # some BIRD description files are Latin-1
        text = raw.decode("latin-1")
    out = []
    for row in csv.DictReader(text.splitlines()):
        row = {str(k or "").strip().lower(): " ".join(str(v or "").split()) for k, v in row.items()}
        col = row.get("original_column_name", "")
        if col:
            out.append((col, row.get("column_description", ""), row.get("value_description", "")))
    return out


def _clip(s: str) -> str:
    return s if len(s) <= _MAX_DESCRIPTION else s[: _MAX_DESCRIPTION - 3] + "..."


_CREATE_TABLE = re.compile(
    r'(?is)^create\s+table\s+(?:if\s+not\s+exists\s+)?(?:"([^"]+)"|`([^`]+)`|\[([^\]]+)\]|([^\s(]+))'
)


def add_column_descriptions(schema: str, db_path: str | os.PathLike) -> str:
    """`schema` (blank-line separated statements) with, after each CREATE TABLE that has a
    `database_description/<table>.csv` beside the database (name matched ignoring case), a comment
    `/* column descriptions of T:` with one line `col: description [values: ...]` per described
    column `*/`. Unchanged when the folder is absent."""
    desc_dir = Path(db_path).parent / "database_description"
    if not desc_dir.is_dir():
        return schema
    files = {p.stem.strip().lower(): p for p in desc_dir.glob("*.csv")}
    blocks = schema.split("\n\n")
    for i, block in enumerate(blocks):
        m = _CREATE_TABLE.match(block.strip())
        path = files.get(next(g for g in m.groups() if g).strip().lower()) if m else None
        if path is None:
            continue
        lines = []
        for col, d, v in _description_rows(path):
            line = f"{col}: {_clip(d) or '(no description)'}"
            if v:
                line += f" [values: {_clip(v)}]"
            lines.append(line.replace("*/", "* /"))
        if lines:
            name = next(g for g in m.groups() if g)
            blocks[i] = block + f"\n/* column descriptions of {name}:\n" + "\n".join(lines) + "\n*/"
    return "\n\n".join(blocks)


class BirdData(SpiderData):
    """A folder in BIRD's layout (module docstring). Same interface as `SpiderData`."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser().resolve()
        if not self.root.is_dir():
            raise DataError(f"BIRD data folder {self.root} does not exist or is not a folder")
        self._splits = bird_splits(self.root)
        if not self._splits:
            raise DataError(
                f"{self.root} holds no BIRD split file (e.g. dev/dev.json beside dev/dev_databases/); "
                f"point {DATA_ARG} at the BIRD folder as downloaded"
            )
        super()._init_caches()

    def __repr__(self) -> str:
        return f"BirdData({str(self.root)!r})"

    def splits(self) -> list[str]:
        return sorted(self._splits)

    def training_file(self) -> str:
        if "train" in self._splits:
            return "train"
        raise DataError(
            f"{self.root} has no BIRD train.json (beside train_databases/), so there is no "
            f"`train`/`validation` split; available splits: {self._available()}"
        )

    def db_path(self, db_id: str) -> Path:
        """`<databases folder>/<db_id>/<db_id>.sqlite` in the first databases folder that has it."""
        hit = self._db_paths.get(db_id)
        if hit is not None:
            return hit
        dirs = sorted({d for _, d in self._splits.values()})
        for d in dirs:
            p = d / db_id / f"{db_id}.sqlite"
            if p.is_file():
                self._db_paths[db_id] = p
                return p
        return dirs[0] / db_id / f"{db_id}.sqlite"

    def _split_file(self, stem: str) -> Path:
        hit = self._splits.get(stem)
        if hit is None:
            raise DataError(f"no BIRD split {stem!r} in {self.root}; available: {self._available()}")
        return hit[0]

    def _parse(self, path: Path, raw: object) -> list[_Example]:
        if not isinstance(raw, list):
            raise DataError(f"{path} must hold a JSON list of BIRD examples, found {type(raw).__name__}")
        out: list[_Example] = []
        for i, ex in enumerate(raw):
            if not isinstance(ex, dict):
                raise DataError(f"{path}, example {i}: expected an object, found {type(ex).__name__}")
            check_example(path, i, ex, "SQL", "every BIRD example")
            db_id = ex["db_id"]
            evidence, difficulty = ex.get("evidence") or "", ex.get("difficulty") or ""
            if not isinstance(evidence, str) or not isinstance(difficulty, str):
                raise DataError(f"{path}, example {i}: evidence and difficulty must be strings when present")
            out.append(_Example(i, db_id, ex["question"], ex["SQL"], None, evidence, difficulty.lower()))
        return out

    def _read_file(self, stem: str) -> list[_Example]:
        with self._lock:
            hit = self._examples.get(stem)
        if hit is not None:
            return hit
        path = self._split_file(stem)
        out = self._parse(path, read_data_json(path))
        with self._lock:
            self._examples[stem] = out
        return out

    def _check_databases(self, stem: str, examples: list[_Example]) -> None:
        missing = sorted({e.db_id for e in examples if not os.path.lexists(self.db_path(e.db_id))})
        if missing:
            shown = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
            raise DataError(
                f"{stem}.json refers to {len(missing)} database(s) missing from {self._splits[stem][1]}: "
                f"{shown}; expected e.g. {self.db_path(missing[0])}. Unzip BIRD's databases archive "
                "there, or remove their examples from the json."
            )
