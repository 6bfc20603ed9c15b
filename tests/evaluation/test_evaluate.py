"""`sqlrl eval` pieces and the gold-mutation leakage audit, with a scripted policy on real SQLite."""

from __future__ import annotations

import pytest

from sqlrl.agent.loop import Budgets
from sqlrl.evaluation.runner import evaluate_tasks
from sqlrl.evidence.leakage import compare_runs, leakage_audit, mutate_golds, static_check
from sqlrl.generation.scripted import ScriptedPolicy
from sqlrl.sql.sandbox import Sandbox
from sqlrl.tasks.data import PrivateTask, select_tasks
from sqlrl.tasks.goldcache import GoldCache

ANSWERS = {
    "How many customers are there?": "SELECT count(*) FROM customer",
    "List customer names in London.": "SELECT name FROM customer WHERE city = 'Paris'",  # wrong
    "What is the total order amount?": "SELECT sum(amont) FROM orders",  # error
}


def answer(text, turn):
    for q, sql in ANSWERS.items():
        if q in text:
            return f"```sql\n{sql}\n```"
    return "?"


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(workers=1, timeout_s=2.0) as sb:
        yield sb


def test_eval_scores_after_the_trajectory_and_summarizes(shop_tasks, sandbox, tmp_path):
    unscorable = PrivateTask(
        shop_tasks[0].public.__class__(
            "shop/00099",
            "shop",
            "Which customers are from Mars?",
            shop_tasks[0].public.schema,
            "",
            shop_tasks[0].public.db_path,
        ),
        "SELECT name FROM customer WHERE city = 'Mars'",
    )
    tasks = shop_tasks + [unscorable]
    policy = ScriptedPolicy(answer)
    out = evaluate_tasks(tasks, policy, sandbox, GoldCache(tmp_path / "gc"), Budgets(), progress=False)
    by = {r["task_id"]: r for r in out.results}
    assert by["shop/00000"]["status"] == "match" and by["shop/00000"]["correct"] is True
    assert by["shop/00001"]["status"] == "mismatch" and by["shop/00001"]["correct"] is False
    assert by["shop/00002"]["status"] == "exec_error" and by["shop/00002"]["correct"] is False
    assert by["shop/00099"]["status"] == "gold_unscorable" and by["shop/00099"]["correct"] is None
    # the unscorable task never reached the policy
    assert len(out.trajectories) == 3 and all("Mars" not in tr.prompt_text for tr in out.trajectories)
    s = out.summary
    assert s["n"] == 3 and s["n_tasks"] == 4
    assert s["execution_match"] == pytest.approx(1 / 3) and s["executable_rate"] == pytest.approx(2 / 3)
    assert s["excluded"] == {"gold_empty": 1}
    assert s["status_counts"] == {"match": 1, "mismatch": 1, "exec_error": 1, "gold_unscorable": 1}
    # why the prediction did not execute: SQLite's message on its row, its kind in the summary
    assert by["shop/00002"]["error"] == "no such column: amont"
    assert all("error" not in by[t] for t in ("shop/00000", "shop/00001", "shop/00099"))
    assert s["exec_error_kinds"] == {"no such column": 1}
    assert s["per_db"]["shop"] == {"n": 3, "correct": 1, "accuracy": pytest.approx(1 / 3)}
    # every gold is easy (one aggregate or one WHERE): 3 scored, 1 right, the unscorable one excluded
    assert s["by_hardness"]["easy"] == {"n": 3, "correct": 1, "accuracy": pytest.approx(1 / 3), "excluded": 1}
    assert all(s["by_hardness"][h]["n"] == 0 for h in ("medium", "hard", "extra"))
    assert all(tr.reward is not None for tr in out.trajectories)


def test_select_tasks_is_seeded_and_order_preserving():
    items = list(range(100))
    a = select_tasks(items, 10, seed=1)
    assert a == sorted(a) and a == select_tasks(items, 10, seed=1) and a != select_tasks(items, 10, seed=2)
    assert select_tasks(items, 0, seed=1) == items


def test_leakage_audit_passes_for_an_honest_agent(shop_tasks, sandbox, tmp_path):
    for turns in (1, 3):
        res = leakage_audit(
            shop_tasks, ScriptedPolicy(answer), sandbox, Budgets(turns=turns), work_dir=tmp_path / str(turns)
        )
        assert res["passed"], res
        assert res["golds_mutated"] == 3 and res["first_difference"] is None and res["static_check"]["passed"]


def test_leakage_audit_counts_both_runs_on_a_progress_handle_without_its_own_bars(
    shop_tasks, sandbox, tmp_path, capsys
):
    """The experiment's progress line counts the audit's tasks (real then mutated golds: 2 x 3); no tqdm
    bar of its own is drawn over that line."""
    counted = []

    class Handle:
        def update(self, n=1):
            counted.append(n)

        def close(self):
            pass

    res = leakage_audit(
        shop_tasks, ScriptedPolicy(answer), sandbox, Budgets(), work_dir=tmp_path, progress=Handle()
    )
    assert res["passed"] and sum(counted) == 2 * len(shop_tasks) == 6
    assert "eval" not in capsys.readouterr().err


def test_leakage_audit_catches_a_leaky_agent(shop_tasks, sandbox, tmp_path, monkeypatch):
    """Wire the gold into the prompt (a bug we must catch): the audit fails and names task and field."""
    import sqlrl.agent.text2sql as agent_mod

    golds = {}
    real_build = agent_mod.build_messages

    def leaky_build(task, **kw):
        msgs = real_build(task, **kw)
        msgs[-1]["content"] += "\n-- hint: " + golds.get(task.task_id, "")
        return msgs

    monkeypatch.setattr(agent_mod, "build_messages", leaky_build)
    import sqlrl.evaluation.runner as ev

    real_eval = ev.evaluate_tasks

    def spying_eval(tasks, *a, **kw):
        golds.clear()
        golds.update({t.public.task_id: t.gold_sql for t in tasks})
        return real_eval(tasks, *a, **kw)

    monkeypatch.setattr(ev, "evaluate_tasks", spying_eval)
    res = leakage_audit(shop_tasks, ScriptedPolicy(answer), sandbox, Budgets(), work_dir=tmp_path)
    assert not res["passed"]
    assert (
        res["first_difference"]["task_id"] == "shop/00000"
        and res["first_difference"]["field"] == "prompt_ids"
    )
    assert not res["static_check"]["passed"]


def test_mutated_golds_differ_and_stay_valid(shop_tasks):
    m = mutate_golds(shop_tasks)
    assert all(a.gold_sql != b.gold_sql for a, b in zip(shop_tasks, m))
    assert all(a.public is b.public for a, b in zip(shop_tasks, m))


def test_compare_and_static_check_name_the_difference(shop_tasks, sandbox):
    from sqlrl.agent.text2sql import run_agent

    p = [t.public for t in shop_tasks]
    a = run_agent(p, ScriptedPolicy(answer), sandbox, Budgets())
    b = run_agent(p, ScriptedPolicy(lambda t, k: "```sql\nSELECT 1\n```"), sandbox, Budgets())
    d = compare_runs(a, b)
    assert d["task_id"] == "shop/00000" and d["field"] == "token_ids"
    assert compare_runs(a, a) is None
    assert static_check(a, ["SELECT name FROM customer WHERE city = 'London'"])["passed"]


def test_eval_against_an_openai_compatible_endpoint(tmp_path):
    """`sqlrl eval --endpoint`: a served model (fake server on 127.0.0.1) through the same agent and evaluator."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from sqlrl.cli.eval import cli_main
    from sqlrl.generation.scripted import make_chat_tokenizer

    tok = make_chat_tokenizer()
    tok_dir = tmp_path / "tok"
    tok.save_pretrained(tok_dir)
    reply = "```sql\nSELECT count(*) FROM Staff\n```"
    reply_ids = tok(reply, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    seen = []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            choices = [
                {
                    "index": i,
                    "text": reply,
                    "finish_reason": "stop",
                    "token_ids": reply_ids,
                    "logprobs": {
                        "token_logprobs": [-0.1] * len(reply_ids),
                        "tokens": [f"token_id:{t}" for t in reply_ids],
                    },
                }
                for i, _ in enumerate(body["prompt"])
            ]
            data = json.dumps({"choices": choices}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    th = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    th.start()
    try:
        out = tmp_path / "run"
        rc = cli_main(
            [
                "--endpoint",
                f"http://127.0.0.1:{srv.server_address[1]}",
                "--model",
                "served-model",
                "--tokenizer",
                str(tok_dir),
                "--split",
                "validation",
                "--limit",
                "3",
                "--out",
                str(out),
            ]
        )
    finally:
        srv.shutdown()
        srv.server_close()
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["n_tasks"] == 3 and s["model"]["name"] == "served-model"
    assert s["model"]["identity"].startswith("openai:")
    assert seen and all(isinstance(p, list) and isinstance(p[0], int) for b in seen for p in b["prompt"])
    res = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert {r["final_sql"] for r in res if r["status"] != "gold_unscorable"} == {"SELECT count(*) FROM Staff"}


class CountingPolicy(ScriptedPolicy):
    """A scripted policy (answers by question) that counts prompts and can fail on its n-th call."""

    def __init__(self, fail_on_call: int | None = None):
        super().__init__(
            lambda text, turn: "```sql\nSELECT 1\n```" if "How many" in text else "```sql\nSELECT\n```"
        )
        self.n_calls, self.prompts, self.fail_on_call = 0, 0, fail_on_call

    def generate(self, prompts, **kw):
        self.n_calls += 1
        if self.n_calls == self.fail_on_call:
            raise KeyboardInterrupt
        self.prompts += len(prompts)
        return super().generate(prompts, **kw)


def _eval(out, policy, caplog=None):
    from sqlrl.evaluation.runner import run_eval

    return run_eval(
        model="scripted",
        data="embedded",
        split="validation",
        out=out,
        budgets=Budgets(turns=1, max_new_tokens=16, max_schema_chars=300),
        limit=5,
        policy=policy,
        sandbox_workers=1,
        progress=False,
        chunk_size=2,
    )


def test_an_interrupted_eval_resumes_from_the_saved_tasks_with_the_same_predictions(tmp_path, caplog):
    import json
    import logging

    whole = tmp_path / "whole"
    _eval(whole, CountingPolicy())
    part = tmp_path / "part"
    with pytest.raises(KeyboardInterrupt):  # chunk 1 (tasks 1-2) saved, interrupted in chunk 2
        _eval(part, CountingPolicy(fail_on_call=2))
    saved = [json.loads(x) for x in (part / "trajectories.partial.jsonl").read_text().splitlines()]
    assert len(saved) == 2 and not (part / "summary.json").exists()
    again = CountingPolicy()
    with caplog.at_level(logging.INFO, logger="sqlrl"):
        out = _eval(part, again)
    assert again.prompts == 3  # tasks 3, 4 and 5 only
    assert "resuming evaluation" in caplog.text and "after 2 of 5 tasks" in caplog.text
    assert out.summary["resumed_tasks"] == 2

    def strip(path):  # records without their timings
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        for r in rows:
            r.pop("timings", None)
            r.pop("exec_ms", None)
            (r.get("reward") or {}).pop("exec_ms", None)
            for t in r.get("turns") if isinstance(r.get("turns"), list) else []:
                t.pop("gen_s")
                (t.get("sql_result") or {}).pop("elapsed_ms", None)
        return rows

    predictions = strip(part / "results.jsonl")
    assert [r["task_id"] for r in predictions] == json.loads((whole / "run.json").read_text())["task_ids"]
    assert predictions == strip(whole / "results.jsonl")

    assert strip(part / "trajectories.jsonl") == strip(whole / "trajectories.jsonl")
    assert not (part / "trajectories.partial.jsonl").exists() and not (part / "partial.json").exists()


def test_partial_predictions_of_another_model_are_not_reused(tmp_path, caplog):
    import logging

    part = tmp_path / "part"
    with pytest.raises(KeyboardInterrupt):
        _eval(part, CountingPolicy(fail_on_call=2))
    other = CountingPolicy()
    other.name = "another-model"
    with caplog.at_level(logging.WARNING, logger="sqlrl"):
        out = _eval(part, other)
    assert other.prompts == 5 and "resumed_tasks" not in out.summary
    assert "another model, task set, budgets or device; starting over" in caplog.text


def test_an_evaluation_begun_on_another_device_starts_over(tmp_path, caplog, monkeypatch):
    """Greedy answers differ between GPU models: a resumed evaluation must not mix two devices' answers."""
    import json
    import logging

    from sqlrl.evaluation import runner

    part = tmp_path / "part"
    monkeypatch.setattr(
        runner, "eval_device", lambda: {"accelerator": "NVIDIA H100", "torch": "2", "cuda": "13"}
    )
    with pytest.raises(KeyboardInterrupt):
        _eval(part, CountingPolicy(fail_on_call=2))
    assert json.loads((part / "partial.json").read_text())["device"]["accelerator"] == "NVIDIA H100"
    monkeypatch.setattr(
        runner, "eval_device", lambda: {"accelerator": "NVIDIA H200", "torch": "2", "cuda": "13"}
    )
    again = CountingPolicy()
    with caplog.at_level(logging.WARNING, logger="sqlrl"):
        out = _eval(part, again)
    assert again.prompts == 5 and "resumed_tasks" not in out.summary
    assert "budgets or device; starting over" in caplog.text


MULTI = {
    # turn 0, turn 1, turn 2 replies per question
    "How many customers are there?": ["FINAL\n```sql\nSELECT count(*) FROM customer\n```"],  # 1 turn, right
    "List customer names in London.": [  # repeats its first query, then FINAL: 3 turns, wrong
        "```sql\nSELECT name FROM customer WHERE city = 'Paris'\n```",
        "```sql\nSELECT name FROM customer  WHERE city = 'Paris';\n```",
        "FINAL",
    ],
    "What is the total order amount?": [  # an error, then a corrected FINAL: 2 turns, right
        "```sql\nSELECT sum(amont) FROM orders\n```",
        "FINAL\n```sql\nSELECT sum(amount) FROM orders\n```",
    ],
}


def multi_answer(text, turn):
    for q, replies in MULTI.items():
        if q in text:
            return replies[turn]
    return "?"


def test_eval_summary_reports_how_the_turns_were_used(shop_tasks, sandbox, tmp_path):
    budgets = Budgets(turns=3)
    out = evaluate_tasks(
        shop_tasks, ScriptedPolicy(multi_answer), sandbox, GoldCache(tmp_path / "gc"), budgets, progress=False
    )
    u = out.summary["turn_use"]
    assert u["n"] == 3 and u["turns_used"] == {"1": 1, "2": 1, "3": 1}
    # two trajectories proposed >= 2 queries; only the London one repeated its first (whitespace, ';')
    assert u["multi_query"] == 2 and u["repeat_first"] == 1 and u["repeat_first_rate"] == 0.5
    assert u["reinspect_first"] == 1  # London executed its first query twice
    # one failed execution (no such column amont), followed by FINAL with another query
    assert u["after_error"] == {
        "n": 1,
        "final": 1,
        "final_rate": 1.0,
        "final_unchanged": 0,
        "rewritten": 1,
        "rewritten_rate": 1.0,
    }
    assert u["accuracy_by_turns"] == {
        "1": {"n": 1, "correct": 1, "accuracy": 1.0},
        "2": {"n": 1, "correct": 1, "accuracy": 1.0},
        "3": {"n": 1, "correct": 0, "accuracy": 0.0},
    }


def test_report_and_evaluation_count_turn_use_the_same_way(shop_tasks, sandbox, tmp_path):
    """`sqlrl report` recomputes turn use from trajectories.jsonl; on the trajectories the evaluation
    scored it gives exactly the evaluation's summary.json block (one definition, not two)."""
    import json

    from sqlrl.evidence.analysis import turn_use as report_turn_use

    out = evaluate_tasks(
        shop_tasks,
        ScriptedPolicy(multi_answer),
        sandbox,
        GoldCache(tmp_path / "gc"),
        Budgets(turns=3),
        progress=False,
    )
    rows = [
        json.loads(json.dumps(tr.to_dict())) for tr in out.trajectories
    ]  # as trajectories.jsonl holds them
    u = report_turn_use(out.results, rows)
    assert u == out.summary["turn_use"]
    # by hand: London proposed the same query twice (whitespace and ';' differ): repeated, not revised;
    # the total amount query was rewritten after its error: revised and correct
    assert (u["n"], u["with_sql"], u["revised"], u["revised_correct"], u["repeated"]) == (3, 3, 1, 1, 1)
    assert u["stop_reasons"] == {"final": 3} and u["mean_turns"] == pytest.approx(2.0)
