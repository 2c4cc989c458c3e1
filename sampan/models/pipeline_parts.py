"""``PipelineParts``: where a model cuts into pipeline stages (a family's ``pipeline_parts`` gives one)."""

from __future__ import annotations

import dataclasses

from torch import nn

LOSSES = ("causal_lm", "token")
POSITIONS = ("none", "embeddings", "rotary")


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
        positions: how token positions reach the model when a rank holds tokens that are not
            ``0 .. s-1`` (context parallel): "embeddings" (the embeddings take ``position_ids=``:
            learned absolute positions, GPT and ERNIE), "rotary" (``rotary(position_ids, dtype)``
            gives the tables every layer takes as ``position_embeddings=``: Llama / Qwen), or
            "none" (they cannot be told, so context parallel refuses the model).
        rotary: the rotary embedding, for ``positions="rotary"``.
    """

    embeddings: nn.Module
    layers: nn.ModuleList
    norm: nn.Module | None
    lm_head: nn.Module
    loss: str
    block_args: tuple = ()
    positions: str = "none"
    rotary: nn.Module | None = None

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"PipelineParts.loss must be one of {list(LOSSES)}, got {self.loss!r}")
        if self.positions not in POSITIONS:
            raise ValueError(f"PipelineParts.positions must be one of {list(POSITIONS)}, got {self.positions!r}")
        if (self.positions == "rotary") != (self.rotary is not None):
            raise ValueError("PipelineParts: give rotary exactly when positions='rotary'")
        if not isinstance(self.layers, nn.ModuleList) or len(self.layers) == 0:
            raise ValueError("PipelineParts.layers must be a non-empty nn.ModuleList (the blocks to cut into stages)")
