"""sampan's ERNIE reproduces Hugging Face BERT checkpoints opened with ``sampan.models.from_pretrained``."""

from __future__ import annotations

import json

import pytest
import torch

from sampan.models import (
    ErnieForMaskedLM,
    ErnieForSequenceClassification,
    ErnieForTokenClassification,
    ErnieModel,
    from_pretrained,
)

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

TOL = 1e-5
# Far from BERT's (and sampan's) default 1e-12: at these models' activation scale a config mapping
# that dropped layer_norm_eps would move every output by 8e-4 or more (80 x TOL); 1e-7 would not.
LAYER_NORM_EPS = 1e-3


def _config(**overrides):
    kwargs = dict(vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=128, max_position_embeddings=64, type_vocab_size=2,
                  layer_norm_eps=LAYER_NORM_EPS)
    kwargs.update(overrides)
    config = transformers.BertConfig(**kwargs)
    config._attn_implementation = "eager"
    return config


def _build(cls, config, seed=0):
    torch.manual_seed(seed)
    model = cls(config).eval()
    # Random init leaves LayerNorms at identity and biases at zero; perturb every tensor so the
    # comparison exercises each mapped weight.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _batch():
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(1, 120, (3, 10), generator=g)
    attention_mask = torch.ones(3, 10, dtype=torch.long)
    attention_mask[1, 7:] = 0
    attention_mask[2, 4:] = 0
    input_ids[attention_mask == 0] = 0
    token_type_ids = torch.zeros(3, 10, dtype=torch.long)
    token_type_ids[:, 5:] = 1
    return input_ids, token_type_ids, attention_mask


def _max_diff(a, b):
    return (a - b).abs().max().item()


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    model = _build(transformers.BertModel, _config())
    path = tmp_path_factory.mktemp("bert")
    model.save_pretrained(path)
    return model, path


def test_bert_model_matches(bert_dir):
    hf, path = bert_dir
    assert (path / "model.safetensors").is_file()
    ours = from_pretrained(path)
    assert type(ours) is ErnieModel and not ours.training
    ids, types, mask = _batch()
    with torch.no_grad():
        expected = hf(input_ids=ids, token_type_ids=types, attention_mask=mask)
        hidden, pooled = ours(ids, types, mask)
    valid = mask.bool()
    assert _max_diff(hidden[valid], expected.last_hidden_state[valid]) < TOL
    assert _max_diff(hidden, expected.last_hidden_state) < TOL
    assert _max_diff(pooled, expected.pooler_output) < TOL


def test_bert_for_masked_lm_matches(tmp_path):
    hf = _build(transformers.BertForMaskedLM, _config(hidden_act="gelu_new"))
    hf.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path)
    assert type(ours) is ErnieForMaskedLM and ours.config.activation == "gelu_tanh"
    assert ours.lm_head.decoder.weight is ours.ernie.embeddings.word_embeddings.weight
    ids, types, mask = _batch()
    with torch.no_grad():
        expected = hf(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
        logits = ours(ids, types, mask)
    assert _max_diff(logits, expected) < TOL
    # The same checkpoint as a bare encoder: the MLM head is skipped, there is no pooler to fill.
    with pytest.raises(ValueError, match="pooler.dense.weight"):
        from_pretrained(tmp_path, head="none")


@pytest.mark.parametrize("arch,cls", [
    ("BertForSequenceClassification", ErnieForSequenceClassification),
    ("BertForTokenClassification", ErnieForTokenClassification),
])
def test_classifiers_match(tmp_path, arch, cls):
    hf = _build(getattr(transformers, arch), _config(num_labels=3))
    hf.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path)
    assert type(ours) is cls and ours.config.num_labels == 3
    ids, types, mask = _batch()
    with torch.no_grad():
        expected = hf(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
        logits = ours(ids, types, mask)
    assert _max_diff(logits, expected) < TOL


def test_legacy_pytorch_model_bin_with_prefix_and_gamma_beta(bert_dir, tmp_path):
    hf, path = bert_dir
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    state = {}
    for key, tensor in hf.state_dict().items():
        key = "bert." + key
        if "LayerNorm" in key:
            key = key.replace(".weight", ".gamma").replace(".bias", ".beta")
        state[key] = tensor.clone()
    torch.save(state, tmp_path / "pytorch_model.bin")
    ours = from_pretrained(tmp_path)
    ids, types, mask = _batch()
    with torch.no_grad():
        expected = hf(input_ids=ids, token_type_ids=types, attention_mask=mask)
        hidden, pooled = ours(ids, types, mask)
    assert _max_diff(hidden, expected.last_hidden_state) < TOL
    assert _max_diff(pooled, expected.pooler_output) < TOL


def test_sharded_safetensors_and_legacy_tied_decoder(tmp_path):
    hf = _build(transformers.BertForMaskedLM, _config())
    ids, types, mask = _batch()
    with torch.no_grad():
        expected = hf(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    with torch.no_grad():
        assert _max_diff(from_pretrained(sharded)(ids, types, mask), expected) < TOL

    # Old pytorch_model.bin files hold the tied decoder weight and bias too: checked, not loaded.
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "config.json").write_text((sharded / "config.json").read_text())
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    assert "cls.predictions.decoder.weight" in state and "cls.predictions.decoder.bias" in state
    torch.save(state, legacy / "pytorch_model.bin")
    with torch.no_grad():
        assert _max_diff(from_pretrained(legacy)(ids, types, mask), expected) < TOL
    state["cls.predictions.decoder.weight"] += 1.0
    torch.save(state, legacy / "pytorch_model.bin")
    with pytest.raises(ValueError, match="decoder.weight differs"):
        from_pretrained(legacy)


def test_unknown_and_missing_keys_are_named(bert_dir, tmp_path):
    hf, path = bert_dir
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    state = {k: v.clone() for k, v in hf.state_dict().items() if k != "encoder.layer.1.output.dense.bias"}
    state["encoder.layer.0.attention.self.rotary.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"layers\.1\.mlp\.fc2\.bias.*rotary"):
        from_pretrained(tmp_path)


def test_relative_position_embeddings_rejected(bert_dir, tmp_path):
    _, path = bert_dir
    config = json.loads((path / "config.json").read_text())
    config["position_embedding_type"] = "relative_key"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="position_embedding_type.*not supported"):
        from_pretrained(tmp_path)


def test_missing_files(tmp_path, bert_dir):
    with pytest.raises(FileNotFoundError, match="config.json"):
        from_pretrained(tmp_path / "nope")
    (tmp_path / "config.json").write_text((bert_dir[1] / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        from_pretrained(tmp_path)
