"""Hugging Face export of a trained model or a sqlrl checkpoint, with identity.json.

What is covered:
- `export_hf` writes to a temp folder and renames it into place; ``identity.json`` holds the weights
  hash of exactly the model that was saved, and reloading the folder with
  ``AutoModelForCausalLM.from_pretrained`` gives the same ``weights_hash`` (tested on tiny models).
- LoRA is merged on a copy (the model passed in keeps its adapter), and the original bits are kept
  wherever the merge left a value numerically unchanged (a zero adapter merges to bit-identical base
  weights, signed zeros included).
- ``export_hf(..., dtype=, base=, base_identity=)`` stores the weights in ``dtype`` and, when smaller, as
  a patch over the base cast to that dtype (``sqlrl.generation.patch``); ``load_model`` rebuilds it.
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
import json
import logging
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

log = logging.getLogger(__name__)


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
    """The model to load for a run's ``final`` folder: the folder itself (dense, or a patch that
    ``load_model`` rebuilds over its base), or the base model named in its identity when the weights were
    not stored twice (`export_unchanged`)."""
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
    dtype: str | None = None,
    base: str | None = None,
    base_identity: str | None = None,
) -> dict:
    """Save ``model`` (+ tokenizer) in Hugging Face format (safetensors) to ``out_dir`` atomically,
    with ``identity.json`` = {weights_hash, source_checkpoint, step, ...}; returns the identity.

    ``dtype`` (e.g. "bfloat16") stores the floating tensors in that dtype (None: as they are; the hash of
    the model as passed is then ``master_weights_hash``). With ``base`` and ``base_identity`` (the base's
    weights hash as loaded), the weights are stored as a patch over the base cast to that dtype when the
    patch is smaller (`sqlrl.generation.patch`; ``weights_stored: "patch"``), else dense.

    A peft model with ``merge_lora=True`` is merged on a deep copy (``merge_and_unload``), so the
    model passed in keeps its adapter and can continue training unchanged; the copy costs one extra
    model in memory on the model's device. ``merge_lora=False`` on a peft model saves only the
    adapter (peft format), which needs the base model to load.
    """
    from sqlrl.generation.hashing import torch_dtype

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
    adapter_only = is_peft(to_save)
    tdtype = None if adapter_only else torch_dtype(dtype)
    if tdtype is not None and model_dtype(to_save) == str(tdtype).removeprefix("torch."):
        tdtype = None  # already stored in that dtype
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        stored = _save_weights(to_save, tmp, tdtype, None if adapter_only else base, base_identity)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        identity = {
            "format_version": FORMAT_VERSION,
            "weights_hash": stored.pop("weights_hash"),
            "source_checkpoint": str(source_checkpoint) if source_checkpoint is not None else None,
            "step": step,
            "source_weights_hash": source_weights_hash,
            "lora_merged": merged,
            "adapter_only": adapter_only,
            "model_class": type(to_save).__name__,
            "dtype": str(tdtype).removeprefix("torch.") if tdtype is not None else model_dtype(to_save),
            **stored,
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


def _save_weights(model: Any, tmp: Path, tdtype: Any, base: str | None, base_identity: str | None) -> dict:
    """Write ``model``'s weights into ``tmp``: a patch over ``base`` when smaller, else dense; floating
    tensors cast to ``tdtype`` (None: as they are). Returns the identity fields of what was written."""
    from sqlrl.generation.patch import unique_tensors

    out: dict[str, Any] = {"weights_stored": "dense"}
    if tdtype is not None:
        out["master_weights_hash"] = _weights_hash(model)
    if base is not None and base_identity is not None:
        patched = _try_patch(model, tmp, tdtype, base, base_identity)
        if patched.get("weights_stored") == "patch":
            return {**out, **patched}
        out.update(patched)
    if tdtype is None:
        model.save_pretrained(str(tmp))
        out["weights_hash"] = _weights_hash(model)
        return out
    sd = {n: t.detach().cpu().to(tdtype) for n, t in unique_tensors(model)}
    out["weights_hash"] = _weights_hash(sd)  # before save_pretrained, which may edit the dict (tied keys)
    model.save_pretrained(str(tmp), state_dict=dict(sd))
    _set_config_dtype(tmp, tdtype)
    return out


def _try_patch(model: Any, tmp: Path, tdtype: Any, base: str, base_identity: str) -> dict:
    """Write ``patch.safetensors`` + config into ``tmp`` when the patch over ``base`` is smaller than the
    dense weights; returns the identity fields (``weights_stored: "patch"``), or why it stayed dense."""
    from safetensors.torch import save_file

    from sqlrl.generation.hashing import ModelError
    from sqlrl.generation.patch import PATCH_FILE, diff_against_base, unique_tensors

    items = unique_tensors(model)
    if tdtype is None:  # already in the final dtype (LoRA keeps the generation dtype): cast the base to it
        dtypes = {t.dtype for _, t in items if t.is_floating_point()}
        if len(dtypes) != 1:
            return {"why_dense": f"floating tensors in {len(dtypes)} dtypes"}
        tdtype = dtypes.pop()
    dense_bytes = sum(
        t.numel() * (t.element_size() if tdtype is None else _size(t, tdtype)) for _, t in items
    )
    ref = local_base(base)
    if ref is None:
        log.warning(f"final weights stored dense: base {base!r} is not on this machine for a patch")
        return {"why_dense": f"base {base!r} not found locally"}
    try:
        reader = BaseWeights(ref, base_identity)
    except (ModelError, OSError) as e:
        log.warning(f"final weights stored dense: base {base!r} cannot be read for a patch ({e})")
        return {"why_dense": f"base unreadable: {e}"}
    got, patch, stats = diff_against_base(items, reader, tdtype, dense_bytes)
    del reader
    if patch is None:
        return {"why_dense": stats["why_dense"], "dense_bytes": dense_bytes}
    save_file(patch, str(tmp / PATCH_FILE), metadata={"format": "pt", "sqlrl": "patch"})
    model.config.save_pretrained(str(tmp))
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(str(tmp))
    if tdtype is not None:
        _set_config_dtype(tmp, tdtype)
    return {
        "weights_hash": got,
        "weights_stored": "patch",
        "base": ref,
        "base_weights_hash": base_identity,
        "patch_file": PATCH_FILE,
        "changed_tensors": stats["changed_tensors"],
        "changed_elements": stats["changed_elements"],
        "numel": stats["numel"],
        "patch_bytes": stats["patch_bytes"],
        "dense_bytes": dense_bytes,
        "weights_note": "base cast to dtype + these elements; `sqlrl export FINAL -o DIR` writes a plain "
        "Hugging Face folder",
    }


def local_base(name: str, cache_dir: str | os.PathLike | None = None) -> str | None:
    """How to name the base ``name`` so that it loads without the network: a cached built-in or converted
    name as is, a local path made absolute, a hub id as its Hugging Face cache folder; None otherwise."""
    from sqlrl.generation.models import (
        BUILTIN_MODELS,
        _hf_cache_folder,  # the cache lookup, no network
        cache_root,
        read_manifest,
        safe_name,
    )

    if read_manifest(cache_root(cache_dir) / safe_name(name)) is not None:
        return name
    if name in BUILTIN_MODELS:
        return None
    p = Path(name).expanduser()
    if p.exists():
        return str(p.resolve())
    try:
        return _hf_cache_folder(name)
    except Exception:  # noqa: BLE001 -- not a hub id the cache knows
        return None


class BaseWeights:
    """The base model's tensors by name, as stored, with its weights hash checked (``identity``)."""

    def __init__(self, name: str, identity: str, *, cache_dir: str | os.PathLike | None = None):
        from sqlrl.generation.models import load_model, resolve_model
        from sqlrl.generation.patch import is_patch_folder

        self.name, self.identity = name, identity
        self._handles: dict[str, Any] = {}
        self._mem: dict | None = None
        res = resolve_model(name, cache_dir=cache_dir)
        if res.kind != "hub" and not is_patch_folder(res.path):
            self._open_files(Path(res.path))
            if self._handles and self._stream_hash() == identity:
                return
            self._handles = {}
        loaded = load_model(name, device="cpu", cache_dir=cache_dir)
        if loaded.identity != identity:
            from sqlrl.generation.hashing import ModelError

            raise ModelError(
                f"base {name!r} now loads with weights hash {loaded.identity}, not the {identity} training "
                "started from; the final weights cannot be stored as a patch over it"
            )
        from sqlrl.generation.patch import unique_tensors

        self._mem = dict(unique_tensors(loaded.model))

    def _open_files(self, path: Path) -> None:
        from safetensors import safe_open

        for f in sorted(path.glob("*.safetensors")):
            h = safe_open(str(f), framework="pt", device="cpu")
            for k in h.keys():
                self._handles[k] = h

    def _stream_hash(self) -> str:
        from sqlrl.generation.hashing import hash_named_tensors

        return hash_named_tensors((k, self.get(k)) for k in sorted(self._handles))

    def names(self) -> set[str]:
        return set(self._mem) if self._mem is not None else set(self._handles)

    def get(self, name: str) -> Any:
        if self._mem is not None:
            return self._mem[name]
        return self._handles[name].get_tensor(name)


def _size(t: Any, tdtype: Any) -> int:
    import torch

    return torch.empty((), dtype=tdtype).element_size() if t.is_floating_point() else t.element_size()


def _set_config_dtype(folder: Path, tdtype: Any) -> None:
    """config.json says the stored dtype, so ``from_pretrained(dtype="auto")`` loads it as stored."""
    from sqlrl.artifacts import read_json

    cfg = read_json(folder / "config.json")
    name = str(tdtype).removeprefix("torch.")
    cfg["dtype"] = name
    if "torch_dtype" in cfg:
        cfg["torch_dtype"] = name
    # the folder is a temp folder renamed into place; keep save_pretrained's file mode
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


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
