"""Hugging Face export of a trained model or a sqlrl checkpoint, with identity.json.

What is covered:
- `export_hf` writes to a temp folder and renames it into place; ``identity.json`` holds the weights
  hash of exactly the model that was saved, and reloading the folder with
  ``AutoModelForCausalLM.from_pretrained`` gives the same ``weights_hash`` (tested on tiny models).
- LoRA is merged on a copy (the model passed in keeps its adapter), and the original bits are kept
  wherever the merge left a value numerically unchanged (a zero adapter merges to bit-identical base
  weights, signed zeros included).
- `model_from_checkpoint` rebuilds a model from a checkpoint and checks its weights hash.
- `export_unchanged` records, for a run whose weights ended bit-identical to its base (the No-update
  control), only ``identity.json`` with the hash of every tensor (no second copy of the weights);
  `final_weights` says which folder then holds them (the base) and the weight audit re-checks every
  tensor hash against the base.

What is not: loading a LoRA checkpoint without its base model (same weights and dtype), which the
weights-hash check refuses loudly.
"""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path
from typing import Any

from sqlrl.artifacts import write_json_atomic
from sqlrl.training.checkpoint import (
    FORMAT_VERSION,
    IDENTITY,
    CheckpointError,
    CheckpointInfo,
    files_record,
    fsync_dir,
    is_peft,
    model_dtype,
    replace_dir,
    restore_checkpoint,
    utc_now,
)


def _weights_hash(model_or_sd: Any) -> str:
    from sqlrl.generation.models import weights_hash

    return weights_hash(model_or_sd)


def tensor_hashes(model_or_sd: Any) -> tuple[dict[str, dict], dict[str, str]]:
    """({name: {dtype, shape, sha256}} of the raw bytes of every tensor, {alias: canonical name}) of a
    model's state dict; tied weights (the same storage view) are hashed once, under their first name."""
    import hashlib

    sd = model_or_sd.state_dict() if hasattr(model_or_sd, "state_dict") else model_or_sd
    seen: dict[tuple, str] = {}
    out: dict[str, dict] = {}
    aliases: dict[str, str] = {}
    for name, t in sd.items():
        t = t.detach()
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if t.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        out[name] = {
            "dtype": str(t.dtype).removeprefix("torch."),
            "shape": list(t.shape),
            "sha256": hashlib.sha256(tensor_bytes(t)).hexdigest(),
        }
    return out, aliases


def tensor_bytes(t: Any) -> memoryview:
    """The raw bytes of a tensor (made contiguous on the CPU)."""
    import torch

    t = t.detach().cpu().contiguous().reshape(-1)
    return memoryview(t.view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


def export_unchanged(
    model: Any, out_dir: str | os.PathLike, *, base: str, base_identity: str, step: int | None = None
) -> dict | None:
    """When ``model``'s weights hash equals ``base_identity`` (the hash of ``base`` as loaded), write
    ``out_dir`` with only ``identity.json`` (weights hash, every tensor's sha256, the base) and return
    the identity; else write nothing and return None (the caller exports the weights)."""
    got = _weights_hash(model)
    if got != base_identity:
        return None
    hashes, aliases = tensor_hashes(model)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    identity = {
        "format_version": FORMAT_VERSION,
        "weights_hash": got,
        "weights_stored": False,
        "weights_in": base,
        "weights_note": "bit-identical to the base model as loaded (same weights hash); not stored twice",
        "tensor_hashes": hashes,
        "aliases": aliases,
        "step": step,
        "model_class": type(model).__name__,
        "dtype": model_dtype(model) if hasattr(model, "parameters") else None,
        "created": utc_now(),
    }
    try:
        write_json_atomic(tmp / IDENTITY, identity)
        fsync_dir(tmp)
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return identity


def final_weights(final_dir: str | os.PathLike) -> str:
    """The model to load for a run's ``final`` folder: the folder itself, or the base model named in
    its identity when the weights were not stored twice (`export_unchanged`)."""
    from sqlrl.artifacts import read_json

    where = str(final_dir)
    for _ in range(64):  # a chain of such runs (e.g. curriculum stages) ends at stored weights
        ident = Path(where) / IDENTITY
        if not ident.is_file():
            break
        data = read_json(ident)
        if data.get("weights_stored") is not False:
            break
        where = str(data["weights_in"])
    return where


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
    if is_peft(model):
        source_weights_hash = source_weights_hash or _weights_hash(model)
        if merge_lora:
            to_save = copy.deepcopy(model).merge_and_unload()
            keep_unchanged_bits(to_save, model)
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
            "adapter_only": is_peft(to_save),
            "model_class": type(to_save).__name__,
            "dtype": model_dtype(to_save),
            "created": utc_now(),
        }
        identity["files"] = files_record(tmp, exclude=(IDENTITY,))
        write_json_atomic(tmp / IDENTITY, identity)
        fsync_dir(tmp)
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if merged:
            del to_save
    return identity


def keep_unchanged_bits(merged: Any, peft_model: Any) -> None:
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
