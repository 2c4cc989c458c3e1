"""How ERNIE 4.5 splits: tensor-parallel plan, sequence-parallel plan, pipeline parts and expert parallelism.

Tensor parallel splits attention by heads (whole KV groups per rank), the dense layers' SwiGLU by
width and the vocabulary of the embedding and the head, as the Llama family does. MoE blocks
are left whole on every mp rank: their experts are sharded by expert parallelism instead
(``expert_parallel_modules``), which fleet applies over the data ranks.
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
from sampan.models.ernie4_5.modeling import Ernie4_5ForCausalLM, Ernie4_5Model
from sampan.models.pipeline_parts import PipelineParts
from sampan.nn.vocab_parallel import VocabParallelEmbedding

ATTENTION_PLAN = {
    "*embed_tokens": "vocab",
    "*layers.*.self_attn": "shared_input",
    "*layers.*.self_attn.q_proj": "colwise",
    "*layers.*.self_attn.k_proj": "colwise",
    "*layers.*.self_attn.v_proj": "colwise",
    "*layers.*.self_attn.o_proj": "rowwise",
}
DENSE_MLP_PLAN = {
    "mlp": "shared_input",
    "mlp.gate_proj": "colwise",
    "mlp.up_proj": "colwise",
    "mlp.down_proj": "rowwise",
}


def _body(model: nn.Module) -> str:
    if isinstance(model, Ernie4_5ForCausalLM):
        return "model"
    if isinstance(model, Ernie4_5Model):
        return ""
    raise ValueError(f"not an ERNIE 4.5 model: {type(model).__name__}")


def _prefix(model: nn.Module) -> str:
    body = _body(model)
    return f"{body}." if body else ""


def tensor_parallel_plan(model: nn.Module) -> dict[str, str]:
    """Heads, KV heads, the dense layers' SwiGLU and the vocabulary split across mp ranks; MoE
    blocks replicated (see the module docstring)."""
    moe = set(model.config.moe_layers)
    plan = dict(ATTENTION_PLAN)
    for i in range(model.config.num_layers):  # dense layers one by one: an MoE block's name is also "mlp"
        if i not in moe:
            plan.update({f"*layers.{i}.{name}": style for name, style in DENSE_MLP_PLAN.items()})
    if _body(model):
        plan["lm_head"] = "vocab"
    return plan


def sequence_parallel_plan(model: nn.Module) -> dict[str, object]:
    """Megatron-SP: norms and the residual stream on ``1/mp`` of the tokens, attention and dense
    MLPs as the Llama family's plan. An MoE block gathers the sequence, runs whole on every mp rank
    (as under plain tensor parallel) and keeps this rank's shard of its output, so its router and
    experts get the same gradients on every mp rank and need no sum over mp.
    """
    body = _body(model)
    prefix = f"{body}." if body else ""
    moe = set(model.config.moe_layers)
    plan: dict[str, object] = {f"{prefix}embed_tokens": VocabParallelEmbedding(Shard(1))}
    for i in range(model.config.num_layers):
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
        if i in moe:
            # Gathered in (all-gather forward, this rank's slice of the full gradient backward),
            # sliced out (the reverse): the block sees plain, whole-sequence tensors.
            plan[f"{name}.mlp"] = PrepareModuleInputOutput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_input=True,
                output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),), use_local_output=True)
            continue
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

    Each stage's layers compute their own rotary tables for positions ``0 .. s-1`` unless the
    pipeline hands them other positions' tables (context parallel); the tables are the plain
    RoPE ones, which the attention spreads over interleaved pairs itself.
    """
    if not isinstance(model, Ernie4_5ForCausalLM):
        return None
    return PipelineParts(model.model.embed_tokens, model.model.layers, model.model.norm, model.lm_head,
                         loss="causal_lm", block_args=(None, True), positions="rotary", rotary=model.model.rotary)


def expert_parallel_modules(model: nn.Module) -> list[str]:
    """Module names of every MoE block's experts (``model.layers.1.mlp.experts``, ...), which fleet's
    expert parallelism shards over the ep ranks; empty for the dense model."""
    prefix = _prefix(model)
    return [f"{prefix}layers.{i}.mlp.experts" for i in model.config.moe_layers]
