"""Task name -> the ``Task`` class that runs it (and so its default and other models)."""

from __future__ import annotations

from sampan.taskflow.chat import Chat
from sampan.taskflow.document import Document
from sampan.taskflow.fill_mask import FillMask
from sampan.taskflow.generation import PoetryGeneration, TextGeneration
from sampan.taskflow.layout import Layout
from sampan.taskflow.ner import NER
from sampan.taskflow.ocr import OCR
from sampan.taskflow.segmentation import WordSegmentation
from sampan.taskflow.sentiment import SentimentAnalysis
from sampan.taskflow.task import Task

TASKS: dict[str, type[Task]] = {cls.name: cls for cls in (
    SentimentAnalysis, NER, WordSegmentation, TextGeneration, PoetryGeneration, FillMask, Chat, OCR, Layout,
    Document)}


def task_class(name: str) -> type[Task]:
    """The ``Task`` class of ``name``, or a ``ValueError`` listing the tasks there are."""
    if not isinstance(name, str) or name not in TASKS:
        from sampan.utils.names import did_you_mean

        raise ValueError(f"unknown task {name!r}; {did_you_mean(name, TASKS)}tasks: {', '.join(sorted(TASKS))} "
                         "(Taskflow.tasks() describes them)")
    return TASKS[name]
