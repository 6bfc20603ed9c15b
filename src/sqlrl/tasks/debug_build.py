"""Building and validating SQL-debugging tasks from Spider's training databases (`build_debug_tasks`).

Per database: query tasks (a Spider gold query with one `mutate_query` bug), management tasks (an
UPDATE / DELETE / ALTER TABLE / CREATE INDEX statement with a plausible bug) and personalization
tasks (a CREATE VIEW over a mutated gold query), each with its hidden tests.

What is covered:
- every task emitted was validated on fresh temporary copies (`validate_task`): the reference
  solution passes every test and the buggy SQL fails at least one (or raises an error); tasks that
  fail validation are dropped and counted by reason in the stats;
- deterministic: same inputs and seed -> the same tasks in the same order, and `save_debug_tasks`
  writes byte-identical files;
- train/validation split by database with `sqlrl.tasks.data.split_by_database` (default split seed
  0, val_fraction 0.1, over the db ids of train_spider.json), the same split as `SpiderData`'s.

What is not:
- that each description pins down one solution (the tests define success).
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlrl.tasks.data import schema_text, split_by_database
from sqlrl.tasks.debug_episode import SUBMITTED_TABLE, connect, query_test_cases, quote_ident, validate_task
from sqlrl.tasks.debug_mutate import MUTATION_KINDS, mutate_query, numeric_type
from sqlrl.tasks.debugging import CATEGORIES, DEBUG_FORMAT_VERSION, DebugTaskPrivate, DebugTaskPublic

__all__ = ["build_debug_tasks"]


def table_columns(db_path: str) -> dict[str, list[tuple[str, str]]]:
    """{lower-case table: [(column, upper-case declared type)]} of a database (metadata, read-only)."""
    con = sqlite3.connect(Path(db_path).resolve().as_uri() + "?mode=ro", uri=True)
    con.text_factory = lambda b: b.decode("utf-8", errors="replace")
    try:
        out = {}
        names = [
            r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY rowid")
        ]
        for n in names:
            if n.startswith("sqlite_"):
                continue
            cols = con.execute(f"PRAGMA table_info({quote_ident(n)})").fetchall()
            out[n.lower()] = [(c[1], (c[2] or "").upper()) for c in cols]
        return out
    finally:
        con.close()


def _id_like(col: str) -> bool:
    c = col.lower()
    return c.endswith("id") or "_id" in c or c.endswith("code") or c.endswith("_no")


# ------------------------------------------------------------------------------------------- builder

_QUERY_TEMPLATES = (
    'I need to answer this question: "{q}" My SQL below runs, but the result is not what I expect. '
    "Can you fix it?",
    'Question from my manager: "{q}" I wrote the query below, but the numbers look wrong. '
    "Please correct the query.",
    'I\'m trying to get: "{q}" The query I have returns the wrong rows. What is wrong with it?',
)


def _fmt_value(v: Any) -> str:
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return repr(v)


@dataclass
class _DbInfo:
    db_id: str
    db_path: str
    schema: str
    columns: dict[str, list[tuple[str, str]]]


def _query_tasks(info: _DbInfo, examples: list[dict], rng: random.Random, n: int, dropped: dict):
    out = []
    idx = list(range(len(examples)))
    rng.shuffle(idx)
    for i in idx:
        if len(out) >= n:
            break
        ex = examples[i]
        gold = ex["query"].strip().rstrip(";")
        m = mutate_query(gold, info.columns, rng)
        if m is None:
            dropped["no_mutation"] = dropped.get("no_mutation", 0) + 1
            continue
        buggy, kind = m
        # reference result shape
        try:
            con = connect(info.db_path, 5.0, read_only=True)
        except sqlite3.Error:
            continue
        try:
            cur = con.execute(gold)
            ncol = len(cur.description or [])
            cur.fetchall()
        except sqlite3.Error:
            dropped["gold_error"] = dropped.get("gold_error", 0) + 1
            continue
        finally:
            con.close()
        ordered = "order by" in gold.lower()
        desc = rng.choice(_QUERY_TEMPLATES).format(q=ex["question"].strip())
        out.append(
            (
                "query",
                desc,
                buggy,
                [],
                [gold],
                query_test_cases(ncol, ordered),
                [f"DROP TABLE IF EXISTS {SUBMITTED_TABLE}"],
                {"mutation": kind, "source": f"train_spider/{ex['__index']:05d}"},
            )
        )
    return out


def _sample_rows(con, table: str, col: str, rng: random.Random) -> list:
    vals = [
        r[0]
        for r in con.execute(
            f"SELECT DISTINCT {quote_ident(col)} FROM {quote_ident(table)} WHERE {quote_ident(col)} IS NOT NULL"
        )
    ]
    vals = sorted(vals, key=lambda v: (type(v).__name__, v))
    return vals


@dataclass
class _Table:
    """The table a management task is built on, and what its builders need to know about it."""

    con: sqlite3.Connection
    tb: str  # lower-cased name (the key of `_DbInfo.columns`)
    T: str  # the name as the database spells it
    qT: str  # T quoted
    cols: list[tuple[str, str]]
    num: list[str]  # numeric columns
    txt: list[str]  # other columns
    tables: list[str]  # every candidate table (lower-cased)
    real_names: dict[str, str]


def _management_tasks(info: _DbInfo, rng: random.Random, n: int, dropped: dict):
    out = []
    con = sqlite3.connect(Path(info.db_path).resolve().as_uri() + "?mode=ro", uri=True)
    con.text_factory = lambda b: b.decode("utf-8", errors="replace")
    try:
        tables = []
        for tb in sorted(info.columns):
            try:
                cnt = con.execute(f"SELECT count(*) FROM {quote_ident(tb)}").fetchone()[0]
                con.execute(f"SELECT rowid FROM {quote_ident(tb)} LIMIT 1").fetchall()
            except sqlite3.Error:
                continue
            if cnt >= 2:
                tables.append(tb)
        if not tables:
            dropped["no_table"] = dropped.get("no_table", 0) + 1
            return out
        real_names = {
            r[0].lower(): r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        kinds = ["update_scale", "delete_where", "add_column", "create_index", "rename_column"]
        rng.shuffle(kinds)
        attempts = 0
        while len(out) < n and attempts < 4 * n:
            kind = kinds[attempts % len(kinds)]
            attempts += 1
            tb = rng.choice(tables)
            T = real_names.get(tb, tb)
            cols = info.columns[tb]
            num = [c for c, ty in cols if numeric_type(ty)]
            txt = [c for c, ty in cols if not numeric_type(ty)]
            table = _Table(con, tb, T, quote_ident(T), cols, num, txt, tables, real_names)
            task = _MANAGEMENT_BUILDERS[kind](table, rng)
            if task is not None and "'" not in T:
                out.append(task)
    finally:
        con.close()
    return out


def _update_scale(t: _Table, rng: random.Random) -> tuple | None:
    con, T, qT, num, txt = t.con, t.T, t.qT, t.num, t.txt
    upd = [c for c in num if not _id_like(c)]
    if not (upd and (txt or len(num) > 1)):
        return None
    target = rng.choice(upd)
    fcols = [c for c in (txt + num) if c != target]
    fcol = rng.choice(fcols)
    vals = _sample_rows(con, T, fcol, rng)
    tvals = [
        r[0]
        for r in con.execute(
            f"SELECT {quote_ident(target)} FROM {qT} WHERE typeof({quote_ident(target)}) IN ('integer','real') LIMIT 1"
        )
    ]
    if len(vals) < 2 or not tvals:
        return None
    v = rng.choice(vals)
    pct = rng.choice([5, 10, 15, 20, 25])
    fac = f"{1 + pct / 100:.2f}"
    cond = f"{quote_ident(fcol)} = {_fmt_value(v)}"
    sol = f"UPDATE {qT} SET {quote_ident(target)} = {quote_ident(target)} * {fac} WHERE {cond}"
    bug_kind = rng.choice(["factor", "where"])
    if bug_kind == "factor":
        buggy = (
            f"UPDATE {qT} SET {quote_ident(target)} = {quote_ident(target)} * {pct / 100:.2f} WHERE {cond}"
        )
    else:
        buggy = f"UPDATE {qT} SET {quote_ident(target)} = {quote_ident(target)} * {fac} WHERE {quote_ident(fcol)} <> {_fmt_value(v)}"
    close = f"(a.{quote_ident(target)} IS b.{quote_ident(target)} OR abs(a.{quote_ident(target)} - b.{quote_ident(target)}) <= 1e-6)"
    join = f"FROM ref.{qT} b LEFT JOIN main.{qT} a ON a.rowid = b.rowid"
    tests = [
        f"SELECT NOT EXISTS (SELECT 1 {join} WHERE b.{cond} AND (a.rowid IS NULL OR NOT {close}))",
        f"SELECT NOT EXISTS (SELECT 1 {join} WHERE (b.{cond}) IS NOT 1 AND (a.rowid IS NULL OR NOT {close}))",
        f"SELECT (SELECT count(*) FROM main.{qT}) = (SELECT count(*) FROM ref.{qT})",
    ]
    desc = (
        f"In table {T}, I want to increase {target} by {pct}% for every row whose {fcol} is "
        f"{_fmt_value(v)}; other rows must stay unchanged. My statement below does not do that."
    )
    return ("management", desc, buggy, [], [sol], tests, [], {"kind": "update_scale", "bug": bug_kind})


def _delete_where(t: _Table, rng: random.Random) -> tuple | None:
    con, T, qT, num = t.con, t.T, t.qT, t.num
    if not num:
        return None
    col = rng.choice(num)
    vals = [x for x in _sample_rows(con, T, col, rng) if isinstance(x, int | float)]
    if len(vals) < 3:
        return None
    v = vals[len(vals) // 2]
    sol = f"DELETE FROM {qT} WHERE {quote_ident(col)} > {v!r}"
    bug_kind = rng.choice(["boundary", "direction"])
    op = ">=" if bug_kind == "boundary" else "<"
    buggy = f"DELETE FROM {qT} WHERE {quote_ident(col)} {op} {v!r}"
    tests = [
        f"SELECT count(*) = 0 FROM main.{qT} WHERE {quote_ident(col)} > {v!r}",
        f"SELECT NOT EXISTS (SELECT rowid FROM ref.{qT} EXCEPT SELECT rowid FROM main.{qT})",
        f"SELECT (SELECT count(*) FROM main.{qT}) = (SELECT count(*) FROM ref.{qT})",
    ]
    desc = (
        f"I need to delete every row of {T} whose {col} is greater than {v!r} and keep all "
        "other rows. My statement below deletes the wrong rows."
    )
    return ("management", desc, buggy, [], [sol], tests, [], {"kind": "delete_where", "bug": bug_kind})


def _add_column(t: _Table, rng: random.Random) -> tuple | None:
    tb, T, qT, cols = t.tb, t.T, t.qT, t.cols
    new = rng.choice(["is_active", "priority", "review_flag", "version", "score_bonus"])
    if any(c.lower() == new for c, _ in cols):
        return None
    d = rng.choice([0, 1, 5, 10])
    sol = f"ALTER TABLE {qT} ADD COLUMN {new} INTEGER DEFAULT {d}"
    others = [x for x in t.tables if x != tb]
    bug_kind = rng.choice(["default", "table"] if others else ["default"])
    if bug_kind == "default":
        buggy = f"ALTER TABLE {qT} ADD COLUMN {new} INTEGER"
    else:
        buggy = f"ALTER TABLE {quote_ident(t.real_names.get(others[0], others[0]))} ADD COLUMN {new} INTEGER DEFAULT {d}"
    tests = [
        f"SELECT count(*) = 1 FROM pragma_table_info('{T}') WHERE name = '{new}'",
        f"SELECT (SELECT count(*) FROM main.{qT} WHERE {new} IS {d}) = (SELECT count(*) FROM ref.{qT})",
        f"SELECT upper(type) = 'INTEGER' FROM pragma_table_info('{T}') WHERE name = '{new}'",
    ]
    desc = (
        f"Add an INTEGER column named {new} to the table {T}; every existing and future row "
        f"should get the default value {d}. My statement below is not right."
    )
    return ("management", desc, buggy, [], [sol], tests, [], {"kind": "add_column", "bug": bug_kind})


def _create_index(t: _Table, rng: random.Random) -> tuple | None:
    tb, T, qT, cols = t.tb, t.T, t.qT, t.cols
    if len(cols) < 2:
        return None
    col = rng.choice([c for c, _ in cols])
    iname = f"idx_{tb}_{col}".lower().replace(" ", "_")
    if not iname.replace("_", "").isalnum():
        return None
    other = rng.choice([c for c, _ in cols if c != col])
    sol = f"CREATE INDEX {iname} ON {qT} ({quote_ident(col)})"
    bug_kind = rng.choice(["column", "composite"])
    if bug_kind == "column":
        buggy = f"CREATE INDEX {iname} ON {qT} ({quote_ident(other)})"
    else:
        buggy = f"CREATE INDEX {iname} ON {qT} ({quote_ident(other)}, {quote_ident(col)})"
    tests = [
        f"SELECT count(*) = 1 FROM sqlite_master WHERE type = 'index' AND name = '{iname}' "
        f"AND lower(tbl_name) = '{tb}'",
        f"SELECT count(*) = 1 FROM pragma_index_info('{iname}')",
        f"SELECT lower(name) = '{col.lower()}' FROM pragma_index_info('{iname}') WHERE seqno = 0",
    ]
    desc = (
        f"Lookups on {T} by {col} are slow. I want an index named {iname} on {T}({col}) and "
        "nothing else. My statement below builds the wrong index."
    )
    return (
        "management",
        desc,
        buggy,
        [],
        [sol],
        tests,
        [f"DROP INDEX IF EXISTS {iname}"],
        {"kind": "create_index", "bug": bug_kind},
    )


def _rename_column(t: _Table, rng: random.Random) -> tuple | None:
    T, qT, cols = t.T, t.qT, t.cols
    if len(cols) < 2:
        return None
    # only columns no view/trigger/index mentions, to keep ALTER simple
    col, other = rng.sample([c for c, _ in cols], 2)
    new = f"{col}_old".lower().replace(" ", "_")
    if not new.replace("_", "").isalnum() or any(c.lower() == new for c, _ in cols):
        return None
    sol = f"ALTER TABLE {qT} RENAME COLUMN {quote_ident(col)} TO {new}"
    buggy = f"ALTER TABLE {qT} RENAME COLUMN {quote_ident(other)} TO {new}"
    tests = [
        f"SELECT count(*) = 1 FROM pragma_table_info('{T}') WHERE name = '{new}'",
        f"SELECT count(*) = 0 FROM pragma_table_info('{T}') WHERE lower(name) = '{col.lower()}'",
        f"SELECT count(*) = {len(cols)} FROM pragma_table_info('{T}')",
        f"SELECT count(*) = 1 FROM pragma_table_info('{T}') WHERE lower(name) = '{other.lower()}'",
    ]
    desc = (
        f"We are retiring the column {col} of {T}: rename it to {new}, keeping its data. "
        "My statement below renames the wrong thing."
    )
    return ("management", desc, buggy, [], [sol], tests, [], {"kind": "rename_column", "bug": "column"})


_MANAGEMENT_BUILDERS = {
    "update_scale": _update_scale,
    "delete_where": _delete_where,
    "add_column": _add_column,
    "create_index": _create_index,
    "rename_column": _rename_column,
}


def _personalization_tasks(info: _DbInfo, examples: list[dict], rng: random.Random, n: int, dropped: dict):
    out = []
    idx = list(range(len(examples)))
    rng.shuffle(idx)
    for i in idx:
        if len(out) >= n:
            break
        ex = examples[i]
        gold = ex["query"].strip().rstrip(";")
        m = mutate_query(
            gold, info.columns, rng, kinds=tuple(k for k in MUTATION_KINDS if k != "order_direction")
        )
        if m is None:
            dropped["no_mutation"] = dropped.get("no_mutation", 0) + 1
            continue
        buggy_sel, kind = m
        vname = f"v_{info.db_id}_{i:05d}"
        sol = f"CREATE VIEW {vname} AS {gold}"
        buggy = f"CREATE VIEW {vname} AS {buggy_sel}"
        tests = [
            f"SELECT count(*) = 1 FROM sqlite_master WHERE type = 'view' AND name = '{vname}'",
            f"SELECT (SELECT count(*) FROM main.{vname}) = (SELECT count(*) FROM ref.{vname}) AND NOT EXISTS "
            f"(SELECT * FROM main.{vname} EXCEPT SELECT * FROM ref.{vname}) AND NOT EXISTS "
            f"(SELECT * FROM ref.{vname} EXCEPT SELECT * FROM main.{vname})",
        ]
        desc = (
            f'I want a saved view named {vname} that answers: "{ex["question"].strip()}" so my dashboard '
            "can read it. The view I created below shows the wrong data; please give me the corrected "
            "CREATE VIEW statement."
        )
        out.append(
            (
                "personalization",
                desc,
                buggy,
                [f"DROP VIEW IF EXISTS {vname}"],
                [sol],
                tests,
                [f"DROP VIEW IF EXISTS {vname}"],
                {"mutation": kind, "source": f"train_spider/{ex['__index']:05d}"},
            )
        )
    return out


def build_debug_tasks(
    spider_root: str | os.PathLike,
    *,
    seed: int = 0,
    per_db: int = 6,
    db_ids: list[str] | None = None,
    split_seed: int = 0,
    val_fraction: float = 0.1,
    timeout_s: float = 5.0,
) -> tuple[list[DebugTaskPrivate], dict]:
    """Build and validate debugging tasks from Spider's training databases. Returns (tasks, stats).

    Per database (sorted ids, rng seeded with f"{seed}:{db_id}"): up to ceil(per_db/2) query tasks,
    per_db//3 management tasks and per_db//6 personalization tasks (at least one each when
    per_db >= 3), candidates generated then validated; failing candidates are dropped and counted.
    """
    root = Path(spider_root).expanduser().resolve()
    src = root / "train_spider.json"
    if not src.is_file():
        src = root / "train.json"
    raw = json.loads(src.read_text(encoding="utf-8"))
    by_db: dict[str, list[dict]] = {}
    for i, ex in enumerate(raw):
        by_db.setdefault(ex["db_id"], []).append({**ex, "__index": i})
    all_ids = sorted(by_db)
    train_ids, val_ids = split_by_database(all_ids, split_seed, val_fraction)
    val_set = set(val_ids)
    chosen = sorted(db_ids) if db_ids is not None else all_ids
    n_q = max(1, (per_db + 1) // 2)
    n_m = max(1, per_db // 3)
    n_p = max(1, per_db // 6) if per_db >= 3 else 0
    tasks: list[DebugTaskPrivate] = []
    dropped: dict[str, int] = {}
    for db_id in chosen:
        db_path = root / "database" / db_id / f"{db_id}.sqlite"
        if not db_path.is_file() or db_id not in by_db:
            dropped["missing_database"] = dropped.get("missing_database", 0) + 1
            continue
        info = _DbInfo(db_id, str(db_path), schema_text(str(db_path)), table_columns(str(db_path)))
        rng = random.Random(f"{seed}:{db_id}")
        cands = []
        cands += _query_tasks(info, by_db[db_id], rng, n_q, dropped)
        cands += _management_tasks(info, rng, n_m, dropped)
        if n_p:
            cands += _personalization_tasks(info, by_db[db_id], rng, n_p, dropped)
        k = 0
        for cat, desc, buggy, pre, sol, tests, cu, meta in cands:
            pub = DebugTaskPublic(
                task_id=f"debug/{db_id}/{k:03d}",
                db_id=db_id,
                category=cat,
                description=desc,
                schema=info.schema,
                buggy_sql=buggy,
                preprocess_sql=tuple(pre),
                db_path=str(db_path),
            )
            t = DebugTaskPrivate(
                public=pub,
                solution_sql=sol,
                test_cases=tests,
                clean_up_sql=cu,
                split="validation" if db_id in val_set else "train",
                meta=meta,
            )
            reason = validate_task(t, timeout_s=timeout_s)
            if reason:
                key = f"{cat}:{reason}"
                dropped[key] = dropped.get(key, 0) + 1
                continue
            tasks.append(t)
            k += 1
    stats: dict[str, Any] = {
        "version": DEBUG_FORMAT_VERSION,
        "seed": seed,
        "per_db": per_db,
        "split_seed": split_seed,
        "val_fraction": val_fraction,
        "n_databases": len(chosen),
        "n_tasks": len(tasks),
        "per_category": {c: sum(t.category == c for t in tasks) for c in CATEGORIES},
        "per_split": {s: sum(t.split == s for t in tasks) for s in ("train", "validation")},
        "per_split_category": {
            s: {c: sum(t.split == s and t.category == c for t in tasks) for c in CATEGORIES}
            for s in ("train", "validation")
        },
        "dropped": dict(sorted(dropped.items())),
        "per_kind": _count_kinds(tasks),
    }
    return tasks, stats


def _count_kinds(tasks: list[DebugTaskPrivate]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in tasks:
        k = f"{t.category}:{t.meta.get('mutation') or t.meta.get('kind')}"
        out[k] = out.get(k, 0) + 1
    return dict(sorted(out.items()))
