"""The Llama family (Llama 2 / 3 / 3.1, Qwen2 / 2.5, Qwen3): config, model, cache, generation, export."""

from __future__ import annotations

import time

import pytest
import torch

import sampan
from sampan.models import LlamaConfig, create, get_config, list_models
from sampan.nn.rms_norm import RMSNorm
from sampan.nn.rope import rope_inv_freq

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

LLAMA_NAMES = [n for n in list_models() if get_config(n).model_type == "llama"]


# -- config ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    ({"num_heads": 6, "num_kv_heads": 4}, r"num_kv_heads \(4\) must divide num_heads \(6\); allowed: \[1, 2, 3, 6\]"),
    ({"hidden_size": 60, "num_heads": 4, "head_dim": 15}, "head_dim must be even"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn' is not supported"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, r"needs number\(s\) \['low_freq_factor'"),
    ({"eos_token_id": [1, 40000]}, r"eos_token_id\[1\] must be an integer in \[0, vocab_size=32000\)"),
    ({"variant": "mistral"}, "variant must be one of"),
    ({"qkv_bias": 1}, "qkv_bias must be true or false"),
    ({"rms_norm_eps": 0}, "rms_norm_eps"),
])
def test_bad_config_names_the_problem(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LlamaConfig(**kwargs)


def test_derived_fields_follow_replace_and_round_trip():
    config = get_config("llama-tiny")
    assert config.num_kv_heads == 2 and config.head_dim == 16
    wider = config.replace(hidden_size=128)
    assert wider.head_dim == 32 and wider.num_kv_heads == 2
    assert get_config("qwen3-tiny").replace(hidden_size=128).head_dim == 32  # explicit head_dim kept
    mha = LlamaConfig(hidden_size=64, num_heads=4, intermediate_size=128)
    assert mha.replace(num_heads=8).num_kv_heads == 8
    for name in LLAMA_NAMES:
        again = LlamaConfig.from_dict(get_config(name).to_dict())
        assert again == get_config(name), name


# Parameter counts of the published checkpoints (as transformers counts them on the same config).
PUBLISHED = {"llama2-7b": 6_738_415_616, "llama3-8b": 8_030_261_248, "llama3-70b": 70_553_706_496,
             "llama3-405b": 405_853_388_800, "qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304,
             "qwen2.5-7b": 7_615_616_512, "qwen2.5-72b": 72_706_203_648, "qwen3-0.6b": 596_049_920,
             "qwen3-8b": 8_190_735_360, "llama3.2-1b": 1_235_814_400}


@pytest.mark.parametrize("name", LLAMA_NAMES)
def test_parameter_count_equals_transformers(name):
    from sampan.models.llama.hf import config_to_hf

    config = get_config(name)
    hf_config = transformers.AutoConfig.for_model(**config_to_hf(config, "causal_lm"))
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(hf_config)
    assert config.num_parameters() == sum(p.numel() for p in hf.parameters())
    if name in PUBLISHED:
        assert config.num_parameters() == PUBLISHED[name]
    assert create(name, device="meta").num_parameters() == config.num_parameters()


def test_405b_builds_on_meta_in_seconds():
    start = time.perf_counter()
    model = create("llama3-405b", device="meta")
    assert time.perf_counter() - start < 60  # a bound that catches materialising 1.6 TB, not a benchmark
    assert all(p.is_meta for p in model.parameters()) and len(model.model.layers) == 126
    attn = model.model.layers[0].self_attn
    assert attn.k_proj.weight.shape == (8 * 128, 16384) and attn.q_proj.weight.shape == (128 * 128, 16384)


def test_flops_per_token_by_hand():
    config = get_config("qwen3-tiny")
    model = create(config)
    n = sum(p.numel() for name, p in model.named_parameters() if "embed_tokens" not in name)
    n += config.vocab_size * config.hidden_size  # the (tied) head multiplies on every token
    s = 128
    assert config.flops_per_token(s) == 6 * n + 12 * config.num_layers * config.num_heads * config.head_dim * s


# -- numerics against transformers' building blocks ------------------------------------------------------
@pytest.mark.parametrize("scaling", [None, {"rope_type": "linear", "factor": 4.0},
                                     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}])
def test_rope_frequencies_equal_transformers(scaling):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(hidden_size=4096, num_attention_heads=32, rope_theta=500000.0,
                                      max_position_embeddings=131072, rope_scaling=scaling)
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type == "default":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        expected = LlamaRotaryEmbedding.compute_default_rope_parameters(config)[0]
    else:
        expected = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")[0]
    assert torch.equal(rope_inv_freq(128, 500000.0, scaling), expected)


def test_rms_norm_in_bf16_equals_transformers():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    theirs, ours = LlamaRMSNorm(64, eps=1e-5), RMSNorm(64, eps=1e-5)
    with torch.no_grad():
        theirs.weight.normal_()
        ours.weight.copy_(theirs.weight)
    x = torch.randn(4, 7, 64).bfloat16()
    assert torch.equal(ours.bfloat16()(x), theirs.bfloat16()(x))


# -- cache and generation ------------------------------------------------------------------------------------
def _model(name: str = "qwen2-tiny", **overrides):
    torch.manual_seed(0)
    return create(name, **overrides).eval()


def test_kv_cache_holds_only_kv_heads_and_decoding_equals_full_forward():
    from sampan.nn import KVCache

    model = _model()
    ids = torch.randint(0, 512, (2, 9), generator=torch.Generator().manual_seed(0))
    cache = KVCache(model.config.num_layers)
    with torch.no_grad():
        full = model(ids)
        steps = [model(ids[:, :5], kv_cache=cache)[:, -1]]
        for t in range(5, 9):
            steps.append(model(ids[:, t:t + 1], kv_cache=cache)[:, -1])
    keys, _ = cache.get(0)
    assert keys.shape == (2, model.config.num_kv_heads, 9, model.config.head_dim)
    assert model.config.num_kv_heads < model.config.num_heads
    torch.testing.assert_close(torch.stack(steps[:-1], 1), full[:, 4:8], atol=1e-5, rtol=1e-5)


def test_generate_stops_on_any_of_several_eos_and_samples_repeatably():
    model = _model("llama-tiny")
    prompt = torch.randint(1, 512, (2, 4), generator=torch.Generator().manual_seed(1))
    free = model.generate(prompt, max_new_tokens=6, eos_token_id=[])
    eos = [int(free[0, 5]), int(free[1, 5])]
    stopped = model.generate(prompt, max_new_tokens=6, eos_token_id=eos, pad_token_id=0)
    assert stopped.shape[1] <= free.shape[1] and torch.equal(stopped[:, :6], free[:, :6])
    assert torch.equal(model.generate(prompt, max_new_tokens=6, use_cache=False, eos_token_id=[]), free)
    g = [torch.Generator().manual_seed(7) for _ in range(2)]
    a = model.generate(prompt, max_new_tokens=5, do_sample=True, top_k=20, top_p=0.9, temperature=0.8, generator=g[0])
    b = model.generate(prompt, max_new_tokens=5, do_sample=True, top_k=20, top_p=0.9, temperature=0.8, generator=g[1])
    assert torch.equal(a, b)


def test_padding_mask_leaves_real_tokens_alone():
    model = _model("qwen3-tiny")
    ids = torch.randint(1, 512, (1, 6), generator=torch.Generator().manual_seed(2))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 6, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded, attention_mask=mask)[:, 3:], model(ids), atol=1e-5, rtol=1e-5)


# -- training pieces and export --------------------------------------------------------------------------------
def test_recompute_wraps_every_layer_and_keeps_gradients():
    from sampan.nn.recompute import apply_recompute

    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(3))
    plain, wrapped = _model("qwen3-tiny").train(), _model("qwen3-tiny").train()
    assert apply_recompute(wrapped, "full") == wrapped.config.num_layers
    plain(ids, labels=ids).backward()
    wrapped(ids, labels=ids).backward()
    for (name, a), b in zip(plain.named_parameters(), wrapped.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_kv_heads_that_mp_cannot_split_are_refused_by_the_strategy():
    from sampan.distributed import fleet

    strategy = fleet.DistributedStrategy()
    config = get_config("qwen2.5-7b")  # 28 query heads, 4 KV heads
    with pytest.raises(ValueError, match=r"does not divide the model's 4 key/value heads.*\[1, 2, 4\]"):
        strategy.validate_for_model(config.num_heads, config.num_layers, config.vocab_size,
                                    {"mp": 7}, num_kv_heads=config.num_kv_heads)


@pytest.mark.slow
def test_export_pretrained_forward_runs_in_onnxruntime(tmp_path):
    from sampan.inference import Config, create_predictor, export_pretrained

    model = _model("qwen3-tiny", num_layers=1)
    out = export_pretrained(model, tmp_path / "qwen3")  # verified against eager at 4 shapes before it is kept
    ids = torch.randint(0, 512, (2, 11), generator=torch.Generator().manual_seed(4))
    logits = create_predictor(Config(out)).run([ids.numpy()])[0]
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(logits), model(ids), atol=1e-4, rtol=1e-4)


def test_model_directory_round_trip_in_sampan_format(tmp_path):
    model = _model("llama-tiny")
    model.save_pretrained(tmp_path / "m")
    again = sampan.models.from_pretrained(tmp_path / "m")
    ids = torch.randint(0, 512, (1, 8))
    with torch.no_grad():
        assert torch.equal(again(ids), model(ids))
    assert again.config == model.config
