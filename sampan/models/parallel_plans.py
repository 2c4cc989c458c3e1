"""How sampan's models split for tensor parallelism, declared beside them (not inside them).

A plan maps module-name patterns (``fnmatch``, relative to the model root) to a style name that
``sampan.distributed`` turns into torch's parallel styles:

* "colwise": shard the output features (q/k/v projections, the first FFN layer).
* "rowwise": shard the input features and all-reduce the output (attention output, second FFN layer).
* "shared_input": the module's first input is made one replicated DTensor before its
  column-parallel children read it (attention's q / k / v), so backward all-reduces their summed
  input gradient once instead of once per projection.
* "vocab": shard the vocabulary. On an embedding: each rank looks up its slice of the table and
  the partial results are summed. On an output layer: logits stay sharded by vocabulary and the
  loss is computed by a parallel cross-entropy, so the full ``[tokens, vocab]`` logits never exist
  on one rank.

Anything not matched (norms, position embeddings, pooler, classifiers) is replicated.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from sampan.models.ernie.modeling import ErnieForMaskedLM, ErnieModel
from sampan.models.gpt.modeling import GPTForCausalLM, GPTModel

# The blocks of both families are sampan.nn.TransformerBlock, so they split the same way.
BLOCK_PLAN = {
    "*layers.*.attn": "shared_input",
    "*layers.*.attn.q_proj": "colwise",
    "*layers.*.attn.k_proj": "colwise",
    "*layers.*.attn.v_proj": "colwise",
    "*layers.*.attn.out_proj": "rowwise",
    "*layers.*.mlp.fc1": "colwise",
    "*layers.*.mlp.fc2": "rowwise",
}

GPT_PLAN = {"*embeddings.word_embeddings": "vocab", **BLOCK_PLAN, "lm_head": "vocab"}
ERNIE_PLAN = {"*embeddings.word_embeddings": "vocab", **BLOCK_PLAN, "lm_head.decoder": "vocab"}


def tensor_parallel_plan(model: nn.Module) -> dict[str, str] | None:
    """The plan for a sampan model (bare or with a head), or None for a model sampan doesn't know."""
    for module in model.modules():
        if isinstance(module, GPTModel):
            return dict(GPT_PLAN)
        if isinstance(module, ErnieModel):
            return dict(ERNIE_PLAN)
    return None


LOSSES = ("causal_lm", "token")


@dataclasses.dataclass
class PipelineParts:
    """Where a model cuts into pipeline stages: embeddings on the first, the layer list split in
    order across stages, then the final norm and output head on the last. Pass one to
    ``fleet.distributed_model(model, pipeline_parts=...)`` to pipeline a model of your own.

    Fields:
        embeddings: token ids -> hidden states (first stage).
        layers: the blocks, each ``layer(x, *block_args) -> x``, cut in order across the stages.
        norm: applied after the last block (last stage), or None.
        lm_head: hidden states -> logits (last stage).
        loss: what the last stage computes from the logits and the labels: "causal_lm" (next
            token: logits[:, :-1] against labels[:, 1:]) or "token" (each position); mean
            cross-entropy over labels that are not -100.
        block_args: extra positional arguments after ``x`` for every layer (sampan's blocks take
            ``(attention_mask, is_causal)``).
    """

    embeddings: nn.Module
    layers: nn.ModuleList
    norm: nn.Module | None
    lm_head: nn.Module
    loss: str
    block_args: tuple = ()

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"PipelineParts.loss must be one of {list(LOSSES)}, got {self.loss!r}")
        if not isinstance(self.layers, nn.ModuleList) or len(self.layers) == 0:
            raise ValueError("PipelineParts.layers must be a non-empty nn.ModuleList (the blocks to cut into stages)")


def pipeline_parts(model: nn.Module) -> PipelineParts | None:
    """The pipeline split of a sampan language model, or None for a model sampan doesn't know."""
    if isinstance(model, GPTForCausalLM):
        return PipelineParts(model.gpt.embeddings, model.gpt.layers, model.gpt.norm, model.lm_head,
                             loss="causal_lm", block_args=(None, True))
    if isinstance(model, ErnieForMaskedLM):
        return PipelineParts(model.ernie.embeddings, model.ernie.layers, model.ernie.final_norm, model.lm_head,
                             loss="token", block_args=(None, False))
    return None
