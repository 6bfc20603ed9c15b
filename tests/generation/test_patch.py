"""Patches over a base: exact indices and values by hand, signed zero and NaN payloads kept bit for bit,
the patch's weights hash equal to the cast model's, the streaming hash equal to ``weights_hash``."""

from __future__ import annotations

import pytest

from sqlrl.generation.hashing import hash_named_tensors, weights_hash
from sqlrl.generation.patch import apply_tensor_patch, bits, diff_against_base, tensor_patch, unique_tensors

torch = pytest.importorskip("torch")


class _Base:
    def __init__(self, sd):
        self.sd = sd

    def names(self):
        return set(self.sd)

    def get(self, name):
        return self.sd[name]


def test_patch_of_a_2x3_tensor_holds_exactly_the_changed_elements():
    base = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    final = torch.tensor([[1.0, 2.5, 3.0], [4.0, 5.0, -6.0]])
    idx, val = tensor_patch(base, final)
    assert idx.dtype == torch.int32 and idx.tolist() == [1, 5]
    assert val.dtype == torch.float32 and val.tolist() == [2.5, -6.0]
    rebuilt = apply_tensor_patch(base.clone(), idx, val)
    assert torch.equal(bits(rebuilt), bits(final))


def test_signed_zero_and_nan_payload_changes_are_kept_bit_for_bit():
    base = torch.tensor([0.0, 1.0, float("nan"), 3.0], dtype=torch.bfloat16)
    final = base.clone()
    final[0] = -0.0  # equal value, other bits
    b = bits(final)
    b[2] = b[2] ^ 1  # another NaN payload: NaN either way
    assert torch.isnan(final[2]) and bool((final == base)[0])
    idx, val = tensor_patch(base, final)
    assert idx.tolist() == [0, 2]
    assert bits(val).tolist() == [bits(final)[0].item(), bits(final)[2].item()]
    rebuilt = apply_tensor_patch(base.clone(), idx, val)
    assert torch.equal(bits(rebuilt), bits(final))


def test_diff_against_base_compares_in_the_target_dtype_and_hashes_the_cast_model():
    base = {"a": torch.tensor([1.0, 1.0 + 2**-12, 3.0]), "b": torch.tensor([5.0, 6.0])}
    # the float32 masters moved in a and b; in bfloat16 only b[1] differs (1 + 2**-12 rounds to 1.0)
    final = {"a": torch.tensor([1.0 + 2**-13, 1.0, 3.0]), "b": torch.tensor([5.0, 6.5])}
    got, patch, stats = diff_against_base(sorted(final.items()), _Base(base), torch.bfloat16, 10**6)
    assert sorted(patch) == ["b:idx", "b:val"]
    assert patch["b:idx"].tolist() == [1] and patch["b:val"].tolist() == [6.5]
    assert patch["b:val"].dtype == torch.bfloat16
    assert stats["changed_elements"] == 1 and stats["numel"] == 5 and stats["patch_bytes"] == 6
    assert got == weights_hash({k: v.to(torch.bfloat16) for k, v in final.items()})


def test_diff_against_base_gives_no_patch_when_it_would_not_be_smaller():
    base = {"w": torch.zeros(4)}
    final = {"w": torch.tensor([1.0, 2.0, 0.0, 0.0])}  # 2 changed: 2 * (4 + 4) bytes = 16 = dense size
    got, patch, stats = diff_against_base(sorted(final.items()), _Base(base), None, 16)
    assert patch is None and "not be smaller" in stats["why_dense"]
    assert got == weights_hash(final)
    _, patch, _ = diff_against_base(sorted(final.items()), _Base(base), None, 17)
    assert patch["w:idx"].tolist() == [0, 1]


def test_hash_named_tensors_equals_weights_hash_with_tied_aliases():
    emb = torch.arange(6.0).reshape(2, 3)
    sd = {"model.embed": emb, "lm_head": emb, "z": torch.ones(2, dtype=torch.bfloat16)}
    assert [n for n, _ in unique_tensors(sd)] == ["model.embed", "z"]
    assert hash_named_tensors(unique_tensors(sd)) == weights_hash(sd)
