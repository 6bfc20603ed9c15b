"""Dataset rows for veRL: the public task only; the gold is referenced, never copied.

What is covered:
- ``task_to_row`` writes a task's public fields and a reference to its gold (data folder, split and
  its settings, task id); the reward worker loads the gold itself (``reward.compute_score``).
- ``write_dataset`` audits every gold first (``audit_golds``, in the gold cache the reward workers
  use, ``SQLRL_GOLD_CACHE``) and leaves unscorable ones out of the parquet files; ``gold_audit.json``
  beside them counts the exclusions by reason.

What is not:
- A gold that turns unscorable later (on the reward worker) is excluded at run time, not here.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from sqlrl.integrations.verl.common import (
    AGENT_NAME,
    DATA_SOURCE,
    GOLD_AUDIT_FILE,
    gold_cache_dir,
    public_dict,
)

log = logging.getLogger(__name__)


def task_to_row(
    task,
    *,
    data_root: str,
    split: str,
    index: int,
    turns: int,
    max_schema_chars: int,
    split_seed: int = 0,
    val_fraction: float = 0.1,
    reward_kind: str = "execution",
    schema_sample_values: int = 0,
    schema_order: str = "file",
    show_evidence: bool = True,
    column_descriptions: bool = False,
) -> dict:
    """One veRL dataset row for a task. Accepts a PrivateTask but writes only its public part; the gold
    is referenced (folder, split and its settings, task id), never copied."""
    from sqlrl.agent.prompts import build_messages
    from sqlrl.tasks.data import PrivateTask, ensure_public

    public = ensure_public(task.public if isinstance(task, PrivateTask) else task)
    ref = {
        "data": str(data_root),
        "split": split,
        "split_seed": int(split_seed),
        "val_fraction": float(val_fraction),
        "task_id": public.task_id,
        "kind": reward_kind,
    }
    return {
        "data_source": DATA_SOURCE,
        "agent_name": AGENT_NAME,
        "prompt": build_messages(
            public,
            turns=turns,
            max_schema_chars=max_schema_chars,
            schema_sample_values=schema_sample_values,
            schema_order=schema_order,
            show_evidence=show_evidence,
            column_descriptions=column_descriptions,
        ),
        "reward_model": {"style": "rule", "ground_truth": json.dumps(ref, sort_keys=True)},
        "extra_info": {"index": index, "split": split, "sqlrl_task": public_dict(public)},
    }


def write_dataset(cfg, out_dir: str | os.PathLike, *, quiet: bool = False) -> dict[str, str]:
    """Write train/validation parquet files for veRL from the run config's data section.

    Every gold is audited first (`sqlrl.tasks.goldcache.audit_golds`, in the gold cache the reward workers use,
    `SQLRL_GOLD_CACHE`): a task whose gold errors, times out or returns no rows is left out of the files,
    so it never enters a veRL batch. `gold_audit.json` beside the files records, per split, how many tasks
    there were, how many were written and how many were excluded by reason; the same is logged unless
    `quiet`. A split left with no scorable task is a ValueError. Returns the paths (`train`,
    `validation`, `gold_audit`). `data.max_train_tasks` / `data.max_eval_tasks` then pick the same seeded
    subset of the scorable tasks as sqlrl's own trainer (`sqlrl.evaluation.runner.select_tasks`, seed `run.seed`).
    """
    if cfg.data.train_paraphrases:
        # the reward workers find a task by id in SpiderData(...).load(split), which has no paraphrases
        raise ValueError(
            "data.train_paraphrases is not supported by the veRL dataset writer (its reward workers look tasks "
            "up without paraphrases); set data.train_paraphrases = false for veRL runs"
        )
    import pandas as pd

    from sqlrl.artifacts import write_json_atomic
    from sqlrl.tasks.bird import open_data
    from sqlrl.tasks.data import embedded_root, select_tasks
    from sqlrl.tasks.goldcache import GoldCache, audit_golds

    d, a = cfg.data, cfg.agent
    root = str(embedded_root()) if d.path == "embedded" else str(Path(d.path).expanduser().resolve())
    data = open_data(root)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, str] = {}
    report: dict[str, Any] = {"data": root, "gold_cache": gold_cache_dir(), "splits": {}}
    with GoldCache(gold_cache_dir()) as cache:
        for name, split in (("train", d.train_split), ("validation", d.eval_split)):
            tasks = data.load(split, seed=d.split_seed, val_fraction=d.val_fraction)
            audit = audit_golds(tasks, cache)
            scorable = [t for t in tasks if audit.per_task.get(t.public.task_id) is None]
            limit = d.max_train_tasks if name == "train" else d.max_eval_tasks
            kept = select_tasks(scorable, limit, cfg.run.seed)
            report["splits"][name] = {
                "split": split,
                "tasks": len(tasks),
                "scorable": len(scorable),
                "limit": limit,
                "written": len(kept),
                "excluded": dict(sorted(audit.excluded.items())),
                "excluded_task_ids": sorted(k for k, v in audit.per_task.items() if v is not None),
            }
            if not quiet:
                why = ", ".join(f"{k} {v}" for k, v in sorted(audit.excluded.items())) or "none"
                cap = f" (limit {limit} of {len(scorable)} scorable)" if len(kept) < len(scorable) else ""
                log.info(
                    f"veRL data {name} ({split}): {len(tasks)} tasks, {len(kept)} written{cap}, "
                    f"{len(tasks) - len(scorable)} excluded (unscorable gold: {why})"
                )
            if not kept:
                raise ValueError(f"veRL data: no task of split {split!r} has a scorable gold ({root})")
            rows = [
                task_to_row(
                    t,
                    data_root=root,
                    split=split,
                    index=i,
                    turns=a.turns,
                    max_schema_chars=a.max_schema_chars,
                    split_seed=d.split_seed,
                    val_fraction=d.val_fraction,
                    reward_kind=cfg.grpo.reward,
                    schema_sample_values=a.schema_sample_values,
                    schema_order=a.schema_order,
                    show_evidence=a.show_evidence,
                    column_descriptions=a.column_descriptions,
                )
                for i, t in enumerate(kept)
            ]
            path = out / f"{name}.parquet"
            pd.DataFrame(rows).to_parquet(path)
            paths[name] = str(path)
    audit_path = out / GOLD_AUDIT_FILE
    write_json_atomic(audit_path, report)
    paths["gold_audit"] = str(audit_path)
    return paths
