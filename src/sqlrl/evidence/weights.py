"""Tensor-level weight audit: did training change the weights, did the no-update arm leave them
bit-identical, and is the exported/reloaded model the one that was trained?

`audit_weights(base, trained, no_update=None, *, reloaded=None, expect_hash=None)` takes paths (a HF
folder with ``*.safetensors``, a sqlrl checkpoint ``step_NNNNNN``, a ``final`` folder holding every tensor's
hash (`export_unchanged`) or a patch over its base (`sqlrl.generation.patch`: base hash checked, rebuilt
one tensor at a time)) or state dicts / modules, compared one tensor at a time in float64 chunks.

Verdicts (``None`` when not applicable):
- ``trained_changed``: a tensor of ``trained`` differs (raw bits) from the base CAST TO TRAINED'S DTYPE:
  the model every evaluation loads. A bf16 final whose float32 masters moved by less than a bf16 step
  equals bf16(base): "unchanged" (against the float32 base every bf16 final would differ trivially).
- ``no_update_identical``: every tensor of ``no_update`` is bit-identical to ``base`` (raw bytes, not
  allclose: -0.0 vs 0.0 or a NaN payload change counts). Different floating dtypes where one converts
  exactly into the other (bf16 base vs float32 export) are compared after that exact upcast; any other
  dtype change counts as a change. Against a hash-only folder, each base tensor's sha256 (after that
  upcast) must equal the recorded one (a change has no size then).
- ``reloaded_identity``: the weights hash of ``reloaded`` (or of ``trained`` when no ``reloaded`` is
  given) equals the recorded hash (``expect_hash``, else ``identity.json`` / ``sidecar.json`` of
  ``trained``, else the hash computed from ``trained``).
``passed``: no structural error (name/shape mismatch, unreadable model) and no applicable verdict false.

Not guaranteed: tied weights missing from a HF folder are reconstructed only for ``tie_word_embeddings``
(``lm_head.weight`` -> ``*embed_tokens.weight``); LoRA adapter-only checkpoints are refused (export them
merged first with ``sqlrl export --base``); ``.bin`` (pickle) weights are not read.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlrl.artifacts import read_json

CHUNK = 1 << 22  # elements per float64 chunk


class AuditError(RuntimeError):
    """A model could not be read for the audit."""


class _Source:
    """Named tensors of one model: lazily from safetensors files, or from an in-memory state dict."""

    def __init__(self, label: str, obj: Any):
        self.label = label
        self.path: str | None = None
        self.kind = "state_dict"
        self.recorded_hash: str | None = None
        self.aliases: dict[str, str] = {}
        self._mem: dict | None = None
        self._hashes: dict[str, dict] | None = None
        self._file_of: dict[str, Path] = {}
        self._handles: dict[Path, Any] = {}
        self._base: _Source | None = None  # the base a patch folder applies to
        if isinstance(obj, str | os.PathLike):
            self._init_path(Path(obj))
        elif hasattr(obj, "state_dict") and not isinstance(obj, Mapping):
            self._mem = dict(obj.state_dict())
        elif isinstance(obj, Mapping):
            self._mem = dict(obj)
        else:
            raise AuditError(f"{label}: expected a path, a state dict or a module, got {type(obj).__name__}")
        if self._mem is not None:
            self.aliases = _memory_aliases(self._mem)

    def _init_path(self, path: Path) -> None:
        self.path = str(path)
        if not path.is_dir():
            raise AuditError(f"{self.label}: {path} is not a folder")
        if (path / "sidecar.json").is_file():
            from sqlrl.training.checkpoint import validate_checkpoint

            sc, problems = validate_checkpoint(path, verify=True)
            if problems:
                raise AuditError(f"{self.label}: corrupt checkpoint {path}: " + "; ".join(problems))
            if sc.get("weights_kind") != "full":
                raise AuditError(
                    f"{self.label}: {path} is a LoRA adapter checkpoint; export it merged first "
                    "(`sqlrl export CKPT -o DIR --base BASE`) and audit the export"
                )
            self.kind = "checkpoint"
            self.recorded_hash = sc.get("weights_hash")
            self.aliases = dict(sc.get("aliases") or {})
            files = [path / sc["weights_file"]]
        else:
            self.kind = "hf"
            ident = read_json(path / "identity.json") if (path / "identity.json").is_file() else {}
            self.recorded_hash = ident.get("weights_hash")
            if ident.get("weights_stored") == "patch":
                self._init_patch(path, ident)
                return
            if ident.get("weights_stored") is False:
                if not isinstance(ident.get("tensor_hashes"), dict):
                    raise AuditError(
                        f"{self.label}: {path}/identity.json stores no weights and no tensor hashes"
                    )
                self.kind = "hashes"
                self._hashes = ident["tensor_hashes"]
                self.aliases = dict(ident.get("aliases") or {})
                return
            index = path / "model.safetensors.index.json"
            if index.is_file():
                files = sorted({path / f for f in read_json(index)["weight_map"].values()})
            else:
                files = sorted(p for p in path.glob("*.safetensors") if not p.name.startswith("adapter_"))
            if not files:
                if (path / "adapter_config.json").is_file():
                    raise AuditError(
                        f"{self.label}: {path} holds only a LoRA adapter; export it merged first"
                    )
                raise AuditError(f"{self.label}: no *.safetensors weights in {path}")
        from safetensors import safe_open

        for f in files:
            h = safe_open(str(f), framework="pt", device="cpu")
            self._handles[f] = h
            for k in h.keys():
                if k in self._file_of:
                    raise AuditError(f"{self.label}: tensor {k} appears in two files")
                self._file_of[k] = f
        if self.kind == "hf":
            self._hf_tied_aliases(path)

    def _init_patch(self, path: Path, ident: dict) -> None:
        """A final folder stored as a patch over its base: the base (checked against the recorded hash) cast
        to the patch dtype, with the patch's elements replaced, read one tensor at a time."""
        from safetensors import safe_open

        from sqlrl.generation.hashing import torch_dtype
        from sqlrl.generation.models import resolve_model
        from sqlrl.generation.patch import PATCH_FILE

        self.kind = "patch"
        try:
            base_path = resolve_model(str(ident["base"]), fetch=False).path
        except Exception as e:  # noqa: BLE001 -- a missing base: a failed audit that says which
            raise AuditError(
                f"{self.label}: {path} is a patch over base {ident.get('base')!r}, which cannot be found "
                f"({e}); restore that model to audit it"
            ) from e
        self._base = _Source(f"{self.label} base", base_path)
        got = self._base.weights_hash()
        if got != ident.get("base_weights_hash"):
            raise AuditError(
                f"{self.label}: {path} is a patch over base {ident.get('base')!r} with weights hash "
                f"{ident.get('base_weights_hash')}, but that base now has {got}; restore that exact base model"
            )
        self.aliases = self._base.aliases
        self._dtype = torch_dtype(ident["dtype"])
        self._patch = safe_open(str(path / PATCH_FILE), framework="pt", device="cpu")
        self._patched = {k[: -len(":idx")] for k in self._patch.keys() if k.endswith(":idx")}

    def _hf_tied_aliases(self, path: Path) -> None:
        cfg_path = path / "config.json"
        if "lm_head.weight" in self._file_of or not cfg_path.is_file():
            return
        cfg = read_json(cfg_path)
        tied = cfg.get("tie_word_embeddings", (cfg.get("text_config") or {}).get("tie_word_embeddings"))
        if tied is None:
            tied = True  # the transformers default
        embeds = [k for k in self._file_of if k.endswith("embed_tokens.weight")]
        if tied and len(embeds) == 1:
            self.aliases["lm_head.weight"] = embeds[0]

    def names(self) -> set[str]:
        if self._base is not None:
            return self._base.names()
        if self._hashes is not None:
            base = set(self._hashes)
        else:
            base = set(self._mem) if self._mem is not None else set(self._file_of)
        return base | {a for a, c in self.aliases.items() if c in base}

    def canonical(self, name: str) -> str:
        if self._base is not None:
            return self._base.canonical(name)
        if self._hashes is not None:
            return name if name in self._hashes else self.aliases.get(name, name)
        if self._mem is not None or name not in self._file_of:
            return self.aliases.get(name, name)
        return name

    def is_alias(self, name: str) -> bool:
        return self.canonical(name) != name

    def hash_entry(self, name: str) -> dict:
        """{dtype, shape, sha256} recorded for a tensor of a hash-only folder."""
        return self._hashes[self.canonical(name)]

    def get(self, name: str):
        if self._hashes is not None:
            raise AuditError(f"{self.label}: {self.path} stores tensor hashes, not tensors")
        if self._mem is not None:
            return self._mem[name].detach().cpu()
        if self._base is not None:
            return self._patched_tensor(self._base.canonical(name))
        name = self.canonical(name)
        return self._handles[self._file_of[name]].get_tensor(name)

    def _patched_tensor(self, name: str):
        from sqlrl.generation.patch import apply_tensor_patch

        t = self._base.get(name)
        t = t.to(self._dtype) if t.is_floating_point() and t.dtype != self._dtype else t.clone()
        t = t.contiguous()
        if name in self._patched:
            apply_tensor_patch(
                t, self._patch.get_tensor(f"{name}:idx"), self._patch.get_tensor(f"{name}:val")
            )
        return t

    def full_state_dict(self) -> dict:
        if self._mem is not None:
            return self._mem
        sd = {k: self._handles[f].get_tensor(k) for k, f in self._file_of.items()}
        for a, c in self.aliases.items():
            if c in sd and a not in sd:
                sd[a] = sd[c]
        return sd

    def weights_hash(self) -> str:
        from sqlrl.generation.models import weights_hash

        if self._hashes is not None:
            return self.recorded_hash  # the hash recorded from the weights in memory; none stored here
        if self._base is not None:  # rebuilt one tensor at a time
            from sqlrl.generation.hashing import hash_named_tensors

            names = sorted(n for n in self.names() if not self.is_alias(n))
            return hash_named_tensors((n, self.get(n)) for n in names)
        sd = self.full_state_dict()
        try:
            return weights_hash(sd)
        finally:
            del sd

    def describe(self) -> dict:
        return {"path": self.path, "kind": self.kind, "n_tensors": len(self.names())}


def _sum_sq(t) -> float:
    import torch

    flat = t.reshape(-1)
    return sum(
        float((flat[i : i + CHUNK].to(torch.float64) ** 2).sum()) for i in range(0, flat.numel(), CHUNK)
    )


def _compare_hashed(a, entry: dict) -> dict:
    """``a`` (base) against a recorded {dtype, shape, sha256}: identical when the sha256 of a's raw bytes,
    after an exact upcast into the recorded dtype where needed, equals the recorded one."""
    import hashlib

    import torch

    from sqlrl.training.export import tensor_bytes

    want = getattr(torch, str(entry.get("dtype")), None)
    rec: dict[str, Any] = {"dtype_a": str(a.dtype).removeprefix("torch."), "dtype_b": entry.get("dtype")}
    x = None
    if want == a.dtype:
        x = a
    elif isinstance(want, torch.dtype) and _lossless_common(a.dtype, want) == want:
        x = a.to(want)
    rec["compared_as"] = f"sha256 of {entry.get('dtype')} bytes"
    identical = x is not None and hashlib.sha256(tensor_bytes(x)).hexdigest() == entry.get("sha256")
    base_sq = _sum_sq(a)
    base_l2 = math.sqrt(base_sq) if math.isfinite(base_sq) else float("nan")
    known = 0 if identical else None  # a hash mismatch says that, not by how much
    rec.update(
        identical=identical,
        changed_elements=known,
        value_changed_elements=known,
        numel=a.numel(),
        delta_l2=0.0 if identical else None,
        max_abs_delta=0.0 if identical else None,
        base_l2=_num(base_l2),
        relative_change=0.0 if identical else None,
        _sq=0.0,
        _base_sq=base_sq,
    )
    return rec


def _memory_aliases(sd: dict) -> dict[str, str]:
    """{alias: canonical} for entries that are the very same tensor view (tied weights)."""
    seen: dict[tuple, str] = {}
    aliases: dict[str, str] = {}
    for name, t in sd.items():
        if not hasattr(t, "untyped_storage") or t.numel() == 0:
            continue
        key = (
            t.untyped_storage().data_ptr(),
            t.storage_offset(),
            tuple(t.shape),
            tuple(t.stride()),
            t.dtype,
            t.device,
        )
        if key in seen:
            aliases[name] = seen[key]
        else:
            seen[key] = name
    return aliases


def _int_view(t):
    import torch

    flat = t.contiguous().reshape(-1)
    size = flat.element_size()
    if flat.dtype == torch.bool:
        return flat.view(torch.uint8)
    return flat.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size])


def _num(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _lossless_common(da, db):
    """The wider dtype when one floating dtype converts exactly into the other (bf16/f16 -> f32 -> f64)."""
    import torch

    exact_into = {
        torch.bfloat16: (torch.float32, torch.float64),
        torch.float16: (torch.float32, torch.float64),
        torch.float32: (torch.float64,),
    }
    if db in exact_into.get(da, ()):
        return db
    if da in exact_into.get(db, ()):
        return da
    return None


def _compare(a, b, cast_base: bool = False) -> dict:
    """Bit-level and numeric comparison of two same-shape tensors (b - a), float64 accumulation; with
    ``cast_base`` a floating ``a`` is first cast to ``b``'s floating dtype."""
    import torch

    rec: dict[str, Any] = {
        "dtype_a": str(a.dtype).removeprefix("torch."),
        "dtype_b": str(b.dtype).removeprefix("torch."),
    }
    if cast_base and a.dtype != b.dtype and a.is_floating_point() and b.is_floating_point():
        a = a.to(b.dtype)
        rec["compared_as"] = f"base cast to {rec['dtype_b']}"
    same_dtype = a.dtype == b.dtype
    wide = _lossless_common(a.dtype, b.dtype)
    if same_dtype:
        ia, ib = _int_view(a), _int_view(b)
        changed = int((ia != ib).sum())
        identical = changed == 0
    elif wide is not None:
        # e.g. a bf16 base vs a float32 export: the upcast is exact, so bit equality after it is
        # bit equality of the values (and -0.0 stays -0.0)
        ia, ib = _int_view(a.to(wide)), _int_view(b.to(wide))
        changed = int((ia != ib).sum())
        identical = changed == 0
        rec["compared_as"] = str(wide).removeprefix("torch.")
    else:
        changed = None
        identical = False
    af, bf = a.reshape(-1), b.reshape(-1)
    sq = base_sq = 0.0
    mx = 0.0
    numeric_changed = 0
    for i in range(0, af.numel(), CHUNK):
        x = af[i : i + CHUNK].to(torch.float64)
        y = bf[i : i + CHUNK].to(torch.float64)
        d = y - x
        sq += float((d * d).sum())
        base_sq += float((x * x).sum())
        if d.numel():
            mx = max(mx, float(d.abs().max()))
        numeric_changed += int((d != 0).sum())  # NaN deltas count as changed
    l2 = math.sqrt(sq) if math.isfinite(sq) else float("nan")
    base_l2 = math.sqrt(base_sq) if math.isfinite(base_sq) else float("nan")
    rec.update(
        identical=identical,
        changed_elements=changed if changed is not None else numeric_changed,
        value_changed_elements=numeric_changed,  # bits may differ with equal values (-0.0 vs 0.0)
        numel=af.numel(),
        delta_l2=_num(l2),
        max_abs_delta=_num(mx),
        base_l2=_num(base_l2),
        relative_change=_num(l2 / base_l2) if base_l2 > 0 else (0.0 if l2 == 0 else None),
        _sq=sq,
        _base_sq=base_sq,
    )
    return rec


def _summarise(recs: list[dict], top_k: int, full: bool) -> dict:
    sq = sum(r["_sq"] for r in recs)
    base_sq = sum(r["_base_sq"] for r in recs)
    clean = [{k: v for k, v in r.items() if not k.startswith("_")} for r in recs]
    unsized = [r["name"] for r in clean if r["changed_elements"] is None]  # hash mismatch, size unknown
    ranked = sorted(clean, key=lambda r: (r["delta_l2"] is None, -(r["delta_l2"] or 0.0), r["name"]))
    ranked_nonfinite_first = [r for r in ranked if r["delta_l2"] is None] + [
        r for r in ranked if r["delta_l2"] is not None
    ]
    l2 = math.sqrt(sq) if math.isfinite(sq) else float("nan")
    base_l2 = math.sqrt(base_sq) if math.isfinite(base_sq) else float("nan")
    out = {
        "summary": {
            "n_tensors": len(recs),
            "n_changed": sum(1 for r in recs if not r["identical"]),
            "n_elements": sum(r["numel"] for r in recs),
            "n_changed_elements": sum(r["changed_elements"] or 0 for r in recs),
            "n_value_changed_elements": sum(r["value_changed_elements"] or 0 for r in recs),
            "changed_by_hash_only": unsized,
            "delta_l2": _num(l2),
            "base_l2": _num(base_l2),
            "relative_change": _num(l2 / base_l2) if base_l2 > 0 else None,
            "max_abs_delta": max((r["max_abs_delta"] or 0.0 for r in recs), default=0.0),
            "nonfinite_tensors": [
                r["name"] for r in clean if r["delta_l2"] is None and r["name"] not in unsized
            ],
            "dtype_changed": [r["name"] for r in clean if r["dtype_a"] != r["dtype_b"]],
        },
        "top": ranked_nonfinite_first[:top_k],
    }
    if full:
        out["all"] = sorted(clean, key=lambda r: r["name"])
    return out


def audit_weights(
    base: Any,
    trained: Any,
    no_update: Any = None,
    *,
    reloaded: Any = None,
    expect_hash: str | None = None,
    top_k: int = 10,
    full: bool = False,
    hashes: bool = True,
) -> dict:
    """Compare ``trained`` (and ``no_update``) against ``base`` tensor by tensor; see module docstring.
    Returns a JSON-serialisable dict with ``passed``, ``verdicts``, ``errors``, ``tensors``, ``hashes``."""
    errors: list[str] = []
    sources: dict[str, _Source] = {}
    for label, obj in (
        ("base", base),
        ("trained", trained),
        ("no_update", no_update),
        ("reloaded", reloaded),
    ):
        if obj is None:
            continue
        try:
            sources[label] = _Source(label, obj)
        except AuditError as e:
            errors.append(str(e))
        except Exception as e:  # noqa: BLE001 -- unreadable file: a failed audit, not a crash
            errors.append(f"{label}: cannot read {obj!r}: {type(e).__name__}: {e}")

    for label in ("base", "reloaded"):  # these must be weights that can be read back, not hashes
        if label in sources and sources[label].kind == "hashes":
            errors.append(
                f"{label}: {sources.pop(label).path} stores only tensor hashes; give the model folder "
                "its identity.json names (weights_in)"
            )
    verdicts: dict[str, bool | None] = {
        "trained_changed": None,
        "no_update_identical": None,
        "reloaded_identity": None,
    }
    tensors: dict[str, Any] = {}
    b = sources.get("base")
    for label in ("trained", "no_update"):
        other = sources.get(label)
        if b is None or other is None:
            if label == "trained" or no_update is not None:
                verdicts["trained_changed" if label == "trained" else "no_update_identical"] = False
            continue
        bn, on = b.names(), other.names()
        structural: list[str] = []
        only_b, only_o = sorted(bn - on), sorted(on - bn)
        if only_b:
            structural.append(f"{label}: missing {len(only_b)} tensor(s) present in base, e.g. {only_b[:5]}")
        if only_o:
            structural.append(f"{label}: {len(only_o)} extra tensor(s) not in base, e.g. {only_o[:5]}")
        recs = []
        for name in sorted(bn & on):
            if b.is_alias(name) and other.is_alias(name):
                continue  # tied: the canonical tensor is compared
            ta = b.get(name)
            tb = other.hash_entry(name) if other.kind == "hashes" else other.get(name)
            shape_b = list(tb["shape"]) if other.kind == "hashes" else list(tb.shape)
            if list(ta.shape) != shape_b:
                structural.append(f"{label}: tensor {name} shape {shape_b} != base {list(ta.shape)}")
                continue
            if other.kind == "hashes":
                rec = _compare_hashed(ta, tb)
            else:
                rec = _compare(ta, tb, cast_base=label == "trained")
            rec["name"] = name
            rec["shape"] = list(ta.shape)
            recs.append(rec)
            del ta, tb
        errors.extend(structural)
        tensors[label] = _summarise(recs, top_k, full)
        if label == "trained":
            verdicts["trained_changed"] = (not structural) and any(not r["identical"] for r in recs)
        else:
            verdicts["no_update_identical"] = (
                (not structural) and all(r["identical"] for r in recs) and bool(recs)
            )
            tensors[label]["summary"]["first_changed"] = sorted(
                r["name"] for r in recs if not r["identical"]
            )[:10]

    hash_out: dict[str, str | None] = {}
    if hashes:
        for label, src in sources.items():
            try:
                hash_out[label] = src.weights_hash()
            except Exception as e:  # noqa: BLE001
                errors.append(f"{label}: cannot hash: {type(e).__name__}: {e}")
                hash_out[label] = None
    t = sources.get("trained")
    recorded = t.recorded_hash if t is not None else None
    hash_out["trained_recorded"] = recorded
    hash_out["expected"] = expect_hash
    identity_detail = None
    if reloaded is not None or expect_hash is not None or recorded is not None:
        target = expect_hash or recorded or hash_out.get("trained")
        subject_label = "reloaded" if reloaded is not None else "trained"
        subject = hash_out.get(subject_label)
        ok = target is not None and subject is not None and subject == target
        identity_detail = {"subject": subject_label, "subject_hash": subject, "target_hash": target}
        if expect_hash and recorded and expect_hash != recorded:
            ok = False
            identity_detail["problem"] = (
                f"expected hash {expect_hash} != hash recorded with trained {recorded}"
            )
        verdicts["reloaded_identity"] = ok

    passed = (
        not errors
        and all(v is not False for v in verdicts.values())
        and verdicts["trained_changed"] is not None
    )
    return {
        "passed": passed,
        "verdicts": verdicts,
        "errors": errors,
        "identity": identity_detail,
        "hashes": hash_out,
        "sources": {k: v.describe() for k, v in sources.items()},
        "tensors": tensors,
    }


def weights_hash_of(path: str | Path) -> str:
    """The weights hash `audit_weights` records (``hashes``) for the model at `path`; AuditError (or the
    reader's error) when it cannot be read."""
    return _Source("model", str(path)).weights_hash()


__all__ = ["AuditError", "audit_weights", "weights_hash_of"]
