"""A weight audit done where the finals' weights were is kept when the experiment resumes without them."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from sqlrl.experiment import matrix


def _folder(tmp_path: Path, *, audit_trained: str, weights: bool = False, passed: bool = True) -> Path:
    out = tmp_path / "exp"
    for arm, h in (("grpo", "sha256:aa"), ("no_update", "sha256:bb")):
        final = out / "arms" / arm / "train" / "final"
        final.mkdir(parents=True)
        (final / "identity.json").write_text(json.dumps({"weights_hash": h}))
        if weights:
            (final / "patch.safetensors").write_bytes(b"x")
    audit = {"passed": passed, "hashes": {"trained": audit_trained, "no_update": "sha256:bb"}}
    (out / "weights_audit.json").write_text(json.dumps(audit))
    return out


def _holds(out: Path) -> bool:
    arms = out / "arms"
    return matrix._audit_still_holds(
        out / "weights_audit.json", arms / "grpo/train/final", arms / "no_update/train/final"
    )


def test_kept_when_hashes_match_and_weights_are_gone(tmp_path):
    assert _holds(_folder(tmp_path, audit_trained="sha256:aa"))


@pytest.mark.parametrize(
    "kw",
    [
        {"audit_trained": "sha256:other"},  # the audit was of other weights
        {"audit_trained": "sha256:aa", "weights": True},  # the weights are here: audit them again
        {"audit_trained": "sha256:aa", "passed": False},  # a failed audit is never carried forward
    ],
)
def test_audited_again_otherwise(tmp_path, kw):
    assert not _holds(_folder(tmp_path, **kw))


def test_audit_weights_does_not_rerun_a_kept_audit(tmp_path, monkeypatch):
    out = _folder(tmp_path, audit_trained="sha256:aa")
    before = (out / "weights_audit.json").read_text()
    calls = []
    monkeypatch.setattr("sqlrl.evidence.weights.audit_weights", lambda *a, **k: calls.append(a) or {})
    monkeypatch.setattr(matrix, "load_model_path", lambda name: tmp_path / "base")
    exp = matrix.ExperimentConfig(arms=("base", "grpo", "no_update"), turns=(1,))
    matrix._audit_weights(SimpleNamespace(model=SimpleNamespace(name="m")), exp, out)
    assert calls == [] and (out / "weights_audit.json").read_text() == before
