"""Contract test of `sqlrl export` for veRL 0.9.1 FSDP checkpoints (src/sqlrl/integrations/fsdp_export.py).

A REAL sharded checkpoint is made on the CPU: 2 processes (torch.distributed, gloo, world size 2) wrap a
tiny random Qwen2 model in FSDP1 (veRL's default ``strategy: fsdp``, with a device mesh as veRL passes it)
or FSDP2 (``strategy: fsdp2``, wrapped by veRL's own ``apply_fsdp2``; also HSDP: 4 processes, a 2 x 2
(ddp, fsdp) mesh), and veRL's own ``FSDPCheckpointManager.save_checkpoint`` writes it into
``global_step_N/actor/``. The export must give
exactly the original tensors, and ``AutoModelForCausalLM.from_pretrained`` of the export must give the
same weights hash as identity.json.

Needs the veRL venv: ``.venv-verl/bin/python -m pytest -q tests/integrations/test_fsdp_export.py``.
Elsewhere the veRL-dependent tests are skipped with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import torch
    import torch.distributed as dist
    import transformers  # noqa: F401
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager  # noqa: F401

    if not dist.is_available() or not dist.is_gloo_available():
        raise RuntimeError("torch.distributed with the gloo backend is not available")
    SKIP = None
except Exception as e:  # ImportError, numpy ABI errors, no gloo
    SKIP = f"veRL / torch.distributed FSDP not usable ({type(e).__name__}: {e}); run in .venv-verl"

needs_verl = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

SEED = 1234


def _tiny_config(tie: bool):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=101,  # odd sizes: uneven shards along dim 0
        hidden_size=36,
        intermediate_size=70,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
        architectures=["Qwen2ForCausalLM"],
    )


def _reference_model(tie: bool):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(_tiny_config(tie), dtype=torch.float32)
    with torch.no_grad():  # every tensor random (norms are ones at init), so a mixed-up shard shows
        for p in model.parameters():
            p.copy_(torch.randn_like(p))
    return model


def _tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(99)} | {"<unk>": 99, "<eos>": 100}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")


def _worker(rank: int, out: str, strategy: str, tie: bool, port: int, world: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    os.environ.setdefault("LOCAL_RANK", str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

        model = _reference_model(tie)
        if strategy == "hsdp":  # 2 replica groups x 2 shards: DTensor placements (Replicate, Shard(0))
            mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("ddp", "fsdp"))
        else:
            mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
        if strategy == "fsdp":
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from torch.distributed.fsdp import ShardingStrategy
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy
            from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

            wrapped = FSDP(
                model,
                auto_wrap_policy=ModuleWrapPolicy({Qwen2DecoderLayer}),
                device_id=torch.device("cpu"),
                sharding_strategy=ShardingStrategy.FULL_SHARD,
                device_mesh=mesh,
                use_orig_params=False,
            )
        else:
            from verl.utils.fsdp_utils import apply_fsdp2

            apply_fsdp2(model, {"mesh": mesh, "reshard_after_forward": True}, {})
            wrapped = model
        optim = torch.optim.AdamW(wrapped.parameters(), lr=0.0)
        mgr = FSDPCheckpointManager(
            wrapped,
            optimizer=optim,
            processing_class=_tiny_tokenizer(),
            checkpoint_config={"save_contents": ["model", "optimizer", "extra"], "load_contents": ["model"]},
        )
        mgr.save_checkpoint(os.path.join(out, "global_step_3", "actor"), global_step=3)
        if rank == 0:
            Path(out, "latest_checkpointed_iteration.txt").write_text("3")
    finally:
        dist.destroy_process_group()


def _make_checkpoint(tmp_path: Path, strategy: str, tie: bool, world: int) -> Path:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / f"ckpts_{strategy}"
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, __file__, "make-ckpt", str(out), strategy, "tie" if tie else "notie", str(port)]
    cmd.append(str(world))
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if res.returncode != 0:
        raise AssertionError(
            f"making the FSDP checkpoint failed:\n{res.stdout[-4000:]}\n{res.stderr[-8000:]}"
        )
    return out


def test_module_imports_and_detects_non_fsdp_folders(tmp_path):
    from sqlrl.cli.export import fsdp_main
    from sqlrl.training import fsdp_export as fe

    assert callable(fe.export_fsdp_checkpoint) and callable(fsdp_main)
    assert not fe.is_fsdp_checkpoint(tmp_path)
    (tmp_path / "step_000001").mkdir()
    (tmp_path / "step_000001" / "sidecar.json").write_text("{}")
    assert not fe.is_fsdp_checkpoint(tmp_path / "step_000001")
    assert not fe.is_fsdp_checkpoint(tmp_path / "missing")


@needs_verl
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "strategy,tie,world",
    [("fsdp", True, 2), ("fsdp2", False, 2), ("hsdp", True, 4)],
    ids=["fsdp1", "fsdp2", "hsdp2x2"],
)
def test_export_real_fsdp_checkpoint_exactly(tmp_path, strategy, tie, world):
    from transformers import AutoModelForCausalLM

    from sqlrl.cli.export import fsdp_main as cli_main
    from sqlrl.generation.models import weights_hash
    from sqlrl.training.fsdp_export import (
        export_fsdp_checkpoint,
        find_fsdp_checkpoint,
        is_fsdp_checkpoint,
    )

    root = _make_checkpoint(tmp_path, strategy, tie, world)
    actor = root / "global_step_3" / "actor"
    assert sorted(p.name for p in actor.glob("model_world_size_*")) == [
        f"model_world_size_{world}_rank_{r}.pt" for r in range(world)
    ]
    assert json.loads((actor / "fsdp_config.json").read_text()) == {
        "FSDP_version": 1 if strategy == "fsdp" else 2,
        "world_size": world,
    }
    # the run folder, the step folder and the actor folder all resolve to the same checkpoint
    for p in (root, root / "global_step_3", actor):
        assert is_fsdp_checkpoint(p), p
        assert find_fsdp_checkpoint(p) == actor

    ref = _reference_model(tie)
    ref_sd = ref.state_dict()

    out = tmp_path / "hf"
    identity = export_fsdp_checkpoint(root, out)
    assert identity["step"] == 3
    assert identity["fsdp"]["world_size"] == world and identity["fsdp"]["fsdp_version"] in (1, 2)
    assert (out / "model.safetensors").is_file() and (out / "identity.json").is_file()
    assert json.loads((out / "identity.json").read_text())["weights_hash"] == identity["weights_hash"]
    assert identity["weights_hash"] == weights_hash(ref)
    assert identity["source_weights_hash"] == identity["weights_hash"]  # saved dtype kept: nothing changed
    assert identity["source_checkpoint"] == str(actor.resolve()) and identity["dtype"] == "float32"

    reloaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    assert weights_hash(reloaded) == identity["weights_hash"]
    got = reloaded.state_dict()
    assert set(got) == set(ref_sd)
    for name, t in ref_sd.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
    if tie:
        assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()

    # the tokenizer veRL saved under huggingface/ comes along byte for byte
    saved = actor / "huggingface"
    tok_files = sorted(
        p.name for p in saved.iterdir() if p.name not in ("config.json", "generation_config.json")
    )
    assert "tokenizer.json" in tok_files
    for name in tok_files:
        assert (out / name).read_bytes() == (saved / name).read_bytes(), name

    # the CLI gives the same weights
    out2 = tmp_path / "hf_cli"
    assert cli_main([str(actor), "-o", str(out2)]) == 0
    assert json.loads((out2 / "identity.json").read_text())["weights_hash"] == identity["weights_hash"]


@needs_verl
def test_missing_shard_is_an_error(tmp_path):
    from sqlrl.cli.export import fsdp_main as cli_main
    from sqlrl.training.fsdp_export import FSDPExportError, export_fsdp_checkpoint

    d = tmp_path / "actor"
    (d / "huggingface").mkdir(parents=True)
    _tiny_config(False).save_pretrained(str(d / "huggingface"))
    (d / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 2}))
    torch.save({"x": torch.zeros(2)}, d / "model_world_size_2_rank_0.pt")
    with pytest.raises(FSDPExportError, match="rank_1"):
        export_fsdp_checkpoint(d, tmp_path / "out")
    assert cli_main([str(d), "-o", str(tmp_path / "out")]) == 1
    assert not (tmp_path / "out").exists()


if __name__ == "__main__" and len(sys.argv) == 7 and sys.argv[1] == "make-ckpt":
    import torch.multiprocessing as mp

    _out, _strategy, _tie, _port = sys.argv[2], sys.argv[3], sys.argv[4] == "tie", int(sys.argv[5])
    _world = int(sys.argv[6])
    mp.spawn(_worker, args=(_out, _strategy, _tie, _port, _world), nprocs=_world, join=True)
