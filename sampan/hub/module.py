"""``hub.Module(name=...)``: a named, ready-to-use capability, PaddleHub style.

A module is a task on a store model with the method names PaddleHub users know
(``ernie_gen.generate``, ``senta.sentiment_classify``, ``lac.ner``...). Everything runs through
``Taskflow``, so through the inference predictor on the exported graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModuleSpec:
    """A hub module: its task, default store model and one line on what it does."""

    name: str
    task: str
    model: str | None
    summary: str


MODULES: dict[str, ModuleSpec] = {spec.name: spec for spec in (
    ModuleSpec("ernie_gen", "text_generation", "gpt-zh",
               "Chinese text continuation (GPT trained on People's Daily 1998, 三国演义 and Tang poems); .generate(text=...)"),
    ModuleSpec("ernie_tiny", "fill_mask", "ernie-tiny-zh",
               "ernie-tiny pretrained with knowledge masking; .fill_mask(text=...)"),
    ModuleSpec("senta_ernie_mini", "sentiment_analysis", "ernie-mini-sentiment",
               "review sentiment (positive / negative); .sentiment_classify(texts=[...])"),
    ModuleSpec("ner_ernie_tiny", "ner", "ernie-tiny-ner",
               "PER / LOC / ORG entities with offsets; .ner(texts=[...])"),
    ModuleSpec("jieba", "word_segmentation", "jieba", "word segmentation; .cut(text=...)"),
    ModuleSpec("poetry_gen", "poetry_generation", "gpt-zh", "regulated verse in 5 or 7 characters; .generate(text=...)"),
    ModuleSpec("chinese_ocr_db_crnn", "ocr", None,
               "Chinese OCR: DB text detection + CTC recognition (ocr-det-zh + ocr-rec-zh); .recognize_text(images=[...])"),
    ModuleSpec("chat-zh-tiny", "chat", "chat-zh-tiny",
               "a small Chinese chat model (poems, entities, sentiment, segmentation, 三国演义); .chat(messages)"),
)}


class Module:
    """``Module(name="ernie_gen")``; ``hub.list()`` shows the names. Options go to the task
    (``Module(name="ernie_gen", max_new_tokens=64, seed=1)``)."""

    def __init__(self, name: str, **options: Any):
        if name not in MODULES:
            from sampan.utils.names import did_you_mean

            raise ValueError(f"unknown hub module {name!r}; {did_you_mean(name, MODULES)}modules: {', '.join(sorted(MODULES))}")
        from sampan.taskflow import Taskflow

        self.spec = MODULES[name]
        self.name = name
        # model= picks another store model or directory for the module's task, as in Taskflow
        self._flow = Taskflow(self.spec.task, model=options.pop("model", self.spec.model), **options)

    def predict(self, texts: str | list[str]) -> list[dict[str, Any]]:
        """The task's raw output dicts, one per text."""
        return self._flow(texts)

    __call__ = predict

    def _one_or_many(self, texts: str | list[str], key: str) -> Any:
        out = [r[key] for r in self._flow(texts)]
        return out[0] if isinstance(texts, str) else out

    def generate(self, text: str | list[str]) -> str | list[str]:
        """A continuation of ``text`` (generation modules); a list in, a list out."""
        if self.spec.task == "text_generation":
            return self._one_or_many(text, "generated")
        if self.spec.task == "poetry_generation":
            return self._one_or_many(text, "poem")
        raise AttributeError(f"hub module {self.name!r} ({self.spec.task}) does not generate; try .predict")

    def sentiment_classify(self, texts: str | list[str]) -> list[dict[str, Any]]:
        return self._require("sentiment_analysis").predict(texts)

    def ner(self, texts: str | list[str]) -> list[dict[str, Any]]:
        return self._require("ner").predict(texts)

    def fill_mask(self, text: str | list[str]) -> list[dict[str, Any]]:
        return self._require("fill_mask").predict(text)

    def recognize_text(self, images: Any) -> list[list[dict[str, Any]]]:
        """PaddleHub's OCR method: per image (a path, bytes, PIL image or numpy array), its lines
        ``[{"text", "score", "box"}]`` in reading order."""
        module = self._require("ocr")
        return module._flow(list(images) if isinstance(images, (list, tuple)) else [images])

    def cut(self, text: str | list[str]) -> list[str] | list[list[str]]:
        return self._require("word_segmentation")._one_or_many(text, "words")

    def chat(self, messages: Any, **generation: Any) -> str | list[str]:
        """The reply text to ``messages``: OpenAI-style ``[{"role": "system" | "user" | "assistant",
        "content": ...}]`` or a plain string (one user message); a list of conversations gives a list
        of replies. ``generation`` sets ``max_tokens``, ``temperature`` (0 = greedy), ``top_p``,
        ``top_k``, ``seed``, ``repetition_penalty`` and ``stop`` for this call."""
        from sampan.taskflow.chat import conversations

        task = self._require("chat")._flow.task
        _, single = conversations(messages)
        replies = [r["reply"] for r in task.reply(messages, **generation)]
        return replies[0] if single else replies

    def _require(self, task: str) -> Module:
        if self.spec.task != task:
            raise AttributeError(f"hub module {self.name!r} runs {self.spec.task}, not {task}")
        return self

    def __repr__(self) -> str:
        return f"hub.Module(name={self.name!r}, task={self.spec.task!r}, model={self.spec.model!r})"
