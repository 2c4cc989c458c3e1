"""``sampan hub evaluate NAME``: score a stored task model on its held-out test split again.

A card's figures are measured when the recipe builds the model. When the scoring itself improves
(NER's BIO-constrained decoding, say) the weights need not be trained again to see what the
change is worth: this re-runs the recipe's test evaluation on the stored weights and, with
``write=True``, puts the new figures in ``card.json`` and ``task.json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sampan.store.model_dir import TASK_FILE, ModelDir
from sampan.store.models import CARD_NAME, resolve

TASKS = ("sentiment_analysis", "ner")


def evaluate_model(name: str, max_examples: int = 0) -> dict[str, Any]:
    """Test-split metrics of store model ``name`` (a name or a directory), as the recipe computes them.

    ``max_examples`` > 0 scores only that many test examples (a quick look; never written to a card).
    """
    from sampan.finetune import load_task_data, load_task_model
    from sampan.finetune.encoding import PadCollator, encode_examples
    from sampan.finetune.evaluate import evaluate_examples
    from sampan.finetune.tags import TagTransitions
    from sampan.finetune.task_model import FEATURES_FILE
    from sampan.text.features import CharFeatures

    directory = resolve(name)
    task = json.loads((directory / CARD_NAME).read_text(encoding="utf-8")).get("task")
    if task not in TASKS:
        raise ValueError(f"{directory} is a {task!r} model; hub evaluate scores {list(TASKS)} models")
    model, tokenizer, meta = load_task_model(directory)
    if meta.get("data", "builtin") != "builtin":
        raise ValueError(f"{directory} was fine-tuned on {meta['data']!r}, not the built-in data; "
                         "score it with `sampan finetune` on that data instead")
    data = load_task_data(meta["task"], "builtin", meta["max_length"], seed=meta.get("seed", 0),
                          max_eval_examples=max_examples or None)
    if list(data.labels) != list(meta["labels"]):
        raise ValueError(f"{directory}: its labels {meta['labels']} differ from the data's {data.labels}")
    features = CharFeatures.load(directory / FEATURES_FILE) if meta.get("features") else None
    collator = PadCollator(features, meta.get("features") or ())
    encoded = encode_examples(tokenizer, data.test, meta["task"], data.labels, meta["max_length"])
    transitions = TagTransitions.from_task_meta(meta, data.labels)
    return evaluate_examples(model, meta["task"], data.test, encoded, data.labels, collator, transitions=transitions)


def write_metrics(name: str, metrics: dict[str, Any]) -> Path:
    """Put test ``metrics`` (from ``evaluate_model`` on the whole split) into the model's card and task.json."""
    from sampan.finetune.task_model import write_json

    directory = resolve(name)
    if not os.access(directory, os.W_OK):
        raise PermissionError(f"{directory} is read-only: copy the model under $SAMPAN_HOME/models to rescore it")
    card = json.loads((directory / CARD_NAME).read_text(encoding="utf-8"))
    task_path = directory / TASK_FILE
    task = ModelDir(directory).task_meta
    if task is None:
        raise FileNotFoundError(f"{task_path} not found: {directory} is not a fine-tuned model")
    # A sentiment ensemble's card heads with the ensemble's test figures; these are its ERNIE's.
    prefix = "ernie_test_" if task.get("ensemble") else "test_"
    flat = {f"{prefix}{k}": (round(v, 6) if isinstance(v, float) else v) for k, v in metrics.items()
            if isinstance(v, (int, float))}
    card["metrics"] = {**{k: v for k, v in card["metrics"].items() if not k.startswith(prefix)}, **flat}
    task["metrics"] = metrics
    write_json(task_path, task)  # as the fine-tune wrote it (sorted keys)
    write_json(directory / CARD_NAME, card, sort_keys=False)  # as the recipe wrote it
    return directory
