"""Contract tests of the veRL 0.9.1 integration (src/sqlrl/integrations/verl/).

They need veRL, which pins transformers<5.11 and so lives in its own venv: run them with
`scripts/verl-env.sh --test` (or `.venv-verl/bin/python -m pytest tests/integrations`). In the main venv
every test but the import test is skipped with the reason below.
"""

from __future__ import annotations

import asyncio
import json
import math

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
    assert callable(v.build_verl_config)


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
    assert d["algorithm"]["adv_estimator"] == "sqlrl_grpo"
    assert (
        ar["rollout"]["agent"]["agent_loop_manager_class"] == "sqlrl.integrations.verl.SqlrlAgentLoopManager"
    )
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
def test_config_selects_the_trainer_that_takes_the_managers_batch():
    """veRL 0.9.1 runs its V1 trainer by default, which reads rollouts from a TransferQueue; the batch that
    SqlrlAgentLoopManager.generate_sequences returns is taken only by the PPO trainer of main_ppo_v0."""
    from sqlrl.integrations.verl import VERL_VERSION, build_verl_config

    assert verl.__version__ == VERL_VERSION == "0.9.1"
    d = build_verl_config(_cfg(), n_gpus_per_node=1, nnodes=1, model_path="/models/qwen")
    assert d["trainer"]["use_v1"] is False


def test_reward_function_file_loads_by_path_like_verl_does():
    """veRL imports `custom_reward_function.path` as a file: it must be the reward module, loadable alone."""
    import importlib.util
    from pathlib import Path

    from sqlrl.integrations.verl import reward, verl_overrides

    fn = verl_overrides(_cfg())["custom_reward_function"]
    assert fn == {"path": str(Path(reward.__file__).resolve()), "name": "compute_score"}
    spec = importlib.util.spec_from_file_location("custom_module", fn["path"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(getattr(module, fn["name"]))


def test_dynamic_sampling_is_refused_not_dropped():
    """A setting veRL's trainer cannot honour fails loudly instead of training something else (no veRL
    needed: the mapping is plain Python)."""
    from sqlrl.integrations.verl import verl_overrides

    with pytest.raises(ValueError, match="dynamic_sampling_rounds = 2 is not mapped to veRL"):
        verl_overrides(_cfg(grpo={"dynamic_sampling_rounds": 2}))
    assert verl_overrides(_cfg())["algorithm"]["norm_adv_by_std_in_grpo"] is True
    with pytest.raises(ValueError, match="agent.checker is not mapped to veRL"):
        verl_overrides(_cfg(agent={"checker": True}))


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
    import sqlrl.integrations.verl.config as vc

    real = vc.verl_overrides

    def with_typo(cfg, **kw):
        d = real(cfg, **kw)
        d["actor_rollout_ref"]["actor"]["clip_ratio_hihg"] = 0.3
        return d

    monkeypatch.setattr(vc, "verl_overrides", with_typo)
    with pytest.raises(ConfigKeyError):
        v.build_verl_config(_cfg(), validate=False)


@needs_verl
def test_cli_writes_yaml_and_registry(tmp_path):
    import yaml

    from sqlrl.cli.verl_config import cli_main

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
    assert loaded.algorithm.adv_estimator == "sqlrl_grpo"
    assert loaded.actor_rollout_ref.rollout.agent.agent_loop_manager_class.endswith(".SqlrlAgentLoopManager")


def _gold_verdict(db_path: str, sql: str) -> str | None:
    """Independent of sqlrl: plain sqlite3 says whether a gold can be scored (rows, no error)."""
    import sqlite3

    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        rows = con.execute(sql).fetchall()
    except sqlite3.Error:
        return "gold_error"
    finally:
        con.close()
    return None if rows else "gold_empty"


@needs_verl
def test_write_dataset_rows_hold_no_gold_and_no_unscorable_task(tmp_path, monkeypatch):
    import pandas as pd

    from sqlrl.integrations.verl import write_dataset
    from sqlrl.tasks.data import SpiderData, embedded_root

    monkeypatch.setenv("SQLRL_GOLD_CACHE", str(tmp_path / "gc"))
    paths = write_dataset(_cfg(), tmp_path / "data", quiet=True)
    df = pd.read_parquet(paths["train"])
    tasks = SpiderData(embedded_root()).load("train")
    golds = {t.public.task_id: t.gold_sql for t in tasks}
    unscorable = {t.public.task_id for t in tasks if _gold_verdict(t.public.db_path, t.gold_sql)}
    assert unscorable  # the embedded subset has golds that return nothing
    written = [json.loads(r["ground_truth"])["task_id"] for r in df["reward_model"]]
    assert set(written) == set(golds) - unscorable and len(written) == len(golds) - len(unscorable)
    for _, row in df.head(50).iterrows():
        ref = json.loads(row["reward_model"]["ground_truth"])
        assert ref["task_id"] in golds and golds[ref["task_id"]] not in json.dumps(row.to_dict(), default=str)
        assert row["agent_name"] == "sqlrl_agent"
    audit = json.loads((tmp_path / "data" / "gold_audit.json").read_text())
    assert audit["splits"]["train"]["written"] == len(written)
    assert sum(audit["splits"]["train"]["excluded"].values()) == len(unscorable)


def _spider_folder(root):
    """10 databases x 3 questions; per database: `id = 0` returns no row (gold_empty), `id = 1` one row,
    and the third gold is `SELECT nope FROM t` (gold_error) on db0..db4, `SELECT count(*) FROM t` else."""
    import sqlite3

    examples, tables = [], []
    for d in range(10):
        db = f"db{d}"
        (root / "database" / db).mkdir(parents=True)
        con = sqlite3.connect(root / "database" / db / f"{db}.sqlite")
        con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
        con.executemany("INSERT INTO t VALUES (?, ?)", [(1, "a"), (2, "b")])
        con.commit()
        con.close()
        tables.append({"db_id": db, "table_names_original": ["t"]})
        third = "SELECT nope FROM t" if d < 5 else "SELECT count(*) FROM t"
        for q, sql in enumerate(
            ["SELECT name FROM t WHERE id = 0", "SELECT name FROM t WHERE id = 1", third]
        ):
            examples.append({"db_id": db, "question": f"q{q} of {db}?", "query": sql})
    (root / "tables.json").write_text(json.dumps(tables))
    (root / "train_spider.json").write_text(json.dumps(examples))
    return root


@needs_verl
def test_write_dataset_drops_unscorable_golds_and_reports_counts(tmp_path, monkeypatch, caplog):
    import logging

    import pandas as pd

    from sqlrl.integrations.verl import write_dataset
    from sqlrl.tasks.data import SpiderData

    root = _spider_folder(tmp_path / "spider")
    monkeypatch.setenv("SQLRL_GOLD_CACHE", str(tmp_path / "gc"))
    cfg = _cfg(data={"path": str(root), "val_fraction": 0.2})
    caplog.set_level(logging.INFO, logger="sqlrl")
    paths = write_dataset(cfg, tmp_path / "out")
    printed = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
    audit = json.loads(open(paths["gold_audit"]).read())
    assert paths["gold_audit"] == str(tmp_path / "out" / "gold_audit.json")
    total = {"written": 0, "gold_empty": 0, "gold_error": 0}
    for name in ("train", "validation"):
        dbs = sorted({t.db_id for t in SpiderData(root).load(name, seed=0, val_fraction=0.2)})
        # by hand: every database loses its `id = 0` gold; db0..db4 also lose `SELECT nope`
        n_err = sum(1 for db in dbs if int(db[2:]) < 5)
        expected = {"gold_empty": len(dbs), "gold_error": n_err} if n_err else {"gold_empty": len(dbs)}
        rep = audit["splits"][name]
        assert rep["tasks"] == 3 * len(dbs)
        assert rep["excluded"] == expected
        assert rep["written"] == 3 * len(dbs) - len(dbs) - n_err
        df = pd.read_parquet(paths[name])
        assert len(df) == rep["written"]
        questions = {r["sqlrl_task"]["question"] for r in df["extra_info"]}
        assert not any(q.startswith("q0 ") for q in questions)  # `id = 0`: no rows
        assert not any(q.startswith("q2 ") and int(q.split("db")[1][0]) < 5 for q in questions)
        assert f"veRL data {name} ({name}): {3 * len(dbs)} tasks, {rep['written']} written" in printed
        total["written"] += rep["written"]
        total["gold_empty"] += rep["excluded"].get("gold_empty", 0)
        total["gold_error"] += rep["excluded"].get("gold_error", 0)
    assert total == {"written": 15, "gold_empty": 10, "gold_error": 5}  # 30 tasks: 10 empty, 5 errors


@needs_verl
def test_write_dataset_honours_max_train_and_eval_tasks_like_the_native_trainer(tmp_path, monkeypatch):
    import pandas as pd

    from sqlrl.integrations.verl import write_dataset
    from sqlrl.tasks.data import SpiderData, select_tasks

    root = _spider_folder(tmp_path / "spider")
    monkeypatch.setenv("SQLRL_GOLD_CACHE", str(tmp_path / "gc"))
    cfg = _cfg(data={"path": str(root), "val_fraction": 0.2, "max_train_tasks": 4, "max_eval_tasks": 1})
    paths = write_dataset(cfg, tmp_path / "out", quiet=True)
    audit = json.loads(open(paths["gold_audit"]).read())
    for name, limit in (("train", 4), ("validation", 1)):
        tasks = SpiderData(root).load(name, seed=0, val_fraction=0.2)
        bad = set(audit["splits"][name]["excluded_task_ids"])
        want = [
            t.public.task_id
            for t in select_tasks([t for t in tasks if t.public.task_id not in bad], limit, 0)
        ]
        df = pd.read_parquet(paths[name])
        got = [json.loads(r["ground_truth"])["task_id"] for r in df["reward_model"]]
        assert got == want and len(got) == limit
        assert audit["splits"][name]["written"] == limit and audit["splits"][name]["limit"] == limit
        assert audit["splits"][name]["scorable"] == len(tasks) - len(bad) > limit


@needs_verl
def test_cli_write_data_refuses_a_split_without_scorable_gold(tmp_path, monkeypatch, capsys):
    from sqlrl.cli.verl_config import cli_main

    root = _spider_folder(tmp_path / "spider")
    spider = json.loads((root / "train_spider.json").read_text())
    for ex in spider:
        ex["query"] = "SELECT name FROM t WHERE id = 0"
    (root / "train_spider.json").write_text(json.dumps(spider))
    monkeypatch.setenv("SQLRL_GOLD_CACHE", str(tmp_path / "gc"))
    toml = tmp_path / "run.toml"
    toml.write_text(f'[data]\npath = "{root}"\n[grpo]\nprompts_per_step = 8\ngroup_size = 4\n')
    rc = cli_main([str(toml), "-o", str(tmp_path / "verl.yaml"), "--write-data", str(tmp_path / "d")])
    assert rc == 2 and "no task of split 'train' has a scorable gold" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------ advantages


def _grpo_batch(rows):
    """rows: (uid, score, n_mask_tokens); the score sits on the last masked token, as veRL puts it."""
    import numpy as np
    import torch

    length = 5
    rewards = torch.zeros(len(rows), length)
    mask = torch.zeros(len(rows), length, dtype=torch.int64)
    for i, (_, score, n) in enumerate(rows):
        mask[i, :n] = 1
        rewards[i, max(n, 1) - 1] = score
    return rewards, mask, np.array([u for u, _, _ in rows], dtype=object)


@needs_verl
@pytest.mark.parametrize("norm", [True, False])
def test_sqlrl_grpo_leaves_the_excluded_sample_out_of_its_group(norm):
    import numpy as np
    import torch
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, get_adv_estimator_fn

    import sqlrl.integrations.verl as v

    v.register_advantage_estimator()
    fn = get_adv_estimator_fn("sqlrl_grpo")
    assert fn is v.compute_sqlrl_grpo_advantage
    # group a: 1, 0, 1 and one excluded (mask all zero; its reward 0.0 must not count as a wrong answer);
    # group b: one valid (0.5) and one excluded -> a singleton group; group c: all excluded
    rows = [("a", 1.0, 3), ("a", 0.0, 2), ("a", 0.0, 0), ("a", 1.0, 5), ("b", 0.5, 4), ("b", 0.0, 0)]
    rows += [("c", 1.0, 0), ("c", 0.0, 0)]
    rewards, mask, uid = _grpo_batch(rows)  # group c's 1.0 shows an excluded reward is never read
    cfg = OmegaConf.create({"norm_adv_by_std_in_grpo": norm})
    adv, ret = fn(token_level_rewards=rewards, response_mask=mask, index=uid, config=cfg)
    assert torch.equal(adv, ret) and adv.shape == rewards.shape
    excluded = [2, 5, 6, 7]
    for i in excluded:
        assert torch.equal(adv[i], torch.zeros(5))  # exactly 0
    # by hand, group a = (1, 0, 1): mean 2/3, unbiased std sqrt(((1/3)^2 * 2 + (2/3)^2) / 2) = sqrt(1/3)
    std = (1 / 3) ** 0.5
    a_hand = [1 / 3, -2 / 3, 1 / 3]
    a_hand = [x / (std + 1e-6) for x in a_hand] if norm else a_hand
    for i, want in zip([0, 1, 3], a_hand):
        n = rows[i][2]
        assert adv[i, :n].tolist() == pytest.approx([want] * n, abs=1e-6) and adv[i, n:].abs().sum() == 0
    # group b: singleton as veRL's GRPO treats one: mean 0, std 1
    assert adv[4, :4].tolist() == pytest.approx([0.5 / (1 + 1e-6) if norm else 0.5] * 4, abs=1e-7)
    # the same advantages, bit for bit, as veRL's own GRPO on the batch without the excluded samples
    keep = [0, 1, 3, 4]
    ref, _ = compute_grpo_outcome_advantage(
        token_level_rewards=rewards[keep],
        response_mask=mask[keep],
        index=uid[keep],
        norm_adv_by_std_in_grpo=norm,
    )
    assert torch.equal(adv[keep], ref)
    # ... which plain GRPO on the whole batch does not give (the excluded 0 would pull group a's mean)
    full, _ = compute_grpo_outcome_advantage(
        token_level_rewards=rewards, response_mask=mask, index=uid, norm_adv_by_std_in_grpo=norm
    )
    assert not torch.equal(full[[0, 1, 3]], adv[[0, 1, 3]])
    assert np.isfinite(adv.numpy()).all()


class _FakeAgentLoopWorker:
    """What veRL's AgentLoopWorker returns from generate_sequences (tensors, reward extra info, metrics)."""

    def __init__(self, rows):
        self.rows = rows
        outer = self

        class _Method:
            async def remote(self, chunk):
                return outer.output()

        self.generate_sequences = _Method()

    def output(self):
        import numpy as np
        import torch
        from verl import DataProto

        rewards, mask, uid = _grpo_batch([(u, s, n) for u, s, n, _, _ in self.rows])
        n = len(self.rows)
        excluded = np.array([float(e) for *_, e, _ in self.rows])
        infra = np.empty(n, dtype=object)
        infra[:] = [err for *_, err in self.rows]
        metric = {"generate_sequences": 0.1, "tool_calls": 0.0, "compute_score": 0.0, "num_preempted": 0}
        return DataProto.from_dict(
            tensors={
                "prompts": torch.ones(n, 3, dtype=torch.int64),
                "responses": torch.ones(n, 5, dtype=torch.int64),
                "response_mask": mask,
                "rm_scores": rewards,
            },
            non_tensors={"uid": uid, "sqlrl_excluded": excluded, "sqlrl_infra_error": infra},
            meta_info={"metrics": [dict(metric) for _ in range(n)], "reward_extra_keys": ["sqlrl_excluded"]},
        )


@needs_verl
def test_manager_masks_excluded_trajectories_and_they_add_nothing_to_the_update():
    import pickle

    import torch
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.experimental.agent_loop import AgentLoopManager
    from verl.trainer.ppo.core_algos import agg_loss
    from verl.trainer.ppo.ray_trainer import compute_advantage

    import sqlrl.integrations.verl as v

    # (uid, score, mask tokens, sqlrl_excluded, sqlrl_infra_error): row 2 is excluded by its reward, row 5 by
    # an infra error the reward did not see (e.g. scored elsewhere); both have tokens before masking
    rows = [("a", 1.0, 3, 0, None), ("a", 0.0, 2, 0, None), ("a", 0.0, 4, 1, None), ("a", 1.0, 5, 0, None)]
    rows += [("b", 1.0, 2, 0, None), ("b", 0.0, 3, 0, "sandbox worker crashed")]
    cls = v.SqlrlAgentLoopManager
    assert issubclass(cls, AgentLoopManager)
    assert cls.__module__ == "sqlrl.integrations.verl" and pickle.loads(pickle.dumps(cls)) is cls
    manager = cls.__new__(cls)  # veRL's __init__ only stores config and handles; the workers are faked
    manager.agent_loop_workers = [_FakeAgentLoopWorker(rows)]
    prompts = DataProto.from_dict(tensors={"x": torch.zeros(len(rows), 1)})
    out = manager.generate_sequences(prompts)  # veRL's own generate_sequences + the mask
    assert "timing" in out.meta_info
    mask = out.batch["response_mask"]
    assert mask[2].sum() == 0 and mask[5].sum() == 0
    assert [int(mask[i].sum()) for i in (0, 1, 3, 4)] == [3, 2, 5, 2]
    # veRL's compute_advantage, as the driver calls it, with the estimator the config selects
    out.batch["token_level_rewards"] = out.batch["rm_scores"]
    algo = OmegaConf.create({"adv_estimator": "sqlrl_grpo", "norm_adv_by_std_in_grpo": True})
    out = compute_advantage(out, adv_estimator="sqlrl_grpo", config=algo)
    adv = out.batch["advantages"]
    assert adv[2].abs().sum() == 0 and adv[5].abs().sum() == 0
    # group b keeps one valid trajectory: singleton (mean 0, std 1)
    assert adv[4, :2].tolist() == pytest.approx([1.0 / (1 + 1e-6)] * 2)
    # the loss veRL aggregates (its loss mask is response_mask) is the same with or without the excluded rows
    loss_mat = torch.arange(adv.numel(), dtype=torch.float32).reshape(adv.shape) / 7 + adv
    keep = [0, 1, 3, 4]
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        with_excluded = agg_loss(loss_mat, mask, mode)
        without = agg_loss(loss_mat[keep], mask[keep], mode)
        assert torch.allclose(with_excluded, without), mode


@needs_verl
def test_the_driver_registers_the_estimator_by_loading_the_configured_manager(tmp_path):
    """In a fresh process, do what veRL's trainer driver does with the generated YAML: load the agent loop
    manager class by name (RayPPOTrainer.init_workers), then look the estimator up (compute_advantage)."""
    import subprocess
    import sys

    from sqlrl.cli.verl_config import cli_main

    toml = tmp_path / "run.toml"
    toml.write_text("[grpo]\nprompts_per_step = 8\ngroup_size = 4\n")
    out = tmp_path / "verl.yaml"
    assert cli_main([str(toml), "-o", str(out), "--gpus-per-node", "2"]) == 0
    code = """
import sys
from omegaconf import OmegaConf
from verl.trainer.ppo import ray_trainer  # noqa: F401  (what the driver has imported by then)
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.utils.import_utils import load_class_from_fqn
cfg = OmegaConf.load(sys.argv[1])
assert "sqlrl.integrations.verl" not in sys.modules
try:
    get_adv_estimator_fn(cfg.algorithm.adv_estimator)
    print("before: registered")
except ValueError as e:
    print("before:", e)
cls = load_class_from_fqn(cfg.actor_rollout_ref.rollout.agent.agent_loop_manager_class, "AgentLoopManager")
fn = get_adv_estimator_fn(cfg.algorithm.adv_estimator)
print("after:", cls.__name__, fn.__module__, fn.__name__)
"""
    r = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "before: Unknown advantage estimator simply: sqlrl_grpo" in r.stdout
    assert (
        "after: SqlrlAgentLoopManager sqlrl.integrations.verl.advantage compute_sqlrl_grpo_advantage"
        in r.stdout
    )


@needs_verl
def test_verl_validation_refuses_sqlrl_grpo_without_the_manager(monkeypatch):
    import sqlrl.integrations.verl as v
    import sqlrl.integrations.verl.config as vc

    real = vc.verl_overrides

    def without_manager(cfg, **kw):
        d = real(cfg, **kw)
        d["actor_rollout_ref"]["rollout"]["agent"]["agent_loop_manager_class"] = None
        return d

    monkeypatch.setattr(vc, "verl_overrides", without_manager)
    with pytest.raises(ValueError, match="agent_loop_manager_class"):
        v.build_verl_config(_cfg())


# ------------------------------------------------------------------------------------------------ agent loop


def _script(text: str, turn: int) -> str:
    if turn == 0:
        return "Let me look.\n```sql\nSELECT nme FROM customer\n```"  # typo -> real sqlite error observation
    if turn == 1:
        return "```sql\nSELECT name FROM customer WHERE city = 'London'\n```"
    return "FINAL\n```sql\nSELECT name FROM customer WHERE city = 'London'\n```"


class FakeServerManager:
    """veRL's server manager contract: `await generate(request_id, *, prompt_ids, sampling_params)` ->
    TokenOutput. Scripted like `sqlrl.generation.scripted.ScriptedPolicy` (same replies, eos-terminated, -0.5 logprobs)."""

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
    from sqlrl.sql.sandbox import Sandbox

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
    from sqlrl.agent.loop import Budgets
    from sqlrl.agent.text2sql import run_agent
    from sqlrl.generation.scripted import ScriptedPolicy, make_chat_tokenizer
    from sqlrl.integrations.verl import AGENT_NAME, SqlrlAgentLoop, task_to_row

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
    from sqlrl.generation.scripted import make_chat_tokenizer

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
    from sqlrl.integrations.verl import compute_score, task_to_row
    from sqlrl.tasks.data import SpiderData, embedded_root

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
    # excluded: no verdict (NaN), not a wrong answer; the 0.0 reward is masked out of the update
    assert infra["sqlrl_excluded"] == 1.0 and infra["score"] == 0.0
    assert math.isnan(infra["acc"]) and math.isnan(infra["sqlrl_executable"])


def test_rows_carry_the_schema_options_and_paraphrases_are_refused(shop_tasks, tmp_path):
    from sqlrl.integrations.verl.data import task_to_row, write_dataset

    kw = {"data_root": "/x", "split": "train", "index": 0, "turns": 1, "max_schema_chars": 8000}
    plain = task_to_row(shop_tasks[0], **kw)["prompt"][1]["content"]
    with_values = task_to_row(shop_tasks[0], **kw, schema_sample_values=1)["prompt"][1]["content"]
    assert "example values" not in plain
    assert (
        "/* example values of customer (up to 1 per column, most frequent first):\n  id: 1\n" in with_values
    )
    with pytest.raises(ValueError, match="train_paraphrases is not supported by the veRL dataset writer"):
        write_dataset(_cfg(data={"train_paraphrases": True}), tmp_path)
