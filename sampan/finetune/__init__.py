"""Fine-tuning: ERNIE sentiment analysis and NER (full / LoRA / Adapter, honest data splits), chat
SFT and DPO on causal LMs (task="chat" / "dpo"), and LoRA on any sampan model with peft-format
adapters (``apply_lora``, ``save_peft_adapter``).

::

    from sampan.finetune import FinetuneConfig, finetune, load_task_model

    result = finetune(FinetuneConfig(task="sentiment_analysis", model="outputs/pretrain/model", method="lora",
                                     training={"learning_rate": 2e-3, "output_dir": "outputs/sentiment"}))
    print(result.metrics)                      # {"accuracy": ..., "loss": ..., "examples": ...}
    model, tokenizer, meta = load_task_model("outputs/sentiment")

See docs/finetune.md for data formats, methods, outputs, metrics and the split rules.
"""

# The names load on first use: Taskflow's NER decoding needs only the numpy tag code in
# ``sampan.finetune.tags``, and importing the package must not import torch for it (~1 s).
import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from sampan.finetune.adapter import AdaptedLinear, BottleneckAdapter, apply_adapters
    from sampan.finetune.causal_lm import (
        CausalLM,
        apply_causal_method,
        load_causal_lm,
        load_chat_model,
        save_causal_lm,
    )
    from sampan.finetune.chat_config import ChatConfig
    from sampan.finetune.chat_data import BadRecords, load_chat_data
    from sampan.finetune.chat_encoding import ChatEncoder, EncodedChat
    from sampan.finetune.chat_sft import run_chat_sft
    from sampan.finetune.config import DEFAULT_LORA_TARGETS, METHODS, TASKS, FinetuneConfig
    from sampan.finetune.data import (
        TaskData,
        TaskExample,
        bio_labels,
        load_task_data,
        read_jsonl,
    )
    from sampan.finetune.encoding import Encoded, PadCollator, encode_examples, tokenize_for_task
    from sampan.finetune.evaluate import evaluate_examples, predict_logits
    from sampan.finetune.lora import LoRAEmbedding, LoRALinear, apply_embedding_lora, apply_lora, merge_lora
    from sampan.finetune.metrics import accuracy, flat_span_metrics, span_f1
    from sampan.finetune.packing import ChatCollator, PackedDataset, PaddedDataset
    from sampan.finetune.peft_format import load_peft_adapter, save_peft_adapter, without_lora
    from sampan.finetune.run import FinetuneResult, finetune
    from sampan.finetune.tags import (
        TagTransitions,
        count_transitions,
        decode_entities,
        encode_bio,
        viterbi_bio,
    )
    from sampan.finetune.task_model import load_task_model, read_task_meta

_SUBMODULES = {
    "adapter": ("AdaptedLinear", "BottleneckAdapter", "apply_adapters"),
    "causal_lm": ("CausalLM", "apply_causal_method", "load_causal_lm", "load_chat_model", "save_causal_lm"),
    "chat_config": ("ChatConfig",),
    "chat_data": ("BadRecords", "load_chat_data"),
    "chat_encoding": ("ChatEncoder", "EncodedChat"),
    "chat_sft": ("run_chat_sft",),
    "packing": ("ChatCollator", "PackedDataset", "PaddedDataset"),
    "config": ("DEFAULT_LORA_TARGETS", "METHODS", "TASKS", "FinetuneConfig"),
    "data": ("TaskData", "TaskExample", "bio_labels", "load_task_data", "read_jsonl"),
    "encoding": ("Encoded", "PadCollator", "encode_examples", "tokenize_for_task"),
    "evaluate": ("evaluate_examples", "predict_logits"),
    "lora": ("LoRAEmbedding", "LoRALinear", "apply_embedding_lora", "apply_lora", "merge_lora"),
    "metrics": ("accuracy", "flat_span_metrics", "span_f1"),
    "peft_format": ("load_peft_adapter", "save_peft_adapter", "without_lora"),
    "run": ("FinetuneResult", "finetune"),
    "tags": ("TagTransitions", "count_transitions", "decode_entities", "encode_bio", "viterbi_bio"),
    "task_model": ("load_task_model", "read_task_meta"),
}
_WHERE = {name: module for module, names in _SUBMODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(f"sampan.finetune.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sampan.finetune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


__all__ = [
    "BadRecords",
    "CausalLM",
    "ChatCollator",
    "ChatConfig",
    "ChatEncoder",
    "EncodedChat",
    "PackedDataset",
    "PaddedDataset",
    "apply_causal_method",
    "load_causal_lm",
    "load_chat_data",
    "load_chat_model",
    "load_peft_adapter",
    "run_chat_sft",
    "save_causal_lm",
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
    "save_peft_adapter",
    "span_f1",
    "tokenize_for_task",
    "viterbi_bio",
    "without_lora",
    "TagTransitions",
    "count_transitions",
]
