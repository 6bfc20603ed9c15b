"""Export a veRL 0.9.1 FSDP checkpoint (sharded, one file per rank) to a Hugging Face folder.

veRL's ``FSDPCheckpointManager.save_checkpoint`` (FSDP1 ``strategy: fsdp`` and FSDP2 ``strategy: fsdp2``)
writes, into ``<trainer.default_local_dir>/global_step_N/actor/``::

    model_world_size_{W}_rank_{r}.pt        torch.save of the rank's SHARDED model state dict
                                            (DTensor values; ShardedTensor from older FSDP1 setups)
    optim_/extra_state_world_size_{W}_rank_{r}.pt   optimizer, scheduler, RNG (not needed for export)
    fsdp_config.json                        {"FSDP_version": 1|2, "world_size": W}
    huggingface/                            config.json (+ tokenizer, generation_config.json)

and ``<default_local_dir>/latest_checkpointed_iteration.txt`` holds the newest N.

What is covered: `export_fsdp_checkpoint` takes the actor folder, a ``global_step_N`` folder or the run
folder (newest step), reassembles every tensor in its SAVED dtype (each element placed by the DTensor /
ShardedTensor offsets and covered exactly once; replicated copies checked equal), loads the merged
state dict strictly into a model built from the saved config, checks the loaded model holds exactly
those tensors (``weights_hash``), and saves it with `sqlrl.training.export.export_hf` (identity.json).
veRL's own merger (``python -m verl.model_merger``) is not used: it casts every tensor to bfloat16,
assumes a concatenation layout instead of reading offsets, and writes no identity.json.

What is not (a clear `FSDPExportError`): LoRA checkpoints (``lora_train_meta.json``; use veRL's merger),
tensor parallel / strided (``_StridedShard``) and ``Partial`` placements, remote (HDFS) paths.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import warnings
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SHARD_RE = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")
STEP_RE = re.compile(r"^global_step_(\d+)$")
FSDP_CONFIG = "fsdp_config.json"
HF_SUBDIR = "huggingface"
LATEST = "latest_checkpointed_iteration.txt"
_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


class FSDPExportError(RuntimeError):
    """The folder is not a complete, supported veRL FSDP checkpoint, or the shards do not fit together."""


# ------------------------------------------------------------------------------------------ detection


def _has_shards(d: Path) -> bool:
    try:
        return d.is_dir() and any(SHARD_RE.match(p.name) for p in d.iterdir())
    except OSError:
        return False


def _steps(d: Path) -> list[tuple[int, Path]]:
    try:
        return sorted(
            (int(m.group(1)), p) for p in d.iterdir() if (m := STEP_RE.match(p.name)) and p.is_dir()
        )
    except OSError:
        return []


def find_fsdp_checkpoint(path: str | os.PathLike) -> Path | None:
    """The folder holding the ``model_world_size_*`` shards for ``path``, or None.

    ``path`` may be that folder itself (``.../global_step_N/actor``), a ``global_step_N`` folder (its
    ``actor/``), or a veRL run folder (``default_local_dir``: the step named by
    ``latest_checkpointed_iteration.txt``, else the highest ``global_step_N`` that has shards)."""
    p = Path(path)
    if _has_shards(p):
        return p
    if _has_shards(p / "actor"):
        return p / "actor"
    latest = p / LATEST
    if latest.is_file():
        try:
            n = int(latest.read_text().strip())
        except ValueError:
            n = None
        if n is not None:
            for cand in (p / f"global_step_{n}" / "actor", p / f"global_step_{n}"):
                if _has_shards(cand):
                    return cand
    for _, d in reversed(_steps(p)):
        for cand in (d / "actor", d):
            if _has_shards(cand):
                return cand
    return None


def is_fsdp_checkpoint(path: str | os.PathLike) -> bool:
    """True when ``path`` is (or contains, see `find_fsdp_checkpoint`) a veRL FSDP checkpoint. Cheap: lists
    folders only. A sqlrl checkpoint (``step_NNNNNN`` with sidecar.json) or run folder is never one."""
    return find_fsdp_checkpoint(path) is not None


def _step_of(actor_dir: Path) -> int | None:
    for d in (actor_dir, actor_dir.parent):
        m = STEP_RE.match(d.name)
        if m:
            return int(m.group(1))
    return None


def _world_size(actor_dir: Path) -> tuple[int, int | None]:
    """(world size, FSDP version or None); every rank's shard must be present."""
    cfg: dict = {}
    if (actor_dir / FSDP_CONFIG).is_file():
        cfg = json.loads((actor_dir / FSDP_CONFIG).read_text())
    sizes = {int(m.group(1)) for p in actor_dir.iterdir() if (m := SHARD_RE.match(p.name))}
    world = cfg.get("world_size")
    if world is None:
        if len(sizes) != 1:
            raise FSDPExportError(
                f"{actor_dir}: no {FSDP_CONFIG} and shards of several world sizes {sorted(sizes)}"
            )
        world = sizes.pop()
    world = int(world)
    missing = [
        f"model_world_size_{world}_rank_{r}.pt"
        for r in range(world)
        if not (actor_dir / f"model_world_size_{world}_rank_{r}.pt").is_file()
    ]
    if missing:
        raise FSDPExportError(f"{actor_dir}: incomplete checkpoint, missing {', '.join(missing)}")
    return world, cfg.get("FSDP_version")


# -------------------------------------------------------------------------------------------- merging


def _clean_key(k: str) -> str:
    for pre in _WRAPPER_PREFIXES:
        k = k.replace(pre, "")
    return k


def _load_shard(path: Path) -> dict:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm_log = logging.getLogger("torch.distributed.device_mesh")
        level = dm_log.level
        dm_log.setLevel(logging.ERROR)  # "unpickling of the DeviceMesh before the PGs were created"
        try:
            sd = torch.load(path, map_location="cpu", weights_only=False)
        finally:
            dm_log.setLevel(level)
    if not isinstance(sd, dict):
        raise FSDPExportError(f"{path}: not a state dict ({type(sd).__name__})")
    return sd


def _dtensor_offsets(t: Any, rank: int) -> tuple[list[int], list[int], bool]:
    """(global offset, local shape, primary) of ``rank``'s piece of a DTensor, from its mesh and
    placements (torch.chunk semantics of ``Shard(d)``, as DTensor uses; Replicate keeps the whole
    extent). ``primary``: the rank is replica 0 on every Replicate mesh dim (HSDP keeps one copy per
    replica group; only replica 0's pieces are used)."""
    import numpy as np

    mesh = np.asarray(t.device_mesh.mesh.tolist())
    where = np.argwhere(mesh == rank)
    if len(where) != 1:
        raise FSDPExportError(f"rank {rank} is not (exactly once) in the device mesh {mesh.tolist()}")
    coord = [int(c) for c in where[0]]
    shape = list(t.shape)
    offset = [0] * len(shape)
    primary = True
    for mdim, pl in enumerate(t.placements):
        kind = type(pl).__name__
        if pl.is_replicate():
            primary = primary and coord[mdim] == 0
            continue
        if kind != "Shard" or not pl.is_shard():
            raise FSDPExportError(f"unsupported DTensor placement {pl!r} (only Shard and Replicate)")
        d, n, c = pl.dim, mesh.shape[mdim], coord[mdim]
        chunk = math.ceil(shape[d] / n) if shape[d] else 0
        start = min(c * chunk, shape[d])
        size = max(0, min(chunk, shape[d] - start))
        offset[d] += start
        shape[d] = size
    return offset, shape, primary


def _pieces(value: Any, rank: int, key: str) -> tuple[tuple, Any, list[tuple[list[int], Any]], bool]:
    """(global shape, dtype, [(offset, local tensor)], replicated) of one rank's value."""
    import torch

    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch < 2.5
        from torch.distributed._tensor import DTensor
    try:
        from torch.distributed._shard.sharded_tensor import ShardedTensor
    except ImportError:  # pragma: no cover
        ShardedTensor = ()  # noqa: N806

    if isinstance(value, DTensor):
        local = value._local_tensor
        offset, shape, primary = _dtensor_offsets(value, rank)
        replicated = all(p.is_replicate() for p in value.placements)
        if not primary and not replicated:
            return tuple(value.shape), local.dtype, [], False  # another replica group's copy
        if list(local.shape) != shape:
            # FSDP may keep padding at the end of the last shard; keep only the real extent
            if all(ls >= s for ls, s in zip(local.shape, shape, strict=True)):
                local = local[tuple(slice(0, s) for s in shape)]
            else:
                raise FSDPExportError(
                    f"{key}: rank {rank} holds a {tuple(local.shape)} piece, expected {tuple(shape)} at {offset}"
                )
        return tuple(value.shape), local.dtype, [(offset, local)], replicated
    if ShardedTensor and isinstance(value, ShardedTensor):
        md = value.metadata()
        pieces = [(list(s.metadata.shard_offsets), s.tensor) for s in value.local_shards()]
        dtype = md.tensor_properties.dtype
        return tuple(md.size), dtype, pieces, False
    if isinstance(value, torch.Tensor):
        return tuple(value.shape), value.dtype, [([0] * value.dim(), value)], True
    raise FSDPExportError(f"{key}: unsupported value type {type(value).__name__} in the sharded state dict")


def merge_fsdp_shards(actor_dir: str | os.PathLike) -> tuple[dict, dict]:
    """Full state dict (CPU tensors in their saved dtype) from the per-rank shards of ``actor_dir``,
    plus info {world_size, fsdp_version, n_tensors}. Raises `FSDPExportError` on gaps or overlaps,
    mismatched shapes or dtypes between ranks, or replicated copies that differ."""
    import torch

    actor_dir = Path(actor_dir)
    world, version = _world_size(actor_dir)
    merged: dict[str, Any] = {}
    covered: dict[str, Any] = {}
    meta: dict[str, tuple] = {}
    order: list[str] = []
    for rank in range(world):
        path = actor_dir / f"model_world_size_{world}_rank_{rank}.pt"
        sd = _load_shard(path)
        keys = [_clean_key(k) for k in sd]
        if rank == 0:
            order = keys
        elif set(keys) != set(order):
            diff = sorted(set(keys) ^ set(order))[:5]
            raise FSDPExportError(f"{path}: holds different tensor names than rank 0 (e.g. {diff})")
        for raw_key, value in sd.items():
            key = _clean_key(raw_key)
            shape, dtype, pieces, replicated = _pieces(value, rank, key)
            if key not in merged:
                merged[key] = torch.empty(shape, dtype=dtype)
                covered[key] = torch.zeros(shape, dtype=torch.int8) if not replicated else None
                meta[key] = (shape, dtype, replicated)
            elif meta[key] != (shape, dtype, replicated):
                raise FSDPExportError(f"{key}: rank {rank} has {(shape, dtype)} but rank 0 {meta[key][:2]}")
            for offset, local in pieces:
                local = local.detach().to("cpu")
                if local.dtype != dtype:
                    raise FSDPExportError(f"{key}: rank {rank} piece dtype {local.dtype} != {dtype}")
                if replicated:
                    if rank == 0:
                        merged[key].copy_(local.reshape(shape))
                    elif not torch.equal(merged[key], local.reshape(shape)):
                        raise FSDPExportError(f"{key}: replicated copies differ between rank 0 and {rank}")
                    continue
                idx = tuple(slice(o, o + s) for o, s in zip(offset, local.shape, strict=True))
                merged[key][idx].copy_(local)
                covered[key][idx] += 1
        del sd
    for key, cov in covered.items():
        if cov is None:
            continue
        if cov.numel() and not bool((cov == 1).all()):
            n_gap, n_dup = int((cov == 0).sum()), int((cov > 1).sum())
            raise FSDPExportError(
                f"{key}: shards do not tile the tensor ({n_gap} elements missing, {n_dup} written twice)"
            )
    out = {k: merged[k] for k in order}
    return out, {"world_size": world, "fsdp_version": version, "n_tensors": len(out)}


# --------------------------------------------------------------------------------------------- export


def _tied_aliases(model: Any) -> dict[str, str]:
    """{alias name: canonical name} of parameters shared under several names (tied embeddings)."""
    first: dict[int, str] = {}
    out: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            out[name] = first[id(p)]
        else:
            first[id(p)] = name
    return out


def _load_config(actor_dir: Path, base_config: Any):
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(base_config, PretrainedConfig):
        return base_config
    if base_config is not None:
        return AutoConfig.from_pretrained(str(base_config))
    if not (actor_dir / HF_SUBDIR / "config.json").is_file():
        raise FSDPExportError(f"{actor_dir}: no {HF_SUBDIR}/config.json; pass base_config (--base-config)")
    return AutoConfig.from_pretrained(str(actor_dir / HF_SUBDIR))


_NOT_TOKENIZER = re.compile(
    r"^(config\.json|generation_config\.json|.*\.safetensors|.*\.bin|.*\.pt|.*\.index\.json|identity\.json)$"
)
_TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


class TokenizerFiles:
    """The tokenizer files of a folder, copied VERBATIM by ``save_pretrained`` (what `export_hf` calls).
    Loading and re-saving a tokenizer can rewrite it (transformers 5 converts some tokenizer.json
    models); a byte copy keeps exactly what veRL saved. Config and weight files are not copied."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.files = sorted(
            p for p in self.folder.iterdir() if p.is_file() and not _NOT_TOKENIZER.match(p.name)
        )

    @classmethod
    def find(cls, folder: str | os.PathLike) -> TokenizerFiles | None:
        f = Path(folder)
        if f.is_dir() and any((f / m).is_file() for m in _TOKENIZER_MARKERS):
            return cls(f)
        return None

    def save_pretrained(self, out_dir: str | os.PathLike) -> list[str]:
        import shutil

        out = []
        for p in self.files:
            shutil.copyfile(p, Path(out_dir) / p.name)
            out.append(str(Path(out_dir) / p.name))
        return out


def _load_tokenizer(actor_dir: Path, base_config: Any) -> TokenizerFiles | None:
    candidates = [actor_dir / HF_SUBDIR]
    if isinstance(base_config, (str, os.PathLike)):
        candidates.append(Path(base_config))
    for c in candidates:
        tok = TokenizerFiles.find(c)
        if tok is not None:
            return tok
    return None


def export_fsdp_checkpoint(
    ckpt_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    base_config: Any = None,
    dtype: str | None = None,
) -> dict:
    """Merge a veRL FSDP checkpoint (actor folder, ``global_step_N`` folder or run folder) and save it as a
    Hugging Face folder via `sqlrl.training.export.export_hf`. Returns export_hf's identity dict plus
    ``fsdp`` = {world_size, fsdp_version, n_tensors, actor_dir}.

    ``base_config``: a config folder / model id / ``PretrainedConfig`` to build the model from instead of
    the checkpoint's ``huggingface/config.json`` (also a tokenizer source). ``dtype`` (e.g. ``bfloat16``)
    casts the merged weights; default: keep the saved dtype (bit-exact)."""
    import torch
    from transformers import AutoModelForCausalLM

    from sqlrl.generation.models import weights_hash
    from sqlrl.training.export import export_hf

    actor_dir = find_fsdp_checkpoint(ckpt_dir)
    if actor_dir is None:
        raise FSDPExportError(f"{ckpt_dir}: no veRL FSDP checkpoint (model_world_size_*_rank_*.pt) found")
    if (actor_dir / "lora_train_meta.json").is_file():
        raise FSDPExportError(
            f"{actor_dir}: LoRA checkpoint; not supported here (use `python -m verl.model_merger merge "
            "--backend fsdp`, which writes the adapter)"
        )
    sd, info = merge_fsdp_shards(actor_dir)
    if any("lora_" in k for k in sd):
        raise FSDPExportError(f"{actor_dir}: holds LoRA tensors; not supported here (use verl.model_merger)")
    config = _load_config(actor_dir, base_config)
    with torch.device("meta"):  # structure only (which names are tied), no memory
        tied_names = set(_tied_aliases(AutoModelForCausalLM.from_config(config)))
    # the hash of the merged checkpoint tensors, as saved (a tied alias counted once, like weights_hash)
    source_hash = weights_hash({k: v for k, v in sd.items() if k not in tied_names})
    if dtype:
        target = getattr(torch, dtype)
        sd = {k: v.to(target) if v.is_floating_point() else v for k, v in sd.items()}

    dtypes = {v.dtype for v in sd.values() if v.is_floating_point()}
    model_dtype = dtypes.pop() if len(dtypes) == 1 else None
    model = AutoModelForCausalLM.from_config(config, dtype=model_dtype) if model_dtype else None
    if model is None:
        model = AutoModelForCausalLM.from_config(config)
    aliases = _tied_aliases(model)
    for alias, canon in aliases.items():
        if alias in sd and canon in sd and not torch.equal(sd[alias], sd[canon]):
            raise FSDPExportError(f"{alias} and {canon} are tied in the model but differ in the checkpoint")
        if alias not in sd and canon in sd:
            sd[alias] = sd[canon]
        elif canon not in sd and alias in sd:
            sd[canon] = sd[alias]
    try:
        model.load_state_dict(sd, strict=True)
    except RuntimeError as e:
        raise FSDPExportError(f"{actor_dir}: merged weights do not fit {type(model).__name__}: {e}") from e
    got = weights_hash(model)
    expect = weights_hash({k: v for k, v in sd.items() if k not in aliases})
    if got != expect:
        raise FSDPExportError(f"{actor_dir}: model after loading has weights hash {got} != merged {expect}")
    del sd

    gen = actor_dir / HF_SUBDIR / "generation_config.json"
    if gen.is_file() and model.can_generate():
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig.from_pretrained(str(gen.parent))
    tokenizer = _load_tokenizer(actor_dir, base_config)
    if tokenizer is None:
        log.warning(
            "%s: no tokenizer in %s/ (and none from base_config); exporting weights only",
            actor_dir,
            HF_SUBDIR,
        )
    identity = export_hf(
        model,
        tokenizer,
        out_dir,
        source_checkpoint=actor_dir.resolve(),
        step=_step_of(actor_dir),
        source_weights_hash=source_hash,
    )
    identity = dict(identity)
    identity["fsdp"] = dict(info, actor_dir=str(actor_dir))
    return identity
