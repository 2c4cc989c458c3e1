"""How the Qwen-MoE family splits: tensor- and sequence-parallel plans, pipeline parts, expert parallelism.

Tensor parallel splits attention as the Llama family does (``num_heads / mp`` query heads and
``num_kv_heads / mp`` KV heads per rank), the dense layers' SwiGLU by ``intermediate_size / mp``,
and the vocabulary. The MoE blocks stay whole on every mp rank (router, experts and shared
expert replicated; each rank computes the same output, so their gradients agree without a
reduction): experts are split by expert parallelism instead, over the modules
``expert_parallel_modules`` names.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
)

from sampan.models.block_plans import gather_body_output, vocab_parallel_head
from sampan.models.pipeline_parts import PipelineParts
from sampan.models.qwen_moe.modeling import QwenMoeForCausalLM, QwenMoeModel
from sampan.nn.moe import MoE
from sampan.nn.moe_experts import GroupedExperts
from sampan.nn.vocab_parallel import VocabParallelEmbedding

ATTENTION_PLAN = {
    "*layers.*.self_attn": "shared_input",
    "*layers.*.self_attn.q_proj": "colwise",
    "*layers.*.self_attn.k_proj": "colwise",
    "*layers.*.self_attn.v_proj": "colwise",
    "*layers.*.self_attn.o_proj": "rowwise",
    "*layers.*.self_attn.q_norm": "head_norm",
    "*layers.*.self_attn.k_norm": "head_norm",
}
DENSE_MLP_PLAN = {"": "shared_input", ".gate_proj": "colwise", ".up_proj": "colwise", ".down_proj": "rowwise"}


def _body(model: nn.Module) -> tuple[str, QwenMoeModel]:
    """(prefix of the body's module names, the body)."""
    if isinstance(model, QwenMoeForCausalLM):
        return "model.", model.model
    if isinstance(model, QwenMoeModel):
        return "", model
    raise ValueError(f"not a Qwen-MoE model: {type(model).__name__}")


def tensor_parallel_plan(model: nn.Module) -> dict[str, str]:
    """Attention heads, the dense layers' SwiGLU and the vocabulary split across mp ranks; MoE
    blocks replicated (see the module docstring)."""
    prefix, body = _body(model)
    plan = {"*embed_tokens": "vocab", **ATTENTION_PLAN}
    if not model.config.qk_norm:
        del plan["*layers.*.self_attn.q_norm"], plan["*layers.*.self_attn.k_norm"]
    # Dense layers by index: a pattern over every layer's mlp would reach the MoE blocks too.
    for i, layer in enumerate(body.layers):
        if not isinstance(layer.mlp, MoE):
            plan.update({f"{prefix}layers.{i}.mlp{part}": style for part, style in DENSE_MLP_PLAN.items()})
    if prefix:
        plan["lm_head"] = "vocab"
    return plan


def sequence_parallel_plan(model: nn.Module) -> dict[str, object]:
    """Tensor + sequence parallel (Megatron-SP): norms and the residual stream on ``1/mp`` of the
    tokens, attention and dense MLPs as the Llama family's plan. An MoE block gathers the
    sequence, runs whole on every mp rank (as under plain tensor parallel) and keeps this rank's
    shard of its output; its gradients are then the same on every rank."""
    prefix, body = _body(model)
    plan: dict[str, object] = {f"{prefix}embed_tokens": VocabParallelEmbedding(Shard(1))}
    for i, layer in enumerate(body.layers):
        name = f"{prefix}layers.{i}"
        plan[f"{name}.input_layernorm"] = SequenceParallel(use_local_output=True)
        plan[f"{name}.post_attention_layernorm"] = SequenceParallel(use_local_output=True)
        # self_attn(x, attn_mask, is_causal, kv_cache, layer_idx, position_embeddings): only x is
        # sequence-sharded; it stays a DTensor so q / k / v's input gradients reduce-scatter once.
        plan[f"{name}.self_attn"] = PrepareModuleInput(input_layouts=(Shard(1), *(None,) * 5),
                                                       desired_input_layouts=(Replicate(), *(None,) * 5),
                                                       use_local_output=False)
        for proj in ("q_proj", "k_proj", "v_proj"):
            plan[f"{name}.self_attn.{proj}"] = ColwiseParallel()
        plan[f"{name}.self_attn.o_proj"] = RowwiseParallel(output_layouts=Shard(1))
        if layer.self_attn.q_norm is not None:  # per-head norms: replicated weights, summed gradients
            for norm in ("q_norm", "k_norm"):
                plan[f"{name}.self_attn.{norm}"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        if isinstance(layer.mlp, MoE):
            # Gathered in (all-gather forward, this rank's slice of the full gradient backward),
            # sliced out (the reverse): the block itself sees plain, whole-sequence tensors.
            plan[f"{name}.mlp"] = PrepareModuleInputOutput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_input=True,
                output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),), use_local_output=True)
        else:
            plan[f"{name}.mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                                     use_local_output=False)
            plan[f"{name}.mlp.gate_proj"] = ColwiseParallel()
            plan[f"{name}.mlp.up_proj"] = ColwiseParallel()
            plan[f"{name}.mlp.down_proj"] = RowwiseParallel(output_layouts=Shard(1))
    gather_body_output(plan, prefix.rstrip("."), "norm")
    if prefix:
        plan["lm_head"] = vocab_parallel_head()
    return plan


def pipeline_parts(model: nn.Module) -> PipelineParts | None:
    """Embedding, decoder layers, final norm and LM head (None for the bare body, which has no
    loss); every layer computes its rotary tables unless the pipeline hands them over (context
    parallel), as in the Llama family."""
    if not isinstance(model, QwenMoeForCausalLM):
        return None
    return PipelineParts(model.model.embed_tokens, model.model.layers, model.model.norm, model.lm_head,
                         loss="causal_lm", block_args=(None, True), positions="rotary", rotary=model.model.rotary)


def expert_parallel_modules(model: nn.Module) -> list[str]:
    """The module name of every MoE block's experts (``model.layers.0.mlp.experts`` ...), which
    fleet's expert parallelism shards over the ep group."""
    return [name for name, module in model.named_modules() if isinstance(module, GroupedExperts)]
