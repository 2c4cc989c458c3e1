"""Model configs (validation, dict round trips) and the registry (names, parameter counts, create)."""

from __future__ import annotations

import json

import pytest
import torch

import sampan
from sampan.models import (
    ErnieConfig,
    ErnieForMaskedLM,
    ErnieForSequenceClassification,
    ErnieForTokenClassification,
    ErnieModel,
    GPTConfig,
    GPTForCausalLM,
    GPTModel,
    LlamaForCausalLM,
    LlamaModel,
    create,
    get_config,
    list_models,
    register_config,
)
from sampan.models.deepseek_v3 import DeepseekV3ForCausalLM, DeepseekV3Model
from sampan.models.ernie4_5 import Ernie4_5ForCausalLM, Ernie4_5Model
from sampan.models.qwen_moe import QwenMoeForCausalLM, QwenMoeModel

# --------------------------------------------------------------------------------------------
# configs


@pytest.mark.parametrize("cls, kwargs, field", [
    (GPTConfig, {"hidden_size": 100, "num_heads": 3}, "hidden_size"),
    (GPTConfig, {"vocab_size": 0}, "vocab_size"),
    (GPTConfig, {"num_layers": -1}, "num_layers"),
    (GPTConfig, {"num_heads": 0}, "num_heads"),
    (GPTConfig, {"max_position_embeddings": 0}, "max_position_embeddings"),
    (GPTConfig, {"hidden_size": 12.5}, "hidden_size"),
    (GPTConfig, {"num_layers": True}, "num_layers"),
    (GPTConfig, {"intermediate_size": -4}, "intermediate_size"),
    (GPTConfig, {"dropout": 1.0}, "dropout"),
    (GPTConfig, {"attention_dropout": -0.1}, "attention_dropout"),
    (GPTConfig, {"activation": "tanh"}, "tanh"),
    (GPTConfig, {"eos_token_id": 50257}, "eos_token_id"),
    (GPTConfig, {"bos_token_id": -1}, "bos_token_id"),
    (GPTConfig, {"vocab_size": 10, "pad_token_id": 10}, "pad_token_id"),
    (ErnieConfig, {"hidden_size": 768, "num_heads": 7}, "hidden_size"),
    (ErnieConfig, {"num_labels": 0}, "num_labels"),
    (ErnieConfig, {"type_vocab_size": -1}, "type_vocab_size"),
    (ErnieConfig, {"pinyin_vocab_size": -2}, "pinyin_vocab_size"),
    (ErnieConfig, {"dropout": 1.5}, "dropout"),
    (ErnieConfig, {"classifier_dropout": 1.0}, "classifier_dropout"),
    (ErnieConfig, {"activation": "swish"}, "swish"),
    (ErnieConfig, {"pad_token_id": 21128}, "pad_token_id"),
    (ErnieConfig, {"pad_token_id": -1}, "pad_token_id"),
])
def test_bad_config_names_the_field(cls, kwargs, field):
    with pytest.raises(ValueError, match=field):
        cls(**kwargs)


def test_divisibility_error_lists_allowed_heads():
    with pytest.raises(ValueError, match=r"num_heads.*\[1, 2, 4, 5, 10, 20\]"):
        GPTConfig(hidden_size=20, num_heads=3)


@pytest.mark.parametrize("cls, kwargs, field", [
    (GPTConfig, {"dropout": None}, "dropout"),
    (GPTConfig, {"dropout": "high"}, "dropout"),
    (GPTConfig, {"eos_token_id": 1.5}, "eos_token_id"),
    (ErnieConfig, {"pad_token_id": 1.5}, "pad_token_id"),
    (GPTConfig, {"layer_norm_eps": -1.0}, "layer_norm_eps"),
    (GPTConfig, {"initializer_range": -0.02}, "initializer_range"),
    (ErnieConfig, {"initializer_range": -0.02}, "initializer_range"),
])
def test_wrongly_typed_or_unchecked_fields_are_value_errors_naming_the_field(cls, kwargs, field):
    # Principle 3 of DESIGN.md: a bad value is a clear error naming the key, at config time.
    with pytest.raises(ValueError, match=field):
        cls(**kwargs)


def test_intermediate_size_default():
    assert GPTConfig(hidden_size=64, num_heads=4).intermediate_size == 256
    assert GPTConfig(hidden_size=64, num_heads=4, intermediate_size=100).intermediate_size == 100
    assert ErnieConfig().intermediate_size == 3072


def test_replace_rederives_default_intermediate_size():
    # intermediate_size 0 means "4 * hidden_size": changing hidden_size must not keep the old width.
    config = GPTConfig(hidden_size=64, num_heads=4)
    assert config.replace(hidden_size=128).intermediate_size == 512
    assert get_config("gpt-small", hidden_size=1024, num_heads=16).intermediate_size == 4096


@pytest.mark.parametrize("config", [
    GPTConfig(),
    GPTConfig(vocab_size=100, hidden_size=32, num_heads=2, eos_token_id=3, tie_word_embeddings=False),
    ErnieConfig(),
    ErnieConfig(pinyin_vocab_size=400, classifier_dropout=0.2, pad_token_id=None),
])
def test_to_dict_from_dict_round_trip(config):
    data = config.to_dict()
    assert data["model_type"] == config.model_type
    again = type(config).from_dict(data)
    assert again == config
    assert type(config).from_dict(json.loads(config.to_json())) == config
    assert json.loads(config.to_json()) == data


def test_from_dict_rejects_unknown_keys_naming_them():
    data = GPTConfig().to_dict()
    data["hiden_size"] = 10
    data["n_layer"] = 3
    with pytest.raises(ValueError, match=r"\['hiden_size', 'n_layer'\]"):
        GPTConfig.from_dict(data)


def test_from_dict_rejects_other_model_type():
    with pytest.raises(ValueError, match="ernie"):
        GPTConfig.from_dict(ErnieConfig().to_dict())


def test_from_dict_validates():
    with pytest.raises(ValueError, match="num_heads"):
        GPTConfig.from_dict({"hidden_size": 10, "num_heads": 3})


def test_replace():
    base = GPTConfig(vocab_size=100, hidden_size=32, num_heads=2)
    other = base.replace(num_layers=3, dropout=0.1)
    assert other.num_layers == 3 and other.dropout == 0.1
    assert base.num_layers == 12 and base.dropout == 0.0  # original unchanged
    with pytest.raises(ValueError, match="num_layer"):
        base.replace(num_layer=3)
    with pytest.raises(ValueError, match="num_heads"):
        base.replace(num_heads=5)


def test_unknown_head():
    with pytest.raises(ValueError, match="classifier"):
        GPTConfig().num_parameters("classifier")


# --------------------------------------------------------------------------------------------
# registry

EXPECTED_NAMES = ["ernie-tiny", "ernie-base", "ernie-large", "gpt-tiny", "gpt-small", "gpt-1.3b",
                  "gpt-13b", "gpt-175b", "gpt-100b"]

CLASSES = {
    ("gpt", "causal_lm"): GPTForCausalLM,
    ("gpt", "none"): GPTModel,
    ("ernie", "masked_lm"): ErnieForMaskedLM,
    ("ernie", "none"): ErnieModel,
    ("ernie", "sequence_classification"): ErnieForSequenceClassification,
    ("ernie", "token_classification"): ErnieForTokenClassification,
    ("llama", "causal_lm"): LlamaForCausalLM,
    ("llama", "none"): LlamaModel,
    ("ernie4_5", "causal_lm"): Ernie4_5ForCausalLM,
    ("ernie4_5", "none"): Ernie4_5Model,
    ("deepseek_v3", "causal_lm"): DeepseekV3ForCausalLM,
    ("deepseek_v3", "none"): DeepseekV3Model,
    ("qwen_moe", "causal_lm"): QwenMoeForCausalLM,
    ("qwen_moe", "none"): QwenMoeModel,
}


def test_list_models():
    names = list_models()
    for name in EXPECTED_NAMES:
        assert name in names
    assert names == sorted(names)


def test_unknown_name_lists_known_names():
    with pytest.raises(ValueError, match="gpt-tiny") as err:
        get_config("gpt-7")
    assert "ernie-base" in str(err.value) and "gpt-7" in str(err.value)
    with pytest.raises(ValueError, match="gpt-175b"):
        create("no-such-model", device="meta")


def test_get_config_returns_fresh_copies():
    a = get_config("gpt-tiny")
    a.num_layers = 99
    assert get_config("gpt-tiny").num_layers == 4


@pytest.mark.parametrize("name", sorted(set(list_models()) | set(EXPECTED_NAMES)))
def test_meta_parameter_count_equals_formula_for_every_head(name):
    config = get_config(name)
    for head in config.HEADS:
        model = create(name, device="meta", head=head)
        assert type(model) is CLASSES[(config.model_type, head)]
        assert all(p.is_meta for p in model.parameters())
        held = sum(p.numel() for p in model.parameters())
        assert held == config.num_parameters(head), (name, head)
        assert held == model.num_parameters()


def test_default_heads():
    assert isinstance(create("gpt-tiny", device="meta"), GPTForCausalLM)
    assert isinstance(create("ernie-tiny", device="meta"), ErnieForMaskedLM)
    with pytest.raises(ValueError, match="masked_lm"):
        create("gpt-tiny", device="meta", head="masked_lm")


def test_known_sizes():
    assert abs(get_config("gpt-175b").num_parameters() - 175e9) / 175e9 < 0.01
    # bert-base-chinese's BertModel (encoder + pooler) holds exactly 102,267,648 parameters.
    ernie_base = get_config("ernie-base").num_parameters("none")
    assert abs(ernie_base - 102_267_648) / 102_267_648 < 0.02
    assert ernie_base == 102_267_648
    # GPT-2 small (tied head): 124,439,808.
    assert get_config("gpt-small").num_parameters() == 124_439_808
    assert abs(get_config("gpt-1.3b").num_parameters() - 1.3e9) / 1.3e9 < 0.05
    assert abs(get_config("gpt-13b").num_parameters() - 13e9) / 13e9 < 0.05
    assert 95e9 < get_config("gpt-100b").num_parameters() < 110e9


def test_flops_per_token_by_hand_from_the_model():
    model = create("gpt-tiny")
    config = model.config
    h, L, V, s = config.hidden_size, config.num_layers, config.vocab_size, 256
    embeddings = {"gpt.embeddings.word_embeddings.weight", "gpt.embeddings.position_embeddings.weight"}
    n = sum(p.numel() for name, p in model.named_parameters() if name not in embeddings) + V * h
    assert config.flops_per_token(s) == 6 * n + 12 * L * h * s
    with pytest.raises(ValueError, match="seq_len"):
        config.flops_per_token(0)


def test_create_bfloat16_keeps_global_default():
    before = torch.get_default_dtype()
    model = create("gpt-tiny", dtype="bfloat16", num_layers=1)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert torch.get_default_dtype() == before == torch.float32
    ernie = create("ernie-tiny", dtype=torch.bfloat16, num_layers=1, vocab_size=100)
    assert all(p.dtype == torch.bfloat16 for p in ernie.parameters())
    assert torch.get_default_dtype() == torch.float32
    assert sampan.randn([2]).dtype == torch.float32


def test_create_restores_default_dtype_when_construction_fails(monkeypatch):
    def boom(self, config):
        raise RuntimeError("boom")

    monkeypatch.setattr(GPTForCausalLM, "__init__", boom)
    with pytest.raises(RuntimeError, match="boom"):
        create("gpt-tiny", dtype="float64")
    assert torch.get_default_dtype() == torch.float32


def test_create_overrides():
    torch.manual_seed(0)
    model = create("gpt-tiny", vocab_size=100, num_layers=1)
    assert model.config.vocab_size == 100 and model.config.num_layers == 1
    assert model.gpt.embeddings.word_embeddings.weight.shape == (100, 128)
    assert len(model.gpt.layers) == 1
    assert model(torch.tensor([[1, 2, 99]])).shape == (1, 3, 100)
    assert get_config("gpt-tiny").vocab_size == 8192  # the registered config is untouched
    with pytest.raises(ValueError, match="vocab_sise"):
        create("gpt-tiny", vocab_sise=100)
    with pytest.raises(ValueError, match="num_heads"):
        create("gpt-tiny", num_heads=3, device="meta")


def test_create_from_config_object():
    config = GPTConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, max_position_embeddings=8)
    model = create(config, head="none")
    assert isinstance(model, GPTModel) and model.config == config
    model2 = create(config, num_layers=2, device="meta")
    assert len(model2.gpt.layers) == 2 and config.num_layers == 1
    with pytest.raises(TypeError, match="int"):
        create(123)


def test_register_config():
    name = "test-registry-gpt-micro"
    config = GPTConfig(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, max_position_embeddings=16)
    from sampan.models import registry

    try:
        register_config(name, config)
        assert name in list_models()
        assert get_config(name) == config
        assert create(name, device="meta").num_parameters() == config.num_parameters()
        with pytest.raises(ValueError, match="already registered"):
            register_config(name, config)
        register_config(name, config.replace(num_layers=2), overwrite=True)
        assert get_config(name).num_layers == 2
    finally:
        registry._CONFIGS.pop(name, None)
    assert name not in list_models()
