"""Spider-layout folders (BIRD's: `sqlrl.tasks.bird`): tasks, by-database split, fingerprints, schema.

Standard library only. Layout (the official Spider 1.0 one, so a full download works unchanged):
`ROOT/<split>.json` (list of {"db_id", "question", "query", ...}), `ROOT/tables.json` (must exist;
its content is not needed), `ROOT/database/<db_id>/<db_id>.sqlite`.

What is covered:
- `PublicTask` is everything the policy may see and holds no gold SQL (no field, back reference or
  cache keyed to it). `PrivateTask` wraps it plus the gold and is *not* a subclass, so
  `isinstance(private, PublicTask)` is False; `ensure_public` is the run-time check.
- task ids are `"<file stem>/<index in that file, 5 digits>"` (e.g. `"train_spider/00042"`), the same
  whether the task is loaded as `train_spider`, `train` or `validation`;
- `train` / `validation` split the training file (`train_spider.json`, else `train.json`) by
  database (`split_by_database`): deterministic for (db ids, seed, val_fraction), independent of
  example order, no database on both sides;
- `fingerprint` changes when any example of the split (or their order) or any byte of a database
  file they use changes; data errors are `DataError` (a ValueError) saying what, where and how to fix;
- a database that is absent raises `DataError`; one that exists but is damaged (`sqlrl.tasks.dbcheck`,
  checked once per process) is named by `damaged_databases`, its tasks load with an empty schema.

What is not:
- that the gold SQL executes or returns rows (`sqlrl.tasks.goldcache.audit_golds` checks that);
- that `tables.json` agrees with the SQLite files: schema text comes from the file's `sqlite_master`;
- file hashes are cached per (path, mtime_ns, size) in-process: a same-size rewrite within the same
  mtime_ns would not be re-hashed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import sqlite3
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlrl.tasks.dbcheck import database_problem

__all__ = [
    "DataError",
    "PublicTask",
    "PrivateTask",
    "SpiderData",
    "embedded_root",
    "ensure_public",
    "file_sha256",
    "paraphrase_count",
    "schema_text",
    "split_by_database",
]

log = logging.getLogger(__name__)

SPLIT_NAMES = ("train", "validation")
PARAPHRASE_SUFFIX = "-syn"
_FINGERPRINT_VERSION = "sqlrl-data-fingerprint-v1"


class DataError(ValueError):
    """The data folder is missing something or holds something malformed; the message says how to fix it."""


# --------------------------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class PublicTask:
    """Everything the policy may see. Never holds the gold SQL."""

    task_id: str  # "<source-file-stem>/<index in that file, 5 digits>", e.g. "train_spider/00042"
    db_id: str
    question: str
    schema: str  # full rendered schema text (CREATE statements from sqlite_master, in file order)
    evidence: str  # allowed evidence (empty for Spider)
    db_path: str  # absolute path of the .sqlite file


@dataclass(frozen=True)
class PrivateTask:
    """A public task plus its gold SQL. NOT a subclass of PublicTask: never hand this to the policy."""

    public: PublicTask
    gold_sql: str
    difficulty: str = ""  # BIRD's label (simple / moderate / challenging); empty for Spider

    @property
    def task_id(self) -> str:
        return self.public.task_id

    @property
    def db_id(self) -> str:
        return self.public.db_id

    @property
    def db_path(self) -> str:
        return self.public.db_path


def ensure_public(task: Any) -> PublicTask:
    """Return `task` if it is a PublicTask; raise TypeError for a PrivateTask or anything else."""
    if isinstance(task, PrivateTask):
        raise TypeError(
            "ensure_public: got a PrivateTask (it carries the gold SQL); the policy and the rollout may "
            "only see PublicTask. Pass `task.public` instead."
        )
    if type(task) is not PublicTask:
        raise TypeError(
            f"ensure_public: expected sqlrl.tasks.data.PublicTask, got {type(task).__module__}.{type(task).__qualname__}"
        )
    return task


# ------------------------------------------------------------------------------------------- hashing

_HASH_CACHE: dict[tuple[str, int, int], str] = {}
_HASH_LOCK = threading.Lock()


def read_data_json(path: Path):
    """A data folder's JSON file, parsed; DataError (one line, naming the file) when it is not UTF-8 JSON
    or is nested too deeply to read."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path} is not valid UTF-8 JSON ({e}); re-download or fix the file") from e
    except RecursionError:
        raise DataError(
            f"{path} is malformed: its JSON is nested too deeply to read; re-download or fix the file"
        ) from None


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 hex of a file's bytes, cached in-process per (real path, mtime_ns, size). OSError for a path
    that is not a regular file (a FIFO or a device would block or never end)."""
    real = os.path.realpath(path)
    st = os.stat(real)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(f"{path} is not a regular file")
    key = (real, st.st_mtime_ns, st.st_size)
    with _HASH_LOCK:
        hit = _HASH_CACHE.get(key)
    if hit is not None:
        return hit
    h = hashlib.sha256()
    with open(real, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    digest = h.hexdigest()
    with _HASH_LOCK:
        _HASH_CACHE[key] = digest
    return digest


# ------------------------------------------------------------------------------------------- split


def split_by_database(db_ids: Any, seed: int = 0, val_fraction: float = 0.1) -> tuple[list[str], list[str]]:
    """Split database ids into (train_dbs, val_dbs), both sorted.

    Rule: de-duplicate and sort the ids, shuffle with `random.Random(seed)`, and put the first
    `max(1, round(val_fraction * n))` into validation. Pure: depends only on the set of ids, the
    seed and the fraction. Needs at least 2 databases, and always leaves at least one for training.
    """
    if isinstance(db_ids, str):
        raise TypeError("split_by_database: db_ids must be an iterable of db ids, not a string")
    ids = sorted(set(db_ids))
    if not isinstance(val_fraction, int | float) or not 0.0 < float(val_fraction) < 1.0:
        raise DataError(
            f"val_fraction must be a number strictly between 0 and 1, got {val_fraction!r}; e.g. 0.1"
        )
    if len(ids) < 2:
        raise DataError(
            f"a by-database split needs at least 2 databases, the training file has {len(ids)} "
            f"({ids}); add databases or load the json split directly instead of train/validation"
        )
    rng = random.Random(seed)
    shuffled = list(ids)
    rng.shuffle(shuffled)
    n_val = max(1, round(float(val_fraction) * len(ids)))
    n_val = min(n_val, len(ids) - 1)
    return sorted(shuffled[n_val:]), sorted(shuffled[:n_val])


# ------------------------------------------------------------------------------------------ schema


def _connect_ro(db_path: str | os.PathLike) -> sqlite3.Connection:
    uri = Path(db_path).resolve().as_uri() + "?mode=ro"
    con = sqlite3.connect(uri, uri=True)
    con.text_factory = lambda b: b.decode("utf-8", errors="replace")
    return con


def _render_value(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bytes):
        return "X'" + v.hex() + "'"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        s = v.replace("\n", " ")
        return "'" + (s if len(s) <= 60 else s[:57] + "...") + "'"
    return str(v)


def schema_text(db_path: str | os.PathLike, max_chars: int | None = None, sample_rows: int = 0) -> str:
    """Render a database's schema as its CREATE statements from `sqlite_master`.

    Statements come in file order (`sqlite_master` rowid order): tables, and any views, indexes and
    triggers that have SQL, skipping SQLite's internal `sqlite_*` objects. Each statement is stripped
    of trailing whitespace and ends with `;`; statements are separated by a blank line. No data rows
    are included unless `sample_rows > 0`, in which case each table's statement is followed by a
    `/* first N rows of T: ... */` comment with up to that many rows.

    Truncation rule when `max_chars` is set: whole statements (each with its sample-row comment) are
    kept in order while the text, including the final marker line, fits in `max_chars`; at the first
    one that does not fit, it and everything after it are dropped (no skipping ahead to smaller ones)
    and a line `-- [schema truncated: K more tables]` is appended, K being the number of tables not
    shown. Statements are never cut in the middle. The result is at most `max_chars` long, except when
    `max_chars` is smaller than the marker line itself, in which case the marker alone is returned.
    """
    if not Path(db_path).is_file():
        raise DataError(f"schema_text: no database file at {db_path}")
    if sample_rows < 0:
        raise ValueError("sample_rows must be >= 0")
    con = _connect_ro(db_path)
    try:
        entries = con.execute(
            "SELECT type, name, sql FROM sqlite_master "
            "WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY rowid"
        ).fetchall()
        blocks: list[tuple[str, str]] = []  # (type, text)
        for typ, name, sql in entries:
            text = sql.rstrip().rstrip(";").rstrip() + ";"
            if sample_rows and typ == "table":
                quoted = '"' + name.replace('"', '""') + '"'
                try:
                    cur = con.execute(f"SELECT * FROM {quoted} LIMIT {int(sample_rows)}")
                    cols = [d[0] for d in cur.description]
                    rows = cur.fetchall()
                except sqlite3.Error as e:  # e.g. a virtual table whose module is not loaded
                    cols, rows = [], []
                    text += f"\n/* rows of {name} unavailable: {e} */"
                if cols:
                    lines = [f"/* first {len(rows)} rows of {name}:", " | ".join(cols)]
                    lines += [" | ".join(_render_value(v) for v in r) for r in rows]
                    text += "\n" + "\n".join(lines) + "\n*/"
            blocks.append((typ, text))
    except sqlite3.DatabaseError as e:
        raise DataError(f"schema_text: cannot read {db_path} as SQLite ({e}); re-download the file") from e
    finally:
        con.close()

    full = "\n\n".join(t for _, t in blocks)
    if max_chars is None or len(full) <= max_chars:
        return full
    n_tables = sum(1 for typ, _ in blocks if typ == "table")
    kept: list[str] = []
    used = 0
    tables_kept = 0
    for typ, text in blocks:
        marker = f"-- [schema truncated: {n_tables - tables_kept - (typ == 'table')} more tables]"
        sep = 2 if kept else 0
        # the block must fit together with the marker that would follow it
        if used + sep + len(text) + 2 + len(marker) > max_chars:
            break
        kept.append(text)
        used += sep + len(text)
        tables_kept += typ == "table"
    marker = f"-- [schema truncated: {n_tables - tables_kept} more tables]"
    return "\n\n".join(kept + [marker])


# ------------------------------------------------------------------------------------------ folder


def embedded_root() -> Path:
    """The demo subset shipped inside the package (Spider layout, CC BY-SA 4.0, see its README.md)."""
    return Path(__file__).resolve().parents[1] / "embedded" / "spider_demo"


@dataclass(frozen=True)
class _Example:
    index: int
    db_id: str
    question: str
    query: str
    question_syn: str | None = None  # Spider-Syn paraphrase, when the file has one
    evidence: str = ""  # BIRD's evidence (public); empty for Spider
    difficulty: str = ""  # BIRD's difficulty label; empty for Spider


def _same_question(a: str, b: str) -> bool:
    return " ".join(a.split()).lower() == " ".join(b.split()).lower()


def paraphrase_count(tasks: list) -> int:
    """How many of `tasks` are Spider-Syn paraphrase tasks (id suffix `PARAPHRASE_SUFFIX`)."""
    return sum(1 for t in tasks if t.task_id.endswith(PARAPHRASE_SUFFIX))


def check_example(path: Path, i: int, ex: dict, gold_key: str, who: str) -> None:
    """Raise DataError unless example `i` of `path` has string "db_id", "question" and `gold_key` and
    a db_id that names a folder (no path separators, not "." or "..")."""
    bad = [k for k in ("db_id", "question", gold_key) if not isinstance(ex.get(k), str)]
    if bad:
        what = ", ".join(f"{k!r} ({'missing' if k not in ex else type(ex[k]).__name__})" for k in bad)
        raise DataError(
            f'{path}, example {i}: field(s) {what} must be strings; {who} needs "db_id", "question" and "{gold_key}"'
        )
    db_id = ex["db_id"]
    if not db_id or "/" in db_id or "\\" in db_id or db_id in (".", ".."):
        raise DataError(f"{path}, example {i}: invalid db_id {db_id!r}")


# where a data folder is given, named in errors: `eval` and `audit` take --data, run files data.path
DATA_ARG = "--data (data.path in a TOML run file)"


class SpiderData:
    """A folder in the official Spider layout, or ``"embedded"`` for the demo subset shipped in the package
    (a folder named embedded: ``./embedded``). Cheap to construct; files are read on first use."""

    def __init__(self, root: str | os.PathLike):
        self.root = (embedded_root() if root == "embedded" else Path(root).expanduser()).resolve()
        if not self.root.exists():
            raise DataError(
                f"data folder {self.root} does not exist; point {DATA_ARG} at a folder in the Spider "
                "layout (<split>.json, tables.json, database/<db_id>/<db_id>.sqlite)"
            )
        if not self.root.is_dir():
            raise DataError(f"data path {self.root} is not a folder; pass the folder that holds tables.json")
        if not (self.root / "tables.json").is_file():
            raise DataError(
                f"{self.root} has no tables.json, so it is not a Spider-layout folder; point {DATA_ARG} at the "
                "folder that holds tables.json, <split>.json and database/"
            )
        self._init_caches()

    def _init_caches(self) -> None:
        self._examples: dict[str, list[_Example]] = {}
        self._schemas: dict[str, str] = {}
        self._db_paths: dict[str, Path] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SpiderData({str(self.root)!r})"

    # ---- discovery

    def splits(self) -> list[str]:
        """Json split names (file stems) in the folder, sorted; excludes tables.json and *_tables.json."""
        out = []
        for p in self.root.glob("*.json"):
            stem = p.stem
            if stem == "tables" or stem.endswith("_tables") or not p.is_file():
                continue
            out.append(stem)
        return sorted(out)

    def training_file(self) -> str:
        """Stem of the file that `train` / `validation` split: train_spider if present, else train."""
        for stem in ("train_spider", "train"):
            if (self.root / f"{stem}.json").is_file():
                return stem
        raise DataError(
            f"{self.root} has neither train_spider.json nor train.json, so there is no `train`/`validation` "
            f"split; available splits: {self._available()}"
        )

    def _available(self) -> str:
        s = self.splits()
        return ", ".join(s + list(SPLIT_NAMES)) if s else "(none: the folder has no <split>.json)"

    def db_path(self, db_id: str) -> Path:
        """Expected path of a database file (database/, or test_database/ for the official test set)."""
        hit = self._db_paths.get(db_id)
        if hit is not None:
            return hit
        p = self.root / "database" / db_id / f"{db_id}.sqlite"
        if not p.is_file():
            alt = self.root / "test_database" / db_id / f"{db_id}.sqlite"
            if alt.is_file():
                p = alt
            else:
                return p  # not cached: the file may still appear
        self._db_paths[db_id] = p
        return p

    # ---- reading

    def _read_file(self, stem: str) -> list[_Example]:
        with self._lock:
            hit = self._examples.get(stem)
        if hit is not None:
            return hit
        path = self.root / f"{stem}.json"
        if not path.is_file():
            raise DataError(
                f"no split {stem!r} in {self.root} (no {stem}.json); available: {self._available()}"
            )
        raw = read_data_json(path)
        if not isinstance(raw, list):
            raise DataError(
                f"{path} must hold a JSON list of examples, found {type(raw).__name__}; each example is "
                '{"db_id": ..., "question": ..., "query": ...}'
            )
        out: list[_Example] = []
        for i, ex in enumerate(raw):
            if not isinstance(ex, dict):
                raise DataError(f"{path}, example {i}: expected an object, found {type(ex).__name__}")
            check_example(path, i, ex, "query", "every example")
            syn = ex.get("question_syn")
            if syn is not None and not isinstance(syn, str):
                raise DataError(
                    f"{path}, example {i}: question_syn must be a string or absent, found {type(syn).__name__}"
                )
            out.append(_Example(i, ex["db_id"], ex["question"], ex["query"], syn))
        with self._lock:
            self._examples[stem] = out
        return out

    def _check_databases(self, stem: str, examples: list[_Example]) -> None:
        counts: dict[str, int] = {}
        for ex in examples:
            counts[ex.db_id] = counts.get(ex.db_id, 0) + 1
        missing = {k: v for k, v in counts.items() if not os.path.lexists(self.db_path(k))}
        if missing:
            shown = ", ".join(f"{k} ({v} examples)" for k, v in sorted(missing.items())[:10])
            more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
            first = sorted(missing)[0]
            raise DataError(
                f"{stem}.json refers to {len(missing)} database(s) missing from {self.root / 'database'}: "
                f"{shown}{more}; expected e.g. {self.db_path(first)}. Add the database files, or remove "
                "their examples from the json."
            )

    def _examples_for(self, split: str, seed: int, val_fraction: float) -> tuple[str, list[_Example]]:
        """(source file stem, examples in file order) for a split name."""
        if split.endswith(".json"):  # the whole file, even when its stem is `train`
            stem = split[: -len(".json")]
            exs = self._read_file(stem)
        elif split in SPLIT_NAMES:
            stem = self.training_file()
            all_exs = self._read_file(stem)
            train_dbs, val_dbs = split_by_database({e.db_id for e in all_exs}, seed, val_fraction)
            keep = set(train_dbs if split == "train" else val_dbs)
            exs = [e for e in all_exs if e.db_id in keep]
        else:
            stem = split
            exs = self._read_file(stem)
        self._check_databases(stem, exs)
        return stem, exs

    def damaged_databases(self, split: str, *, seed: int = 0, val_fraction: float = 0.1) -> dict[str, str]:
        """{db_id: problem} for the split's databases that fail `sqlrl.tasks.dbcheck.database_problem`
        (each file checked once per process); their tasks are excluded as `database_damaged`."""
        out = {}
        for db_id in sorted({e.db_id for e in self._examples_for(split, seed, val_fraction)[1]}):
            problem = database_problem(self.db_path(db_id))
            if problem is not None:
                out[db_id] = problem
        return out

    def _schema(self, db_id: str) -> str:
        path = str(self.db_path(db_id))
        with self._lock:
            hit = self._schemas.get(path)
        if hit is None:
            # a damaged database's tasks are excluded before any rollout: no schema to show
            hit = "" if database_problem(path) is not None else schema_text(path)
            with self._lock:
                self._schemas[path] = hit
        return hit

    def load(
        self, split: str, *, seed: int = 0, val_fraction: float = 0.1, paraphrases: bool = False
    ) -> list[PrivateTask]:
        """Tasks of a split, in file order.

        `split` is a json stem in the folder (`train_spider`, `dev`, ...), `train` / `validation` (the
        by-database split of the training file; `seed` and `val_fraction` only matter for these), or
        `<stem>.json` for a whole file (useful when the training file itself is `train.json`).
        `paraphrases` (a training split only; `validation` refuses it) adds, right after each example
        whose `question_syn` differs from its question (ignoring case and spacing), a second task with
        that question, the same gold and database, id `<task id>-syn`. The split is decided on the
        examples before any is added, so it does not depend on this flag.
        """
        if paraphrases and split == "validation":
            raise DataError(
                "paraphrases are training data: the validation split is loaded without them; "
                "set data.train_paraphrases only for the training split"
            )
        stem, exs = self._examples_for(split, seed, val_fraction)
        tasks = []
        for e in exs:
            questions = [("", e.question)]
            if paraphrases and e.question_syn and not _same_question(e.question_syn, e.question):
                questions.append((PARAPHRASE_SUFFIX, e.question_syn))
            for suffix, question in questions:
                pub = PublicTask(
                    task_id=f"{stem}/{e.index:05d}{suffix}",
                    db_id=e.db_id,
                    question=question,
                    schema=self._schema(e.db_id),
                    evidence=e.evidence,
                    db_path=str(self.db_path(e.db_id)),
                )
                tasks.append(PrivateTask(public=pub, gold_sql=e.query, difficulty=e.difficulty))
        if paraphrases:
            n_syn = paraphrase_count(tasks)
            log.info(
                f"{split}: {n_syn} Spider-Syn paraphrase tasks added to {len(exs)} examples "
                f"({sum(1 for e in exs if e.question_syn is not None) - n_syn} with question_syn equal to "
                f"the question, {sum(1 for e in exs if e.question_syn is None)} without one)"
            )
        return tasks

    def db_ids(self, split: str, *, seed: int = 0, val_fraction: float = 0.1) -> list[str]:
        """Sorted database ids used by a split."""
        return sorted({e.db_id for e in self._examples_for(split, seed, val_fraction)[1]})

    def fingerprint(
        self, split: str, *, seed: int = 0, val_fraction: float = 0.1, paraphrases: bool = False
    ) -> str:
        """sha256 hex over the split's examples (db_id, question, query, in order; with `paraphrases`
        also each `question_syn`; a non-empty evidence or difficulty too) and the sha256 of every
        database file they use (sorted by db id)."""
        _, exs = self._examples_for(split, seed, val_fraction)
        h = hashlib.sha256()
        h.update(_FINGERPRINT_VERSION.encode() + b"\n")
        for e in exs:
            row = [e.db_id, e.question, e.query] + ([e.question_syn] if paraphrases else [])
            row += (
                [{"evidence": e.evidence, "difficulty": e.difficulty}] if e.evidence or e.difficulty else []
            )
            h.update(json.dumps(row, ensure_ascii=False).encode("utf-8") + b"\n")
        h.update(b"databases\n")
        for db_id in sorted({e.db_id for e in exs}):
            try:
                digest = file_sha256(self.db_path(db_id))
            except OSError:  # a directory or an unreadable file: its problem stands for its bytes
                digest = f"unreadable: {database_problem(self.db_path(db_id))}"
            h.update(f"{db_id} {digest}\n".encode())
        return h.hexdigest()

    def split_info(self, seed: int = 0, val_fraction: float = 0.1) -> dict:
        """What to save as split.json: source file, rule parameters, db ids, counts and fingerprints."""
        stem = self.training_file()
        all_exs = self._read_file(stem)
        train_dbs, val_dbs = split_by_database({e.db_id for e in all_exs}, seed, val_fraction)
        info: dict[str, Any] = {
            "data_root": str(self.root),
            "source": f"{stem}.json",
            "rule": "split_by_database: sorted db ids, random.Random(seed).shuffle, "
            "first max(1, round(val_fraction * n)) -> validation",
            "seed": seed,
            "val_fraction": val_fraction,
            "source_fingerprint": self.fingerprint(f"{stem}.json"),
        }
        for name, dbs in (("train", train_dbs), ("validation", val_dbs)):
            keep = set(dbs)
            info[name] = {
                "db_ids": dbs,
                "n_databases": len(dbs),
                "n_examples": sum(1 for e in all_exs if e.db_id in keep),
                "fingerprint": self.fingerprint(name, seed=seed, val_fraction=val_fraction),
            }
        return info


# --------------------------------------------------------------------------------------------- CLI


def resolve_data_root(path: str) -> Path:
    from sqlrl.tasks.data import embedded_root

    return embedded_root() if path in ("embedded", "", None) else Path(path)


def select_tasks(tasks: list, limit: int, seed: int) -> list:
    """A seeded, order-preserving subset: shuffle indices with `seed`, keep the first `limit`, restore order
    (`limit` 0: all the tasks; a negative `limit` is a ValueError)."""
    if limit < 0:
        raise ValueError(f"a task limit of {limit} is negative; give a number of tasks, or 0 for all of them")
    if not limit or limit >= len(tasks):
        return list(tasks)
    idx = list(range(len(tasks)))
    random.Random(seed).shuffle(idx)
    keep = sorted(idx[:limit])
    return [tasks[i] for i in keep]
