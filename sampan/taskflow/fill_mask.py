"""``fill_mask``: the most likely characters for each ``[MASK]`` in a text, from the pretrained ERNIE."""

from __future__ import annotations

from typing import Any

import numpy as np

from sampan.taskflow.encoding import EncodedBatch, encode_texts
from sampan.taskflow.sentiment import softmax
from sampan.taskflow.task import Task
from sampan.text.tokenizer import MASK_ID

MASK = "[MASK]"


class FillMask(Task):
    """Each text holds one or more ``[MASK]`` markers. ``predictions`` lists the ``top_k`` fillings,
    best first; with several masks, candidate ``r`` fills every mask with its ``r``-th best token
    (each mask predicted independently, as BERT does) and its score is the product."""

    name = "fill_mask"
    description = "fill [MASK] markers with the most likely characters (pretrained ernie-tiny-zh)"
    default_model = "ernie-tiny-zh"
    models = ("ernie-tiny-zh",)
    option_names = ("top_k",)

    def _construct_model(self, model: str) -> None:
        self.loaded = self._load(model)
        self.top_k = int(self.options.get("top_k", 5))
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")

    def _preprocess(self, texts: list[str]) -> EncodedBatch:
        for i, text in enumerate(texts):
            if MASK not in text:
                raise ValueError(f"fill_mask input [{i}] has no {MASK} marker: write e.g. '中国的首都是北[MASK]'")
        return encode_texts(self.loaded.tokenizer, texts, self.max_length)

    def _run_model(self, inputs: EncodedBatch) -> np.ndarray:
        (logits,) = self.loaded.predictor.run({"input_ids": inputs.input_ids, "attention_mask": inputs.attention_mask})
        return logits

    def _postprocess(self, texts: list[str], inputs: EncodedBatch, outputs: np.ndarray) -> list[dict[str, Any]]:
        tok = self.loaded.tokenizer
        results = []
        for row, text in enumerate(texts):
            positions = np.flatnonzero(inputs.input_ids[row] == MASK_ID)
            if positions.size == 0:  # every mask was cut off by truncation
                results.append({"text": text, "predictions": []})
                continue
            probs = softmax(outputs[row, positions].astype(np.float64))
            probs[:, :5] = 0.0  # special tokens are never a filling
            order = np.argsort(-probs, axis=-1)[:, : self.top_k]
            predictions = []
            for r in range(order.shape[1]):
                tokens = [tok.id_to_token(int(order[m, r])) or "" for m in range(len(positions))]
                score = float(np.prod([probs[m, order[m, r]] for m in range(len(positions))]))
                sequence, rest = "", text
                for t in tokens:
                    head, _, rest = rest.partition(MASK)
                    sequence += head + t.removeprefix("##")
                sequence += rest
                predictions.append({"token": "".join(t.removeprefix("##") for t in tokens),
                                    "score": round(score, 4), "sequence": sequence})
            results.append({"text": text, "predictions": predictions})
        return results
