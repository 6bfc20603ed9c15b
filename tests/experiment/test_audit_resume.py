"""The matrix's weight audit: every cell is audited, and a cell's audit done where the finals' weights
were is kept when the experiment resumes without them, on the same finals and the same base model.

Real safetensors folders (two small tensors): the base, and per cell a GRPO final and a No-update final.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from sqlrl.experiment import matrix, weightaudit

torch = pytest.importorskip("torch")


def _save(folder: Path, tensors: dict) -> str:
    from safetensors.torch import save_file

    from sqlrl.generation.models import weights_hash

    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    h = weights_hash(tensors)
    (folder / "identity.json").write_text(json.dumps({"weights_hash": h}))
    return h


def _base_tensors(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(4, 4, generator=g), "b": torch.zeros(4)}


def _matrix(tmp_path: Path, suffixes: dict[str, bool]) -> tuple[Path, Path]:
    """(out, base): per suffix a grpo final (changed from base when True) and a No-update final (= base)."""
    base = tmp_path / "base"
    _save(base, _base_tensors())
    out = tmp_path / "exp"
    for suffix, changed in suffixes.items():
        trained = _base_tensors()
        if changed:
            trained["w"][0, 0] += 1.0
        _save(out / "arms" / f"grpo{suffix}" / "train" / "final", trained)
        _save(out / "arms" / f"no_update{suffix}" / "train" / "final", _base_tensors())
    return out, base


def _run(out: Path, base: Path, exp: matrix.ExperimentConfig, monkeypatch) -> dict:
    monkeypatch.setattr(matrix, "load_model_path", lambda name: base)
    matrix._audit_weights(SimpleNamespace(model=SimpleNamespace(name="m")), exp, out)
    return json.loads((out / "weights_audit.json").read_text())


def test_every_cell_is_audited(tmp_path, monkeypatch):
    """The 3-turn cell's GRPO final equals the base: its audit fails, and so does the file's verdict."""
    out, base = _matrix(tmp_path, {"": True, "_t3": False})
    exp = matrix.ExperimentConfig(arms=("base", "grpo", "no_update"), turns=(1, 3))
    wa = _run(out, base, exp, monkeypatch)
    assert list(wa["cells"]) == ["t1", "t3"]
    assert wa["cells"]["t1"]["passed"] is True and wa["cells"]["t3"]["passed"] is False
    assert wa["cells"]["t3"]["verdicts"]["trained_changed"] is False
    assert wa["passed"] is False
    assert wa["verdicts"] == {
        "trained_changed": False,
        "no_update_identical": True,
        "reloaded_identity": True,
    }
    # the one-cell layout at the top (what the evidence gate reads): the first cell's details
    assert wa["sources"] == wa["cells"]["t1"]["sources"] and wa["hashes"] == wa["cells"]["t1"]["hashes"]


def test_the_gate_reads_a_failed_later_cell(tmp_path, monkeypatch):
    from sqlrl.evidence.gate import check_weights_audit

    out, base = _matrix(tmp_path, {"_c2048": True, "_c4096": False})
    exp = matrix.ExperimentConfig(arms=("base", "grpo", "no_update"), context_tokens=(2048, 4096))
    _run(out, base, exp, monkeypatch)
    check = check_weights_audit(SimpleNamespace(audit=lambda n: json.loads((out / n).read_text()), dir=out))
    assert not check.passed and "weight audit did not pass (passed=false)" in check.problems


def _drop_weights(out: Path) -> None:
    for f in out.glob("arms/*/train/final/*.safetensors"):
        f.unlink()


def test_kept_when_finals_and_base_match_and_weights_are_gone(tmp_path, monkeypatch):
    out, base = _matrix(tmp_path, {"": True, "_t3": True})
    exp = matrix.ExperimentConfig(arms=("base", "grpo", "no_update"), turns=(1, 3))
    first = _run(out, base, exp, monkeypatch)
    assert first["passed"] is True
    _drop_weights(out)
    calls = []
    monkeypatch.setattr("sqlrl.evidence.weights.audit_weights", lambda *a, **k: calls.append(a) or {})
    assert _run(out, base, exp, monkeypatch) == first and calls == []


def test_audited_again_when_the_base_changed(tmp_path, monkeypatch):
    """The same finals, but the base model here is not the one audited: never carried forward."""
    out, base = _matrix(tmp_path, {"": True})
    exp = matrix.ExperimentConfig(arms=("base", "grpo", "no_update"))
    assert _run(out, base, exp, monkeypatch)["passed"] is True
    _drop_weights(out)
    _save(base, _base_tensors(seed=1))
    wa = _run(out, base, exp, monkeypatch)
    assert wa["passed"] is False and wa["errors"]  # audited again: the finals' weights are not here


def test_an_earlier_one_cell_file_is_read_as_the_first_cell(tmp_path):
    from sqlrl.evidence.weights import weights_hash_of

    out, base = _matrix(tmp_path, {"": True})
    arms, final = out / "arms", "train/final"
    idents = {a: json.loads((arms / a / final / "identity.json").read_text()) for a in ("grpo", "no_update")}
    old = {
        "passed": True,
        "hashes": {
            "base": weights_hash_of(base),
            "trained": idents["grpo"]["weights_hash"],
            "no_update": idents["no_update"]["weights_hash"],
        },
    }
    (out / "weights_audit.json").write_text(json.dumps(old))
    _drop_weights(out)
    earlier = weightaudit._earlier(out / "weights_audit.json", "t1")

    def holds(done: dict) -> bool:
        return weightaudit.audit_still_holds(
            done, arms / "grpo" / final, arms / "no_update" / final, lambda: weights_hash_of(base)
        )

    assert list(earlier) == ["t1"] and holds(earlier["t1"])
    assert not holds({**old, "hashes": {**old["hashes"], "trained": "sha256:other"}})  # other finals
    assert not holds({**old, "hashes": {**old["hashes"], "base": "sha256:other"}})  # another base
    assert not holds({**old, "passed": False})  # a failed audit is never carried forward
    _save(arms / "grpo" / final, _base_tensors())
    assert not holds(old)  # the weights are here: audit them again


def test_a_cell_audited_early_is_kept_as_it_is_and_the_rest_are_audited(tmp_path, monkeypatch):
    """The matrix audits a cell right after its grpo and no_update arms (`now` = that cell), then the
    other cells at its end: the file holds only the cells audited so far, each audited once."""
    out, base = _matrix(tmp_path, {"": True, "_t3": True})
    exp = matrix.ExperimentConfig(arms=("base", "grpo", "no_update"), turns=(1, 3))
    from sqlrl.evidence import weights

    real, calls = weights.audit_weights, []
    monkeypatch.setattr(weights, "audit_weights", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    monkeypatch.setattr(matrix, "load_model_path", lambda name: base)
    cfg = SimpleNamespace(model=SimpleNamespace(name="m"))
    matrix._audit_weights(cfg, exp, out, now={"t1"})
    wa = json.loads((out / "weights_audit.json").read_text())
    assert list(wa["cells"]) == ["t1"] and wa["passed"] is True
    matrix._audit_weights(cfg, exp, out, now={"t3"})
    both = json.loads((out / "weights_audit.json").read_text())
    assert list(both["cells"]) == ["t1", "t3"] and both["cells"]["t1"] == wa["cells"]["t1"]
    assert calls == [str(out / "arms/grpo/train/final"), str(out / "arms/grpo_t3/train/final")]
    matrix._audit_weights(cfg, exp, out, now=set())  # nothing left to audit: the file stays
    assert json.loads((out / "weights_audit.json").read_text()) == both and len(calls) == 2


def test_a_cell_is_audited_after_the_later_of_grpo_and_no_update():
    assert weightaudit.audit_point(("base", "grpo", "no_update", "validity")) == "no_update"
    assert weightaudit.audit_point(("base", "no_update", "grpo", "validity")) == "grpo"
    assert weightaudit.audit_point(("base", "grpo", "validity")) == "grpo"
    assert weightaudit.audit_point(("base", "no_update", "sft")) is None  # no grpo: no audit
