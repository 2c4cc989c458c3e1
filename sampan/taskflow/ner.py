"""``ner``: PER / LOC / ORG spans with character offsets, from a fine-tuned ERNIE token classifier.

Texts longer than the model's window are cut into windows at sentence punctuation and their
spans shifted back, so every character is tagged (no silent truncation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sampan.taskflow.encoding import EncodedBatch, encode_texts
from sampan.taskflow.task import Task
from sampan.text.windows import sentence_windows


@dataclass
class _Windows:
    """The windows of a batch of texts: ``(text index, start, end)`` and their encodings."""

    pieces: list[tuple[int, int, int]]
    parts: list[str]
    encoded: list[EncodedBatch]


class NER(Task):
    name = "ner"
    description = "person (PER), place (LOC) and organisation (ORG) names with character offsets"
    default_model = "ernie-tiny-ner"
    models = ("ernie-tiny-ner",)

    def _construct_model(self, model: str) -> None:
        self.loaded = self._load(model)
        self.labels = list(self.loaded.task_meta.get("labels") or [])
        if not any(label.startswith("B-") for label in self.labels):
            raise ValueError(f"{self.loaded.directory} is not an NER model (task.json labels {self.labels})")
        from sampan.finetune.tags import TagTransitions

        # The tag-bigram prior the fine-tune picked on dev (absent in models made before it, or
        # with --no-tag-transitions): decoding here must match what the card's figures measured.
        self.transitions = TagTransitions.from_task_meta(self.loaded.task_meta, self.labels)

    def _preprocess(self, texts: list[str]) -> _Windows:
        pieces = [(i, s, e) for i, text in enumerate(texts) for s, e in sentence_windows(text, self.max_length - 2)]
        parts = [texts[i][s:e] for i, s, e in pieces]
        encoded = [encode_texts(self.loaded.tokenizer, parts[k: k + self.batch_size], self.max_length,
                                warn_truncation=False) for k in range(0, len(parts), self.batch_size)]
        return _Windows(pieces, parts, encoded)

    def _run_model(self, inputs: _Windows) -> list[np.ndarray]:
        return [self.loaded.predictor.run({"input_ids": enc.input_ids, "attention_mask": enc.attention_mask})[0]
                for enc in inputs.encoded]

    def _postprocess(self, texts: list[str], inputs: _Windows, outputs: list[np.ndarray]) -> list[dict[str, Any]]:
        from sampan.finetune.tags import decode_entities, tag_path

        entities: list[list[dict[str, Any]]] = [[] for _ in texts]
        k = 0
        for enc, logits in zip(inputs.encoded, outputs, strict=True):
            for row in range(len(enc.lengths)):
                i, s, _ = inputs.pieces[k]
                n = enc.lengths[row]
                offsets = enc.offsets[row][:n]
                for ent in decode_entities(inputs.parts[k], offsets, tag_path(logits[row][:n], offsets, self.labels, self.transitions),
                                           self.labels):
                    entities[i].append({"text": ent["text"], "type": ent["type"],
                                        "start": ent["start"] + s, "end": ent["end"] + s})
                k += 1
        return [{"text": t, "entities": ents} for t, ents in zip(texts, entities, strict=True)]
