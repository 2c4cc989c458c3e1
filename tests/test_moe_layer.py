"""The MoE layer (sampan.nn.MoE): equal to transformers' own MoE blocks (Qwen3-MoE, Qwen2-MoE,
ERNIE 4.5, DeepSeek-V3) on the same weights, forward and gradients; both expert back ends agree;
the balancing losses, the aux-loss-free bias, capacity and the statistics do what they promise.

Cost: about 6 s on 2 cores, 4 s of it importing transformers (tiny shapes and configs).
"""

from __future__ import annotations

import math

import pytest
import torch

from sampan.nn import MoE, MoEConfig
from sampan.nn.moe import (
    moe_blocks,
    moe_metrics,
    reset_moe_stats,
    set_aux_loss_scale,
    set_load_reducer,
    update_expert_bias,
)
from sampan.nn.moe_experts import GroupedExperts

H, F_EXPERT = 16, 8  # multiples of 4: fp32 _grouped_mm runs at these widths


def _randomize(module: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in module.state_dict().values():  # parameters and saved buffers, not statistics
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


# -- balancing losses -------------------------------------------------------------------------

def _block(seed: int = 0, **cfg) -> MoE:
    block = MoE(MoEConfig(**{**dict(hidden_size=H, num_experts=8, top_k=2, expert_intermediate_size=F_EXPERT),
                             **cfg}))
    _randomize(block, seed)
    return block


def _direct_aux(kind: str, route, b: int, num_experts: int, k: int, score_func: str, other=None):
    """The balancing losses written out from their papers, one sequence at a time for "sequence"."""
    probs = route.scores if score_func == "softmax" else route.scores / route.scores.sum(-1, keepdim=True)
    assigned = torch.nn.functional.one_hot(route.topk_idx, num_experts).float().sum(1)  # [T, E]
    if kind == "micro_batch":
        f = assigned.sum(0) / (assigned.shape[0] * k)
        return num_experts * (f * probs.mean(0)).sum()
    if kind == "global_batch":
        counts = assigned.sum(0) + other
        return num_experts * (counts / counts.sum() * probs.mean(0)).sum()
    losses = []
    for seq_assigned, seq_probs in zip(assigned.view(b, -1, num_experts), probs.view(b, -1, num_experts),
                                       strict=True):
        s = seq_assigned.shape[0]
        f = num_experts / (k * s) * seq_assigned.sum(0)  # DeepSeek-V3's f_i
        losses.append((f * seq_probs.mean(0)).sum())
    return torch.stack(losses).mean()


OTHER_RANK = torch.arange(8, dtype=torch.float32) * 3  # another data rank's expert counts


@pytest.mark.parametrize("kind,score_func", [("micro_batch", "softmax"), ("global_batch", "softmax"),
                                             ("sequence", "sigmoid"), ("sequence", "softmax")])
def test_aux_loss_values_and_gradients_match_the_formula(kind, score_func):
    coef, z_coef = 0.3, 0.05
    block = _block(aux_loss=kind, aux_loss_coef=coef, z_loss_coef=z_coef, score_func=score_func,
                   shared_intermediate_size=F_EXPERT)
    reference = _block(score_func=score_func, shared_intermediate_size=F_EXPERT)  # no losses of its own
    reference.load_state_dict(block.state_dict())
    reducer = (lambda t: t + OTHER_RANK) if kind == "global_batch" else None
    set_load_reducer(block, reducer)
    x = torch.randn(3, 7, H, generator=torch.Generator().manual_seed(3))

    x1 = x.clone().requires_grad_()
    block(x1).sum().backward()

    x2 = x.clone().requires_grad_()
    out = reference(x2)
    route = reference.gate(x2.reshape(-1, H))
    aux = _direct_aux(kind, route, 3, 8, 2, score_func, OTHER_RANK)
    z = (torch.logsumexp(route.logits, -1) ** 2).mean()
    (out.sum() + coef * aux + z_coef * z).backward()

    torch.testing.assert_close(block.last_aux_loss, aux.detach())
    torch.testing.assert_close(block.last_z_loss, z.detach())
    assert block.gate.weight.grad is not None
    torch.testing.assert_close(x1.grad, x2.grad)
    ours = dict(block.named_parameters())
    for name, p in reference.named_parameters():
        torch.testing.assert_close(ours[name].grad, p.grad, msg=lambda m, name=name: f"{name}: {m}")


def test_a_perfectly_even_router_has_aux_loss_one():
    block = _block(aux_loss="micro_batch", num_experts=4, top_k=2)
    with torch.no_grad():
        block.gate.weight.zero_()  # equal scores; top-k then picks experts 0 and 1 for every token
    block(torch.randn(1, 4, H))
    # f = (.5, .5, 0, 0), P = .25 each: E * sum f P = 4 * .25 = 1.
    assert float(block.last_aux_loss) == pytest.approx(1.0)


def test_aux_loss_scale_multiplies_the_losses_gradient():
    block = _block(aux_loss="micro_batch", aux_loss_coef=1.0, z_loss_coef=0.1)
    x = torch.randn(2, 5, H)
    grads = []
    for scale in (1.0, 0.25, 0.0):
        set_aux_loss_scale(block, scale)
        block.zero_grad()
        block(x).sum().backward()
        grads.append(block.gate.weight.grad.clone())
    # The main loss's part of gate.weight's gradient is g(0); the losses' part scales linearly.
    torch.testing.assert_close(grads[1] - grads[2], 0.25 * (grads[0] - grads[2]))
    assert (grads[0] - grads[2]).abs().max() > 1e-4


def test_losses_are_not_computed_in_eval():
    block = _block(aux_loss="micro_batch", aux_loss_coef=1.0).eval()
    block(torch.randn(1, 3, H))
    assert block.last_aux_loss is None
    assert float(block.tokens_per_expert.sum()) == 0


# -- aux-loss-free bias -----------------------------------------------------------------------

def _skewed(rate: float = 1e-3, **cfg) -> tuple[MoE, torch.Tensor]:
    """A sigmoid router that sends most tokens to the low-numbered experts: feature 0 is a constant
    1 and its router weight falls from expert 0 to expert 7."""
    block = _block(score_func="sigmoid", score_correction_bias=True, bias_update_rate=rate, **cfg)
    with torch.no_grad():
        block.gate.weight[:, 0] = torch.linspace(2.0, -2.0, 8)
        block.gate.e_score_correction_bias.zero_()
    x = torch.randn(4, 64, H, generator=torch.Generator().manual_seed(4))
    x[..., 0] = 1.0
    return block, x


def _load(block: MoE, x: torch.Tensor) -> torch.Tensor:
    reset_moe_stats(block)
    with torch.no_grad():
        block(x)
    return block.tokens_per_expert.clone()


def test_one_bias_update_lowers_the_overloaded_and_raises_the_idle():
    block, x = _skewed(rate=0.01)
    load = _load(block, x)
    update_expert_bias(block)
    bias = block.gate.e_score_correction_bias
    assert bias[load > load.mean()].max() == pytest.approx(-0.01)
    assert bias[load < load.mean()].min() == pytest.approx(0.01)
    torch.testing.assert_close(bias, 0.01 * torch.sign(load.mean() - load))
    assert float(block.tokens_per_expert.sum()) == 0  # the update resets the statistics


def test_repeated_bias_updates_even_out_a_skewed_router():
    block, x = _skewed(rate=0.02)
    before = _load(block, x)
    for _ in range(150):
        _load(block, x)
        update_expert_bias(block)
    after = _load(block, x)
    ratio = lambda load: float(load.max() / load.mean())  # noqa: E731
    assert ratio(before) > 2.5
    assert ratio(after) < 1.3, (before, after)


def test_bias_update_uses_the_load_summed_over_ranks():
    block, x = _skewed(rate=0.01)
    local = _load(block, x)
    other = torch.zeros(8)
    other[7] = 10 * local.sum()  # another rank swamps expert 7
    set_load_reducer(block, lambda t: t + other)
    update_expert_bias(block)
    total = local + other
    torch.testing.assert_close(block.gate.e_score_correction_bias, 0.01 * torch.sign(total.mean() - total))
    assert block.gate.e_score_correction_bias[7] < 0 < block.gate.e_score_correction_bias[0]


def test_blocks_without_a_bias_are_left_alone_but_reset():
    block = _block()
    block(torch.randn(1, 4, H))
    update_expert_bias(block)
    assert not hasattr(block.gate, "e_score_correction_bias") or block.gate.e_score_correction_bias is None
    assert float(block.tokens_per_expert.sum()) == 0


# -- capacity ---------------------------------------------------------------------------------

def _by_hand(block: MoE, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Token by token, copy by copy: the kept copies' weighted expert outputs plus the shared
    experts (a dropped copy adds nothing)."""
    tokens = x.reshape(-1, x.shape[-1])
    route = block.gate(tokens)
    w_gu, w_down = block.experts.gate_up_proj, block.experts.down_proj
    rows = []
    for t in range(tokens.shape[0]):
        row = block.shared_experts(tokens[t]) if block.shared_experts is not None else torch.zeros_like(tokens[t])
        for j in range(route.topk_idx.shape[1]):
            if keep[t, j]:
                e = route.topk_idx[t, j]
                gate, up = (w_gu[e] @ tokens[t]).chunk(2)
                row = row + route.topk_weight[t, j] * (w_down[e] @ (torch.nn.functional.silu(gate) * up))
        rows.append(row)
    return torch.stack(rows).view_as(x)


def _expected_keep(route, capacity: int, policy: str) -> torch.Tensor:
    """For each expert, its copies ranked by weight ("probs") or by token ("position"); the first
    ``capacity`` are kept."""
    keep = torch.zeros_like(route.topk_idx, dtype=torch.bool)
    route = type(route)(*(t.detach() for t in route))
    for e in range(8):
        copies = [(t, j) for t in range(route.topk_idx.shape[0]) for j in range(route.topk_idx.shape[1])
                  if route.topk_idx[t, j] == e]
        if policy == "probs":
            copies.sort(key=lambda c: -float(route.topk_weight[c]))
        for t, j in copies[:capacity]:
            keep[t, j] = True
    return keep


@pytest.mark.parametrize("policy", ["probs", "position"])
def test_capacity_drops_the_right_copies_and_counts_them(policy):
    block, x = _skewed(capacity_factor=1.0, drop_policy=policy, shared_intermediate_size=F_EXPERT)
    x = x[:, :10]  # 40 tokens, 80 copies, capacity 10 per expert
    with torch.no_grad():
        out = block(x)
        route = block.gate(x.reshape(-1, H))
    keep = _expected_keep(route, 10, policy)
    counts = torch.bincount(route.topk_idx.reshape(-1), minlength=8)
    assert int(block.last_dropped_tokens) == int((counts - 10).clamp(min=0).sum()) == int((~keep).sum()) > 0
    torch.testing.assert_close(out, _by_hand(block, x, keep).detach(), atol=1e-5, rtol=1e-5)
    assert moe_metrics(block)["moe/dropped_tokens"] == float((~keep).sum())


def test_a_fully_dropped_token_still_gets_the_shared_experts():
    block, x = _skewed(capacity_factor=0.25, drop_policy="position", shared_intermediate_size=F_EXPERT)
    x = x[:1, :8]  # 8 tokens, 16 copies, capacity 1 per expert: the late tokens lose both copies
    x.requires_grad_()
    out = block(x)
    last = x[0, -1]
    torch.testing.assert_close(out[0, -1], block.shared_experts(last))
    out.sum().backward()  # dropped copies take no gradient, the rest do
    assert torch.isfinite(x.grad).all() and x.grad[0, 0].abs().sum() > 0


def test_a_large_capacity_factor_drops_nothing():
    dropless, x = _skewed()
    capped = _block(score_func="sigmoid", score_correction_bias=True, capacity_factor=8.0)
    capped.load_state_dict(dropless.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(capped(x), dropless(x))
    assert int(capped.last_dropped_tokens) == 0


def test_dropless_matches_the_block_by_hand():
    block, x = _skewed(shared_intermediate_size=F_EXPERT)
    x = x[:, :6]
    with torch.no_grad():
        torch.testing.assert_close(block(x), _by_hand(block, x, torch.ones(24, 2, dtype=torch.bool)),
                                   atol=1e-5, rtol=1e-5)


# -- statistics -------------------------------------------------------------------------------

class _TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.ModuleDict({"mlp": _block(seed=i, aux_loss="micro_batch",
                                                                               z_loss_coef=0.01)})
                                           for i in range(2)])
        self.layers.insert(0, torch.nn.ModuleDict({"mlp": torch.nn.Linear(H, H)}))  # a dense layer 0

    def forward(self, x):
        for layer in self.layers:
            x = x + layer["mlp"](x)
        return x


def test_statistics_and_metrics():
    model = _TwoLayers()
    assert [name for name, _ in moe_blocks(model)] == ["layers.1.mlp", "layers.2.mlp"]
    assert "tokens_per_expert" not in str(list(model.state_dict()))
    x = torch.randn(2, 5, H)
    model(x)
    model(x)
    metrics = moe_metrics(model)
    for _, block in moe_blocks(model):
        assert float(block.tokens_per_expert.sum()) == 2 * 10 * 2  # two calls, 10 tokens, k = 2
    loads = [b.tokens_per_expert for _, b in moe_blocks(model)]
    expected = [float(load.max() / load.mean()) for load in loads]
    assert metrics["moe/layer1/load_max_over_mean"] == pytest.approx(expected[0])
    assert metrics["moe/layer2/load_max_over_mean"] == pytest.approx(expected[1])
    assert metrics["moe/load_max_over_mean"] == pytest.approx(max(expected))
    aux = [float(b.last_aux_loss) for _, b in moe_blocks(model)]
    assert metrics["moe/aux_loss"] == pytest.approx(sum(aux) / 2)
    assert metrics["moe/z_loss"] > 0 and metrics["moe/dropped_tokens"] == 0
    reset_moe_stats(model)
    assert all(float(b.tokens_per_expert.sum()) == 0 and b.last_aux_loss is None for _, b in moe_blocks(model))
    assert "moe/aux_loss" not in moe_metrics(model)


def test_dropless_block_exports_without_data_dependent_branches():
    block = _block(shared_intermediate_size=F_EXPERT).eval()
    x = torch.randn(2, 5, H)
    program = torch.export.export(block, (x,))
    y = torch.randn(2, 5, H)
    torch.testing.assert_close(program.module()(y), block(y), atol=1e-5, rtol=1e-5)


def test_a_bf16_block_routes_in_fp32_and_stays_close_to_fp32():
    block = _block(shared_intermediate_size=F_EXPERT)
    x = torch.randn(2, 5, H, generator=torch.Generator().manual_seed(5))  # no near-tied choices
    ref = block(x)
    low = MoE(block.config).to(torch.bfloat16)
    low.load_state_dict(block.state_dict())
    route = low.gate(x.reshape(-1, H).bfloat16())
    assert route.scores.dtype == route.topk_weight.dtype == torch.float32
    out = low(x.bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)


def test_planned_routing_gives_every_expert_an_even_share_with_real_counts():
    """What ``sampan simulate`` routes by: the experts see even counts (values, even when the block
    runs on fake tensors: tests/test_simulate.py), and the receiving rank's share is stretched by
    the load factor."""
    from sampan.nn.moe_planned import PlannedRouting, active_plan, planned_routing

    block = _block(num_experts=8, top_k=2)
    seen = []
    block.experts.register_forward_pre_hook(lambda m, args: seen.append(args[1]))
    x = torch.randn(2, 7, block.config.hidden_size)
    with planned_routing() as plan:
        assert active_plan() is plan
        block(x)
    assert active_plan() is None
    assert seen[-1].tolist() == [4, 4, 4, 4, 3, 3, 3, 3]  # 28 copies over 8 experts
    block(x)
    assert seen[-1].sum() == 28 and seen[-1].tolist() != [4, 4, 4, 4, 3, 3, 3, 3]  # the router's own again
    # 4 ranks, this rank's 2 experts get 1.5x their share of the 28 copies each source sends.
    received = PlannedRouting(1.5).received(torch.tensor([4, 4, 4, 4, 3, 3, 3, 3]), ep=4)
    assert received.shape == (4, 2) and received.sum(1).tolist() == [10] * 4  # round(1.5 * 28 / 4)
    with pytest.raises(ValueError, match="load_factor must be >= 1"):
        PlannedRouting(0.5)
