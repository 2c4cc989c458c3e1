"""How the Llama family splits: tensor-parallel plan, sequence-parallel plan and pipeline parts.

Tensor parallel gives each mp rank ``num_heads / mp`` query heads and ``num_kv_heads / mp`` KV
heads (whole groups, so grouped-query attention stays local), ``intermediate_size / mp`` of the
SwiGLU, and ``vocab_size / mp`` of the embedding and the head.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

from sampan.models.block_plans import gather_body_output, vocab_parallel_head
from sampan.models.llama.modeling import LlamaForCausalLM, LlamaModel
from sampan.models.pipeline_parts import PipelineParts
from sampan.nn.vocab_parallel import VocabParallelEmbedding

TP_PLAN = {
    "*embed_tokens": "vocab",
    "*layers.*.self_attn": "shared_input",
    "*layers.*.self_attn.q_proj": "colwise",
    "*layers.*.self_attn.k_proj": "colwise",
    "*layers.*.self_attn.v_proj": "colwise",
    "*layers.*.self_attn.o_proj": "rowwise",
    "*layers.*.self_attn.q_norm": "head_norm",
    "*layers.*.self_attn.k_norm": "head_norm",
    "*layers.*.mlp": "shared_input",
    "*layers.*.mlp.gate_proj": "colwise",
    "*layers.*.mlp.up_proj": "colwise",
    "*layers.*.mlp.down_proj": "rowwise",
    "lm_head": "vocab",
}


def _body(model: nn.Module) -> str:
    if isinstance(model, LlamaForCausalLM):
        return "model"
    if isinstance(model, LlamaModel):
        return ""
    raise ValueError(f"not a Llama-family model: {type(model).__name__}")


def tensor_parallel_plan(model: nn.Module) -> dict[str, str]:
    """Heads, KV heads, SwiGLU and vocabulary split across mp ranks (see the module docstring)."""
    plan = dict(TP_PLAN)
    if not _body(model):
        del plan["lm_head"]
    if not model.config.qk_norm:
        del plan["*layers.*.self_attn.q_norm"], plan["*layers.*.self_attn.k_norm"]
    return plan


def sequence_parallel_plan(model: nn.Module) -> dict[str, object]:
    """Tensor + sequence parallel (Megatron-SP) styles: the RMSNorms and residual stream run on
    ``1/mp`` of the tokens; attention and the MLP gather the sequence first and reduce-scatter
    after, as torchtitan's Llama plan does."""
    body = _body(model)
    prefix = f"{body}." if body else ""
    layers = model.model.layers if body else model.layers
    # The embedding's partial lookups are reduce-scattered straight onto sequence shards.
    plan: dict[str, object] = {f"{prefix}embed_tokens": VocabParallelEmbedding(Shard(1))}
    for i in range(len(layers)):
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
        if layers[i].self_attn.q_norm is not None:  # per-head norms: replicated weights, summed gradients
            for norm in ("q_norm", "k_norm"):
                plan[f"{name}.self_attn.{norm}"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        plan[f"{name}.mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                                 use_local_output=False)
        plan[f"{name}.mlp.gate_proj"] = ColwiseParallel()
        plan[f"{name}.mlp.up_proj"] = ColwiseParallel()
        plan[f"{name}.mlp.down_proj"] = RowwiseParallel(output_layouts=Shard(1))
    gather_body_output(plan, body, "norm")
    if body:
        plan["lm_head"] = vocab_parallel_head()
    return plan


def pipeline_parts(model: nn.Module) -> PipelineParts | None:
    """Embedding, decoder layers, final norm and LM head (None for the bare body, which has no loss).

    Each stage's layers compute their own rotary tables for positions ``0 .. s-1``, unless the
    pipeline hands them the tables of other positions (context parallel).
    """
    if not isinstance(model, LlamaForCausalLM):
        return None
    return PipelineParts(model.model.embed_tokens, model.model.layers, model.model.norm, model.lm_head,
                         loss="causal_lm", block_args=(None, True), positions="rotary", rotary=model.model.rotary)
