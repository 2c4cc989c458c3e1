"""sampan.nn: Layer helpers, attention masks, attention vs a hand-written reference, KV cache, blocks."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sampan
from sampan.nn import (
    FeedForward,
    KVCache,
    Layer,
    MultiHeadAttention,
    TransformerBlock,
    TransformerEmbeddings,
    build_attention_mask,
)

# --------------------------------------------------------------------------------------------
# Layer helpers


class Inner(Layer):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 3)
        self.b = nn.ReLU()


class Outer(Layer):
    def __init__(self):
        super().__init__()
        self.inner = Inner()
        self.head = nn.Linear(3, 1)

    def forward(self, x):
        return self.head(self.inner.b(self.inner.a(x)))


def test_sublayers_and_named_sublayers():
    model = Outer()
    assert model.sublayers() == [model.inner, model.inner.a, model.inner.b, model.head]
    assert model.sublayers(include_self=True)[0] is model
    assert len(model.sublayers(include_self=True)) == 5
    names = [name for name, _ in model.named_sublayers()]
    assert names == ["inner", "inner.a", "inner.b", "head"]
    with_self = list(model.named_sublayers(prefix="m", include_self=True))
    assert with_self[0] == ("m", model)
    assert [n for n, _ in with_self[1:]] == ["m.inner", "m.inner.a", "m.inner.b", "m.head"]


def test_set_state_dict_loads_and_is_strict():
    torch.manual_seed(0)
    src, dst = Outer(), Outer()
    dst.set_state_dict(src.state_dict())
    for (name, p), (_, q) in zip(src.state_dict().items(), dst.state_dict().items(), strict=True):
        assert torch.equal(p, q), name
    missing = dict(src.state_dict())
    del missing["head.bias"]
    with pytest.raises(RuntimeError, match="head.bias"):
        dst.set_state_dict(missing)
    extra = {**src.state_dict(), "extra.weight": torch.zeros(1)}
    with pytest.raises(RuntimeError, match="extra.weight"):
        dst.set_state_dict(extra)
    wrong_shape = {**src.state_dict(), "head.bias": torch.zeros(2)}
    with pytest.raises(RuntimeError, match="head.bias"):
        dst.set_state_dict(wrong_shape)


def test_create_parameter():
    layer = Layer()
    torch.manual_seed(0)
    w = layer.create_parameter([64, 32])
    assert isinstance(w, nn.Parameter) and w.requires_grad
    assert w.shape == (64, 32) and w.dtype == torch.float32
    bound = math.sqrt(6.0 / (64 + 32))  # Xavier-uniform
    peak = float(w.detach().abs().max())
    assert 0.5 * bound < peak <= bound
    b = layer.create_parameter([8], is_bias=True)
    assert torch.equal(b, torch.zeros(8))
    assert torch.equal(layer.create_parameter([5]), torch.zeros(5))  # 1-D: zeros
    assert torch.equal(layer.create_parameter((2, 2), is_bias=True), torch.zeros(2, 2))
    c = layer.create_parameter([3, 3], dtype="float64", default_initializer=lambda t: nn.init.constant_(t, 0.5))
    assert c.dtype == torch.float64 and bool((c == 0.5).all())
    assert layer.create_parameter([2, 2], dtype="bfloat16").dtype == torch.bfloat16


def test_clear_gradients():
    model = Outer()
    model(torch.randn(4, 2)).sum().backward()
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in model.parameters())
    model.clear_gradients()
    assert all(p.grad is not None and bool((p.grad == 0).all()) for p in model.parameters())
    model(torch.randn(4, 2)).sum().backward()
    model.clear_gradients(set_to_zero=False)
    assert all(p.grad is None for p in model.parameters())


# --------------------------------------------------------------------------------------------
# build_attention_mask


def test_mask_none_non_causal():
    assert build_attention_mask(None, 5, 5, causal=False) == (None, False)
    assert build_attention_mask(None, 2, 7, causal=False) == (None, False)


def test_mask_causal_prefill_uses_is_causal():
    assert build_attention_mask(None, 6, 6, causal=True) == (None, True)


def test_mask_decode_step_needs_nothing():
    assert build_attention_mask(None, 1, 9, causal=True) == (None, False)


def test_mask_causal_chunk_with_cache_offset():
    mask, is_causal = build_attention_mask(None, 2, 5, causal=True)
    assert not is_causal
    expected = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert mask.shape == (1, 1, 2, 5)
    assert torch.equal(mask[0, 0], expected)


def test_mask_padding_causal_with_cache_offset():
    pad = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 0, 1]])
    mask, is_causal = build_attention_mask(pad, 2, 5, causal=True)
    assert not is_causal and mask.dtype == torch.bool and mask.shape == (2, 1, 2, 5)
    for b in range(2):
        for i in range(2):
            for j in range(5):
                assert bool(mask[b, 0, i, j]) == (j <= 3 + i and bool(pad[b, j])), (b, i, j)


def test_mask_padding_non_causal():
    pad = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    mask, is_causal = build_attention_mask(pad, 3, 3, causal=False)
    assert not is_causal and mask.shape == (2, 1, 3, 3)
    assert torch.equal(mask[:, 0], pad[:, None, :].expand(2, 3, 3))


def test_mask_fully_masked_rows_become_all_true():
    # Left padding under a causal mask: the first two queries see only padding.
    pad = torch.tensor([[0, 0, 1, 1]])
    mask, _ = build_attention_mask(pad, 4, 4, causal=True)
    assert torch.equal(mask[0, 0, 0], torch.ones(4, dtype=torch.bool))
    assert torch.equal(mask[0, 0, 1], torch.ones(4, dtype=torch.bool))
    assert mask[0, 0, 2].tolist() == [False, False, True, False]
    assert mask[0, 0, 3].tolist() == [False, False, True, True]
    # An all-padding row (non-causal) also sees everything instead of nothing.
    mask, _ = build_attention_mask(torch.zeros(1, 3), 3, 3, causal=False)
    assert bool(mask.all())


def test_mask_wrong_length_and_bad_q_len():
    with pytest.raises(ValueError, match="4 positions.*5"):
        build_attention_mask(torch.ones(2, 4), 1, 5, causal=True)
    with pytest.raises(ValueError, match="q_len"):
        build_attention_mask(None, 6, 5, causal=True)


# --------------------------------------------------------------------------------------------
# MultiHeadAttention vs a hand-written reference


def reference_attention(mha: MultiHeadAttention, x, mask=None, causal=False, past_kv=None):
    """softmax(Q K^T / sqrt(d) [masked]) V, head by head, in float64."""
    b, s, h = x.shape
    d = mha.head_dim
    n = h // d
    xd = x.double()

    def proj(lin, t):
        return (t @ lin.weight.double().T + lin.bias.double()).view(b, t.shape[1], n, d).transpose(1, 2)

    q, k, v = proj(mha.q_proj, xd), proj(mha.k_proj, xd), proj(mha.v_proj, xd)
    if past_kv is not None:
        k = torch.cat([past_kv[0].double(), k], dim=2)
        v = torch.cat([past_kv[1].double(), v], dim=2)
    kv_len = k.shape[2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    allowed = torch.ones(b, 1, s, kv_len, dtype=torch.bool)
    if causal:
        allowed = allowed & torch.ones(s, kv_len, dtype=torch.bool).tril(kv_len - s)
    if mask is not None:
        allowed = allowed & mask
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = scores.softmax(-1) @ v
    out = out.transpose(1, 2).reshape(b, s, h)
    return (out @ mha.out_proj.weight.double().T + mha.out_proj.bias.double()).float()


def make_mha(seed=0, hidden=32, heads=4):
    torch.manual_seed(seed)
    mha = MultiHeadAttention(hidden, heads)
    return mha.eval()


def test_mha_matches_reference_unmasked():
    mha = make_mha()
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(mha(x), reference_attention(mha, x), rtol=0, atol=1e-5)


def test_mha_matches_reference_causal():
    mha = make_mha(1)
    x = torch.randn(2, 6, 32)
    mask, is_causal = build_attention_mask(None, 6, 6, causal=True)
    out = mha(x, mask, is_causal)
    torch.testing.assert_close(out, reference_attention(mha, x, causal=True), rtol=0, atol=1e-5)
    # Causality: a later token does not change an earlier output.
    x2 = x.clone()
    x2[:, -1] += 1.0
    torch.testing.assert_close(mha(x2, mask, is_causal)[:, :-1], out[:, :-1], rtol=0, atol=1e-6)


def test_mha_matches_reference_with_padding_mask():
    mha = make_mha(2)
    x = torch.randn(2, 5, 32)
    pad = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    mask, is_causal = build_attention_mask(pad, 5, 5, causal=False)
    ref = reference_attention(mha, x, mask=pad[:, None, None, :])
    torch.testing.assert_close(mha(x, mask, is_causal), ref, rtol=0, atol=1e-5)


def test_mha_matches_reference_padding_and_causal():
    mha = make_mha(3)
    x = torch.randn(2, 5, 32)
    pad = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], dtype=torch.bool)
    mask, is_causal = build_attention_mask(pad, 5, 5, causal=True)
    out = mha(x, mask, is_causal)
    ref = reference_attention(mha, x, mask=pad[:, None, None, :], causal=True)
    # Compare the rows that can see something (row 1's first two queries see only padding).
    torch.testing.assert_close(out[0], ref[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(out[1, 2:], ref[1, 2:], rtol=0, atol=1e-5)
    assert bool(torch.isfinite(out).all())


def test_mha_with_kv_cache_matches_full_causal():
    mha = make_mha(4)
    x = torch.randn(2, 9, 32)
    full_mask, full_causal = build_attention_mask(None, 9, 9, causal=True)
    full = mha(x, full_mask, full_causal)
    cache = KVCache(1)
    outs = []
    for start, end in [(0, 4), (4, 5), (5, 8), (8, 9)]:
        mask, is_causal = build_attention_mask(None, end - start, end, causal=True)
        outs.append(mha(x[:, start:end], mask, is_causal, kv_cache=cache, layer_idx=0))
    assert cache.seq_len(0) == 9
    torch.testing.assert_close(torch.cat(outs, dim=1), full, rtol=0, atol=1e-5)


def test_mha_rejects_indivisible_heads():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(30, 4)


# --------------------------------------------------------------------------------------------
# KVCache


def test_kv_cache_incremental_equals_one_shot():
    torch.manual_seed(0)
    keys, values = torch.randn(2, 3, 11, 4), torch.randn(2, 3, 11, 4)
    cache = KVCache(num_layers=2)
    assert cache.num_layers == 2 and cache.seq_len(0) == 0
    for start, end in [(0, 3), (3, 4), (4, 9), (9, 11)]:
        k, v = cache.update(0, keys[:, :, start:end], values[:, :, start:end])
        assert torch.equal(k, keys[:, :, :end]) and torch.equal(v, values[:, :, :end])
        assert cache.seq_len(0) == end
    assert cache.seq_len(1) == 0  # layers are independent
    k1, v1 = cache.update(1, keys[:, :, :2], values[:, :, :2])
    assert torch.equal(k1, keys[:, :, :2]) and cache.seq_len(1) == 2
    assert cache.seq_len(0) == 11


def test_kv_cache_grows_beyond_initial_capacity():
    torch.manual_seed(1)
    keys, values = torch.randn(1, 2, 70, 3), torch.randn(1, 2, 70, 3)
    cache = KVCache(1)
    for t in range(70):  # one token at a time: several doublings past the initial 16
        k, v = cache.update(0, keys[:, :, t:t + 1], values[:, :, t:t + 1])
    assert torch.equal(k, keys) and torch.equal(v, values)
    assert cache.seq_len() == 70
    # A single big update larger than the doubled capacity.
    cache2 = KVCache(1)
    cache2.update(0, keys[:, :, :5], values[:, :, :5])
    k, v = cache2.update(0, keys[:, :, 5:], values[:, :, 5:])
    assert torch.equal(k, keys) and torch.equal(v, values)


def test_kv_cache_reorder():
    torch.manual_seed(2)
    keys, values = torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4)
    cache = KVCache(2)
    cache.update(0, keys, values)
    cache.update(1, keys * 2, values * 2)
    index = torch.tensor([2, 0, 0])
    cache.reorder(index)
    new_k, new_v = torch.randn(3, 2, 1, 4), torch.randn(3, 2, 1, 4)
    k, v = cache.update(0, new_k, new_v)
    assert torch.equal(k, torch.cat([keys[index], new_k], dim=2))
    assert torch.equal(v, torch.cat([values[index], new_v], dim=2))
    k, _ = cache.update(1, new_k, new_v)
    assert torch.equal(k, torch.cat([(keys * 2)[index], new_k], dim=2))


def test_kv_cache_rejects_zero_layers():
    with pytest.raises(ValueError, match="num_layers"):
        KVCache(0)


# --------------------------------------------------------------------------------------------
# FeedForward, TransformerBlock, TransformerEmbeddings


@pytest.mark.parametrize("activation, fn", [
    ("gelu", F.gelu), ("relu", F.relu), ("silu", F.silu),
    ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh")),
])
def test_feed_forward(activation, fn):
    torch.manual_seed(0)
    ff = FeedForward(8, 16, activation)
    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(ff(x), ff.fc2(fn(ff.fc1(x))))
    assert ff.fc1.weight.shape == (16, 8) and ff.fc2.weight.shape == (8, 16)


def test_feed_forward_unknown_activation():
    with pytest.raises(ValueError, match="tanh"):
        FeedForward(8, 16, "tanh")


@pytest.mark.parametrize("pre_norm", [True, False])
def test_transformer_block_formula(pre_norm):
    torch.manual_seed(0)
    block = TransformerBlock(16, 2, 32, pre_norm=pre_norm).eval()
    x = torch.randn(2, 5, 16)
    out = block(x, None, True)
    attn = lambda t: block.attn(t, None, True)  # noqa: E731
    if pre_norm:
        h = x + attn(block.norm1(x))
        expected = h + block.mlp(block.norm2(h))
    else:
        h = block.norm1(x + attn(x))
        expected = block.norm2(h + block.mlp(h))
    torch.testing.assert_close(out, expected)


def test_transformer_embeddings_sum_and_features():
    torch.manual_seed(0)
    emb = TransformerEmbeddings(20, 8, 10, type_vocab_size=2, pinyin_vocab_size=5, stroke_vocab_size=4)
    assert set(emb.feature_embeddings) == {"pinyin", "stroke"}
    ids = torch.tensor([[1, 2, 3]])
    types = torch.tensor([[0, 1, 1]])
    py = torch.tensor([[4, 0, 2]])
    st = torch.tensor([[3, 3, 1]])
    out = emb(ids, types, features={"pinyin": py, "stroke": st})
    expected = (emb.word_embeddings(ids) + emb.position_embeddings(torch.arange(3))[None]
                + emb.token_type_embeddings(types) + emb.feature_embeddings["pinyin"](py)
                + emb.feature_embeddings["stroke"](st))
    torch.testing.assert_close(out, expected)
    with pytest.raises(ValueError, match="stroke"):
        emb(ids, types, features={"pinyin": py})
    with pytest.raises(ValueError, match="radical"):
        emb(ids, types, features={"pinyin": py, "stroke": st, "radical": st})
    with pytest.raises(ValueError, match="bogus"):
        emb(ids, types, features={"pinyin": py, "stroke": st, "bogus": st})
    with pytest.raises(ValueError, match="max_position_embeddings"):
        emb(torch.ones(1, 11, dtype=torch.long), features={"pinyin": py, "stroke": st})


def test_transformer_embeddings_layer_norm_and_no_types():
    torch.manual_seed(0)
    emb = TransformerEmbeddings(20, 8, 10, layer_norm_eps=1e-12)
    assert emb.token_type_embeddings is None and len(emb.feature_embeddings) == 0
    ids = torch.tensor([[5, 6]])
    raw = emb.word_embeddings(ids) + emb.position_embeddings(torch.arange(2))[None]
    torch.testing.assert_close(emb(ids), emb.norm(raw))


def test_sampan_nn_exports_blocks():
    assert sampan.nn.MultiHeadAttention is MultiHeadAttention
    assert sampan.nn.KVCache is KVCache
    assert sampan.nn.build_attention_mask is build_attention_mask
