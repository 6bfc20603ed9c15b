"""Shared fixtures: a small real SQLite database and public/private tasks on it. The only conftest.py:
tests import its helpers with `from conftest import ...`, which a second conftest.py would shadow."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
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


HOLDER = """
import sys
from sqlrl.artifacts import lock_run_folder
with lock_run_folder({folder!r}):
    print("held", flush=True)
    sys.stdin.read()  # until the test closes stdin (or kills this process)
"""


@pytest.fixture()
def hold_run_lock():
    """`hold(folder) -> Popen`: another process holding `folder`'s run lock (`artifacts.lock_run_folder`)
    until its stdin is closed (`release(p)`) or it is killed; holders still running at teardown are released."""
    started: list[subprocess.Popen] = []

    def hold(folder: Path) -> subprocess.Popen:
        p = subprocess.Popen(
            [sys.executable, "-c", HOLDER.format(folder=str(folder))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(p)
        assert p.stdout.readline().strip() == "held"
        return p

    yield hold
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)


def make_name_age_db(path: Path, rows: list[tuple]) -> str:
    """A real SQLite file at `path` (its folder is created) with one table t(name TEXT, age INTEGER)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (name TEXT, age INTEGER)")
    con.executemany("INSERT INTO t VALUES (?, ?)", rows)
    con.commit()
    con.close()
    return str(path)


def gold_task(db: str, gold_sql: str, task_id: str = "t/00000"):
    """A PrivateTask on the database file `db` with this gold (question and schema left empty)."""
    from sqlrl.tasks.data import PrivateTask, PublicTask

    return PrivateTask(PublicTask(task_id, Path(db).stem, "q?", "", "", db), gold_sql)


def score_statuses(
    sandbox, db: str, gold_sql: str, preds: list[str], timeout_s=None, gold_cache=None
) -> list:
    """(status, value) of each prediction against the gold, scored by `Evaluator.score_many` as
    training scores (a fresh GoldCache on `sandbox` unless one is given)."""
    from sqlrl.reward.evaluator import Evaluator
    from sqlrl.tasks.goldcache import GoldCache

    with gold_cache or GoldCache(executor=sandbox) as gc:
        ev = Evaluator(sandbox, gc, timeout_s=timeout_s)
        return [(r.status, r.value) for r in ev.score_many([(p, gold_task(db, gold_sql)) for p in preds])]


class ParentOnlySandbox:
    """A sandbox without `execute_scored`: drives the Evaluator's parent-side scoring path."""

    def __init__(self, sb) -> None:
        self.sb = sb
        self.max_rows, self.max_result_bytes = sb.max_rows, sb.max_result_bytes

    def execute(self, db, sql, timeout_s=None):
        return self.sb.execute(db, sql, timeout_s)

    def execute_many(self, items):
        return self.sb.execute_many(items)


@pytest.fixture()
def tiny_db(tmp_path: Path) -> str:
    """t(a INTEGER, b REAL) with rows (1, 1.5), (2, 2.0), (3, 4.0) (the debugging-task tests)."""
    p = tmp_path / "tiny.sqlite"
    con = sqlite3.connect(p)
    con.executescript(
        "CREATE TABLE t (a INTEGER, b REAL); INSERT INTO t VALUES (1, 1.5), (2, 2.0), (3, 4.0);"
    )
    con.commit()
    con.close()
    return str(p)


def status_rows(pattern: list[tuple[str, str]], side: int) -> list[dict]:
    """results.jsonl rows for one side of a paired pattern [(status A, status B), ...] on pets_1; an
    infra_error row is excluded (correct None)."""
    rows = []
    for i, statuses in enumerate(pattern):
        status = statuses[side]
        correct = None if status == "infra_error" else status == "match"
        rows.append({"task_id": f"dev/{i:05d}", "db_id": "pets_1", "status": status, "correct": correct})
    return rows


def oom_while_engine_cached(monkeypatch) -> None:
    """Make every update pass run out of memory while the policy's static engine cache is held."""
    import torch

    from sqlrl.generation import staticgen
    from sqlrl.training import update as U

    real = U.sequence_logprobs

    def logprobs(model, batch, *a, **k):
        if hasattr(staticgen._hf_model(model), "_sqlrl_static"):
            raise torch.OutOfMemoryError("CUDA out of memory (simulated: the cache is in the way)")
        return real(model, batch, *a, **k)

    monkeypatch.setattr(U, "sequence_logprobs", logprobs)
