"""Final weights in the generation dtype: a patch over the base when smaller, dense otherwise; the patch
folder reloads (load_model, a warm start) with the recorded hash, refuses a changed base, and
`sqlrl export` turns it into a plain Hugging Face folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sqlrl import config as C
from sqlrl.cli import export as export_cli
from sqlrl.generation.models import ModelError, load_model, weights_hash
from sqlrl.training.export import export_hf
from sqlrl.training.runfolder import export_final

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_checkpoint import tiny_model, tiny_tokenizer  # noqa: E402


def bf16_representable(model):
    """The model with every float32 weight rounded to a bfloat16 value (so tiny moves round back)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return model


@pytest.fixture()
def base(tmp_path: Path):
    model = bf16_representable(tiny_model(tie=False))
    model.save_pretrained(tmp_path / "base")
    tiny_tokenizer().save_pretrained(tmp_path / "base")
    return tmp_path / "base", load_model(str(tmp_path / "base")).identity


def trained_from(base_dir: Path):
    """The base with 7 elements of one tensor moved by 1.0 (a bf16 change) and every element of another
    moved by 2**-12 of itself (a float32 change that rounds back to the same bfloat16)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.view(-1)[:7] += 1.0
        w = model.model.layers[1].self_attn.q_proj.weight
        w.mul_(1 + 2**-12)
    return model


def bf16_hash(model):
    from sqlrl.generation.patch import unique_tensors  # tied weights once, as weights_hash counts them

    return weights_hash({k: v.to(torch.bfloat16) for k, v in unique_tensors(model)})


def test_bf16_final_is_a_patch_of_the_changed_elements_and_reloads_with_its_hash(base, tmp_path):
    base_dir, base_id = base
    trained = trained_from(base_dir)
    ident = export_hf(
        trained,
        tiny_tokenizer(),
        tmp_path / "final",
        dtype="bfloat16",
        base=str(base_dir),
        base_identity=base_id,
    )
    assert ident["weights_stored"] == "patch" and ident["dtype"] == "bfloat16"
    assert ident["base"] == str(base_dir.resolve()) and ident["base_weights_hash"] == base_id
    assert (ident["changed_tensors"], ident["changed_elements"]) == (1, 7)  # q_proj's move is below bf16
    assert ident["weights_hash"] == bf16_hash(trained) and ident["master_weights_hash"] == weights_hash(
        trained
    )
    assert not (tmp_path / "final" / "model.safetensors").exists()
    assert ident["patch_bytes"] == 7 * (4 + 2) < ident["dense_bytes"]
    loaded = load_model(str(tmp_path / "final"))
    assert loaded.identity == ident["weights_hash"] == weights_hash(loaded.model)
    assert next(loaded.model.parameters()).dtype == torch.bfloat16


def test_dense_when_most_elements_change(base, tmp_path):
    from transformers import AutoModelForCausalLM

    base_dir, base_id = base
    trained = trained_from(base_dir)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(1.0)
    ident = export_hf(
        trained, None, tmp_path / "final", dtype="bfloat16", base=str(base_dir), base_identity=base_id
    )
    assert ident["weights_stored"] == "dense" and "not be smaller" in ident["why_dense"]
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    assert next(reloaded.parameters()).dtype == torch.bfloat16
    assert weights_hash(reloaded) == ident["weights_hash"] == bf16_hash(trained)
    assert export_cli.cli_main([str(tmp_path / "final"), "-o", str(tmp_path / "hf")]) == 0  # a final/ too
    assert weights_hash(AutoModelForCausalLM.from_pretrained(tmp_path / "hf")) == ident["weights_hash"]


def test_a_changed_base_is_refused_in_one_line(base, tmp_path):
    base_dir, base_id = base
    export_hf(
        trained_from(base_dir),
        None,
        tmp_path / "final",
        dtype="bfloat16",
        base=str(base_dir),
        base_identity=base_id,
    )
    tiny_model(seed=5, tie=False).save_pretrained(base_dir)  # other weights under the base's name
    with pytest.raises(ModelError) as e:
        load_model(str(tmp_path / "final"))
    msg = str(e.value)
    assert (
        "\n" not in msg
        and "is a patch over base" in msg
        and base_id in msg
        and "restore that exact base" in msg
    )
    assert export_cli.cli_main([str(tmp_path / "final"), "-o", str(tmp_path / "hf")]) == 2
    assert not (tmp_path / "hf").exists()


def test_sqlrl_export_of_a_patch_folder_loads_with_from_pretrained(base, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_dir, base_id = base
    trained = trained_from(base_dir)
    ident = export_hf(
        trained,
        tiny_tokenizer(),
        tmp_path / "final",
        dtype="bfloat16",
        base=str(base_dir),
        base_identity=base_id,
    )
    assert export_cli.cli_main([str(tmp_path / "final"), "-o", str(tmp_path / "hf")]) == 0
    assert ident["weights_hash"] in capsys.readouterr().out
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert weights_hash(hf) == ident["weights_hash"] == bf16_hash(trained)
    out_ident = json.loads((tmp_path / "hf" / "identity.json").read_text())
    assert (
        out_ident["weights_stored"] == "dense" and out_ident["source_weights_hash"] == ident["weights_hash"]
    )
    assert AutoTokenizer.from_pretrained(tmp_path / "hf").convert_tokens_to_ids("w5") == 5


def run_cfg(name: str, **run):
    return C.from_dict({"model": {"name": name, "dtype": "bfloat16"}, "run": {"device": "cpu", **run}})


def test_a_run_final_takes_the_generation_dtype_and_the_warm_start_loads_it(base, tmp_path):
    from sqlrl.training.trainer import load_trainable

    base_dir, base_id = base
    trained = trained_from(base_dir)
    ident = export_final(
        trained, tiny_tokenizer(), tmp_path / "run", cfg=run_cfg(str(base_dir)), base_identity=base_id
    )
    assert (ident["weights_stored"], ident["dtype"]) == ("patch", "bfloat16")
    # grpo_sft starts from the sft arm's final: float32 masters of the bf16 weights, the recorded identity
    model, _, _, identity = load_trainable(run_cfg(str(tmp_path / "run" / "final")), "cpu", "bfloat16")
    assert identity == ident["weights_hash"] and next(model.parameters()).dtype == torch.float32
    assert bf16_hash(model) == ident["weights_hash"]
    kept = export_final(
        trained,
        None,
        tmp_path / "run32",
        cfg=run_cfg(str(base_dir), final_dtype="float32"),
        base_identity=base_id,
    )
    assert (kept["dtype"], kept["weights_hash"]) == ("float32", weights_hash(trained))
    moved = int((trained.model.layers[1].self_attn.q_proj.weight != 0).sum())  # x * (1 + 2**-12) != x
    assert kept["weights_stored"] == "patch" and kept["changed_elements"] == 7 + moved


def test_a_model_already_in_the_final_dtype_is_patched_over_the_cast_base(base, tmp_path):
    """LoRA keeps its weights in the generation dtype: the float32 base is cast to it for the patch."""
    base_dir, base_id = base
    trained = trained_from(base_dir).to(torch.bfloat16)
    ident = export_hf(
        trained, None, tmp_path / "final", dtype="bfloat16", base=str(base_dir), base_identity=base_id
    )
    assert (ident["weights_stored"], ident["changed_elements"]) == ("patch", 7)
    assert "master_weights_hash" not in ident and ident["weights_hash"] == weights_hash(trained)
    assert load_model(str(tmp_path / "final")).identity == ident["weights_hash"]


def test_a_dense_bf16_final_of_a_tied_model_reloads_with_its_recorded_hash(tmp_path):
    from transformers import AutoModelForCausalLM

    base = tiny_model(tie=True)
    base.save_pretrained(tmp_path / "base")
    trained = tiny_model(tie=True)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(1.0)
    ident = export_hf(
        trained,
        None,
        tmp_path / "final",
        dtype="bfloat16",
        base=str(tmp_path / "base"),
        base_identity=weights_hash(base),
    )
    assert ident["weights_stored"] == "dense"
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()
    assert weights_hash(reloaded) == ident["weights_hash"] == bf16_hash(trained)


def test_final_dtype_is_a_record_only_setting_that_old_run_folders_lack():
    from sqlrl.training.runfolder import config_changes

    mine = json.loads(json.dumps(run_cfg("tiny").resolve()))  # as config.json holds it
    saved = json.loads(json.dumps(mine))
    del saved["run"]["final_dtype"]  # a run folder written before the setting existed: float32 finals
    blocking, recorded = config_changes(saved, mine)
    assert blocking == [] and recorded == ["run.final_dtype: None -> auto"]
    with pytest.raises(C.ConfigError):
        run_cfg("tiny", final_dtype="bfloat16")  # only the generation dtype or the float32 masters
