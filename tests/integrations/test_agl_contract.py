"""Contract tests of the Agent Lightning 0.3.x adapter (src/sqlrl/integrations/agl.py).

A real Agent Lightning runner (``LitAgentRunner`` + ``InMemoryLightningStore``) executes one rollout of
`SqlrlLitAgent`; the LLM resource points at a fake OpenAI-compatible ``/v1/completions`` server on
127.0.0.1 that answers with token ids and log-probs, as vLLM does. Needs the Agent Lightning venv:
``scripts/agl-env.sh --test`` (or ``.venv-agl/bin/python -m pytest -q tests/integrations/test_agl_contract.py``).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sqlrl.integrations import agl as sqlrl_agl

needs_agl = pytest.mark.skipif(sqlrl_agl.AGL_ERROR is not None, reason=sqlrl_agl.AGL_ERROR or "")

GOLD = "SELECT name FROM customer WHERE city = 'London'"


def test_module_imports_without_agentlightning():
    assert callable(sqlrl_agl.task_to_agl) and issubclass(sqlrl_agl.RolloutInfraError, RuntimeError)


@pytest.fixture
def tasks(tmp_path):
    from sqlrl.tasks.data import PrivateTask, PublicTask

    db = tmp_path / "shop.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE customer (id INTEGER PRIMARY KEY, name TEXT, city TEXT)")
    con.executemany(
        "INSERT INTO customer (name, city) VALUES (?, ?)",
        [("Ann", "London"), ("Bob", "Paris"), ("Cid", "London")],
    )
    con.commit()
    con.close()
    public = PublicTask(
        task_id="shop/00000",
        db_id="shop",
        question="Names of the customers in London?",
        schema="CREATE TABLE customer (id INTEGER PRIMARY KEY, name TEXT, city TEXT)",
        evidence="",
        db_path=str(db),
    )
    return public, PrivateTask(public=public, gold_sql=GOLD)


class FakeServer:
    """OpenAI-compatible /v1/completions (any path prefix, e.g. the proxy's /rollout/R/attempt/A/v1)."""

    def __init__(self, tokenizer, script, status: int = 200):
        self.tok, self.script, self.status = tokenizer, script, status
        self.requests: list[tuple[str, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, body))
                if outer.status != 200 or not self.path.endswith("/v1/completions"):
                    code = outer.status if outer.status != 200 else 404
                    self.send_response(code)
                    self.end_headers()
                    self.wfile.write(b'{"error": "fake failure"}')
                    return
                choices = []
                for i, ids in enumerate(body["prompt"]):
                    text = outer.tok.decode(ids, skip_special_tokens=False)
                    turn = text.count("<|im_start|>assistant") - 1
                    gen = outer.tok(outer.script(turn), add_special_tokens=False)["input_ids"]
                    gen = gen + [outer.tok.eos_token_id]
                    choices.append(
                        {
                            "index": i,
                            "text": outer.tok.decode(gen, skip_special_tokens=True),
                            "token_ids": gen,
                            "logprobs": {"token_logprobs": [-0.25] * len(gen)},
                            "finish_reason": "stop",
                        }
                    )
                raw = json.dumps(
                    {"id": "cmpl-fake", "object": "text_completion", "choices": choices}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _multi_turn(turn: int) -> str:
    if turn == 0:
        return "```sql\nSELECT name FROM customer WHERE city = 'Paris'\n```"
    return f"FINAL\n```sql\n{GOLD}\n```"


def _run_one(agent, task, resources):
    import agentlightning as agl

    async def go():
        store = agl.InMemoryLightningStore()
        runner = agl.LitAgentRunner(tracer=agl.OtelTracer())
        runner.init(agent)
        runner.init_worker(0, store)
        try:
            rollout = await runner.step(task, resources=resources)
            spans = await store.query_spans(rollout.rollout_id)
            return rollout, spans
        finally:
            runner.teardown_worker(0)
            runner.teardown()

    return asyncio.run(go())


def _agent(private, **kw):
    from sqlrl.config import AgentConfig
    from sqlrl.generation.scripted import make_chat_tokenizer

    return sqlrl_agl.SqlrlLitAgent(
        make_chat_tokenizer(),
        budgets=AgentConfig(turns=3, max_new_tokens=64, max_context_tokens=4096),
        private_lookup=lambda ref: {private.public.task_id: private}[ref["task_id"]],
        **kw,
    )


@needs_agl
@pytest.mark.timeout(300)
def test_rollout_runs_sqlrl_agent_and_reports_evaluator_reward(tasks):
    import agentlightning as agl

    public, private = tasks
    agent = _agent(private)
    task = sqlrl_agl.task_to_agl(private, data_root=None, split="validation")
    assert GOLD not in json.dumps(task)  # the gold is referenced, never copied
    try:
        with FakeServer(agent.tokenizer, _multi_turn) as srv:
            llm = agl.LLM(
                endpoint=srv.url + "/v1", model="fake-model", sampling_parameters={"temperature": 0.7}
            )
            rollout, spans = _run_one(agent, task, {"main_llm": llm})
    finally:
        agent.close()

    assert rollout.status == "succeeded", rollout
    assert agl.find_final_reward(spans) == 1.0
    traj = agent.last_trajectory
    assert [t.action for t in traj.turns] == ["inspect", "final"]
    assert traj.final_sql == GOLD and traj.n_executions == 1 and traj.infra_error is None
    assert traj.reward["status"] == "match" and traj.reward["value"] == 1.0
    # token-in/token-out through the endpoint Agent Lightning handed out
    assert len(srv.requests) == 2
    (path0, body0), (path1, body1) = srv.requests
    assert path0 == path1 == "/v1/completions"
    assert body0["model"] == "fake-model" and body0["temperature"] == 0.7
    assert body0["prompt"] == [traj.prompt_ids]
    assert body1["prompt"][0] == traj.token_ids[: len(body1["prompt"][0])]
    assert sum(traj.loss_mask) == sum(len(t.completion_ids) for t in traj.turns)
    for _, body in srv.requests:  # nothing the policy saw holds the gold
        assert "London'" not in agent.tokenizer.decode(body["prompt"][0]).split("<|im_start|>assistant")[0]


@needs_agl
@pytest.mark.timeout(300)
def test_wrong_answer_scores_zero_and_proxy_url_is_per_rollout(tasks):
    import agentlightning as agl

    public, private = tasks
    agent = _agent(private)
    try:
        with FakeServer(agent.tokenizer, lambda turn: "FINAL ```sql\nSELECT name FROM customer\n```") as srv:
            llm = agl.ProxyLLM(endpoint=srv.url + "/v1", model="fake-model")
            rollout, spans = _run_one(agent, sqlrl_agl.task_to_agl(public), {"main_llm": llm})
    finally:
        agent.close()
    assert rollout.status == "succeeded"
    assert agl.find_final_reward(spans) == 0.0
    assert agent.last_trajectory.reward["status"] == "mismatch"
    path, _ = srv.requests[0]
    assert path.startswith(f"/rollout/{rollout.rollout_id}/attempt/") and path.endswith("/v1/completions")


@needs_agl
@pytest.mark.timeout(300)
def test_endpoint_failure_fails_the_attempt_not_a_wrong_answer(tasks):
    import agentlightning as agl

    public, private = tasks
    agent = _agent(private)
    try:
        with FakeServer(agent.tokenizer, _multi_turn, status=400) as srv:
            llm = agl.LLM(endpoint=srv.url, model="fake-model")
            with pytest.raises(sqlrl_agl.RolloutInfraError, match="infrastructure"):
                _run_one(agent, sqlrl_agl.task_to_agl(public), {"main_llm": llm})
    finally:
        agent.close()
    assert agent.last_trajectory.reward is None  # never scored
