"""Task name -> the ``Task`` class that runs it (and so its default and other models)."""

from __future__ import annotations

from sampan.taskflow.fill_mask import FillMask
from sampan.taskflow.generation import PoetryGeneration, TextGeneration
from sampan.taskflow.ner import NER
from sampan.taskflow.segmentation import WordSegmentation
from sampan.taskflow.sentiment import SentimentAnalysis
from sampan.taskflow.task import Task

TASKS: dict[str, type[Task]] = {cls.name: cls for cls in (
    SentimentAnalysis, NER, WordSegmentation, TextGeneration, PoetryGeneration, FillMask)}


def task_class(name: str) -> type[Task]:
    """The ``Task`` class of ``name``, or a ``ValueError`` listing the tasks there are."""
    if not isinstance(name, str) or name not in TASKS:
        import difflib

        close = difflib.get_close_matches(name, TASKS, n=1) if isinstance(name, str) else []
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(f"unknown task {name!r}; {hint}tasks: {', '.join(sorted(TASKS))} "
                         "(Taskflow.tasks() describes them)")
    return TASKS[name]
