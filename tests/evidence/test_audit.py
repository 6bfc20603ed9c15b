"""Weight audit: trained changed, no-update bit-identical (AdamW lr=0 even with weight decay), a single
flipped element is caught, shape/name mismatches are named, reload identity, CLI exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sqlrl.cli.audit import cli_main
from sqlrl.evidence.weights import audit_weights
from sqlrl.generation.models import weights_hash
from sqlrl.training.checkpoint import save_checkpoint
from sqlrl.training.export import export_hf

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def tiny_model(seed: int = 0):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return AutoModelForCausalLM.from_config(cfg).float()


def step(model, lr: float, weight_decay: float = 0.1):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit")
    base = tiny_model()
    base.save_pretrained(root / "base")
    trained = step(tiny_model(), lr=1e-2)
    export_hf(trained, None, root / "trained", step=1)
    no_update = step(tiny_model(), lr=0.0, weight_decay=0.1)
    no_update.save_pretrained(root / "no_update")
    return root, base, trained, no_update


def test_adamw_lr0_with_weight_decay_is_bit_identical(models):
    _, base, _, no_update = models
    # decoupled decay is p *= 1 - lr*wd = 1 exactly, and the update is scaled by lr = 0
    for (n, a), (_, b) in zip(base.state_dict().items(), no_update.state_dict().items()):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), n


def test_trained_changed_and_no_update_identical(models):
    root, *_ = models
    res = audit_weights(root / "base", root / "trained", root / "no_update")
    assert res["passed"], res["errors"]
    v = res["verdicts"]
    assert (
        v["trained_changed"] is True and v["no_update_identical"] is True and v["reloaded_identity"] is True
    )
    t = res["tensors"]["trained"]
    assert t["summary"]["n_changed"] > 0 and t["summary"]["delta_l2"] > 0
    assert t["summary"]["relative_change"] > 0 and len(t["top"]) == 10
    assert t["top"][0]["delta_l2"] >= t["top"][1]["delta_l2"]
    assert res["tensors"]["no_update"]["summary"]["n_changed"] == 0
    assert res["hashes"]["base"] == res["hashes"]["no_update"] != res["hashes"]["trained"]
    assert res["hashes"]["trained"] == res["hashes"]["trained_recorded"]
    json.dumps(res, allow_nan=False)  # strictly JSON-serialisable


def test_in_memory_state_dicts_and_full_list(models):
    _, base, trained, no_update = models
    res = audit_weights(base.state_dict(), trained, no_update.state_dict(), full=True, top_k=3)
    assert res["passed"] and len(res["tensors"]["trained"]["top"]) == 3
    # the tied lm_head.weight is the embedding tensor: compared once
    assert len(res["tensors"]["trained"]["all"]) == len(base.state_dict()) - 1
    from_files = audit_weights(models[0] / "base", models[0] / "trained")
    assert from_files["tensors"]["trained"]["summary"] == res["tensors"]["trained"]["summary"]
    assert res["verdicts"]["reloaded_identity"] is None  # nothing recorded, nothing reloaded
    assert res["hashes"]["trained"] == weights_hash(trained)


def test_identical_trained_fails(models):
    root, *_ = models
    res = audit_weights(root / "base", root / "no_update")
    assert res["verdicts"]["trained_changed"] is False and not res["passed"]


def test_single_flipped_element_is_detected(models):
    root, base, *_ = models
    sd = {k: v.clone() for k, v in base.state_dict().items()}
    w = sd["model.layers.1.mlp.up_proj.weight"]
    w.view(torch.int32)[3, 5] ^= 1  # one ulp in one element
    res = audit_weights(root / "base", root / "trained", sd)
    assert res["verdicts"]["no_update_identical"] is False and not res["passed"]
    s = res["tensors"]["no_update"]["summary"]
    assert s["first_changed"] == ["model.layers.1.mlp.up_proj.weight"]
    assert s["n_changed"] == 1 and s["n_changed_elements"] == 1


def test_negative_zero_counts_as_change(models):
    _, base, trained, _ = models
    sd = {k: v.clone() for k, v in base.state_dict().items()}
    sd["model.norm.weight"][0] = 0.0
    sd2 = {k: v.clone() for k, v in sd.items()}
    sd2["model.norm.weight"][0] = -0.0
    res = audit_weights(sd, trained, sd2)
    assert res["verdicts"]["no_update_identical"] is False


def test_shape_and_name_mismatch_are_named(models):
    root, base, *_ = models
    sd = {k: v.clone() for k, v in base.state_dict().items()}
    sd["model.norm.weight"] = torch.zeros(7)
    del sd["model.layers.0.self_attn.q_proj.weight"]
    res = audit_weights(root / "base", root / "trained", sd)
    assert not res["passed"] and res["verdicts"]["no_update_identical"] is False
    text = " ".join(res["errors"])
    assert "model.norm.weight" in text and "model.layers.0.self_attn.q_proj.weight" in text


def test_reloaded_identity_and_expect_hash(models, tmp_path):
    root, _, trained, _ = models
    good = audit_weights(root / "base", root / "trained", reloaded=root / "trained")
    assert good["verdicts"]["reloaded_identity"] is True
    bad = audit_weights(root / "base", root / "trained", expect_hash="sha256:" + "0" * 64)
    assert bad["verdicts"]["reloaded_identity"] is False and not bad["passed"]
    # tamper with the export: the recomputed hash no longer matches identity.json
    from safetensors.torch import load_file, save_file

    tampered = tmp_path / "tampered"
    tampered.mkdir()
    for p in (root / "trained").iterdir():
        (tampered / p.name).write_bytes(p.read_bytes())
    sd = load_file(str(tampered / "model.safetensors"))
    sd["model.norm.weight"][1] += 1
    save_file(sd, str(tampered / "model.safetensors"), metadata={"format": "pt"})
    res = audit_weights(root / "base", tampered)
    assert res["verdicts"]["reloaded_identity"] is False and res["verdicts"]["trained_changed"] is True


def test_checkpoint_folder_as_input(models, tmp_path):
    root, _, trained, _ = models
    path = save_checkpoint(tmp_path / "run", 1, model=trained)
    res = audit_weights(root / "base", path, reloaded=root / "trained")
    assert res["passed"] and res["sources"]["trained"]["kind"] == "checkpoint"
    assert res["hashes"]["trained_recorded"] == weights_hash(trained) == res["hashes"]["reloaded"]


def test_unreadable_input_fails_cleanly(models, tmp_path):
    root, *_ = models
    res = audit_weights(root / "base", tmp_path / "missing")
    assert not res["passed"] and "missing" in res["errors"][0]


def _cli(*args):
    cmd = [sys.executable, "-m", "sqlrl.cli", "audit", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ})


@pytest.mark.slow
def test_cli_exit_codes_subprocess(models, tmp_path):
    root, *_ = models
    ok = _cli(
        "weights", "--base", str(root / "base"), "--trained", str(root / "trained"),
        "--no-update", str(root / "no_update"), "--json", "--out", str(tmp_path / "a.json"),
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["passed"] and json.loads(Path(tmp_path / "a.json").read_text())["passed"]
    fail = _cli(
        "weights", "--base", str(root / "base"), "--trained", str(root / "trained"),
        "--no-update", str(root / "trained"),
    )  # fmt: skip
    assert fail.returncode == 1 and "FAILED" in fail.stdout


def test_cli_exit_codes_in_process(models, tmp_path, capsys):
    root, *_ = models
    base, trained = str(root / "base"), str(root / "trained")
    assert cli_main(["weights", "--base", base, "--trained", trained]) == 0
    assert "PASSED" in capsys.readouterr().out
    assert cli_main(["weights", "--base", base, "--trained", trained, "--expect-hash", "sha256:00"]) == 1
    assert cli_main(["weights", "--base", base, "--trained", base]) == 1  # nothing changed
    assert cli_main(["weights", "--base", str(tmp_path / "nope"), "--trained", trained]) == 2
    with pytest.raises(SystemExit) as ei:
        cli_main(["weights", "--base", base])
    assert ei.value.code == 2


def test_leakage_is_forwarded(monkeypatch):
    seen = {}
    import sqlrl.cli.audit as audit_cli

    monkeypatch.setattr(audit_cli, "leakage_main", lambda argv: seen.setdefault("argv", argv) and 7)
    assert cli_main(["leakage", "--exp", "E", "-n", "3"]) == 7
    assert seen["argv"] == ["--exp", "E", "-n", "3"]


def test_bf16_base_vs_float32_export_compares_after_exact_upcast(models):
    """A hub model stored in bf16 and a float32 training export: identical values are identical, one ulp is not."""
    _, base, trained, _ = models
    b16 = {k: v.to(torch.bfloat16) for k, v in base.state_dict().items()}
    f32 = {k: v.float() for k, v in b16.items()}  # exact upcast: what a lr=0 float32 master exports
    res = audit_weights(b16, trained, f32)
    assert res["verdicts"]["no_update_identical"] is True
    bumped = {k: v.clone() for k, v in f32.items()}
    bumped["model.norm.weight"].view(torch.int32)[0] ^= 1  # below bf16 resolution, still a change
    res = audit_weights(b16, trained, bumped)
    assert res["verdicts"]["no_update_identical"] is False
    assert res["tensors"]["no_update"]["summary"]["first_changed"] == ["model.norm.weight"]


def _hash_only_final(model_or_sd, folder: Path, base: str = "BASE") -> Path:
    """A run's final folder as a No-update run writes it: identity.json with every tensor's hash, no weights."""
    from sqlrl.training.export import export_unchanged

    ident = weights_hash(model_or_sd)
    assert export_unchanged(model_or_sd, folder, base=base, base_identity=ident, step=2) is not None
    return folder


def test_hash_only_no_update_is_checked_tensor_by_tensor(models, tmp_path):
    """No weights stored: each base tensor's sha256 must equal the recorded one; one flipped bit is named."""
    root, base, *_ = models
    final = _hash_only_final(base, tmp_path / "final")
    assert not list(final.glob("*.safetensors"))
    res = audit_weights(root / "base", root / "trained", final)
    assert res["passed"] and res["verdicts"]["no_update_identical"] is True
    s = res["tensors"]["no_update"]["summary"]
    # the tiny Llama has 2 x 9 layer tensors + embeddings + final norm; lm_head is tied to the embeddings
    assert s["n_tensors"] == 20 and s["n_changed"] == 0 and s["changed_by_hash_only"] == []
    assert res["sources"]["no_update"]["kind"] == "hashes"
    sd = {k: v.clone() for k, v in base.state_dict().items()}
    sd["model.layers.1.mlp.up_proj.weight"].view(torch.int32)[3, 5] ^= 1
    flipped = _hash_only_final(sd, tmp_path / "flipped")
    res = audit_weights(root / "base", root / "trained", flipped)
    assert res["verdicts"]["no_update_identical"] is False and not res["passed"]
    s = res["tensors"]["no_update"]["summary"]
    assert s["first_changed"] == ["model.layers.1.mlp.up_proj.weight"]
    assert s["changed_by_hash_only"] == ["model.layers.1.mlp.up_proj.weight"] and s["nonfinite_tensors"] == []


def test_hash_only_no_update_against_bf16_base_after_exact_upcast(models, tmp_path):
    _, base, trained, _ = models
    b16 = {k: v.to(torch.bfloat16) for k, v in base.state_dict().items()}
    f32 = {k: v.float() for k, v in b16.items()}
    res = audit_weights(b16, trained, _hash_only_final(f32, tmp_path / "f32"))
    assert res["verdicts"]["no_update_identical"] is True
    # a base that is not the recorded dtype's exact source (float32 recorded, base float32 rounded) differs
    res = audit_weights(base.state_dict(), trained, _hash_only_final(f32, tmp_path / "f32b"))
    assert res["verdicts"]["no_update_identical"] is False


def test_hash_only_folder_cannot_stand_for_base_or_reloaded(models, tmp_path):
    root, base, *_ = models
    final = _hash_only_final(base, tmp_path / "final")
    res = audit_weights(final, root / "trained")
    assert not res["passed"] and any("stores only tensor hashes" in e for e in res["errors"])
    res = audit_weights(root / "base", root / "trained", reloaded=final)
    assert not res["passed"] and any("reloaded" in e and "tensor hashes" in e for e in res["errors"])


def test_export_unchanged_refuses_changed_weights(models, tmp_path):
    from sqlrl.training.export import export_unchanged, final_weights

    _, base, trained, _ = models
    out = tmp_path / "final"
    assert export_unchanged(trained, out, base="B", base_identity=weights_hash(base)) is None
    assert not out.exists()
    _hash_only_final(base, out, base="models/base")
    assert final_weights(out) == "models/base"
    assert final_weights(tmp_path / "elsewhere") == str(tmp_path / "elsewhere")


def test_trained_is_compared_with_the_base_cast_to_its_dtype():
    """A bf16 final whose float32 masters moved by less than a bf16 step IS bf16(base): "unchanged"
    (against the float32 base every element not representable in bf16 would look changed)."""
    base = {k: v.detach().clone() for k, v in tiny_model().state_dict().items()}
    same = {k: v.to(torch.bfloat16) for k, v in base.items()}
    r = audit_weights(base, same, hashes=False)
    assert r["verdicts"]["trained_changed"] is False and r["passed"] is False
    assert r["tensors"]["trained"]["summary"]["n_changed_elements"] == 0
    one = {k: v.clone() for k, v in same.items()}
    one["model.norm.weight"][3] += 1.0
    r = audit_weights(base, one, hashes=False)
    assert r["verdicts"]["trained_changed"] is True
    assert r["tensors"]["trained"]["summary"]["n_changed_elements"] == 1
    assert r["tensors"]["trained"]["top"][0]["compared_as"] == "base cast to bfloat16"


def test_audit_of_a_patch_final_rebuilds_it_and_refuses_a_changed_base(tmp_path):
    tiny_model().save_pretrained(tmp_path / "base")
    trained = tiny_model()
    with torch.no_grad():
        trained.model.layers[0].mlp.up_proj.weight.view(-1)[:5] += 1.0
    base_id = weights_hash(tiny_model())  # the base's hash as loaded
    ident = export_hf(
        trained,
        None,
        tmp_path / "final",
        dtype="bfloat16",
        base=str(tmp_path / "base"),
        base_identity=base_id,
    )
    assert ident["weights_stored"] == "patch"
    r = audit_weights(str(tmp_path / "base"), str(tmp_path / "final"), reloaded=str(tmp_path / "final"))
    assert r["passed"] and r["verdicts"] == {
        "trained_changed": True,
        "no_update_identical": None,
        "reloaded_identity": True,
    }
    assert r["sources"]["trained"]["kind"] == "patch"
    assert r["tensors"]["trained"]["summary"]["n_changed_elements"] == 5
    assert r["hashes"]["reloaded"] == ident["weights_hash"]
    tiny_model(seed=3).save_pretrained(tmp_path / "base")
    r = audit_weights(str(tmp_path / "base"), str(tmp_path / "final"), reloaded=str(tmp_path / "final"))
    assert not r["passed"] and any("restore that exact base model" in e for e in r["errors"])
