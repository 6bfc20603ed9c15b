"""The device and dtypes a run uses, and freeing cached GPU memory."""

from __future__ import annotations

import contextlib

from sqlrl.config import Config, ConfigError


def pick_device(device: str) -> str:
    """``device``, or for ``"auto"`` ``"cuda"`` when torch sees a GPU, else ``"cpu"``."""
    if device != "auto":
        return device
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def device_and_dtypes(cfg: Config):
    """``(device, generation dtype)`` of a run config; ConfigError when CUDA is asked for but absent."""
    import torch

    device = pick_device(cfg.run.device)
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run.device = 'cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    gen_dtype = cfg.model.dtype
    if gen_dtype == "auto":
        gen_dtype = "bfloat16" if device == "cuda" else "float32"
    return device, gen_dtype


def free_memory() -> None:
    """Collect garbage and return cached CUDA blocks to the driver (no-op without CUDA)."""
    import gc

    gc.collect()
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
