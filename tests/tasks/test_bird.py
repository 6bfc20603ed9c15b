"""BIRD folders as downloaded (tests/fixtures/make_bird.py builds them from the demo databases):
layout detection, splits, evidence and difficulty, column descriptions, difficulty accuracy."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sqlrl.tasks.bird import BirdData, accuracy_by_difficulty, add_column_descriptions, open_data
from sqlrl.tasks.data import DataError, PublicTask, SpiderData

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from make_bird import DEV, TRAIN_DBS, make_bird, make_dev, make_mini_dev  # noqa: E402


@pytest.fixture(scope="module")
def bird(tmp_path_factory) -> Path:
    return make_bird(tmp_path_factory.mktemp("bird") / "bird")


def test_the_bird_root_and_its_folders_are_detected(bird, tmp_path):
    root = open_data(bird)
    assert type(root) is BirdData and root.splits() == ["dev", "train"]
    assert open_data(bird / "dev").splits() == ["dev"]
    assert open_data(bird / "train").splits() == ["train"]
    assert open_data(make_mini_dev(tmp_path / "MINIDEV")).splits() == ["mini_dev_sqlite"]
    assert type(open_data("embedded")) is SpiderData
    with pytest.raises(DataError, match="tables.json"):
        open_data(tmp_path / "MINIDEV" / "dev_databases")  # neither layout: Spider's message


def test_dev_tasks_carry_evidence_in_public_and_sql_and_difficulty_in_private(bird):
    tasks = open_data(bird).load("dev")
    assert [t.task_id for t in tasks] == [f"dev/{i:05d}" for i in range(6)]
    t = tasks[1]
    assert t.public.question == "Which dorm names have a capacity over 300?"
    assert t.public.evidence == "capacity over 300 refers to student_capacity > 300"
    assert t.gold_sql == "SELECT dorm_name FROM Dorm WHERE student_capacity > 300"
    assert t.difficulty == "moderate" and type(t.public) is PublicTask
    assert t.public.db_path == str((bird / "dev" / "dev_databases" / "dorm_1" / "dorm_1.sqlite").resolve())
    assert "CREATE TABLE Dorm" in t.public.schema
    assert tasks[3].public.evidence == ""  # an empty evidence stays empty
    assert "SQL" not in json.dumps(t.public.__dict__) and t.gold_sql not in json.dumps(t.public.__dict__)


def test_train_is_split_by_database_and_train_json_is_the_whole_file(bird):
    ds = open_data(bird)
    train, val = ds.db_ids("train"), ds.db_ids("validation")
    assert not set(train) & set(val) and sorted(train + val) == sorted(TRAIN_DBS) and len(val) == 1
    assert len(ds.load("train.json")) == 24 and len(ds.load("train")) + len(ds.load("validation")) == 24
    assert ds.load("train.json")[0].public.evidence == "hint 0" and ds.load("train.json")[0].difficulty == ""
    info = ds.split_info()
    assert info["source"] == "train.json" and info["validation"]["db_ids"] == val


def test_a_missing_database_or_field_is_refused_with_the_fix(tmp_path):
    folder = make_dev(tmp_path / "dev")
    rows = json.loads((folder / "dev.json").read_text())
    (folder / "dev.json").write_text(json.dumps([*rows, {**rows[0], "db_id": "nowhere"}]))
    with pytest.raises(DataError, match=r"missing from .*dev_databases: nowhere; expected e.g."):
        open_data(folder).load("dev")
    (folder / "dev.json").write_text(json.dumps([{k: v for k, v in rows[0].items() if k != "SQL"}]))
    with pytest.raises(DataError, match=r"example 0: field\(s\) 'SQL' \(missing\)"):
        open_data(folder).load("dev")
    with pytest.raises(DataError, match="no BIRD train.json"):
        open_data(folder).load("validation")


def test_the_fingerprint_covers_evidence_and_difficulty(tmp_path):
    folder = make_dev(tmp_path / "dev")
    before = open_data(folder).fingerprint("dev")
    rows = json.loads((folder / "dev.json").read_text())
    rows[0]["evidence"] = "another hint"
    (folder / "dev.json").write_text(json.dumps(rows))
    after = open_data(folder).fingerprint("dev")
    rows[0]["difficulty"] = "challenging"
    (folder / "dev.json").write_text(json.dumps(rows))
    assert len({before, after, open_data(folder).fingerprint("dev")}) == 3


def test_column_descriptions_follow_their_table(bird):
    db = bird / "dev" / "dev_databases" / "dorm_1" / "dorm_1.sqlite"
    schema = "CREATE TABLE Student (StuID INTEGER);\n\nCREATE TABLE Dorm (dormid INTEGER);"
    assert add_column_descriptions(schema, db) == (
        "CREATE TABLE Student (StuID INTEGER);\n\nCREATE TABLE Dorm (dormid INTEGER);\n"
        "/* column descriptions of Dorm:\n"
        "dormid: the unique id of the dorm\n"
        "student_capacity: how many students fit, at most\n"
        "gender: the gender the dorm houses [values: M: male; F: female; X: mixed]\n"
        "*/"
    )
    no_desc = bird / "dev" / "dev_databases" / "game_1" / "game_1.sqlite"
    assert add_column_descriptions(schema, no_desc) == schema


def test_accuracy_by_difficulty_counts_both_metrics():
    rows = [
        {"difficulty": "simple", "correct": True, "bird_correct": True},
        {"difficulty": "simple", "correct": False, "bird_correct": True},
        {"difficulty": "challenging", "correct": None, "bird_correct": None},
        {"difficulty": "", "correct": False, "bird_correct": False},
    ]
    got = accuracy_by_difficulty(rows)
    assert got["simple"] == {
        "n": 2,
        "correct": 1,
        "accuracy": 0.5,
        "bird_correct": 2,
        "bird_accuracy": 1.0,
        "excluded": 0,
    }
    assert got["moderate"]["n"] == 0 and got["moderate"]["accuracy"] is None
    assert got["challenging"]["excluded"] == 1 and got["unlabelled"]["n"] == 1
    assert accuracy_by_difficulty([{"correct": True}]) is None  # a Spider split has no breakdown


def test_dev_examples_match_the_fixture_table(bird):
    assert [t.difficulty for t in open_data(bird).load("dev")] == [d[4] for d in DEV]
