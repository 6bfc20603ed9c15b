"""The weights identity: ``weights_hash``, plus the model error and dtype names every model module uses.

What is covered:
- ``weights_hash`` is a pure function of the tensors (names, dtypes, shapes, bytes), independent of
  ``state_dict`` order. Tensors that alias one another (tied embeddings) are counted once, under the
  name that comes first in ``state_dict`` order -- the name ``save_pretrained`` keeps -- so a model,
  its saved safetensors and the reloaded model all hash the same.
- Non-persistent buffers (rotary ``inv_freq``) are not in ``state_dict``, so they are not hashed.

What is not:
- Equal hashes across dtypes: a bf16 copy of float32 weights hashes differently (``load_model``
  therefore hashes the weights as stored, before any cast).
- Meta tensors (weights not loaded) are refused with ``ModelError``, not hashed.
"""

from __future__ import annotations

import hashlib
from typing import Any

__all__ = ["ModelError", "hash_named_tensors", "torch_dtype", "weights_hash"]


class ModelError(RuntimeError):
    """A model could not be found, fetched, verified or converted. The message says what to do."""


def _tensor_key(t: Any) -> tuple:
    try:
        ptr = t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 -- tensors without storage (meta) are rejected below
        ptr = None
    return (ptr, t.storage_offset(), tuple(t.shape), tuple(t.stride()), str(t.dtype), str(t.device))


def weights_hash(model_or_state_dict: Any) -> str:
    """``"sha256:<hex>"`` over all tensors of a model (its ``state_dict``) or a name -> tensor mapping.

    Per tensor, in sorted name order: ``name``, dtype, shape, byte count, then the raw bytes of the tensor
    made contiguous on the CPU. Aliases (the same storage view under several names, i.e. tied weights)
    are hashed once, under the first name in the mapping's order. Raises ``ModelError`` on meta tensors.
    """
    import torch

    sd = (
        model_or_state_dict.state_dict()
        if hasattr(model_or_state_dict, "state_dict")
        else model_or_state_dict
    )
    seen: set[tuple] = set()
    items: list[tuple[str, Any]] = []
    for name, t in sd.items():
        if not isinstance(t, torch.Tensor):
            raise ModelError(f"weights_hash: {name!r} is not a tensor ({type(t).__name__})")
        if t.device.type == "meta":
            raise ModelError(f"weights_hash: {name!r} is on the meta device (weights not loaded)")
        key = _tensor_key(t)
        if key[0] is not None and key[0] != 0 and key in seen:
            continue
        seen.add(key)
        items.append((name, t))
    return hash_named_tensors(sorted(items, key=lambda kv: kv[0]))


def hash_named_tensors(items: Any) -> str:
    """``weights_hash`` of (name, tensor) pairs given in sorted name order, without aliases; the pairs may
    come from a generator, so one tensor at a time needs to be in memory."""
    import torch

    h = hashlib.sha256()
    for name, t in items:
        t = t.detach()
        if t.device.type != "cpu":
            t = t.to("cpu")
        t = t.contiguous()
        header = f"{name}\0{str(t.dtype).removeprefix('torch.')}\0{list(t.shape)}\0{t.numel() * t.element_size()}\n"
        h.update(header.encode("utf-8"))
        if t.numel():
            h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return "sha256:" + h.hexdigest()


def torch_dtype(dtype: Any):
    """The ``torch.dtype`` for a dtype name (``None`` for ``"auto"``/``None``); ModelError if unknown."""
    import torch

    if dtype is None or dtype == "auto":
        return None
    if isinstance(dtype, torch.dtype):
        return dtype
    table = {
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float32": torch.float32,
        "fp32": torch.float32,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if str(dtype) not in table:
        raise ModelError(f"unknown dtype {dtype!r}: use auto, bfloat16, float32 or float16")
    return table[str(dtype)]
