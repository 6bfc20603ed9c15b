"""Agent logic with a scripted fake policy on a real SQLite database."""

from __future__ import annotations

import pytest

from sqlrl.agent.loop import Budgets, PolicyInfraError, Sampling
from sqlrl.agent.prompts import Parser
from sqlrl.agent.text2sql import run_agent
from sqlrl.generation.scripted import ScriptedPolicy
from sqlrl.sql.sandbox import Sandbox


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(workers=1, timeout_s=2.0) as sb:
        yield sb


def test_private_task_is_refused(shop_tasks, sandbox):
    policy = ScriptedPolicy(lambda text, turn: "```sql\nSELECT 1\n```")
    with pytest.raises(TypeError, match="PrivateTask"):
        run_agent(shop_tasks, policy, sandbox, Budgets())
    with pytest.raises(TypeError, match="PrivateTask"):
        run_agent([shop_tasks[0].public, shop_tasks[1]], policy, sandbox, Budgets())
    assert policy.calls == []  # refused before anything reached the policy


def test_duck_typed_task_is_refused(shop_tasks, sandbox):
    class Lookalike:
        task_id, db_id, question, schema, evidence = "x", "shop", "q", "", ""
        db_path = shop_tasks[0].public.db_path
        gold_sql = "SELECT 1"

    with pytest.raises(TypeError):
        run_agent([Lookalike()], ScriptedPolicy(lambda t, k: "x"), sandbox, Budgets())


def test_single_turn_takes_the_sql_and_never_executes(shop_tasks, sandbox):
    policy = ScriptedPolicy(lambda text, turn: "Here:\n```sql\nSELECT count(*) FROM customer;\n```")
    trajs = run_agent([t.public for t in shop_tasks], policy, sandbox, Budgets(turns=1))
    assert len(trajs) == 3 and len(policy.calls) == 1  # one batched generate call
    for tr in trajs:
        assert tr.final_sql == "SELECT count(*) FROM customer"
        assert tr.stop_reason == "single_turn" and tr.n_executions == 0 and len(tr.turns) == 1
        assert tr.turns[0].sql_result is None
        # loss mask covers exactly the generated ids, which are the tail of the sequence
        gen = tr.turns[0].completion_ids
        assert tr.token_ids[-len(gen) :] == gen
        assert tr.loss_mask == [0] * len(tr.prompt_ids) + [1] * len(gen)
        assert len(tr.logprobs) == len(tr.token_ids)
        assert tr.reward is None  # the evaluator writes it later


def test_multi_turn_inspect_then_final_with_real_observation(shop_tasks, sandbox):
    def script(text, turn):
        if turn == 0:
            return "```sql\nSELECT nme FROM customer\n```"  # typo -> real sqlite error
        if turn == 1:
            assert "no such column" in text  # the observation is the real sandbox error
            return "```sql\nSELECT name FROM customer WHERE city = 'London'\n```"
        assert "Ada" in text and "Cy" in text  # real rows
        return "FINAL"

    policy = ScriptedPolicy(script)
    [tr] = run_agent([shop_tasks[1].public], policy, sandbox, Budgets(turns=4, max_sql_executions=3))
    assert [t.action for t in tr.turns] == ["inspect", "inspect", "final"]
    assert tr.stop_reason == "final"
    assert (
        tr.final_sql == "SELECT name FROM customer WHERE city = 'London'"
    )  # FINAL without SQL keeps the last
    assert tr.n_executions == 2
    assert tr.turns[0].sql_result["status"] != "ok" and tr.turns[1].sql_result["status"] == "ok"
    # token layout: prompt | gen1 | obs1 | gen2 | obs2 | gen3, mask 1 only on gen
    pos = len(tr.prompt_ids)
    for t in tr.turns:
        n = len(t.completion_ids)
        assert tr.token_ids[pos : pos + n] == t.completion_ids
        assert tr.loss_mask[pos : pos + n] == [1] * n
        pos += n
        m = len(t.observation_ids)
        assert tr.loss_mask[pos : pos + m] == [0] * m
        pos += m
    assert pos == len(tr.token_ids)
    # the observation delta decodes to a user turn followed by the assistant header
    obs_text = policy.tokenizer.decode(tr.turns[0].observation_ids)
    assert "<|im_start|>user" in obs_text and obs_text.endswith("<|im_start|>assistant\n")
    assert not obs_text.startswith("<|im_end|><|im_end|>")


def test_turn_limit_makes_last_sql_final(shop_tasks, sandbox):
    policy = ScriptedPolicy(lambda text, turn: f"```sql\nSELECT {turn} FROM customer\n```")
    [tr] = run_agent([shop_tasks[0].public], policy, sandbox, Budgets(turns=3, max_sql_executions=5))
    assert len(tr.turns) == 3 and tr.stop_reason == "max_turns"
    assert tr.final_sql == "SELECT 2 FROM customer" and tr.n_executions == 2


def test_sql_execution_budget(shop_tasks, sandbox):
    policy = ScriptedPolicy(lambda text, turn: f"```sql\nSELECT {turn}\n```")
    [tr] = run_agent([shop_tasks[0].public], policy, sandbox, Budgets(turns=6, max_sql_executions=2))
    assert tr.n_executions == 2 and tr.stop_reason == "sql_budget" and tr.final_sql == "SELECT 2"


def test_invalid_reply_costs_a_turn_and_says_so(shop_tasks, sandbox):
    def script(text, turn):
        if turn == 0:
            return "I am not sure."
        assert "No SQL found" in text
        return "FINAL ```sql\nSELECT count(*) FROM customer\n```"

    [tr] = run_agent([shop_tasks[0].public], ScriptedPolicy(script), sandbox, Budgets(turns=3))
    assert [t.action for t in tr.turns] == ["invalid", "final"] and tr.n_executions == 0
    assert tr.final_sql == "SELECT count(*) FROM customer"


def test_no_sql_at_all(shop_tasks, sandbox):
    [tr] = run_agent([shop_tasks[0].public], ScriptedPolicy(lambda t, k: "no idea"), sandbox, Budgets())
    assert tr.final_sql is None and tr.stop_reason == "single_turn"


def test_context_budget_stops_before_generating(shop_tasks, sandbox):
    policy = ScriptedPolicy(lambda t, k: "```sql\nSELECT 1\n```")
    [tr] = run_agent(
        [shop_tasks[0].public], policy, sandbox, Budgets(max_new_tokens=64, max_context_tokens=100)
    )
    assert tr.stop_reason == "context_budget" and tr.turns == [] and policy.calls == []


def test_max_new_tokens_truncates(shop_tasks, sandbox):
    policy = ScriptedPolicy(lambda t, k: "```sql\nSELECT " + "1+" * 100 + "1\n```")
    [tr] = run_agent([shop_tasks[0].public], policy, sandbox, Budgets(max_new_tokens=16))
    assert tr.turns[0].finish_reason == "length" and len(tr.turns[0].completion_ids) == 16


def test_budgets_recorded_and_samples_grouped(shop_tasks, sandbox):
    b = Budgets(turns=1, max_new_tokens=32)
    trajs = run_agent(
        [t.public for t in shop_tasks[:2]],
        ScriptedPolicy(lambda t, k: "SELECT 1"),
        sandbox,
        b,
        Sampling(temperature=1.0, seed=3),
        n_samples=3,
    )
    assert [(t.task_id, t.sample) for t in trajs] == [
        (shop_tasks[0].public.task_id, 0),
        (shop_tasks[0].public.task_id, 1),
        (shop_tasks[0].public.task_id, 2),
        (shop_tasks[1].public.task_id, 0),
        (shop_tasks[1].public.task_id, 1),
        (shop_tasks[1].public.task_id, 2),
    ]
    assert all(t.budgets == b.to_dict() for t in trajs)
    assert Budgets(turns=1) != Budgets(turns=3)


def test_policy_infra_error_is_not_a_wrong_answer(shop_tasks, sandbox):
    class Broken(ScriptedPolicy):
        def generate(self, prompts, **kw):
            raise PolicyInfraError("server unreachable")

    [tr] = run_agent([shop_tasks[0].public], Broken(lambda t, k: ""), sandbox, Budgets())
    assert tr.stop_reason == "infra_error" and "unreachable" in tr.infra_error


def test_prompt_never_contains_gold(shop_tasks, sandbox):
    policy = ScriptedPolicy(lambda t, k: "```sql\nSELECT 1\n```")
    trajs = run_agent([t.public for t in shop_tasks], policy, sandbox, Budgets(turns=2))
    for tr, task in zip(trajs, shop_tasks):
        assert task.gold_sql not in tr.prompt_text
        assert task.public.question in tr.prompt_text


@pytest.mark.parametrize(
    "text,multi,kind,sql",
    [
        ("```sql\nSELECT 1;\n```", False, "final", "SELECT 1"),
        ("```sql\nSELECT 1\n```\nthen\n```sql\nSELECT 2\n```", False, "final", "SELECT 2"),
        ("```\nSELECT a FROM t\n```", True, "inspect", "SELECT a FROM t"),
        ("SELECT a\nFROM t", True, "inspect", "SELECT a\nFROM t"),
        ("I will select the rows", True, "invalid", None),
        ("FINAL\n```sql\nSELECT 3\n```", True, "final", "SELECT 3"),
        ("FINAL", True, "final", None),
        ("final answer is below ```sql SELECT 4```", True, "inspect", "SELECT 4"),  # FINAL must be upper case
        ("```sql\nSELECT 5", False, "final", "SELECT 5"),  # unterminated fence (hit max tokens)
    ],
)
def test_parser(text, multi, kind, sql):
    a = Parser.parse(text, multi_turn=multi)
    assert (a.kind, a.sql) == (kind, sql)


def test_rollout_prompt_shows_example_values_and_records_the_setting(shop_tasks, sandbox):
    policy = ScriptedPolicy(lambda text, turn: "```sql\nSELECT 1\n```")
    public = [shop_tasks[0].public]
    [plain] = run_agent(public, policy, sandbox, Budgets())
    [tr] = run_agent(public, policy, sandbox, Budgets(schema_sample_values=1))
    assert "example values" not in plain.prompt_text and "schema_sample_values" not in plain.budgets
    # customer: every id and name occurs once (smallest shown), London twice
    assert "  id: 1\n  name: 'Ada'\n  city: 'London'\n*/" in tr.prompt_text
    assert tr.budgets["schema_sample_values"] == 1 and "schema_order" not in tr.budgets  # at its default
