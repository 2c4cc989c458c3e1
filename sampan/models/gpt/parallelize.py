"""How GPT splits: tensor-parallel plan, sequence-parallel plan and pipeline parts."""

from __future__ import annotations

from torch import nn

from sampan.models.block_plans import (
    BLOCK_PLAN,
    block_sequence_parallel_plan,
    gather_body_output,
    vocab_parallel_head,
)
from sampan.models.gpt.modeling import GPTForCausalLM, GPTModel
from sampan.models.pipeline_parts import PipelineParts

TP_PLAN = {"*embeddings.word_embeddings": "vocab", **BLOCK_PLAN, "lm_head": "vocab"}


def tensor_parallel_plan(model: nn.Module) -> dict[str, str]:
    """Heads and FFN split across mp ranks, the vocabulary split in the embedding and the head."""
    return dict(TP_PLAN)


def sequence_parallel_plan(model: nn.Module) -> dict[str, object]:
    """Tensor + sequence parallel (Megatron-SP) styles for a GPT, bare or with its LM head."""
    plan = block_sequence_parallel_plan(model)
    body = "gpt" if isinstance(model, GPTForCausalLM) else ""
    if not isinstance(model, (GPTForCausalLM, GPTModel)):
        raise ValueError(f"not a GPT model: {type(model).__name__}")
    gather_body_output(plan, body, "norm")
    if body:
        plan["lm_head"] = vocab_parallel_head()
    return plan


def pipeline_parts(model: nn.Module) -> PipelineParts | None:
    """Embeddings, blocks, final norm and LM head (None for the bare body, which has no loss)."""
    if not isinstance(model, GPTForCausalLM):
        return None
    return PipelineParts(model.gpt.embeddings, model.gpt.layers, model.gpt.norm, model.lm_head,
                         loss="causal_lm", block_args=(None, True), positions="embeddings")
