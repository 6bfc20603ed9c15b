"""Resolving and loading models by name, and their weights identity.

A model is named by a **built-in name** (``BUILTIN_MODELS``; default ``qwen2.5-coder-0.5b-instruct``),
fetched and converted into the cache by ``sqlrl.generation.sources``; a **local path**: a folder with
``config.json`` + safetensors (loaded as is, not copied) or a ``.gguf`` file (converted and cached);
or else a **Hugging Face hub id**, passed to ``from_pretrained``. The names of ``sources`` and
``hashing`` are re-exported here.

What is covered:
- ``LoadedModel.identity`` is the ``weights_hash`` of the weights *as stored* (computed before any cast
  to the requested load dtype): a bf16 load for generation and a float32 load for training report the
  same identity, which equals the cache manifest's ``weights_hash``.
- The tokenizer pads on the left; a missing pad token is set to the eos token.
- An offline hub id that is not in the Hugging Face cache raises ``ModelError`` saying how to get it.

What is not:
- That a hub id resolves offline. torch/transformers are imported lazily inside functions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlrl.generation.hashing import ModelError, torch_dtype, weights_hash
from sqlrl.generation.sources import (
    BUILTIN_MODELS,
    CACHE_DTYPE,
    DEFAULT_MODEL,
    BuiltinModel,
    cache_model,
    cache_root,
    convert_gguf,
    fetch_model,
    library_versions,
    read_manifest,
    safe_name,
)

__all__ = [
    "BUILTIN_MODELS",
    "CACHE_DTYPE",
    "DEFAULT_MODEL",
    "BuiltinModel",
    "LoadedModel",
    "ModelError",
    "ResolvedModel",
    "cache_model",
    "cache_root",
    "convert_gguf",
    "fetch_model",
    "load_model",
    "resolve_model",
    "weights_hash",
]


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    name: str
    path: str
    identity: str  # weights_hash of `model` as loaded
    manifest: dict = field(default_factory=dict)
    pad_token_id: int | None = None


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model name points. ``kind``: builtin | gguf | local | hub. ``path`` is a local folder
    (config + safetensors + tokenizer) except for ``hub``, where it is the hub id. Path-like."""

    name: str
    kind: str
    path: str

    def __fspath__(self) -> str:
        return self.path

    def __str__(self) -> str:
        return self.path


# ------------------------------------------------------------------------------------------ resolving


def _is_hf_folder(p: Path) -> bool:
    return p.is_dir() and (p / "config.json").is_file()


def resolve_model(
    name: str, *, cache_dir: str | os.PathLike | None = None, fetch: bool = True
) -> ResolvedModel:
    """Where ``name`` lives, as a local folder where possible. Built-ins and ``.gguf`` files are fetched /
    converted into the cache first (unless ``fetch=False``, which raises if they are not cached)."""
    name = str(name)
    root = cache_root(cache_dir)
    if name in BUILTIN_MODELS:
        folder = root / safe_name(name)
        if read_manifest(folder) is None:
            if not fetch:
                raise ModelError(f"{name} is not in the cache {root}; run `sqlrl model fetch {name}`")
            folder = fetch_model(name, cache_dir=cache_dir)
        return ResolvedModel(name, "builtin", str(folder))
    p = Path(name).expanduser()
    if p.suffix == ".gguf" and p.is_file():
        if not fetch:
            raise ModelError(f"{name} is a GGUF file; convert it with `sqlrl model fetch {name}`")
        return ResolvedModel(name, "gguf", str(fetch_model(name, cache_dir=cache_dir)))
    if _is_hf_folder(p):
        return ResolvedModel(name, "local", str(p.resolve()))
    cached = root / safe_name(name)
    if read_manifest(cached) is not None:  # e.g. a converted gguf by its cache name
        return ResolvedModel(name, "cached", str(cached))
    if p.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelError(
            f"model {name!r}: not a built-in ({', '.join(BUILTIN_MODELS)}), and {p} is neither a folder with "
            "config.json + safetensors nor a .gguf file"
        )
    return ResolvedModel(name, "hub", name)


def _offline() -> bool:
    return any(
        os.environ.get(v, "").lower() not in ("", "0", "false", "no")
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _hub_error(name: str, e: Exception) -> ModelError:
    offline = _offline()
    how = (
        "it is offline (HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE set) and not in the Hugging Face cache"
        if offline
        else "it could not be downloaded"
    )
    return ModelError(
        f"model {name!r} is not a built-in ({', '.join(BUILTIN_MODELS)}) nor a local path, and as a Hugging Face hub id "
        f"{how}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}\n"
        f"Get it on a machine with network (`huggingface-cli download {name}` or `sqlrl model fetch` for a built-in) "
        "and pass the local folder, or use a built-in name."
    )


def load_model(
    name: str = DEFAULT_MODEL,
    *,
    device: str = "cpu",
    dtype: str = "auto",
    cache_dir: str | os.PathLike | None = None,
) -> LoadedModel:
    """Load a model by built-in name / local path / hub id (see the module docstring). ``dtype="auto"``
    keeps the stored dtype (float32 for the cache); ``identity`` is always the hash of the stored weights. The tokenizer pads on the left; a missing pad token is set
    to the eos token (``LoadedModel.pad_token_id``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    res = resolve_model(name, cache_dir=cache_dir)
    tdtype = torch_dtype(dtype)
    kwargs: dict = {"dtype": "auto"}  # as stored: the identity is the hash of the stored weights
    if res.kind == "hub" and _offline():
        kwargs["local_files_only"] = True  # some huggingface_hub versions read HF_HUB_OFFLINE only at import
    try:
        model = AutoModelForCausalLM.from_pretrained(res.path, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(
            res.path, **({"local_files_only": True} if "local_files_only" in kwargs else {})
        )
    except (OSError, ValueError) as e:
        if res.kind == "hub":
            raise _hub_error(name, e) from e
        raise ModelError(f"could not load {name!r} from {res.path}: {type(e).__name__}: {e}") from e
    identity = weights_hash(model)
    if tdtype is not None:
        model.to(tdtype)
    model.to(device)
    model.eval()
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    manifest = read_manifest(Path(res.path)) if res.kind != "hub" else None
    if manifest is None:
        manifest = {"name": name, "source": {res.kind: res.path}, **library_versions()}
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        path=res.path,
        identity=identity,
        manifest=manifest,
        pad_token_id=tokenizer.pad_token_id,
    )
