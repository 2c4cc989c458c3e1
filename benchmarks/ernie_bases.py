"""The pretrained ERNIE bases side by side on the same held-out documents.

Each base was pretrained on its own data build, with its own tokenizer and its own held-out rows,
so the figures in their model cards do not compare. Here every base reads the **same** held-out
documents (the fixed split of each corpus, which no base trained on: ``load_corpus(name, "test")``),
tokenized with its own tokenizer, and is scored per corpus on:

* masked-token loss and accuracy: BERT masking of 15% of single tokens, all ``[MASK]``, seeded
  per row (the same rows and rates for every base; the positions differ only where the two
  tokenizers cut a text differently, which for Han text they rarely do: both keep one character
  per token);
* whole-entity cloze (People's Daily only, where the gold PER / LOC spans are): every token of one
  gold entity is masked; right only if every token comes back.

ernie-tiny-zh never saw debian-zh text in training (its corpora are news, 三国演义 and reviews),
so its debian-zh column measures transfer to modern technical prose; ernie-mini-zh trained on
debian-zh's train documents.

Run:  python benchmarks/ernie_bases.py                       # the two stored bases, all held-out docs
      python benchmarks/ernie_bases.py --quick --out /tmp/b.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from _common import apply_presets, machine_info, set_threads, timestamp, write_json_atomic
from sampan.pretraining.batches import MLMBatcher
from sampan.pretraining.evaluate import entity_cloze_accuracy
from sampan.text.build import DataBuildConfig, build_data
from sampan.text.masking import IGNORE_INDEX, KnowledgeMasker, MaskingConfig
from sampan.text.shards import SpanShardDataset
from sampan.text.tokenizer import MASK_ID

DEFAULT_OUT = Path(__file__).parent / "results" / "ernie_bases.json"
DEFAULTS = {"test_docs": 0, "rows": 1024, "entities": 2000}
QUICK = {"test_docs": 20, "rows": 32, "entities": 50}


@torch.no_grad()
def masked_token_scores(model, dataset: SpanShardDataset, batcher: MLMBatcher, rows: int,
                        seed: int = 0, batch_size: int = 32) -> dict[str, float]:
    """Cross-entropy and accuracy on 15% single-token ``[MASK]`` positions of the first ``rows`` rows."""
    masker = KnowledgeMasker(batcher.masker.vocab_size, MASK_ID,
                             MaskingConfig(mask_token_prob=1.0, random_token_prob=0.0))
    picked = list(range(min(rows, len(dataset))))
    loss = right = total = 0.0
    model.eval()
    for start in range(0, len(picked), batch_size):
        chunk = picked[start:start + batch_size]
        pairs = [dataset.row(r) for r in chunk]
        original, flags = np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])
        masked, labels = masker.mask(original, flags, "char", np.random.default_rng([seed, chunk[0]]))
        batch = batcher.finish(original, masked, labels)
        gold = batch["labels"][batch["labels"] != IGNORE_INDEX]
        hidden, _ = model.ernie(**{k: v for k, v in batch.items() if k != "labels"})
        logits = model.lm_head(hidden[batch["labels"] != IGNORE_INDEX]).float()
        loss += float(torch.nn.functional.cross_entropy(logits, gold, reduction="sum"))
        right += int((logits.argmax(-1) == gold).sum())
        total += len(gold)
    return {"mlm_loss": loss / max(total, 1), "mlm_accuracy": right / max(total, 1), "masked_tokens": int(total),
            "rows": len(picked)}


def score_base(name: str, corpora: list[str], args: argparse.Namespace, work: Path) -> dict:
    """Build the held-out documents with ``name``'s tokenizer and score it on each corpus."""
    from sampan.models import from_pretrained
    from sampan.store.models import resolve

    path = resolve(name)
    model = from_pretrained(str(path)).float().eval()
    data = work / name.replace("/", "_")
    # max_docs=1: the train split is not read here (one document keeps the build's shape valid).
    build_data(DataBuildConfig(corpora=tuple(corpora), out=str(data), tokenizer=str(path / "tokenizer.json"),
                               max_docs=1, max_test_docs=args.test_docs or 10**9, workers=1, overwrite=True))
    batcher = MLMBatcher(KnowledgeMasker(model.config.vocab_size, MASK_ID))
    out = {"path": str(path), "parameters": sum(p.numel() for p in model.parameters()), "corpora": {}}
    for corpus in corpora:
        held_out = SpanShardDataset(data, "test", [corpus])
        scores = masked_token_scores(model, held_out, batcher, args.rows)
        if corpus == "news":
            scores.update(entity_cloze_accuracy(model, held_out, batcher, max_entities=args.entities))
        out["corpora"][corpus] = scores
        print(f"  {name:15s} {corpus:10s} loss {scores['mlm_loss']:.3f}  acc {scores['mlm_accuracy']:.1%}"
              + (f"  cloze {scores['entity_accuracy']:.1%}" if "entity_accuracy" in scores else ""), file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="ernie-tiny-zh,ernie-mini-zh", help="store names or model directories")
    parser.add_argument("--corpora", default="news,sanguo,debian-zh")
    parser.add_argument("--test-docs", type=int, help="held-out documents per corpus (0 = all)")
    parser.add_argument("--rows", type=int, help="held-out rows scored per corpus")
    parser.add_argument("--entities", type=int, help="gold entities in the cloze")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="a smoke run on a few documents")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    args = apply_presets(args, QUICK if args.quick else DEFAULTS, DEFAULT_OUT)
    threads = set_threads(args.threads)
    corpora = [c for c in args.corpora.split(",") if c]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sampan-bases-") as tmp:
        bases = {name: score_base(name, corpora, args, Path(tmp)) for name in args.models.split(",") if name}
    result = {"benchmark": "ernie_bases", "timestamp": timestamp(), "machine": machine_info(), "threads": threads,
              "settings": {"corpora": corpora, "test_docs": args.test_docs, "rows": args.rows,
                           "entities": args.entities, "quick": bool(args.quick)},
              "bases": bases, "seconds": round(time.perf_counter() - start, 1)}
    print_table(result)
    write_json_atomic(args.out, result)
    return result


def print_table(result: dict) -> None:
    corpora = result["settings"]["corpora"]
    print("| base | params | " + " | ".join(f"{c} loss / acc" for c in corpora) + " | entity cloze |")
    print("|---|---|" + "---|" * len(corpora) + "---|")
    for name, base in result["bases"].items():
        cells = [f"{base['corpora'][c]['mlm_loss']:.3f} / {base['corpora'][c]['mlm_accuracy']:.1%}" for c in corpora]
        cloze = base["corpora"].get("news", {}).get("entity_accuracy")
        print(f"| {name} | {base['parameters'] / 1e6:.1f}M | " + " | ".join(cells)
              + f" | {'' if cloze is None else f'{cloze:.1%}'} |")


if __name__ == "__main__":
    main()
