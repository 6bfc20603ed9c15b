"""The checker turn (`agent.checker`) with scripted policies on the embedded Spider demo (real SQLite)."""

from __future__ import annotations

import pytest

from sqlrl import config as C
from sqlrl.agent.loop import Budgets
from sqlrl.agent.text2sql import run_agent
from sqlrl.evaluation.runner import evaluate_tasks
from sqlrl.generation.scripted import ScriptedPolicy
from sqlrl.sql.sandbox import Sandbox
from sqlrl.tasks.data import SpiderData, embedded_root
from sqlrl.tasks.goldcache import GoldCache

# allergy_1 of the demo: 14 allergies of 3 types (food, environmental, animal)
WRONG = "SELECT count(DISTINCT allergy) FROM Allergy_type"  # 14
RIGHT = "SELECT count(DISTINCT allergytype) FROM Allergy_type"  # 3, task 00002's answer
TYPO = "SELECT count(DISTINCT alergytype) FROM Allergy_type"
SPACED = WRONG.replace(" FROM", "\n   FROM")


@pytest.fixture(scope="module")
def tasks():
    return SpiderData(embedded_root()).load("train")[:6]


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(workers=1, timeout_s=2.0) as sb:
        yield sb


def sql(q: str, final: bool = False) -> str:
    return ("FINAL\n" if final else "") + f"```sql\n{q}\n```"


def checked(task, script, sandbox, **budgets):
    policy = ScriptedPolicy(script)
    [tr] = run_agent([task.public], policy, sandbox, Budgets(checker=True, **budgets))
    return tr, policy


def test_checker_message_holds_the_answers_own_result_and_never_the_gold(tasks, sandbox):
    task = tasks[2]  # "How many different allergy types exist?", gold = RIGHT
    seen = {}

    def script(text, turn):
        if turn == 0:
            return sql(WRONG)
        seen["text"] = text
        return sql(RIGHT, final=True)

    tr, policy = checked(task, script, sandbox)
    msg = tr.turns[0].observation
    assert msg.startswith("Your final query returned:\nstatus: ok (1 row)\n") and WRONG not in msg
    assert "\n14\n" in msg and "reply FINAL with the same query" in msg
    assert (
        task.gold_sql not in seen["text"] and "allergytype" not in seen["text"].split("Your final query")[1]
    )
    assert [t.action for t in tr.turns] == ["final", "check"] and len(policy.calls) == 2
    assert tr.stop_reason == "single_turn" and tr.n_executions == 1 and tr.final_sql == RIGHT
    assert tr.turns[0].sql_result["status"] == "ok" and tr.turns[1].sql_result is None
    assert tr.checker == {
        "checked": True,
        "reason": None,
        "first_sql": WRONG,
        "reply": "correct",
        "changed": True,
    }
    # token layout: prompt | reply | checker message | checker reply; loss mask 1 on the two replies only
    a, b = tr.turns
    assert tr.token_ids == tr.prompt_ids + a.completion_ids + a.observation_ids + b.completion_ids
    n0, na, no = len(tr.prompt_ids), len(a.completion_ids), len(a.observation_ids)
    assert tr.loss_mask == [0] * n0 + [1] * na + [0] * no + [1] * len(b.completion_ids)


def test_an_error_is_shown_as_the_structured_error(tasks, sandbox):
    tr, _ = checked(tasks[2], lambda t, k: sql(TYPO) if k == 0 else "FINAL", sandbox)
    assert "returned:\nstatus: runtime_error\n" in tr.turns[0].observation
    assert "no such column: alergytype" in tr.turns[0].observation
    assert tr.final_sql == TYPO and tr.checker["reply"] == "confirm" and not tr.checker["changed"]


@pytest.mark.parametrize(
    "reply,kind,final",
    [
        (sql(SPACED + ";", final=True), "confirm", SPACED),  # the same query (whitespace, ';')
        ("FINAL", "confirm", WRONG),  # FINAL without SQL keeps the answer
        ("Looks right to me.", "no_final", WRONG),  # garbled: the first answer stands
        (sql(RIGHT), "no_final", WRONG),  # SQL without FINAL is not a submission
        (sql(RIGHT, final=True), "correct", RIGHT),
    ],
)
def test_confirm_correct_and_garbled_replies(tasks, sandbox, reply, kind, final):
    tr, _ = checked(tasks[2], lambda t, k: sql(WRONG) if k == 0 else reply, sandbox)
    assert tr.checker["reply"] == kind and tr.final_sql == final
    assert tr.checker["changed"] is (kind == "correct") and len(tr.turns) == 2


def test_multi_turn_final_without_sql_checks_the_last_inspected_query(tasks, sandbox):
    script = {0: sql(WRONG), 1: "FINAL", 2: sql(RIGHT, final=True)}
    tr, policy = checked(tasks[2], lambda t, k: script[k], sandbox, turns=3, max_sql_executions=3)
    assert [t.action for t in tr.turns] == ["inspect", "final", "check"] and tr.n_executions == 2
    assert tr.turns[1].sql_result["status"] == "ok" and "\n14\n" in tr.turns[1].observation
    assert tr.stop_reason == "final" and tr.final_sql == RIGHT and tr.checker["first_sql"] == WRONG


def test_the_checker_turn_comes_after_the_last_turn(tasks, sandbox):
    """max_turns: the last turn's SQL is the answer; the checker reply is turn 3 of a 2-turn budget."""
    script = {0: sql(TYPO), 1: sql(WRONG), 2: sql(RIGHT, final=True)}
    tr, _ = checked(tasks[2], lambda t, k: script[k], sandbox, turns=2, max_sql_executions=3)
    assert [t.action for t in tr.turns] == ["inspect", "inspect", "check"]
    assert (
        tr.checker["first_sql"] == WRONG
        and tr.stop_reason == "max_turns"
        and tr.final_sql == RIGHT
        and tr.n_executions == 2
    )


def test_spent_execution_budget_means_no_checker_turn(tasks, sandbox):
    script = {0: sql(WRONG), 1: sql(WRONG, final=True)}
    tr, policy = checked(tasks[2], lambda t, k: script[k], sandbox, turns=3, max_sql_executions=1)
    assert [t.action for t in tr.turns] == ["inspect", "final"] and len(policy.calls) == 2
    assert tr.n_executions == 1 and tr.final_sql == WRONG and tr.turns[-1].observation is None
    assert tr.checker == {
        "checked": False,
        "reason": "sql_budget",
        "first_sql": WRONG,
        "reply": None,
        "changed": False,
    }


@pytest.mark.parametrize("first,reason", [("no idea", "no_sql")])
def test_no_answer_no_check(tasks, sandbox, first, reason):
    tr, policy = checked(tasks[2], lambda t, k: first, sandbox)
    assert tr.checker["reason"] == reason and len(policy.calls) == 1 and tr.n_executions == 0


def test_context_budget_without_room_for_the_reply(tasks, sandbox):
    """The answer is executed and the message appended, but with no room for max_new_tokens more the
    episode ends with the first answer."""
    probe, _ = checked(tasks[2], lambda t, k: sql(WRONG) if k == 0 else "FINAL", sandbox)
    after_msg = (
        len(probe.prompt_ids) + len(probe.turns[0].completion_ids) + len(probe.turns[0].observation_ids)
    )
    tight = after_msg + 64 - 1  # one token short of a 64-token reply after the checker message
    tr, policy = checked(
        tasks[2], lambda t, k: sql(WRONG), sandbox, max_new_tokens=64, max_context_tokens=tight
    )
    assert len(tr.token_ids) == after_msg and len(policy.calls) == 1 and tr.n_executions == 1
    assert tr.checker["reason"] == "context_budget" and tr.final_sql == WRONG and len(tr.turns) == 1
    roomy, policy = checked(
        tasks[2], lambda t, k: sql(WRONG), sandbox, max_new_tokens=64, max_context_tokens=tight + 1
    )
    assert roomy.checker["checked"] and len(policy.calls) == 2


def test_checker_off_is_the_old_episode(tasks, sandbox):
    policy = ScriptedPolicy(lambda t, k: sql(WRONG))
    [tr] = run_agent([tasks[2].public], policy, sandbox, Budgets())
    assert tr.checker is None and len(tr.turns) == 1 and tr.n_executions == 0
    assert "checker" not in Budgets().to_dict() and Budgets(checker=True).to_dict()["checker"] is True


def test_summary_counts_how_the_checker_changed_answers(tasks, sandbox, tmp_path):
    """Six tasks, replies scripted per question; the counts below are derived by hand from the golds:
    00000/00001 count allergies (14), 00002/00003 count types (3), 00004/00005 list the 3 types."""
    types = "SELECT DISTINCT allergytype FROM Allergy_type"
    plan = {
        "How many allergies are there?": (WRONG, sql(RIGHT, final=True)),  # right -> wrong
        "How many allergy entries are there?": (RIGHT, sql(WRONG, final=True)),  # wrong -> right
        "How many different allergy types exist?": (RIGHT, "FINAL"),  # confirmed, right
        "How many distinct allergies are there?": (WRONG, "hmm"),  # no FINAL: first (wrong) stands
        "Show all allergy types.": (TYPO, sql(WRONG, final=True)),  # changed, wrong -> wrong
        "What are the different allergy types?": (
            types,
            sql(types + " ORDER BY 1", final=True),
        ),  # right -> right
    }

    def script(text, turn):
        first, check = next(v for q, v in plan.items() if f"Question: {q}" in text)
        return sql(first) if turn == 0 else check

    out = evaluate_tasks(
        tasks,
        ScriptedPolicy(script),
        sandbox,
        GoldCache(tmp_path / "gc"),
        Budgets(checker=True),
        progress=False,
    )
    c = out.summary["checker"]
    assert c == {
        "n": 6,
        "checked": 6,
        "not_checked": {},
        "replies": {"confirm": 1, "correct": 4, "no_final": 1},
        "changed": 4,
        "changed_to_right": 1,
        "changed_to_wrong": 1,
        "changed_both_right": 1,
        "changed_both_wrong": 1,
        "changed_unscored": 0,
        "n_first": 6,
        "execution_match_first": 3 / 6,  # firsts right: 00000, 00002, 00005
    }
    assert out.summary["execution_match"] == pytest.approx(3 / 6)  # finals right: 00001, 00002, 00005
    by = {r["task_id"]: r for r in out.results}
    assert by["train_spider/00000"]["checker"]["first_correct"] is True
    assert by["train_spider/00000"]["correct"] is False
    assert out.summary["turn_use"]["turns_used"] == {"1": 6}  # the checker turn is not a turn of the budget
    assert out.summary["mean_turns"] == 2.0


def test_checker_config_validation():
    cfg = C.from_dict({"agent": {"checker": True}})
    assert cfg.agent.checker is True and C.from_dict({}).agent.checker is False
    with pytest.raises(C.ConfigError, match="agent.checker executes the answer once.*data.kind = 'text2sql'"):
        C.from_dict({"agent": {"checker": True}, "data": {"kind": "debug"}})
    with pytest.raises(C.ConfigError, match=r"max_sql_executions >= 1 \(got 0\)"):
        C.from_dict({"agent": {"checker": True, "max_sql_executions": 0}})
    with pytest.raises(C.ConfigError, match="agent.checker must be true or false"):
        C.from_dict({"agent": {"checker": "yes"}})
    assert "checker" in C.field_docs(C.AgentConfig)


def test_an_environment_without_a_checker_refuses_it():
    from sqlrl.agent.debugging import DebugEnv
    from sqlrl.agent.loop import Sampling, run_episodes

    env = DebugEnv.__new__(DebugEnv)  # no pool needed: refused before anything runs
    with pytest.raises(ValueError, match="DebugEnv has no checker turn; set agent.checker = false"):
        run_episodes(env, [], ScriptedPolicy(lambda t, k: ""), Budgets(checker=True), Sampling())


def test_leakage_audit_passes_through_the_checker_turn(tasks, sandbox, tmp_path):
    """Real and mutated golds give identical checker messages and replies: the message holds only the
    prediction's own result. It never repeats the SQL: the first answer here equals task 00000's gold,
    which the static check (no gold string in any prompt or observation) would then find."""
    from sqlrl.evidence.leakage import leakage_audit

    def script(text, turn):
        return sql(WRONG) if turn == 0 else sql(RIGHT, final=True)

    res = leakage_audit(
        tasks[:4], ScriptedPolicy(script), sandbox, Budgets(checker=True), work_dir=tmp_path / "l"
    )
    assert res["passed"] and res["golds_mutated"] == 4 and res["budgets"]["checker"] is True
    assert res["static_check"]["passed"] and res["first_difference"] is None


def test_turn_use_describes_the_turns_before_the_checker_turn(tasks, sandbox, tmp_path):
    """turn_use leaves the checker turn out: its turns, mean turns and `revised` (the answer the turns
    produced vs the first query) are those before the checker reply, in summary.json and in the report
    (trajectories.jsonl rows). By hand, 2-turn budget, tasks 00002 (gold RIGHT) and 00003 (gold RIGHT):
    00002 inspects WRONG, answers RIGHT (revised, right), the checker reply confirms it;
    00003 answers WRONG at once (not revised), the checker turns it to RIGHT (not a revision by turns)."""
    import json

    from sqlrl.evidence.analysis import turn_use as report_turn_use

    plan = {
        "How many different allergy types exist?": (sql(WRONG), sql(RIGHT, final=True), "FINAL"),
        "How many distinct allergies are there?": (sql(WRONG, final=True), sql(RIGHT, final=True)),
    }

    def script(text, turn):
        return next(v for q, v in plan.items() if f"Question: {q}" in text)[turn]

    out = evaluate_tasks(
        tasks[2:4],
        ScriptedPolicy(script),
        sandbox,
        GoldCache(tmp_path / "gc"),
        Budgets(checker=True, turns=2, max_sql_executions=3),
        progress=False,
    )
    by = {r["task_id"]: r for r in out.results}
    assert by["train_spider/00002"]["correct"] is True and by["train_spider/00003"]["correct"] is True
    assert by["train_spider/00002"]["turns"] == 3  # results.jsonl counts every reply, the checker's too
    u = out.summary["turn_use"]
    assert u["turns_used"] == {"1": 1, "2": 1} and u["mean_turns"] == 1.5
    assert (u["with_sql"], u["revised"], u["revised_correct"], u["repeated"]) == (2, 1, 1, 0)
    rows = [json.loads(json.dumps(tr.to_dict())) for tr in out.trajectories]
    assert report_turn_use(out.results, rows) == u
