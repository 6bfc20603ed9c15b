"""Free disk for an experiment folder, checked before any arm runs.

`exp` is an `experiment.matrix.ExperimentConfig` (not imported here: matrix imports this module).

What is covered: `disk_needed` (the folder's peak: stored finals in their dtype, grpo_sft's SFT start,
the checkpoints training keeps, logs), `check_free_disk` (one-line ConfigError when the disk holding
the folder cannot take it; what the folder already holds counts as written), `model_parameters` (from
a local model folder's manifest or safetensors headers).
What is not: a hub model not yet downloaded (its size is unknown: the check is skipped with a warning);
other writers on the same disk while the experiment runs.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from sqlrl.artifacts import read_json
from sqlrl.config import Config, ConfigError

log = logging.getLogger(__name__)

GB = 1e9
DISK_MARGIN = 200_000_000  # evaluation and training logs, report, leakage replicas


def model_parameters(path: Path) -> int | None:
    """Parameter count of a local model folder (its cache manifest, else its safetensors headers)."""
    manifest = path / "manifest.json"
    if manifest.is_file() and read_json(manifest).get("parameter_count"):
        return int(read_json(manifest)["parameter_count"])
    files = sorted(path.glob("*.safetensors"))
    if not files:
        return None
    from safetensors import safe_open

    n = 0
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():
                shape = h.get_slice(k).get_shape()
                n += math.prod(shape)
    return n


def disk_needed(cfg: Config, exp: Any, params: int) -> tuple[int, str]:
    """(bytes, how) the experiment folder needs at its peak: the final weights of every trained arm but
    No-update (stored as hashes) at their dense size in the final dtype (bfloat16 when generation is
    bfloat16 for sure: `model.dtype` or a CUDA `run.device`; a patch over the base is smaller; grpo_sft's
    SFT stage or the sft arm's branch one more), plus the checkpoints (float32 weights + AdamW state)
    training keeps."""
    start = "grpo_sft" in exp.arms and exp.sft.init_steps > 0  # grpo_sft's SFT stage (one more run) or branch
    own_stage = start and exp.sft.init_from == "stage"
    cells = len(exp.cells())
    stored = (
        sum(1 for k in exp.arms if k in ("grpo", "validity", "sft", "grpo_sft", "grpo_checker")) + start
    ) * cells
    trained = (sum(1 for k in exp.arms if k != "base") + own_stage) * cells
    g, r = cfg.grpo, cfg.run
    half = r.final_dtype == "auto" and (
        cfg.model.dtype == "bfloat16" or (cfg.model.dtype == "auto" and r.device == "cuda")
    )
    weights, ckpt = (2 if half else 4) * params, 12 * params
    n_ckpt = sum(1 for s in range(1, g.steps) if s % r.checkpoint_every == 0)
    n_ckpt += 0 if r.prune_checkpoints_at_end else 1
    kept = min(n_ckpt, r.keep_checkpoints)
    # while an arm trains: the finals before it, its checkpoints (one more while a new one is written)
    peak_ckpt = ckpt * min(n_ckpt, kept + 1)
    left_behind = 0 if r.prune_checkpoints_at_end else ckpt * kept * (trained - 1)  # earlier arms
    need = stored * weights + peak_ckpt + left_behind + DISK_MARGIN
    how = (
        f"{stored} stored arm(s) x at most {weights / GB:.1f} GB {'bfloat16' if half else 'float32'} weights"
        + (f", checkpoints {(peak_ckpt + left_behind) / GB:.1f} GB" if peak_ckpt + left_behind else "")
        + f", {DISK_MARGIN / GB:.1f} GB logs"
    )
    return need, how


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def check_free_disk(cfg: Config, exp: Any, out: Path) -> None:
    """ConfigError (one line: needed and free) when the disk holding `out` cannot take the experiment;
    what `out` already holds (a resumed run) counts as written. Skipped for a hub model not yet
    downloaded (its size is unknown)."""
    import shutil

    from sqlrl.generation.models import resolve_model

    resolved = resolve_model(cfg.model.name)
    params = model_parameters(Path(resolved.path)) if resolved.kind != "hub" else None
    if params is None:
        log.warning(f"[experiment] free-disk check skipped: the size of {cfg.model.name} is unknown here")
        return
    need, how = disk_needed(cfg, exp, params)
    need -= folder_bytes(out)
    anchor = out
    while not anchor.exists():
        anchor = anchor.parent
    free = shutil.disk_usage(anchor).free
    if need > free:
        raise ConfigError(
            f"not enough free disk for {out}: the experiment needs {need / GB:.1f} GB more ({how}), "
            f"{free / GB:.1f} GB are free on that disk; free space or pass --out on a larger disk"
        )
