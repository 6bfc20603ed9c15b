"""Contract tests of the veRL 0.8.0 integration (src/sqlrl/integrations/verl.py).

They need veRL, which pins numpy<2 and so lives in its own venv: run them with
`scripts/verl-env.sh --test` (or `.venv-verl/bin/python -m pytest tests/integrations`). In the main venv
every test but the import test is skipped with the reason below.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from sqlrl import config as sqlrl_config

try:
    import verl  # noqa: F401
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

    VERL_ERROR = None
except Exception as e:  # ImportError, or numpy-ABI errors from veRL's dependencies
    VERL_ERROR = f"veRL not importable ({type(e).__name__}: {e}); run scripts/verl-env.sh --test"

needs_verl = pytest.mark.skipif(VERL_ERROR is not None, reason=VERL_ERROR or "")


def test_module_imports_without_verl():
    import sqlrl.integrations.verl as v

    assert v.AGENT_NAME == "sqlrl_agent"
    assert callable(v.cli_main) and callable(v.build_verl_config)


# ------------------------------------------------------------------------------------------------ config


def _cfg(**sections) -> sqlrl_config.Config:
    return sqlrl_config.Config().replace(**sections) if sections else sqlrl_config.Config()


@needs_verl
def test_default_config_passes_verl_validation_and_maps_fields():
    from sqlrl.integrations.verl import build_verl_config

    cfg = _cfg(
        grpo={"prompts_per_step": 16, "group_size": 8, "clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.01},
        agent={"turns": 3, "max_new_tokens": 256, "max_context_tokens": 4096},
        run={"checkpoint_every": 5},
    )
    d = build_verl_config(cfg, n_gpus_per_node=4, nnodes=2, model_path="/models/qwen")
    ar = d["actor_rollout_ref"]
    assert d["algorithm"]["adv_estimator"] == "grpo"
    assert d["algorithm"]["norm_adv_by_std_in_grpo"] is True
    assert ar["rollout"]["n"] == 8 and d["data"]["train_batch_size"] == 16
    assert ar["actor"]["ppo_mini_batch_size"] == 16
    assert ar["actor"]["optim"]["lr"] == 1e-6
    assert (ar["actor"]["clip_ratio_low"], ar["actor"]["clip_ratio_high"]) == (0.2, 0.28)
    assert ar["actor"]["use_kl_loss"] is True and ar["actor"]["kl_loss_coef"] == 0.01
    assert ar["actor"]["kl_loss_type"] == "low_var_kl"
    assert ar["actor"]["loss_agg_mode"] == "token-mean"
    assert ar["actor"]["strategy"] == "fsdp" and ar["model"]["enable_gradient_checkpointing"] is True
    assert ar["model"]["path"] == "/models/qwen"
    assert d["data"]["max_prompt_length"] == 4096 - 256 and d["data"]["max_response_length"] == 4096
    assert ar["rollout"]["prompt_length"] == 3840 and ar["rollout"]["name"] == "vllm"
    assert (
        ar["rollout"]["multi_turn"]["enable"] is True
        and ar["rollout"]["multi_turn"]["max_assistant_turns"] == 3
    )
    assert ar["rollout"]["agent"]["default_agent_loop"] == "sqlrl_agent"
    assert d["trainer"]["save_freq"] == 5 and d["trainer"]["resume_mode"] == "auto"
    assert (d["trainer"]["n_gpus_per_node"], d["trainer"]["nnodes"]) == (4, 2)
    assert d["trainer"]["total_training_steps"] == cfg.grpo.steps
    assert d["reward"]["custom_reward_function"]["name"] == "compute_score"


@needs_verl
def test_no_update_control_maps_to_lr_zero_and_seq_mean():
    from sqlrl.integrations.verl import build_verl_config

    cfg = _cfg(grpo={"control": "no-update", "lr": 0.0, "loss_agg": "seq-mean", "adv_scale": "none"})
    d = build_verl_config(cfg, n_gpus_per_node=8)
    actor = d["actor_rollout_ref"]["actor"]
    assert actor["optim"]["lr"] == 0.0
    assert actor["loss_agg_mode"] == "seq-mean-token-mean"
    assert actor["use_kl_loss"] is False
    assert d["algorithm"]["norm_adv_by_std_in_grpo"] is False
    assert d["data"]["max_response_length"] == cfg.agent.max_new_tokens  # single-turn default


@needs_verl
def test_verl_validation_rejects_a_batch_that_does_not_divide_the_gpus():
    from sqlrl.integrations.verl import build_verl_config

    cfg = _cfg(grpo={"prompts_per_step": 3, "group_size": 2})  # 6 trajectories on 8 GPUs
    with pytest.raises(Exception, match="divisible"):
        build_verl_config(cfg, n_gpus_per_node=8)


@needs_verl
def test_unknown_verl_key_is_an_error_not_ignored(monkeypatch):
    from omegaconf.errors import ConfigKeyError

    import sqlrl.integrations.verl as v

    real = v.verl_overrides

    def with_typo(cfg, **kw):
        d = real(cfg, **kw)
        d["actor_rollout_ref"]["actor"]["clip_ratio_hihg"] = 0.3
        return d

    monkeypatch.setattr(v, "verl_overrides", with_typo)
    with pytest.raises(ConfigKeyError):
        v.build_verl_config(_cfg(), validate=False)


@needs_verl
def test_cli_writes_yaml_and_registry(tmp_path):
    import yaml

    from sqlrl.integrations.verl import cli_main

    toml = tmp_path / "run.toml"
    toml.write_text("[grpo]\nprompts_per_step = 8\ngroup_size = 4\n[agent]\nturns = 2\n")
    out = tmp_path / "verl.yaml"
    assert cli_main([str(toml), "-o", str(out), "--gpus-per-node", "2"]) == 0
    d = yaml.safe_load(out.read_text())
    assert d["actor_rollout_ref"]["rollout"]["n"] == 4 and d["trainer"]["n_gpus_per_node"] == 2
    reg = yaml.safe_load((tmp_path / "verl.agent_loops.yaml").read_text())
    assert reg[0]["name"] == "sqlrl_agent" and reg[0]["_target_"] == "sqlrl.integrations.verl.SqlrlAgentLoop"
    assert reg[0]["budgets"]["turns"] == 2
    assert d["actor_rollout_ref"]["rollout"]["agent"]["agent_loop_config_path"].endswith(
        "verl.agent_loops.yaml"
    )
    # veRL's entry point loads it the way `main_ppo --config-path DIR --config-name verl` does
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from sqlrl.integrations.verl import validate_verl_config

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
        loaded = compose(config_name="verl")
    validate_verl_config(loaded)
    assert loaded.actor_rollout_ref.actor.optim.lr == 1e-6


@needs_verl
def test_write_dataset_rows_hold_no_gold(tmp_path):
    import pandas as pd

    from sqlrl.data import SpiderData, embedded_root
    from sqlrl.integrations.verl import write_dataset

    paths = write_dataset(_cfg(), tmp_path)
    df = pd.read_parquet(paths["train"])
    golds = {t.public.task_id: t.gold_sql for t in SpiderData(embedded_root()).load("train")}
    assert len(df) == len(golds)
    for _, row in df.head(50).iterrows():
        ref = json.loads(row["reward_model"]["ground_truth"])
        assert ref["task_id"] in golds and golds[ref["task_id"]] not in json.dumps(row.to_dict(), default=str)
        assert row["agent_name"] == "sqlrl_agent"


# ------------------------------------------------------------------------------------------------ agent loop


def _script(text: str, turn: int) -> str:
    if turn == 0:
        return "Let me look.\n```sql\nSELECT nme FROM customer\n```"  # typo -> real sqlite error observation
    if turn == 1:
        return "```sql\nSELECT name FROM customer WHERE city = 'London'\n```"
    return "FINAL\n```sql\nSELECT name FROM customer WHERE city = 'London'\n```"


class FakeServerManager:
    """veRL's server manager contract: `await generate(request_id, *, prompt_ids, sampling_params)` ->
    TokenOutput. Scripted like `sqlrl.testing.ScriptedPolicy` (same replies, eos-terminated, -0.5 logprobs)."""

    def __init__(self, tokenizer, script):
        self.tok = tokenizer
        self.script = script
        self.calls: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), **sampling_params})
        await asyncio.sleep(0)
        text = self.tok.decode(prompt_ids, skip_special_tokens=False)
        turn = text.count("<|im_start|>assistant") - 1
        ids = self.tok(self.script(text, turn), add_special_tokens=False)["input_ids"]
        max_tokens = sampling_params["max_tokens"]
        ids = ids[:max_tokens] if len(ids) >= max_tokens else ids + [self.tok.eos_token_id]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed")


@pytest.fixture()
def sandbox():
    from sqlrl.sandbox import Sandbox

    with Sandbox(workers=1, timeout_s=5.0) as sb:
        yield sb


def _agent_loop(cfg, tokenizer, server, sandbox):
    """Instantiate the loop exactly as veRL's AgentLoopWorker does (hydra, from the registry entry)."""
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from sqlrl.integrations.verl import agent_loop_registry, build_verl_config

    vcfg = OmegaConf.create(build_verl_config(cfg, n_gpus_per_node=1, validate=False))
    entry = dict(agent_loop_registry(cfg)[0])
    entry.pop("name")
    return hydra.utils.instantiate(
        config=OmegaConf.create(entry),
        trainer_config=DictConfigWrap(config=vcfg),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(vcfg.data),
        tools=ToolListWrap([]),
        sandbox=sandbox,
    )


@needs_verl
@pytest.mark.parametrize("turns", [1, 4])
def test_agent_loop_matches_run_agent_token_for_token(shop_tasks, sandbox, turns):
    from sqlrl.agent import Budgets, run_agent
    from sqlrl.integrations.verl import AGENT_NAME, SqlrlAgentLoop, task_to_row
    from sqlrl.testing import ScriptedPolicy, make_chat_tokenizer

    cfg = _cfg(
        agent={"turns": turns, "max_new_tokens": 64, "max_context_tokens": 2048}, grpo={"group_size": 2}
    )
    budgets = Budgets.from_config(cfg.agent)
    task = shop_tasks[1]
    tok = make_chat_tokenizer()

    # reference: sqlrl's own loop with the scripted policy
    [ref] = run_agent([task.public], ScriptedPolicy(_script, tokenizer=tok), sandbox, budgets)

    # veRL: the registered agent loop against a fake token-level server
    server = FakeServerManager(tok, _script)
    loop_obj = _agent_loop(cfg, tok, server, sandbox)
    assert isinstance(loop_obj, SqlrlAgentLoop)
    row = task_to_row(task, data_root="/nowhere", split="train", index=0, turns=turns, max_schema_chars=8000)
    assert task.gold_sql not in json.dumps(row)  # the row carries no gold
    kwargs = {k: v for k, v in row.items() if k != "prompt"} | {"raw_prompt": row["prompt"]}
    assert kwargs["agent_name"] == AGENT_NAME
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    out = asyncio.run(loop_obj.run(params, **kwargs))

    assert isinstance(out, AgentLoopOutput)
    n = len(ref.prompt_ids)
    assert out.prompt_ids == ref.prompt_ids
    assert out.response_ids == ref.token_ids[n:]
    assert out.response_mask == ref.loss_mask[n:]
    assert out.response_logprobs == pytest.approx(ref.logprobs[n:])
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)
    assert out.extra_fields["sqlrl_final_sql"] == ref.final_sql
    assert out.extra_fields["sqlrl_stop_reason"] == ref.stop_reason
    # one server call per turn, token-in: each call's prompt is the trajectory so far
    assert len(server.calls) == len(ref.turns)
    assert all(c["max_tokens"] == 64 for c in server.calls)
    assert len({c["request_id"] for c in server.calls}) == 1  # sticky session per trajectory
    if turns == 1:
        assert out.response_mask == [1] * len(out.response_ids) and ref.stop_reason == "single_turn"
    else:
        assert ref.stop_reason == "final" and len(ref.turns) == 3 and ref.n_executions == 2
        assert 0 in out.response_mask and out.response_mask[0] == 1 and out.response_mask[-1] == 1
        first_obs = ref.turns[0].observation_ids
        start = len(ref.turns[0].completion_ids)
        assert out.response_ids[start : start + len(first_obs)] == first_obs
        assert out.response_mask[start : start + len(first_obs)] == [0] * len(first_obs)
        assert "no such column" in tok.decode(first_obs)
        assert out.num_turns == 1 + 3 + 2
        for call, turn in zip(server.calls, ref.turns):
            assert call["prompt_ids"] == ref.token_ids[: turn.context_tokens]
    # veRL's own tensor conversion accepts it
    as_dict = out.as_dict()
    assert as_dict["responses"].shape == as_dict["response_mask"].shape == as_dict["rollout_log_probs"].shape


@needs_verl
def test_agent_loop_server_failure_is_raised_not_scored(shop_tasks, sandbox):
    from sqlrl.testing import make_chat_tokenizer

    class Broken(FakeServerManager):
        async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
            raise ConnectionError("server gone")

    from sqlrl.integrations.verl import task_to_row

    tok = make_chat_tokenizer()
    cfg = _cfg(agent={"turns": 2})
    loop_obj = _agent_loop(cfg, tok, Broken(tok, _script), sandbox)
    row = task_to_row(shop_tasks[0], data_root="/x", split="train", index=0, turns=2, max_schema_chars=8000)
    with pytest.raises(RuntimeError, match="server gone"):
        asyncio.run(
            loop_obj.run({"temperature": 1.0}, extra_info=row["extra_info"], raw_prompt=row["prompt"])
        )


# ------------------------------------------------------------------------------------------------ reward


@needs_verl
def test_reward_function_scores_from_the_private_task_on_the_trainer_side(tmp_path, monkeypatch):
    from sqlrl.data import SpiderData, embedded_root
    from sqlrl.integrations.verl import compute_score, task_to_row

    monkeypatch.setenv("SQLRL_GOLD_CACHE", str(tmp_path / "gc"))
    monkeypatch.setenv("SQLRL_REWARD_WORKERS", "1")
    root = str(embedded_root())
    task = SpiderData(root).load("train")[0]
    row = task_to_row(task, data_root=root, split="train", index=0, turns=1, max_schema_chars=8000)
    assert task.gold_sql not in json.dumps(row)
    gt = row["reward_model"]["ground_truth"]
    src = row["data_source"]
    good = compute_score(src, "", gt, {"sqlrl_final_sql": task.gold_sql})
    assert good["score"] == 1.0 and good["acc"] == 1.0 and good["sqlrl_excluded"] == 0.0
    bad = compute_score(src, "", gt, {"sqlrl_final_sql": "SELECT 1 WHERE 0"})
    assert bad["score"] == 0.0
    none = compute_score(src, "no sql here", gt, {"sqlrl_final_sql": None})
    assert none["score"] == 0.0 and none["sqlrl_executable"] == 0.0
    # without the agent loop's extra field, the SQL is read from the decoded response
    fallback = compute_score(src, f"```sql\n{task.gold_sql}\n```", gt, {})
    assert fallback["score"] == 1.0
    infra = compute_score(src, "", gt, {"sqlrl_final_sql": task.gold_sql, "sqlrl_infra_error": "x"})
    assert infra["sqlrl_excluded"] == 1.0 and infra["score"] == 0.0
