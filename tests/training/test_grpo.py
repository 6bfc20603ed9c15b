"""Tests for sqlrl.training.grpo: hand-derived values (see comments) and properties."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from sqlrl.training.grpo import entropy_from_logits, group_advantages, policy_loss, token_logprobs  # noqa: E402

F64 = torch.float64


# ---------------------------------------------------------------- group_advantages


def test_advantages_hand_value_sample_std():
    # rewards [1,0,0,1]: mean 0.5, deviations [+.5,-.5,-.5,+.5]
    # sample var = (4 * 0.25) / (4 - 1) = 1/3, std = 0.5773502691896258
    # A = +-0.5 / (0.5773502691896258 + 1e-6) = +-0.8660239...
    adv, m = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=F64), torch.tensor([0, 0, 0, 0]))
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert a == pytest.approx(0.866023902, abs=1e-8)
    torch.testing.assert_close(adv, torch.tensor([a, -a, -a, a], dtype=F64), rtol=0, atol=1e-12)
    assert m["groups"] == 1.0 and m["zero_var_groups"] == 0.0
    assert m["adv_max"] == pytest.approx(a, abs=1e-12) and m["adv_min"] == pytest.approx(-a, abs=1e-12)
    assert m["adv_mean"] == pytest.approx(0.0, abs=1e-12)
    assert m["adv_std"] == pytest.approx(a, abs=1e-12)  # population std of [a,-a,-a,a] is a


def test_advantages_hand_value_three_members_and_none_scale():
    # rewards [1,0,0]: mean 1/3, dev [2/3,-1/3,-1/3]; sample var = (4/9+1/9+1/9)/2 = 1/3
    # std-scaled: [2/3, -1/3, -1/3] / (sqrt(1/3)+eps) = [1.1547, -0.57735, -0.57735]
    adv, _ = group_advantages(torch.tensor([1.0, 0.0, 0.0], dtype=F64), torch.tensor([5, 5, 5]), eps=0.0)
    torch.testing.assert_close(
        adv, torch.tensor([1.1547005383792517, -0.5773502691896258, -0.5773502691896258], dtype=F64)
    )
    adv_none, _ = group_advantages(
        torch.tensor([1.0, 0.0, 0.0], dtype=F64), torch.tensor([5, 5, 5]), scale="none"
    )
    torch.testing.assert_close(adv_none, torch.tensor([2 / 3, -1 / 3, -1 / 3], dtype=F64))


def test_advantages_interleaved_groups_zero_var_and_singleton():
    # ids 7 and 3 interleaved; group 7 = [1, 1] (zero variance), group 3 = [0, 1] -> +-0.5/(std) ,
    # sample std of [0,1] = sqrt(0.5) = 0.70710678 -> A = +-0.70710678 (eps=0); group 9 singleton.
    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.3])
    g = torch.tensor([7, 3, 7, 3, 9])
    adv, m = group_advantages(r, g, eps=0.0)
    s = 0.5 / math.sqrt(0.5)
    torch.testing.assert_close(adv, torch.tensor([0.0, -s, 0.0, s, 0.0]))
    assert adv[0].item() == 0.0 and adv[2].item() == 0.0 and adv[4].item() == 0.0  # exactly zero
    assert m["groups"] == 3.0
    assert m["zero_var_groups"] == 2.0  # group 7 and the singleton 9
    assert m["singleton_groups"] == 1.0
    assert adv.dtype == torch.float32


def test_advantages_zero_var_exact_even_with_inexact_mean():
    # 0.1 * 3 / 3 is not exactly 0.1 in floats; the degenerate group must still give exact zeros
    adv, m = group_advantages(torch.tensor([0.1, 0.1, 0.1], dtype=F64), torch.tensor([0, 0, 0]))
    assert torch.equal(adv, torch.zeros(3, dtype=F64))
    assert m["zero_var_groups"] == 1.0


def test_advantages_group_sums_to_zero_property():
    gen = torch.Generator().manual_seed(0)
    r = torch.rand(60, generator=gen, dtype=F64)
    g = torch.randint(0, 7, (60,), generator=gen)
    for scale in ("std", "none"):
        adv, _ = group_advantages(r, g, scale=scale)
        for gid in g.unique():
            assert adv[g == gid].sum().item() == pytest.approx(0.0, abs=1e-10)


def test_advantages_validation():
    with pytest.raises(ValueError, match="entries"):
        group_advantages(torch.zeros(3), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        group_advantages(torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match="finite"):
        group_advantages(torch.tensor([float("nan"), 1.0]), torch.zeros(2, dtype=torch.long))
    adv, m = group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert adv.numel() == 0 and m["groups"] == 0.0


# ---------------------------------------------------------------- policy_loss: hand values


def _one_token_batch(ratios, advs):
    """B sequences of T=2; token 0 is the loss token with ratio r (old = 0, logp = log r); token 1 masked."""
    b = len(ratios)
    logp = torch.zeros(b, 2, dtype=F64)
    logp[:, 0] = torch.log(torch.tensor(ratios, dtype=F64))
    logp[:, 1] = float("nan")  # masked garbage must not leak
    logp.requires_grad_(True)
    old = torch.zeros(b, 2, dtype=F64)
    mask = torch.tensor([[1, 0]] * b)
    return logp, old, torch.tensor(advs, dtype=F64), mask


def test_clipped_surrogate_hand_values():
    # clip_low = 0.2 (lower bound 0.8), clip_high = 0.28 (upper bound 1.28); per-token loss = -min(rA, clip(r)A)
    # r=1.5,  A=+1: min(1.5, 1.28)   = 1.28  -> loss -1.28, clipped, grad 0
    # r=0.5,  A=-1: min(-0.5, -0.8)  = -0.8  -> loss +0.8,  clipped, grad 0
    # r=1.5,  A=-1: min(-1.5, -1.28) = -1.5  -> loss +1.5,  grad d(-rA)/dlogp = -A r = +1.5
    # r=0.5,  A=+1: min(0.5, 0.8)    = 0.5   -> loss -0.5,  grad -A r = -0.5
    # r=1.25, A=+1: inside (0.8,1.28)        -> loss -1.25, grad -1.25 (would be clipped with symmetric 0.2)
    # r=0.75, A=-1: min(-0.75, -0.8) = -0.8  -> loss +0.8,  clipped, grad 0
    ratios = [1.5, 0.5, 1.5, 0.5, 1.25, 0.75]
    advs = [1.0, -1.0, -1.0, 1.0, 1.0, -1.0]
    logp, old, adv, mask = _one_token_batch(ratios, advs)
    loss, m = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, loss_scale_tokens=1.0)
    per_tok = [-1.28, 0.8, 1.5, -0.5, -1.25, 0.8]
    assert loss.item() == pytest.approx(sum(per_tok), abs=1e-12)
    loss.backward()
    expected_grad = torch.tensor([[0.0, 0], [0, 0], [1.5, 0], [-0.5, 0], [-1.25, 0], [0, 0]], dtype=F64)
    torch.testing.assert_close(logp.grad, expected_grad, rtol=0, atol=1e-12)
    assert m["clip_frac"] == pytest.approx(3 / 6)
    assert m["clip_frac_high"] == pytest.approx(1 / 6)
    assert m["clip_frac_low"] == pytest.approx(2 / 6)
    assert m["ratio_max"] == pytest.approx(1.5) and m["ratio_min"] == pytest.approx(0.5)
    assert m["ratio_mean"] == pytest.approx(sum(ratios) / 6)
    assert m["tokens"] == 6.0 and m["seqs"] == 6.0
    assert math.isfinite(m["loss"])


def test_symmetric_clip_default_clips_1_25():
    logp, old, adv, mask = _one_token_batch([1.25], [1.0])
    loss, m = policy_loss(logp, old, adv, mask)  # default clip 0.2 -> bound 1.2
    assert loss.item() == pytest.approx(-1.2, abs=1e-12)
    loss.backward()
    assert logp.grad[0, 0].item() == 0.0
    assert m["clip_frac"] == 1.0


def test_ratio_one_is_reinforce_token_mean_vs_seq_mean():
    # ratio 1 everywhere, A = [1, 2]; seq 0 has 1 loss token, seq 1 has 3 loss tokens (+1 masked each)
    # token-mean: (-1 - 2*3) / 4 = -1.75 ; grad per token = -A_b / 4
    # seq-mean:  (-1/1*1 + -2*3/3) / 2 = -1.5 ; grad per token = -A_b / (|o_b| * 2)
    logp = torch.zeros(2, 4, dtype=F64, requires_grad=True)
    old = torch.zeros(2, 4, dtype=F64)
    adv = torch.tensor([1.0, 2.0], dtype=F64)
    mask = torch.tensor([[0, 1, 0, 0], [0, 1, 1, 1]])
    loss, m = policy_loss(logp, old, adv, mask)
    assert loss.item() == pytest.approx(-1.75, abs=1e-12)
    assert m["pg_loss"] == pytest.approx(-1.75, abs=1e-12) and m["clip_frac"] == 0.0
    assert m["ratio_mean"] == 1.0 and m["ratio_max"] == 1.0
    loss.backward()
    torch.testing.assert_close(
        logp.grad, torch.tensor([[0, -0.25, 0, 0], [0, -0.5, -0.5, -0.5]], dtype=F64), rtol=0, atol=1e-12
    )
    logp.grad = None
    loss, m = policy_loss(logp, old, adv, mask, agg="seq-mean")
    assert loss.item() == pytest.approx(-1.5, abs=1e-12)
    loss.backward()
    torch.testing.assert_close(
        logp.grad, torch.tensor([[0, -0.5, 0, 0], [0, -1 / 3, -1 / 3, -1 / 3]], dtype=F64), rtol=0, atol=1e-12
    )


def test_k3_kl_hand_values_and_gradient():
    # A = 0, r = 1 so only the KL term remains. d = ref - logp.
    # token 0: d = ln 2 -> k3 = 2 - ln2 - 1 = 0.30685281944 ; dk3/dlogp = 1 - e^d = -1
    # token 1: d = -1   -> k3 = e^-1 + 1 - 1 = 0.36787944117 ; dk3/dlogp = 1 - e^-1 = 0.63212055883
    logp = torch.tensor([[-1.0, -2.0]], dtype=F64, requires_grad=True)
    ref = torch.tensor([[-1.0 + math.log(2.0), -3.0]], dtype=F64)
    mask = torch.ones(1, 2)
    loss, m = policy_loss(logp, logp.detach(), torch.zeros(1, dtype=F64), mask, ref_logprobs=ref, kl_coef=0.1)
    k0, k1 = 0.30685281944005466, 0.36787944117144233
    assert m["kl"] == pytest.approx((k0 + k1) / 2, abs=1e-12)
    assert loss.item() == pytest.approx(0.1 * (k0 + k1) / 2, abs=1e-12)
    assert m["pg_loss"] == pytest.approx(0.0, abs=1e-15)
    loss.backward()
    torch.testing.assert_close(
        logp.grad,
        torch.tensor([[0.1 * -1.0 / 2, 0.1 * (1 - math.exp(-1)) / 2]], dtype=F64),
        rtol=0,
        atol=1e-12,
    )


def test_kl_zero_when_equal_positive_otherwise_and_metric_only_without_coef():
    gen = torch.Generator().manual_seed(1)
    logp = -torch.rand(3, 5, generator=gen, dtype=F64)
    mask = torch.ones(3, 5)
    adv = torch.tensor([1.0, -1.0, 0.5], dtype=F64)
    _, m = policy_loss(logp, logp, adv, mask, ref_logprobs=logp.clone(), kl_coef=0.5)
    assert m["kl"] == 0.0
    ref = logp + 0.3 * torch.randn(3, 5, generator=gen, dtype=F64)
    loss_kl, m = policy_loss(logp, logp, adv, mask, ref_logprobs=ref, kl_coef=0.5)
    assert m["kl"] > 0.0
    loss_nokl, m0 = policy_loss(logp, logp, adv, mask, ref_logprobs=ref, kl_coef=0.0)
    assert m0["kl"] == pytest.approx(m["kl"])  # measured even with coefficient 0
    assert loss_kl.item() == pytest.approx(loss_nokl.item() + 0.5 * m["kl"], abs=1e-12)


# ---------------------------------------------------------------- policy_loss: properties


def _random_batch(seed, b=6, t=7):
    gen = torch.Generator().manual_seed(seed)
    logp = (-2 * torch.rand(b, t, generator=gen, dtype=F64)).requires_grad_(True)
    old = logp.detach() + 0.3 * torch.randn(
        b, t, generator=gen, dtype=F64
    )  # ratios far enough from 1 to clip
    ref = logp.detach() + 0.2 * torch.randn(b, t, generator=gen, dtype=F64)
    adv = torch.randn(b, generator=gen, dtype=F64)
    mask = (torch.rand(b, t, generator=gen) < 0.6).long()
    mask[0] = 0  # a sequence with no loss tokens
    mask[1, 0] = 1
    ent = torch.rand(b, t, generator=gen, dtype=F64)
    return logp, old, ref, adv, mask, ent


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean"])
def test_gradient_accumulation_matches_big_batch(agg):
    logp, old, ref, adv, mask, _ = _random_batch(3)
    kw = dict(clip_low=0.2, clip_high=0.28, ref_logprobs=ref, kl_coef=0.05, agg=agg)
    big, mbig = policy_loss(logp, old, adv, mask, **kw)
    assert mbig["clip_frac"] > 0  # the test exercises the clipped branch
    (g_big,) = torch.autograd.grad(big, logp)

    scale_key = "loss_scale_tokens" if agg == "token-mean" else "loss_scale_seqs"
    global_count = float(mask.sum()) if agg == "token-mean" else float((mask.sum(1) > 0).sum())
    g_acc = torch.zeros_like(logp)
    total = 0.0
    for sl in (slice(0, 2), slice(2, 6)):
        sub = logp.detach()[sl].clone().requires_grad_(True)
        kw_sl = dict(kw, ref_logprobs=ref[sl])
        loss, _ = policy_loss(sub, old[sl], adv[sl], mask[sl], **kw_sl, **{scale_key: global_count})
        loss.backward()
        g_acc[sl] = sub.grad
        total += loss.item()
    assert total == pytest.approx(big.item(), abs=1e-10)
    torch.testing.assert_close(g_acc, g_big, rtol=0, atol=1e-6)
    # guard against a vacuous test: summing locally normalised micro-batch gradients is different
    g_local = torch.zeros_like(logp)
    for sl in (slice(0, 2), slice(2, 6)):
        sub = logp.detach()[sl].clone().requires_grad_(True)
        loss, _ = policy_loss(sub, old[sl], adv[sl], mask[sl], **dict(kw, ref_logprobs=ref[sl]))
        loss.backward()
        g_local[sl] = sub.grad
    assert (g_local - g_big).abs().max().item() > 1e-3


def test_masked_tokens_get_zero_grad_even_with_nan():
    logp, old, ref, adv, mask, ent = _random_batch(4)
    bad = logp.detach().clone()
    bad[mask == 0] = float("nan")
    old = old.clone()
    old[mask == 0] = float("-inf")
    bad.requires_grad_(True)
    loss, m = policy_loss(bad, old, adv, mask, ref_logprobs=ref, kl_coef=0.1, entropy=ent)
    assert math.isfinite(loss.item())
    loss.backward()
    assert torch.all(bad.grad[mask == 0] == 0.0)
    assert torch.all(torch.isfinite(bad.grad))
    assert bool((bad.grad[mask == 1] != 0).any())
    assert m["entropy"] == pytest.approx(ent[mask == 1].mean().item(), abs=1e-12)
    assert m["tokens"] == float(mask.sum())


def test_zero_variance_group_gives_exactly_zero_gradient():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0], dtype=F64)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    adv, m = group_advantages(rewards, groups)
    assert m["zero_var_groups"] == 1.0
    logp, old, _, _, mask, _ = _random_batch(5)
    mask = torch.ones_like(mask)
    loss, _ = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    loss.backward()
    assert torch.all(logp.grad[:3] == 0.0)
    assert bool((logp.grad[3:] != 0).any(dim=1).all())  # other rows do learn (some tokens clip)


def test_old_and_advantages_are_detached():
    logp, old, ref, adv, mask, _ = _random_batch(6)
    adv = adv.clone().requires_grad_(True)
    old = old.clone().requires_grad_(True)
    loss, _ = policy_loss(logp, old, adv, mask)
    loss.backward()
    assert adv.grad is None and old.grad is None


def test_policy_loss_validation():
    logp, old, ref, adv, mask, _ = _random_batch(7)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, old, adv[:3], mask)
    with pytest.raises(ValueError, match="mask"):
        policy_loss(logp, old, adv, mask[:, :3])
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(logp, old, adv, mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="seq-mean"):
        policy_loss(logp, old, adv, mask, loss_scale_seqs=3.0)
    with pytest.raises(ValueError, match="token-mean"):
        policy_loss(logp, old, adv, mask, agg="seq-mean", loss_scale_tokens=3.0)


def test_no_loss_tokens_gives_zero_loss_attached():
    logp = torch.zeros(2, 3, requires_grad=True)
    loss, m = policy_loss(logp, logp.detach(), torch.ones(2), torch.zeros(2, 3))
    assert loss.item() == 0.0 and m["tokens"] == 0.0 and m["ratio_mean"] == 0.0
    loss.backward()
    assert torch.all(logp.grad == 0)


# ---------------------------------------------------------------- log-probs / entropy


def test_token_logprobs_matches_log_softmax_with_temperature_and_chunks():
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(3, 5, 11, generator=gen, dtype=F64, requires_grad=True)
    targets = torch.randint(0, 11, (3, 5), generator=gen)
    ref = torch.log_softmax(logits / 0.7, dim=-1).gather(-1, targets[..., None]).squeeze(-1)
    out = token_logprobs(logits, targets, temperature=0.7)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref.float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(token_logprobs(logits, targets, 0.7, chunk_size=4), out, rtol=0, atol=0)
    out.sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    # hand value: uniform logits over V=4 -> log(1/4)
    u = token_logprobs(torch.zeros(1, 1, 4), torch.zeros(1, 1, dtype=torch.long))
    assert u.item() == pytest.approx(-math.log(4), abs=1e-6)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, targets, temperature=0.0)


def test_entropy_from_logits():
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(2, 3, 17, generator=gen)
    p = torch.softmax(logits / 1.3, dim=-1)
    ref = -(p * torch.log(p)).sum(-1)
    torch.testing.assert_close(entropy_from_logits(logits, 1.3, chunk_size=2), ref, rtol=0, atol=1e-5)
    # uniform over 8 -> ln 8 = 2.0794; near one-hot -> ~0
    assert entropy_from_logits(torch.zeros(1, 1, 8)).item() == pytest.approx(math.log(8), abs=1e-6)
    peaked = torch.tensor([[[100.0, 0.0, 0.0]]])
    assert entropy_from_logits(peaked).item() == pytest.approx(0.0, abs=1e-6)
