"""Tests of sqlrl.generation.policy: HFPolicy on a tiny random model (both engines) and OpenAIPolicy against a fake
OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sqlrl.agent.loop import PolicyInfraError
from sqlrl.generation.policy import Generation, OpenAIPolicy

# ------------------------------------------------------------------------------------------ HFPolicy


@pytest.fixture(scope="module")
def tiny():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from sqlrl.generation.scripted import make_chat_tokenizer

    tok = make_chat_tokenizer()
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    return model, tok


def _fastgen_or_skip():
    try:
        from sqlrl.generation import fastgen
    except ImportError:
        pytest.skip("sqlrl.generation.fastgen not available")
    if not hasattr(fastgen, "generate_fast") or not hasattr(fastgen, "generate_reference"):
        pytest.skip("sqlrl.generation.fastgen incomplete")


def _prompts(tok):
    texts = ["SELECT", "select count(*) from singer where age > 30", "hi", "The quick brown fox jumps"]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_eos_ids_and_identity(tiny):
    import torch

    from sqlrl.generation.models import weights_hash
    from sqlrl.generation.policy import HFPolicy

    model, tok = tiny
    pol = HFPolicy(model, tok, name="tiny")
    vocab = tok.get_vocab()
    assert vocab["<|im_end|>"] in pol.eos_token_ids and vocab["<|endoftext|>"] in pol.eos_token_ids
    assert pol.pad_token_id == tok.pad_token_id
    assert pol.identity == weights_hash(model) and pol.name == "tiny"
    h = pol.identity
    with torch.no_grad():
        model.model.norm.weight[0] += 1.0
    assert pol.identity == h  # not automatic
    assert pol.refresh_identity() != h and pol.identity != h
    with torch.no_grad():
        model.model.norm.weight[0] -= 1.0
    assert pol.refresh_identity() == h
    pol.identity = "custom"  # the trainer labels identities itself
    assert pol.identity == "custom"
    with pytest.raises(ValueError):
        HFPolicy(model, tok, engine="nope")


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_generate_shapes_padding_determinism(tiny, engine):
    import torch

    from sqlrl.generation.policy import HFPolicy

    _fastgen_or_skip()
    model, tok = tiny
    pol = HFPolicy(model, tok, engine=engine, batch_size=4, max_batch=4)
    prompts = _prompts(tok)
    model.train()  # generation must switch to eval and restore
    gens = pol.generate(prompts, max_new_tokens=12)
    assert model.training
    assert len(gens) == len(prompts)
    for g in gens:
        assert isinstance(g, Generation)
        assert len(g.token_ids) == len(g.logprobs) >= 1
        assert g.finish_reason in ("stop", "length")
        if g.finish_reason == "length":
            assert len(g.token_ids) == 12
        else:
            assert g.token_ids[-1] in pol.eos_token_ids
        assert all(lp <= 0.0 for lp in g.logprobs)
        assert g.text == tok.decode(g.token_ids, skip_special_tokens=True)
    # greedy is deterministic
    again = pol.generate(prompts, max_new_tokens=12)
    assert [g.token_ids for g in again] == [g.token_ids for g in gens]
    # left padding is correct: each prompt alone gives the same continuation as in the padded batch
    for p, g in zip(prompts, gens):
        alone = pol.generate([p], max_new_tokens=12)[0]
        assert alone.token_ids == g.token_ids
        assert alone.logprobs == pytest.approx(g.logprobs, abs=1e-4)
    # greedy log-probs are those of the raw logits (direct forward, unpadded)
    p, g = prompts[1], gens[1]
    ids = torch.tensor([p + g.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(p) - 1 : -1].float()
    direct = torch.log_softmax(logits, -1).gather(1, torch.tensor(g.token_ids)[:, None])[:, 0].tolist()
    assert direct == pytest.approx(g.logprobs, abs=1e-4)
    assert g.token_ids == logits.argmax(-1).tolist()


def test_sampling_seeded(tiny):
    from sqlrl.generation.policy import HFPolicy

    _fastgen_or_skip()
    model, tok = tiny
    pol = HFPolicy(model, tok, engine="fast")
    prompts = _prompts(tok)
    a = pol.generate(prompts, max_new_tokens=10, temperature=1.0, seed=7)
    b = pol.generate(prompts, max_new_tokens=10, temperature=1.0, seed=7)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert all(len(g.token_ids) == len(g.logprobs) for g in a)


@pytest.mark.parametrize("engine", ["fast", "static", "hf"])
def test_generation_out_of_memory_retries_with_half_the_batch(tiny, monkeypatch, engine):
    """A simulated CUDA out-of-memory error for batches over 2 sequences: the call is redone with 4,
    then 2 per batch, gives exactly what a policy built with 2 per batch gives (same sampling draws), and
    the smaller batch is kept and recorded. Under 1 sequence per batch it stops with a clear message."""
    import torch

    from sqlrl.generation import fastgen, staticgen
    from sqlrl.generation.policy import HFPolicy

    _fastgen_or_skip()
    model, tok = tiny
    prompts = _prompts(tok) * 2  # 8 prompts
    attr = "batch_size" if engine == "hf" else "max_batch"
    fn_name = {
        "fast": (fastgen, "generate_fast"),
        "static": (staticgen, "generate_static"),
        "hf": (fastgen, "generate_reference"),
    }[engine]
    real = getattr(*fn_name)
    calls = []

    def flaky(model_, prompts_, **kw):
        size = kw.get("max_batch", kw.get("batch_size"))
        calls.append(size)
        if size > limit[0]:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model_, prompts_, **kw)

    limit = [2]
    monkeypatch.setattr(*fn_name, flaky)
    pol = HFPolicy(model, tok, engine=engine, **{attr: 8})
    got = pol.generate(prompts, max_new_tokens=6, temperature=1.0, seed=3)
    assert calls == [8, 4, 2] and getattr(pol, attr) == 2
    assert pol.memory_adjustments == [{"engine": engine, attr: 4}, {"engine": engine, attr: 2}]
    ref = HFPolicy(model, tok, engine=engine, **{attr: 2}).generate(
        prompts, max_new_tokens=6, temperature=1.0, seed=3
    )
    assert [g.token_ids for g in got] == [g.token_ids for g in ref]
    calls.clear()
    pol.generate(prompts, max_new_tokens=6, temperature=1.0, seed=3)
    assert calls == [2]  # the smaller batch is kept
    limit[0] = 0  # nothing fits any more
    mode = model.training
    with pytest.raises(RuntimeError, match="one sequence at a time"):
        pol.generate(prompts, max_new_tokens=6, temperature=1.0, seed=3)
    assert calls[-2:] == [2, 1] and model.training is mode  # train/eval mode restored


def test_from_loaded_model(tiny, tmp_path, monkeypatch):
    from sqlrl.generation.models import cache_model, load_model
    from sqlrl.generation.policy import HFPolicy

    monkeypatch.setenv("TQDM_DISABLE", "1")
    model, tok = tiny
    cache_model(model, tok, "tiny-policy", cache_dir=tmp_path, dtype=None)
    lm = load_model("tiny-policy", cache_dir=tmp_path)
    pol = HFPolicy(lm, engine="hf")
    assert pol.identity == lm.identity and pol.name == "tiny-policy" and pol.tokenizer is lm.tokenizer
    if pol.eos_token_ids:
        assert tok.eos_token_id in pol.eos_token_ids


# ------------------------------------------------------------------------------------------ OpenAIPolicy


class _Fake:
    """Behaviour of the fake server, switched per test."""

    mode = "ok"
    requests: list = []


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):  # quiet
        pass

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Fake.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        mode = _Fake.mode
        if mode == "500":
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"boom")
            return
        if mode == "sleep":
            time.sleep(1.5)
        if mode == "garbage":
            payload = b"<html>not json"
        else:
            choices = []
            for i, prompt in enumerate(body["prompt"]):
                n = min(body["max_tokens"], len(prompt))
                ids = [t + 1 for t in prompt[:n]]
                reason = "length" if n == body["max_tokens"] else "stop"
                c = {
                    "index": i,
                    "text": "".join(chr(65 + t % 26) for t in ids),
                    "finish_reason": reason,
                    "logprobs": {
                        "token_logprobs": [-0.1 * (k + 1) for k in range(n)],
                        "tokens": [f"token_id:{t}" for t in ids],
                    },
                }
                if mode == "ids":
                    c["token_ids"] = ids
                choices.append(c)
            if mode == "wrong_count":
                choices = choices[:-1]
            payload = json.dumps({"id": "x", "object": "text_completion", "choices": choices[::-1]}).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):  # the client timed out first ("sleep")
            pass


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    th = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    th.start()
    _Fake.mode, _Fake.requests = "ok", []
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
        th.join(timeout=5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["ok", "ids"])
def test_openai_policy_ok(server, mode):
    _Fake.mode = mode
    pol = OpenAIPolicy(server, "m", api_key="k", timeout=5, max_batch=2)
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9]]
    gens = pol.generate(prompts, max_new_tokens=4, temperature=0.0, seed=3)
    assert [g.token_ids for g in gens] == [[2, 3, 4], [5], [6, 7, 8, 9]]
    assert [g.finish_reason for g in gens] == ["stop", "stop", "length"]
    assert [len(g.logprobs) for g in gens] == [3, 1, 4]
    assert gens[0].text == "CDE"
    assert len(_Fake.requests) == 2  # chunks of max_batch
    req = _Fake.requests[0]
    assert req["path"] == "/v1/completions" and req["auth"] == "Bearer k"
    assert req["body"]["prompt"] == [[1, 2, 3], [4]] and req["body"]["model"] == "m"
    assert req["body"]["max_tokens"] == 4 and req["body"]["logprobs"] == 1
    assert pol.identity.startswith("openai:")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["500", "garbage", "wrong_count", "sleep"])
def test_openai_policy_infra_errors(server, mode):
    _Fake.mode = mode
    pol = OpenAIPolicy(server + "/v1", "m", timeout=0.5, retries=1)
    t0 = time.monotonic()
    with pytest.raises(PolicyInfraError):
        pol.generate([[1, 2]], max_new_tokens=2)
    assert time.monotonic() - t0 < 20
    if mode == "500":
        assert len(_Fake.requests) == 2  # retried once


@pytest.mark.timeout(60)
def test_openai_policy_connection_refused():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    pol = OpenAIPolicy(f"http://127.0.0.1:{port}", "m", timeout=2, retries=0)
    with pytest.raises(PolicyInfraError):
        pol.generate([[1]], max_new_tokens=1)
