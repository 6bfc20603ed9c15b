"""A deterministic large SQLite database for the large-database benchmark (`bench/bench_big_db.py`).

Four related tables with a realistic mix of text and number columns, foreign keys and indexes, at
`--scale 1` (default) 5.55 million rows and about 0.7 GB:

    customers    500,000  id, name, email, country (40 values), segment (5), signup_date, credit
    products      50,000  id, name, category (25), price, description (about 80 chars)
    orders     2,000,000  id, customer_id -> customers, order_date, status (6), total, note
    order_items 3,000,000 id, order_id -> orders, product_id -> products, quantity, unit_price, comment

Values come from `random.Random(--seed)` (skewed categorical columns, uniform keys), so the same
command writes the same rows. Built in batches of 50,000 rows inside one transaction with
`journal_mode=OFF` and `synchronous=OFF`, indexes created after the rows; peak memory about 100 MB.
Written under /tmp by default: never commit it.

    python bench/make_big_db.py [--out /tmp/sqlrl_big/big/big.sqlite] [--scale 1.0] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import time

BATCH = 50_000
BASE_ROWS = {"customers": 500_000, "products": 50_000, "orders": 2_000_000, "order_items": 3_000_000}

SCHEMA = """
CREATE TABLE customers (
  id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT, country TEXT NOT NULL,
  segment TEXT NOT NULL, signup_date TEXT NOT NULL, credit REAL);
CREATE TABLE products (
  id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL, price REAL NOT NULL,
  description TEXT);
CREATE TABLE orders (
  id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
  order_date TEXT NOT NULL, status TEXT NOT NULL, total REAL NOT NULL, note TEXT);
CREATE TABLE order_items (
  id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL REFERENCES orders(id),
  product_id INTEGER NOT NULL REFERENCES products(id), quantity INTEGER NOT NULL,
  unit_price REAL NOT NULL, comment TEXT);
"""
INDEXES = """
CREATE INDEX customers_country ON customers(country);
CREATE INDEX orders_customer ON orders(customer_id);
CREATE INDEX orders_date ON orders(order_date);
CREATE INDEX order_items_order ON order_items(order_id);
CREATE INDEX order_items_product ON order_items(product_id);
"""

WORDS = (
    "alpha bravo cedar delta ember falcon garnet harbor iris juniper kestrel lumen maple nectar onyx "
    "pepper quartz raven sierra tundra umber velvet willow xenon yarrow zephyr amber basalt cobalt "
    "dune fjord glacier hollow indigo jasper koala lagoon meadow north orchid prairie quill ridge "
    "saffron timber upland vista walnut yonder zinc"
).split()
COUNTRIES = [f"Country{i:02d}" for i in range(40)]
SEGMENTS = ["consumer", "corporate", "home office", "small business", "government"]
CATEGORIES = [f"category {i}" for i in range(25)]
STATUSES = ["delivered", "shipped", "processing", "cancelled", "returned", "on hold"]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choices(WORDS, k=words))


def _date(rng: random.Random) -> str:
    return f"{rng.randrange(2015, 2025)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"


def _skewed(rng: random.Random, values: list[str]) -> str:
    """A value of `values`, the first ones far more frequent (about Zipf-like)."""
    return values[min(len(values) - 1, int(rng.expovariate(5.0 / len(values))))]


def _rows(table: str, rng: random.Random, start: int, stop: int, n: dict[str, int]) -> list[tuple]:
    if table == "customers":
        return [
            (
                i,
                f"{rng.choice(WORDS).title()} {rng.choice(WORDS).title()}",
                f"user{i}@{rng.choice(WORDS)}.example" if rng.random() < 0.9 else None,
                _skewed(rng, COUNTRIES),
                _skewed(rng, SEGMENTS),
                _date(rng),
                round(rng.uniform(0, 10_000), 2) if rng.random() < 0.95 else None,
            )
            for i in range(start, stop)
        ]
    if table == "products":
        return [
            (
                i,
                _text(rng, 2).title(),
                _skewed(rng, CATEGORIES),
                round(rng.uniform(1, 500), 2),
                _text(rng, 12),
            )
            for i in range(start, stop)
        ]
    if table == "orders":
        return [
            (
                i,
                rng.randrange(1, n["customers"] + 1),
                _date(rng),
                _skewed(rng, STATUSES),
                round(rng.uniform(5, 2_000), 2),
                _text(rng, 12) if rng.random() < 0.7 else None,
            )
            for i in range(start, stop)
        ]
    return [
        (
            i,
            rng.randrange(1, n["orders"] + 1),
            rng.randrange(1, n["products"] + 1),
            1 + int(rng.expovariate(0.5)),
            round(rng.uniform(1, 500), 2),
            _text(rng, 10) if rng.random() < 0.7 else None,
        )
        for i in range(start, stop)
    ]


def build(out: str, scale: float = 1.0, seed: int = 0) -> dict[str, int]:
    """Write the database to `out` (replacing it); returns the row count per table."""
    n = {t: max(10, int(c * scale)) for t, c in BASE_ROWS.items()}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    for suffix in ("", "-journal", "-wal"):
        if os.path.exists(out + suffix):
            os.remove(out + suffix)
    con = sqlite3.connect(out, isolation_level=None)
    con.execute("PRAGMA journal_mode=OFF")
    con.execute("PRAGMA synchronous=OFF")
    con.execute("PRAGMA cache_size=-65536")  # 64 MiB
    con.executescript(SCHEMA)
    rng = random.Random(seed)
    con.execute("BEGIN")
    for table, count in n.items():
        marks = ", ".join("?" * {"customers": 7, "products": 5, "orders": 6, "order_items": 6}[table])
        for start in range(1, count + 1, BATCH):
            stop = min(count + 1, start + BATCH)
            con.executemany(f"INSERT INTO {table} VALUES ({marks})", _rows(table, rng, start, stop, n))
    con.execute("COMMIT")
    con.executescript(INDEXES)
    con.execute("ANALYZE")
    con.close()
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/sqlrl_big/big/big.sqlite")
    ap.add_argument("--scale", type=float, default=1.0, help="row counts times this (1.0: 5.55M rows)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    t0 = time.perf_counter()
    n = build(a.out, a.scale, a.seed)
    size = os.path.getsize(a.out)
    print(
        f"wrote {a.out}: {sum(n.values()):,} rows {n}, {size / 1e6:.0f} MB in {time.perf_counter() - t0:.0f} s"
    )


if __name__ == "__main__":
    main()
