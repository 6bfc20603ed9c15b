"""The public Python API (`import sqlrl`): cheap to import, every name resolves, the custom reward keeps
the built-in exclusion semantics on a real SQLite database, and the README's example runs (slow)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

import sqlrl
from sqlrl.reward.custom import CustomReward
from sqlrl.reward.evaluator import Evaluator
from sqlrl.sql.sandbox import Sandbox, SQLResult
from sqlrl.tasks.data import PrivateTask
from sqlrl.tasks.goldcache import GoldCache, GoldResult

ROOT = Path(__file__).resolve().parents[1]

sys.path.insert(0, str(ROOT / "tests" / "training"))
from test_trainer import tiny_factory  # noqa: E402  (the trainer tests' tiny Qwen2 policy)


def test_import_is_cheap():
    code = "import sys, sqlrl; print(sorted(m for m in ('torch', 'transformers', 'sqlglot') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


def test_every_public_name_resolves():
    for name in sqlrl.__all__:
        assert getattr(sqlrl, name) is not None, name
    assert set(sqlrl.__all__) <= set(dir(sqlrl))
    assert sqlrl.load_config is sqlrl.config.load and sqlrl.Evaluator is Evaluator
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        sqlrl.nope  # noqa: B018


# ------------------------------------------------------------------------------ custom reward adapter


class Recorder:
    """A user's reward function: 1.0 for the gold's rows as a multiset, else 0.25 when it ran, else 0."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __call__(self, pred, gold, task) -> float:
        assert isinstance(pred, SQLResult) and isinstance(gold, GoldResult) and isinstance(task, PrivateTask)
        assert gold.scorable
        self.calls.append((pred.status, task.task_id))
        if pred.status != "ok":
            return 0.0
        return 1.0 if sorted(map(repr, pred.rows)) == sorted(map(repr, gold.rows)) else 0.25


@pytest.fixture()
def stack(tmp_path):
    with Sandbox(workers=1, timeout_s=0.5) as sb, GoldCache(tmp_path / "gold") as gc:
        yield sb, gc


def test_custom_reward_scores_what_the_model_answered(stack, shop_tasks):
    sb, gc = stack
    fn = Recorder()
    ev = CustomReward(sb, gc, fn)
    count, names = shop_tasks[0], shop_tasks[1]
    slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    items = [
        ("SELECT count(*) FROM customer", count),
        ("SELECT 42", count),
        ("SELEC nonsense", count),
        (None, count),
        ("  ;", count),
        (slow, count),
        ("SELECT name FROM customer WHERE city = 'London'", names),
    ]
    got = ev.score_many(items)
    assert [r.status for r in got] == [
        "match",
        "mismatch",
        "exec_error",
        "no_sql",
        "no_sql",
        "timeout",
        "match",
    ]
    assert [r.value for r in got] == [1.0, 0.25, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert [r.parts["custom"] for r in got] == [r.value for r in got]
    assert [r.parts["execution_match"] for r in got] == [1.0, 0, 0, 0, 0, 0, 1.0]
    # every answer reached the function, slow and erroring ones included; nothing was excluded
    assert len(fn.calls) == len(items) and not ev.excluded
    assert [s for s, _ in fn.calls] == ["ok", "ok", "syntax_error", "empty_sql", "empty_sql", "timeout", "ok"]
    # the same statuses and the same exclusions as the built-in reward
    builtin = Evaluator(sb, gc).score_many(items)
    assert [r.status for r in builtin] == [r.status for r in got]
    assert [r.value is None for r in builtin] == [r.value is None for r in got]


def test_unscorable_gold_is_excluded_not_scored(stack, shop_db):
    from sqlrl.tasks.data import PublicTask

    sb, gc = stack
    fn = Recorder()
    empty = PrivateTask(
        PublicTask("shop/x", "shop", "q", "", "", shop_db), "SELECT name FROM customer WHERE 0"
    )
    broken = PrivateTask(PublicTask("shop/y", "shop", "q", "", "", shop_db), "SELECT nope FROM nowhere")
    ev = CustomReward(sb, gc, fn)
    got = ev.score_many([("SELECT 1", empty), ("SELECT 1", broken), (None, empty)])
    assert [(r.value, r.status) for r in got] == [(None, "gold_unscorable")] * 3
    assert [r.parts["reason"] for r in got] == ["gold_empty", "gold_error", "gold_empty"]
    assert fn.calls == [] and ev.excluded == {"gold_unscorable": 3}
    builtin = Evaluator(sb, gc).score_many([("SELECT 1", empty), ("SELECT 1", broken)])
    assert [(r.value, r.status) for r in builtin] == [(None, "gold_unscorable")] * 2


class CrashingSandbox:
    """The real sandbox, except that some SQL crashes the worker or raises (infrastructure)."""

    def __init__(self, sb):
        self.sb = sb

    def execute(self, db_path, sql):
        if "crash" in sql:
            return SQLResult("worker_crash", message="worker died")
        if "raise" in sql:
            raise OSError("pipe closed")
        return self.sb.execute(db_path, sql)

    def execute_many(self, items):
        raise RuntimeError("batch failed")  # the adapter falls back to one call per item


class BrokenGoldCache:
    def get(self, db_path, sql):
        raise OSError("disk gone")


def test_infrastructure_failures_are_excluded_not_scored(stack, shop_tasks):
    sb, gc = stack
    fn = Recorder()
    ev = CustomReward(CrashingSandbox(sb), gc, fn)
    task = shop_tasks[0]
    got = ev.score_many(
        [("SELECT 'crash'", task), ("SELECT 'raise'", task), ("SELECT count(*) FROM customer", task)]
    )
    assert [(r.value, r.status) for r in got] == [
        (None, "infra_error"),
        (None, "infra_error"),
        (1.0, "match"),
    ]
    assert got[0].parts["sandbox_status"] == "worker_crash" and "pipe closed" in got[1].parts["error"]
    assert len(fn.calls) == 1 and ev.excluded == {"infra_error": 2}
    gone = CustomReward(sb, BrokenGoldCache(), fn).score("SELECT 1", task)
    assert (gone.value, gone.status) == (None, "infra_error") and "disk gone" in gone.parts["error"]
    builtin = Evaluator(CrashingSandbox(sb), gc, test_suite=False).score_many(
        [("SELECT 'crash'", task), ("SELECT 'raise'", task)]
    )
    assert [(r.value, r.status) for r in builtin] == [(None, "infra_error")] * 2


def test_the_users_exception_propagates(stack, shop_tasks):
    sb, gc = stack

    def bad(pred, gold, task):
        raise KeyError("my bug")

    with pytest.raises(KeyError, match="my bug"):
        CustomReward(sb, gc, bad).score("SELECT 1", shop_tasks[0])
    for value, err in [(None, TypeError), ("1", TypeError), (math.nan, ValueError), (math.inf, ValueError)]:
        with pytest.raises(err, match="reward function returned"):
            CustomReward(sb, gc, lambda p, g, t, v=value: v).score("SELECT 1", shop_tasks[0])
    with pytest.raises(TypeError, match="PrivateTask"):
        CustomReward(sb, gc, Recorder()).score("SELECT 1", shop_tasks[0].public)


# ------------------------------------------------------------------------------ sqlrl.train(reward=...)


def tiny_cfg(**data):
    return sqlrl.Config().replace(
        model={"name": "tiny"},
        data={"path": "embedded", "max_train_tasks": 4, **data},
        agent={"max_new_tokens": 8, "max_schema_chars": 300, "max_context_tokens": 2048},
        grpo={"steps": 1, "prompts_per_step": 2, "group_size": 2, "lr": 1e-3, "micro_batch": 4},
        run={"device": "cpu", "loggers": [], "gen_engine": "fast", "sandbox_workers": 1},
    )


def test_train_with_a_custom_reward(tmp_path):
    pytest.importorskip("torch")
    fn = Recorder()
    res = sqlrl.train(tiny_cfg(), tmp_path / "run", reward=fn, policy_factory=tiny_factory, progress=False)
    assert res["finished"] and len(fn.calls) == 4
    rows = [json.loads(x) for x in (tmp_path / "run" / "sql.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["value"] in (0.0, 0.25, 1.0) for r in rows)
    assert json.loads((tmp_path / "run" / "run.json").read_text())["command"][-1].endswith("Recorder")

    def bad(pred, gold, task):
        raise ZeroDivisionError("user bug")

    with pytest.raises(ZeroDivisionError, match="user bug"):
        sqlrl.train(tiny_cfg(), tmp_path / "bad", reward=bad, policy_factory=tiny_factory, progress=False)
    with pytest.raises(ValueError, match="grpo.reward"):
        sqlrl.train(tiny_cfg(kind="debug"), tmp_path / "debug", reward=fn, policy_factory=tiny_factory)


# ------------------------------------------------------------------------------ the README's example


def readme_example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README.md has no ```python block"
    return blocks[0]


@pytest.mark.slow
def test_readme_example_runs(tmp_path):
    code = readme_example().replace('"runs/', f'"{tmp_path}/runs/')
    assert str(tmp_path) in code
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    summary = json.loads((tmp_path / "runs" / "api-eval" / "summary.json").read_text())
    assert summary["n_tasks"] >= 1 and summary["model"]["identity"].startswith("sha256:")
    assert json.loads((tmp_path / "runs" / "api" / "run.json").read_text())["finished"]
