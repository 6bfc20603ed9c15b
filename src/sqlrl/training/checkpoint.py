"""Atomic training checkpoints with verifiable sidecars, resume, and Hugging Face export.

Layout of one checkpoint (``RUN/checkpoints/step_000010/``)::

    model.safetensors            full fine-tune: the model state dict (tied aliases stored once)
    config.json                  full fine-tune: the model config (so `sqlrl export` can rebuild it)
    adapter_model.safetensors    LoRA (peft): only the adapter weights, in peft's own format
    adapter_config.json          LoRA (peft): the adapter config (the folder is a loadable peft adapter)
    optimizer.pt                 torch.save(optimizer.state_dict())       (if an optimizer was given)
    scheduler.pt                 torch.save(scheduler.state_dict())       (if a scheduler was given)
    rng.pt                       torch.save(capture_rng()-style dict)
    tokenizer/                   tokenizer.save_pretrained(...)           (if a tokenizer was given)
    sidecar.json                 written LAST: step, weights_hash, files {name: {sha256, bytes}}, ...

``RUN/checkpoints/manifest.json`` lists the complete checkpoints (step, path, weights_hash, created).

Guaranteed:
- A checkpoint folder named ``step_NNNNNN`` only appears through one ``os.replace`` of a fully
  written, fsynced temporary folder (``.step_NNNNNN.tmp-<pid>``) whose ``sidecar.json`` was written
  last. A kill at any moment leaves either the previous state or a dot-prefixed temp folder, which
  `load_latest` ignores and reports under ``partial``.
- `load_latest` never loads silently: every file listed in the sidecar must be present with the
  recorded size and (with ``verify=True``) sha256. If the newest checkpoint is corrupt it raises
  `CheckpointError` naming the folder and the problem, unless ``fallback=True``, which logs a warning
  naming it and uses the newest valid older one (reported in ``CheckpointInfo.skipped``).
- `restore_checkpoint` recomputes ``models.weights_hash`` of the model after loading and raises on a
  mismatch with the sidecar (this also catches a LoRA checkpoint restored onto the wrong base model or
  in a different dtype).
- `export_hf` merges LoRA on a copy and keeps the original bits wherever the merge left a value
  numerically unchanged (so a zero adapter merges to bit-identical base weights, signed zeros included).
- `export_hf` writes to a temp folder and renames it into place; ``identity.json`` holds the
  weights hash of exactly the model that was saved, and reloading the folder with
  ``AutoModelForCausalLM.from_pretrained`` gives the same ``weights_hash`` (tested on tiny models).

Not guaranteed:
- Durability against power loss on file systems that ignore fsync, or on network file systems where
  ``os.replace`` of a folder is not atomic.
- Bit-exact resume of GPU kernels: RNG state is restored (python, numpy, torch CPU and CUDA), but
  non-deterministic CUDA kernels can still make a resumed run diverge from an uninterrupted one.
- A LoRA checkpoint stores only the adapter: restoring or exporting it needs the same base model
  (same weights and dtype); the weights-hash check fails loudly when it is not.
- Pruning (``keep_last``) deletes older folders; it never deletes the checkpoint just written, nor
  the newest one.
"""

from __future__ import annotations

import copy
import logging
import os
import random
import re
import shutil
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


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
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


def _files_record(folder: Path, exclude: tuple[str, ...] = (SIDECAR,)) -> dict[str, dict]:
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
        _fsync_dir(d)
    return out


def _is_peft(model: Any) -> bool:
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


def _model_dtype(model: Any) -> str | None:
    for p in model.parameters():
        return str(p.dtype).removeprefix("torch.")
    return None


def _replace_dir(tmp: Path, final: Path) -> None:
    """Move a finished temp folder to its final name; an existing final folder is moved aside first."""
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
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
    extra: dict | None = None,
    keep_last: int | None = 2,
    tokenizer: Any = None,
) -> Path:
    """Write ``run_dir/checkpoints/step_{step:06d}/`` atomically and return its path.

    ``rng_state`` defaults to `capture_rng()` taken now. ``keep_last`` (>= 1, or None/0 to keep all)
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
        model_info: dict[str, Any] = {"class": type(model).__name__, "dtype": _model_dtype(model)}
        if _is_peft(model):
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
            "files": _files_record(tmp),
            "optimizer": optimizer is not None,
            "optimizer_class": type(optimizer).__name__ if optimizer is not None else None,
            "scheduler": scheduler is not None,
            "scheduler_class": type(scheduler).__name__ if scheduler is not None else None,
            "tokenizer": tokenizer is not None,
            "rng": {"file": "rng.pt", "keys": sorted(rng), "cuda": rng.get("torch_cuda") is not None},
            "data_cursor": dict(data_cursor or {}),
            "config_hash": config_hash,
            "extra": dict(extra or {}),
            "created": _now(),
            "pid": os.getpid(),
        }
        write_json_atomic(tmp / SIDECAR, sidecar)
        _fsync_dir(tmp)
        _replace_dir(tmp, final)
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
        log.info("pruned checkpoint %s", p)


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
            "updated": _now(),
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

    A corrupt newest checkpoint raises `CheckpointError` (path + problem) unless ``fallback=True``,
    which logs a warning naming it and continues with older ones. If checkpoint folders exist but
    none is valid, `CheckpointError` is raised in both modes.
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
            return CheckpointInfo(step=step, path=path, sidecar=sc, partial=partial, skipped=skipped)
        msg = f"corrupt checkpoint {path}: " + "; ".join(problems)
        if not fallback:
            raise CheckpointError(msg)
        log.warning("%s -- falling back to an older checkpoint", msg)
        skipped.append({"path": str(path), "step": step, "problems": problems})
    if skipped:
        raise CheckpointError(
            "no valid checkpoint in "
            + str(ckdir)
            + ": "
            + "; ".join(f"{s['path']}: {s['problems']}" for s in skipped)
        )
    return None


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
        if not _is_peft(model):
            raise CheckpointError(f"{info.path} holds a LoRA adapter but the model is not a peft model")
        from peft.utils import set_peft_model_state_dict

        adapter = (sc.get("model") or {}).get("adapter_name", "default")
        res = set_peft_model_state_dict(model, sd, adapter_name=adapter)
        unexpected = list(getattr(res, "unexpected_keys", []) or [])
        if unexpected:
            raise CheckpointError(f"{info.path}: adapter tensors not in the model: {unexpected[:5]}")
    else:
        if _is_peft(model):
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


# ----------------------------------------------------------------------------------------- export


def export_hf(
    model: Any,
    tokenizer: Any,
    out_dir: str | os.PathLike,
    *,
    merge_lora: bool = True,
    source_checkpoint: str | os.PathLike | None = None,
    step: int | None = None,
    source_weights_hash: str | None = None,
) -> dict:
    """Save ``model`` (+ tokenizer) in Hugging Face format (safetensors) to ``out_dir`` atomically,
    with ``identity.json`` = {weights_hash, source_checkpoint, step, ...}; returns the identity.

    A peft model with ``merge_lora=True`` is merged on a deep copy (``merge_and_unload``), so the
    model passed in keeps its adapter and can continue training unchanged; the copy costs one extra
    model in memory on the model's device. ``merge_lora=False`` on a peft model saves only the
    adapter (peft format), which needs the base model to load.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    to_save = model
    merged = False
    if _is_peft(model):
        source_weights_hash = source_weights_hash or _weights_hash(model)
        if merge_lora:
            to_save = copy.deepcopy(model).merge_and_unload()
            _keep_unchanged_bits(to_save, model)
            merged = True
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        to_save.save_pretrained(str(tmp))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        identity = {
            "format_version": FORMAT_VERSION,
            "weights_hash": _weights_hash(to_save),
            "source_checkpoint": str(source_checkpoint) if source_checkpoint is not None else None,
            "step": step,
            "source_weights_hash": source_weights_hash,
            "lora_merged": merged,
            "adapter_only": _is_peft(to_save),
            "model_class": type(to_save).__name__,
            "dtype": _model_dtype(to_save),
            "created": _now(),
        }
        identity["files"] = _files_record(tmp, exclude=(IDENTITY,))
        write_json_atomic(tmp / IDENTITY, identity)
        _fsync_dir(tmp)
        _replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if merged:
            del to_save
    return identity


def _keep_unchanged_bits(merged: Any, peft_model: Any) -> None:
    """Where merging left a weight numerically unchanged, restore the original bits. IEEE arithmetic
    turns -0.0 + 0.0 into +0.0, so merging an all-zero adapter (e.g. a LoRA whose B stayed 0 under
    lr=0) would otherwise look like a weight change to a bit-level audit."""
    import torch

    orig = {k.replace(".base_layer.", "."): v for k, v in peft_model.get_base_model().state_dict().items()}
    with torch.no_grad():
        for name, t in merged.state_dict().items():
            o = orig.get(name)
            if o is None or o.shape != t.shape or o.dtype != t.dtype or o.data_ptr() == t.data_ptr():
                continue
            o = o.to(t.device)
            t.copy_(torch.where(t == o, o, t))


def _dtype_of(name: str | None):
    import torch

    return getattr(torch, name) if name else None


def model_from_checkpoint(
    info: CheckpointInfo, *, base: str | None = None, device: str = "cpu"
) -> tuple[Any, Any]:
    """(model, tokenizer or None) rebuilt from a checkpoint, weights hash checked.
    Full checkpoints rebuild from their config.json; LoRA checkpoints need ``base``."""
    sc = info.sidecar
    dtype = _dtype_of((sc.get("model") or {}).get("dtype"))
    tokenizer = None
    if (info.path / "tokenizer").is_dir():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(info.path / "tokenizer"))
    if info.is_lora:
        if not base:
            raise CheckpointError(f"{info.path} is a LoRA adapter checkpoint: pass the base model (--base)")
        from peft import PeftModel

        from sqlrl.generation.models import load_model

        loaded = load_model(base, device=device, dtype=dtype)
        tokenizer = tokenizer or loaded.tokenizer
        model = PeftModel.from_pretrained(loaded.model, str(info.path), is_trainable=False)
        got = _weights_hash(model)
        if got != sc["weights_hash"]:
            raise CheckpointError(
                f"{info.path}: base {base!r} + adapter gives weights hash {got} != sidecar {sc['weights_hash']} "
                "(wrong base model or dtype?)"
            )
        return model, tokenizer
    if not (info.path / "config.json").is_file():
        raise CheckpointError(f"{info.path}: full checkpoint without config.json cannot be rebuilt")
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(info.path))
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    restore_checkpoint(info, model, restore_rng_state=False)
    if tokenizer is None and base:
        from transformers import AutoTokenizer

        try:
            from sqlrl.generation.models import resolve_model

            base_path = resolve_model(base)
            base_path = getattr(base_path, "path", base_path)
        except Exception:  # noqa: BLE001 -- fall back to the literal name/path
            base_path = base
        tokenizer = AutoTokenizer.from_pretrained(str(base_path))
    return model.to(device), tokenizer
