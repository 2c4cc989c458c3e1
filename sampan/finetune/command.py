"""``sampan finetune``: run a fine-tune from parsed CLI arguments and print the metrics table."""

from __future__ import annotations

import argparse
import json

from sampan.finetune.config import FinetuneConfig
from sampan.finetune.run import FinetuneResult, finetune


def config_from_args(args: argparse.Namespace) -> FinetuneConfig:
    """The ``FinetuneConfig`` the CLI flags describe (``--steps`` wins over ``--epochs``)."""
    return FinetuneConfig(
        task=args.task, model=args.model, data=args.data, method=args.method, output_dir=args.output_dir,
        max_steps=args.steps if args.steps is not None else -1, epochs=args.epochs, batch_size=args.batch_size,
        learning_rate=args.learning_rate, lora_rank=args.lora_rank, lora_alpha=args.lora_alpha,
        adapter_size=args.adapter_size, embedding_lora_rank=args.embedding_lora_rank,
        embedding_lora_alpha=args.embedding_lora_alpha, augment_mentions=args.augment_mentions,
        augment_types=args.augment_types, tag_transitions=not args.no_tag_transitions,
        pooling=args.pooling, dropout=args.dropout, freeze=args.freeze, max_length=args.max_length, max_train_examples=args.max_train_examples,
        max_eval_examples=args.max_eval_examples, eval_steps=args.eval_steps, group_by_length=not args.no_group_by_length, save=args.save, seed=args.seed,
        overwrite=args.overwrite)


def print_result(result: FinetuneResult, task: str) -> None:
    """A rich table of the test and dev metrics, then the output directory and parameter counts."""
    from rich.console import Console
    from rich.table import Table

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
    console.print(f"model: {result.output_dir}  (load with sampan.finetune.load_task_model)")


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    result = finetune(cfg)
    if args.json:
        print(json.dumps({"output_dir": str(result.output_dir), "metrics": result.metrics,
                          "dev_metrics": result.dev_metrics, "trainable_parameters": result.trainable_parameters,
                          "total_parameters": result.total_parameters, "train_seconds": result.train_seconds},
                         indent=2))
    else:
        print_result(result, cfg.task)
    return 0
