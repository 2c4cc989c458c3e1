"""``word_segmentation``: Chinese words, by jieba (the well-kept dictionary + HMM segmenter).

This is PaddleNLP's "fast" mode too: segmentation quality comes from the 349K-word dictionary
more than from a small neural tagger, and jieba needs no model file. The jieba dictionary loads
once per process (~1 s).
"""

from __future__ import annotations

from typing import Any

from sampan.taskflow.task import Task


class WordSegmentation(Task):
    name = "word_segmentation"
    description = "Chinese word segmentation (jieba dictionary + HMM)"
    default_model = "jieba"
    models = ("jieba",)
    uses_predictor = False  # jieba is a dictionary on the CPU: ``device`` does not apply

    def _construct_model(self, model: str) -> None:
        if model != "jieba":
            raise ValueError(f"word_segmentation runs on models {list(self.models)}, not {model!r}")
        import jieba

        jieba.setLogLevel(60)  # jieba prints its dictionary-loading chatter at INFO
        jieba.initialize()
        self._jieba = jieba

    def _preprocess(self, texts: list[str]) -> list[str]:
        return texts

    def _run_model(self, texts: list[str]) -> list[list[str]]:
        return [list(self._jieba.cut(text, HMM=True)) for text in texts]

    def _postprocess(self, texts: list[str], inputs: Any, outputs: list[list[str]]) -> list[dict[str, Any]]:
        return [{"text": t, "words": [w for w in words if w.strip()]} for t, words in zip(texts, outputs, strict=True)]
