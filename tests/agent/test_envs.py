"""Training environments: the Text-to-SQL env scores with the strict reward only (no test-suite metric)."""

from __future__ import annotations

from types import SimpleNamespace as NS

from sqlrl import config as C


def test_text2sql_env_training_reward_skips_the_test_suite_metric(tmp_path):
    from sqlrl.agent.envs import make_env

    cfg = C.from_dict(
        {"data": {"path": "embedded", "max_train_tasks": 4}, "run": {"sandbox_workers": 1, "loggers": []}}
    )
    env = make_env(cfg, tmp_path)
    with env:
        assert env.evaluator.test_suite is False and env.evaluator.kind == "execution"
        task = env.tasks[0]
        # the gold itself, and the gold with DISTINCT added: the strict reward needs one execution each;
        # the test-suite metric would have run a DISTINCT-free variant of the second as well
        wrapped = f"SELECT DISTINCT * FROM ({task.gold_sql})"
        trajs = [
            NS(task_id=task.public.task_id, final_sql=sql, done=True, infra_error=None, reward=None)
            for sql in (task.gold_sql, wrapped)
        ]
        before = env.evaluator.memo_stats()["executions"]
        accs = env.score(trajs)
        assert env.evaluator.memo_stats()["executions"] - before == 2
    assert accs[0] == 1.0 and trajs[0].reward["status"] == "match"
    for tr in trajs:
        assert "test_suite_match" not in tr.reward["parts"]
        assert tr.reward["exec_ms"] is not None and tr.reward["exec_ms"] >= 0  # recorded in sql.jsonl


def test_validity_env_reads_accuracy_from_its_own_scoring(tmp_path):
    """The validity arm logs execution accuracy from the status of its one scoring pass (no second
    evaluator executing every prediction again), equal to what the execution reward gives."""
    from sqlrl.agent.envs import make_env
    from sqlrl.reward.evaluator import Evaluator

    cfg = C.from_dict(
        {
            "data": {"path": "embedded", "max_train_tasks": 4},
            "grpo": {"reward": "validity"},
            "run": {"sandbox_workers": 1, "loggers": []},
        }
    )
    env = make_env(cfg, tmp_path)
    with env:
        task = env.tasks[0]
        sqls = [task.gold_sql, "SELECT 12345", "SELEC nonsense", None]
        trajs = [
            NS(task_id=task.public.task_id, final_sql=sql, done=True, infra_error=None, reward=None)
            for sql in sqls
        ]
        before = env.evaluator.memo_stats()["executions"]
        accs = env.score(trajs)
        assert env.evaluator.memo_stats()["executions"] - before == 3  # one per SQL (None runs nothing)
        strict = Evaluator(env.sandbox, env.gold_cache, "execution", test_suite=False)
        want = [r.value for r in strict.score_many([(sql, task) for sql in sqls])]
    assert [tr.reward["value"] for tr in trajs] == [1.0, 1.0, 0.0, 0.0]  # validity: executes
    assert accs == want == [1.0, 0.0, 0.0, 0.0]
    assert [tr.reward["parts"]["execution_match"] for tr in trajs] == want


def test_make_env_closes_what_it_built_and_never_what_it_borrowed(tmp_path):
    from sqlrl.agent.envs import make_env
    from sqlrl.sql.sandbox import Sandbox

    with Sandbox(workers=1) as sb:
        with make_env(sandbox=sb, gold_dir=tmp_path / "gc", reward="validity") as env:
            assert env.sandbox is sb and env.evaluator.kind == "validity" and env.evaluator.test_suite
            assert env.gold_cache.path is not None
        assert sb.execute_many([(":memory:", "SELECT 1")])[0].status != "worker_crash"  # still open
    with make_env(workers=1, timeout_s=1.0) as env:
        assert env.gold_cache is None and env.evaluator is None
        assert env.sandbox.timeout_s == 1.0


def test_make_env_debug_builds_and_closes_its_pool(tmp_path):
    from sqlrl.agent.envs import make_env
    from sqlrl.tasks.debugging import debug_demo_root, load_debug_tasks

    tasks = load_debug_tasks(debug_demo_root() / "debug_tasks.jsonl")
    templates = {t.public.db_id: t.public.db_path for t in tasks}
    env = make_env(
        kind="debug", templates=templates, pool_root=tmp_path / "pool", replicas_per_db=3, workers=1
    )
    with env:
        assert env.capacity(tasks[0].public.db_id) == 3
    with make_env(kind="debug", pool=env.pool) as borrowed:
        assert borrowed.pool is env.pool


def test_text2sql_training_adds_paraphrases_and_records_their_count(tmp_path):
    import json

    from sqlrl.agent.envs import make_env
    from sqlrl.tasks.data import SpiderData, embedded_root

    raw = json.loads((embedded_root() / "train_spider.json").read_text())
    train_dbs = set(SpiderData("embedded").db_ids("train"))
    want = sum(
        1
        for e in raw
        if e["db_id"] in train_dbs
        and " ".join(e.get("question_syn", e["question"]).split()).lower()
        != " ".join(e["question"].split()).lower()
    )
    assert want > 0
    base = {"run": {"sandbox_workers": 1, "loggers": []}}
    plain = make_env(C.from_dict({"data": {"path": "embedded"}, **base}), tmp_path / "a")
    syn = make_env(
        C.from_dict({"data": {"path": "embedded", "train_paraphrases": True}, **base}), tmp_path / "b"
    )
    info = syn.split_info()
    assert info["train_paraphrases"]["added"] == want
    assert info["train_paraphrases"]["in_train_tasks"] == len(syn.tasks) - len(plain.tasks)
    assert "train_paraphrases" not in plain.split_info()
    assert info["validation"] == plain.split_info()["validation"]  # the held-out side does not move
