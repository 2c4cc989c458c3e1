"""``sentiment_analysis``: positive / negative with a probability, from a fine-tuned ERNIE classifier."""

from __future__ import annotations

from typing import Any

import numpy as np

from sampan.taskflow.encoding import EncodedBatch, encode_texts
from sampan.taskflow.task import Task

# task.json labels (the review corpus's "pos" / "neg") -> the names users read.
_READABLE = {"pos": "positive", "neg": "negative", "positive": "positive", "negative": "negative"}


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


class SentimentAnalysis(Task):
    name = "sentiment_analysis"
    description = "positive / negative sentiment of a text, with its probability"
    default_model = "ernie-tiny-sentiment"
    models = ("ernie-tiny-sentiment",)

    def _construct_model(self, model: str) -> None:
        self.loaded = self._load(model)
        labels = self.loaded.task_meta.get("labels")
        if not labels:
            raise ValueError(f"{self.loaded.directory} is not a sentiment model (task.json has no labels)")
        self.labels = [_READABLE.get(label, label) for label in labels]

    def _preprocess(self, texts: list[str]) -> EncodedBatch:
        return encode_texts(self.loaded.tokenizer, texts, self.max_length)

    def _run_model(self, inputs: EncodedBatch) -> np.ndarray:
        (logits,) = self.loaded.predictor.run({"input_ids": inputs.input_ids, "attention_mask": inputs.attention_mask})
        return logits

    def _postprocess(self, texts: list[str], inputs: EncodedBatch, outputs: np.ndarray) -> list[dict[str, Any]]:
        probs = softmax(outputs.astype(np.float64))
        best = probs.argmax(axis=-1)
        return [{"text": t, "label": self.labels[int(b)], "score": round(float(p[b]), 4)}
                for t, b, p in zip(texts, best, probs, strict=True)]
