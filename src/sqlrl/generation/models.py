"""Resolving and loading models by name, and their weights identity.

A model is named by a **built-in name** (``BUILTIN_MODELS``; default ``qwen2.5-coder-0.5b-instruct``),
fetched and converted into the cache by ``sqlrl.generation.sources``; a **local path**: a folder with
``config.json`` + safetensors (loaded as is, not copied), a run's ``final`` folder stored as a patch over
its base (``sqlrl.generation.patch``) or a ``.gguf`` file (converted and cached); or else a **Hugging
Face hub id**, passed to ``from_pretrained``. The names of ``sources`` and ``hashing`` are re-exported.

What is covered:
- ``LoadedModel.identity`` is the ``weights_hash`` of the weights *as stored* (computed before any cast
  to the requested load dtype): a bf16 load for generation and a float32 load for training report the
  same identity, which equals the cache manifest's ``weights_hash``.
- The tokenizer pads on the left; a missing pad token is set to the eos token.
- A model on local disk loads without transformers' "Loading weights" bar (`no_loading_bar`).
- ``check_model`` resolves a name before anything is written or downloaded: an unknown built-in name,
  a missing path, a hub id the hub does not know, or one it cannot be asked about (unreachable within
  ``HUB_CHECK_SECONDS``, or offline mode) and not in the Hugging Face cache raise a one-line
  ``ModelError`` with the built-in names; a hub id in the Hugging Face cache loads without the hub.

What is not:
- That a hub id the hub knows can be downloaded (gated, disk). torch/transformers are imported lazily.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import threading
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
    "check_model",
    "convert_gguf",
    "fetch_model",
    "load_model",
    "load_patched",
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
    offline: bool = False  # a hub id whose ``path`` is its Hugging Face cache snapshot, hub not asked

    def __fspath__(self) -> str:
        return self.path

    def __str__(self) -> str:
        return self.path


# ------------------------------------------------------------------------------------------ resolving

HUB_CHECK_SECONDS = 3.0
"""How long the hub is asked whether a hub id exists before it counts as unreachable."""
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def _is_hf_folder(p: Path) -> bool:
    return p.is_dir() and (p / "config.json").is_file()


def _unknown(name: str, why: str) -> ModelError:
    """One line: what ``name`` is not, why it is not a hub id, the built-in names and what to try."""
    close = difflib.get_close_matches(name.lower(), list(BUILTIN_MODELS), n=1, cutoff=0.4)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ModelError(
        f"model {name!r} is not a built-in ({', '.join(BUILTIN_MODELS)}) nor a local folder (config.json + "
        f"safetensors) or .gguf file, and {why}; {hint}use a built-in name, a local folder, or a hub id "
        "(without network: download it elsewhere with `hf download ID` and pass the folder)"
    )


def _hf_cache_folder(name: str) -> str | None:
    """The snapshot folder of hub id ``name`` in the Hugging Face cache (its ``main``), if cached."""
    from huggingface_hub import constants, try_to_load_from_cache

    hit = try_to_load_from_cache(name, "config.json", cache_dir=constants.HF_HUB_CACHE)
    return str(Path(hit).parent) if isinstance(hit, str) else None


def _ask_hub(name: str, timeout: float) -> tuple[str, str]:
    """("ok" | "missing" | "unreachable", detail): whether the hub knows ``name``, asked once (no retries)
    in a daemon thread, so that a hanging DNS lookup or connection costs at most ``timeout`` seconds."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    box: dict[str, tuple[str, str]] = {}

    def ask() -> None:
        try:
            HfApi().model_info(name, timeout=timeout)
            box["r"] = ("ok", "")
        except GatedRepoError:
            box["r"] = ("ok", "gated")  # exists; the download says how to get access
        except RepositoryNotFoundError:
            box["r"] = ("missing", "")
        except HfHubHTTPError:
            box["r"] = ("ok", "answered")  # e.g. a mirror without the model API: the download decides
        except Exception as e:  # noqa: BLE001 -- any client or network error: the hub is unreachable
            box["r"] = ("unreachable", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")

    t = threading.Thread(target=ask, name="sqlrl-hub-check", daemon=True)
    t.start()
    t.join(timeout + 0.5)
    return box.get("r", ("unreachable", f"no answer within {timeout:.0f} s"))


def _check_hub(name: str, timeout: float) -> ResolvedModel:
    cached = _hf_cache_folder(name)
    if _offline():
        if cached:
            return ResolvedModel(name, "hub", cached, offline=True)
        raise _unknown(
            name,
            "offline mode is on (HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE) and it is not in the Hugging Face cache",
        )
    answer, detail = _ask_hub(name, timeout)
    if answer == "ok":
        return ResolvedModel(name, "hub", name)
    if answer == "missing":
        raise _unknown(
            name, "the Hugging Face hub has no such model (or it is private: log in with `hf auth login`)"
        )
    if cached:  # hub unreachable: the cached snapshot folder is loaded as a local folder
        return ResolvedModel(name, "hub", cached, offline=True)
    raise _unknown(
        name, f"the Hugging Face hub is unreachable ({detail}) and it is not in the Hugging Face cache"
    )


def check_model(
    name: str, *, cache_dir: str | os.PathLike | None = None, timeout: float = HUB_CHECK_SECONDS
) -> ResolvedModel:
    """Where ``name`` points, found without downloading, converting or writing anything; raises
    ``ModelError`` (one line) for an unknown name. A hub id is asked of the hub once (``timeout``); when
    the hub is unreachable or offline mode is set, its snapshot folder in the Hugging Face cache is the
    ``path`` (``offline=True``). For a built-in not cached yet, ``path`` is the cache folder it will get."""
    name = str(name)
    root = cache_root(cache_dir)
    if name in BUILTIN_MODELS:
        return ResolvedModel(name, "builtin", str(root / safe_name(name)))
    p = Path(name).expanduser()
    if p.suffix == ".gguf" and p.is_file():
        return ResolvedModel(name, "gguf", str(p.resolve()))
    if _is_hf_folder(p):
        return ResolvedModel(name, "local", str(p.resolve()))
    cached = root / safe_name(name)
    if read_manifest(cached) is not None:  # e.g. a converted gguf by its cache name
        return ResolvedModel(name, "cached", str(cached))
    if p.exists() or p.suffix == ".gguf" or name.startswith((".", "/", "~")) or not _HUB_ID.fullmatch(name):
        what = "does not exist" if not p.exists() else "is neither a folder with config.json nor a .gguf file"
        raise _unknown(name, f"as a path {p.absolute()} {what}")
    return _check_hub(name, timeout)


def resolve_model(
    name: str, *, cache_dir: str | os.PathLike | None = None, fetch: bool = True
) -> ResolvedModel:
    """Where ``name`` lives (``check_model``), as a local folder where possible. Built-ins and ``.gguf``
    files are fetched / converted into the cache first (unless ``fetch=False``, which raises if they are
    not cached)."""
    res = check_model(name, cache_dir=cache_dir)
    if res.kind == "builtin" and read_manifest(Path(res.path)) is None:
        if not fetch:
            raise ModelError(
                f"{name} is not in the cache {cache_root(cache_dir)}; run `sqlrl model fetch {name}`"
            )
        return ResolvedModel(res.name, "builtin", str(fetch_model(res.name, cache_dir=cache_dir)))
    if res.kind == "gguf":
        if not fetch:
            raise ModelError(f"{name} is a GGUF file; convert it with `sqlrl model fetch {name}`")
        return ResolvedModel(res.name, "gguf", str(fetch_model(res.name, cache_dir=cache_dir)))
    return res


def _offline() -> bool:
    return any(
        os.environ.get(v, "").lower() not in ("", "0", "false", "no")
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _hub_error(name: str, e: Exception) -> ModelError:
    first = str(e).splitlines()[0] if str(e) else ""
    return ModelError(
        f"model {name!r} (a Hugging Face hub id) could not be loaded: {type(e).__name__}: {first}; get it "
        f"on a machine with network (`hf download {name}`) and pass the local folder, or use a built-in "
        f"name ({', '.join(BUILTIN_MODELS)})"
    )


@contextlib.contextmanager
def no_loading_bar(quiet: bool = True):
    """transformers' "Loading weights" bar off while `quiet` (a model on local disk: nothing downloads,
    and the bar would break a command's progress line), restored after; a hub id keeps its bars."""
    from transformers.utils import logging as hf_logging

    if not quiet or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


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
    if res.kind == "local":
        from sqlrl.generation.patch import is_patch_folder

        if is_patch_folder(res.path):  # a run's final weights stored as a patch over its base
            return load_patched(res.path, name=name, device=device, dtype=dtype, cache_dir=cache_dir)
    tdtype = torch_dtype(dtype)
    kwargs: dict = {"dtype": "auto"}  # as stored: the identity is the hash of the stored weights
    if res.kind == "hub" and (res.offline or _offline()):
        kwargs["local_files_only"] = True  # no hub retries; HF_HUB_OFFLINE may be read only at import
    try:
        with no_loading_bar(res.kind != "hub"):
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


def load_patched(
    folder: str | os.PathLike,
    *,
    name: str,
    device: str = "cpu",
    dtype: str = "auto",
    cache_dir: str | os.PathLike | None = None,
) -> LoadedModel:
    """A run's final folder stored as a patch (``sqlrl.generation.patch``): the recorded base loaded in the
    patch dtype, its hash checked, the patch applied, the result's hash checked; then cast to ``dtype``
    (``auto``: the patch dtype) and moved to ``device``. ``identity`` is the recorded weights hash."""
    from transformers import AutoTokenizer

    from sqlrl.artifacts import read_json
    from sqlrl.generation.patch import IDENTITY, apply_patch_file

    folder = Path(folder)
    ident = read_json(folder / IDENTITY)
    base = load_model(ident["base"], device="cpu", dtype=ident["dtype"], cache_dir=cache_dir)
    if base.identity != ident["base_weights_hash"]:
        raise ModelError(
            f"{folder} is a patch over base {ident['base']!r} with weights hash {ident['base_weights_hash']}, "
            f"but that base now loads with {base.identity}, so the patch cannot rebuild the trained weights; "
            "restore that exact base model (or retrain with run.final_dtype = 'float32' to store dense weights)"
        )
    model = base.model
    apply_patch_file(model, folder)
    got = weights_hash(model)
    if got != ident["weights_hash"]:
        raise ModelError(
            f"{folder}: base + patch gives weights hash {got}, not the recorded {ident['weights_hash']} "
            "(a changed patch file or base); re-export the run's final weights"
        )
    tokenizer = base.tokenizer
    if (folder / "tokenizer_config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
    tdtype = torch_dtype(dtype)
    if tdtype is not None:
        model.to(tdtype)
    model.to(device)
    model.eval()
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        path=str(folder),
        identity=got,
        manifest={"name": name, "source": {"patch": str(folder), "base": ident["base"]}, "weights_hash": got},
        pad_token_id=tokenizer.pad_token_id,
    )
