"""Sequence parallelism on top of tensor parallelism (Megatron-SP) for sampan's transformer blocks.

Between the tensor-parallel regions the activations are split along the sequence instead of
replicated: LayerNorms and dropout run on ``1/mp`` of the tokens, the row-parallel projections
reduce-scatter (instead of all-reduce) into sequence shards, and the column-parallel inputs
all-gather them back. The blocks' outputs are gathered once at the end of the body, so the
model's own loss code (which slices or selects positions) sees the full sequence.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)

from sampan.models.ernie.modeling import ErnieForMaskedLM, ErnieForTokenClassification, ErnieModel
from sampan.models.gpt.modeling import GPTForCausalLM, GPTModel
from sampan.nn.embeddings import TransformerEmbeddings
from sampan.nn.transformer import TransformerBlock

SUPPORTED = (GPTForCausalLM, GPTModel, ErnieForMaskedLM, ErnieForTokenClassification)


def sequence_parallel_plan(model: nn.Module) -> dict[str, object]:
    """Parallel styles for tensor + sequence parallelism of a sampan GPT / ERNIE (by module type)."""
    if not isinstance(model, SUPPORTED):
        raise ValueError(f"sequence_parallel supports {[c.__name__ for c in SUPPORTED]}, not {type(model).__name__} "
                         "(a pooler reads position 0, which lives on one sequence shard)")
    plan: dict[str, object] = {}
    for name, module in model.named_modules():
        if isinstance(module, TransformerEmbeddings):
            plan[f"{name}.word_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
            plan[name] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1))
        elif isinstance(module, TransformerBlock):
            for proj in ("q_proj", "k_proj", "v_proj"):
                plan[f"{name}.attn.{proj}"] = ColwiseParallel()
            plan[f"{name}.attn.out_proj"] = RowwiseParallel(output_layouts=Shard(1))
            plan[f"{name}.mlp.fc1"] = ColwiseParallel()
            plan[f"{name}.mlp.fc2"] = RowwiseParallel(output_layouts=Shard(1))
            plan[f"{name}.norm1"] = SequenceParallel(use_local_output=True)
            plan[f"{name}.norm2"] = SequenceParallel(use_local_output=True)
            # attn(x, attn_mask, is_causal, kv_cache, layer_idx): only x is a sequence-sharded tensor.
            # The gathered input stays a DTensor (use_local_output=False): the column-parallel
            # layers' partial input gradients are summed and reduce-scattered once at this boundary,
            # as Megatron-SP does, instead of all-reduced by each layer.
            plan[f"{name}.attn"] = PrepareModuleInput(input_layouts=(Shard(1), None, None, None, None),
                                                      desired_input_layouts=(Replicate(), None, None, None, None),
                                                      use_local_output=False)
            plan[f"{name}.mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                                     use_local_output=False)
        elif isinstance(module, GPTModel):
            plan[f"{name}.norm" if name else "norm"] = SequenceParallel(use_local_output=True)
            plan[name] = PrepareModuleOutput(output_layouts=Shard(1), desired_output_layouts=Replicate())
        elif isinstance(module, ErnieModel):
            if module.final_norm is not None:  # pre-norm ERNIE
                plan[f"{name}.final_norm" if name else "final_norm"] = SequenceParallel(use_local_output=True)
            plan[name] = PrepareModuleOutput(output_layouts=(Shard(1), None), desired_output_layouts=(Replicate(), None))
    if isinstance(model, GPTForCausalLM):
        plan["lm_head"] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    elif isinstance(model, ErnieForMaskedLM):
        plan["lm_head.decoder"] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    return plan
