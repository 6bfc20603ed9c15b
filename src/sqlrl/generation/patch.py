"""Final weights stored as a patch over the base model: only the elements that differ, in one dtype.

A patch folder (identity.json ``weights_stored: "patch"``) holds ``patch.safetensors`` with, per changed
tensor, ``NAME:idx`` (flat int32 indices; int64 past 2**31 - 1 elements) and ``NAME:val`` (the values in
the patch dtype), plus config.json, the tokenizer and identity.json: ``base`` (built-in name or absolute
path), ``base_weights_hash`` (the base's weights hash as loaded), ``dtype`` and ``weights_hash`` (of the
patched model). The patched model is the base cast to ``dtype`` with those elements replaced.

What is covered:
- Elements are compared by their raw bits (``tensor_patch``), so -0.0 vs 0.0 and NaN payload changes
  are kept; values are written and applied through integer views, bit for bit.
- ``load_model`` rebuilds such a folder (``models.load_patched``), refusing in one line a base whose
  weights hash differs from the recorded one and a rebuilt model whose hash differs from the record.
- ``diff_against_base`` makes the patch and the final's weights hash in one pass, one tensor at a time.

What is not: a patch over a base with different tensor names or shapes (the writer stores dense then).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from sqlrl.artifacts import read_json
from sqlrl.generation.hashing import ModelError, hash_named_tensors

PATCH_FILE = "patch.safetensors"
IDENTITY = "identity.json"
INDEX_LIMIT = 2**31 - 1  # flat indices past this need int64


def is_patch_folder(path: str | os.PathLike) -> bool:
    """The folder's identity.json says its weights are stored as a patch over a base."""
    ident = Path(path) / IDENTITY
    return ident.is_file() and read_json(ident).get("weights_stored") == "patch"


def unique_tensors(sd: Any) -> list[tuple[str, Any]]:
    """(name, tensor) of a state dict (or module) in sorted name order, tied aliases counted once under
    their first name in state-dict order (as ``weights_hash`` counts them)."""
    sd = sd.state_dict() if hasattr(sd, "state_dict") else sd
    seen: set[tuple] = set()
    out = []
    for name, t in sd.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if t.numel() and key in seen:
            continue
        seen.add(key)
        out.append((name, t))
    return sorted(out, key=lambda kv: kv[0])


def bits(t: Any) -> Any:
    """A flat integer view of a contiguous tensor's raw bits (same storage)."""
    import torch

    flat = t.reshape(-1)
    if flat.dtype == torch.bool:
        return flat.view(torch.uint8)
    return flat.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()])


def tensor_patch(base: Any, final: Any) -> tuple[Any, Any]:
    """(flat indices, values) of the elements of ``final`` whose raw bits differ from ``base`` (same shape
    and dtype). Indices are int32, int64 past 2**31 - 1 elements; values keep ``final``'s dtype and bits."""
    import torch

    if base.shape != final.shape or base.dtype != final.dtype:
        raise ModelError(
            f"tensor_patch: {list(base.shape)} {base.dtype} vs {list(final.shape)} {final.dtype}"
        )
    fb = bits(final.detach().cpu().contiguous())
    idx = (bits(base.detach().cpu().contiguous()) != fb).nonzero().reshape(-1)
    idx = idx.to(torch.int32 if final.numel() <= INDEX_LIMIT else torch.int64)
    return idx, fb[idx.long()].view(final.dtype)


def apply_tensor_patch(t: Any, idx: Any, val: Any) -> Any:
    """Write ``val`` bit for bit at the flat indices ``idx`` of the contiguous tensor ``t`` (in place)."""
    import torch

    if val.dtype != t.dtype:
        raise ModelError(f"patch values are {val.dtype}, the tensor is {t.dtype}: a patch of another dtype")
    with torch.no_grad():
        bits(t)[idx.to(t.device).long()] = bits(val.contiguous()).to(t.device)
    return t


def cast(t: Any, dtype: Any) -> Any:
    """``t`` on the CPU, floating tensors cast to ``dtype``, contiguous."""
    t = t.detach().cpu()
    if dtype is not None and t.is_floating_point() and t.dtype != dtype:
        t = t.to(dtype)
    return t.contiguous()


def diff_against_base(
    items: Iterable[tuple[str, Any]], base: Any, dtype: Any, limit_bytes: int
) -> tuple[str, dict[str, Any] | None, dict]:
    """(weights hash of ``items`` cast to ``dtype``, patch tensors or None, stats) for the final model's
    (name, tensor) pairs in sorted order against ``base`` (``names()``, ``get(name)``) cast to ``dtype``. The patch is None when a name
    or shape differs from the base or its bytes reach ``limit_bytes`` (the dense size)."""
    patch: dict[str, Any] | None = {}
    stats = {"changed_elements": 0, "numel": 0, "changed_tensors": 0, "patch_bytes": 0, "why_dense": None}
    base_names = base.names()

    def walk() -> Iterator[tuple[str, Any]]:
        nonlocal patch
        for name, t in items:
            t = cast(t, dtype)
            stats["numel"] += t.numel()
            if patch is not None and name not in base_names:
                patch, stats["why_dense"] = None, f"{name} is not in the base"
            b = cast(base.get(name), dtype) if patch is not None else None
            if b is not None and (b.shape != t.shape or b.dtype != t.dtype):
                patch, stats["why_dense"] = None, f"{name} differs from the base in shape or dtype"
            if patch is not None:
                idx, val = tensor_patch(b, t)
                if idx.numel():
                    patch[f"{name}:idx"], patch[f"{name}:val"] = idx, val
                    stats["changed_tensors"] += 1
                    stats["changed_elements"] += idx.numel()
                    stats["patch_bytes"] += idx.numel() * (idx.element_size() + val.element_size())
                if stats["patch_bytes"] >= limit_bytes:
                    patch, stats["why_dense"] = None, "the patch would not be smaller than the dense weights"
            yield name, t

    got = hash_named_tensors(walk())
    if patch is None:
        stats["changed_elements"] = stats["changed_tensors"] = stats["patch_bytes"] = None
    return got, patch, stats


def apply_patch_file(model: Any, folder: str | os.PathLike) -> None:
    """Apply a patch folder's ``patch.safetensors`` to ``model`` (the base in the patch dtype) in place."""
    from safetensors import safe_open

    sd = model.state_dict()
    with safe_open(str(Path(folder) / PATCH_FILE), framework="pt", device="cpu") as f:
        for key in f.keys():
            if key.endswith(":idx"):
                tname = key[: -len(":idx")]
                if tname not in sd:
                    raise ModelError(f"{folder}: the patch changes {tname}, which the base model lacks")
                apply_tensor_patch(sd[tname], f.get_tensor(key), f.get_tensor(f"{tname}:val"))


__all__ = [
    "PATCH_FILE",
    "apply_patch_file",
    "apply_tensor_patch",
    "bits",
    "diff_against_base",
    "is_patch_folder",
    "tensor_patch",
    "unique_tensors",
]
