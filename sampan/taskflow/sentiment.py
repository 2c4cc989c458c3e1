"""``sentiment_analysis``: positive / negative with a probability, from a fine-tuned ERNIE classifier,
averaged with a character n-gram model where the model directory ships one.

A model directory whose ``task.json`` has an ``ensemble`` entry (``sampan hub build
ernie-mini-sentiment`` writes it) also holds ``ngram.json`` + ``ngram.safetensors``: a char 1-3-gram
TF-IDF + logistic regression trained on the same reviews (``sampan.text.ngram_classifier``). The
answer's probabilities are then ``(1 - w) * ERNIE + w * n-gram``, with ``w`` (``ngram_weight``) picked
on the dev split when the model was built. The two err on different reviews (the n-gram model also
reads the whole of a long review, where ERNIE reads its first ``max_length`` tokens), so the average
is right more often than either. ``SentimentAnalysis.components`` gives the two apart.
"""

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
    default_model = "ernie-mini-sentiment"
    # ernie-tiny-sentiment is not shipped (the store holds the stronger one); `sampan hub build
    # ernie-tiny-sentiment` makes it, for a smaller, faster model.
    models = ("ernie-mini-sentiment", "ernie-tiny-sentiment")

    def _construct_model(self, model: str) -> None:
        self.loaded = self._load(model)
        labels = self.loaded.task_meta.get("labels")
        if not labels:
            raise ValueError(f"{self.loaded.directory} is not a sentiment model (task.json has no labels)")
        self.labels = [_READABLE.get(label, label) for label in labels]
        self.ngram, self.ngram_weight, self._ngram_columns = None, 0.0, None
        spec = self.loaded.task_meta.get("ensemble")
        if spec:
            self._load_ngram(spec)

    def _load_ngram(self, spec: dict[str, Any]) -> None:
        from sampan.text.ngram_classifier import NgramClassifier

        weight = float(spec["ngram_weight"])
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"{self.loaded.directory}/task.json: ensemble.ngram_weight must be in [0, 1], got "
                             f"{weight}; rebuild it with `sampan hub build {self.model_name}`")
        self.ngram = NgramClassifier.load(self.loaded.directory)
        classes = [_READABLE.get(c, c) for c in self.ngram.classes]
        if sorted(classes) != sorted(self.labels):
            raise ValueError(f"{self.loaded.directory}: the n-gram model's classes {classes} are not the model's "
                             f"labels {self.labels}; rebuild it with `sampan hub build {self.model_name}`")
        self.ngram_weight = weight
        # column j of the answer's probabilities is the n-gram model's P(classes[1]) or 1 - it
        self._ngram_columns = np.array([label == classes[1] for label in self.labels])

    def _preprocess(self, texts: list[str]) -> EncodedBatch:
        return encode_texts(self.loaded.tokenizer, texts, self.max_length)

    def _run_model(self, inputs: EncodedBatch) -> np.ndarray:
        (logits,) = self.loaded.predictor.run({"input_ids": inputs.input_ids, "attention_mask": inputs.attention_mask})
        return logits

    def _ngram_probabilities(self, texts: list[str]) -> np.ndarray:
        second = self.ngram.predict_proba(texts)[:, None]
        return np.where(self._ngram_columns[None, :], second, 1.0 - second)

    def components(self, texts: list[str]) -> dict[str, np.ndarray]:
        """The class probabilities (columns in ``self.labels`` order) of each part apart: ``"ernie"``,
        and ``"ngram"`` where the model ships an n-gram model (what a benchmark or a weight search
        needs; a call on the task averages them with ``self.ngram_weight``)."""
        ernie = []
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start: start + self.batch_size]
            ernie.append(softmax(self._run_model(self._preprocess(batch)).astype(np.float64)))
        out = {"ernie": np.concatenate(ernie) if ernie else np.zeros((0, len(self.labels)))}
        if self.ngram is not None:
            out["ngram"] = self._ngram_probabilities(texts)
        return out

    def _postprocess(self, texts: list[str], inputs: EncodedBatch, outputs: np.ndarray) -> list[dict[str, Any]]:
        probs = softmax(outputs.astype(np.float64))
        if self.ngram is not None:
            probs = (1.0 - self.ngram_weight) * probs + self.ngram_weight * self._ngram_probabilities(texts)
        best = probs.argmax(axis=-1)
        return [{"text": t, "label": self.labels[int(b)], "score": round(float(p[b]), 4)}
                for t, b, p in zip(texts, best, probs, strict=True)]
