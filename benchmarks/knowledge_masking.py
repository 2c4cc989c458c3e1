"""Character masking vs ERNIE knowledge masking (and pinyin / radical / stroke features on vs off).

Three ernie-tiny pretraining runs with equal budget (steps, batch, learning rate, seed, data
order, initial weights for equal configs) on the People's Daily train split of a data build:

* ``char``: BERT's masking, single tokens, all the way;
* ``knowledge``: ERNIE 1.0's staged schedule, char -> phrase (whole jieba words) -> entity
  (whole LAC / lexicon entities), 20% / 30% / 50% of the steps;
* ``knowledge+features``: the same with pinyin, radical and stroke-count embeddings.

Each is scored on held-out People's Daily paragraphs (the fixed 5% split):

(a) whole-entity cloze: every token of one gold PER / LOC entity is ``[MASK]``ed; right only if
    every token is predicted right (``entity_accuracy``; ``entity_token_accuracy`` per character);
(b) ordinary character MLM accuracy: 15% single tokens ``[MASK]``ed, seeded;
(c) with ``--ner-steps N``, downstream: each pretrained model is fine-tuned for N steps on the NER
    task (People's Daily PER / LOC / ORG, the same leak-free splits and settings for every run)
    and scored by span F1 on its test sentences; this is where ERNIE's masking claims its gain.

Also reported: the data build's throughput (from its manifest), what each masking level does to
the held-out rows (share of gold entities masked whole), and what masking costs per batch next
to a training step (it runs in the training process, so it must stay small).

Numbers are whatever they come out as; a tiny model trained for minutes on 2 CPU cores is far
from ERNIE's setting, so read them as a measurement of this pipeline, not of the method.

Run:  python benchmarks/knowledge_masking.py --data outputs/data/news-sanguo --steps 600
      (``sampan data build --corpus news,sanguo --out outputs/data/news-sanguo`` first; the
      script builds news alone into --data when the directory does not exist)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from _common import load_average, machine_info, set_threads, timestamp, write_json_atomic
from sampan.pretraining import PretrainConfig, pretrain
from sampan.pretraining.evaluate import char_mlm_accuracy, entity_cloze_accuracy, gold_entity_spans
from sampan.text.build import DataBuildConfig, build_data, load_manifest
from sampan.text.masking import IGNORE_INDEX, KnowledgeMasker
from sampan.text.shards import SpanShardDataset
from sampan.text.spans import IN_GOLD_ENTITY, SPECIAL
from sampan.text.tokenizer import MASK_ID

RUNS = {
    "char": {"masking": "char", "features": ()},
    "knowledge": {"masking": "knowledge", "features": ()},
    "knowledge+features": {"masking": "knowledge", "features": ("pinyin", "radical", "stroke")},
}


def masking_effect(data: SpanShardDataset, vocab_size: int, rows: int = 512, seed: int = 0) -> dict:
    """Per level: share of masked tokens inside gold entities, and of touched entities masked whole."""
    masker = KnowledgeMasker(vocab_size, MASK_ID)
    n = min(rows, len(data))
    ids = np.stack([data.row(i)[0] for i in range(n)])
    flags = np.stack([data.row(i)[1] for i in range(n)])
    out = {}
    for level in ("char", "phrase", "entity"):
        _, labels = masker.mask(ids, flags, level, np.random.default_rng(seed))
        picked = labels != IGNORE_INDEX
        whole = touched = 0
        for r in range(n):
            for s, e in gold_entity_spans(flags[r]):
                if picked[r, s:e].any():
                    touched += 1
                    whole += bool(picked[r, s:e].all())
        out[level] = {"masked_share": float(picked.sum() / max(((flags & SPECIAL) == 0).sum(), 1)),
                      "masked_in_gold_entities": float((picked & ((flags & IN_GOLD_ENTITY) != 0)).sum()
                                                       / max(picked.sum(), 1)),
                      "gold_entities_touched": touched,
                      "touched_entities_masked_whole": whole / max(touched, 1)}
    return out


def masking_cost_ms(data: SpanShardDataset, vocab_size: int, batch_size: int, repeats: int = 20) -> float:
    """Median milliseconds to mask one training batch at the entity level."""
    masker = KnowledgeMasker(vocab_size, MASK_ID)
    ids = np.stack([data.row(i)[0] for i in range(batch_size)])
    flags = np.stack([data.row(i)[1] for i in range(batch_size)])
    rng = np.random.default_rng(0)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        masker.mask(ids, flags, "entity", rng)
        times.append(time.perf_counter() - t0)
    return 1000 * float(np.median(times))


def downstream_ner(run_dir: Path, args: argparse.Namespace) -> dict:
    """Fine-tune the run's final model on NER (full, every weight trained, seed 0) and score it:
    test span F1 overall and by type, dev F1, from the same splits for every run."""
    from sampan.finetune import FinetuneConfig, finetune

    config = FinetuneConfig(task="ner", model=str(run_dir / "model"), method="full", save="merged",
                            max_train_examples=64 if args.quick else None,
                            max_eval_examples=16 if args.quick else None,
                            training={"max_steps": args.ner_steps, "learning_rate": args.ner_learning_rate,
                                      "per_device_train_batch_size": 32, "seed": 0, "overwrite_output_dir": True,
                                      "output_dir": str(run_dir / "ner")})
    started = time.perf_counter()
    result = finetune(config)
    test = {k: v for k, v in result.metrics.items() if k == "f1" or k.endswith("_f1")}
    return {"steps": args.ner_steps, "learning_rate": args.ner_learning_rate, "test": test,
            "dev_f1": (result.dev_metrics or {}).get("f1"), "seconds": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="outputs/data/news-sanguo", help="a data build holding news")
    parser.add_argument("--build-docs", type=int, default=0,
                        help="when --data does not exist, build news with this many documents per split (0 = all)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated subset of {list(RUNS)}")
    parser.add_argument("--max-entities", type=int, default=3000, help="held-out gold entities in the cloze")
    parser.add_argument("--eval-rows", type=int, default=512, help="held-out rows for char MLM accuracy")
    parser.add_argument("--overrides", default="", help="model config overrides, e.g. num_layers=2,hidden_size=128")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--ner-steps", type=int, default=0,
                        help="fine-tune each pretrained model on NER for this many steps and score test span F1 "
                             "(0 = skip)")
    parser.add_argument("--ner-learning-rate", type=float, default=5e-4)
    parser.add_argument("--work-dir", default="outputs/bench/knowledge_masking")
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run (for tests)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "knowledge_masking.json"))
    args = parser.parse_args(argv)
    set_threads(args.threads)
    if args.quick:
        args.steps, args.max_entities, args.eval_rows = min(args.steps, 6), 50, 16
        args.overrides = args.overrides or "num_layers=1,hidden_size=64,num_heads=2"
    overrides = {}
    for pair in filter(None, args.overrides.split(",")):
        key, _, value = pair.partition("=")
        overrides[key.strip()] = int(value)
    data = Path(args.data)
    if not (data / "manifest.json").is_file():
        build_data(DataBuildConfig(corpora=("news",), out=str(data), max_docs=args.build_docs))
    manifest = load_manifest(data)
    vocab_size = manifest["vocab_size"]
    held_out = SpanShardDataset(data, "test", ["news"])
    train_rows = len(SpanShardDataset(data, "train", ["news"]))
    result = {
        "benchmark": "knowledge_masking", "timestamp": timestamp(), "machine": machine_info(),
        "load_average_start": load_average(), "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
        "data": {"dir": str(data), "vocab_size": vocab_size, "seq_len": manifest["seq_len"],
                 "train_rows_news": train_rows, "held_out_rows_news": len(held_out),
                 "build": manifest["build"], "corpora": manifest["config"]["corpora"]},
        "budget": {"steps": args.steps, "batch_size": args.batch_size, "learning_rate": args.learning_rate,
                   "seed": args.seed, "model": "ernie-tiny", "overrides": overrides},
        "masking_effect_held_out": masking_effect(held_out, vocab_size),
        "runs": {},
    }
    work = Path(args.work_dir)
    for name in filter(None, args.runs.split(",")):
        spec = RUNS[name]
        config = PretrainConfig(
            model={"name": "ernie-tiny", "overrides": overrides}, data=str(data), masking=spec["masking"],
            features=spec["features"], train_corpora=("news",), eval_rows=256,
            training={"output_dir": str(work / name), "max_steps": args.steps,
                      "per_device_train_batch_size": args.batch_size, "learning_rate": args.learning_rate,
                      "warmup_steps": max(1, args.steps // 10), "seed": args.seed, "overwrite_output_dir": True,
                      "logging_steps": max(1, min(50, args.steps // 6))})
        started = time.perf_counter()
        trainer, _ = pretrain(config)
        seconds = time.perf_counter() - started
        cloze = entity_cloze_accuracy(trainer.model, held_out, trainer.batcher, max_entities=args.max_entities)
        chars = char_mlm_accuracy(trainer.model, held_out, trainer.batcher, max_rows=args.eval_rows)
        metrics = [json.loads(line) for line in (work / name / "metrics.jsonl").read_text().splitlines()]
        steps = [m for m in metrics if "loss" in m]
        result["runs"][name] = {
            **cloze, **chars, "train_seconds": round(seconds, 1),
            "final_train_loss": steps[-1]["loss"], "median_step_s": float(np.median([m["step_time_sec"] for m in steps])),
            "eval_loss_char_masking": next((m["eval_loss"] for m in reversed(metrics) if "eval_loss" in m), None),
            "stages": trainer.level_log, "parameters": sum(p.numel() for p in trainer.model.parameters()),
        }
        print(f"{name}: entity cloze {cloze['entity_accuracy']:.2%} ({cloze['entity_token_accuracy']:.2%} of "
              f"characters) over {cloze['entities']} entities; char MLM {chars['char_accuracy']:.2%}")
        if args.ner_steps > 0:
            result["runs"][name]["ner"] = downstream_ner(work / name, args)
            print(f"{name}: NER test span F1 {result['runs'][name]['ner']['test']['f1']:.3f} after "
                  f"{args.ner_steps} fine-tuning steps")
    first = next(iter(result["runs"].values()), None)
    if first is not None:
        result["masking_cost"] = {"entity_level_ms_per_batch": masking_cost_ms(held_out, vocab_size, args.batch_size),
                                  "median_step_ms": 1000 * first["median_step_s"]}
    result["load_average_end"] = load_average()
    write_json_atomic(args.out, result)
    print_table(result)
    print(f"wrote {args.out}")
    return result


def print_table(result: dict) -> None:
    rows = [("run", "entity cloze", "entity chars", "char MLM", "eval loss", "train s", "NER F1")]
    for name, r in result["runs"].items():
        eval_loss = r["eval_loss_char_masking"]
        ner = r.get("ner")
        rows.append((name, f"{r['entity_accuracy']:.2%}", f"{r['entity_token_accuracy']:.2%}",
                     f"{r['char_accuracy']:.2%}", f"{eval_loss:.3f}" if eval_loss is not None else "-",
                     f"{r['train_seconds']:.0f}", f"{ner['test']['f1']:.3f}" if ner else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
