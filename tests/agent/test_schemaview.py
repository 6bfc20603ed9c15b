"""Tests for sqlrl.agent.schemaview: question-ordered trimming (hand-checked orders), example values in
prompts, and that the defaults leave today's prompt unchanged."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sqlrl.agent.prompts import build_messages, truncate_schema
from sqlrl.agent.schemaview import rank_units, schema_for_prompt, words
from sqlrl.tasks.data import PublicTask, schema_text
from sqlrl.tasks.schemainfo import schema_info

SINGER = "CREATE TABLE singer (singer_id INTEGER PRIMARY KEY, name TEXT, country TEXT, age INTEGER);"
CONCERT = (
    "CREATE TABLE concert (concert_id INTEGER PRIMARY KEY, concert_name TEXT, "
    "stadium_id INTEGER REFERENCES stadium(stadium_id), year TEXT);"
)
STADIUM = "CREATE TABLE stadium (stadium_id INTEGER PRIMARY KEY, location TEXT, name TEXT, capacity INTEGER);"
SIC = (
    "CREATE TABLE singer_in_concert (concert_id INTEGER REFERENCES concert(concert_id), "
    "singer_id INTEGER REFERENCES singer(singer_id));"
)
LOG = "CREATE TABLE audit_log (id INTEGER PRIMARY KEY, message TEXT, created TEXT);"
QUESTION = "What is the capacity of the stadium where the concerts of 2014 were held?"


@pytest.fixture()
def concert_db(tmp_path: Path) -> str:
    path = tmp_path / "concert.sqlite"
    con = sqlite3.connect(path)
    for stmt in (SINGER, CONCERT, STADIUM, SIC, LOG):
        con.execute(stmt)
    con.execute("INSERT INTO stadium VALUES (1, 'Beijing', 'Bird Nest', 91000)")
    con.execute("INSERT INTO singer VALUES (1, 'Joe', 'France', 52)")
    con.commit()
    con.close()
    return str(path)


def task(db: str, question: str) -> PublicTask:
    return PublicTask("c/00000", "concert", question, schema_text(db), "", db)


def test_words_split_names_and_singularise():
    assert words("StudentCourseRegistrations", split_camel=True) == {"student", "course", "registration"}
    assert words("How many Countries? class bus") == {"how", "many", "country", "class", "bus"}


def test_rank_by_hand(concert_db):
    # Q = {capacity, stadium, concert, 2014, held}; id and name are column words of more than half of the
    # 5 tables, so they never count. (name hits, column hits): singer (0, 0), concert (1, 2: concert,
    # stadium), stadium (1, 2: stadium, capacity), singer_in_concert (1, 1: concert), audit_log (0, 0).
    # Tier 0: concert, stadium, singer_in_concert; tier 1: singer (foreign key of singer_in_concert).
    order = rank_units(QUESTION, schema_info(concert_db).units, with_values=False)
    assert [u.name for u in order] == ["concert", "stadium", "singer_in_concert", "singer", "audit_log"]


def test_a_question_matching_nothing_keeps_file_order(concert_db):
    order = rank_units("Hello there?", schema_info(concert_db).units, with_values=False)
    assert [u.name for u in order] == ["singer", "concert", "stadium", "singer_in_concert", "audit_log"]


def test_example_values_count_when_shown(concert_db):
    # 'Beijing' is a value of stadium.location only; 'France' of singer.country
    units = schema_info(concert_db, 1).units
    assert [u.name for u in rank_units("Who is from Beijing?", units, with_values=True)][0] == "stadium"
    assert [u.name for u in rank_units("Who is from Beijing?", units, with_values=False)][0] == "singer"
    # with values on, the foreign-key partner concert follows stadium; audit_log comes last
    order = [u.name for u in rank_units("Who is from Beijing?", units, with_values=True)]
    assert order == ["stadium", "concert", "singer", "singer_in_concert", "audit_log"]


def test_question_order_truncates_in_rank_order_and_shows_file_order(concert_db):
    t = task(concert_db, QUESTION)
    three = CONCERT + "\n\n" + STADIUM + "\n\n" + SIC + "\n-- [schema truncated: 2 of 5 tables left out]"
    assert schema_for_prompt(t, len(three), order="question") == three
    two = CONCERT + "\n\n" + STADIUM + "\n-- [schema truncated: 3 of 5 tables left out]"
    assert schema_for_prompt(t, len(three) - 1, order="question") == two
    # file order with the same budget keeps the first statements of the file instead (its marker is not
    # counted against the budget: truncate_schema's rule)
    want = SINGER + "\n\n" + CONCERT + "\n\n" + STADIUM + "\n-- [schema truncated: 2 more statements]"
    assert schema_for_prompt(t, len(three), order="file") == want
    # a schema that fits is shown whole, in file order, either way
    full = schema_text(concert_db)
    assert schema_for_prompt(t, len(full), order="question") == full == schema_for_prompt(t, len(full))


def test_first_ranked_table_alone_too_long_is_cut(concert_db):
    marker = "\n-- [schema truncated: 4 of 5 tables left out]"
    out = schema_for_prompt(task(concert_db, QUESTION), 60, order="question")
    assert out == CONCERT[: 60 - len(marker)] + marker and len(out) == 60


def test_defaults_are_todays_prompt(concert_db, shop_tasks):
    for t in [task(concert_db, QUESTION), *(x.public for x in shop_tasks)]:
        for budget in (200, 10_000):
            msgs = build_messages(t, turns=1, max_schema_chars=budget)
            want = f"Database schema:\n{truncate_schema(t.schema.strip(), budget)}\n\nQuestion: {t.question}"
            assert msgs[1]["content"] == want


def test_values_in_the_prompt(concert_db):
    msgs = build_messages(
        task(concert_db, QUESTION), turns=1, max_schema_chars=10_000, schema_sample_values=2
    )
    assert (
        STADIUM + "\n/* example values of stadium (up to 2 per column, most frequent first):\n"
        "  stadium_id: 1\n  location: 'Beijing'\n  name: 'Bird Nest'\n  capacity: 91000\n*/"
    ) in msgs[1]["content"]
    assert "/* concert has no rows */" in msgs[1]["content"]
    with pytest.raises(ValueError, match="'file' or 'question'"):
        schema_for_prompt(task(concert_db, QUESTION), 1000, order="random")
