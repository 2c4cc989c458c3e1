"""Task fine-tuning of ERNIE: sentiment analysis and NER, full / LoRA / Adapter, honest data splits.

::

    from sampan.finetune import FinetuneConfig, finetune, load_task_model

    result = finetune(FinetuneConfig(task="sentiment_analysis", model="outputs/pretrain/model",
                                     method="lora", learning_rate=2e-3, output_dir="outputs/sentiment"))
    print(result.metrics)                      # {"accuracy": ..., "loss": ..., "examples": ...}
    model, tokenizer, meta = load_task_model("outputs/sentiment")

See docs/finetune.md for data formats, methods, outputs, metrics and the split rules.
"""

from sampan.finetune.adapter import AdaptedLinear, BottleneckAdapter, apply_adapters
from sampan.finetune.config import DEFAULT_LORA_TARGETS, METHODS, TASKS, FinetuneConfig
from sampan.finetune.data import (
    TaskData,
    TaskExample,
    bio_labels,
    load_task_data,
    read_jsonl,
    sentence_windows,
)
from sampan.finetune.encoding import Encoded, PadCollator, encode_examples, tokenize_for_task
from sampan.finetune.evaluate import evaluate_examples, predict_logits
from sampan.finetune.lora import LoRAEmbedding, LoRALinear, apply_embedding_lora, apply_lora, merge_lora
from sampan.finetune.metrics import accuracy, flat_span_metrics, span_f1
from sampan.finetune.run import FinetuneResult, finetune
from sampan.finetune.tags import TagTransitions, count_transitions, decode_entities, encode_bio, viterbi_bio
from sampan.finetune.task_model import load_task_model, read_task_meta

__all__ = [
    "DEFAULT_LORA_TARGETS",
    "METHODS",
    "TASKS",
    "AdaptedLinear",
    "BottleneckAdapter",
    "Encoded",
    "LoRAEmbedding",
    "LoRALinear",
    "FinetuneConfig",
    "FinetuneResult",
    "PadCollator",
    "TaskData",
    "TaskExample",
    "accuracy",
    "apply_adapters",
    "apply_embedding_lora",
    "apply_lora",
    "bio_labels",
    "decode_entities",
    "encode_bio",
    "encode_examples",
    "evaluate_examples",
    "finetune",
    "flat_span_metrics",
    "load_task_data",
    "load_task_model",
    "merge_lora",
    "predict_logits",
    "read_jsonl",
    "read_task_meta",
    "sentence_windows",
    "span_f1",
    "tokenize_for_task",
    "viterbi_bio",
    "TagTransitions",
    "count_transitions",
]
