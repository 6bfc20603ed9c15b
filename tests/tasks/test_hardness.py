"""Official Spider hardness: hand-counted components of Spider golds, one row per counted feature."""

from __future__ import annotations

import pytest

from sqlrl.tasks.hardness import Components, accuracy_by_hardness, classify, components, hardness

# (gold SQL, component1, component2, others, class); the first eleven are train_spider.json golds verbatim
CASES = [
    # 0: WHERE only
    ("SELECT count(*) FROM head WHERE age  >  56", 1, 0, 0, "easy"),
    # 1: ORDER BY; three SELECT columns
    ("SELECT name ,  born_state ,  age FROM head ORDER BY age", 1, 0, 1, "medium"),
    # 4: BETWEEN is one condition
    ("SELECT avg(num_employees) FROM department WHERE ranking BETWEEN 10 AND 15", 1, 0, 0, "easy"),
    # 7: GROUP BY; the HAVING aggregate is not counted (count_agg reads the condition's NOT flag)
    ("SELECT born_state FROM head GROUP BY born_state HAVING count(*)  >=  3", 1, 0, 0, "easy"),
    # 11: NOT IN subquery: nested 1; the NOT flag counts as an aggregate, with count(*) that is 2 > 1
    (
        "SELECT count(*) FROM department WHERE department_id NOT IN (SELECT department_id FROM management);",
        1,
        1,
        1,
        "extra",
    ),
    # 15: LIKE counts in component1; two SELECT columns
    ("SELECT head_id ,  name FROM head WHERE name LIKE '%Ha%'", 2, 0, 1, "medium"),
    # 52: OR counts in component1; two WHERE conditions
    ("SELECT Official_Name FROM city WHERE Population  >  1500 OR Population  <  500", 2, 0, 1, "medium"),
    # 99: UNION
    (
        "SELECT student_id FROM student_course_registrations UNION "
        "SELECT student_id FROM student_course_attendance",
        0,
        1,
        0,
        "hard",
    ),
    # 169: EXCEPT; the second query's WHERE/GROUP BY/HAVING are not the top level's
    (
        "SELECT id FROM station WHERE lat  >  37.4 EXCEPT SELECT station_id FROM status "
        "GROUP BY station_id HAVING min(bikes_available)  <  7",
        1,
        1,
        0,
        "hard",
    ),
    # JOIN: two table units; WHERE, GROUP BY, ORDER BY, LIMIT: 4 + 1
    (
        "SELECT T2.name ,  T2.capacity FROM concert AS T1 JOIN stadium AS T2 ON T1.stadium_id  =  "
        "T2.stadium_id WHERE T1.year  >=  2014 GROUP BY T2.stadium_id ORDER BY count(*) DESC LIMIT 1",
        5,
        0,
        1,
        "extra",
    ),
    # INTERSECT
    (
        "SELECT country FROM singer WHERE age  >  40 INTERSECT SELECT country FROM singer WHERE age  <  30",
        1,
        1,
        0,
        "hard",
    ),
    # three aggregates, three columns
    ("SELECT avg(age) ,  min(age) ,  max(age) FROM singer WHERE country  =  'France'", 1, 0, 2, "medium"),
    # others > 2 (aggregates, columns, WHERE conditions) with component1 2
    (
        "SELECT max(age), min(age), name FROM singer WHERE age > 20 AND country = 'France' ORDER BY age",
        2,
        0,
        3,
        "hard",
    ),
    # component1 = 3: WHERE, ORDER BY, LIMIT
    ("SELECT name FROM singer WHERE age > 20 ORDER BY age LIMIT 1", 3, 0, 0, "hard"),
    # nested comparison with component1 2
    ("SELECT name FROM singer WHERE age > (SELECT avg(age) FROM singer) ORDER BY age", 2, 1, 0, "extra"),
    # FROM subquery: one table unit, not nested SQL; its WHERE is not the top level's
    ("SELECT count(*) FROM (SELECT name FROM singer WHERE age > 20)", 0, 0, 0, "easy"),
    # comma join counts like JOIN
    ("SELECT T1.name FROM singer AS T1 ,  concert AS T2 WHERE T1.id = T2.singer_id", 2, 0, 0, "medium"),
    # ORDER BY / LIMIT after UNION belong to the last query
    ("SELECT name FROM a UNION SELECT name FROM b ORDER BY name LIMIT 3", 0, 1, 0, "hard"),
    # BETWEEN two subqueries: two nested
    (
        "SELECT name FROM t WHERE x BETWEEN (SELECT min(x) FROM u) AND (SELECT max(x) FROM u)",
        1,
        2,
        0,
        "extra",
    ),
    # OR in JOIN ON
    ("SELECT a FROM t JOIN u ON t.id = u.id OR t.k = u.k", 2, 0, 0, "medium"),
    # NOT LIKE: LIKE in component1, NOT as an aggregate (1 + count(*) = 2)
    ("SELECT name ,  count(*) FROM t WHERE name NOT LIKE '%a%' GROUP BY name", 3, 0, 2, "hard"),
    # HAVING connectors count as aggregates (1 here: not > 1)
    ("SELECT c FROM t GROUP BY c HAVING count(*) > 1 AND avg(a) > 30", 1, 0, 0, "easy"),
    # two GROUP BY columns, two SELECT columns
    ("SELECT count(*) ,  city FROM employee GROUP BY city ,  age", 1, 0, 2, "medium"),
    # ORDER BY on two aggregates' difference: two aggregates
    ("SELECT name FROM t GROUP BY name ORDER BY sum(a) - sum(b) DESC LIMIT 1", 3, 0, 1, "hard"),
    # HAVING subquery is nested
    ("SELECT name FROM t GROUP BY name HAVING count(*) > (SELECT count(*) FROM u)", 1, 1, 0, "hard"),
    # IS NOT NULL is one condition, not a negated one
    ("SELECT name FROM t WHERE x IS NOT NULL", 1, 0, 0, "easy"),
]


@pytest.mark.parametrize("sql,c1,c2,others,cls", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_components_and_class(sql: str, c1: int, c2: int, others: int, cls: str) -> None:
    assert components(sql) == Components(c1, c2, others)
    assert hardness(sql) == cls


def test_every_class_is_covered() -> None:
    assert {c[-1] for c in CASES} == {"easy", "medium", "hard", "extra"}


@pytest.mark.parametrize(
    "c1,c2,others,cls",
    [
        (1, 0, 0, "easy"),
        (1, 0, 2, "medium"),
        (2, 0, 1, "medium"),
        (2, 0, 2, "extra"),
        (2, 0, 3, "hard"),
        (3, 0, 2, "hard"),
        (4, 0, 0, "extra"),
        (1, 1, 0, "hard"),
        (1, 1, 1, "extra"),
        (0, 2, 0, "extra"),
    ],
)
def test_classify_boundaries(c1: int, c2: int, others: int, cls: str) -> None:
    assert classify(c1, c2, others) == cls


def test_unparsable_sql_has_no_hardness() -> None:
    assert hardness("SELECT FROM WHERE (") is None
    with pytest.raises(ValueError, match="parse"):
        components("SELECT FROM WHERE (")


def test_accuracy_by_hardness_counts_scored_and_excluded() -> None:
    gold = {"a": CASES[0][0], "b": CASES[0][0], "c": CASES[1][0], "d": "SELECT FROM WHERE ("}
    results = [
        {"task_id": "a", "correct": True},
        {"task_id": "b", "correct": None},
        {"task_id": "c", "correct": False},
        {"task_id": "d", "correct": True},
        {"task_id": "zz", "correct": True},  # no gold known: skipped
    ]
    out = accuracy_by_hardness(results, gold)
    assert out["easy"] == {"n": 1, "correct": 1, "accuracy": 1.0, "excluded": 1}
    assert out["medium"] == {"n": 1, "correct": 0, "accuracy": 0.0, "excluded": 0}
    assert out["hard"] == {"n": 0, "correct": 0, "accuracy": None, "excluded": 0}
    assert out["unparsed"] == {"n": 1, "correct": 1, "accuracy": 1.0, "excluded": 0}
