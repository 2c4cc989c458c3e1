"""How ERNIE splits: tensor-parallel plan, sequence-parallel plan and pipeline parts."""

from __future__ import annotations

from torch import nn

from sampan.models.block_plans import (
    BLOCK_PLAN,
    block_sequence_parallel_plan,
    gather_body_output,
    vocab_parallel_head,
)
from sampan.models.ernie.modeling import ErnieForMaskedLM, ErnieForTokenClassification
from sampan.models.pipeline_parts import PipelineParts

TP_PLAN = {"*embeddings.word_embeddings": "vocab", **BLOCK_PLAN, "lm_head.decoder": "vocab"}


def tensor_parallel_plan(model: nn.Module) -> dict[str, str]:
    """Heads and FFN split across mp ranks, the vocabulary split in the embedding and the MLM decoder."""
    plan = dict(TP_PLAN)
    if not isinstance(model, ErnieForMaskedLM):
        del plan["lm_head.decoder"]
    return plan


def sequence_parallel_plan(model: nn.Module) -> dict[str, object]:
    """Tensor + sequence parallel styles for the MLM and token-classification models.

    The sequence classifier and the bare encoder are refused: their pooler reads position 0,
    which lives on one sequence shard.
    """
    if not isinstance(model, (ErnieForMaskedLM, ErnieForTokenClassification)):
        raise ValueError(f"sequence_parallel supports ErnieForMaskedLM and ErnieForTokenClassification, not "
                         f"{type(model).__name__} (a pooler reads position 0, which lives on one sequence shard)")
    plan = block_sequence_parallel_plan(model)
    gather_body_output(plan, "ernie", "final_norm" if model.ernie.final_norm is not None else None, outputs=2)
    if isinstance(model, ErnieForMaskedLM):
        plan["lm_head.decoder"] = vocab_parallel_head()
    return plan


def pipeline_parts(model: nn.Module) -> PipelineParts | None:
    """Embeddings, blocks, final norm (pre-norm only) and MLM head; None for the other heads."""
    if not isinstance(model, ErnieForMaskedLM):
        return None
    return PipelineParts(model.ernie.embeddings, model.ernie.layers, model.ernie.final_norm, model.lm_head,
                         loss="token", block_args=(None, False), positions="embeddings")
