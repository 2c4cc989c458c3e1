"""ERNIE: encoder outputs, padding masks, MLM and classification heads, Chinese feature embeddings."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import sampan
from sampan.models import (
    ErnieConfig,
    ErnieForMaskedLM,
    ErnieForSequenceClassification,
    ErnieForTokenClassification,
    ErnieModel,
)

VOCAB = 300


def small_config(**overrides) -> ErnieConfig:
    base = {"vocab_size": VOCAB, "hidden_size": 64, "num_layers": 2, "num_heads": 4,
            "max_position_embeddings": 64, "num_labels": 3}
    return ErnieConfig(**{**base, **overrides})


def build(cls, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return cls(small_config(**overrides)).eval()


def real_ids(batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    """Token ids that never equal the pad id 0."""
    return torch.randint(1, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def test_ernie_model_outputs():
    model = build(ErnieModel)
    ids = real_ids(3, 9)
    seq, pooled = model(ids)
    assert seq.shape == (3, 9, 64) and seq.dtype == torch.float32
    assert pooled.shape == (3, 64)
    torch.testing.assert_close(pooled, torch.tanh(model.pooler.dense(seq[:, 0])))
    no_pool = ErnieModel(small_config(), add_pooler=False).eval()
    assert no_pool(ids)[1] is None


def test_token_type_ids_matter():
    model = build(ErnieModel)
    ids = real_ids(2, 6)
    types = torch.tensor([[0, 0, 0, 1, 1, 1]] * 2)
    default, _ = model(ids)
    zeros, _ = model(ids, token_type_ids=torch.zeros_like(ids))
    torch.testing.assert_close(default, zeros, rtol=0, atol=0)
    assert not torch.allclose(model(ids, token_type_ids=types)[0], default)


def test_auto_mask_from_pad_token_equals_explicit_mask():
    model = build(ErnieModel, 1)
    ids = real_ids(2, 8, seed=1)
    ids[0, 5:] = 0
    ids[1, 7:] = 0
    mask = (ids != 0).long()
    auto_seq, auto_pooled = model(ids)
    exp_seq, exp_pooled = model(ids, attention_mask=mask)
    torch.testing.assert_close(auto_seq, exp_seq, rtol=0, atol=0)
    torch.testing.assert_close(auto_pooled, exp_pooled, rtol=0, atol=0)
    # Without a mask the padding is attended to, which changes the real tokens.
    all_ones_seq, _ = model(ids, attention_mask=torch.ones_like(ids))
    assert not torch.allclose(all_ones_seq[0, :5], auto_seq[0, :5], atol=1e-4)


def test_appended_padding_does_not_change_real_tokens():
    model = build(ErnieModel, 2)
    ids = real_ids(2, 7, seed=2)
    seq, pooled = model(ids)
    padded = torch.cat([ids, torch.zeros(2, 5, dtype=torch.long)], dim=1)
    pseq, ppooled = model(padded)
    torch.testing.assert_close(pseq[:, :7], seq, rtol=0, atol=1e-5)
    torch.testing.assert_close(ppooled, pooled, rtol=0, atol=1e-5)
    assert bool(torch.isfinite(pseq).all())


def test_pad_token_id_none_attends_to_everything():
    model = build(ErnieModel, 3, pad_token_id=None)
    ids = real_ids(1, 6, seed=3)
    ids[0, 4:] = 0
    torch.testing.assert_close(model(ids)[0], model(ids, attention_mask=torch.ones_like(ids))[0],
                               rtol=0, atol=0)


def test_mlm_logits_and_loss():
    model = build(ErnieForMaskedLM, 4)
    ids = real_ids(2, 10, seed=4)
    logits = model(ids)
    assert logits.shape == (2, 10, VOCAB)
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[0, 7], labels[1, 0], labels[1, 9] = 5, 17, 299, 1
    keep = labels != -100
    manual = F.cross_entropy(logits[keep], labels[keep])
    loss = model(ids, labels=labels)
    torch.testing.assert_close(loss, manual, rtol=1e-6, atol=1e-6)
    # Same as CE over the full logits with ignore_index.
    full = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(loss, full, rtol=1e-6, atol=1e-6)


def test_mlm_head_is_tied():
    model = build(ErnieForMaskedLM)
    assert model.lm_head.decoder.weight is model.ernie.embeddings.word_embeddings.weight
    assert model.num_parameters() == model.config.num_parameters("masked_lm")


def test_sequence_classification():
    model = build(ErnieForSequenceClassification, 5)
    ids = real_ids(4, 8, seed=5)
    logits = model(ids)
    assert logits.shape == (4, 3)
    _, pooled = model.ernie(ids)
    torch.testing.assert_close(logits, model.classifier(pooled))
    labels = torch.tensor([0, 2, 1, 2])
    torch.testing.assert_close(model(ids, labels=labels), F.cross_entropy(logits, labels),
                               rtol=1e-6, atol=1e-6)


def test_mean_pooled_sequence_classification_averages_the_real_tokens():
    model = build(ErnieForSequenceClassification, 5, classifier_pooling="mean")
    assert model.ernie.pooler is None
    assert model.num_parameters() == model.config.num_parameters("sequence_classification")
    assert model.num_parameters() == build(ErnieForSequenceClassification, 5).num_parameters() - (64 * 64 + 64)
    ids = real_ids(2, 6, seed=3)
    hidden, _ = model.ernie(ids)
    torch.testing.assert_close(model(ids), model.classifier(hidden.mean(dim=1)))
    # Padding (explicit mask, or pad ids with no mask) leaves the logits of the real tokens as they were.
    padded = torch.cat([ids, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    mask = (padded != 0).long()
    torch.testing.assert_close(model(padded, attention_mask=mask), model(ids), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model(padded), model(ids), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="classifier_pooling must be 'cls' or 'mean'"):
        small_config(classifier_pooling="max")


def test_sequence_regression_with_one_label():
    model = build(ErnieForSequenceClassification, 6, num_labels=1)
    ids = real_ids(4, 8, seed=6)
    logits = model(ids)
    assert logits.shape == (4, 1)
    targets = torch.tensor([0.5, -1.0, 2.0, 0.0])
    torch.testing.assert_close(model(ids, labels=targets), F.mse_loss(logits[:, 0], targets),
                               rtol=1e-6, atol=1e-6)


def test_token_classification():
    model = build(ErnieForTokenClassification, 7)
    ids = real_ids(2, 9, seed=7)
    logits = model(ids)
    assert logits.shape == (2, 9, 3)
    assert model.ernie.pooler is None
    labels = torch.randint(0, 3, (2, 9), generator=torch.Generator().manual_seed(8))
    labels[1, 4:] = -100
    keep = labels != -100
    torch.testing.assert_close(model(ids, labels=labels), F.cross_entropy(logits[keep], labels[keep]),
                               rtol=1e-6, atol=1e-6)


FEATURES = {"pinyin_vocab_size": 20, "radical_vocab_size": 12, "stroke_vocab_size": 30}


def feature_ids(batch, seq, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {
        "pinyin_ids": torch.randint(0, 20, (batch, seq), generator=gen),
        "radical_ids": torch.randint(0, 12, (batch, seq), generator=gen),
        "stroke_ids": torch.randint(0, 30, (batch, seq), generator=gen),
    }


@pytest.mark.parametrize("missing", ["pinyin", "radical", "stroke"])
def test_enabled_feature_requires_its_ids(missing):
    model = build(ErnieModel, **FEATURES)
    ids = real_ids(1, 5)
    feats = feature_ids(1, 5)
    del feats[f"{missing}_ids"]
    with pytest.raises(ValueError, match=missing):
        model(ids, **feats)


def test_features_change_the_output():
    model = build(ErnieModel, 9, **FEATURES)
    ids = real_ids(2, 6, seed=9)
    feats = feature_ids(2, 6, seed=1)
    base, _ = model(ids, **feats)
    for name in feats:
        other = dict(feats)
        other[name] = (feats[name] + 1) % {"pinyin_ids": 20, "radical_ids": 12, "stroke_ids": 30}[name]
        assert not torch.allclose(model(ids, **other)[0], base), name
    # The features reach every head.
    for cls in (ErnieForMaskedLM, ErnieForSequenceClassification, ErnieForTokenClassification):
        head = build(cls, 9, **FEATURES)
        out = head(ids, **feats)
        assert bool(torch.isfinite(out).all())
        with pytest.raises(ValueError, match="stroke"):
            head(ids, pinyin_ids=feats["pinyin_ids"], radical_ids=feats["radical_ids"])


def test_feature_parameter_count():
    model = build(ErnieModel, **FEATURES)
    assert model.num_parameters() == model.config.num_parameters("none")
    plain = build(ErnieModel)
    assert model.num_parameters() - plain.num_parameters() == (20 + 12 + 30) * 64


@pytest.mark.parametrize("name", ["pinyin", "radical", "stroke"])
def test_ids_for_disabled_feature_are_rejected(name):
    model = build(ErnieModel)
    ids = real_ids(1, 5)
    with pytest.raises(ValueError, match=name):
        model(ids, **{f"{name}_ids": torch.zeros(1, 5, dtype=torch.long)})
    head = build(ErnieForSequenceClassification)
    with pytest.raises(ValueError, match=name):
        head(ids, **{f"{name}_ids": torch.zeros(1, 5, dtype=torch.long)})


def test_too_long_input():
    model = build(ErnieModel)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(real_ids(1, 65))


@pytest.mark.parametrize("cls", [ErnieForMaskedLM, ErnieForSequenceClassification, ErnieForTokenClassification])
def test_backward_gives_finite_grads(cls):
    model = build(cls, 10, **FEATURES).train()
    ids = real_ids(2, 8, seed=10)
    ids[1, 6:] = 0
    feats = feature_ids(2, 8, seed=2)
    if cls is ErnieForMaskedLM:
        labels = torch.full_like(ids, -100)
        labels[:, 3] = 7
    elif cls is ErnieForSequenceClassification:
        labels = torch.tensor([0, 2])
    else:
        labels = torch.randint(0, 3, (2, 8), generator=torch.Generator().manual_seed(0))
    loss = model(ids, labels=labels, **feats)
    assert loss.dim() == 0 and bool(torch.isfinite(loss))
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert bool(torch.isfinite(param.grad).all()), name
    assert float(model.ernie.layers[0].attn.q_proj.weight.grad.abs().sum()) > 0
    assert float(model.ernie.embeddings.feature_embeddings["pinyin"].weight.grad.abs().sum()) > 0


def test_dropout_active_in_train_mode_only():
    model = build(ErnieModel, 11, dropout=0.3)
    ids = real_ids(1, 6, seed=11)
    a, _ = model(ids)
    b, _ = model(ids)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    model.train()
    torch.manual_seed(0)
    c, _ = model(ids)
    assert not torch.allclose(a, c)


def test_create_ernie_tiny_by_name():
    torch.manual_seed(0)
    model = sampan.models.create("ernie-tiny", head="sequence_classification", num_layers=1,
                                 vocab_size=500, num_labels=5).eval()
    assert isinstance(model, ErnieForSequenceClassification)
    assert model(real_ids(2, 7)).shape == (2, 5)


def test_pre_norm_encoder_ends_with_one_layer_norm():
    post = build(ErnieForMaskedLM)
    pre = build(ErnieForMaskedLM, pre_norm=True)
    assert post.ernie.final_norm is None
    assert pre.num_parameters() == pre.config.num_parameters("masked_lm") == post.num_parameters() + 2 * 64
    assert all(layer.pre_norm for layer in pre.ernie.layers) and not any(layer.pre_norm for layer in post.ernie.layers)
    ids = real_ids(2, 7)
    hidden, _ = pre.ernie(ids)
    # The output is normalised per token (zero mean, unit variance up to the LayerNorm's affine init).
    torch.testing.assert_close(hidden.mean(-1), torch.zeros(2, 7), atol=1e-5, rtol=0)
    loss = pre(ids, labels=ids)
    loss.backward()
    assert pre.ernie.final_norm.weight.grad is not None and torch.isfinite(loss)
    from sampan.models.ernie.parallelize import pipeline_parts

    assert pipeline_parts(pre).norm is pre.ernie.final_norm and pipeline_parts(post).norm is None
