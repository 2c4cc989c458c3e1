"""The MoE layer (sampan.nn.MoE): equal to transformers' own MoE blocks (Qwen3-MoE, Qwen2-MoE,
ERNIE 4.5, DeepSeek-V3) on the same weights, forward and gradients; both expert back ends agree;
the balancing losses, the aux-loss-free bias, capacity and the statistics do what they promise.

Cost: about 10 s on 2 cores (tiny shapes; transformers' blocks are built from tiny configs).
"""

from __future__ import annotations

import math

import pytest
import torch

from sampan.nn import MoE, MoEConfig
from sampan.nn.moe_experts import GroupedExperts

H, F_EXPERT = 16, 8  # multiples of 4: fp32 _grouped_mm runs at these widths


def _randomize(module: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            if t.is_floating_point():
                t.copy_(torch.randn(t.shape, generator=g) * 0.3)


def _hf_block(family: str, **overrides):
    """A transformers MoE block from a tiny config, every weight random."""
    common = dict(hidden_size=H, moe_intermediate_size=F_EXPERT, hidden_act="silu")
    if family == "qwen3":
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
        cfg = Qwen3MoeConfig(num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, **common)
        block = Qwen3MoeSparseMoeBlock(cfg)
    elif family == "qwen2":
        from transformers import Qwen2MoeConfig
        from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
        cfg = Qwen2MoeConfig(num_experts=8, num_experts_per_tok=3, norm_topk_prob=False,
                             shared_expert_intermediate_size=12, **common)
        block = Qwen2MoeSparseMoeBlock(cfg)
    elif family == "ernie":
        from transformers import Ernie4_5_MoeConfig
        from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import Ernie4_5_MoeSparseMoeBlock
        cfg = Ernie4_5_MoeConfig(moe_num_experts=8, moe_k=2, moe_num_shared_experts=2, moe_norm_min=1e-12,
                                 **common)
        block = Ernie4_5_MoeSparseMoeBlock(cfg)
    elif family == "deepseek":
        from transformers import DeepseekV3Config
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
        cfg = DeepseekV3Config(n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
                               routed_scaling_factor=2.5, n_shared_experts=1, norm_topk_prob=True, **common)
        block = DeepseekV3MoE(cfg)
    else:
        raise AssertionError(family)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    _randomize(block)
    return block


SAMPAN_CONFIGS = {
    "qwen3": dict(num_experts=8, top_k=2),
    "qwen2": dict(num_experts=8, top_k=3, norm_topk_prob=False, shared_intermediate_size=12,
                  shared_expert_gate=True),
    "ernie": dict(num_experts=8, top_k=2, shared_intermediate_size=2 * F_EXPERT, norm_min=1e-12,
                  score_correction_bias=True),
    "deepseek": dict(num_experts=16, top_k=4, score_func="sigmoid", n_group=4, topk_group=2,
                     routed_scaling_factor=2.5, score_correction_bias=True, shared_intermediate_size=F_EXPERT),
}


def _hf_to_sampan_name(name: str) -> str:
    name = name.replace("gate.moe_statics.e_score_correction_bias", "gate.e_score_correction_bias")
    return name.replace("shared_expert.", "shared_experts.")


def _sampan_block(family: str, hf_block, backend: str = "auto") -> MoE:
    ours = MoE(MoEConfig(hidden_size=H, expert_intermediate_size=F_EXPERT, **SAMPAN_CONFIGS[family]))
    state = {_hf_to_sampan_name(k): v.reshape(-1) if "correction_bias" in k else v
             for k, v in hf_block.state_dict().items()}
    ours.load_state_dict(state, strict=True)
    ours.experts.backend = backend
    return ours


@pytest.mark.parametrize("backend", ["grouped_mm", "padded"])
@pytest.mark.parametrize("family", ["qwen3", "qwen2", "ernie", "deepseek"])
def test_block_equals_transformers_forward_and_gradients(family, backend):
    hf = _hf_block(family)
    ours = _sampan_block(family, hf, backend)
    x = torch.randn(3, 7, H, generator=torch.Generator().manual_seed(1))
    x_hf, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_hf, out_ours = hf(x_hf), ours(x_ours)
    torch.testing.assert_close(out_ours, out_hf, atol=1e-5, rtol=1e-5)
    g = torch.randn(out_hf.shape, generator=torch.Generator().manual_seed(2))
    out_hf.backward(g)
    out_ours.backward(g)
    torch.testing.assert_close(x_ours.grad, x_hf.grad, atol=1e-5, rtol=1e-5)
    ours_params = dict(ours.named_parameters())
    for name, p in hf.named_parameters():
        if p.grad is None:  # the correction bias: not trained by gradients
            continue
        torch.testing.assert_close(ours_params[_hf_to_sampan_name(name)].grad, p.grad, atol=1e-5, rtol=1e-5,
                                   msg=lambda m, name=name: f"{name}: {m}")


def test_the_bias_chooses_experts_but_does_not_weight_them():
    hf = _hf_block("deepseek")
    with torch.no_grad():  # a bias big enough to change the choice
        hf.gate.e_score_correction_bias.copy_(torch.linspace(-1, 1, 16))
    ours = _sampan_block("deepseek", hf)
    x = torch.randn(2, 5, H)
    torch.testing.assert_close(ours(x), hf(x), atol=1e-5, rtol=1e-5)
    route = ours.gate(x.reshape(-1, H))
    assert (route.topk_idx >= 8).float().mean() > 0.6  # the bias pulls choices to high experts
    unbiased = route.scores.gather(1, route.topk_idx)
    torch.testing.assert_close(route.topk_weight, 2.5 * unbiased / unbiased.sum(-1, keepdim=True))


def test_group_limited_routing_picks_only_from_the_best_groups():
    cfg = MoEConfig(hidden_size=H, num_experts=16, top_k=4, expert_intermediate_size=F_EXPERT,
                    score_func="sigmoid", n_group=4, topk_group=2)
    block = MoE(cfg)
    _randomize(block)
    route = block.gate(torch.randn(50, H))
    groups = route.topk_idx // 4
    group_score = route.scores.view(50, 4, 4).topk(2, dim=-1).values.sum(-1)
    best = group_score.topk(2, dim=-1).indices
    for t in range(50):
        assert set(groups[t].tolist()) <= set(best[t].tolist())


@pytest.mark.parametrize("h,f", [(16, 8), (12, 6), (6, 10)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_experts_back_ends_agree(h, f, dtype):
    cfg = MoEConfig(hidden_size=h, num_experts=5, top_k=2, expert_intermediate_size=f)
    experts = GroupedExperts(cfg).to(dtype)
    _randomize(experts)
    counts = torch.tensor([4, 0, 7, 1, 3])  # an idle expert too
    x = torch.randn(int(counts.sum()), h, dtype=dtype)
    outs, grads = [], []
    backends = ["padded", "grouped_mm"] if experts.grouped_mm_fits(x) else ["padded", "auto"]
    for backend in backends:
        experts.backend = backend
        experts.zero_grad()
        xi = x.clone().requires_grad_()
        out = experts(xi, counts)
        out.sum().backward()  # a stride-0 gradient: the back ends must take it
        outs.append(out)
        grads.append((xi.grad, experts.gate_up_proj.grad.clone(), experts.down_proj.grad.clone()))
    # Against one expert at a time, by hand.
    ref, start = [], 0
    for e, n in enumerate(counts.tolist()):
        gate, up = (x[start:start + n].float() @ experts.gate_up_proj[e].float().T).chunk(2, -1)
        ref.append((torch.nn.functional.silu(gate) * up) @ experts.down_proj[e].float().T)
        start += n
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(outs[0].float(), torch.cat(ref), **tol)
    torch.testing.assert_close(outs[1], outs[0], **tol)
    for a, b in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(a, b, **tol)


def test_auto_picks_grouped_mm_only_where_it_fits():
    aligned = GroupedExperts(MoEConfig(hidden_size=16, num_experts=2, top_k=1, expert_intermediate_size=8))
    odd = GroupedExperts(MoEConfig(hidden_size=16, num_experts=2, top_k=1, expert_intermediate_size=6))
    assert aligned.grouped_mm_fits(torch.zeros(1, 16))
    assert not odd.grouped_mm_fits(torch.zeros(1, 16))
    assert aligned.to(torch.bfloat16).grouped_mm_fits(torch.zeros(1, 16, dtype=torch.bfloat16))
    narrow = GroupedExperts(MoEConfig(hidden_size=16, num_experts=2, top_k=1, expert_intermediate_size=4))
    assert narrow.grouped_mm_fits(torch.zeros(1, 16))  # 4 fp32 = 16 bytes
    assert not narrow.to(torch.bfloat16).grouped_mm_fits(torch.zeros(1, 16, dtype=torch.bfloat16))  # 8 bytes


def test_experts_refuse_counts_for_another_number_of_experts():
    experts = GroupedExperts(MoEConfig(hidden_size=H, num_experts=4, top_k=1, expert_intermediate_size=F_EXPERT))
    with pytest.raises(ValueError, match="holds 4 experts"):
        experts(torch.zeros(3, H), torch.tensor([1, 2]))


def test_config_refuses_impossible_settings():
    base = dict(hidden_size=H, num_experts=8, top_k=2, expert_intermediate_size=F_EXPERT)
    for bad, match in [
        (dict(top_k=9), "top_k=9 exceeds"),
        (dict(score_func="tanh"), "score_func"),
        (dict(aux_loss="switch"), "aux_loss"),
        (dict(n_group=3), "n_group=3"),
        (dict(n_group=4, topk_group=5), "topk_group=5"),
        (dict(n_group=4, topk_group=1, top_k=4), "raise topk_group"),
        (dict(capacity_factor=0.0), "capacity_factor"),
        (dict(shared_expert_gate=True), "shared_expert_gate"),
        (dict(activation="swish"), "activation"),
    ]:
        with pytest.raises(ValueError, match=match):
            MoEConfig(**{**base, **bad})


def test_expert_capacity_formula():
    from sampan.nn.moe_balance import expert_capacity
    assert expert_capacity(10, 2, 4, 1.0) == 5
    assert expert_capacity(10, 2, 4, 1.25) == math.ceil(6.25)
