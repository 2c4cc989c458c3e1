"""ERNIE: a BERT-style bidirectional encoder with MLM, sequence- and token-classification heads.

Optional pinyin / radical / stroke embeddings (config sizes > 0) add Chinese character features
to the word embedding. No parallelism lives here (see ``sampan.distributed``).
"""

from __future__ import annotations

import torch
from torch import nn

from sampan.models.ernie.config import ErnieConfig
from sampan.models.init import init_transformer_weights
from sampan.models.losses import labelled_count, token_cross_entropy
from sampan.models.pretrained import PretrainedModel
from sampan.nn import Layer, TransformerBlock, TransformerEmbeddings, build_attention_mask
from sampan.nn.mlp import ACTIVATIONS


class ErniePooler(Layer):
    """``tanh(dense(h[:, 0]))``: the [CLS] summary used by sentence-level heads."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


def real_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                pad_token_id: int | None) -> torch.Tensor | None:
    """Which positions hold real tokens: ``attention_mask`` when given, else the positions not
    holding ``pad_token_id`` (as in Paddle's ERNIE); None when every position is real."""
    if attention_mask is not None or pad_token_id is None:
        return attention_mask
    pad = input_ids == pad_token_id
    return ~pad if bool(pad.any()) else None


class ErnieModel(Layer, PretrainedModel):
    """The encoder: returns ``(sequence_output [b, s, h], pooled_output [b, h] | None)``."""

    config_class = ErnieConfig
    head = "none"

    def __init__(self, config: ErnieConfig, add_pooler: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = TransformerEmbeddings(
            config.vocab_size, config.hidden_size, config.max_position_embeddings,
            type_vocab_size=config.type_vocab_size, pinyin_vocab_size=config.pinyin_vocab_size,
            radical_vocab_size=config.radical_vocab_size, stroke_vocab_size=config.stroke_vocab_size,
            layer_norm_eps=config.layer_norm_eps, dropout=config.dropout, padding_idx=config.pad_token_id,
            task_type_vocab_size=config.task_type_vocab_size,
        )
        self.layers = nn.ModuleList(
            TransformerBlock(
                config.hidden_size, config.num_heads, config.intermediate_size,
                dropout=config.dropout, attention_dropout=config.attention_dropout,
                activation=config.activation, layer_norm_eps=config.layer_norm_eps, pre_norm=config.pre_norm,
            )
            for _ in range(config.num_layers)
        )
        # Pre-norm blocks leave the residual stream unnormalised; one LayerNorm closes it.
        self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.pre_norm else None
        self.pooler = ErniePooler(config.hidden_size) if add_pooler else None
        init_transformer_weights(self, config.initializer_range)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        pinyin_ids: torch.Tensor | None = None,
        radical_ids: torch.Tensor | None = None,
        stroke_ids: torch.Tensor | None = None,
        task_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Encode ``input_ids [b, s]``.

        ``attention_mask [b, s]`` is 1 for real tokens and 0 for padding; when omitted, positions
        holding ``config.pad_token_id`` are masked (as in Paddle's ERNIE). ``task_type_ids`` are
        ERNIE 3.0's task types (zeros when omitted).
        """
        attention_mask = real_tokens(input_ids, attention_mask, self.config.pad_token_id)
        features = {name: ids for name, ids in
                    (("pinyin", pinyin_ids), ("radical", radical_ids), ("stroke", stroke_ids)) if ids is not None}
        x = self.embeddings(input_ids, token_type_ids, position_ids, features, task_type_ids)
        mask, _ = build_attention_mask(attention_mask, x.shape[1], x.shape[1], causal=False)
        for layer in self.layers:
            x = layer(x, mask)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, (self.pooler(x) if self.pooler is not None else None)


class ErnieLMHead(Layer):
    """BERT's MLM head: dense + activation + LayerNorm, then the tied vocabulary projection + bias."""

    def __init__(self, config: ErnieConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.activation = config.activation
        self.transform = nn.Linear(config.hidden_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        # The output bias lives inside the decoder Linear (not beside it) so that a column-parallel
        # split of the vocabulary shards weight and bias together.
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=True)
        self.decoder.weight = word_embeddings.weight
        nn.init.zeros_(self.decoder.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = self.norm(ACTIVATIONS[self.activation](self.transform(hidden)))
        return self.decoder(hidden)


class ErnieForMaskedLM(Layer, PretrainedModel):
    """Masked-language-model pretraining: logits over the vocabulary, or the loss on masked slots."""

    config_class = ErnieConfig
    head = "masked_lm"

    def __init__(self, config: ErnieConfig):
        super().__init__()
        self.config = config
        self.ernie = ErnieModel(config, add_pooler=False)
        self.lm_head = ErnieLMHead(config, self.ernie.embeddings.word_embeddings)
        # Only the transform is new; the decoder weight is the (already initialised) embedding.
        init_transformer_weights(self.lm_head.transform, config.initializer_range)

    def tie_weights(self) -> None:
        self.lm_head.decoder.weight = self.ernie.embeddings.word_embeddings.weight

    def forward(self, input_ids: torch.Tensor, token_type_ids=None, attention_mask=None, position_ids=None,
                labels: torch.Tensor | None = None, **features: torch.Tensor | None) -> torch.Tensor:
        """Logits ``[b, s, vocab]``, or with ``labels`` (-100 = not masked) the mean MLM loss.

        With labels, only the masked positions (~15%) go through the vocabulary projection, which
        is most of the head's cost at a 21K vocabulary.
        """
        hidden, _ = self.ernie(input_ids, token_type_ids, attention_mask, position_ids, **features)
        if labels is None:
            return self.lm_head(hidden)
        selected = labels != -100
        return token_cross_entropy(self.lm_head(hidden[selected]), labels[selected])

    loss_token_count = staticmethod(labelled_count)


class ErnieForSequenceClassification(Layer, PretrainedModel):
    """Sentence classification from the pooled [CLS] vector, or the mean over the real tokens
    (``config.classifier_pooling``); regression when ``num_labels == 1``."""

    config_class = ErnieConfig
    head = "sequence_classification"

    def __init__(self, config: ErnieConfig):
        super().__init__()
        self.config = config
        self.ernie = ErnieModel(config, add_pooler=config.classifier_pooling == "cls")
        p = config.dropout if config.classifier_dropout is None else config.classifier_dropout
        self.dropout = nn.Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        init_transformer_weights(self.classifier, config.initializer_range)

    def forward(self, input_ids: torch.Tensor, token_type_ids=None, attention_mask=None, position_ids=None,
                labels: torch.Tensor | None = None, **features: torch.Tensor | None) -> torch.Tensor:
        """Logits ``[b, num_labels]``, or with ``labels [b]`` the cross-entropy (MSE for one label)."""
        hidden, pooled = self.ernie(input_ids, token_type_ids, attention_mask, position_ids, **features)
        if pooled is None:  # classifier_pooling == "mean": the real tokens ([CLS] / [SEP] included)
            keep = real_tokens(input_ids, attention_mask, self.config.pad_token_id)
            if keep is None:
                pooled = hidden.mean(dim=1)
            else:
                keep = keep.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1.0)
        logits = self.classifier(self.dropout(pooled))
        if labels is None:
            return logits
        if self.config.num_labels == 1:
            return nn.functional.mse_loss(logits.squeeze(-1).float(), labels.float())
        return token_cross_entropy(logits, labels)


class ErnieForTokenClassification(Layer, PretrainedModel):
    """Per-token classification (NER, segmentation tags)."""

    config_class = ErnieConfig
    head = "token_classification"

    def __init__(self, config: ErnieConfig):
        super().__init__()
        self.config = config
        self.ernie = ErnieModel(config, add_pooler=False)
        p = config.dropout if config.classifier_dropout is None else config.classifier_dropout
        self.dropout = nn.Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        init_transformer_weights(self.classifier, config.initializer_range)

    def forward(self, input_ids: torch.Tensor, token_type_ids=None, attention_mask=None, position_ids=None,
                labels: torch.Tensor | None = None, **features: torch.Tensor | None) -> torch.Tensor:
        """Logits ``[b, s, num_labels]``, or with ``labels [b, s]`` (-100 ignored) the mean loss."""
        hidden, _ = self.ernie(input_ids, token_type_ids, attention_mask, position_ids, **features)
        logits = self.classifier(self.dropout(hidden))
        return logits if labels is None else token_cross_entropy(logits, labels)

    loss_token_count = staticmethod(labelled_count)
