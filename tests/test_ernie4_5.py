"""The ERNIE 4.5 family (dense and MoE): HF checkpoints both ways against transformers, the zoo's
parameter counts, routing details, packing, the cache, training and the parallel plans.

Cost: the single-process tests took 9 s on an idle 2-core machine; the whole file 45 s at load average
13-21 (two 4-rank fleet runs and a one-process reference, plus the ranks' zygote start, which
the suite's other multi-process tests share).
"""

from __future__ import annotations

import json
from fnmatch import fnmatchcase

import pytest
import torch
from safetensors.torch import save_file

import sampan
from sampan.models import create, from_pretrained, get_config, list_models
from sampan.models.ernie4_5 import Ernie4_5Config, parallelize
from sampan.models.ernie4_5 import hf as ernie_hf
from sampan.nn import KVCache
from sampan.nn.moe import MoE, moe_blocks, update_expert_bias
from sampan.nn.moe_experts import GroupedExperts

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

TOL = 1e-4
VOCAB = 128
EPS = 1e-3  # far from every default, so a dropped rms_norm_eps moves the logits far beyond TOL
NAMES = [n for n in list_models() if get_config(n).model_type == "ernie4_5"]

# HF tiny configs: the dense one with use_bias, untied head and head_dim != h / H; the MoE one with
# dense and MoE layers (start index 1, interval 2 leaves layer 2 dense), 8 experts top-2, 2 shared.
CASES = {
    "dense": ("Ernie4_5ForCausalLM", lambda: transformers.Ernie4_5Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=56, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=EPS, use_bias=True,
        tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "moe": ("Ernie4_5_MoeForCausalLM", lambda: transformers.Ernie4_5_MoeConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=56, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=EPS, moe_intermediate_size=16, moe_k=2,
        moe_num_experts=8, moe_num_shared_experts=2, moe_layer_start_index=1, moe_layer_interval=2,
        moe_norm_min=1e-9, tie_word_embeddings=True)),
}


def _hf_model(kind: str, seed: int = 0):
    arch, make_config = CASES[kind]
    torch.manual_seed(seed)
    model = getattr(transformers, arch)(make_config()).eval()
    with torch.no_grad():  # a fresh init leaves norms at one, biases at zero: perturb every tensor
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _ids(batch: int = 3, seq: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _logits(model, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids, **kwargs)
    return out if isinstance(out, torch.Tensor) else out.logits


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def _correction_bias_count(model) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if n.endswith("e_score_correction_bias"))


# -- Hugging Face checkpoints both ways ------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(CASES))
def test_hf_round_trip_logits_generation_and_export(kind, tmp_path):
    hf = _hf_model(kind)
    hf.save_pretrained(tmp_path / "hf")
    ours = from_pretrained(tmp_path / "hf")
    config = ours.config
    assert config.is_moe == (kind == "moe")
    if kind == "moe":
        assert config.moe_layers == (1, 3) and config.moe_norm_min == 1e-9 and config.head_dim == 8
        assert [type(layer.mlp).__name__ for layer in ours.model.layers] == ["Ernie4_5MLP", "MoE", "Ernie4_5MLP", "MoE"]
    # transformers counts the correction bias (E per MoE layer) as a parameter; sampan, a buffer.
    hf_count = sum(p.numel() for p in hf.parameters())
    assert ours.num_parameters() == config.num_parameters() == hf_count - _correction_bias_count(hf)
    ids = _ids()
    expected = _logits(hf, ids)
    assert _diff(_logits(ours, ids), expected) < TOL

    # Greedy decoding with the KV cache, one prompt left-padded.
    prompt = ids[:2, :5].clone()
    mask = torch.ones_like(prompt)
    mask[0, :2] = 0
    prompt = prompt.masked_fill(mask == 0, 0)
    want = hf.generate(prompt, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=2)
    got = ours.generate(prompt, attention_mask=mask, max_new_tokens=8, eos_token_id=2, pad_token_id=0)
    assert torch.equal(got, want)

    ours.save_pretrained(tmp_path / "back", format="hf")
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    assert written["model_type"] == ("ernie4_5_moe" if kind == "moe" else "ernie4_5")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    assert type(back).__name__ == CASES[kind][0]
    assert _diff(_logits(back, ids), expected) < TOL
    assert _diff(_logits(from_pretrained(tmp_path / "back"), ids), expected) < TOL


def test_moe_fused_names_correction_bias_and_mtp_tensors(tmp_path):
    """transformers' in-memory names (fused experts, ``gate.moe_statics``) load too; the
    correction bias steers which experts are chosen (not their weights); ``mtp_*`` tensors drop."""
    hf = _hf_model("moe")
    with torch.no_grad():  # a bias large enough to overturn many tokens' choices
        for layer in (1, 3):
            hf.model.layers[layer].mlp.gate.moe_statics.e_score_correction_bias.copy_(
                0.3 * torch.randn(1, 8, generator=torch.Generator().manual_seed(layer)))
    state = {k: v.contiguous() for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    assert "model.layers.1.mlp.experts.gate_up_proj" in state
    assert "model.layers.1.mlp.gate.moe_statics.e_score_correction_bias" in state
    state["mtp_linear_proj.0.weight"] = torch.zeros(32, 64)  # an MTP layer, as hub checkpoints carry
    (tmp_path / "config.json").write_text(json.dumps({**hf.config.to_dict(), "num_nextn_predict_layers": 1}))
    save_file(state, str(tmp_path / "model.safetensors"))
    ours = from_pretrained(tmp_path)
    ids = _ids()
    expected = _logits(hf, ids)
    assert _diff(_logits(ours, ids), expected) < TOL
    bias = ours.model.layers[1].mlp.gate.e_score_correction_bias
    assert bias.shape == (8,) and torch.equal(bias, state["model.layers.1.mlp.gate.moe_statics.e_score_correction_bias"][0])
    with torch.no_grad():
        for _, block in moe_blocks(ours):
            block.gate.e_score_correction_bias.zero_()
    assert _diff(_logits(ours, ids), expected) > 1e-3  # other experts chosen without it
    # The same checkpoint as the bare decoder: transformers' base model's hidden states.
    body = from_pretrained(tmp_path, head="none")
    assert type(body).__name__ == "Ernie4_5Model"
    with torch.no_grad():
        assert _diff(body(ids), hf.model(ids).last_hidden_state) < TOL


def test_hf_config_refusals_and_defaults():
    base = {"model_type": "ernie4_5_moe", "vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 3,
            "num_attention_heads": 4, "moe_intermediate_size": 8, "moe_num_experts": 4, "moe_k": 2}
    config = ernie_hf.config_from_hf(base)  # transformers' defaults for what the file leaves out
    assert (config.moe_num_shared_experts, config.moe_layer_start_index, config.rope_theta) == (2, 1, 500000.0)
    assert config.head_dim == 8 and config.tie_word_embeddings and config.eos_token_id == 2
    nulls = ernie_hf.config_from_hf({**base, "num_key_value_heads": None, "pad_token_id": None, "use_bias": None})
    assert (nulls.num_kv_heads, nulls.pad_token_id, nulls.bos_token_id, nulls.use_bias) == (4, None, 1, False)
    bare = ernie_hf.config_from_hf({"model_type": "ernie4_5_moe"})  # every key left out: the 21B's shape
    assert bare.num_parameters() == get_config("ernie4.5-21b-a3b").num_parameters()
    assert ernie_hf.config_from_hf({"model_type": "ernie4_5"}) == get_config("ernie4.5-0.3b")
    dense = ernie_hf.config_from_hf({**base, "model_type": "ernie4_5"})
    assert dense.head_dim == 128 and not dense.is_moe  # Ernie4_5Config's default head_dim
    with pytest.raises(ValueError, match="use_rmsnorm=false"):
        ernie_hf.config_from_hf({**base, "use_rmsnorm": False})
    with pytest.raises(ValueError, match="moe_gate_act 'sigmoid'"):
        ernie_hf.config_from_hf({**base, "moe_gate_act": "sigmoid"})
    with pytest.raises(ValueError, match="rope_type 'dynamic'|not supported"):
        ernie_hf.config_from_hf({**base, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}})
    with pytest.raises(ValueError, match="use_bias=True is not supported with MoE"):
        ernie_hf.config_from_hf({**base, "use_bias": True})
    with pytest.raises(ValueError, match="moe_capacity_factor"):
        ernie_hf.config_to_hf(config.replace(moe_capacity_factor=1.25), "causal_lm")


# -- configs and the zoo ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    ({"moe_num_experts": 8, "moe_k": 9, "moe_intermediate_size": 8}, r"moe_k must be in \[1, moe_num_experts=8\]"),
    ({"moe_num_experts": 8, "moe_k": 2, "moe_intermediate_size": 0}, "moe_intermediate_size"),
    ({"num_layers": 2, "moe_num_experts": 8, "moe_k": 2, "moe_intermediate_size": 8, "moe_layer_start_index": 2},
     "no layer is an MoE layer"),
    ({"moe_layer_end_index": 18}, "moe_layer_end_index"),
    ({"moe_aux_loss": "batch"}, "moe_aux_loss must be one of"),
    ({"moe_norm_min": 0.0}, "moe_norm_min"),
    ({"num_heads": 6, "num_kv_heads": 4}, r"num_kv_heads \(4\) must divide num_heads \(6\)"),
    ({"use_bias": 1}, "use_bias must be true or false"),
])
def test_bad_config_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Ernie4_5Config(**kwargs)


@pytest.mark.parametrize("name", NAMES)
def test_zoo_counts_equal_transformers(name):
    config = get_config(name)
    assert Ernie4_5Config.from_dict(config.to_dict()) == config
    hf_config = transformers.AutoConfig.for_model(**ernie_hf.config_to_hf(config, "causal_lm"))
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(hf_config)
    hf_count = sum(p.numel() for p in hf.parameters())
    assert config.num_parameters() == hf_count - _correction_bias_count(hf)
    idle = 0
    if config.is_moe:
        e, k, h, f = config.moe_num_experts, config.moe_k, config.hidden_size, config.moe_intermediate_size
        idle = (e - k) * 3 * h * f * len(config.moe_layers)
        assert config.moe_shape().moe_layers == config.moe_layers
    assert config.num_active_parameters() == config.num_parameters() - idle
    assert create(name, device="meta").num_parameters() == config.num_parameters()


def test_published_sizes():
    # ERNIE 4.5's names: 0.3B (0.36B on its card), 21B total / 3B active, 300B / 47B.
    sizes = {n: (get_config(n).num_parameters(), get_config(n).num_active_parameters())
             for n in ("ernie4.5-0.3b", "ernie4.5-21b-a3b", "ernie4.5-300b-a47b")}
    assert sizes["ernie4.5-0.3b"] == (360_748_032, 360_748_032)
    assert sizes["ernie4.5-21b-a3b"] == (21_825_436_160, 3_352_148_480)
    assert sizes["ernie4.5-300b-a47b"] == (298_636_910_592, 47_079_333_888)
    moe = get_config("ernie4.5-21b-a3b").moe_shape()
    assert (moe.num_experts, moe.top_k, moe.shared_intermediate_size, moe.moe_layers[0], len(moe.moe_layers)) == \
        (64, 6, 3072, 1, 27)
    assert get_config("ernie4.5-0.3b").moe_shape() is None


def test_flops_per_token_counts_active_weights_by_hand():
    config = get_config("ernie4.5-moe-tiny")
    model = create(config)
    f, h, e, k = config.moe_intermediate_size, config.hidden_size, config.moe_num_experts, config.moe_k
    n = sum(p.numel() for name, p in model.named_parameters() if "embed_tokens" not in name)
    n -= (e - k) * 3 * h * f * len(config.moe_layers)  # only top-k experts multiply a token
    n += config.vocab_size * h  # the (tied) head
    s = 64
    assert config.flops_per_token(s) == 6 * n + 12 * config.num_layers * config.num_heads * config.head_dim * s


# -- the model -------------------------------------------------------------------------------------------
def _model(name: str = "ernie4.5-moe-tiny", **overrides):
    torch.manual_seed(0)
    return create(name, **overrides).eval()


def test_interleaved_rope_is_a_permuted_half_split_rope():
    from sampan.models.ernie4_5.modeling import apply_interleaved_rotary
    from sampan.nn.rope import RotaryEmbedding, apply_rotary

    d = 8
    q, k = torch.randn(2, 3, 5, d), torch.randn(2, 2, 5, d)
    cos, sin = RotaryEmbedding(d, 10000.0)(torch.arange(5)[None], torch.float32)
    # Interleaved pairs (2i, 2i+1) are half-split pairs (i, i + d/2) after this permutation.
    perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
    qi, ki = apply_interleaved_rotary(q, k, cos, sin)
    qh, kh = apply_rotary(q[..., perm], k[..., perm], cos, sin)
    torch.testing.assert_close(qi[..., perm], qh)
    torch.testing.assert_close(ki[..., perm], kh)


def test_kv_cache_decoding_equals_full_forward():
    model = _model()
    ids = torch.randint(0, 512, (2, 9), generator=torch.Generator().manual_seed(0))
    cache = KVCache(model.config.num_layers)
    with torch.no_grad():
        full = model(ids)
        steps = [model(ids[:, :5], kv_cache=cache)[:, -1]]
        for t in range(5, 9):
            steps.append(model(ids[:, t:t + 1], kv_cache=cache)[:, -1])
    assert cache.get(0)[0].shape == (2, 2, 9, 16)
    torch.testing.assert_close(torch.stack(steps[:-1], 1), full[:, 4:8], atol=1e-5, rtol=1e-5)


def test_packed_sequences_equal_separate_ones():
    model = _model()
    a = torch.randint(3, 512, (1, 5), generator=torch.Generator().manual_seed(1))
    b = torch.randint(3, 512, (1, 7), generator=torch.Generator().manual_seed(2))
    packed = torch.cat([a, b], dim=1)
    segments = torch.tensor([[0] * 5 + [1] * 7])
    positions = torch.cat([torch.arange(5), torch.arange(7)])[None]
    with torch.no_grad():
        together = model(packed, segment_ids=segments, position_ids=positions)
        torch.testing.assert_close(together[:, :5], model(a), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(together[:, 5:], model(b), atol=1e-5, rtol=1e-5)


def test_training_reduces_loss_and_moves_the_correction_bias():
    torch.manual_seed(0)
    model = create("ernie4.5-moe-tiny", moe_aux_loss="micro_batch", router_aux_loss_coef=0.01).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = torch.randint(3, 512, (4, 16), generator=torch.Generator().manual_seed(5))
    losses = []
    for _ in range(8):
        loss = model(ids, labels=ids)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        update_expert_bias(model)
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5, losses
    router = model.model.layers[1].mlp.gate
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0
    assert router.e_score_correction_bias.abs().sum() > 0  # the aux-loss-free update ran
    assert "e_score_correction_bias" not in dict(model.named_parameters())


def test_recompute_keeps_gradients_and_expert_loads():
    from sampan.nn.recompute import apply_recompute

    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(3))
    overrides = {"moe_aux_loss": "micro_batch", "router_aux_loss_coef": 0.1}
    plain, wrapped = _model(**overrides).train(), _model(**overrides).train()
    assert apply_recompute(wrapped, "full") == wrapped.config.num_layers
    plain(ids, labels=ids).backward()
    wrapped(ids, labels=ids).backward()
    for (name, a), b in zip(plain.named_parameters(), wrapped.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5, msg=name)
    for (_, a), (_, b) in zip(moe_blocks(plain), moe_blocks(wrapped), strict=True):
        assert torch.equal(a.tokens_per_expert, b.tokens_per_expert)  # a replayed forward counts once


def test_sampan_models_open_in_transformers(tmp_path):
    for name in ("ernie4.5-tiny", "ernie4.5-moe-tiny"):
        ours = _model(name, vocab_size=VOCAB, rms_norm_eps=EPS, max_position_embeddings=64)
        with torch.no_grad():  # a non-zero correction bias must travel too
            for _, block in moe_blocks(ours):
                block.gate.e_score_correction_bias.normal_(std=0.3)
        ours.save_pretrained(tmp_path / name, format="hf", max_shard_size="40KB")
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / name).eval()
        ids = _ids()
        assert _diff(_logits(hf, ids), _logits(ours, ids)) < TOL, name


# -- parallel plans --------------------------------------------------------------------------------------
def test_parallel_plans_leave_moe_blocks_to_expert_parallelism():
    moe, dense = create("ernie4.5-moe-tiny", device="meta"), create("ernie4.5-tiny", device="meta")
    assert parallelize.expert_parallel_modules(moe) == ["model.layers.1.mlp.experts", "model.layers.2.mlp.experts"]
    assert parallelize.expert_parallel_modules(moe.model) == ["layers.1.mlp.experts", "layers.2.mlp.experts"]
    assert parallelize.expert_parallel_modules(dense) == []
    assert all(isinstance(moe.get_submodule(n), GroupedExperts) for n in parallelize.expert_parallel_modules(moe))
    plan = parallelize.tensor_parallel_plan(moe)
    modules = dict(moe.named_modules())
    split = {name for name in modules for pattern in plan if fnmatchcase(name, pattern)}
    assert "model.layers.0.mlp.gate_proj" in split and "model.layers.2.self_attn.q_proj" in split
    assert not any(".layers.1.mlp" in name or ".layers.2.mlp" in name for name in split)
    sp = parallelize.sequence_parallel_plan(moe)
    assert type(sp["model.layers.1.mlp"]).__name__ == "PrepareModuleInputOutput"  # gathered whole, sliced out
    assert "model.layers.1.mlp.gate_proj" not in sp and "model.layers.0.mlp.gate_proj" in sp
    assert "model.layers.1.mlp.gate_proj" in parallelize.sequence_parallel_plan(dense)
    parts = parallelize.pipeline_parts(moe)
    assert parts.layers is moe.model.layers and parts.positions == "rotary"
    assert isinstance(moe.get_submodule("model.layers.1.mlp"), MoE)
    assert sampan.models.get_spec("ernie4_5").parallel() is parallelize


# -- under fleet -----------------------------------------------------------------------------------------
FLEET_SCRIPT = r'''
import json, os, sys
import torch
import torch.distributed as dist
import sampan
from sampan.models import create
from sampan.nn.moe import update_expert_bias

torch.set_num_threads(1)
out, settings = sys.argv[1], json.loads(sys.argv[2])
hybrid = settings.get("hybrid_configs")
torch.manual_seed(0)
model = create("ernie4.5-moe-tiny", num_layers=4, moe_layer_interval=2, moe_bias_update_rate=0.01)
with torch.no_grad():  # skew the correction bias so that its update has a visible job
    model.model.layers[1].mlp.gate.e_score_correction_bias[0] = 0.05
optimizer = sampan.optimizer.AdamW(learning_rate=1e-2, parameters=model.parameters())
gen = torch.Generator().manual_seed(1)
batches = [torch.randint(3, 512, (4, 16), generator=gen) for _ in range(3)]
losses = []
if hybrid:
    from sampan.distributed import fleet
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = hybrid
    strategy.pipeline_configs = settings.get("pipeline_configs", {})
    strategy.tensor_parallel_configs = settings.get("tensor_parallel_configs", {})
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
bias = model.model.layers[1].mlp.gate.e_score_correction_bias
bias = bias.full_tensor() if hasattr(bias, "full_tensor") else bias
if not hybrid or dist.get_rank() == 0:
    with open(out, "w") as f:
        json.dump({"losses": losses, "bias": bias.tolist()}, f)
if dist.is_initialized():
    from sampan.distributed.env import shutdown
    shutdown()
'''


def _fleet_run(directory, name: str, settings: dict, nproc: int) -> dict:
    from tests.ranks import run_ranks

    script = directory / "ernie4_5_fleet.py"
    script.write_text(FLEET_SCRIPT)
    out = directory / f"{name}.json"
    run = run_ranks(script, [out, json.dumps(settings)], nproc=nproc, distributed=bool(settings))
    assert run.returncode == 0, run.stdout[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def fleet_reference(tmp_path_factory):
    return _fleet_run(tmp_path_factory.mktemp("ernie4_5_one"), "one", {}, 1)


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name, settings, nproc", [
    ("dp2_mp2_ep2", {"hybrid_configs": {"dp_degree": 2, "mp_degree": 2, "ep_degree": 2}}, 4),
    ("mp2_pp2_sp", {"hybrid_configs": {"mp_degree": 2, "pp_degree": 2}, "pipeline_configs": {"accumulate_steps": 2},
                    "tensor_parallel_configs": {"sequence_parallel": True}}, 4),
])
def test_moe_model_trains_alike_under_fleet(name, settings, nproc, fleet_reference, tmp_path):
    """Attention and dense MLPs split by mp (with and without sequence parallel), experts by ep (MoE
    blocks whole on each mp rank), layers by pp: one process's losses and correction-bias updates
    (the loads summed over the data ranks and the micro-batches)."""
    fleet = _fleet_run(tmp_path, name, settings, nproc)
    torch.testing.assert_close(torch.tensor(fleet["losses"]), torch.tensor(fleet_reference["losses"]),
                               atol=2e-5, rtol=0)
    torch.testing.assert_close(torch.tensor(fleet["bias"]), torch.tensor(fleet_reference["bias"]), atol=1e-6, rtol=0)
    assert fleet_reference["bias"][0] < 0.05  # the overloaded expert's bias went down
