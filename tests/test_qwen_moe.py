"""The Qwen-MoE family (Qwen2-MoE, Qwen3-MoE): config, zoo sizes, HF checkpoints both ways, KV cache,
packing, training, and its tensor / sequence / expert-parallel splits.

Tiny random transformers models (8 experts, top-2, MoE and dense layers side by side) are the
reference; nothing is downloaded. Cost: about 14 s on an idle 2-core machine (70 s with it loaded 8x over):
the multi-process case (six two-rank or one-process runs, forked from the zygote in ranks.py) 6 s,
the HF round trips 2 s, the zoo (Qwen3-235B built on the meta device by transformers and by
sampan) 1 s, the rest under 2 s.
"""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from ranks import run_ranks

import sampan
from sampan.models import create, from_pretrained, get_config, list_models
from sampan.models.qwen_moe import QwenMoeConfig, QwenMoeForCausalLM, QwenMoeModel, parallelize
from sampan.models.qwen_moe import hf as qwen_hf
from sampan.nn.moe import MoE, moe_blocks, moe_metrics

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

TOL = 1e-4
VOCAB = 128
# Far from every default epsilon (1e-6), so a dropped mapping moves the logits well past TOL.
HF_SHAPE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-3, moe_intermediate_size=16,
                num_experts=8, num_experts_per_tok=2, bos_token_id=1, eos_token_id=2)
# Each variant with its own features: Qwen2-MoE's q / k / v bias, gated shared expert, un-normalised
# top-k weights, a dense layer by mlp_only_layers and a tied head; Qwen3-MoE's qk-norm, explicit
# head_dim, normalised top-k and a dense layer by decoder_sparse_step.
CASES = {
    "qwen2_moe": ("Qwen2MoeForCausalLM", lambda: transformers.Qwen2MoeConfig(
        **HF_SHAPE, shared_expert_intermediate_size=24, mlp_only_layers=[1], tie_word_embeddings=True)),
    "qwen3_moe": ("Qwen3MoeForCausalLM", lambda: transformers.Qwen3MoeConfig(
        **HF_SHAPE, head_dim=16, norm_topk_prob=True, decoder_sparse_step=2, tie_word_embeddings=False)),
}
QWEN_MOE_NAMES = [n for n in list_models() if get_config(n).model_type == "qwen_moe"]
PUBLISHED = {  # total parameters (as transformers counts them on the published config.json)
    "qwen1.5-moe-a2.7b": 14_315_784_192, "qwen3-30b-a3b": 30_532_122_624, "qwen3-235b-a22b": 235_093_634_560}


def _hf_model(arch: str, config, seed: int = 0):
    torch.manual_seed(seed)
    model = getattr(transformers, arch)(config).eval()
    with torch.no_grad():  # move norms off one and biases off zero, so every mapped tensor matters
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _ids(batch: int = 3, seq: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _logits(model, ids, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids, **kwargs)
    return out if isinstance(out, torch.Tensor) else out.logits


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


# -- HF checkpoints ------------------------------------------------------------------------------------
@pytest.mark.parametrize("model_type", sorted(CASES))
def test_hf_round_trip_logits_and_greedy_tokens(model_type, tmp_path):
    arch, make_config = CASES[model_type]
    hf = _hf_model(arch, make_config())
    hf.save_pretrained(tmp_path / "hf")  # transformers writes experts one tensor each, as the hub does
    ours = from_pretrained(tmp_path / "hf")
    assert isinstance(ours, QwenMoeForCausalLM) and ours.config.variant == model_type
    assert ours.num_parameters() == sum(p.numel() for p in hf.parameters()) == ours.config.num_parameters()
    assert [i for i, layer in enumerate(ours.model.layers) if isinstance(layer.mlp, MoE)] == \
        [i for i, layer in enumerate(hf.model.layers) if hasattr(layer.mlp, "experts")]
    ids = _ids()
    expected = _logits(hf, ids)
    assert _diff(_logits(ours, ids), expected) < TOL

    # Greedy decoding with the KV cache, two prompts, the second left-padded by two.
    prompt = ids[:2, :6].clone()
    prompt[1, :2] = 0
    mask = torch.ones_like(prompt)
    mask[1, :2] = 0
    want = hf.generate(prompt, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=2)
    got = ours.generate(prompt, attention_mask=mask, max_new_tokens=8, eos_token_id=2, pad_token_id=0)
    assert torch.equal(got, want)

    ours.save_pretrained(tmp_path / "back", format="hf")
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["model_type"] == model_type and config["architectures"] == [arch]
    from safetensors import safe_open

    with safe_open(tmp_path / "back" / "model.safetensors", "pt") as f:
        names = set(f.keys())
    with safe_open(tmp_path / "hf" / "model.safetensors", "pt") as f:
        assert names == set(f.keys())  # per-expert names, the shared expert as HF calls it
    back = getattr(transformers, arch).from_pretrained(tmp_path / "back").eval()
    assert _diff(_logits(back, ids), expected) < TOL


def test_fused_expert_checkpoint_and_the_bare_body(tmp_path):
    """transformers' in-memory layout (``experts.gate_up_proj`` / ``down_proj``) loads too, and a
    causal-LM checkpoint loads as the bare model, whose hidden states equal HF's."""
    from safetensors.torch import save_file

    arch, make_config = CASES["qwen2_moe"]
    hf = _hf_model(arch, make_config(), seed=3)
    state = {k: v.contiguous() for k, v in hf.state_dict().items() if k != "lm_head.weight"}  # tied
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    (tmp_path / "fused").mkdir()
    save_file(state, str(tmp_path / "fused" / "model.safetensors"), metadata={"format": "pt"})
    hf.config.save_pretrained(tmp_path / "fused")
    ids = _ids(seed=4)
    assert _diff(_logits(from_pretrained(tmp_path / "fused"), ids), _logits(hf, ids)) < TOL
    body = from_pretrained(tmp_path / "fused", head="none")
    assert isinstance(body, QwenMoeModel)
    with torch.no_grad():
        assert _diff(body(ids), hf.model(ids).last_hidden_state) < TOL


def test_a_missing_or_extra_expert_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    arch, make_config = CASES["qwen3_moe"]
    _hf_model(arch, make_config()).save_pretrained(tmp_path / "hf")
    state = load_file(tmp_path / "hf" / "model.safetensors")
    for name, change, message in [
        ("missing", lambda s: s.pop("model.layers.1.mlp.experts.3.up_proj.weight"),
         r"missing \['model.layers.1.mlp.experts.gate_up_proj \(only 7680/8192 elements\)'\]"),
        ("extra", lambda s: s.update({"model.layers.1.mlp.experts.8.down_proj.weight": torch.zeros(32, 16)}),
         r"unexpected \['model.layers.1.mlp.experts.8.down_proj.weight \(HF name\)'\]"),
    ]:
        broken = dict(state)
        change(broken)
        (tmp_path / name).mkdir()
        save_file(broken, str(tmp_path / name / "model.safetensors"), metadata={"format": "pt"})
        (tmp_path / name / "config.json").write_text((tmp_path / "hf" / "config.json").read_text())
        with pytest.raises(ValueError, match=message):
            from_pretrained(tmp_path / name)


@pytest.mark.parametrize("change, message", [
    ({"use_sliding_window": True}, "use_sliding_window=true is not supported"),
    ({"shared_expert_intermediate_size": 0}, "shared_expert_intermediate_size=0 is not supported"),
    ({"num_experts": 0}, "num_experts=0 makes every layer dense"),
    ({"mlp_only_layers": [0, 1, 2]}, "has no MoE layer"),
    ({"num_key_value_heads": 3}, r"QwenMoeConfig.num_kv_heads \(3\) must divide num_heads \(4\)"),
])
def test_hf_settings_sampan_cannot_run_are_refused_by_name(change, message):
    hf = {**transformers.Qwen2MoeConfig(**HF_SHAPE).to_dict(), **change}
    with pytest.raises(ValueError, match=message):
        qwen_hf.config_from_hf(hf)


# The published config.json files (Qwen/Qwen3-30B-A3B, Qwen/Qwen1.5-MoE-A2.7B), as the Hub holds them.
HUB_CONFIGS = {
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
        "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
        "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
        "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": False,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936},
    "qwen1.5-moe-a2.7b": {
        "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
        "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21, "model_type": "qwen2_moe",
        "num_attention_heads": 16, "num_hidden_layers": 24, "num_key_value_heads": 16, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.39.0.dev0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
        "decoder_sparse_step": 1, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
        "num_experts_per_tok": 4, "num_experts": 60, "norm_topk_prob": False, "output_router_logits": False,
        "router_aux_loss_coef": 0.001},
}


@pytest.mark.parametrize("name", sorted(HUB_CONFIGS))
def test_published_config_json_reads_as_the_zoo_entry(name):
    assert qwen_hf.config_from_hf(HUB_CONFIGS[name]) == get_config(name)
    assert qwen_hf.head_from_hf(HUB_CONFIGS[name], set()) == "causal_lm"


def test_hf_config_reads_transformers_5_names_and_defaults():
    saved = transformers.Qwen3MoeConfig(**HF_SHAPE, head_dim=16).to_dict()
    assert "num_local_experts" in saved  # transformers 5 writes Qwen3-MoE's expert count so
    config = qwen_hf.config_from_hf({k: v for k, v in saved.items() if k != "num_experts"})
    assert config.num_experts == 8 and config.qk_norm and not config.qkv_bias
    # A key left out means what transformers would build: Qwen3-MoE's norm_topk_prob is false there.
    bare = qwen_hf.config_from_hf({"model_type": "qwen3_moe", **{k: v for k, v in HF_SHAPE.items()}})
    assert bare.norm_topk_prob is False and bare.router_aux_loss_coef == 0.001


@pytest.mark.parametrize("name, change, message", [
    ("qwen3-moe-tiny", {"shared_expert_intermediate_size": 64}, "Qwen3-MoE has no shared expert"),
    ("qwen3-moe-tiny", {"qk_norm": False}, "Qwen3-MoE always has qk_norm=True"),
    ("qwen2-moe-tiny", {"shared_expert_intermediate_size": 0}, "Qwen2-MoE always has a shared expert"),
    ("qwen2-moe-tiny", {"out_bias": True}, "no bias on o_proj"),
])
def test_export_refuses_fields_the_variant_lacks(name, change, message):
    config = get_config(name, **change)  # a model sampan runs, which transformers' class cannot express
    with pytest.raises(ValueError, match=message):
        qwen_hf.config_to_hf(config, "causal_lm")


# -- config and zoo --------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    ({"variant": "mixtral"}, "variant must be one of"),
    ({"num_experts": 4, "num_experts_per_tok": 8}, r"num_experts_per_tok \(8\) must be at most num_experts \(4\)"),
    ({"num_layers": 4, "mlp_only_layers": [4]}, r"mlp_only_layers holds \[4\]"),
    ({"decoder_sparse_step": 0}, "decoder_sparse_step must be a positive integer"),
    ({"num_layers": 1, "decoder_sparse_step": 2}, "has no MoE layer"),
    ({"num_heads": 6, "num_kv_heads": 4}, r"QwenMoeConfig.num_kv_heads \(4\) must divide num_heads \(6\)"),
    ({"norm_topk_prob": 1}, "norm_topk_prob must be true or false"),
    ({"router_aux_loss_coef": -1.0}, "router_aux_loss_coef must be a number >= 0"),
])
def test_bad_config_names_the_problem(kwargs, message):
    with pytest.raises(ValueError, match=message):
        QwenMoeConfig(**kwargs)


def test_config_round_trips_and_derived_fields_follow():
    for name in QWEN_MOE_NAMES:
        config = get_config(name)
        assert QwenMoeConfig.from_dict(json.loads(config.to_json())) == config, name
    a27 = get_config("qwen1.5-moe-a2.7b")
    assert a27.head_dim == 128 and a27.replace(hidden_size=1024).head_dim == 64
    assert get_config("qwen3-30b-a3b").replace(hidden_size=1024).head_dim == 128  # explicit head_dim kept
    assert get_config("qwen2-moe-tiny").moe_layers() == (0, 2)
    assert get_config("qwen3-moe-tiny").moe_layers() == (1, 3)


@pytest.mark.parametrize("name", QWEN_MOE_NAMES)
def test_zoo_total_and_active_parameters_equal_transformers(name):
    config = get_config(name)
    hf_config = transformers.AutoConfig.for_model(**qwen_hf.config_to_hf(config, "causal_lm"))
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(hf_config)
    total = sum(p.numel() for p in hf.parameters())
    assert config.num_parameters() == total
    if name in PUBLISHED:
        assert total == PUBLISHED[name]
    shape = config.moe_shape()
    idle = (shape.num_experts - shape.top_k) * 3 * config.hidden_size * shape.expert_intermediate_size
    assert config.num_active_parameters() == total - idle * len(shape.moe_layers)
    assert create(name, device="meta").num_parameters() == total


def test_published_active_sizes():
    """The names' promise: Qwen1.5-MoE-A2.7B, Qwen3-30B-A3B, Qwen3-235B-A22B."""
    assert round(get_config("qwen1.5-moe-a2.7b").num_active_parameters() / 1e9, 1) == 2.7
    assert round(get_config("qwen3-30b-a3b").num_active_parameters() / 1e9, 1) == 3.4
    assert round(get_config("qwen3-235b-a22b").num_active_parameters() / 1e9) == 22
    shape = get_config("qwen3-235b-a22b").moe_shape()
    assert (shape.num_experts, shape.top_k, shape.expert_intermediate_size, shape.shared_intermediate_size,
            len(shape.moe_layers)) == (128, 8, 1536, 0, 94)


def test_flops_per_token_counts_the_active_matmuls_by_hand():
    config = get_config("qwen2-moe-tiny")
    model = create(config)
    n = 0
    for name, p in model.named_parameters():
        if "embed_tokens" in name:
            continue
        # A token runs top_k of the E stacked experts.
        n += p.numel() * config.num_experts_per_tok // config.num_experts if ".experts." in name else p.numel()
    n += config.vocab_size * config.hidden_size  # the tied head multiplies on every token
    s = 64
    assert config.flops_per_token(s) == 6 * n + 12 * config.num_layers * config.num_heads * config.head_dim * s


# -- cache, packing, training ------------------------------------------------------------------------------
def _model(name: str, **overrides):
    torch.manual_seed(0)
    return create(name, **overrides).eval()


def test_kv_cache_decoding_equals_full_forward():
    from sampan.nn import KVCache

    model = _model("qwen3-moe-tiny")
    ids = torch.randint(0, 512, (2, 9), generator=torch.Generator().manual_seed(0))
    cache = KVCache(model.config.num_layers)
    with torch.no_grad():
        full = model(ids)
        steps = [model(ids[:, :5], kv_cache=cache)[:, -1]]
        for t in range(5, 9):
            steps.append(model(ids[:, t:t + 1], kv_cache=cache)[:, -1])
    assert cache.get(0)[0].shape == (2, model.config.num_kv_heads, 9, model.config.head_dim)
    torch.testing.assert_close(torch.stack(steps[:-1], 1), full[:, 4:8], atol=1e-5, rtol=1e-5)


def test_packed_sequences_equal_each_alone():
    model = _model("qwen2-moe-tiny")
    a, b = (torch.randint(3, 512, (1, n), generator=torch.Generator().manual_seed(n)) for n in (5, 7))
    packed = torch.cat([a, b], 1)
    segments = torch.tensor([[0] * 5 + [1] * 7])
    positions = torch.tensor([list(range(5)) + list(range(7))])
    with torch.no_grad():
        out = model(packed, segment_ids=segments, position_ids=positions)
        torch.testing.assert_close(out[:, :5], model(a), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out[:, 5:], model(b), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name, aux", [("qwen2-moe-tiny", "micro_batch"), ("qwen3-moe-tiny", "global_batch")])
def test_training_lowers_the_loss_and_the_balancing_loss_reaches_the_router(name, aux):
    model = _model(name, router_aux_loss_coef=0.05).train()
    blocks = moe_blocks(model)
    assert blocks and all(b.config.aux_loss == aux and b.config.aux_loss_coef == 0.05 for _, b in blocks)
    ids = torch.randint(0, 512, (4, 16), generator=torch.Generator().manual_seed(5))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(6):
        loss = model(ids, labels=ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1
    metrics = moe_metrics(model)
    assert metrics["moe/aux_loss"] > 0 and {f"moe/layer{i}/load_max_over_mean" for i in model.config.moe_layers()} \
        <= set(metrics)
    # The balancing loss's gradient reaches the router: without it the router's gradient differs.
    router = blocks[0][1].gate.weight
    grads = []
    for coef in (0.0, 0.05):
        other = _model(name, router_aux_loss_coef=coef).train()
        other(ids, labels=ids).backward()
        grads.append(moe_blocks(other)[0][1].gate.weight.grad)
    assert moe_blocks(_model(name, router_aux_loss_coef=0.0))[0][1].config.aux_loss == "none"
    assert _diff(grads[0], grads[1]) > 1e-6 and router.shape == grads[0].shape


def test_recompute_keeps_gradients_with_the_balancing_loss():
    from sampan.nn.recompute import apply_recompute

    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(3))
    plain = _model("qwen3-moe-tiny", router_aux_loss_coef=0.05).train()
    wrapped = _model("qwen3-moe-tiny", router_aux_loss_coef=0.05).train()
    assert apply_recompute(wrapped, "full") == wrapped.config.num_layers
    plain(ids, labels=ids).backward()
    wrapped(ids, labels=ids).backward()
    for (name, a), b in zip(plain.named_parameters(), wrapped.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5, msg=name)


# -- splits ---------------------------------------------------------------------------------------------------
def test_tensor_parallel_plan_leaves_moe_blocks_whole_and_names_the_experts():
    from fnmatch import fnmatchcase

    model = create("qwen2-moe-tiny", device="meta")
    plan = parallelize.tensor_parallel_plan(model)
    modules = [name for name, _ in model.named_modules() if name]
    matched = {name for pattern in plan for name in modules if fnmatchcase(name, pattern)}
    assert "model.layers.1.mlp.gate_proj" in matched and "model.layers.1.mlp.down_proj" in matched
    assert not [n for n in matched if n.startswith(("model.layers.0.mlp", "model.layers.2.mlp"))]
    assert all(any(fnmatchcase(n, p) for n in modules) for p in plan)  # every pattern matches
    assert parallelize.expert_parallel_modules(model) == ["model.layers.0.mlp.experts", "model.layers.2.mlp.experts"]
    assert len(parallelize.pipeline_parts(model).layers) == 3
    assert parallelize.pipeline_parts(model.model) is None
    assert sampan.models.get_spec("qwen_moe").parallel() is parallelize


SPLIT_SCRIPT = textwrap.dedent('''
    import json, sys
    import torch
    import sampan
    from sampan.models import create

    out, aux, layout = sys.argv[1], float(sys.argv[2]), json.loads(sys.argv[3])  # layout {} = one process
    torch.manual_seed(0)
    # Qwen2-MoE's layout (dense layer 1, MoE layers 0 and 2 with a gated shared expert) with qk-norm too.
    model = create("qwen2-moe-tiny", vocab_size=64, max_position_embeddings=16, qk_norm=True,
                   router_aux_loss_coef=aux)
    optimizer = sampan.optimizer.SGD(learning_rate=0.2, parameters=model.parameters())
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(1, 64, (4, 16), generator=gen)] * 3  # one batch: the loss must fall
    losses = []
    if not layout:
        for ids in batches:
            loss = model(input_ids=ids, labels=ids)
            optimizer.minimize(loss)
            losses.append(loss.item())
    else:
        from sampan.distributed import fleet
        strategy = fleet.DistributedStrategy()
        strategy.hybrid_configs = layout["hybrid_configs"]
        strategy.tensor_parallel_configs = {"sequence_parallel": layout.get("sp", False)}
        strategy.pipeline_configs = {"accumulate_steps": layout.get("accumulate", 1)}
        fleet.init(is_collective=True, strategy=strategy)
        dmodel = fleet.distributed_model(model)
        optimizer = fleet.distributed_optimizer(optimizer)
        weight = model.model.layers[0].mlp.experts.gate_up_proj  # a DTensor under expert parallelism
        held = (weight.to_local() if hasattr(weight, "to_local") else weight).shape[0]
        for ids in batches:
            losses.append(dmodel.train_batch(fleet.shard_batch({"input_ids": ids, "labels": ids}), optimizer).item())
    if not layout or torch.distributed.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"losses": losses, "experts_held": held if layout else 8}, f)
    if layout:
        from sampan.distributed.env import shutdown
        shutdown()
''')
# (aux-loss weight, layout): the MoE blocks see every token of the batch under mp (with or without
# sequence parallel), so the balancing loss is one process's; data-parallel expert parallelism and
# pipeline micro-batches compute it on part of the batch, so those run without it.
SPLITS = {
    "mp2": (0.05, {"hybrid_configs": {"mp_degree": 2}}),
    "mp2-sp": (0.05, {"hybrid_configs": {"mp_degree": 2}, "sp": True}),
    "dp2-ep2": (0.0, {"hybrid_configs": {"dp_degree": 2, "ep_degree": 2}}),
    "pp2": (0.0, {"hybrid_configs": {"pp_degree": 2}, "accumulate": 2}),
}


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_tensor_sequence_expert_and_pipeline_parallel_equal_one_process(tmp_path):
    """mp2 (with and without sequence parallel), dp2 x ep2 (one expert of each block on each rank)
    and pp2, each on two gloo ranks: plain SGD (where a gradient of the wrong scale shows in the next
    loss) gives the one-process losses."""
    script = tmp_path / "split.py"
    script.write_text(SPLIT_SCRIPT)
    want = {}
    for aux in (0.05, 0.0):
        one = run_ranks(script, [tmp_path / f"one-{aux}.json", aux, "{}"], distributed=False, timeout=120)
        assert one.returncode == 0, one.stderr[-3000:]
        want[aux] = json.loads((tmp_path / f"one-{aux}.json").read_text())["losses"]
        assert want[aux][2] < want[aux][1] < want[aux][0]
    assert want[0.05] != want[0.0]  # the balancing loss changes the training
    for name, (aux, layout) in SPLITS.items():
        run = run_ranks(script, [tmp_path / f"{name}.json", aux, json.dumps(layout)], nproc=2, timeout=120)
        assert run.returncode == 0, run.stderr[-3000:]
        got = json.loads((tmp_path / f"{name}.json").read_text())
        assert got["losses"] == pytest.approx(want[aux], rel=1e-5, abs=1e-6), name
        assert got["experts_held"] == (4 if "ep_degree" in layout["hybrid_configs"] else 8), name
