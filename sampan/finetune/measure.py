"""Measure full vs LoRA vs Adapter fine-tuning on the builtin data (a script, not a test).

::

    python -m sampan.finetune.measure --model ernie-tiny --steps 200 --runs full:5e-4,lora:2e-3 \
        --out outputs/finetune-measure

For each task and ``method:learning_rate`` it fine-tunes, then prints and writes
``OUT/results.json``: the machine it ran on and the command, then per run the test metrics, dev
metrics, trainable parameters, train seconds and the settings. With a config name the model starts from random weights (a tokenizer is trained on
the task's training split), which is what the figures in docs/finetune.md are: a floor, not
what a pretrained base reaches.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

from sampan.finetune.config import FinetuneConfig
from sampan.finetune.run import finetune


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="ernie-tiny", help="base directory or ERNIE config name")
    parser.add_argument("--tasks", default="sentiment_analysis,ner")
    parser.add_argument("--runs", default="full:5e-4,lora:2e-3", help="method:learning_rate,...")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--eval-steps", type=int, default=100)
    parser.add_argument("--max-eval-examples", type=int, default=2000,
                        help="score at most this many dev and test examples each; 0 = all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="outputs/finetune-measure")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads, 0 = torch's default "
                                                               "(1 is much faster on a machine shared by busy jobs)")
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    record = {"benchmark": "finetune_methods",
              "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(["python -m sampan.finetune.measure", *(argv if argv is not None else sys.argv[1:])]),
              "machine": _machine(), "runs": results}
    for task in args.tasks.split(","):
        for spec in args.runs.split(","):
            method, _, lr = spec.partition(":")
            cfg = FinetuneConfig(task=task, model=args.model, method=method, max_length=args.max_length,
                                 max_eval_examples=args.max_eval_examples or None,
                                 training={"learning_rate": float(lr), "max_steps": args.steps,
                                           "per_device_train_batch_size": args.batch_size,
                                           "eval_steps": args.eval_steps, "seed": args.seed,
                                           "output_dir": str(out / f"{task}-{method}-{lr}"),
                                           "overwrite_output_dir": True, "logging_steps": 25})
            start = time.perf_counter()
            r = finetune(cfg)
            row = {"task": task, "method": method, "learning_rate": float(lr), "steps": args.steps,
                   "batch_size": args.batch_size, "max_length": args.max_length, "model": args.model,
                   "test": r.metrics, "dev": r.dev_metrics, "dev_before": r.initial_dev_metrics,
                   "trainable_parameters": r.trainable_parameters, "total_parameters": r.total_parameters,
                   "train_seconds": r.train_seconds, "wall_seconds": time.perf_counter() - start,
                   "data_sizes": r.data_sizes, "threads": args.threads}
            results.append(row)
            headline = r.metrics.get("accuracy", r.metrics.get("f1"))
            print(f"== {task} {method} lr={lr}: test {'accuracy' if task != 'ner' else 'f1'} {headline:.4f} "
                  f"(dev best {r.dev_metrics}) trainable {r.trainable_parameters:,}/{r.total_parameters:,} "
                  f"train {r.train_seconds:.0f}s", flush=True)
            (out / "results.json").write_text(json.dumps(record, indent=2), encoding="utf-8")
    return 0


def _machine() -> dict:
    """What the figures were measured on (the same fields as benchmarks/_common.machine_info)."""
    import torch

    return {"processor": platform.processor() or platform.machine(), "machine": platform.machine(),
            "cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


if __name__ == "__main__":
    raise SystemExit(main())
