"""The SQL-debugging agent: gold isolation, per-trajectory replicas, protocol, budgets, tokens, scoring.

Real SQLite on the embedded demo tasks (`debug_demo_root()`), a real `ReplicaPool` and a `ScriptedPolicy`;
CPU only, a few seconds.
"""

from __future__ import annotations

import json

import pytest

from sqlrl.agent.debugging import (
    ACTION_EXECUTE,
    ACTION_INVALID,
    ACTION_SUBMIT,
    DebugTrajectory,
    build_debug_messages,
    parse_debug_action,
    release_debug_trajectories,
    run_debug_agent,
    score_debug_trajectories,
)
from sqlrl.agent.loop import Budgets, PolicyInfraError, Trajectory
from sqlrl.agent.prompts import ChatFormat
from sqlrl.evaluation.debugging import evaluate_debug, summarize_debug, write_debug_eval_run
from sqlrl.generation.scripted import ScriptedPolicy
from sqlrl.sql.replicas import ReplicaPool, sha256_file
from sqlrl.tasks.debug_episode import validate_task
from sqlrl.tasks.debugging import DebugTaskPrivate, DebugTaskPublic, debug_demo_root, load_debug_tasks

MULTI = Budgets(turns=4, max_new_tokens=200, max_sql_executions=3, max_context_tokens=30000)


@pytest.fixture(scope="module")
def tasks() -> dict[str, DebugTaskPrivate]:
    return {t.task_id: t for t in load_debug_tasks(debug_demo_root() / "debug_tasks.jsonl")}


@pytest.fixture()
def pool(tasks, tmp_path):
    templates = {t.public.db_id: t.public.db_path for t in tasks.values()}
    with ReplicaPool(templates, tmp_path / "pool", replicas_per_db=2, workers=1) as p:
        yield p


def _sql(*stmts: str) -> str:
    return "\n".join(f"```sql\n{s}\n```" for s in stmts)


def _policy(tasks, replies: dict[str, list[str]] | None = None, default=None) -> ScriptedPolicy:
    """Replies per task id (by turn; the last reply repeats); `default(task, turn)` otherwise."""
    replies = replies or {}

    def script(text: str, turn: int) -> str:
        for tid, t in tasks.items():
            if t.public.description in text:
                if tid in replies:
                    r = replies[tid]
                    return r[min(turn, len(r) - 1)]
                return default(t, turn)
        raise AssertionError("unknown prompt")

    return ScriptedPolicy(script)


def _submit_solution(t: DebugTaskPrivate, turn: int) -> str:
    return "SUBMIT\n" + _sql(*t.solution_sql)


def _rows(pool, tid, sql):
    r = pool.execute(tid, sql)
    assert r.status == "ok", r
    return r.rows


# ---------------------------------------------------------------------------------------------- gold


def test_private_task_is_refused_before_anything(tasks, pool):
    pol = _policy(tasks, default=_submit_solution)
    priv = tasks["debug/activity_1/000"]
    with pytest.raises(TypeError, match="DebugTaskPrivate"):
        run_debug_agent([priv], pol, pool, MULTI)
    with pytest.raises(TypeError):
        run_debug_agent([priv.public, object()], pol, pool, MULTI)
    assert pol.calls == []
    assert pool.stats()["leases"] == 0


def test_prompt_holds_public_fields_only(tasks):
    t = tasks["debug/body_builder/003"]
    msgs = build_debug_messages(t.public, MULTI)
    text = json.dumps(msgs)
    assert "SUBMIT" in msgs[0]["content"] and "4 turns" in msgs[0]["content"]
    user = msgs[1]["content"]
    assert t.public.buggy_sql in user and t.public.description in user and "management" in user
    assert t.solution_sql[0] not in text
    assert all(tc not in text for tc in t.test_cases)
    short = build_debug_messages(t.public, Budgets(turns=2, max_schema_chars=50))
    assert "schema truncated" in short[1]["content"]


# ------------------------------------------------------------------------------------------- parsing


def test_parse_debug_action():
    p = parse_debug_action
    a = p("```sql\nSELECT 1\n```", multi_turn=True, category="query")
    assert a.kind == ACTION_EXECUTE and a.sql == "SELECT 1"
    a = p("SUBMIT\n```sql\nSELECT 1;\n```\n```sql\nSELECT 2\n```", multi_turn=True, category="query")
    assert a.kind == ACTION_SUBMIT and a.submission == ("SELECT 2",)
    a = p("SUBMIT\n" + _sql("UPDATE t SET a = 1", "DELETE FROM t"), multi_turn=True, category="management")
    assert a.submission == ("UPDATE t SET a = 1", "DELETE FROM t")
    assert p("thinking...", multi_turn=True, category="query").kind == ACTION_INVALID
    assert p("submit ```sql\nSELECT 1\n```", multi_turn=True, category="query").kind == ACTION_EXECUTE
    a = p("```sql\nDELETE FROM t\n```", multi_turn=False, category="management")
    assert a.kind == ACTION_SUBMIT and a.submission == ("DELETE FROM t",)


# ------------------------------------------------------------------------------------ replica state


def test_execute_side_effects_stay_on_own_replica(tasks, pool):
    task = tasks["debug/activity_1/000"]
    tpl_sha = sha256_file(task.public.db_path)
    k = {"n": 0}

    def script(text: str, turn: int) -> str:
        if turn == 0:
            k["n"] += 1
            return _sql(f"INSERT INTO Activity VALUES ({900 + k['n']}, 'mine{k['n']}')")
        if turn == 1:
            return _sql("SELECT group_concat(activity_name) FROM Activity WHERE actid > 900")
        return "SUBMIT\n" + _sql(*task.solution_sql)

    pol = ScriptedPolicy(script)
    trajs = run_debug_agent([task.public], pol, pool, MULTI, n_samples=2)
    assert [tr.extra["trajectory_id"] for tr in trajs] == ["debug/activity_1/000#0", "debug/activity_1/000#1"]
    assert trajs[0].extra["replica"]["path"] != trajs[1].extra["replica"]["path"]
    seen = [tr.turns[1].observation for tr in trajs]
    assert "mine1" in seen[0] and "mine2" not in seen[0]
    assert "mine2" in seen[1] and "mine1" not in seen[1]
    assert all(tr.turns[0].sql_result["status"] == "ok" for tr in trajs)
    assert pool.stats()["active_leases"] == 2  # still held until scored
    score_debug_trajectories(trajs, tasks, pool)
    assert [tr.reward["status"] for tr in trajs] == ["solved", "solved"]  # the extra row is not in the answer
    assert all(tr.extra["released_dirty"] for tr in trajs)  # the executed INSERTs
    assert pool.stats()["active_leases"] == 0
    assert sha256_file(task.public.db_path) == tpl_sha


def test_replica_released_and_reset_for_next_lease(tasks, pool):
    task = tasks["debug/body_builder/003"]  # management: DELETE
    tpl_sha = sha256_file(task.public.db_path)
    pol = _policy(tasks, default=_submit_solution)
    trajs = run_debug_agent([task.public], pol, pool, MULTI, n_samples=2)
    # the submitted DELETE never touches the replicas: it is scored on a fresh copy
    assert _rows(pool, "debug/body_builder/003#0", "SELECT count(*) FROM people") == [(6,)]
    s0 = pool.stats()
    score_debug_trajectories(trajs, tasks, pool)
    assert [tr.reward["status"] for tr in trajs] == ["solved", "solved"]
    s1 = pool.stats()
    assert s1["active_leases"] == 0 and s1["dirty_releases"] == s0["dirty_releases"]
    assert not any(tr.extra["released_dirty"] for tr in trajs)
    assert all(not st["needs_reset"] and st["available"] for st in pool.replica_state("body_builder"))
    # a trajectory that wrote while exploring leaves its replica dirty: reset before the next lease
    pol = _policy(tasks, {task.task_id: [_sql("DELETE FROM people"), "SUBMIT\n" + _sql(*task.solution_sql)]})
    trajs = run_debug_agent([task.public], pol, pool, MULTI)
    assert _rows(pool, "debug/body_builder/003#0", "SELECT count(*) FROM people") == [(0,)]
    score_debug_trajectories(trajs, tasks, pool)
    assert trajs[0].reward["status"] == "solved"  # the exploration's DELETE is not in the scored state
    assert trajs[0].extra["released_dirty"] is True
    assert sum(st["needs_reset"] for st in pool.replica_state("body_builder")) == 1
    leases = [pool.lease(p, "body_builder") for p in ("probe", "probe_b")]  # both replicas
    assert pool.stats()["resets"] == s1["resets"] + 1  # only the dirty one was reset
    for p, lease in zip(("probe", "probe_b"), leases):
        # byte-identical to the clean replica image (the template with the WAL-mode header bytes)
        assert sha256_file(lease.path) == pool.replica_sha256["body_builder"]
        assert _rows(pool, p, "SELECT count(*) FROM people") == [(6,)]
        assert pool.release(p) is False  # read-only -> clean
    assert sha256_file(task.public.db_path) == tpl_sha  # the template itself never changed
    # a read-only trajectory is released clean and its replica handed out again without a reset
    q = tasks["debug/body_builder/000"]
    pol = _policy(tasks, {q.task_id: [_sql("SELECT count(*) FROM people"), "SUBMIT"]})
    resets = pool.stats()["resets"]
    trajs = run_debug_agent([q.public], pol, pool, MULTI)
    score_debug_trajectories(trajs, tasks, pool)
    # SUBMIT without SQL on a query task falls back to the last executed SELECT (wrong here: a count)
    assert trajs[0].extra["submission"] == ["SELECT count(*) FROM people"]
    assert trajs[0].reward["status"] in ("failed", "partial")
    assert trajs[0].extra["released_dirty"] is False  # the scorer wrote nothing into it
    pol = _policy(tasks, {q.task_id: ["I give up."]})
    trajs = run_debug_agent([q.public], pol, pool, Budgets(turns=1, max_context_tokens=30000))
    score_debug_trajectories(trajs, tasks, pool)
    assert trajs[0].reward["status"] == "no_sql" and trajs[0].reward["value"] == 0.0
    assert trajs[0].extra["released_dirty"] is False
    pool.lease("probe2", "body_builder")
    assert pool.stats()["resets"] == resets  # clean replicas are handed out without a reset
    pool.release("probe2")


def test_preprocess_runs_on_the_replica(tasks, pool):
    t = tasks["debug/activity_1/005"]  # personalization: preprocess DROP VIEW IF EXISTS
    pol = _policy(tasks, default=_submit_solution)
    trajs = run_debug_agent([t.public], pol, pool, MULTI)
    assert trajs[0].extra["preprocess"] == [{"status": "ok", "message": ""}]
    score_debug_trajectories(trajs, tasks, pool)
    assert trajs[0].reward["status"] == "solved"


# ------------------------------------------------------------------------------------------- scoring


@pytest.mark.parametrize("tid", ["debug/activity_1/000", "debug/body_builder/003", "debug/book_2/005"])
def test_reference_solves_buggy_fails(tasks, pool, tid):
    t = tasks[tid]
    pol = _policy(tasks, {tid: ["SUBMIT\n" + _sql(*t.solution_sql)]})
    good = run_debug_agent([t.public], pol, pool, MULTI)
    score_debug_trajectories(good, tasks, pool)
    assert good[0].reward["status"] == "solved" and good[0].reward["value"] == 1.0
    assert good[0].stop_reason == "submit" and len(good[0].turns) == 1
    pol = _policy(tasks, {tid: ["SUBMIT\n" + _sql(t.public.buggy_sql)]})
    bad = run_debug_agent([t.public], pol, pool, MULTI)
    score_debug_trajectories(bad, tasks, pool)
    assert bad[0].reward["status"] in ("failed", "partial", "exec_error")
    assert bad[0].reward["value"] < 1.0
    assert pool.stats()["active_leases"] == 0


def _update_task(tasks) -> DebugTaskPrivate:
    base = tasks["debug/body_builder/003"].public
    cond = "b.\"Birth_Place\" = 'Anchorage, Alaska'"
    close = '(a."Weight" IS b."Weight" OR abs(a."Weight" - b."Weight") <= 1e-6)'
    join = 'FROM ref."people" b LEFT JOIN main."people" a ON a.rowid = b.rowid'
    pub = DebugTaskPublic(
        task_id="debug/body_builder/update",
        db_id=base.db_id,
        category="management",
        description="Increase Weight by 10% for people born in Anchorage, Alaska; nothing else changes.",
        schema=base.schema,
        buggy_sql="UPDATE people SET Weight = Weight * 0.10 WHERE Birth_Place = 'Anchorage, Alaska'",
        preprocess_sql=(),
        db_path=base.db_path,
    )
    return DebugTaskPrivate(
        public=pub,
        solution_sql=["UPDATE people SET Weight = Weight * 1.10 WHERE Birth_Place = 'Anchorage, Alaska'"],
        test_cases=[
            f"SELECT NOT EXISTS (SELECT 1 {join} WHERE {cond} AND (a.rowid IS NULL OR NOT {close}))",
            f"SELECT NOT EXISTS (SELECT 1 {join} WHERE ({cond}) IS NOT 1 AND (a.rowid IS NULL OR NOT {close}))",
            'SELECT (SELECT count(*) FROM main."people") = (SELECT count(*) FROM ref."people")',
        ],
    )


def test_management_task_solved_by_update_submission(tasks, pool):
    t = _update_task(tasks)
    assert validate_task(t) is None
    everything = {**tasks, t.task_id: t}
    sol = t.solution_sql[0]
    look = "SELECT Weight FROM people WHERE Birth_Place = 'Anchorage, Alaska'"
    pol = _policy(everything, {t.task_id: [_sql(look), "SUBMIT\n" + _sql(sol)]})
    trajs = run_debug_agent([t.public], pol, pool, MULTI)
    assert [x.action for x in trajs[0].turns] == [ACTION_EXECUTE, ACTION_SUBMIT]
    score_debug_trajectories(trajs, everything, pool)
    assert trajs[0].reward["status"] == "solved", trajs[0].reward
    # trying the fix first and then submitting it is scored like submitting it directly: the submission
    # is applied once, to a fresh copy (before 2026-11-29 the UPDATE ran twice and the task failed)
    pol = _policy(everything, {t.task_id: [_sql(sol), _sql(look), "SUBMIT\n" + _sql(sol)]})
    twice = run_debug_agent([t.public], pol, pool, MULTI)
    assert twice[0].turns[0].sql_result["status"] == "ok"
    assert twice[0].extra["submission"] == [sol]
    score_debug_trajectories(twice, everything, pool)
    assert twice[0].reward["status"] == "solved", twice[0].reward
    # the same on a schema change: ALTER ... ADD COLUMN executed, then submitted (was "duplicate column")
    add = "ALTER TABLE people ADD COLUMN note TEXT"
    alter = DebugTaskPrivate(
        public=DebugTaskPublic(
            task_id="debug/body_builder/alter",
            db_id=t.public.db_id,
            category="management",
            description="Add a TEXT column named note to people.",
            schema=t.public.schema,
            buggy_sql="ALTER TABLE people ADD COLUMN note INTEGER",
            preprocess_sql=(),
            db_path=t.public.db_path,
        ),
        solution_sql=[add],
        test_cases=[
            "SELECT count(*) = 1 FROM pragma_table_info('people') WHERE name = 'note' AND type = 'TEXT'"
        ],
    )
    assert validate_task(alter) is None
    everything[alter.task_id] = alter
    pol = _policy(everything, {alter.task_id: [_sql(add), "SUBMIT\n" + _sql(add)]})
    trajs = run_debug_agent([alter.public], pol, pool, MULTI)
    assert trajs[0].turns[0].sql_result["status"] == "ok"
    score_debug_trajectories(trajs, everything, pool)
    assert trajs[0].reward["status"] == "solved", trajs[0].reward
    assert trajs[0].extra["released_dirty"] is True  # the executed ALTER changed the replica


# ------------------------------------------------------------------------------------------- budgets


def test_turn_budget_last_sql_is_the_submission(tasks, pool):
    t = tasks["debug/activity_1/001"]
    explore = _sql("SELECT count(*) FROM Faculty_participates_in")
    pol = _policy(tasks, {t.task_id: [explore, explore, _sql(t.solution_sql[0])]})
    b = Budgets(turns=3, max_new_tokens=200, max_sql_executions=5, max_context_tokens=30000)
    trajs = run_debug_agent([t.public], pol, pool, b)
    tr = trajs[0]
    assert tr.stop_reason == "max_turns" and len(tr.turns) == 3 and tr.n_executions == 2
    assert tr.turns[-1].observation is None and tr.extra["submission"] == [t.solution_sql[0]]
    assert "last turn" in tr.turns[-2].observation
    score_debug_trajectories(trajs, tasks, pool)
    assert tr.reward["status"] == "solved"


def test_sql_budget(tasks, pool):
    t = tasks["debug/activity_1/001"]
    pol = _policy(tasks, {t.task_id: [_sql("SELECT 1"), _sql("SELECT 2"), "SUBMIT"]})
    b = Budgets(turns=5, max_new_tokens=200, max_sql_executions=1, max_context_tokens=30000)
    trajs = run_debug_agent([t.public], pol, pool, b)
    tr = trajs[0]
    assert tr.stop_reason == "sql_budget" and tr.n_executions == 1 and len(tr.turns) == 2
    assert tr.extra["submission"] == ["SELECT 2"]
    release_debug_trajectories(trajs, pool)
    assert pool.stats()["active_leases"] == 0


def test_context_budget_and_invalid_turn(tasks, pool):
    t = tasks["debug/activity_1/001"]
    pol = _policy(tasks, {t.task_id: ["hmm"]})
    n_prompt = len(ChatFormat(pol.tokenizer).prompt_ids(build_debug_messages(t.public, MULTI)))
    b = Budgets(turns=4, max_new_tokens=100, max_context_tokens=n_prompt + 150)
    trajs = run_debug_agent([t.public], pol, pool, b)
    tr = trajs[0]
    assert tr.turns[0].action == ACTION_INVALID and "No SQL found" in tr.turns[0].observation
    assert tr.stop_reason == "context_budget" and len(tr.turns) == 1
    assert tr.final_sql is None
    score_debug_trajectories(trajs, tasks, pool)
    assert tr.reward["status"] == "no_sql"


def test_loss_mask_and_token_layout(tasks, pool):
    t = tasks["debug/activity_1/001"]
    r1, r2 = _sql("SELECT count(*) FROM Faculty_participates_in"), "SUBMIT\n" + _sql(t.solution_sql[0])
    pol = _policy(tasks, {t.task_id: [r1, r2]})
    tr = run_debug_agent([t.public], pol, pool, MULTI)[0]
    assert isinstance(tr, DebugTrajectory) and isinstance(tr, Trajectory)
    t1, t2 = tr.turns
    assert tr.token_ids == tr.prompt_ids + t1.completion_ids + t1.observation_ids + t2.completion_ids
    assert tr.loss_mask == (
        [0] * len(tr.prompt_ids) + [1] * len(t1.completion_ids) + [0] * len(t1.observation_ids)
    ) + [1] * len(t2.completion_ids)
    assert tr.generated_tokens == len(t1.completion_ids) + len(t2.completion_ids)
    assert [lp for lp, m in zip(tr.logprobs, tr.loss_mask) if m] == [-0.5] * tr.generated_tokens
    assert all(lp == 0.0 for lp, m in zip(tr.logprobs, tr.loss_mask) if not m)
    # the second prompt is token-exactly what the policy was given
    assert pol.calls[1][0] == tr.prompt_ids + t1.completion_ids + t1.observation_ids
    # and decodes to the chat template render of the whole conversation
    chat = ChatFormat(pol.tokenizer)
    msgs = build_debug_messages(t.public, MULTI) + [
        {"role": "assistant", "content": r1},
        {"role": "user", "content": t1.observation},
        {"role": "assistant", "content": r2},
    ]
    assert pol.tokenizer.decode(tr.token_ids) + "\n" == chat.render(msgs, add_generation_prompt=False)
    assert "status: ok (1 row)" in t1.observation
    assert tr.budgets == MULTI.to_dict()
    release_debug_trajectories([tr], pool)


def test_threaded_scoring_equals_serial_and_checks_before_releasing(tasks, pool):
    picked = ["debug/activity_1/000", "debug/body_builder/003", "debug/book_2/005", "debug/activity_1/001"]
    ts = [tasks[t] for t in picked]

    def replies(k: int) -> dict:
        # per task: the solution, the buggy SQL, a broken statement and no SQL, rotated by k
        out = {}
        for j, t in enumerate(ts):
            opts = [
                "SUBMIT\n" + _sql(*t.solution_sql),
                "SUBMIT\n" + _sql(t.public.buggy_sql),
                "SUBMIT\n" + _sql("UPDATE nope SET x = 1"),
                "I give up.",
            ]
            out[t.task_id] = [opts[(j + k) % 4]]
        return out

    results = {}
    for threads in (1, 4):
        got = []
        for k in range(4):
            trajs = run_debug_agent([t.public for t in ts], _policy(tasks, replies(k)), pool, MULTI)
            score_debug_trajectories(trajs, tasks, pool, threads=threads)
            got += [(tr.task_id, tr.reward["status"], tr.reward["value"]) for tr in trajs]
            assert pool.stats()["active_leases"] == 0
        results[threads] = got
    assert results[1] == results[4]
    assert {s for _, s, _ in results[1]} >= {"solved", "exec_error", "no_sql"}
    # a bad task entry is found before anything is scored or released
    trajs = run_debug_agent([t.public for t in ts[:2]], _policy(tasks, replies(0)), pool, MULTI)
    bad = {**tasks, ts[1].task_id: ts[0]}
    with pytest.raises(TypeError, match="must be the DebugTaskPrivate of that task"):
        score_debug_trajectories(trajs, bad, pool)
    assert pool.stats()["active_leases"] == 2 and all(tr.reward is None for tr in trajs)
    score_debug_trajectories(trajs, tasks, pool)
    assert pool.stats()["active_leases"] == 0


def test_policy_infra_error_is_excluded_and_released(tasks, pool):
    class Broken(ScriptedPolicy):
        def generate(self, prompts, **kw):
            raise PolicyInfraError("server down")

    t = tasks["debug/activity_1/001"]
    trajs = run_debug_agent([t.public], Broken(lambda s, k: ""), pool, MULTI)
    assert trajs[0].stop_reason == "infra_error"
    score_debug_trajectories(trajs, tasks, pool)
    assert trajs[0].reward["value"] is None and trajs[0].reward["status"] == "infra_error"
    assert trajs[0].extra["released_dirty"] is True and pool.stats()["active_leases"] == 0


def test_capacity_and_duplicate_checks(tasks, pool):
    t = tasks["debug/activity_1/001"]
    pol = _policy(tasks, default=_submit_solution)
    with pytest.raises(ValueError, match="replicas"):
        run_debug_agent([t.public], pol, pool, MULTI, n_samples=3)
    with pytest.raises(ValueError, match="unique"):
        run_debug_agent([t.public, t.public], pol, pool, MULTI)
    assert pol.calls == [] and pool.stats()["leases"] == 0


# ---------------------------------------------------------------------------------------- evaluation


def test_evaluate_debug_category_summary_and_run_folder(tasks, tmp_path):
    chosen = [t for tid, t in sorted(tasks.items()) if tid.startswith("debug/activity_1/")]
    assert [t.category for t in chosen].count("query") == 3

    def default(t, turn):  # query tasks: the solution; others: the buggy SQL
        sql = t.solution_sql if t.category == "query" else [t.public.buggy_sql]
        return "SUBMIT\n" + _sql(*sql)

    pol = _policy(tasks, default=default)
    trajs, results, summary = evaluate_debug(
        chosen, pol, MULTI, pool_root=tmp_path / "pool", replicas_per_db=2
    )
    assert len(trajs) == len(results) == 6 and summary["n"] == 6
    pc = summary["per_category"]
    assert pc["query"] == {"n": 3, "solved": 3, "mean_reward": 1.0}
    assert pc["management"]["n"] == 2 and pc["management"]["solved"] == 0
    assert pc["personalization"]["n"] == 1 and pc["personalization"]["solved"] == 0
    assert summary["solved_rate"] == pytest.approx(0.5)
    exp_mean = sum(r["reward"] for r in results) / 6
    assert summary["mean_reward"] == pytest.approx(exp_mean)
    assert summary["status_counts"]["solved"] == 3
    assert summary == {**summary, **summarize_debug(results, trajs)}
    write_debug_eval_run(tmp_path / "run", trajs, results, summary, {"model": "scripted"})
    lines = (tmp_path / "run" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 6 and json.loads(lines[0])["category"] == "query"
    tj = [json.loads(x) for x in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    assert tj[0]["extra"]["category"] == "query" and tj[0]["reward"]["status"] == "solved"
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["per_category"]["query"]["solved"] == 3 and s["model"] == "scripted"
    assert (tmp_path / "run" / "run.json").is_file()
