"""What batching does to wasted work: length-grouped fine-tuning batches and packed pretraining rows.

1. Fine-tuning (``TrainingArguments.group_by_length``, on by default in ``sampan finetune``): for
   the built-in sentiment reviews and NER sentence windows, the share of padding positions in
   the batches of one epoch drawn by the Trainer's own ``DataLoader``, random order vs grouped.
   Then the training step (forward + backward + AdamW on ernie-tiny, the shipped
   ``ernie-tiny-zh`` weights when present) is timed on the first batches of each order, in
   interleaved blocks, and reported as *real* (non-padding) tokens per second and their ratio.
   The padding share is exact; the speed ratio is what the run measured on this machine.
2. Pretraining packing (``PretrainConfig.pack``, on by default): rows before / after
   ``sampan.pretraining.packing.PackedRows`` and the share of text positions in each, on the
   train split of a data build (``--data``; without it, a People's Daily slice is built).

Usage::

    python benchmarks/batching.py                  # -> benchmarks/results/batching.json
    python benchmarks/batching.py --data ~/.sampan/build/data-news+sanguo+reviews-v6000-s128-d0
    python benchmarks/batching.py --quick --out /tmp/b.json   # a smoke run of the schema
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from _common import (
    apply_presets,
    load_average,
    machine_info,
    set_threads,
    time_interleaved,
    timestamp,
    write_json_atomic,
)

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "batching.json"
DEFAULTS = {"batch_size": 32, "timed_batches": 8, "repeats": 3, "news_docs": 3000}
QUICK = {"batch_size": 8, "timed_batches": 2, "repeats": 1, "news_docs": 60}


def epoch_batches(encoded, batch_size: int, grouped: bool, seed: int = 0) -> list[list[int]]:
    """The sample indices of each batch of one epoch, as the Trainer's DataLoader draws them."""
    from sampan.io.dataloader import DataLoader

    lengths = [len(e.input_ids) for e in encoded]
    loader = DataLoader(list(range(len(encoded))), batch_size=batch_size, shuffle=True, drop_last=True,
                        collate_fn=list, seed=seed, lengths=lengths if grouped else None)
    return [batch for batch in loader]


def padding_share(encoded, batches: list[list[int]]) -> float:
    """Padding positions / all positions when each batch pads to its longest sample."""
    real = total = 0
    for batch in batches:
        sizes = [len(encoded[i].input_ids) for i in batch]
        real += sum(sizes)
        total += max(sizes) * len(sizes)
    return 1 - real / total


def finetune_batching(task: str, batch_size: int, timed_batches: int, repeats: int,
                      max_examples: int | None) -> dict[str, Any]:
    from sampan.finetune import encode_examples, load_task_data
    from sampan.finetune.base import build_task_model, load_base
    from sampan.finetune.encoding import PadCollator
    from sampan.optimizer import AdamW
    from sampan.store.models import SHIPPED_DIR

    data = load_task_data(task, max_train_examples=max_examples, max_eval_examples=max_examples)
    shipped = SHIPPED_DIR / "ernie-tiny-zh"
    base = load_base(str(shipped) if shipped.is_dir() else "ernie-tiny", [ex.text for ex in data.train], 6000)
    encoded = encode_examples(base.tokenizer, data.train, task, data.labels, 128)
    orders = {name: epoch_batches(encoded, batch_size, name == "grouped") for name in ("random", "grouped")}
    result: dict[str, Any] = {"train_examples": len(encoded), "batch_size": batch_size,
                              "base": "ernie-tiny-zh" if shipped.is_dir() else "ernie-tiny (random init)"}
    for name, batches in orders.items():
        result[name] = {"batches": len(batches), "padding_share": padding_share(encoded, batches)}

    collator = PadCollator(base.features, base.feature_names)
    model, _ = build_task_model(base, task, len(data.labels), 0, 128)
    model.train()
    # A small LR: the timed steps must not move the model far (both orders share it).
    optimizer = AdamW(learning_rate=1e-5, weight_decay=0.01,
                      parameters=[p for p in model.parameters() if p.requires_grad])
    prepared = {name: [collator([encoded[i] for i in batch]) for batch in batches[:timed_batches]]
                for name, batches in orders.items()}
    real_tokens = {name: sum(int(b["attention_mask"].sum()) for b in batch_list)
                   for name, batch_list in prepared.items()}
    cursor = dict.fromkeys(prepared, 0)

    def step(name: str):
        batch = prepared[name][cursor[name] % len(prepared[name])]
        cursor[name] += 1
        model(**batch).backward()  # with labels the model returns the loss
        optimizer.step()
        optimizer.clear_grad()

    timings = time_interleaved({name: (lambda n=name: step(n)) for name in prepared}, steps=timed_batches,
                               repeats=repeats, warmup=1)
    for name, timing in timings.items():
        per_batch_tokens = real_tokens[name] / len(prepared[name])
        result[name] |= {"timed_batches": len(prepared[name]), "real_tokens_per_batch": per_batch_tokens,
                         "median_step_s": timing.median, "real_tokens_per_s": per_batch_tokens / timing.median,
                         "per_block_step_s": timing.per_step}
    result["speedup_real_tokens_per_s"] = result["grouped"]["real_tokens_per_s"] / result["random"]["real_tokens_per_s"]
    return result


def packing(data_dir: Path) -> dict[str, Any]:
    from sampan.pretraining.packing import PackedRows
    from sampan.text.shards import SpanShardDataset

    base = SpanShardDataset(data_dir, "train")
    lengths = np.asarray(base.row_lengths())
    start = time.perf_counter()
    packed = PackedRows(base)
    pack_seconds = time.perf_counter() - start
    positions = base.seq_len
    return {"seq_len": positions,
            "unpacked": {"rows": len(base), "text_share": float(lengths.sum() / (len(base) * positions))},
            "packed": {"rows": len(packed), "text_share": packed.fill},  # PackedRows' own count
            "row_ratio": len(packed) / len(base), "pack_seconds": pack_seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=None, help="fine-tuning batch (full 32, quick 8)")
    parser.add_argument("--timed-batches", type=int, default=None, help="batches timed per block (full 8)")
    parser.add_argument("--repeats", type=int, default=None, help="timed blocks per order (full 3)")
    parser.add_argument("--data", default=None, help="a data build to pack (default: build a news slice)")
    parser.add_argument("--news-docs", type=int, default=None,
                        help="People's Daily documents in the slice built when --data is not given (full 3000)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="small slices, for the test of the JSON schema")
    parser.add_argument("--out", default=None, help=f"results JSON (default: {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    apply_presets(args, QUICK if args.quick else DEFAULTS, DEFAULT_OUT)
    threads = set_threads(args.threads)
    limit = 200 if args.quick else None
    result: dict[str, Any] = {"benchmark": "batching", "timestamp": timestamp(), "machine": machine_info(),
                              "threads": threads, "quick": args.quick, "finetune": {}}
    for task in ("sentiment_analysis", "ner"):
        print(f"batching: {task} fine-tuning batches, random vs grouped by length", flush=True)
        row = finetune_batching(task, args.batch_size, args.timed_batches, args.repeats, limit)
        print(f"  padding {row['random']['padding_share']:.1%} -> {row['grouped']['padding_share']:.1%}; real tokens/s "
              f"{row['random']['real_tokens_per_s']:,.0f} -> {row['grouped']['real_tokens_per_s']:,.0f} "
              f"({row['speedup_real_tokens_per_s']:.2f}x)", flush=True)
        result["finetune"][task] = row
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(args.data) if args.data else None
        if data is None:
            from sampan.text.build import DataBuildConfig, build_data

            data = Path(tmp) / "news"
            build_data(DataBuildConfig(corpora=("news",), out=str(data), max_docs=args.news_docs,
                                       max_test_docs=min(args.news_docs, 100), overwrite=True), log=lambda m: None)
        result["packing"] = packing(data)
        result["packing"]["data"] = args.data or f"People's Daily, first {args.news_docs} documents (built here)"
    pk = result["packing"]
    print(f"batching: packing {pk['unpacked']['rows']:,} rows ({pk['unpacked']['text_share']:.1%} text) -> "
          f"{pk['packed']['rows']:,} rows ({pk['packed']['text_share']:.1%} text)", flush=True)
    result["load_average_after"] = load_average()
    write_json_atomic(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
