"""sqlrl: train Text-to-SQL agents with GRPO and prove, with evidence anyone can check, whether training helped.

The public Python API. Importing `sqlrl` is cheap (no torch, no transformers): every name below is
imported on first use (module `__getattr__`); `train`, `evaluate` and `run_experiment` import what they
need when called.

    import sqlrl
    cfg = sqlrl.load_config("configs/quickstart.toml", ["grpo.steps=1"])
    sqlrl.train(cfg, "runs/api", reward=lambda pred, gold, task: float(pred.status == "ok"))
    sqlrl.evaluate("runs/api/final", "runs/api-eval", limit=4)

What is covered: the names in `__all__`, with the behaviour of the CLI commands they mirror (`sqlrl
train`, `sqlrl eval`, `sqlrl experiment`): same run folders, same records.
What is not: the CLI's printed summaries and exit codes (the functions return dicts / objects and raise).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlrl.version import __version__

if TYPE_CHECKING:
    from sqlrl.config import Config

# public name -> "module:attribute", imported on first access
_LAZY: dict[str, str] = {
    "Config": "sqlrl.config:Config",
    "ConfigError": "sqlrl.config:ConfigError",
    "load_config": "sqlrl.config:load",
    "Sandbox": "sqlrl.sql.sandbox:Sandbox",
    "SQLResult": "sqlrl.sql.sandbox:SQLResult",
    "SpiderData": "sqlrl.tasks.data:SpiderData",
    "PublicTask": "sqlrl.tasks.data:PublicTask",
    "PrivateTask": "sqlrl.tasks.data:PrivateTask",
    "GoldCache": "sqlrl.tasks.goldcache:GoldCache",
    "GoldResult": "sqlrl.tasks.goldcache:GoldResult",
    "Evaluator": "sqlrl.reward.evaluator:Evaluator",
    "Reward": "sqlrl.reward.match:Reward",
    "execution_match": "sqlrl.reward.match:execution_match",
    "CustomReward": "sqlrl.reward.custom:CustomReward",
    "Budgets": "sqlrl.agent.loop:Budgets",
    "Sampling": "sqlrl.agent.loop:Sampling",
    "run_agent": "sqlrl.agent.text2sql:run_agent",
    "ScriptedPolicy": "sqlrl.generation.scripted:ScriptedPolicy",
    "load_policy": "sqlrl.evaluation.runner:load_policy",
    "evidence_gate": "sqlrl.evidence.gate:evidence_gate",
    "write_report": "sqlrl.evidence.report:write_report",
}

__all__ = ["__version__", "evaluate", "run_experiment", "train", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'sqlrl' has no attribute {name!r}")
    import importlib

    module, _, attr = target.partition(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _config(config: Config | str | Path, overrides: Iterable[str]) -> Config:
    """A Config from a Config or a TOML path, with `section.key=value` overrides (as `--set`)."""
    from sqlrl import config as C

    overrides = list(overrides)
    if isinstance(config, str | Path):
        return C.load(config, overrides)
    if not isinstance(config, C.Config):
        raise TypeError(f"config: expected a sqlrl.Config or the path of a TOML run file, got {config!r}")
    if not overrides:
        return config
    raw = config.resolve()
    for ov in overrides:
        C.apply_override(raw, ov)
    return C.from_dict(raw, source="<overrides>")


def train(
    config: Config | str | Path,
    out: str | Path,
    *,
    resume: bool = False,
    reward=None,
    overrides: Iterable[str] = (),
    time_budget: float | None = None,
    progress: bool = True,
    policy_factory=None,
) -> dict:
    """GRPO into the run folder `out`, as `sqlrl train` (`resume=True`: as `--resume out`).

    `config`: a `Config` or the path of a TOML run file; `overrides`: `section.key=value` strings.
    `reward(pred: SQLResult, gold: GoldResult, task: PrivateTask) -> float` replaces the execution
    reward (Text-to-SQL tasks, `grpo.reward = "execution"`); unscorable golds and infrastructure
    failures stay excluded and counted, and an exception from `reward` propagates (see
    `sqlrl.reward.custom`). `time_budget` (seconds): stop cleanly, checkpointed, before it runs out.
    Returns {"steps", "finished", and when finished "final" (the Hugging Face folder), "final_identity"}.
    """
    from sqlrl.training.trainer import train as _train

    cfg = _config(config, overrides)
    factory = command = None
    if reward is not None:
        if cfg.data.kind != "text2sql" or cfg.grpo.reward != "execution":
            raise ValueError(
                "train(reward=...) replaces the execution reward of Text-to-SQL tasks: it needs "
                f'data.kind = "text2sql" and grpo.reward = "execution" (got {cfg.data.kind!r}, {cfg.grpo.reward!r})'
            )
        from sqlrl.reward.custom import CustomReward

        def factory(sandbox, gold_cache, kind):
            return CustomReward(sandbox, gold_cache, reward)

        named = (
            reward if hasattr(reward, "__qualname__") else type(reward)
        )  # a function, or a callable object
        name = f"{named.__module__}:{named.__qualname__}"
        command = [*sys.argv, f"reward={name}"]  # run.json records which function scored the run
    deadline = time.monotonic() + time_budget if time_budget else None
    return _train(
        cfg,
        out,
        resume=resume,
        policy_factory=policy_factory,
        progress=progress,
        command=command,
        deadline=deadline,
        evaluator_factory=factory,
    )


def evaluate(
    model: str | Any,
    out: str | Path,
    *,
    data: str = "embedded",
    split: str = "validation",
    limit: int | None = None,
    budgets: Any = None,
    config: Config | str | Path | None = None,
    seed: int = 0,
    device: str = "auto",
    dtype: str = "auto",
    engine: str = "auto",
) -> dict:
    """Greedy evaluation of a model over a split, as `sqlrl eval`; returns summary.json's dict.

    `model`: a built-in name, a local Hugging Face folder (e.g. a run's `final/`), a hub id, or a policy
    object (e.g. `ScriptedPolicy`). Budgets: `budgets` (a `Budgets`), else `config`'s [agent] section,
    else the defaults; with `config`, `data`, `split` and the split's seed and fraction come from its
    [data] section too, and device, dtype and engine where left "auto", as the experiment evaluates an
    arm. `limit`: a seeded subset of that many tasks (0 = all; default: `config`'s
    data.max_eval_tasks, else all)."""
    from sqlrl.agent.loop import Budgets
    from sqlrl.evaluation.runner import load_policy, run_eval

    split_seed, val_fraction, workers = 0, 0.1, 2
    policy = None if isinstance(model, str | Path) else model
    if config is not None:  # as the experiment evaluates its arms
        cfg = _config(config, ())
        budgets = budgets or Budgets.from_config(cfg.agent)
        data, split = cfg.data.path, cfg.data.eval_split
        seed = split_seed = cfg.data.split_seed
        val_fraction, workers = cfg.data.val_fraction, cfg.run.sandbox_workers
        limit = cfg.data.max_eval_tasks if limit is None else limit
        if policy is None:
            policy = load_policy(
                str(model),
                device=cfg.run.device if device == "auto" else device,
                dtype=cfg.model.dtype if dtype == "auto" else dtype,
                engine=cfg.run.gen_engine if engine == "auto" else engine,
                max_batch=cfg.run.gen_max_batch,
            )
    output = run_eval(
        model=str(model) if isinstance(model, str | Path) else getattr(model, "name", "policy"),
        data=data,
        split=split,
        out=out,
        budgets=budgets or Budgets(),
        limit=limit or 0,
        seed=seed,
        split_seed=split_seed,
        val_fraction=val_fraction,
        device=device,
        dtype=dtype,
        engine=engine,
        policy=policy,
        sandbox_workers=workers,
    )
    return output.summary


def run_experiment(
    config: str | Path,
    out: str | Path,
    *,
    overrides: Iterable[str] = (),
    report: bool = True,
    time_budget: float | None = None,
) -> dict:
    """The equal-budget arm matrix of a TOML experiment file, as `sqlrl experiment` (resumable: call it
    again with the same arguments). Raises `sqlrl.training.budget.Unfinished` when `time_budget`
    (seconds) ran out before the end. Returns experiment.json's dict (with "report" when written)."""
    from sqlrl.experiment.matrix import load_experiment
    from sqlrl.experiment.matrix import run_experiment as _run

    cfg, exp = load_experiment(config, list(overrides))
    deadline = time.monotonic() + time_budget if time_budget else None
    return _run(cfg, exp, out, report=report, deadline=deadline)
