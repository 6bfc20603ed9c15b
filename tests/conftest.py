"""Shared fixtures: a small real SQLite database and public/private tasks on it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

SHARED_SPIDER = Path(__file__).resolve().parents[2] / "shared" / "data" / "spider"


@pytest.fixture()
def shop_db(tmp_path: Path) -> str:
    (tmp_path / "db").mkdir()
    path = tmp_path / "db" / "shop.sqlite"
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE customer (id INTEGER PRIMARY KEY, name TEXT, city TEXT);
        CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customer(id), amount REAL);
        INSERT INTO customer VALUES (1, 'Ada', 'London'), (2, 'Bo', 'Paris'), (3, 'Cy', 'London');
        INSERT INTO orders VALUES (1, 1, 10.5), (2, 1, 20.0), (3, 2, 7.25);
        """
    )
    con.commit()
    con.close()
    return str(path)


@pytest.fixture()
def shop_tasks(shop_db: str):
    from sqlrl.tasks.data import PrivateTask, PublicTask, schema_text

    schema = schema_text(shop_db)
    qs = [
        ("How many customers are there?", "SELECT count(*) FROM customer"),
        ("List customer names in London.", "SELECT name FROM customer WHERE city = 'London'"),
        ("What is the total order amount?", "SELECT sum(amount) FROM orders"),
    ]
    return [
        PrivateTask(PublicTask(f"shop/{i:05d}", "shop", q, schema, "", shop_db), gold)
        for i, (q, gold) in enumerate(qs)
    ]
