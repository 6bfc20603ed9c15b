"""Multi-turn SFT traces from text-to-SQL golds (`training/sft_traces.py`), on CPU.

The embedded Spider demo slice (real SQLite databases), the byte-level test tokenizer, a real
`Sandbox` behind a real `Text2SQLEnv`; the tiny random Qwen2 of test_trainer.py for the run, and
SmolLM2-135M for the slow smoke run.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import sys
from pathlib import Path

import pytest

from sqlrl import config as C
from sqlrl import config_tables as T
from sqlrl.agent.envs import make_env
from sqlrl.agent.loop import Budgets
from sqlrl.agent.prompts import ChatFormat, Parser, build_messages, observation_message
from sqlrl.generation.scripted import make_chat_tokenizer
from sqlrl.sql.sandbox import Sandbox
from sqlrl.tasks.data import PrivateTask, SpiderData, embedded_root
from sqlrl.training.sft_traces import build_text2sql_traces, kind_counts

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiment"))
from test_experiment import tiny_model_dir  # noqa: E402, F401  (a module-scoped fixture)
from test_trainer import tiny_factory  # noqa: E402

RUN = Budgets(turns=1, max_new_tokens=256, max_context_tokens=30000, max_schema_chars=300)


@pytest.fixture(scope="module")
def train_tasks():
    return SpiderData(embedded_root()).load("train")[:12]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    gold = tmp_path_factory.mktemp("gold")
    with make_env(workers=1, gold_dir=gold, reward="execution", test_suite=False) as e:
        yield e


def traces(tasks, env, seed=0, budgets=RUN, **table):
    sft = T.sft_from_dict({"trace_turns": 3, **table})
    return build_text2sql_traces(tasks, make_chat_tokenizer(), budgets, sft, env, seed)


def segments(e):
    """The trace's target split into runs of trained (mask 1) and untrained (mask 0) tokens."""
    out, cur, flag = [], [], None
    for tid, m in zip(e["target_ids"], e["target_mask"]):
        if flag is not None and m != flag:
            out.append((flag, cur))
            cur = []
        cur.append(tid)
        flag = m
    out.append((flag, cur))
    return out


def test_every_trace_parses_with_the_agent_parser_and_ends_final_with_the_gold(train_tasks, env):
    tok = make_chat_tokenizer()
    examples, dropped, mix = traces(train_tasks, env)
    assert len(examples) == 12 and dropped == {}
    gold = {t.task_id: t.gold_sql.strip() for t in train_tasks}
    pub = {t.task_id: t.public for t in train_tasks}
    want_prompt = ChatFormat(tok).prompt_ids(
        build_messages(pub["train_spider/00000"], turns=3, max_schema_chars=300)
    )
    assert "You have 3 turns" in tok.decode(want_prompt)
    for e in examples:
        # exactly the agent's multi-turn prompt for 3 turns
        assert e["prompt_ids"] == ChatFormat(tok).prompt_ids(
            build_messages(pub[e["task_id"]], turns=3, max_schema_chars=300)
        )
        replies = [tok.decode(ids, skip_special_tokens=True) for m, ids in segments(e) if m == 1]
        acts = [Parser.parse(r, multi_turn=True) for r in replies]
        want = ["final"] if e["format"] == "final" else ["inspect", "final"]
        assert [a.kind for a in acts] == want, (e["format"], replies)
        assert acts[-1].sql == gold[e["task_id"]]
        for m, ids in segments(e):  # each reply ends with the end-of-turn token, as a stopping model's does
            if m == 1:
                assert ids[-1] == tok.eos_token_id
    assert sum(mix["built"].values()) == 12


def test_observations_are_what_the_sandbox_returns_on_the_real_database(train_tasks, env):
    tok = make_chat_tokenizer()
    examples, _, _ = traces(train_tasks, env, trace_kinds=["check", "fix_error"], trace_weights=[1.0, 1.0])
    by_kind = {}
    for e in examples:
        by_kind.setdefault(e["format"], e)
    task = {t.task_id: t for t in train_tasks}
    with Sandbox(workers=1, timeout_s=5.0) as sb:  # a second, independent sandbox
        for kind, e in by_kind.items():
            t = task[e["task_id"]]
            first = Parser.parse(tok.decode(segments(e)[0][1], skip_special_tokens=True), multi_turn=True).sql
            res = sb.execute(t.db_path, first)
            obs = tok.decode(segments(e)[1][1], skip_special_tokens=True)
            assert (
                observation_message(
                    res.render(max_rows=RUN.observation_rows, max_chars=RUN.observation_chars), 1, 3
                )
                in obs
            )
            if kind == "check":  # the gold itself: its rows, as sqlite3 computes them
                assert first == t.gold_sql.strip()
                rows = sqlite3.connect(t.db_path).execute(t.gold_sql).fetchall()
                assert e["observation_status"] == "ok" and all(str(r[0]) in obs for r in rows)
            else:  # a misspelled column: the database's own error
                assert e["observation_status"] == "runtime_error" and "no such column" in obs


def test_repair_traces_start_from_a_mutation_whose_result_differs(train_tasks, env):
    tok = make_chat_tokenizer()
    examples, _, mix = traces(train_tasks, env, trace_kinds=["repair", "check"], trace_weights=[1.0, 0.0])
    assert mix["requested"] == {"repair": 12, "check": 0}
    task = {t.task_id: t for t in train_tasks}
    repairs = [e for e in examples if e["format"] == "repair"]
    assert repairs and len(repairs) + sum(mix["moved"].values()) >= 12
    for e in repairs:
        first = Parser.parse(tok.decode(segments(e)[0][1], skip_special_tokens=True), multi_turn=True).sql
        t = task[e["task_id"]]
        got = env.evaluator.score(first, t)
        assert got.status in ("mismatch", "exec_error")  # not the gold's result
        con = sqlite3.connect(t.db_path)
        try:
            assert sorted(map(repr, con.execute(first).fetchall())) != sorted(
                map(repr, con.execute(t.gold_sql).fetchall())
            )
        except sqlite3.Error:
            pass  # a mutation that errors is a valid repair trace too


def test_the_mix_ratio_is_honoured_and_what_a_kind_cannot_use_moves_on(train_tasks, env):
    assert kind_counts(10, ("a", "b", "c"), (1.0, 1.0, 2.0)) == {"a": 3, "b": 2, "c": 5}
    assert kind_counts(7, ("a", "b"), (0.0, 1.0)) == {"a": 0, "b": 7}
    examples, _, mix = traces(
        train_tasks, env, trace_kinds=["final", "check", "peek"], trace_weights=[1.0, 1.0, 2.0]
    )
    assert mix["requested"] == {"final": 3, "check": 3, "peek": 6} == mix["built"]
    assert [e["format"] for e in examples].count("peek") == 6
    # golds no mutation applies to (no SELECT structure to change) go to `check`
    pub = train_tasks[0].public
    odd = [
        PrivateTask(public=dataclasses.replace(pub, task_id=f"x/{i}"), gold_sql="SELECT 1") for i in range(4)
    ]
    examples, dropped, mix = traces(odd, env, trace_kinds=["repair", "check"], trace_weights=[1.0, 1.0])
    assert mix["requested"] == {"repair": 2, "check": 2} and mix["built"] == {"repair": 0, "check": 4}
    assert mix["moved"] == {"repair:no_mutation": 4} and dropped == {}
    # the same seed gives the same traces
    a, _, _ = traces(train_tasks, env, seed=3)
    b, _, _ = traces(train_tasks, env, seed=3)
    assert a == b


def test_traces_that_do_not_fit_the_budgets_are_dropped_and_counted(train_tasks, env):
    small = dataclasses.replace(RUN, max_new_tokens=40)  # FINAL + the gold in a block is > 40 bytes
    examples, dropped, _ = traces(
        train_tasks[:2], env, budgets=small, trace_kinds=["check"], trace_weights=[1.0]
    )
    assert examples == [] and dropped == {"answer_over_max_new_tokens": 2}
    # turn 1 fits (prompt + max_new_tokens), turn 2 (after the reply and the observation) does not
    chat = ChatFormat(make_chat_tokenizer())
    longest = max(
        len(chat.prompt_ids(build_messages(t.public, turns=3, max_schema_chars=300))) for t in train_tasks[:2]
    )
    tight = dataclasses.replace(RUN, max_context_tokens=longest + RUN.max_new_tokens + 10)
    examples, dropped, _ = traces(
        train_tasks[:2], env, budgets=tight, trace_kinds=["check"], trace_weights=[1.0]
    )
    assert examples == [] and dropped == {"over_max_context_tokens": 2}


def test_observation_tokens_carry_no_loss(train_tasks, env):
    from sqlrl.training.sft import collate, trained_tokens

    examples, _, _ = traces(train_tasks[:2], env, trace_kinds=["check"], trace_weights=[1.0])
    e = examples[0]
    masked = [m for m in e["target_mask"]]
    assert 0 in masked and trained_tokens(e) == sum(masked) < len(e["target_ids"])
    ids, attn, labels = collate([e], 0, "cpu")
    p = len(e["prompt_ids"])
    row = labels[0].tolist()
    assert all(x == -100 for x in row[:p])
    assert [x != -100 for x in row[p : p + len(masked)]] == [bool(m) for m in masked]


def test_trace_settings_are_checked(tmp_path):
    bad = [
        ({"trace_turns": 1}, "trace_turns = 1"),
        ({"trace_kinds": ["final", "guess"], "trace_weights": [1.0, 1.0]}, r"unknown kinds \['guess'\]"),
        ({"trace_kinds": ["final", "check"], "trace_weights": [1.0]}, "1 entries for 2 trace_kinds"),
        ({"trace_kinds": ["check"], "trace_weights": [-1.0]}, "must be >= 0 with a positive sum"),
        ({"trace_kinds": ["check", "check"], "trace_weights": [1.0, 1.0]}, "list each kind once"),
        (
            {"trace_turns": 3, "trace_kinds": ["final"], "trace_weights": [1.0]},
            "no trace would use a second turn",
        ),
        ({"trace_turns": 3, "submit_turns": 3}, "exclude each other"),
        (  # the mix shapes only multi-turn traces: with trace_turns = 0 it would be silently ignored
            {"trace_kinds": ["check", "repair"], "trace_weights": [1.0, 1.0]},
            r"sft.trace_kinds = \['check', 'repair'\] and sft.trace_weights = \[1.0, 1.0\] with "
            "sft.trace_turns = 0: .* set sft.trace_turns to the agent's turn budget",
        ),
        (
            {"trace_weights": [1.0, 1.0, 1.0, 1.0, 1.0]},
            r"^<dict>: sft.trace_weights = \[1.0, 1.0, 1.0, 1.0, 1.0\] with",
        ),
    ]
    for table, msg in bad:
        with pytest.raises(C.ConfigError, match=msg):
            T.sft_from_dict(table)
    # the defaults, written out as a resolved config holds them, are not a mix set by hand
    resolved = dataclasses.asdict(T.sft_from_dict({}))
    assert T.sft_from_dict(resolved).trace_kinds == T.SFTConfig().trace_kinds
    assert (
        T.sft_from_dict({"trace_turns": 3, "trace_kinds": ["check"], "trace_weights": [1.0]}).trace_turns == 3
    )
    from sqlrl.training.sft import train_sft

    refuse = lambda: pytest.fail("model loaded")  # noqa: E731
    with pytest.raises(C.ConfigError, match="agent.turns = 2 but sft.trace_turns = 3"):
        train_sft(
            _cfg().replace(agent={"turns": 2}),
            T.sft_from_dict({"trace_turns": 3}),
            tmp_path / "a",
            policy_factory=refuse,
            progress=False,
        )
    with pytest.raises(C.ConfigError, match="max_sql_executions >= 1"):
        cfg = _cfg().replace(agent={"max_sql_executions": 0})
        train_sft(
            cfg, T.sft_from_dict({"trace_turns": 3}), tmp_path / "b", policy_factory=refuse, progress=False
        )


def _cfg(**data):
    return C.from_dict(
        {
            "model": {"name": "tiny"},
            "data": {"kind": "text2sql", "path": "embedded", "max_train_tasks": 6, **data},
            "agent": {"max_new_tokens": 256, "max_schema_chars": 300, "max_context_tokens": 4096},
            "run": {"device": "cpu", "checkpoint_every": 1, "loggers": [], "sandbox_workers": 1},
        }
    )


def test_sft_on_traces_records_the_mix_and_trains(tmp_path):
    from sqlrl.training.sft import resolved, train_sft

    sft = T.sft_from_dict(
        {
            "steps": 2,
            "batch_size": 2,
            "micro_batch": 1,
            "lr": 1e-3,
            "trace_turns": 3,
            "trace_kinds": ["check", "fix_error"],
            "trace_weights": [1.0, 1.0],
        }
    )
    res = train_sft(_cfg(), sft, tmp_path / "sft", policy_factory=tiny_factory, progress=False)
    assert res["finished"] and res["weights_changed"]
    run = json.loads((tmp_path / "sft" / "run.json").read_text())
    assert run["examples"] == 6 and run["examples_per_format"] == {"fix_error": 3, "check": 3}
    assert run["trace_mix"]["requested"] == {"check": 3, "fix_error": 3} == run["trace_mix"]["built"]
    assert json.loads((tmp_path / "sft" / "config.json").read_text())["sft"]["trace_turns"] == 3
    # single-turn runs keep their config.json (and hash) as before the trace settings existed
    assert "trace_kinds" not in resolved(_cfg(), T.sft_from_dict({}))["sft"]


@pytest.mark.slow
def test_sft_on_traces_with_smollm2_lowers_the_reply_loss(tmp_path):
    """SmolLM2-135M-Instruct (fetched on first use), 2 training golds of the embedded slice as 3-turn
    traces (check and fix_error), 4 steps of LoRA (rank 16), merged at export: the reply loss falls."""
    import torch

    from sqlrl.generation.models import load_model
    from sqlrl.training.sft import answer_loss_sum, collate, train_sft

    cfg = _cfg(max_train_tasks=2).replace(model={"name": "smollm2-135m-instruct", "lora_rank": 16})
    sft = T.sft_from_dict(
        {
            "steps": 4,
            "batch_size": 2,
            "micro_batch": 2,
            "lr": 2e-3,
            "trace_turns": 3,
            "trace_kinds": ["check", "fix_error"],
            "trace_weights": [1.0, 1.0],
        }
    )
    res = train_sft(cfg, sft, tmp_path / "sft", progress=False)
    assert res["finished"] and res["weights_changed"]
    ids = json.loads((tmp_path / "sft" / "split.json").read_text())["task_ids"]
    tasks = [t for t in SpiderData(embedded_root()).load("train") if t.task_id in ids]

    def loss(name: str) -> float:
        m = load_model(name, device="cpu", dtype="float32")
        with make_env(workers=1, gold_dir=tmp_path / "g", reward="execution", test_suite=False) as e:
            examples, _, _ = build_text2sql_traces(
                tasks, m.tokenizer, Budgets.from_config(cfg.agent), sft, e, 0
            )
        assert len(examples) == 2
        with torch.no_grad():
            total, n, _ = answer_loss_sum(m.model, *collate(examples, m.tokenizer.eos_token_id, "cpu"))
        return float(total) / n

    before, after = loss("smollm2-135m-instruct"), loss(res["final"])
    assert after < 0.5 * before, (before, after)


def test_the_matrix_runs_trace_sft_only_at_the_turns_it_teaches(tmp_path):
    from sqlrl.experiment.matrix import load_experiment

    p = tmp_path / "e.toml"
    p.write_text(
        "[experiment]\narms = ['base', 'sft']\nturns = [1, 3]\n[agent]\nturns = 3\n[sft]\ntrace_turns = 3\n"
    )
    with pytest.raises(C.ConfigError, match=r"experiment.turns = \[1, 3\]; set experiment.turns = \[3\]"):
        load_experiment(p)
    assert load_experiment(p, ["experiment.turns=[3]"])[1].sft.trace_turns == 3
    # without an SFT arm the traces are not built, whatever the turns
    assert load_experiment(p, ["experiment.arms=['base','grpo']"])[1].turns == (1, 3)


def test_the_multi_turn_warm_start_config_validates():
    from sqlrl.experiment.matrix import load_experiment

    root = Path(__file__).resolve().parents[2]
    cfg, exp = load_experiment(root / "configs" / "spider-0.5b-gpu-mt-warm.toml")
    assert exp.turns == (3,) and cfg.agent.turns == 3 and exp.sft.trace_turns == 3
    assert exp.arms == ("base", "grpo", "no_update", "validity", "sft", "grpo_sft")
    assert exp.sft.init_steps == 240 and exp.sft.steps >= exp.sft.init_steps
    assert "NOT YET RUN" in (root / "configs" / "spider-0.5b-gpu-mt-warm.toml").read_text().splitlines()[0]


@pytest.mark.slow
def test_a_3_turn_matrix_runs_grpo_from_a_trace_warm_start(tiny_model_dir, tmp_path):  # noqa: F811
    """The tiny random Qwen2 of the experiment tests: sft (control) and grpo_sft (own trace SFT stage,
    then GRPO) at 3 turns; both SFT runs train on traces and every evaluation reports its turn use."""
    from sqlrl.experiment.matrix import ExperimentConfig, run_experiment

    cfg = C.from_dict(
        {
            "model": {"name": tiny_model_dir},
            "data": {"path": "embedded", "max_train_tasks": 6, "max_eval_tasks": 3},
            "agent": {"turns": 3, "max_new_tokens": 160, "max_schema_chars": 300, "max_context_tokens": 4096},
            "grpo": {"steps": 1, "prompts_per_step": 2, "group_size": 2, "micro_batch": 4},
            "run": {"device": "cpu", "loggers": [], "sandbox_workers": 1, "checkpoint_every": 1},
        }
    )
    sft = T.sft_from_dict(
        {"steps": 2, "init_steps": 1, "batch_size": 2, "micro_batch": 2, "lr": 1e-3, "trace_turns": 3}
    )
    exp = ExperimentConfig(
        name="tiny-mt", arms=("base", "sft", "grpo_sft"), turns=(3,), leakage_tasks=1, smoke=True, sft=sft
    )
    out = tmp_path / "exp"
    run_experiment(cfg, exp, out, report=True)
    for folder in ("arms/sft_t3/train", "arms/grpo_sft_t3/sft_init"):
        run = json.loads((out / folder / "run.json").read_text())
        assert (
            run["status"] == "finished"
            and run["examples"] == 6
            and sum(run["trace_mix"]["built"].values()) == 6
        )
    for arm in ("base_t3", "sft_t3", "grpo_sft_t3"):
        u = json.loads((out / f"arms/{arm}/eval/summary.json").read_text())["turn_use"]
        assert u["n"] == 3 and sum(u["turns_used"].values()) == 3
