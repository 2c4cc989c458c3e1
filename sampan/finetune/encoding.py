"""Examples -> token ids (+ tags / labels), and the padding collator.

``[CLS] tokens [SEP]``, cut to ``max_length`` tokens. NER examples are sentence windows of at most
``max_length - 2`` characters (data.py), and a character is at most one token, so they are cut only
when normalisation expands a character (NFKC: ``㈠`` -> ``(一)``); a cut tail loses its tags, and
its gold spans stay in the evaluation as misses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from sampan.finetune.data import TaskExample
from sampan.finetune.tags import IGNORE, encode_bio
from sampan.text.features import CharFeatures
from sampan.text.tokenizer import PAD_ID, ChineseTokenizer
from sampan.text.windows import encode_with_offsets


@dataclasses.dataclass
class Encoded:
    """One tokenized example: ids, character offsets per token ((0, 0) for specials), label(s)."""

    input_ids: list[int]
    offsets: list[tuple[int, int]]
    labels: int | list[int] | None = None


def tokenize_for_task(tokenizer: ChineseTokenizer, texts: Sequence[str], max_length: int) -> list[Encoded]:
    """Tokenize ``texts`` as ``[CLS] ... [SEP]`` cut to ``max_length`` tokens, with character offsets
    (``sampan.text.windows.encode_with_offsets``, which the Taskflow encodes its inputs with too)."""
    return [Encoded(ids, offsets) for ids, offsets, _ in encode_with_offsets(tokenizer, texts, max_length)]


def encode_examples(tokenizer: ChineseTokenizer, examples: Sequence[TaskExample], task: str,
                    labels: Sequence[str], max_length: int) -> list[Encoded]:
    """Tokenize examples and attach their label id (sentiment) or BIO tag ids (ner)."""
    encoded = tokenize_for_task(tokenizer, [ex.text for ex in examples], max_length)
    index = {label: i for i, label in enumerate(labels)}
    for ex, enc in zip(examples, encoded, strict=True):
        if task == "sentiment_analysis":
            if ex.label not in index:
                raise ValueError(f"example {ex.id}: label {ex.label!r} is not one of {list(labels)}")
            enc.labels = index[ex.label]
        else:
            enc.labels = encode_bio(enc.offsets, ex.entities, labels)
    return encoded


class EncodedDataset(torch.utils.data.Dataset):
    """Map-style dataset over ``Encoded`` items (what the Trainer's DataLoader reads)."""

    def __init__(self, items: Sequence[Encoded]):
        self.items = list(items)
        self.lengths = [len(it.input_ids) for it in self.items]  # for the Trainer's group_by_length

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Encoded:
        return self.items[i]


class PadCollator:
    """Pads a list of ``Encoded`` to the batch's longest: input_ids, attention_mask, labels
    (-100 on padding for tags), and character-feature ids when the model embeds them."""

    def __init__(self, features: CharFeatures | None = None, feature_names: Sequence[str] = ()):
        self.features, self.feature_names = features, tuple(feature_names)

    def __call__(self, items: Sequence[Encoded]) -> dict[str, torch.Tensor]:
        length = max(len(it.input_ids) for it in items)
        ids = torch.full((len(items), length), PAD_ID, dtype=torch.long)
        mask = torch.zeros((len(items), length), dtype=torch.long)
        for row, it in enumerate(items):
            ids[row, : len(it.input_ids)] = torch.tensor(it.input_ids)
            mask[row, : len(it.input_ids)] = 1
        batch = {"input_ids": ids, "attention_mask": mask}
        if self.feature_names:
            batch.update(self.features.lookup(ids, self.feature_names))
        if items[0].labels is not None:
            if isinstance(items[0].labels, int):
                batch["labels"] = torch.tensor([it.labels for it in items], dtype=torch.long)
            else:
                tags = torch.full((len(items), length), IGNORE, dtype=torch.long)
                for row, it in enumerate(items):
                    tags[row, : len(it.labels)] = torch.tensor(it.labels)
                batch["labels"] = tags
        return batch
