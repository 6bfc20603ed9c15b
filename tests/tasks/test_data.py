"""Tests for sqlrl.tasks.data: layout errors, the by-database split, fingerprints, schema text, task privacy."""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from sqlrl.cli.data import cli_main
from sqlrl.tasks.data import (
    DataError,
    PrivateTask,
    PublicTask,
    SpiderData,
    embedded_root,
    ensure_public,
    paraphrase_count,
    schema_text,
    split_by_database,
)

SPIDER = Path(__file__).resolve().parents[3] / "shared" / "data" / "spider"


def make_db(path: Path, tables: dict[str, list[tuple]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path)
    for name, rows in tables.items():
        con.execute(f"CREATE TABLE {name} (id INTEGER PRIMARY KEY, name TEXT, score REAL)")
        con.executemany(f"INSERT INTO {name} VALUES (?, ?, ?)", rows)
    con.commit()
    con.close()


def make_folder(root: Path, n_dbs: int = 5, per_db: int = 3) -> Path:
    """A tiny Spider-layout folder: db0..db{n-1}, each with table t and per_db examples."""
    examples, tables = [], []
    for d in range(n_dbs):
        db = f"db{d}"
        make_db(root / "database" / db / f"{db}.sqlite", {"t": [(1, "a", 1.5), (2, "b", 2.5)]})
        tables.append({"db_id": db, "table_names_original": ["t"]})
        for q in range(per_db):
            examples.append(
                {
                    "db_id": db,
                    "question": f"q{q} of {db}?",
                    "query": f"SELECT name FROM t WHERE id = {q}",
                    "x": 1,
                }
            )
    (root / "tables.json").write_text(json.dumps(tables))
    (root / "train_spider.json").write_text(json.dumps(examples))
    return root


# ------------------------------------------------------------------------------------------ split


def test_split_by_database_deterministic_disjoint_and_order_free():
    ids = [f"db{i:02d}" for i in range(40)]
    a = split_by_database(ids, seed=3, val_fraction=0.2)
    b = split_by_database(list(reversed(ids)) + ids[:5], seed=3, val_fraction=0.2)
    assert a == b
    train, val = a
    assert len(val) == 8 and len(train) == 32
    assert not set(train) & set(val) and set(train) | set(val) == set(ids)
    assert train == sorted(train) and val == sorted(val)
    assert split_by_database(ids, seed=4, val_fraction=0.2) != a


def test_split_by_database_at_least_one_and_bad_args():
    assert len(split_by_database(["a", "b", "c"], 0, 0.01)[1]) == 1
    assert len(split_by_database(["a", "b"], 0, 0.9)[0]) == 1  # always leaves training data
    with pytest.raises(DataError, match="val_fraction"):
        split_by_database(["a", "b"], 0, 1.0)
    with pytest.raises(DataError, match="at least 2"):
        split_by_database(["a"], 0, 0.1)


def test_load_train_validation_split(tmp_path):
    data = SpiderData(make_folder(tmp_path, n_dbs=10))
    train = data.load("train", seed=1)
    val = data.load("validation", seed=1)
    full = data.load("train_spider")
    assert len(train) + len(val) == len(full) == 30
    assert {t.db_id for t in train}.isdisjoint({t.db_id for t in val})
    assert len({t.db_id for t in val}) == 1
    # ids are those of the source file, whichever split loads them
    by_id = {t.task_id: t for t in full}
    for t in train + val:
        assert by_id[t.task_id] == t
    assert full[4].task_id == "train_spider/00004"
    assert [t.task_id for t in data.load("train", seed=1)] == [t.task_id for t in train]
    info = data.split_info(seed=1)
    assert info["validation"]["db_ids"] == sorted({t.db_id for t in val})
    assert info["train"]["n_examples"] == len(train)
    assert info["validation"]["fingerprint"] == data.fingerprint("validation", seed=1)
    assert data.splits() == ["train_spider"]


def test_train_json_fallback_and_whole_file(tmp_path):
    root = make_folder(tmp_path)
    os.replace(root / "train_spider.json", root / "train.json")
    data = SpiderData(root)
    assert data.training_file() == "train"
    assert len(data.load("train.json")) == 15
    assert len(data.load("train")) + len(data.load("validation")) == 15
    assert data.load("train.json")[0].task_id == "train/00000"


# ---------------------------------------------------------------------------------------- errors


def test_errors_are_clear(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        SpiderData(tmp_path / "nope")
    with pytest.raises(DataError, match="no tables.json"):
        SpiderData(tmp_path)
    root = make_folder(tmp_path / "d")
    data = SpiderData(root)
    with pytest.raises(DataError, match=r"no split 'dev'.*available: train_spider, train, validation"):
        data.load("dev")
    (root / "dev.json").write_text("[{'bad json'")
    with pytest.raises(DataError, match=r"dev.json is not valid UTF-8 JSON"):
        SpiderData(root).load("dev")
    (root / "dev.json").write_text(json.dumps([{"db_id": "db0", "question": "q"}]))
    with pytest.raises(DataError, match=r"example 0: field\(s\) 'query' \(missing\)"):
        SpiderData(root).load("dev")
    (root / "dev.json").write_text(json.dumps({"db_id": "db0"}))
    with pytest.raises(DataError, match="JSON list"):
        SpiderData(root).load("dev")
    (root / "dev.json").write_text(json.dumps([{"db_id": "ghost", "question": "q", "query": "SELECT 1"}]))
    with pytest.raises(DataError, match=r"missing from .*ghost \(1 examples\).*ghost/ghost.sqlite"):
        SpiderData(root).load("dev")
    with pytest.raises(DataError, match="neither train_spider.json nor train.json"):
        os.remove(root / "train_spider.json")
        SpiderData(root).load("validation")
    assert issubclass(DataError, ValueError)


# -------------------------------------------------------------------------------------- privacy


def _walk(obj, seen=None):
    """Yield every object reachable through dataclass fields, containers and __dict__."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    yield obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _walk(getattr(obj, f.name), seen)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(k, seen)
            yield from _walk(v, seen)
    elif isinstance(obj, list | tuple | set | frozenset):
        for v in obj:
            yield from _walk(v, seen)
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        yield from _walk(vars(obj), seen)


def test_public_task_holds_no_gold(tmp_path):
    data = SpiderData(make_folder(tmp_path))
    for task in data.load("train_spider"):
        assert isinstance(task, PrivateTask) and not isinstance(task, PublicTask)
        assert not issubclass(PrivateTask, PublicTask)
        reachable = list(_walk(task.public))
        assert not any(isinstance(o, PrivateTask) for o in reachable)
        assert not any(isinstance(o, str) and task.gold_sql in o for o in reachable)
        # no hidden attributes beyond the declared fields
        assert set(vars(task.public)) == {f.name for f in dataclasses.fields(PublicTask)}
        with pytest.raises(dataclasses.FrozenInstanceError):
            task.public.question = "x"  # type: ignore[misc]
    assert {f.name for f in dataclasses.fields(PublicTask)} == {
        "task_id",
        "db_id",
        "question",
        "schema",
        "evidence",
        "db_path",
    }


def test_ensure_public(tmp_path):
    task = SpiderData(make_folder(tmp_path)).load("train_spider")[0]
    assert ensure_public(task.public) is task.public
    with pytest.raises(TypeError, match="PrivateTask.*task.public"):
        ensure_public(task)
    with pytest.raises(TypeError, match="expected sqlrl.tasks.data.PublicTask"):
        ensure_public({"question": "q"})


# ---------------------------------------------------------------------------------- fingerprint


def test_fingerprint_changes_with_example_and_db_byte(tmp_path):
    root = make_folder(tmp_path)
    fp0 = SpiderData(root).fingerprint("train_spider")
    assert SpiderData(root).fingerprint("train_spider") == fp0
    # an example changes
    exs = json.loads((root / "train_spider.json").read_text())
    exs[2]["question"] += " "
    (root / "train_spider.json").write_text(json.dumps(exs))
    fp1 = SpiderData(root).fingerprint("train_spider")
    assert fp1 != fp0
    # an extra (ignored) field does not matter
    exs[0]["extra"] = "ignored"
    (root / "train_spider.json").write_text(json.dumps(exs))
    assert SpiderData(root).fingerprint("train_spider") == fp1
    # one byte of a database changes (same size), with the same SpiderData object
    data = SpiderData(root)
    assert data.fingerprint("train_spider") == fp1
    db = root / "database" / "db3" / "db3.sqlite"
    raw = bytearray(db.read_bytes())
    raw[-1] ^= 0xFF
    st = os.stat(db)
    db.write_bytes(bytes(raw))
    os.utime(db, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert data.fingerprint("train_spider") != fp1


def test_fingerprint_split_specific(tmp_path):
    data = SpiderData(make_folder(tmp_path, n_dbs=6))
    fps = {data.fingerprint(s) for s in ("train", "validation", "train_spider")}
    assert len(fps) == 3


# --------------------------------------------------------------------------------------- schema


def test_schema_text_order_and_truncation(tmp_path):
    db = tmp_path / "s.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE zebra (id INTEGER PRIMARY KEY, name TEXT)")
    con.execute("CREATE TABLE apple (id INTEGER, zebra_id INTEGER REFERENCES zebra(id))")
    con.execute(
        "CREATE TABLE mango (x TEXT UNIQUE, y INTEGER, z INTEGER, w TEXT)"
    )  # creates an sqlite_autoindex (no sql)
    con.execute("INSERT INTO zebra VALUES (1, 'stripe')")
    con.commit()
    con.close()
    full = schema_text(db)
    assert full.index("zebra") < full.index("apple") < full.index("mango")  # file order, not sorted
    assert "sqlite_" not in full and "stripe" not in full
    assert full.count(";") == 3
    with_rows = schema_text(db, sample_rows=1)
    assert "'stripe'" in with_rows
    marker = "-- [schema truncated: 1 more tables]"
    budget = full.index("CREATE TABLE mango") + len(marker)  # exactly zebra + apple + marker
    cut = schema_text(db, max_chars=budget)
    assert cut.endswith(marker) and len(cut) == budget
    assert schema_text(db, max_chars=budget - 1).endswith("-- [schema truncated: 2 more tables]")
    assert schema_text(db, max_chars=len(full) - 1) == cut
    assert "CREATE TABLE mango" not in cut and "CREATE TABLE apple" in cut
    tiny = schema_text(db, max_chars=10)
    assert tiny == "-- [schema truncated: 3 more tables]"
    assert schema_text(db, max_chars=len(full)) == full
    with pytest.raises(DataError):
        schema_text(tmp_path / "missing.sqlite")


def test_task_schema_is_full_text(tmp_path):
    root = make_folder(tmp_path)
    task = SpiderData(root).load("train_spider")[0]
    assert task.public.schema == schema_text(task.public.db_path)
    assert Path(task.public.db_path).is_absolute() and task.public.evidence == ""


# ------------------------------------------------------------------------------------- embedded


def test_embedded_folder():
    root = embedded_root()
    data = SpiderData(root)
    assert data.splits() == ["train_spider"]
    assert (root / "README.md").read_text().count("CC BY-SA 4.0") >= 1
    tasks = data.load("train_spider")
    dbs = {t.db_id for t in tasks}
    assert 6 <= len(dbs) <= 10 and 200 <= len(tasks) <= 1000
    assert sum((root / "database" / d / f"{d}.sqlite").stat().st_size for d in dbs) < 2_000_000
    info = data.split_info()
    assert info["train"]["n_examples"] + info["validation"]["n_examples"] == len(tasks)


def test_embedded_matches_generator(tmp_path):
    if not (SPIDER / "train_spider.json").is_file():
        pytest.skip(f"Spider data not found at {SPIDER}")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    try:
        import make_embedded
    finally:
        sys.path.pop(0)
    make_embedded.build(SPIDER, tmp_path / "demo")
    root = embedded_root()
    for rel in ["train_spider.json", "tables.json", "README.md"]:
        assert (tmp_path / "demo" / rel).read_bytes() == (root / rel).read_bytes(), rel
    assert SpiderData(tmp_path / "demo").fingerprint("train_spider") == SpiderData(root).fingerprint(
        "train_spider"
    )


def test_real_spider_layout():
    if not (SPIDER / "train_spider.json").is_file():
        pytest.skip(f"Spider data not found at {SPIDER}")
    data = SpiderData(SPIDER)
    assert data.training_file() == "train_spider"
    info = data.split_info()
    assert info["train"]["n_databases"] + info["validation"]["n_databases"] == 138
    assert info["validation"]["n_databases"] == 14
    assert info["train"]["n_examples"] + info["validation"]["n_examples"] == 6904


def test_real_spider_paraphrases_training_side_only():
    if not (SPIDER / "train_spider.json").is_file():
        pytest.skip(f"Spider data not found at {SPIDER}")
    data = SpiderData(SPIDER)
    train = data.load("train", paraphrases=True)
    # README: every example carries question_syn; 1,935 of the 6,145 training ones equal their question
    assert (len(train), paraphrase_count(train)) == (6145 + 4210, 4210)
    assert {t.db_id for t in train} == set(data.db_ids("train"))
    assert len(data.load("validation")) == 759


# ------------------------------------------------------------------------------------------- CLI


def test_cli_split_json(capsys):
    assert cli_main(["split", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["source"] == "train_spider.json" and info["validation"]["n_databases"] == 1


def test_cli_bad_input(tmp_path, capsys):
    assert cli_main(["split", "--data", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "--data" in err
    assert cli_main(["audit", "--split", "nosuch"]) == 2
    assert "available: train_spider" in capsys.readouterr().err
    assert cli_main(["audit", "--bogus"]) == 2
    assert cli_main([]) == 2
    assert cli_main(["split", "--val-fraction", "1.5"]) == 2
    # the cache may not live inside the data folder
    root = make_folder(tmp_path / "d")
    assert cli_main(["audit", "--data", str(root), "--cache", str(root / "cache")]) == 2
    assert "outside" in capsys.readouterr().err


def test_cli_via_sqlrl_entry_point():
    proc = subprocess.run(
        [sys.executable, "-m", "sqlrl.cli", "data", "split"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "validation" in proc.stdout and "driving_school" in proc.stdout


def test_embedded_is_a_data_path_everywhere_a_folder_is(tmp_path, monkeypatch, capsys):
    """`--data embedded` (CLI) and SpiderData("embedded") (API) mean the demo subset, as `path = "embedded"`
    does in TOML; a folder that happens to be named embedded is reached as ./embedded."""
    from sqlrl.cli import main

    assert SpiderData("embedded").root == embedded_root()
    assert len(SpiderData("embedded").load("train_spider")) == len(
        SpiderData(embedded_root()).load("train_spider")
    )
    assert main(["data", "split", "--data", "embedded", "--json"]) == 0
    via_name = json.loads(capsys.readouterr().out)
    assert main(["data", "split", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == via_name
    monkeypatch.chdir(tmp_path)
    (tmp_path / "embedded").mkdir()
    with pytest.raises(DataError, match="has no tables.json"):
        SpiderData("./embedded")


# ----------------------------------------------------------------------------------- paraphrases


def add_paraphrases(root: Path) -> None:
    """question_syn on examples 0 (a real paraphrase), 1 (equal to the question up to case and spacing)
    and 2 (absent) of every database; train_spider.json holds 3 examples per database."""
    path = root / "train_spider.json"
    examples = json.loads(path.read_text())
    for i, ex in enumerate(examples):
        if i % 3 == 0:
            ex["question_syn"] = f"syn {ex['question']}"
        elif i % 3 == 1:
            ex["question_syn"] = "  " + ex["question"].upper()
    path.write_text(json.dumps(examples))


def test_paraphrases_are_added_after_the_split_to_training_only(tmp_path):
    root = make_folder(tmp_path, n_dbs=10)
    add_paraphrases(root)
    data = SpiderData(root)
    plain = data.load("train", seed=1)
    syn = data.load("train", seed=1, paraphrases=True)
    # the split is decided before any paraphrase is added: same databases on each side, same validation
    assert {t.db_id for t in syn} == {t.db_id for t in plain}
    assert data.load("validation", seed=1) == SpiderData(root).load("validation", seed=1)
    assert not {t.db_id for t in syn} & set(data.db_ids("validation", seed=1))
    # one paraphrase per database (its example 0), right after its original, same gold and database
    assert len(syn) == len(plain) + 9 and [t for t in syn if not t.task_id.endswith("-syn")] == plain
    first = plain[0]  # example 0 of the first training database: it has a real paraphrase
    i = [t.task_id for t in syn].index(first.task_id)
    para = syn[i + 1]
    assert para.task_id == first.task_id + "-syn"
    assert para.public.question == "syn " + first.public.question
    assert (para.gold_sql, para.db_id, para.public.schema) == (
        first.gold_sql,
        first.db_id,
        first.public.schema,
    )
    assert len({t.task_id for t in syn}) == len(syn)
    assert paraphrase_count(syn) == 9 and paraphrase_count(plain) == 0
    # ids are stable: the same load gives the same ids
    assert [t.task_id for t in data.load("train", seed=1, paraphrases=True)] == [t.task_id for t in syn]
    # the fingerprint covers the paraphrases only when they are used
    assert data.fingerprint("train", seed=1) != data.fingerprint("train", seed=1, paraphrases=True)
    with pytest.raises(DataError, match="validation split is loaded without them"):
        data.load("validation", seed=1, paraphrases=True)


def test_paraphrase_field_must_be_a_string(tmp_path):
    root = make_folder(tmp_path, n_dbs=2)
    examples = json.loads((root / "train_spider.json").read_text())
    examples[1]["question_syn"] = 7
    (root / "train_spider.json").write_text(json.dumps(examples))
    with pytest.raises(DataError, match="example 1: question_syn must be a string or absent, found int"):
        SpiderData(root).load("train_spider")
