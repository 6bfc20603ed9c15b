"""Environments and their factory: `make_env` builds every environment with its execution resources.

A rollout environment (`sqlrl.agent.loop.Environment`) supplies the hooks of the one rollout loop and
owns what it executes on: `Text2SQLEnv` (`sqlrl.agent.text2sql`: a read-only `Sandbox`, a `GoldCache`
and an `Evaluator`) and `DebugEnv` (`sqlrl.agent.debugging`: a `ReplicaPool` of writable replicas).
Runners build them with `make_env(kind=..., ...)` instead of constructing the resources themselves.

A training environment (`make_env(cfg, out)`, what the GRPO trainer uses) adds where the tasks come from:
- `tasks` (the training tasks, already filtered to the scorable ones), `split_info()` and `gold_audit`
  (what run.json and split.json record about them),
- `rollout(batch, policy, budgets, sampling, n_samples)`: trajectories, task-major, from *public* tasks,
- `score(trajs)`: writes `traj.reward` after the trajectories ended and returns the per-trajectory
  accuracy values used for logging (execution match, or "solved" for debugging tasks); optionally
  `prefetch(batch)`, run beside the batch's generation (Text2SQL: the golds into the gold cache).
`Text2SQLTraining` (`data.kind = "text2sql"`: Spider-layout folders, gold audit, execution-match or
validity reward) and `DebugTraining` (`data.kind = "debug"`: reward = fraction of hidden tests passed).

What is covered: every environment is a context manager that closes the resources it built (never
borrowed ones); the rollout receives only public tasks; scoring happens after the trajectories end.
What is not: the training environments' resources exist only inside `with env:`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class Text2SQLTraining:
    """Text-to-SQL training tasks from a Spider-layout folder, on a `Text2SQLEnv`."""

    kind = "text2sql"

    def __init__(self, cfg, out: Path, *, evaluator_factory=None):
        from sqlrl.tasks.bird import open_data
        from sqlrl.tasks.data import resolve_data_root, select_tasks
        from sqlrl.tasks.goldcache import GoldCache, audit_golds

        d = cfg.data
        self.cfg = cfg
        self.root = resolve_data_root(d.path)
        self.ds = open_data(self.root)
        all_train = self.ds.load(
            d.train_split, seed=d.split_seed, val_fraction=d.val_fraction, paraphrases=d.train_paraphrases
        )
        self.all_train = all_train
        self.gold_cache = GoldCache(out / ".goldcache")
        audit = audit_golds(all_train, self.gold_cache)
        scorable = [t for t in all_train if audit.per_task.get(t.public.task_id) is None]
        self.tasks = select_tasks(scorable, d.max_train_tasks, cfg.run.seed)
        self.by_id = {t.public.task_id: t for t in self.tasks}
        self.gold_audit = audit.to_dict()
        self._evaluator_factory = evaluator_factory
        self.env = self.sandbox = self.evaluator = None

    def split_info(self) -> dict:
        from sqlrl.tasks.data import paraphrase_count

        d = self.cfg.data
        return {
            **(
                self.ds.split_info(seed=d.split_seed, val_fraction=d.val_fraction)
                if d.train_split in ("train", "validation")
                else {}
            ),
            "train_split": d.train_split,
            "train_fingerprint": self.ds.fingerprint(
                d.train_split, seed=d.split_seed, val_fraction=d.val_fraction, paraphrases=d.train_paraphrases
            ),
            "train_tasks": len(self.tasks),
            **(
                {
                    # Spider-Syn tasks loaded (before the gold audit) and among the training tasks
                    "train_paraphrases": {
                        "added": paraphrase_count(self.all_train),
                        "in_train_tasks": paraphrase_count(self.tasks),
                    }
                }
                if d.train_paraphrases
                else {}
            ),
        }

    def __enter__(self) -> Text2SQLTraining:
        cfg = self.cfg
        # training reads only the reward value: the literature's test-suite metric (a second execution of
        # every prediction with DISTINCT, and of the gold's variant) is for evaluation (`sqlrl eval`)
        self.env = make_env(
            workers=cfg.run.sandbox_workers,
            timeout_s=cfg.agent.sql_timeout_s,
            gold_cache=self.gold_cache,
            reward=cfg.grpo.reward,
            test_suite=False,
            # training's statement limit on predictions when scored (rollout tool calls keep the agent's)
            score_timeout_s=cfg.grpo.score_timeout_s or None,
            evaluator_factory=self._evaluator_factory,
        )
        self.sandbox, self.evaluator = self.env.sandbox, self.env.evaluator
        return self

    def __exit__(self, *exc) -> None:
        if self.env is not None:
            self.env.close()

    def rollout(self, batch: list, policy, budgets, sampling, n_samples: int) -> list:
        return self.env.rollout([t.public for t in batch], policy, budgets, sampling, n_samples=n_samples)

    def prefetch(self, batch: list) -> None:
        """Warm the gold cache for these tasks (`Evaluator.prefetch`): the trainer runs it beside the
        batch's generation, so that scoring pays for the predictions only."""
        if self.evaluator is not None and hasattr(self.evaluator, "prefetch"):
            self.evaluator.prefetch(batch)

    def score(self, trajs: list) -> list[float]:
        """Rewards into `traj.reward`; returns the execution-match values of the scored trajectories. The
        validity arm's accuracy comes from the same scoring: its status is the execution-match verdict
        (`match` / `mismatch`, or the failure), so no prediction is executed twice."""
        self.env.score(trajs, self.by_id)
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


class DebugTraining:
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
        self.env = self.pool = None

    def split_info(self) -> dict:
        from sqlrl.artifacts import sha256_file

        return {
            "train_split": self.cfg.data.train_split,
            "tasks_file": str(self.file),
            "train_fingerprint": sha256_file(self.file),
            "train_tasks": len(self.tasks),
        }

    def __enter__(self) -> DebugTraining:
        g = self.cfg.grpo
        # every trajectory of a step holds its own replica until it is scored
        self.env = make_env(
            kind="debug",
            templates={t.public.db_id: t.public.db_path for t in self.tasks},
            pool_root=self.out / ".replicas",
            replicas_per_db=g.prompts_per_step * g.group_size,
            workers=self.cfg.run.sandbox_workers,
            timeout_s=self.cfg.agent.sql_timeout_s,
        )
        self.pool = self.env.pool
        return self

    def __exit__(self, *exc) -> None:
        if self.env is not None:
            self.env.close()

    def rollout(self, batch: list, policy, budgets, sampling, n_samples: int) -> list:
        return self.env.rollout([t.public for t in batch], policy, budgets, sampling, n_samples=n_samples)

    def score(self, trajs: list) -> list[float]:
        self.env.score(trajs, self.by_id)
        return [
            float(tr.reward.get("status") == "solved") for tr in trajs if tr.reward.get("value") is not None
        ]


def make_env(
    cfg=None,
    out: Path | None = None,
    *,
    kind: str = "text2sql",
    evaluator_factory=None,
    sandbox=None,
    workers: int = 2,
    timeout_s: float = 5.0,
    gold_cache=None,
    gold_dir: str | Path | None = None,
    reward: str | None = None,
    test_suite: bool = True,
    score_timeout_s: float | None = None,
    pool=None,
    templates: dict | None = None,
    pool_root: str | Path | None = None,
    replicas_per_db: int = 4,
) -> Any:
    """Build an environment with its resources; what it builds, its `close()` (or `with`) closes.

    With `cfg`: the training environment of `cfg.data.kind` (tasks under `out`; resources on `with`).
    Otherwise a rollout environment of `kind`:
    - "text2sql": `Text2SQLEnv` on `sandbox` (else a new `Sandbox(workers, timeout_s)`); with `reward`
      (an `Evaluator` kind) or `gold_dir`, a `gold_cache` (else a new `GoldCache(gold_dir)`); with
      `reward`, an evaluator: `evaluator_factory(sandbox, gold_cache, reward)`, by default
      `Evaluator(sandbox, gold_cache, kind=reward, test_suite=test_suite, timeout_s=score_timeout_s)`
      (`score_timeout_s`: the predictions' statement limit when scored; None = the sandbox's).
    - "debug": `DebugEnv` on `pool` (else a new `ReplicaPool(templates, pool_root, replicas_per_db,
      workers, timeout_s)`)."""
    if cfg is not None:
        if cfg.data.kind == "debug":
            return DebugTraining(cfg, out, evaluator_factory=evaluator_factory)
        return Text2SQLTraining(cfg, out, evaluator_factory=evaluator_factory)
    if kind == "debug":
        from sqlrl.agent.debugging import DebugEnv
        from sqlrl.sql.replicas import ReplicaPool

        if pool is not None:
            return DebugEnv(pool)
        pool = ReplicaPool(
            templates, pool_root, replicas_per_db=replicas_per_db, workers=workers, timeout_s=timeout_s
        )
        return DebugEnv(pool, owned=[pool])
    if kind != "text2sql":
        raise ValueError(f"unknown environment kind {kind!r} (text2sql | debug)")
    from sqlrl.agent.text2sql import Text2SQLEnv
    from sqlrl.reward.evaluator import Evaluator
    from sqlrl.sql.sandbox import Sandbox
    from sqlrl.tasks.goldcache import GoldCache

    owned: list = []
    if sandbox is None:
        sandbox = Sandbox(workers=workers, timeout_s=timeout_s)
        owned.append(sandbox)
    if gold_cache is None and (reward is not None or gold_dir is not None):
        gold_cache = GoldCache(gold_dir)
        owned.append(gold_cache)
    evaluator = None
    if reward is not None:
        make = evaluator_factory or (
            lambda sb, gc, k: Evaluator(sb, gc, kind=k, test_suite=test_suite, timeout_s=score_timeout_s)
        )
        evaluator = make(sandbox, gold_cache, reward)
    return Text2SQLEnv(sandbox, gold_cache, evaluator, owned=owned)
