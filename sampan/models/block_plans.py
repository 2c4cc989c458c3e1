"""Tensor- and sequence-parallel plans for models built from ``sampan.nn.TransformerBlock`` (GPT, ERNIE).

A tensor-parallel plan maps module-name patterns (``fnmatch``, relative to the model root) to a
style name that ``sampan.distributed`` turns into torch's parallel styles:

* "colwise": shard the output features (q / k / v projections, the first FFN layer).
* "rowwise": shard the input features and all-reduce the output (attention output, second FFN layer).
* "shared_input": the module's first input is made one replicated DTensor before its
  column-parallel children read it (attention's q / k / v), so backward all-reduces their summed
  input gradient once instead of once per projection.
* "vocab": shard the vocabulary. On an embedding: each rank looks up its slice of the table and
  the partial results are summed. On an output layer: logits stay sharded by vocabulary and the
  loss is computed by a parallel cross-entropy, so the full ``[tokens, vocab]`` logits never exist
  on one rank.

Anything not matched (norms, position embeddings, pooler, classifiers) is replicated.

A sequence-parallel plan is a ``parallelize_module`` plan of torch styles (Megatron-SP): between
the tensor-parallel regions activations are split along the sequence instead of replicated.
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

from sampan.nn.embeddings import TransformerEmbeddings
from sampan.nn.transformer import TransformerBlock
from sampan.nn.vocab_parallel import VocabParallelEmbedding

BLOCK_PLAN = {
    "*layers.*.attn": "shared_input",
    "*layers.*.attn.q_proj": "colwise",
    "*layers.*.attn.k_proj": "colwise",
    "*layers.*.attn.v_proj": "colwise",
    "*layers.*.attn.out_proj": "rowwise",
    "*layers.*.mlp.fc1": "colwise",
    "*layers.*.mlp.fc2": "rowwise",
}


def block_sequence_parallel_plan(model: nn.Module) -> dict[str, object]:
    """Sequence-parallel styles for every ``TransformerEmbeddings`` and ``TransformerBlock`` in ``model``.

    The embeddings' output is scattered along the sequence; each block gathers it before its
    column-parallel projections and reduce-scatters after its row-parallel ones, so LayerNorms
    and dropout run on ``1/mp`` of the tokens. The family adds the end of its body (final norm,
    gather) and its head.
    """
    plan: dict[str, object] = {}
    for name, module in model.named_modules():
        if isinstance(module, TransformerEmbeddings):
            plan[f"{name}.word_embeddings"] = VocabParallelEmbedding(Replicate())
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
    return plan


def gather_body_output(plan: dict[str, object], body: str, final_norm: str | None, outputs: int = 1) -> None:
    """Add the end of a body to ``plan``: its final norm (if any) on sequence shards, then its
    output gathered back to the full sequence, so the model's own loss code (which slices or
    selects positions) sees every token. ``outputs`` > 1 when the body returns a tuple whose
    first element is the hidden states."""
    prefix = f"{body}." if body else ""
    if final_norm is not None:
        plan[prefix + final_norm] = SequenceParallel(use_local_output=True)
    if outputs == 1:
        plan[body] = PrepareModuleOutput(output_layouts=Shard(1), desired_output_layouts=Replicate())
    else:
        rest = (None,) * (outputs - 1)
        plan[body] = PrepareModuleOutput(output_layouts=(Shard(1), *rest), desired_output_layouts=(Replicate(), *rest))


def vocab_parallel_head() -> ColwiseParallel:
    """An output layer whose logits stay sharded by vocabulary for the parallel cross-entropy."""
    return ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
