"""Atomic training checkpoints with verifiable sidecars, and resume (Hugging Face export: `export.py`).

One checkpoint, ``RUN/checkpoints/step_000010/``: model.safetensors + config.json (full fine-tune; tied
aliases stored once) or adapter_model.safetensors + adapter_config.json (LoRA, peft format);
optimizer.pt, scheduler.pt, rng.pt (torch.save), tokenizer/ (when given), and sidecar.json, written
last: step, weights_hash, files {name: {sha256, bytes}}, data cursor, config hash.
``RUN/checkpoints/manifest.json`` lists the complete checkpoints (step, path, weights_hash, created).

What is covered:
- A folder named ``step_NNNNNN`` only appears through one ``os.replace`` of a fully written, fsynced
  temp folder (``.step_NNNNNN.tmp-<pid>``); a kill leaves the previous state or dot-prefixed folders
  (``.NAME.tmp|old|del-<pid>``), which `load_latest` ignores and `remove_partial` (on resume) removes.
- `load_latest` never loads silently: every file in the sidecar must have the recorded size and (with
  ``verify=True``) sha256; a corrupt newest checkpoint raises `CheckpointError` naming it and the newest
  valid older one, unless ``fallback=True`` (one warning naming both, then that older one, listed in
  ``CheckpointInfo.skipped``).
- `restore_checkpoint` recomputes the weights hash after loading and raises on a mismatch (this also
  catches a LoRA checkpoint restored onto the wrong base model or dtype).
- Pruning (``keep_last``) never deletes the checkpoint just written, nor the newest one.

What is not:
- Durability against power loss where fsync is ignored, or where ``os.replace`` of a folder is not atomic.
- Bit-exact resume of GPU kernels: RNG states are restored (python, numpy, torch CPU and CUDA), but
  non-deterministic CUDA kernels can still make a resumed run diverge.
- A LoRA checkpoint without its base model (same weights and dtype).
"""

from __future__ import annotations

import copy
import logging
import os
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlrl.artifacts import read_json, sha256_file, write_json_atomic

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
SIDECAR = "sidecar.json"
MANIFEST = "manifest.json"
FULL_WEIGHTS = "model.safetensors"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
IDENTITY = "identity.json"
_STEP_RE = re.compile(r"^step_(\d{6,})$")
_TMP_RE = re.compile(r"^\.step_(\d{6,})\.tmp-\d+$")
_LEFTOVER_RE = re.compile(r"^\.(step_\d{6,})\.(tmp|old|del)-\d+$")  # interrupted save / replace / prune


class CheckpointError(RuntimeError):
    """A checkpoint is missing, partial, corrupt or does not match the model it is restored into."""


@dataclass
class CheckpointInfo:
    step: int
    path: Path
    sidecar: dict
    partial: list[Path] = field(default_factory=list)  # temp folders of interrupted saves
    skipped: list[dict] = field(default_factory=list)  # corrupt newer checkpoints skipped (fallback=True)

    @property
    def weights_hash(self) -> str:
        return self.sidecar["weights_hash"]

    @property
    def is_lora(self) -> bool:
        return self.sidecar.get("weights_kind") == "lora_adapter"


# --------------------------------------------------------------------------------------------- rng


def capture_rng() -> dict:
    """Python, numpy, torch CPU and (if initialised) torch CUDA generator states, torch.save-safe."""
    import numpy as np
    import torch

    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)),
        "torch_cpu": torch.get_rng_state(),
        "torch_cuda": None,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    """Inverse of `capture_rng`. CUDA states are restored only when CUDA is available."""
    import numpy as np
    import torch

    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)))
    torch.set_rng_state(state["torch_cpu"].cpu())
    if state.get("torch_cuda") is not None:
        if torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.cpu() for s in state["torch_cuda"]])
        else:
            log.warning("checkpoint has CUDA RNG state but CUDA is not available; not restored")


# ----------------------------------------------------------------------------------------- helpers


def utc_now() -> str:
    """The current UTC time, ISO 8601 to the second (the `created` stamps)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """fsync a folder (its entries), where the platform allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def files_record(folder: Path, exclude: tuple[str, ...] = (SIDECAR,)) -> dict[str, dict]:
    """{relative posix name: {sha256, bytes}} for every regular file under folder (fsyncs them)."""
    out: dict[str, dict] = {}
    for p in sorted(folder.rglob("*")):
        if not p.is_file():
            continue
        rel = p.relative_to(folder).as_posix()
        if rel in exclude:
            continue
        _fsync_file(p)
        out[rel] = {"sha256": sha256_file(p), "bytes": p.stat().st_size}
    for d in sorted({p.parent for p in folder.rglob("*")} | {folder}):
        fsync_dir(d)
    return out


def is_peft(model: Any) -> bool:
    """The model is a peft (LoRA) wrapper."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def _weights_hash(model_or_sd: Any) -> str:
    from sqlrl.generation.models import weights_hash

    return weights_hash(model_or_sd)


def _dedup_aliases(sd: dict) -> tuple[dict, dict[str, str]]:
    """Tensors that are the same storage view (tied weights) are stored once: returns
    (tensors to save, {alias name: canonical name}). Other shared storage is cloned."""
    seen: dict[tuple, str] = {}
    storages: set[int] = set()
    out: dict = {}
    aliases: dict[str, str] = {}
    for name, t in sd.items():
        t = t.detach()
        ptr = t.untyped_storage().data_ptr()
        key = (ptr, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype, t.device)
        if key in seen and t.numel() > 0:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        if ptr in storages or not t.is_contiguous():
            t = t.contiguous().clone()
        else:
            storages.add(ptr)
        out[name] = t.cpu()
    return out, aliases


def _expand_aliases(sd: dict, aliases: dict[str, str]) -> dict:
    for alias, canon in aliases.items():
        if canon in sd and alias not in sd:
            sd[alias] = sd[canon]
    return sd


def model_dtype(model: Any) -> str | None:
    """The dtype of the model's first parameter, as a torch attribute name ("float32")."""
    for p in model.parameters():
        return str(p.dtype).removeprefix("torch.")
    return None


def replace_dir(tmp: Path, final: Path) -> None:
    """Move a finished temp folder to its final name; an existing final folder is moved aside first."""
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------------------------- save


def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    *,
    model: Any,
    optimizer: Any = None,
    scheduler: Any = None,
    rng_state: dict | None = None,
    data_cursor: dict | None = None,
    config_hash: str = "",
    extra: dict | Callable[[], dict] | None = None,
    keep_last: int | None = 2,
    tokenizer: Any = None,
) -> Path:
    """Write ``run_dir/checkpoints/step_{step:06d}/`` atomically and return its path.

    ``rng_state`` defaults to `capture_rng()` taken now. ``extra`` (sidecar ``extra``) may be a callable,
    called after the files are written, just before the sidecar (so that it can count the save's own
    time). ``keep_last`` (>= 1, or None/0 to keep all)
    prunes older complete checkpoints after the save; the one just written is always kept.
    """
    import torch
    from safetensors.torch import save_file

    step = int(step)
    if step < 0:
        raise ValueError("step must be >= 0")
    ckdir = Path(run_dir) / "checkpoints"
    ckdir.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    final = ckdir / name
    tmp = ckdir / f".{name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        model_info: dict[str, Any] = {"class": type(model).__name__, "dtype": model_dtype(model)}
        if is_peft(model):
            from peft.utils import get_peft_model_state_dict

            adapter = getattr(model, "active_adapter", "default")
            if not isinstance(adapter, str):
                adapter = adapter[0]
            sd = get_peft_model_state_dict(model, adapter_name=adapter, save_embedding_layers=False)
            tensors, aliases = _dedup_aliases(sd)
            save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
            model.peft_config[adapter].save_pretrained(str(tmp))
            weights_kind = "lora_adapter"
            base = model.get_base_model()
            model_info.update(
                adapter_name=adapter,
                base_class=type(base).__name__,
                base_name_or_path=getattr(getattr(base, "config", None), "name_or_path", None),
            )
        else:
            tensors, aliases = _dedup_aliases(model.state_dict())
            save_file(tensors, str(tmp / FULL_WEIGHTS), metadata={"format": "pt"})
            cfg = getattr(model, "config", None)
            if cfg is not None and hasattr(cfg, "to_json_string"):
                (tmp / "config.json").write_text(cfg.to_json_string(), encoding="utf-8")
            weights_kind = "full"
        del tensors
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        if scheduler is not None:
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        rng = capture_rng() if rng_state is None else rng_state
        torch.save(rng, tmp / "rng.pt")
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp / "tokenizer"))

        sidecar = {
            "format_version": FORMAT_VERSION,
            "step": step,
            "weights_hash": _weights_hash(model),
            "weights_kind": weights_kind,
            "weights_file": ADAPTER_WEIGHTS if weights_kind == "lora_adapter" else FULL_WEIGHTS,
            "aliases": aliases,
            "model": model_info,
            "files": files_record(tmp),
            "optimizer": optimizer is not None,
            "optimizer_class": type(optimizer).__name__ if optimizer is not None else None,
            "scheduler": scheduler is not None,
            "scheduler_class": type(scheduler).__name__ if scheduler is not None else None,
            "tokenizer": tokenizer is not None,
            "rng": {"file": "rng.pt", "keys": sorted(rng), "cuda": rng.get("torch_cuda") is not None},
            "data_cursor": dict(data_cursor or {}),
            "config_hash": config_hash,
            "extra": dict((extra() if callable(extra) else extra) or {}),
            "created": utc_now(),
            "pid": os.getpid(),
        }
        write_json_atomic(tmp / SIDECAR, sidecar)
        fsync_dir(tmp)
        replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    if keep_last:
        _prune(ckdir, keep_last=max(1, int(keep_last)), keep_step=step)
    _write_manifest(ckdir)
    return final


def _complete_dirs(ckdir: Path) -> list[tuple[int, Path]]:
    out = []
    if not ckdir.is_dir():
        return out
    for p in ckdir.iterdir():
        m = _STEP_RE.match(p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p))
    return sorted(out, reverse=True)


def _prune(ckdir: Path, *, keep_last: int, keep_step: int) -> None:
    dirs = [(s, p) for s, p in _complete_dirs(ckdir) if (p / SIDECAR).is_file()]
    keep = {s for s, _ in dirs[:keep_last]} | {keep_step}
    if dirs:
        keep.add(dirs[0][0])  # never the newest
    for s, p in dirs:
        if s in keep:
            continue
        trash = ckdir / f".{p.name}.del-{os.getpid()}"
        os.replace(p, trash)  # atomic: a half-deleted folder never looks like a checkpoint
        shutil.rmtree(trash, ignore_errors=True)
        log.debug("pruned checkpoint %s", p)


def _write_manifest(ckdir: Path) -> None:
    entries = []
    for s, p in sorted(_complete_dirs(ckdir)):
        try:
            sc = read_json(p / SIDECAR)
        except (OSError, ValueError):
            continue
        entries.append(
            {
                "step": s,
                "path": p.name,
                "weights_hash": sc.get("weights_hash"),
                "weights_kind": sc.get("weights_kind"),
                "created": sc.get("created"),
            }
        )
    write_json_atomic(
        ckdir / MANIFEST,
        {
            "format_version": FORMAT_VERSION,
            "checkpoints": entries,
            "latest": entries[-1]["step"] if entries else None,
            "updated": utc_now(),
        },
    )


# ------------------------------------------------------------------------------------------- load


def validate_checkpoint(path: str | os.PathLike, *, verify: bool = True) -> tuple[dict | None, list[str]]:
    """(sidecar or None, problems). No problems means every listed file is present with the recorded
    size and (verify=True) sha256."""
    path = Path(path)
    problems: list[str] = []
    sc_path = path / SIDECAR
    if not path.is_dir():
        return None, [f"not a folder: {path}"]
    if not sc_path.is_file():
        return None, ["missing sidecar.json (interrupted or tampered save)"]
    try:
        sc = read_json(sc_path)
    except (OSError, ValueError) as e:
        return None, [f"sidecar.json is not valid JSON ({e})"]
    for key in ("step", "weights_hash", "files", "format_version"):
        if not isinstance(sc, dict) or key not in sc:
            return None, [f"sidecar.json lacks {key!r}"]
    if sc["format_version"] > FORMAT_VERSION:
        problems.append(
            f"sidecar format_version {sc['format_version']} is newer than supported {FORMAT_VERSION}"
        )
    m = _STEP_RE.match(path.name)
    if m and int(m.group(1)) != sc["step"]:
        problems.append(f"folder name says step {int(m.group(1))} but sidecar says step {sc['step']}")
    weights_file = sc.get("weights_file")
    if weights_file and weights_file not in sc["files"]:
        problems.append(f"weights file {weights_file} not listed in sidecar")
    for name, rec in sc["files"].items():
        fp = path / name
        if not fp.is_file():
            problems.append(f"missing file {name}")
            continue
        size = fp.stat().st_size
        if size != rec["bytes"]:
            problems.append(f"{name}: size {size} != recorded {rec['bytes']} (truncated?)")
            continue
        if verify:
            digest = sha256_file(fp)
            if digest != rec["sha256"]:
                problems.append(f"{name}: sha256 {digest[:16]}... != recorded {rec['sha256'][:16]}...")
    return sc, problems


def load_latest(
    run_dir: str | os.PathLike, *, verify: bool = True, fallback: bool = False
) -> CheckpointInfo | None:
    """The newest valid checkpoint of a run, or None if the run has no checkpoint folders.

    A corrupt newest checkpoint raises `CheckpointError` in one line (its path and problems, and the
    newest valid older checkpoint, if any) unless ``fallback=True``, which logs that line as a warning
    and returns the newest valid older checkpoint. If checkpoint folders exist but none is valid,
    `CheckpointError` is raised in both modes.
    """
    ckdir = Path(run_dir) / "checkpoints"
    if not ckdir.is_dir():
        return None
    partial = sorted(p for p in ckdir.iterdir() if _TMP_RE.match(p.name))
    for p in partial:
        log.warning("ignoring partial checkpoint %s (interrupted save)", p)
    skipped: list[dict] = []
    for step, path in _complete_dirs(ckdir):
        sc, problems = validate_checkpoint(path, verify=verify)
        if not problems:
            if skipped:
                bad = "; ".join(
                    f"corrupt checkpoint {s['path']}: {'; '.join(s['problems'])}" for s in skipped
                )
                if not fallback:
                    raise CheckpointError(
                        f"{bad}; the newest valid older checkpoint is {path} (step {step}): resume from it "
                        "with --resume-from-valid (fallback=True), or repair or remove the corrupt one"
                    )
                log.warning(
                    "%s; resuming from the newest valid older checkpoint %s (step %d)", bad, path, step
                )
            return CheckpointInfo(step=step, path=path, sidecar=sc, partial=partial, skipped=skipped)
        skipped.append({"path": str(path), "step": step, "problems": problems})
    if skipped:
        raise CheckpointError(
            "no valid checkpoint in "
            + str(ckdir)
            + ": "
            + "; ".join(f"{s['path']}: {s['problems']}" for s in skipped)
        )
    return None


def remove_partial(run_dir: str | os.PathLike) -> list[str]:
    """Delete the folders that killed saves and prunes left in the run's checkpoints folder and return
    their names: ``.step_NNNNNN.tmp-<pid>`` (a save not yet renamed), ``.step_NNNNNN.del-<pid>`` (a pruned
    checkpoint not yet deleted) and ``.step_NNNNNN.old-<pid>`` (the folder a re-save of the same step
    moved aside). An ``.old`` folder whose ``step_NNNNNN`` is absent (killed between the two renames of
    `replace_dir`) is moved back instead, so the previous state stays. ``step_NNNNNN`` folders are never
    touched. Call it only while no other process saves into the run."""
    ckdir = Path(run_dir) / "checkpoints"
    if not ckdir.is_dir():
        return []
    removed = []
    for p in sorted(ckdir.iterdir()):
        m = _LEFTOVER_RE.match(p.name)
        if not m or not p.is_dir() or p.is_symlink():
            continue
        final = ckdir / m.group(1)
        if m.group(2) == "old" and not os.path.lexists(final):
            os.replace(p, final)
            fsync_dir(ckdir)
            log.warning("moved %s back to %s (a re-save of that step was interrupted)", p, final)
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p.name)
    if removed:
        log.warning(
            "removed %d interrupted checkpoint save(s) in %s: %s", len(removed), ckdir, ", ".join(removed)
        )
    return removed


def open_checkpoint(path: str | os.PathLike, *, verify: bool = True) -> CheckpointInfo:
    """A single checkpoint folder (``.../step_000010``) as `CheckpointInfo`, validated."""
    path = Path(path)
    sc, problems = validate_checkpoint(path, verify=verify)
    if problems:
        raise CheckpointError(f"corrupt checkpoint {path}: " + "; ".join(problems))
    return CheckpointInfo(step=int(sc["step"]), path=path, sidecar=sc)


def load_checkpoint_tensors(info: CheckpointInfo) -> dict:
    """The saved weights (full state dict with tied aliases restored, or the adapter state dict)."""
    from safetensors.torch import load_file

    sd = load_file(str(info.path / info.sidecar["weights_file"]))
    return _expand_aliases(sd, info.sidecar.get("aliases") or {})


def restore_checkpoint(
    info: CheckpointInfo,
    model: Any,
    optimizer: Any = None,
    scheduler: Any = None,
    *,
    restore_rng_state: bool = True,
) -> dict:
    """Load weights (+ optimizer, scheduler) into the given objects, check the weights hash, and
    (by default) restore the RNG states. Returns the sidecar with ``rng`` replaced by the loaded RNG
    state dict; ``data_cursor`` and ``step`` are as saved."""
    import torch

    sc = info.sidecar
    sd = load_checkpoint_tensors(info)
    if info.is_lora:
        if not is_peft(model):
            raise CheckpointError(f"{info.path} holds a LoRA adapter but the model is not a peft model")
        from peft.utils import set_peft_model_state_dict

        adapter = (sc.get("model") or {}).get("adapter_name", "default")
        res = set_peft_model_state_dict(model, sd, adapter_name=adapter)
        unexpected = list(getattr(res, "unexpected_keys", []) or [])
        if unexpected:
            raise CheckpointError(f"{info.path}: adapter tensors not in the model: {unexpected[:5]}")
    else:
        if is_peft(model):
            raise CheckpointError(f"{info.path} holds full weights but the model is a peft model")
        try:
            model.load_state_dict(sd, strict=True)
        except RuntimeError as e:
            raise CheckpointError(f"{info.path}: weights do not fit the model: {e}") from e
    del sd
    got = _weights_hash(model)
    if got != sc["weights_hash"]:
        raise CheckpointError(
            f"{info.path}: weights hash after restore {got} != sidecar {sc['weights_hash']}"
            + (" (LoRA: is the base model the same weights and dtype?)" if info.is_lora else "")
        )
    if optimizer is not None:
        if not sc.get("optimizer"):
            raise CheckpointError(f"{info.path}: no optimizer state saved")
        optimizer.load_state_dict(
            torch.load(info.path / "optimizer.pt", map_location="cpu", weights_only=True)
        )
    if scheduler is not None:
        if not sc.get("scheduler"):
            raise CheckpointError(f"{info.path}: no scheduler state saved")
        scheduler.load_state_dict(
            torch.load(info.path / "scheduler.pt", map_location="cpu", weights_only=True)
        )
    rng = torch.load(info.path / "rng.pt", map_location="cpu", weights_only=True)
    if restore_rng_state:
        restore_rng(rng)
    out = copy.deepcopy(sc)
    out["rng"] = rng
    return out
