"""CPU tests of sqlrl.generation.staticgen (static KV cache engine, eager on CPU) against HF generate and fastgen."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_fastgen import (  # noqa: E402
    VOCAB,
    direct_logprobs,
    gen_kwargs,
    greedy_eos,
    random_prompts,
    tiny_llama,
    tiny_qwen2,
)

from sqlrl.generation import fastgen, staticgen  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def qwen():
    return tiny_qwen2()


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


@pytest.mark.parametrize("arch", ["qwen", "llama"])
@pytest.mark.parametrize("max_batch,check_every", [(256, 8), (3, 1), (4, 5)])
def test_greedy_identical_to_reference(arch, max_batch, check_every, request):
    model = request.getfixturevalue(arch)
    staticgen.release(model)
    prompts = random_prompts(12)
    eos = greedy_eos(model, prompts)
    kw = gen_kwargs(eos_token_ids=[eos, 2])
    ref = fastgen.generate_reference(model, prompts, batch_size=5, **kw)
    out = staticgen.generate_static(model, prompts, max_batch=max_batch, check_every=check_every, **kw)
    assert [r[0] for r in out] == [r[0] for r in ref]
    assert [r[2] for r in out] == [r[2] for r in ref]
    assert {r[2] for r in ref} == {"stop", "length"}
    for (_, lr, _), (_, lo, _) in zip(ref, out):
        assert lr == pytest.approx(lo, abs=1e-4)
    st = staticgen.last_stats
    assert st.method == "static" and st.max_active <= max_batch
    if max_batch < 12:
        assert st.refills > 1  # slots were refilled while others were still decoding


@pytest.mark.parametrize("temperature,top_p", [(0.0, 1.0), (1.0, 1.0), (0.7, 0.9)])
def test_logprobs_match_direct_forward(qwen, temperature, top_p):
    prompts = random_prompts(6, seed=7)
    res = staticgen.generate_static(
        qwen,
        prompts,
        seed=11,
        temperature=temperature,
        top_p=top_p,
        max_batch=4,
        **gen_kwargs(max_new_tokens=12),
    )
    for p, (toks, lps, _) in zip(prompts, res):
        direct = direct_logprobs(qwen, p, toks, temperature if temperature > 0 else 1.0)
        assert lps == pytest.approx(direct, abs=1e-4)


def test_sampling_same_stream_as_fastgen_and_schedule_free(qwen):
    prompts = random_prompts(5, seed=9)
    group = [p for p in prompts for _ in range(4)]
    kw = gen_kwargs(temperature=1.0, max_new_tokens=16, eos_token_ids=list(range(3, 80)))
    a = staticgen.generate_static(qwen, group, seed=123, **kw)
    b = staticgen.generate_static(qwen, group, seed=123, max_batch=6, check_every=3, **kw)
    c = staticgen.generate_static(qwen, group, seed=124, **kw)
    f = fastgen.generate_fast(qwen, group, seed=123, **kw)
    assert [r[0] for r in a] == [r[0] for r in b] == [r[0] for r in f]
    assert [r[0] for r in a] != [r[0] for r in c]
    for g in range(5):
        assert len({tuple(r[0]) for r in a[4 * g : 4 * g + 4]}) > 1
    assert {r[2] for r in a} == {"stop", "length"}
    for (_, la, _), (_, lf, _) in zip(a, f):
        assert la == pytest.approx(lf, abs=1e-4)


def test_greedy_duplicates_share_one_slot(qwen):
    prompts = random_prompts(3, seed=14)
    dup = prompts + prompts[:2]
    res = staticgen.generate_static(qwen, dup, **gen_kwargs())
    assert res[3] == res[0] and res[4] == res[1]
    st = staticgen.last_stats
    assert st.n_prompts == 5 and st.n_unique_prompts == 3 and st.max_active == 3
    assert st.tokens_generated == sum(len(r[0]) for r in res)


def test_a_static_run_publishes_its_stats_in_staticgen_only(qwen):
    prompts = random_prompts(2, seed=21)
    fastgen.generate_fast(qwen, prompts, **gen_kwargs())
    before = fastgen.last_stats
    staticgen.generate_static(qwen, prompts, **gen_kwargs())
    assert fastgen.last_stats is before and staticgen.last_stats is not before
    assert staticgen.last_stats.method == "static"


def test_eos_at_first_token_and_max_new_tokens_one(qwen):
    prompts = random_prompts(6, seed=5)
    first = [r[0][0] for r in staticgen.generate_static(qwen, prompts, **gen_kwargs(max_new_tokens=1))]
    res = staticgen.generate_static(qwen, prompts, **gen_kwargs(eos_token_ids=[first[0]]))
    assert res[0][0] == [first[0]] and res[0][2] == "stop"
    one = staticgen.generate_static(qwen, prompts, **gen_kwargs(max_new_tokens=1, eos_token_ids=[VOCAB + 5]))
    assert all(len(t) == 1 and r == "length" for t, _, r in one)


def test_engine_is_reused_grown_and_sees_in_place_weight_updates():
    model = tiny_qwen2(seed=21)
    prompts = random_prompts(4, seed=16, hi=20)
    kw = gen_kwargs(max_new_tokens=8)
    staticgen.generate_static(model, prompts, **kw)
    eng = model._sqlrl_static
    staticgen.generate_static(model, prompts[:2], **kw)
    assert model._sqlrl_static is eng  # fits: reused
    staticgen.generate_static(model, random_prompts(2, seed=17, lo=300, hi=301), **kw)
    assert model._sqlrl_static is not eng and model._sqlrl_static.t_max >= 300 + 8
    assert "_sqlrl_static" not in "".join(model.state_dict().keys())
    before = staticgen.generate_static(model, prompts, **kw)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)  # in place, as the trainer's weight sync does
    after = staticgen.generate_static(model, prompts, **kw)
    ref = fastgen.generate_reference(model, prompts, **kw)
    assert [r[0] for r in after] == [r[0] for r in ref]
    assert [r[0] for r in after] != [r[0] for r in before]


def test_unsupported_model_is_refused():
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2)
    gpt2 = transformers.GPT2LMHeadModel(cfg).eval()
    ok, why = staticgen.supports(gpt2)
    assert not ok and "gpt2" in why
    with pytest.raises(ValueError, match="does not support"):
        staticgen.generate_static(gpt2, [[5, 6]], **gen_kwargs())
    sliding = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        use_sliding_window=True,
        sliding_window=16,
        max_window_layers=0,
    )
    ok, why = staticgen.supports(transformers.Qwen2ForCausalLM(sliding))
    assert not ok and "sliding" in why


def test_peft_wrapped_model_matches_reference():
    peft = pytest.importorskip("peft")
    model = tiny_llama(seed=23)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    wrapped = peft.get_peft_model(model, lora).eval()
    assert staticgen.supports(wrapped)[0]
    prompts = random_prompts(5, seed=18)
    kw = gen_kwargs(max_new_tokens=10)
    ref = fastgen.generate_reference(wrapped, prompts, **kw)
    out = staticgen.generate_static(wrapped, prompts, **kw)
    assert [r[0] for r in out] == [r[0] for r in ref]


@pytest.mark.parametrize("min_rows", [1, 4])
def test_shrinking_batch_with_compaction_gives_the_same_tokens(qwen, monkeypatch, min_rows):
    """Ragged lengths: as sequences finish the decode batch halves and stragglers move to low slots."""
    monkeypatch.setattr(staticgen, "MIN_ROWS", min_rows)
    prompts = random_prompts(6, seed=31)
    group = [p for p in prompts for _ in range(4)]
    kw = gen_kwargs(temperature=1.0, max_new_tokens=20, eos_token_ids=list(range(3, 120)))
    ref = fastgen.generate_fast(qwen, group, seed=7, **kw)
    staticgen.release(qwen)
    out = staticgen.generate_static(qwen, group, seed=7, check_every=2, **kw)
    st = staticgen.last_stats
    assert [r[0] for r in out] == [r[0] for r in ref]
    for (_, lr, _), (_, lo, _) in zip(ref, out):
        assert lr == pytest.approx(lo, abs=1e-4)
    assert st.compactions > 0 and len(st.extra["row_buckets"]) > 1
    # an engine reused with more slots than max_batch never uses more than max_batch rows at once
    small = staticgen.generate_static(qwen, group, seed=7, max_batch=5, check_every=2, **kw)
    assert [r[0] for r in small] == [r[0] for r in ref]
    assert staticgen.last_stats.max_active <= 5
