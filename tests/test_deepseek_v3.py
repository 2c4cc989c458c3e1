"""The DeepSeek-V3 family: MLA, YaRN, the latent KV cache, MoE layers, MTP, and HF checkpoints both ways.

Cost: about 25 s on 2 cores (tiny models; the 671B config is only built on the meta device).
"""

from __future__ import annotations

import json

import pytest
import torch

from sampan.models import create, from_pretrained, get_config
from sampan.models.deepseek_v3 import DeepseekV3Config
from sampan.models.deepseek_v3.hf import config_to_hf

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

TOL = 1e-4
VOCAB = 128
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32, "beta_slow": 1,
        "mscale": 0.8, "mscale_all_dim": 1.0}


def _hf_config(**overrides):
    # 1 dense + 2 MoE layers; 8 experts in 4 groups, top-2 from the best 2 groups; YaRN with an
    # mscale != mscale_all_dim (so both the rope tables and the softmax scale are scaled); a norm
    # epsilon far from the default, so a dropped mapping shows.
    fields = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=56, moe_intermediate_size=16, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
                  num_experts_per_tok=2, n_group=4, topk_group=2, first_k_dense_replace=1, q_lora_rank=24,
                  kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=12, max_position_embeddings=64,
                  rms_norm_eps=1e-3, rope_scaling=dict(YARN), routed_scaling_factor=2.5, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return transformers.DeepseekV3Config(**{**fields, **overrides})


def _hf_model(config, seed: int = 0):
    torch.manual_seed(seed)
    model = transformers.DeepseekV3ForCausalLM(config).eval()
    with torch.no_grad():  # move every tensor off its init (norms at one, correction bias at zero)
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn_like(b))
    return model


def _ids(batch: int = 3, seq: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _logits(model, ids, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids, **kwargs)
    return out if isinstance(out, torch.Tensor) else out.logits


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def _tiny(**overrides):
    torch.manual_seed(0)
    return create("deepseek-v3-tiny", **overrides).eval()


# -- config -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    ({"n_routed_experts": 12, "n_group": 8}, r"n_routed_experts \(12\) must be divisible by n_group \(8\)"),
    ({"n_routed_experts": 8, "n_group": 8, "topk_group": 4}, "needs >= 2 experts"),
    ({"topk_group": 9}, r"topk_group \(9\) cannot exceed n_group \(8\)"),
    ({"num_experts_per_tok": 200}, "num_experts_per_tok .* raise topk_group"),
    ({"qk_rope_head_dim": 63}, "qk_rope_head_dim must be even"),
    ({"first_k_dense_replace": 62}, r"first_k_dense_replace \(62\) cannot exceed num_layers"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, r"needs number\(s\) \['original_max_position"),
    ({"rope_scaling": {"rope_type": "longrope", "factor": 4.0}}, "rope_type 'longrope' is not supported"),
    ({"rope_scaling": {**YARN, "attention_factor": 1.0}}, r"unsupported key\(s\) \['attention_factor'\]"),
    ({"aux_loss": "global"}, "aux_loss must be one of"),
    ({"q_lora_rank": 0}, "q_lora_rank must be a positive integer"),
])
def test_bad_config_names_the_problem(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DeepseekV3Config(**kwargs)


# deepseek-ai/DeepSeek-V3's config.json as published (auto_map left out).
HUB_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
    "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "pretraining_tp": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                                    "quant_method": "fp8", "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                            "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                            "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1", "use_cache": True, "v_head_dim": 128, "vocab_size": 129280,
}


def test_the_published_config_reads_as_the_zoo_entry_and_bad_settings_are_refused_by_name():
    from sampan.models.deepseek_v3.hf import config_from_hf

    with pytest.raises(ValueError, match=r"quantization_config \(fp8\).*dequantize them to bf16"):
        config_from_hf(HUB_CONFIG)
    hub = {k: v for k, v in HUB_CONFIG.items() if k != "quantization_config"}  # as after DeepSeek's fp8_cast_bf16
    # The zoo keeps the paper's balance-loss weight (1e-4); the config.json says 1e-3.
    assert config_from_hf(hub) == get_config("deepseek-v3", aux_loss_coef=0.001)  # MTP left out by default
    assert config_from_hf({**hub, "sampan_load_mtp": True}).num_nextn_predict_layers == 1
    for key, value, message in [("quantization_config", {"quant_method": "fp8"}, "dequantize them to bf16"),
                                ("moe_layer_freq", 2, "moe_layer_freq=2"), ("scoring_func", "softmax", "sigmoid"),
                                ("topk_method", "greedy", "noaux_tc"), ("num_key_value_heads", 8, "every head")]:
        with pytest.raises(ValueError, match=message):
            config_from_hf({**hub, key: value})


def test_yarn_rope_and_softmax_scale_equal_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, yarn_apply_mscale

    from sampan.models.deepseek_v3.modeling import softmax_scale
    from sampan.nn.rope import rope_attention_factor, rope_inv_freq

    for name, scaling in [("deepseek-v3", get_config("deepseek-v3").rope_scaling), ("test", YARN)]:
        config = get_config("deepseek-v3", rope_scaling=scaling, max_position_embeddings=
                            int(scaling["factor"] * scaling["original_max_position_embeddings"]))
        hf = transformers.DeepseekV3Config(**{k: v for k, v in config_to_hf(config, "causal_lm").items()
                                              if k not in ("architectures", "model_type")})
        inv_freq, factor = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
        assert torch.equal(rope_inv_freq(64, 10000.0, scaling), inv_freq), name
        assert rope_attention_factor(scaling) == pytest.approx(factor, rel=1e-12), name
        assert softmax_scale(config) == pytest.approx(yarn_apply_mscale(hf.rope_parameters, 192 ** -0.5), rel=1e-12)
    # The tables themselves, YaRN's temperature folded in (mscale 0.8 against mscale_all_dim 1: != 1).
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

    from sampan.nn.rope import RotaryEmbedding

    positions = torch.arange(0, 64)[None]
    theirs = DeepseekV3RotaryEmbedding(_hf_config())(torch.zeros(1, dtype=torch.float32), positions)
    ours = RotaryEmbedding(4, 10000.0, YARN)(positions, torch.float32)
    assert rope_attention_factor(YARN) != 1.0
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert softmax_scale(get_config("deepseek-v3")) == pytest.approx(192 ** -0.5 * (0.1 * torch.log(
        torch.tensor(40.0)).item() + 1) ** 2, rel=1e-6)


# -- the zoo --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["deepseek-v3", "deepseek-v3-tiny"])
def test_parameter_counts_equal_transformers(name):
    config = get_config(name)
    hf_config = transformers.AutoConfig.for_model(**config_to_hf(config, "causal_lm"))
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(hf_config)
    total = sum(p.numel() for p in hf.parameters())
    assert config.num_parameters() == total
    idle = (config.n_routed_experts - config.num_experts_per_tok) * 3 * config.hidden_size * config.moe_intermediate_size
    assert config.num_active_parameters() == total - (config.num_layers - config.first_k_dense_replace) * idle
    assert create(name, device="meta").num_parameters() == config.num_parameters()
    with_mtp = config.replace(num_nextn_predict_layers=1)
    if name == "deepseek-v3":  # DeepSeek publishes 671B total and 37B activated, both without the MTP module
        assert (config.num_parameters(), config.num_active_parameters()) == (671_026_404_352, 37_552_282_624)
        # 11.6B of MTP weights of its own (+ the shared 0.93B embedding and head the Hub repeats: "685B").
        assert with_mtp.num_parameters() - config.num_parameters() == 11_610_067_968
        shape = config.moe_shape()
        assert (shape.num_experts, shape.top_k, shape.moe_layers[0], len(shape.moe_layers)) == (256, 8, 3, 58)
    else:  # the MTP module's own weights (its MoE layer counted with top-k experts when active)
        model = create(with_mtp, device="meta")
        assert model.num_parameters() == with_mtp.num_parameters()
        assert with_mtp.num_active_parameters() == with_mtp.num_parameters() - 3 * idle


def test_flops_per_token_by_hand():
    config = get_config("deepseek-v3-tiny")
    model = create(config)
    per_expert = 3 * config.hidden_size * config.moe_intermediate_size
    idle = (config.n_routed_experts - config.num_experts_per_tok) * per_expert
    n = sum(p.numel() for name, p in model.named_parameters() if "embed_tokens" not in name)
    n -= (config.num_layers - config.first_k_dense_replace) * idle  # only top-k experts run per token
    s = 64
    attention = 6 * config.num_layers * config.num_heads * s * (config.qk_head_dim + config.v_head_dim)
    assert config.flops_per_token(s) == 6 * n + attention


# -- checkpoints both ways --------------------------------------------------------------------------------
def test_hf_round_trip_logits_and_generation(tmp_path):
    hf = _hf_model(_hf_config())
    hf.save_pretrained(tmp_path / "hf")
    ours = from_pretrained(tmp_path / "hf")
    assert ours.num_parameters() == sum(p.numel() for p in hf.parameters())
    assert ours.config.rope_scaling["mscale"] == 0.8 and ours.config.n_group == 4
    ids = _ids()
    expected = _logits(hf, ids)
    assert _diff(_logits(ours, ids), expected) < TOL

    # Greedy decoding with the latent cache, two prompts, one left-padded.
    prompt, mask = _ids(2, 7, seed=2), torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0
    prompt = prompt.masked_fill(mask == 0, 0)
    want = hf.generate(prompt, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=2)
    got = ours.generate(prompt, attention_mask=mask, max_new_tokens=8, eos_token_id=2, pad_token_id=0)
    assert torch.equal(got, want)

    ours.save_pretrained(tmp_path / "back", format="hf")
    saved = json.loads((tmp_path / "back" / "model.safetensors.index.json").read_text())["weight_map"] if (
        tmp_path / "back" / "model.safetensors.index.json").exists() else None
    from safetensors import safe_open

    if saved is None:
        with safe_open(tmp_path / "back" / "model.safetensors", "pt") as f:
            saved = set(f.keys())
    assert "model.layers.1.mlp.experts.7.up_proj.weight" in saved and "model.layers.1.mlp.experts.gate_up_proj" not in saved
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    assert _diff(_logits(back, ids), expected) < TOL
    assert _diff(_logits(from_pretrained(tmp_path / "back"), ids), expected) < TOL


def test_a_missing_expert_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    hf = _hf_model(_hf_config())
    hf.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["model.layers.2.mlp.experts.5.up_proj.weight"]
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.layers\.2\.mlp\.experts\.gate_up_proj \(only 7680/8192 elements\)"):
        from_pretrained(tmp_path)


def test_fused_expert_checkpoint_and_plain_q_proj(tmp_path):
    """transformers' in-memory names (experts fused as gate_up_proj / down_proj) load too; and
    q_lora_rank=None (a plain q_proj) with the half-split rope layout."""
    from safetensors.torch import save_file

    config = _hf_config(q_lora_rank=None, rope_interleave=False, rope_scaling=None)
    hf = _hf_model(config)
    config.save_pretrained(tmp_path)
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    assert "model.layers.2.mlp.experts.gate_up_proj" in state
    save_file(state, tmp_path / "model.safetensors")
    ours = from_pretrained(tmp_path)
    assert ours.config.q_lora_rank is None and not ours.config.rope_interleave
    ids = _ids()
    assert _diff(_logits(ours, ids), _logits(hf, ids)) < TOL


def test_sampan_model_opens_in_transformers(tmp_path):
    ours = _tiny(vocab_size=VOCAB, rms_norm_eps=1e-3)
    with torch.no_grad():
        for block in (layer.mlp for layer in ours.model.layers[2:]):
            block.gate.e_score_correction_bias.normal_()
    ours.save_pretrained(tmp_path, format="hf", max_shard_size="100KB")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(hf).__name__ == "DeepseekV3ForCausalLM"
    ids = _ids()
    assert _diff(_logits(hf, ids), _logits(ours, ids)) < TOL


# -- the latent KV cache -----------------------------------------------------------------------------------
def test_kv_cache_holds_the_latent_and_decoding_equals_full_forward():
    from sampan.nn import KVCache

    model = _tiny()
    config = model.config
    ids = torch.randint(0, 512, (2, 9), generator=torch.Generator().manual_seed(0))
    cache = KVCache(config.num_layers)
    with torch.no_grad():
        full = model(ids)
        steps = [model(ids[:, :5], kv_cache=cache)[:, -1]]
        for t in range(5, 9):
            steps.append(model(ids[:, t:t + 1], kv_cache=cache)[:, -1])
    torch.testing.assert_close(torch.stack(steps[:-1], 1), full[:, 4:8], atol=1e-5, rtol=1e-5)
    latent, rope_key = cache.get(0)
    assert latent.shape == (2, 1, 9, config.kv_lora_rank) and rope_key.shape == (2, 1, 9, config.qk_rope_head_dim)
    per_token = sum(k.shape[1] * k.shape[-1] + v.shape[1] * v.shape[-1]
                    for k, v in (cache.get(i) for i in range(config.num_layers)))
    assert per_token == (config.kv_lora_rank + config.qk_rope_head_dim) * config.num_layers == 160
    # Per-head keys and values would take H * (qk_head_dim + v_head_dim) numbers per layer: 4x more
    # here (71x for DeepSeek-V3: 576 against 40,960).
    assert per_token * 4 == config.num_layers * config.num_heads * (config.qk_head_dim + config.v_head_dim)
    prompt = ids[:, :4]
    assert torch.equal(model.generate(prompt, max_new_tokens=6, eos_token_id=[]),
                       model.generate(prompt, max_new_tokens=6, eos_token_id=[], use_cache=False))


def test_packed_sequences_equal_separate_ones():
    model = _tiny()
    a, b = _ids(1, 5, seed=3), _ids(1, 7, seed=4)
    packed = torch.cat([a, b], dim=1)
    segments = torch.tensor([[0] * 5 + [1] * 7])
    positions = torch.cat([torch.arange(5), torch.arange(7)])[None]
    got = _logits(model, packed, segment_ids=segments, position_ids=positions)
    torch.testing.assert_close(got, torch.cat([_logits(model, a), _logits(model, b)], dim=1), atol=1e-5, rtol=1e-5)


# -- multi-token prediction ----------------------------------------------------------------------------------
def test_mtp_weights_under_hub_names_and_logits_unchanged(tmp_path):
    from sampan.models.deepseek_v3.modeling import from_pretrained_with_mtp

    ours = _tiny(vocab_size=VOCAB, num_nextn_predict_layers=1)
    ids = _ids()
    ours.save_pretrained(tmp_path, format="hf")
    from safetensors import safe_open

    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        names = set(f.keys())
        assert torch.equal(f.get_tensor("model.layers.4.shared_head.head.weight"), ours.lm_head.weight)
    assert {"model.layers.4.enorm.weight", "model.layers.4.hnorm.weight", "model.layers.4.eh_proj.weight",
            "model.layers.4.shared_head.norm.weight", "model.layers.4.embed_tokens.weight",
            "model.layers.4.mlp.experts.3.down_proj.weight", "model.layers.4.self_attn.kv_b_proj.weight"} <= names
    assert json.loads((tmp_path / "config.json").read_text())["num_nextn_predict_layers"] == 1
    plain = from_pretrained(tmp_path)  # as transformers: the MTP module is left out, logits are the same
    assert len(plain.mtp) == 0 and torch.equal(_logits(plain, ids), _logits(ours, ids))
    again = from_pretrained_with_mtp(tmp_path)
    assert len(again.mtp) == 1
    for name, tensor in ours.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert _diff(_logits(hf, ids), _logits(ours, ids)) < TOL
    body = from_pretrained(tmp_path, head="none")  # the bare decoder drops the MTP module and the head
    assert torch.equal(_logits(body, ids), _logits(ours.model, ids))
    body.save_pretrained(tmp_path / "body", format="hf")
    assert json.loads((tmp_path / "body" / "config.json").read_text())["num_nextn_predict_layers"] == 0


def test_mtp_loss_is_added_and_respects_packing():
    from sampan.models.losses import next_token_loss

    model = _tiny(num_nextn_predict_layers=2, mtp_loss_weight=0.5)
    ids = _ids(2, 10, seed=5)
    with torch.no_grad():
        hidden = model.model(ids)
        main = next_token_loss(model.lm_head, hidden, ids, ids)
        mtp = model.mtp_loss(hidden, ids, ids)
        assert torch.allclose(model(ids, labels=ids), main + 0.5 * mtp)
        assert float(model.last_mtp_loss) == pytest.approx(float(mtp))
        # Depth 1 by hand: state i and the embedding of token i + 1 predict token i + 2.
        m = model.mtp[0]
        x = m.eh_proj(torch.cat([m.enorm(model.model.embed_tokens(ids[:, 1:])), m.hnorm(hidden[:, :-1])], -1))
        state = m.shared_head.norm(m(x, None, True))
        depth1 = torch.nn.functional.cross_entropy(model.lm_head(state[:, :-1]).flatten(0, 1), ids[:, 2:].flatten())
        two = [depth1]
        m2 = model.mtp[1]
        x = m2.eh_proj(torch.cat([m2.enorm(model.model.embed_tokens(ids[:, 2:])), m2.hnorm(state[:, :-1])], -1))
        state2 = m2.shared_head.norm(m2(x, None, True))
        two.append(torch.nn.functional.cross_entropy(model.lm_head(state2[:, :-1]).flatten(0, 1),
                                                     ids[:, 3:].flatten()))
        assert torch.allclose(mtp, torch.stack(two).mean(), atol=1e-6)

        # Packed: no target crosses into the next sequence, and each sequence's terms are its own.
        a, b = ids[:1, :6], ids[1:, :7]
        packed, segments = torch.cat([a, b], 1), torch.tensor([[0] * 6 + [1] * 7])
        positions = torch.cat([torch.arange(6), torch.arange(7)])[None]
        labels = packed.clone()
        labels[0, 6] = -100
        model.mtp = model.mtp[:1]
        got = model.mtp_loss(model.model(packed, segment_ids=segments, position_ids=positions), packed, labels,
                             position_ids=positions, segment_ids=segments)
        la, lb = (model.mtp_loss(model.model(s), s, s) for s in (a, b))
        # depth 1 scores 6 - 2 = 4 targets in a and 7 - 2 = 5 in b
        assert torch.allclose(got, (4 * la + 5 * lb) / 9, atol=1e-5)


# -- training and splitting ------------------------------------------------------------------------------------
def test_training_reduces_loss_and_moves_the_correction_bias():
    from sampan.nn.moe import update_expert_bias

    model = _tiny(num_nextn_predict_layers=1).train()
    ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(6))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(6):
        loss = model(ids, labels=ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        update_expert_bias(model)
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.3
    bias = model.model.layers[3].mlp.gate.e_score_correction_bias
    assert bias.abs().sum() > 0  # aux-loss-free balancing moved it


def test_recompute_keeps_gradients_and_expert_loads():
    from sampan.nn.recompute import apply_recompute

    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(3))
    plain, wrapped = _tiny(num_nextn_predict_layers=1).train(), _tiny(num_nextn_predict_layers=1).train()
    assert apply_recompute(wrapped, "full") == 5  # the 4 layers and the MTP module's layer
    plain(ids, labels=ids).backward()
    wrapped(ids, labels=ids).backward()
    for (name, a), b in zip(plain.named_parameters(), wrapped.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5, msg=name)
    loads = [m.mlp.tokens_per_expert for m in (*wrapped.model.layers[2:], *wrapped.mtp)]
    # Each token goes to top-2 experts once (the replay in backward is not counted): 2 x 32 copies,
    # 2 x 30 in the MTP module, which sees 16 - 1 positions per row.
    assert [float(load.sum()) for load in loads] == [64.0, 64.0, 60.0]


def test_split_plans_name_real_modules():
    from sampan.models.deepseek_v3 import parallelize

    model = create("deepseek-v3-tiny", device="meta", num_nextn_predict_layers=1)
    names = dict(model.named_modules())
    assert parallelize.expert_parallel_modules(model) == [
        "model.layers.2.mlp.experts", "model.layers.3.mlp.experts", "mtp.0.mlp.experts"]
    plan = parallelize.tensor_parallel_plan(model)
    assert all(name in names for name in plan)
    assert "model.layers.0.mlp.gate_proj" in plan and not any(".layers.2.mlp" in name for name in plan)
    assert not any("self_attn" in name for name in plan)  # MLA stays whole (see parallelize.py)
    with pytest.raises(ValueError, match="MTP modules"):
        parallelize.pipeline_parts(model)
    assert len(parallelize.pipeline_parts(create("deepseek-v3-tiny", device="meta")).layers) == 4


FLEET_SCRIPT = r"""
import json, sys
import torch
import torch.distributed as dist
import sampan
from sampan.models import create
from sampan.nn.moe import update_expert_bias

torch.set_num_threads(1)
out, settings = sys.argv[1], json.loads(sys.argv[2])
hybrid = settings.get("hybrid_configs")
torch.manual_seed(0)
model = create("deepseek-v3-tiny", bias_update_rate=0.01)
with torch.no_grad():  # skew the correction bias so that its update has a visible job
    model.model.layers[2].mlp.gate.e_score_correction_bias[0] = 0.05
optimizer = sampan.optimizer.AdamW(learning_rate=1e-2, parameters=model.parameters())
gen = torch.Generator().manual_seed(1)
batches = [torch.randint(3, 512, (4, 16), generator=gen) for _ in range(3)]
losses = []
if hybrid:
    from sampan.distributed import fleet
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = hybrid
    strategy.pipeline_configs = settings.get("pipeline_configs", {})
    fleet.init(is_collective=True, strategy=strategy)
    dmodel = fleet.distributed_model(model)
    optimizer = fleet.distributed_optimizer(optimizer)
    for ids in batches:
        losses.append(dmodel.train_batch(fleet.shard_batch({"input_ids": ids, "labels": ids}), optimizer).item())
else:
    for ids in batches:
        loss = model(ids, labels=ids)
        optimizer.minimize(loss)
        update_expert_bias(model)
        losses.append(loss.item())
bias = model.model.layers[2].mlp.gate.e_score_correction_bias
bias = bias.full_tensor() if hasattr(bias, "full_tensor") else bias
if not hybrid or dist.get_rank() == 0:
    with open(out, "w") as f:
        json.dump({"losses": losses, "bias": bias.tolist()}, f)
if dist.is_initialized():
    from sampan.distributed.env import shutdown
    shutdown()
"""


def _fleet_run(directory, name: str, settings: dict, nproc: int) -> dict:
    from ranks import run_ranks

    script = directory / "deepseek_v3_fleet.py"
    script.write_text(FLEET_SCRIPT)
    out = directory / f"{name}.json"
    run = run_ranks(script, [out, json.dumps(settings)], nproc=nproc, distributed=bool(settings), timeout=200)
    assert run.returncode == 0, run.stdout[-3000:]
    return json.loads(out.read_text())


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_trains_alike_under_fleet_dp2_mp2_ep2(tmp_path):
    """Dense MLPs and the vocabulary split over mp (MLA and MoE blocks whole on each mp rank),
    experts over ep, batches over dp: one process's losses and correction-bias updates (the loads
    summed over the data ranks)."""
    one = _fleet_run(tmp_path, "one", {}, 1)
    fleet = _fleet_run(tmp_path, "fleet", {"hybrid_configs": {"dp_degree": 2, "mp_degree": 2, "ep_degree": 2}}, 4)
    torch.testing.assert_close(torch.tensor(fleet["losses"]), torch.tensor(one["losses"]), atol=2e-5, rtol=0)
    torch.testing.assert_close(torch.tensor(fleet["bias"]), torch.tensor(one["bias"]), atol=1e-6, rtol=0)
    assert one["bias"][0] < 0.05  # the overloaded expert's bias went down
