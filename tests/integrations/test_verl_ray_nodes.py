"""A 2-node Ray cluster on one machine: what veRL's workers on every node of a multi-node run need from sqlrl.

`ray.cluster_utils.Cluster` starts a head and a second node (each its own raylet and worker processes,
each with a custom resource that pins a task to it). `sqlrl train --engine verl --nnodes 2 --dry-run`
writes the run folder; its `verl.yaml` goes through veRL's `main_ppo.run_ppo`, whose `ray.init` joins
the cluster (`RAY_ADDRESS`, as on a real cluster) with the config's `ray_kwargs.ray_init.runtime_env`;
a stand-in TaskRunner then runs one probe on each node, which checks there, with veRL's own loaders:
- the agent loop registered under the config's `default_agent_loop` (the registry file the config
  names, its `_target_` resolved by hydra as veRL's agent-loop worker does) is sqlrl's AgentLoopBase;
- the reward function loads by the file path the config names (veRL's `get_custom_reward_fn`) and
  scores a row of the written train parquet on real SQLite: a right prediction 1.0, a wrong one 0.0;
- the `SQLRL_*` variables of the config's runtime env are set there (the raylets were started without
  them), and the reward used that gold cache.
The variables missing without the runtime env, and a wrong reward path, fail the probe.

Not covered: two machines (one host, one file system, so "shared storage" is trivially shared), GPUs,
vLLM, veRL's real TaskRunner and its worker groups; `ray start` (the CLI) instead of `Cluster`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

HAVE_RAY_VERL = all(importlib.util.find_spec(m) is not None for m in ("ray", "verl"))
needs_verl = pytest.mark.skipif(
    not HAVE_RAY_VERL, reason="Ray/veRL not importable; run scripts/verl-env.sh --test"
)

NODES = ("sqlrl_node_head", "sqlrl_node_worker")
# gold: SELECT count(*) FROM animal WHERE legs > 3 -> 2 (cat 4, ant 6; hen 2)
RIGHT_SQL = "SELECT count(*) FROM animal WHERE legs >= 4"  # 2: the same result -> 1.0
WRONG_SQL = "SELECT count(*) FROM animal WHERE legs > 4"  # 1 (ant only) -> 0.0
WORKER_ENV = {"SQLRL_GOLD_CACHE": "", "SQLRL_REWARD_WORKERS": "1", "SQLRL_SQL_TIMEOUT_S": "7.5"}


def _spider_folder(root: Path) -> Path:
    """Ten databases zoo0..zoo9, each with animal (cat 4 legs, hen 2, ant 6) and the same question (a
    by-database train/validation split needs several databases)."""
    tables, examples = [], []
    for d in range(10):
        db = f"zoo{d}"
        (root / "database" / db).mkdir(parents=True)
        con = sqlite3.connect(root / "database" / db / f"{db}.sqlite")
        con.execute("CREATE TABLE animal (id INTEGER PRIMARY KEY, name TEXT, legs INTEGER)")
        con.executemany("INSERT INTO animal VALUES (?, ?, ?)", [(1, "cat", 4), (2, "hen", 2), (3, "ant", 6)])
        con.commit()
        con.close()
        tables.append({"db_id": db, "table_names_original": ["animal"]})
        q = "How many animals have more than 3 legs?"
        examples.append({"db_id": db, "question": q, "query": "SELECT count(*) FROM animal WHERE legs > 3"})
    (root / "tables.json").write_text(json.dumps(tables))
    (root / "train_spider.json").write_text(json.dumps(examples))
    return root


def _probe_fn():
    """The probe, defined here so that Ray pickles it by value (this test module is not importable on
    the workers)."""

    def probe(config: dict, row: dict | None) -> dict:
        import os

        import ray
        from hydra.utils import get_class
        from omegaconf import OmegaConf
        from verl.experimental.agent_loop.agent_loop import AgentLoopBase
        from verl.trainer.ppo.reward import get_custom_reward_fn

        import sqlrl

        cfg = OmegaConf.create(config)
        agent = cfg.actor_rollout_ref.rollout.agent
        registry = {e.name: e for e in OmegaConf.load(agent.agent_loop_config_path)}
        loop = get_class(registry[agent.default_agent_loop]._target_)
        fn = get_custom_reward_fn(cfg)
        scores = {}
        if row is not None:  # None: no scoring (without the configured gold cache it would go to ~/.cache)
            gt, src = row["reward_model"]["ground_truth"], row["data_source"]
            scores = {
                name: fn(
                    data_source=src, solution_str="", ground_truth=gt, extra_info={"sqlrl_final_sql": sql}
                )
                for name, sql in (("right", RIGHT_SQL), ("wrong", WRONG_SQL))
            }
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "loop": loop.__name__,
            "is_agent_loop": issubclass(loop, AgentLoopBase),
            "scores": {k: v["score"] for k, v in scores.items()},
            "excluded": {k: v["sqlrl_excluded"] for k, v in scores.items()},
            "env": {k: v for k, v in os.environ.items() if k.startswith("SQLRL_")},
            "sqlrl": sqlrl.__file__,
        }

    return probe


def _runner_class(out: Path, row: dict):
    """A stand-in for veRL's TaskRunner (run_ppo calls `.remote()` and then `run.remote(config)`): one probe
    per node, the results written to `out` (run_ppo discards what `run` returns)."""
    import ray
    from omegaconf import OmegaConf

    probe = ray.remote(num_cpus=1)(_probe_fn())

    @ray.remote(num_cpus=0)
    class ProbeRunner:
        def run(self, config):
            d = OmegaConf.to_container(config, resolve=True)
            refs = [probe.options(resources={n: 1}).remote(d, row) for n in NODES]
            try:
                results = {"ok": dict(zip(NODES, ray.get(refs), strict=True))}
            except Exception as e:  # the error travels back as data; the test asserts on it
                results = {"error": f"{type(e).__name__}: {e}"}
            Path(out).write_text(json.dumps(results))

    return ProbeRunner


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("SQLRL_")}  # not in the raylets
    node = {"num_cpus": 2, "object_store_memory": 100 * 2**20}
    c = Cluster(initialize_head=True, head_node_args={**node, "resources": {NODES[0]: 1}})
    c.add_node(**node, resources={NODES[1]: 1})
    c.wait_for_nodes()
    try:
        yield c
    finally:
        c.shutdown()
        os.environ.update(saved)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[Path, dict, Path]:
    """`sqlrl train --engine verl --nnodes 2 --dry-run` on the Spider folder, with the `SQLRL_*` variables set
    only while it writes the config; (run folder, first train row, gold cache)."""
    import pandas as pd

    from sqlrl.cli.train import cli_main

    tmp = tmp_path_factory.mktemp("dry_run")
    root = _spider_folder(tmp / "spider")
    toml = tmp / "run.toml"
    toml.write_text(
        f'[data]\npath = "{root}"\n[grpo]\nprompts_per_step = 2\ngroup_size = 2\nmicro_batch = 1\n'
    )
    out, gc = tmp / "run", tmp / "gc"
    argv = [
        str(toml),
        "--engine",
        "verl",
        "--out",
        str(out),
        "--nnodes",
        "2",
        "--gpus-per-node",
        "1",
        "--dry-run",
    ]
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {**WORKER_ENV, "SQLRL_GOLD_CACHE": str(gc)}.items():
            mp.setenv(k, v)
        assert cli_main(argv) == 0
    row = pd.read_parquet(out / "data" / "train.parquet").iloc[0].to_dict()
    return out, {"data_source": row["data_source"], "reward_model": dict(row["reward_model"])}, gc


def _run_ppo(cluster, run: Path, row: dict | None, monkeypatch, edit=None) -> dict:
    """veRL's run_ppo on the run folder's verl.yaml (after `edit(config)`), joined to `cluster`."""
    import ray
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from verl.trainer import main_ppo

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(run), version_base=None):
        config = compose(config_name="verl")
    if edit:
        edit(config)
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    out = run / "probe.json"
    out.unlink(missing_ok=True)
    try:
        main_ppo.run_ppo(config, task_runner_class=_runner_class(out, row))
    finally:
        ray.shutdown()
    return json.loads(out.read_text())


@needs_verl
def test_every_node_imports_the_agent_loop_scores_by_path_and_sees_the_env(cluster, dry_run, monkeypatch):
    run, row, gc = dry_run
    assert _yaml_env(run) == {**WORKER_ENV, "SQLRL_GOLD_CACHE": str(gc), "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    shutil.rmtree(gc)  # written by the dry run's gold audit; from here on only the reward writes it
    res = _run_ppo(cluster, run, row, monkeypatch)
    assert "error" not in res, res.get("error")
    per_node = res["ok"]
    node_ids = {n.node_id for n in cluster.list_all_nodes()}
    assert {r["node_id"] for r in per_node.values()} == node_ids and len(node_ids) == 2
    for r in per_node.values():
        assert r["loop"] == "SqlrlAgentLoop" and r["is_agent_loop"]
        assert r["scores"] == {"right": 1.0, "wrong": 0.0} and r["excluded"] == {"right": 0.0, "wrong": 0.0}
        assert r["env"] == {**WORKER_ENV, "SQLRL_GOLD_CACHE": str(gc)}
        assert r["sqlrl"] == sys.modules["sqlrl"].__file__
    assert any(gc.iterdir())  # the reward workers' gold cache is the configured one


def _yaml_env(run: Path) -> dict:
    import yaml

    return yaml.safe_load((run / "verl.yaml").read_text())["ray_kwargs"]["ray_init"]["runtime_env"][
        "env_vars"
    ]


@needs_verl
def test_without_the_runtime_env_no_node_sees_the_variables(cluster, dry_run, monkeypatch):
    """What the first test sees comes from the config's runtime env, not from the raylets' environment."""
    from omegaconf import open_dict

    def drop_env(config):
        with open_dict(config.ray_kwargs.ray_init.runtime_env):
            config.ray_kwargs.ray_init.runtime_env.env_vars = {}

    run = dry_run[0]
    res = _run_ppo(cluster, run, None, monkeypatch, edit=drop_env)
    assert "error" not in res, res.get("error")
    assert [r["env"] for r in res["ok"].values()] == [{}, {}]


@needs_verl
def test_a_reward_path_missing_on_the_workers_fails_there(cluster, dry_run, tmp_path, monkeypatch):
    run, row, _ = dry_run
    missing = tmp_path / "elsewhere" / "reward.py"

    def move_reward(config):
        config.reward.custom_reward_function.path = str(missing)

    res = _run_ppo(cluster, run, row, monkeypatch, edit=move_reward)
    assert "ok" not in res and str(missing) in res["error"]
