"""The run folder of a training command (`sqlrl train`, `sqlrl sft`): checks, resume, metrics, pruning.

What is covered:
- A new run needs a new or empty folder; `--resume` needs the run's config.json, equal to the config
  of this invocation except for memory-only and record-only settings (`config_changes`; such changes
  are allowed and recorded). Nothing is created by the checks.
- A resume restores the newest valid checkpoint (weights, optimizer, scheduler, data cursor, RNG) and
  drops metric lines of steps after it (the run was killed after logging them); the run's training
  time and machines across invocations: `sessions.py`.
- The time budget: a loop stops before a step that would probably end too late, with a checkpoint
  of the last step (`budget.out_of_time`).
- Metric sinks: TensorBoard (when installed), W&B and SwanLab (when asked for) get the same scalars.
- Pruning: a finished, exported run may delete its checkpoint folders; the manifest stays, marked.

- One writer: `train` and `train_sft` hold the folder's OS lock (`artifacts.lock_run_folder`) for the
  whole run, checks included; a second process on the same folder gets `RunFolderLocked`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlrl.artifacts import RUN_LOCK_FILE, read_json, read_jsonl, write_json_atomic, write_jsonl
from sqlrl.config import Config, ConfigError
from sqlrl.training.budget import out_of_time

log = logging.getLogger(__name__)

# Settings that change only how an update is split into passes (memory), never what is computed: a
# resumed run may change them, e.g. after running out of GPU memory.
MEMORY_ONLY_KEYS = {
    ("grpo", "micro_batch"),
    ("grpo", "micro_batch_logit_tokens"),
    ("grpo", "micro_batch_tokens"),
}
# Settings that change only what is written for inspection (never what is computed): a resume may change
# them too (recorded like the memory-only ones); sql.jsonl of a run resumed with log_sql turned on
# starts at the resumed step
RECORD_ONLY_KEYS = {
    ("run", "log_sql"),
    ("run", "log_rollouts"),
    ("run", "eval_every"),  # the learning curve never reaches the update (sqlrl.training.curve)
    ("run", "eval_tasks"),
    ("run", "final_dtype"),  # how RUN/final is stored; evaluations load the same generation-dtype model
}
RESUMABLE_CHANGES = MEMORY_ONLY_KEYS | RECORD_ONLY_KEYS
# settings a saved config may lack, with the value that behaves as a config without them: a saved
# config without one of them is read as having that value (so such runs resume)
ADDED_KEYS = {
    ("grpo", "dynamic_sampling_rounds"): 0,
    ("grpo", "score_timeout_s"): 0.0,
    ("grpo", "task_sampling"): "epoch",
    ("grpo", "micro_batch_tokens"): 0,
    ("sft", "submit_turns"): 0,
    ("sft", "checkpoint_every"): 0,
    ("sft", "init_steps"): 0,
    ("run", "eval_every"): 0,
    ("run", "eval_tasks"): 0,
    ("run", "final_dtype"): "float32",
    ("agent", "schema_sample_values"): 0,
    ("agent", "schema_order"): "file",
    ("agent", "show_evidence"): True,
    ("agent", "column_descriptions"): False,
    ("agent", "checker"): False,
    ("data", "train_paraphrases"): False,
}


def config_changes(saved: dict, mine: dict) -> tuple[list[str], list[str]]:
    """Compare two resolved configs (section -> key -> value) for a resume: (the "section.key" names
    that differ outside `MEMORY_ONLY_KEYS` and `RECORD_ONLY_KEYS`, which block it; those changes as
    "section.key: old -> new", which are allowed and should be recorded). A section present on one
    side only blocks, by its name. A key of `ADDED_KEYS` missing from `saved` counts as its listed value."""

    def old(s: str, k: str):
        sec = saved.get(s, {})
        return sec[k] if k in sec else ADDED_KEYS.get((s, k))

    changed = [(s, k) for s in mine for k in mine[s] if old(s, k) != mine[s][k]]
    changed += [(s, k) for s in saved if s in mine for k in saved[s] if k not in mine[s]]
    blocking = [f"{s}.{k}" for s, k in changed if (s, k) not in RESUMABLE_CHANGES]
    blocking += [s for s in saved if s not in mine]
    memory = [
        f"{s}.{k}: {saved.get(s, {}).get(k)} -> {mine[s].get(k)}"
        for s, k in changed
        if (s, k) in RESUMABLE_CHANGES
    ]
    return blocking, memory


def resume_overrides(saved: dict, names: list[str]) -> str:
    """`--set` arguments giving the "section.key" `names` their values in `saved` (a resolved config),
    values as TOML (JSON's strings, numbers, booleans and lists are TOML's), shell-quoted; a section name
    alone, or a key the saved config lacks or holds as null, is left out."""
    import json
    import shlex

    sets = []
    for name in names:
        s, _, k = name.partition(".")
        v = saved.get(s, {}).get(k) if k else None
        if v is not None:
            sets.append(shlex.join(["--set", f"{name}={json.dumps(v)}"]))
    return " ".join(sets) or "see its config.json"


def check_run_folder(out: Path, mine: dict, resume: bool, command: str) -> list[str]:
    """Check a run folder before training: with `resume`, its config.json must equal `mine` (the
    resolved config as JSON) except for `MEMORY_ONLY_KEYS`, whose changes are returned (as
    "section.key: old -> new"); without, the folder must be new or empty. `command` names the
    command in the error (``train``, ``sft``). Creates nothing."""
    if resume:
        if not (out / "config.json").is_file():
            raise ConfigError(f"--resume {out}: no config.json there; is this a sqlrl {command} run folder?")
        try:
            saved = read_json(out / "config.json")
        except (OSError, ValueError, RecursionError) as e:  # ValueError: bad JSON or not UTF-8
            raise ConfigError(
                f"--resume {out}: its config.json cannot be read ({e}); resume a run folder sqlrl {command} "
                "wrote, or start a new run folder"
            ) from None
        if not isinstance(saved, dict) or not all(isinstance(v, dict) for v in saved.values()):
            raise ConfigError(
                f"--resume {out}: its config.json is not a run config (a JSON object of sections); resume "
                f"a run folder sqlrl {command} wrote, or start a new run folder"
            )
        diff, memory = config_changes(saved, mine)
        if diff:
            raise ConfigError(
                f"--resume {out}: the config differs from the run's config.json in {diff}; "
                "resume with the same config file and --set overrides (the run's values: "
                f"{resume_overrides(saved, diff)}), or start a new run folder"
            )
        return memory
    if out.exists() and any(p.name != RUN_LOCK_FILE for p in out.iterdir()):
        raise ConfigError(
            f"run folder {out} is not empty; choose a new --out or pass --resume {out} "
            "(Python API: another out folder, or resume=True)"
        )
    return []


def previous_run(out: Path) -> dict:
    """The run.json of an earlier invocation ({} when there is none or it cannot be read)."""
    with contextlib.suppress(Exception):
        return read_json(out / "run.json")
    return {}


def restore_latest(
    out: Path, model, optimizer, scheduler, sampler, *, from_valid: bool = False
) -> dict | None:
    """Restore the run's newest checkpoint (weights, optimizer, scheduler, data cursor, RNG); returns its
    sidecar (`step`, `extra`, ...), or None when the run has no checkpoint. Temp folders of interrupted
    saves are deleted first. A corrupt newest checkpoint raises `CheckpointError` (one line naming the
    newest valid older one) unless `from_valid`, which restores that older one and says so."""
    from sqlrl.training.checkpoint import load_latest, remove_partial, restore_checkpoint, restore_rng

    remove_partial(out)
    info = load_latest(out, fallback=from_valid)
    if info is None:
        return None
    side = restore_checkpoint(info, model, optimizer, scheduler)
    sampler.load_state_dict(side["data_cursor"])
    restore_rng(side["rng"])
    return side


def drop_steps_after(out: Path, names: tuple[str, ...], step: int) -> None:
    """Keep only the lines of steps <= `step` in the run's JSONL files `names` (those that exist)."""
    for name in names:
        if (out / name).exists():
            kept = [r for r in read_jsonl(out / name) if r["step"] <= step]
            write_jsonl(out / name, kept)


@dataclass
class Checkpointer:
    """Saves the run's training state as `RUN/checkpoints/step_NNNNNN` (`checkpoint.save_checkpoint`)."""

    out: Path
    model: Any
    optimizer: Any
    scheduler: Any
    sampler: Any
    config_hash: str
    keep_last: int
    record: Any = None
    """`sessions.Sessions` of the run, or None: each checkpoint then records `record.extra()` (the
    training seconds so far, `extra.train_seconds`, and a GRPO run's pass caps) and tells `record.saved`."""

    def _extra(self) -> dict:
        extra = self.record.extra() if self.record is not None else {}
        self.saved_s = extra.get("train_seconds")
        return extra

    def __call__(self, step: int) -> None:
        from sqlrl.training.checkpoint import capture_rng, save_checkpoint

        save_checkpoint(
            self.out,
            step,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            rng_state=capture_rng(),
            data_cursor=self.sampler.state_dict(),
            config_hash=self.config_hash,
            extra=self._extra,
            keep_last=self.keep_last,
        )
        if self.record is not None:
            self.record.saved(step, self.saved_s)


def stop_for_time(
    deadline: float | None, last_step_s: float, last_step: int, start_step: int, every: int, save
) -> bool:
    """True when the time budget says stop before the next step; the last step is then checkpointed
    unless it already was (`every` = run.checkpoint_every) or this invocation ran no step."""
    if not out_of_time(deadline, last_step_s):
        return False
    if last_step > start_step and last_step % every != 0:
        save(last_step)
    return True


def final_dtype(cfg) -> str:
    """The dtype of a run's final weights: `run.final_dtype`, `auto` = the generation dtype."""
    from sqlrl.generation.device import device_and_dtypes

    return cfg.run.final_dtype if cfg.run.final_dtype != "auto" else device_and_dtypes(cfg)[1]


def export_final(
    model,
    tokenizer,
    out: Path,
    *,
    prune: bool | None = None,
    step: int | None = None,
    cfg=None,
    base_identity=None,
) -> dict:
    """Export the finished run's weights to `RUN/final` (LoRA merged); with `cfg` and `base_identity`,
    in `final_dtype(cfg)` and as a patch over `cfg.model.name` when smaller. With `prune` (default
    `cfg.run.prune_checkpoints_at_end`), then delete its checkpoint folders. Returns the export's identity."""
    from sqlrl.training.export import export_hf

    kw = {}
    if cfg is not None:
        kw = {"dtype": final_dtype(cfg), "base": cfg.model.name, "base_identity": base_identity}
        prune = cfg.run.prune_checkpoints_at_end if prune is None else prune
    ident = export_hf(model, tokenizer, out / "final", merge_lora=True, step=step, **kw)
    if prune:
        prune_checkpoints(out)
    return ident


def final_record(ident: dict, base_identity: str | None) -> dict:
    """{final_identity, weights_changed} of an export: changed = elements differ from the base in the
    final's dtype (a patch says how many), else the weights hash differs from the base's."""
    changed = ident.get("changed_elements")
    same = ident.get("weights_hash") == base_identity
    return {
        "final_identity": ident.get("weights_hash"),
        "weights_changed": changed > 0 if changed is not None else not same,
    }


def prune_checkpoints(out: Path) -> None:
    """Delete checkpoint folders of a finished, exported run; keep the manifest and mark it pruned."""
    import shutil

    ck = out / "checkpoints"
    if not ck.is_dir():
        return
    for d in ck.iterdir():
        if d.is_dir():
            shutil.rmtree(d, ignore_errors=True)
    mp = ck / "manifest.json"
    if mp.exists():
        m = read_json(mp)
        m["pruned"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        m["pruned_reason"] = "run finished and exported to final/; run.prune_checkpoints_at_end = true"
        write_json_atomic(mp, m)


class MetricSinks:
    """TensorBoard always (when installed); W&B / SwanLab only when the config asks for them.

    Every sink gets the same scalars (numbers, not booleans) under the same step. W&B and SwanLab runs
    are named after the run folder, carry the resolved config, and follow their own settings for
    where the data goes (e.g. WANDB_MODE=offline, SWANLAB_MODE=offline): sqlrl itself makes no
    network call. Asking for one that is not installed is a ConfigError that says what to install.
    """

    def __init__(self, cfg: Config, out_dir: Path):
        self.writers = []
        name, project = out_dir.as_posix(), cfg.run.tracker_project
        for sink in cfg.run.loggers:
            if sink == "tensorboard":
                try:
                    from torch.utils.tensorboard import SummaryWriter

                    self.writers.append(("tb", SummaryWriter(log_dir=str(out_dir / "tb"))))
                except ImportError:
                    log.warning(
                        "sqlrl: tensorboard not installed; TensorBoard logging off (pip install tensorboard)"
                    )
            elif sink == "wandb":
                wandb = import_tracker("wandb")
                run = wandb.init(project=project, name=name, dir=str(out_dir), config=cfg.resolve())
                self.writers.append(("wandb", run))
            elif sink == "swanlab":
                swanlab = import_tracker("swanlab")
                run = swanlab.init(project=project, name=name, log_dir=str(out_dir), config=cfg.resolve())
                self.writers.append(("swanlab", run))

    def log(self, metrics: dict, step: int) -> None:
        scalars = {k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        for kind, w in self.writers:
            if kind == "tb":
                for k, v in scalars.items():
                    w.add_scalar(f"train/{k}", v, step)
                w.flush()
            elif kind == "wandb":
                w.log(scalars, step=step)
            elif kind == "swanlab":
                w.log(scalars, step=step)

    def close(self) -> None:
        for kind, w in self.writers:
            with contextlib.suppress(Exception):
                w.close() if kind == "tb" else w.finish()


def import_tracker(name: str):
    """The tracker package `name` (wandb, swanlab), or a ConfigError that says how to install it."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise ConfigError(
            f"run.loggers asks for {name} but it is not installed: pip install {name} "
            f"(or pip install 'sqlrl[trackers]'), or remove it from run.loggers"
        ) from None


def gpu_telemetry() -> dict:
    """Peak allocated and reserved GPU memory since the last call (then reset) and utilisation; {} off CUDA."""
    try:
        import torch

        if not torch.cuda.is_available():
            return {}
        out = {
            "gpu_mem_gb": round(torch.cuda.max_memory_allocated() / 2**30, 3),
            "gpu_mem_reserved_gb": round(torch.cuda.memory_reserved() / 2**30, 3),
        }
        with contextlib.suppress(Exception):
            out["gpu_util"] = float(torch.cuda.utilization())
        torch.cuda.reset_peak_memory_stats()
        return out
    except Exception:
        return {}
