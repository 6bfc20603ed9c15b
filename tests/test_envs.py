"""Training environments: the Text-to-SQL env scores with the strict reward only (no test-suite metric)."""

from __future__ import annotations

from types import SimpleNamespace as NS

from sqlrl import config as C


def test_text2sql_env_training_reward_skips_the_test_suite_metric(tmp_path):
    from sqlrl.envs import make_env

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
