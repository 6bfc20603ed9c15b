"""Checkpoints: atomic save, corruption detection, fallback, exact resume, pruning, HF export, LoRA."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from sqlrl.artifacts import read_json
from sqlrl.cli import export as export_cli
from sqlrl.generation.models import weights_hash
from sqlrl.training import checkpoint as ck
from sqlrl.training import export as ex

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def tiny_model(seed: int = 0, tie: bool = True):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
    )
    return AutoModelForCausalLM.from_config(cfg).float()


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(62)} | {"<unk>": 62, "<eos>": 63}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")


def train_step(model, opt, seed: int = 123):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (2, 8), generator=g)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def make_run(tmp_path: Path, steps=(1, 2), keep_last=5):
    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for s in steps:
        train_step(model, opt, seed=s)
        ck.save_checkpoint(
            tmp_path,
            s,
            model=model,
            optimizer=opt,
            data_cursor={"epoch": 0, "index": s},
            config_hash="cfg",
            keep_last=keep_last,
        )
    return model, opt


def test_save_then_load_latest(tmp_path):
    model, _ = make_run(tmp_path, steps=(1, 2))
    info = ck.load_latest(tmp_path)
    assert info is not None and info.step == 2 and info.path.name == "step_000002"
    sc = info.sidecar
    assert sc["weights_hash"] == weights_hash(model)
    assert sc["weights_kind"] == "full" and sc["optimizer"] and not sc["scheduler"]
    assert {"model.safetensors", "optimizer.pt", "rng.pt", "config.json"} <= set(sc["files"])
    assert sc["aliases"] == {"lm_head.weight": "model.embed_tokens.weight"}
    assert sc["data_cursor"] == {"epoch": 0, "index": 2} and sc["config_hash"] == "cfg"
    man = read_json(tmp_path / "checkpoints" / "manifest.json")
    assert [e["step"] for e in man["checkpoints"]] == [1, 2] and man["latest"] == 2
    assert man["checkpoints"][-1]["weights_hash"] == sc["weights_hash"]
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]
    assert ck.load_latest(tmp_path / "nothing") is None


def test_partial_temp_folder_is_ignored_and_reported(tmp_path):
    make_run(tmp_path, steps=(1,))
    tmp = tmp_path / "checkpoints" / ".step_000002.tmp-99999"
    tmp.mkdir()
    (tmp / "model.safetensors").write_bytes(b"\0" * 10)  # killed mid-write: no sidecar
    info = ck.load_latest(tmp_path)
    assert info.step == 1 and info.partial == [tmp]


def _corrupt(path: Path, how: str) -> str:
    if how == "truncated_weights":
        p = path / "model.safetensors"
        p.write_bytes(p.read_bytes()[:100])
        return "size"
    if how == "missing_sidecar":
        (path / "sidecar.json").unlink()
        return "missing sidecar.json"
    if how == "bad_sidecar":
        (path / "sidecar.json").write_text('{"step": 2, "weights', encoding="utf-8")
        return "not valid JSON"
    if how == "wrong_sha":
        p = path / "optimizer.pt"
        data = bytearray(p.read_bytes())
        data[-20] ^= 0xFF
        p.write_bytes(bytes(data))
        return "optimizer.pt: sha256"
    if how == "missing_file":
        (path / "rng.pt").unlink()
        return "missing file rng.pt"
    raise AssertionError(how)


@pytest.mark.parametrize(
    "how", ["truncated_weights", "missing_sidecar", "bad_sidecar", "wrong_sha", "missing_file"]
)
def test_corrupt_checkpoint_is_named_and_fallback_uses_previous(tmp_path, how, caplog):
    make_run(tmp_path, steps=(1, 2))
    newest = tmp_path / "checkpoints" / "step_000002"
    expected = _corrupt(newest, how)
    older = tmp_path / "checkpoints" / "step_000001"
    with pytest.raises(ck.CheckpointError) as ei:
        ck.load_latest(tmp_path)
    assert str(newest) in str(ei.value) and expected in str(ei.value)
    assert f"the newest valid older checkpoint is {older} (step 1)" in str(ei.value)
    assert "--resume-from-valid" in str(ei.value) and "\n" not in str(ei.value)
    with caplog.at_level("WARNING"):
        info = ck.load_latest(tmp_path, fallback=True)
    assert info.step == 1
    assert info.skipped[0]["path"] == str(newest)
    assert len(caplog.records) == 1 and str(newest) in caplog.text
    assert f"resuming from the newest valid older checkpoint {older} (step 1)" in caplog.text


def test_remove_partial_deletes_interrupted_saves_only(tmp_path, caplog):
    make_run(tmp_path, steps=(1,))
    ckdir = tmp_path / "checkpoints"
    (ckdir / ".step_000002.tmp-123").mkdir()
    (ckdir / ".step_000002.tmp-123" / "model.safetensors").write_bytes(b"partial")
    (ckdir / ".step_000003.tmp-45").mkdir()
    with caplog.at_level("WARNING"):
        assert ck.remove_partial(tmp_path) == [".step_000002.tmp-123", ".step_000003.tmp-45"]
    assert sorted(p.name for p in ckdir.iterdir()) == ["manifest.json", "step_000001"]
    assert "removed 2 interrupted checkpoint save(s)" in caplog.text
    assert ck.remove_partial(tmp_path) == [] and ck.remove_partial(tmp_path / "nowhere") == []


def test_remove_partial_cleans_killed_replaces_and_prunes_and_keeps_every_checkpoint(tmp_path):
    import shutil

    make_run(tmp_path, steps=(1, 2, 3))
    ckdir = tmp_path / "checkpoints"
    # killed mid-prune: step 1 renamed for deletion, and an older one half deleted
    (ckdir / "step_000001").rename(ckdir / ".step_000001.del-77")
    (ckdir / ".step_000000.del-78").mkdir()
    (ckdir / ".step_000000.del-78" / "rng.pt").write_bytes(b"half")
    # killed in replace_dir after both renames: the moved-aside copy of step 2 is left
    shutil.copytree(ckdir / "step_000002", ckdir / ".step_000002.old-55")
    # killed in replace_dir between the renames: step 3 moved aside, its re-save still a temp folder
    shutil.copytree(ckdir / "step_000003", ckdir / ".step_000003.tmp-66")
    (ckdir / "step_000003").rename(ckdir / ".step_000003.old-66")
    (ckdir / ".step_000009.old-5").write_text("a file, not a folder: not ours")
    assert ck.remove_partial(tmp_path) == [
        ".step_000000.del-78",
        ".step_000001.del-77",
        ".step_000002.old-55",
        ".step_000003.tmp-66",
    ]
    names = sorted(p.name for p in ckdir.iterdir())
    assert names == [".step_000009.old-5", "manifest.json", "step_000002", "step_000003"]
    for step in (2, 3):
        assert ck.validate_checkpoint(ckdir / f"step_{step:06d}")[1] == []
    assert ck.load_latest(tmp_path).step == 3
    assert ck.remove_partial(tmp_path) == []


def test_no_valid_checkpoint_raises_even_with_fallback(tmp_path):
    make_run(tmp_path, steps=(1,))
    _corrupt(tmp_path / "checkpoints" / "step_000001", "truncated_weights")
    with pytest.raises(ck.CheckpointError, match="no valid checkpoint"):
        ck.load_latest(tmp_path, fallback=True)


def test_size_check_without_verify_and_sha_with_verify(tmp_path):
    make_run(tmp_path, steps=(1,))
    _corrupt(tmp_path / "checkpoints" / "step_000001", "wrong_sha")  # same size, different bytes
    assert ck.load_latest(tmp_path, verify=False).step == 1
    with pytest.raises(ck.CheckpointError):
        ck.load_latest(tmp_path, verify=True)


def test_restore_round_trips_model_optimizer_scheduler_rng_cursor(tmp_path):
    model = tiny_model(seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    train_step(model, opt, seed=1)
    sched.step()
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    ck.save_checkpoint(tmp_path, 1, model=model, optimizer=opt, scheduler=sched, data_cursor={"index": 17})
    expected_draws = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    train_step(model, opt, seed=2)
    sched.step()
    expected_state = {k: v.clone() for k, v in model.state_dict().items()}

    # a fresh process-like state: different weights, fresh optimizer, scrambled RNG
    model2 = tiny_model(seed=99)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2, weight_decay=0.1)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0 / (1 + s))
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    info = ck.load_latest(tmp_path)
    out = ck.restore_checkpoint(info, model2, opt2, sched2)
    assert out["step"] == 1 and out["data_cursor"] == {"index": 17}
    assert set(out["rng"]) >= {"python", "numpy", "torch_cpu"}
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected_draws
    assert sched2.last_epoch == 1 and opt2.param_groups[0]["lr"] == pytest.approx(5e-3)
    train_step(model2, opt2, seed=2)
    sched2.step()
    for k, v in model2.state_dict().items():
        assert torch.equal(v, expected_state[k]), k


def test_restore_detects_weights_hash_mismatch(tmp_path):
    from safetensors.torch import load_file, save_file

    from sqlrl.artifacts import sha256_file, write_json_atomic

    make_run(tmp_path, steps=(1,))
    path = tmp_path / "checkpoints" / "step_000001"
    sd = load_file(str(path / "model.safetensors"))
    sd["model.norm.weight"][0] += 1.0
    save_file(sd, str(path / "model.safetensors"))
    sc = read_json(path / "sidecar.json")  # a consistent-looking forgery: sidecar files updated
    sc["files"]["model.safetensors"] = {
        "sha256": sha256_file(path / "model.safetensors"),
        "bytes": (path / "model.safetensors").stat().st_size,
    }
    write_json_atomic(path / "sidecar.json", sc)
    info = ck.load_latest(tmp_path)
    with pytest.raises(ck.CheckpointError, match="weights hash"):
        ck.restore_checkpoint(info, tiny_model(seed=3))


def test_keep_last_prunes_old_checkpoints(tmp_path):
    make_run(tmp_path, steps=(1, 2, 3, 4, 5), keep_last=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["manifest.json", "step_000004", "step_000005"]
    man = read_json(tmp_path / "checkpoints" / "manifest.json")
    assert [e["step"] for e in man["checkpoints"]] == [4, 5]


def test_resave_same_step_replaces(tmp_path):
    model, opt = make_run(tmp_path, steps=(1,))
    train_step(model, opt, seed=7)
    ck.save_checkpoint(tmp_path, 1, model=model, optimizer=opt)
    assert ck.load_latest(tmp_path).weights_hash == weights_hash(model)


def test_export_hf_reloads_with_same_hash(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = tiny_model(seed=1)
    ident = ex.export_hf(
        model, tiny_tokenizer(), tmp_path / "final", step=3, source_checkpoint="x/step_000003"
    )
    assert ident["weights_hash"] == weights_hash(model)
    disk = read_json(tmp_path / "final" / "identity.json")
    assert disk["weights_hash"] == ident["weights_hash"] and disk["step"] == 3
    assert disk["source_checkpoint"] == "x/step_000003" and "model.safetensors" in disk["files"]
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    assert weights_hash(reloaded) == ident["weights_hash"]
    assert AutoTokenizer.from_pretrained(tmp_path / "final").eos_token == "<eos>"
    assert [p.name for p in tmp_path.iterdir()] == ["final"]  # no temp folder left


def _lora(model):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(11)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    return get_peft_model(model, cfg)


def test_lora_export_merges_and_keeps_adapter(tmp_path):
    from transformers import AutoModelForCausalLM

    pm = _lora(tiny_model(seed=2))
    before = weights_hash(pm)
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = pm(input_ids=ids).logits
    ident = ex.export_hf(pm, None, tmp_path / "merged")
    assert ident["lora_merged"] and ident["source_weights_hash"] == before
    assert weights_hash(pm) == before  # the training model still has its adapter, unchanged
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not any("lora" in k for k in reloaded.state_dict())
    assert weights_hash(reloaded) == ident["weights_hash"]
    with torch.no_grad():
        got = reloaded(input_ids=ids).logits
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4)


def test_lora_checkpoint_save_restore_and_cli_export(tmp_path):
    base_dir = tmp_path / "base"
    base = tiny_model(seed=4)
    base.save_pretrained(base_dir)
    pm = _lora(tiny_model(seed=4))
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=1e-2)
    train_step(pm, opt)
    path = ck.save_checkpoint(tmp_path / "run", 1, model=pm, optimizer=opt)
    info = ck.load_latest(tmp_path / "run")
    assert info.is_lora and "adapter_model.safetensors" in info.sidecar["files"]
    assert "model.safetensors" not in info.sidecar["files"]
    assert (path / "adapter_config.json").is_file()

    pm2 = _lora(tiny_model(seed=4))
    ck.restore_checkpoint(info, pm2, torch.optim.AdamW([p for p in pm2.parameters() if p.requires_grad]))
    assert weights_hash(pm2) == weights_hash(pm)
    with pytest.raises(ck.CheckpointError, match="weights hash"):  # adapter onto a different base
        ck.restore_checkpoint(info, _lora(tiny_model(seed=5)))

    direct = ex.export_hf(pm, None, tmp_path / "direct")
    assert export_cli.cli_main([str(path), "-o", str(tmp_path / "hf")]) == 1  # LoRA needs --base
    assert (
        export_cli.cli_main([str(tmp_path / "run"), "-o", str(tmp_path / "hf"), "--base", str(base_dir)]) == 0
    )
    ident = read_json(tmp_path / "hf" / "identity.json")
    assert ident["weights_hash"] == direct["weights_hash"] and ident["step"] == 1
    assert ident["source_weights_hash"] == info.weights_hash
    wrong = tmp_path / "wrong_base"
    tiny_model(seed=5).save_pretrained(wrong)
    assert export_cli.cli_main([str(path), "-o", str(tmp_path / "hf2"), "--base", str(wrong)]) == 1
    assert not (tmp_path / "hf2").exists()


def test_cli_export_full_checkpoint(tmp_path):
    from transformers import AutoModelForCausalLM

    model, _ = make_run(tmp_path / "run", steps=(1,))
    assert export_cli.cli_main([str(tmp_path / "run"), "-o", str(tmp_path / "hf")]) == 0
    ident = json.loads((tmp_path / "hf" / "identity.json").read_text())
    assert ident["weights_hash"] == weights_hash(model) == ident["source_weights_hash"]
    assert weights_hash(AutoModelForCausalLM.from_pretrained(tmp_path / "hf")) == ident["weights_hash"]
    assert export_cli.cli_main([str(tmp_path / "empty"), "-o", str(tmp_path / "hf3")]) == 2


def test_zero_lora_merge_is_bit_identical_to_base_including_negative_zero(tmp_path):
    from peft import LoraConfig, get_peft_model

    from sqlrl.evidence.weights import audit_weights

    base = tiny_model(seed=6).to(torch.bfloat16)
    with torch.no_grad():
        base.model.layers[0].self_attn.q_proj.weight[0, :3] = -0.0  # -0.0 + 0.0 would give +0.0
    base_sd = {k: v.clone() for k, v in base.state_dict().items()}
    pm = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))  # B = 0
    ex.export_hf(pm, None, tmp_path / "merged")
    res = audit_weights(base_sd, base_sd, tmp_path / "merged")
    assert res["verdicts"]["no_update_identical"] is True, res["tensors"]["no_update"]["summary"]
