"""Training environments: where tasks come from, how a batch is rolled out, and how it is scored.

The GRPO trainer is the same for every environment; it only asks an environment for

- `tasks` (the training tasks, already filtered to the scorable ones) and `info` (what run.json and
  split.json record about them),
- `rollout(batch, policy, budgets, sampling, n_samples)`: trajectories, task-major, from *public* tasks,
- `score(trajs)`: writes `traj.reward` after the trajectories ended and returns the per-trajectory
  accuracy values used for logging (execution match, or "solved" for debugging tasks).

Environments are context managers that own their execution resources (a sandbox, a replica pool).

- `Text2SQLEnv` (`data.kind = "text2sql"`): Spider-layout folders, gold audit, hardened read-only
  sandbox, execution-match or validity reward.
- `DebugEnv` (`data.kind = "debug"`): stateful SQL-debugging tasks (debugtasks.py) on per-trajectory
  writable replicas from a pool with lazy reset (pool.py); reward = fraction of hidden tests passed.

Guaranteed: the rollout of both receives only public tasks; scoring happens after the trajectories end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class Text2SQLEnv:
    kind = "text2sql"

    def __init__(self, cfg, out: Path, *, evaluator_factory=None):
        from sqlrl.tasks.data import SpiderData, resolve_data_root, select_tasks
        from sqlrl.tasks.goldcache import GoldCache, audit_golds

        d = cfg.data
        self.cfg = cfg
        self.root = resolve_data_root(d.path)
        self.ds = SpiderData(self.root)
        all_train = self.ds.load(d.train_split, seed=d.split_seed, val_fraction=d.val_fraction)
        self.gold_cache = GoldCache(out / ".goldcache")
        audit = audit_golds(all_train, self.gold_cache)
        scorable = [t for t in all_train if audit.per_task.get(t.public.task_id) is None]
        self.tasks = select_tasks(scorable, d.max_train_tasks, cfg.run.seed)
        self.by_id = {t.public.task_id: t for t in self.tasks}
        self.gold_audit = audit.to_dict()
        self._evaluator_factory = evaluator_factory
        self.sandbox = None

    def split_info(self) -> dict:
        d = self.cfg.data
        return {
            **(
                self.ds.split_info(seed=d.split_seed, val_fraction=d.val_fraction)
                if d.train_split in ("train", "validation")
                else {}
            ),
            "train_split": d.train_split,
            "train_fingerprint": self.ds.fingerprint(
                d.train_split, seed=d.split_seed, val_fraction=d.val_fraction
            ),
            "train_tasks": len(self.tasks),
        }

    def __enter__(self) -> Text2SQLEnv:
        from sqlrl.reward.evaluator import Evaluator
        from sqlrl.sql.sandbox import Sandbox

        cfg = self.cfg
        self.sandbox = Sandbox(workers=cfg.run.sandbox_workers, timeout_s=cfg.agent.sql_timeout_s)
        # training reads only the reward value: the literature's test-suite metric (a second execution of
        # every prediction with DISTINCT, and of the gold's variant) is for evaluation (`sqlrl eval`)
        make = self._evaluator_factory or (
            lambda sb, gc, kind: Evaluator(sb, gc, kind=kind, test_suite=False)
        )
        self.evaluator = make(self.sandbox, self.gold_cache, cfg.grpo.reward)
        return self

    def __exit__(self, *exc) -> None:
        if self.sandbox is not None:
            self.sandbox.close()

    def rollout(self, batch: list, policy, budgets, sampling, n_samples: int) -> list:
        from sqlrl.agent.loop import run_agent

        return run_agent(
            [t.public for t in batch], policy, self.sandbox, budgets, sampling, n_samples=n_samples
        )

    def score(self, trajs: list) -> list[float]:
        """Rewards into `traj.reward`; returns the execution-match values of the scored trajectories. The
        validity arm's accuracy comes from the same scoring: its status is the execution-match verdict
        (`match` / `mismatch`, or the failure), so no prediction is executed twice."""
        from sqlrl.agent.loop import score_trajectories

        score_trajectories(trajs, self.by_id, self.evaluator)
        if self.cfg.grpo.reward == "execution":
            return [tr.reward["value"] for tr in trajs if tr.reward["value"] is not None]
        accs = []
        for tr in trajs:
            if tr.reward["value"] is None:  # excluded (infrastructure, unscorable gold): no accuracy either
                continue
            em = 1.0 if tr.reward["status"] == "match" else 0.0
            tr.reward["parts"]["execution_match"] = em
            accs.append(em)
        return accs


class DebugEnv:
    """SQL-debugging tasks on pooled writable replicas. `data.path`: a folder with `debug_tasks.jsonl`
    (from `bench/make_debug_tasks.py`), a `.jsonl` file, or `embedded` for the shipped demo slice;
    `data.train_split` selects the tasks' `split` field (the demo slice is all `train`)."""

    kind = "debug"

    def __init__(self, cfg, out: Path, *, evaluator_factory=None):
        from sqlrl.tasks.data import select_tasks
        from sqlrl.tasks.debugging import debug_demo_root, load_debug_tasks

        if cfg.grpo.reward != "execution":
            raise ValueError(
                "data.kind = 'debug' scores with the hidden tests; grpo.reward must be 'execution'"
            )
        p = Path(debug_demo_root() if cfg.data.path in ("embedded", "", None) else cfg.data.path)
        file = p / "debug_tasks.jsonl" if p.is_dir() else p
        if not file.is_file():
            raise FileNotFoundError(
                f"no debugging tasks at {file}; build them with bench/make_debug_tasks.py"
            )
        all_tasks = load_debug_tasks(file)
        train = [t for t in all_tasks if t.split == cfg.data.train_split]
        if not train:
            splits = sorted({t.split for t in all_tasks})
            raise ValueError(f"{file}: no tasks with split {cfg.data.train_split!r}; splits there: {splits}")
        self.cfg, self.file, self.out = cfg, file, out
        self.tasks = select_tasks(train, cfg.data.max_train_tasks, cfg.run.seed)
        self.by_id = {t.public.task_id: t for t in self.tasks}
        self.gold_audit = {
            "n": len(train),
            "scorable": len(train),
            "excluded": {},
            "note": "debugging tasks are validated when built (reference passes, buggy fails)",
        }
        self.pool = None

    def split_info(self) -> dict:
        from sqlrl.artifacts import sha256_file

        return {
            "train_split": self.cfg.data.train_split,
            "tasks_file": str(self.file),
            "train_fingerprint": sha256_file(self.file),
            "train_tasks": len(self.tasks),
        }

    def __enter__(self) -> DebugEnv:
        from sqlrl.sql.replicas import ReplicaPool

        g = self.cfg.grpo
        templates = {t.public.db_id: t.public.db_path for t in self.tasks}
        # every trajectory of a step holds its own replica until it is scored
        self.pool = ReplicaPool(
            templates,
            self.out / ".replicas",
            replicas_per_db=g.prompts_per_step * g.group_size,
            workers=self.cfg.run.sandbox_workers,
            timeout_s=self.cfg.agent.sql_timeout_s,
        )
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.close()

    def rollout(self, batch: list, policy, budgets, sampling, n_samples: int) -> list:
        from sqlrl.agent.debugging import run_debug_agent

        return run_debug_agent(
            [t.public for t in batch], policy, self.pool, budgets, sampling, n_samples=n_samples
        )

    def score(self, trajs: list) -> list[float]:
        from sqlrl.agent.debugging import score_debug_trajectories

        score_debug_trajectories(trajs, self.by_id, self.pool)
        return [
            float(tr.reward.get("status") == "solved") for tr in trajs if tr.reward.get("value") is not None
        ]


def make_env(cfg, out: Path, *, evaluator_factory=None) -> Any:
    if cfg.data.kind == "debug":
        return DebugEnv(cfg, out, evaluator_factory=evaluator_factory)
    return Text2SQLEnv(cfg, out, evaluator_factory=evaluator_factory)
