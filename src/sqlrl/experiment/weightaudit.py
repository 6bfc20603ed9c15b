"""The matrix's weight audit, `weights_audit.json`: per cell, the base against that cell's GRPO and
No-update finals (`evidence.weights.audit_weights`), and the reloaded identity of the GRPO final.

What is covered:
- `audit_cells(base, out, cells)`: every (turns, context) cell of the matrix is audited: base vs
  `arms/grpo<suffix>/train/final` and, when that arm ran, `arms/no_update<suffix>/train/final`.
- The file is the first cell's audit (`verdicts`, `hashes`, `sources`, ...: the one-cell layout the
  evidence gate reads), with `passed`, `verdicts` and `errors` over every cell (a verdict is true only
  when it is true in every cell, false when false in one; errors start with the cell key) and `cells`:
  {cell key (`t1`, `t3_c2048`): that cell's audit}. A file without `cells` is a one-cell audit.
- When: a cell is audited as soon as its grpo and no_update arms are done (`audit_point`: after the
  later of the two in experiment.arms), while their weights are surely here, so a session that stops
  in a later arm and is packed without weights has audited them.
- Resume: a cell's earlier audit is kept when it passed on exactly these finals and this base while
  the finals' weights are not here (an experiment resumed elsewhere from a folder carried without
  weights): each final's identity.json hash and the base model's weights hash equal the ones that
  audit recorded. Anything else is audited again.

What is not covered: the validity, sft and grpo_sft arms' weights; a grpo final whose weights are gone
before its cell was audited (a session stopped between grpo and a no_update listed after it): it fails.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlrl.artifacts import read_json, write_json_atomic

log = logging.getLogger(__name__)

VERDICTS = ("trained_changed", "no_update_identical", "reloaded_identity")


def audit_still_holds(done: dict | None, trained: Path, no_update: Path, base_hash) -> bool:
    """Whether the earlier audit `done` of one cell stays (module docstring). `base_hash()` gives the base
    model's weights hash now (called only when everything else matches)."""
    if not isinstance(done, dict) or not done.get("passed"):
        return False
    if any(trained.glob("*.safetensors")) or any(no_update.glob("*.safetensors")):
        return False
    hashes = done.get("hashes") or {}
    for label, final in (("trained", trained), ("no_update", no_update)):
        ident = final / "identity.json"
        recorded = read_json(ident).get("weights_hash") if ident.is_file() else None
        if recorded is None or hashes.get(label) != recorded:
            return False
    return hashes.get("base") is not None and hashes.get("base") == base_hash()


def _earlier(path: Path, first_key: str) -> dict:
    """{cell key: audit} of an earlier weights_audit.json ({} when there is none)."""
    if not path.is_file():
        return {}
    done = read_json(path)
    cells = done.get("cells")
    return dict(cells) if isinstance(cells, dict) else {first_key: done}


def combine(audits: dict[str, dict]) -> dict:
    """weights_audit.json's content from {cell key: audit} in cell order (module docstring)."""
    first = next(iter(audits.values()))
    verdicts = {}
    for v in VERDICTS:
        got = [a.get("verdicts", {}).get(v) for a in audits.values()]
        verdicts[v] = False if False in got else None if None in got else True
    errors = [f"{k}: {e}" for k, a in audits.items() for e in a.get("errors") or []]
    passed = all(a.get("passed") is True for a in audits.values())
    return {**first, "passed": passed, "verdicts": verdicts, "errors": errors, "cells": audits}


def audit_point(arms: tuple[str, ...]) -> str | None:
    """The arm kind after which a cell is audited: the later of grpo and no_update (None without grpo)."""
    return [k for k in arms if k in ("grpo", "no_update")][-1] if "grpo" in arms else None


def audit_cells(base: Path, out: Path, cells: list[tuple[str, str]], now: set[str] | None = None) -> None:
    """Write out/weights_audit.json for `cells` ([(cell key, arm-name suffix)] in run order), auditing the
    cells whose keys are in `now` (every cell when None); another cell's earlier audit is kept as it is,
    and a cell without one is left out."""
    from sqlrl.evidence.weights import audit_weights, weights_hash_of

    path = out / "weights_audit.json"
    earlier = _earlier(path, cells[0][0])
    base_hash: list[str | None] = []

    def hash_now() -> str | None:
        if not base_hash:
            try:
                base_hash.append(weights_hash_of(base))
            except Exception as e:  # noqa: BLE001 -- an unreadable base: audit again (which says why)
                log.warning(f"[experiment] cannot hash the base model {base}: {type(e).__name__}: {e}")
                base_hash.append(None)
        return base_hash[0]

    audits: dict[str, dict] = {}
    for key, suffix in cells:
        if now is not None and key not in now:
            if key in earlier:
                audits[key] = earlier[key]
            continue
        trained = out / "arms" / f"grpo{suffix}" / "train" / "final"
        no_upd = out / "arms" / f"no_update{suffix}" / "train" / "final"
        if audit_still_holds(earlier.get(key), trained, no_upd, hash_now):
            log.info(f"[experiment] weight audit of {key} kept: it audited these finals and this base")
            audits[key] = earlier[key]
            continue
        ident = trained / "identity.json"
        audits[key] = audit_weights(
            str(base),
            str(trained),
            str(no_upd) if no_upd.exists() else None,
            reloaded=str(trained),
            expect_hash=read_json(ident).get("weights_hash") if ident.exists() else None,
        )
    if audits:
        write_json_atomic(path, combine(audits))
