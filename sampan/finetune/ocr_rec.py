"""task="ocr_rec": fine-tune a CTC line recogniser (``ocr-rec-zh`` or any ``CTCRecognizer`` directory)
on the user's own labelled line images, with the recipe's training loop (``sampan.vision.train_rec``).

Label format (``data``): a JSONL file with one record per line image::

    {"image": "lines/0001.png", "text": "合计：¥12.50"}

``image`` is a path relative to the JSONL file's directory (or absolute) to an image holding one
text line, roughly cropped to it; ``text`` is what it reads. ``data`` may instead be a directory
with ``train.jsonl`` and, optionally, ``dev.jsonl`` and ``test.jsonl``. Without ``dev.jsonl`` a
seeded ``dev_fraction`` of the training lines is held out; without ``test.jsonl`` the dev lines are
also the test lines (the result says so). The model's character set is fixed: a line with a
character outside it is left out, and the run prints how many and which characters.

The output directory holds the fine-tuned recogniser (``config.json``, ``model.safetensors``,
``charset.txt``: ``CTCRecognizer.from_pretrained(output_dir)``), the training step with the best dev
character accuracy; ``training/`` beside it holds the Trainer's run (checkpoints, metrics.jsonl).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path

import numpy as np

from sampan.finetune.config import FinetuneConfig
from sampan.finetune.result import FinetuneResult

SPLIT_FILES = ("train.jsonl", "dev.jsonl", "test.jsonl")


def read_line_labels(path: str | Path) -> list[dict]:
    """The records of one label file, each ``{"image": absolute path, "text": str}``; a bad record is
    an error naming its file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: task='ocr_rec' reads a JSONL file of "
                                '{"image": path, "text": str} records (or a directory with train.jsonl)')
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where} is not JSON ({err.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("image"), str) or \
                not isinstance(record.get("text"), str):
            raise ValueError(f'{where}: each record is {{"image": path, "text": str}}, got {line[:80]!r}')
        if not record["text"]:
            raise ValueError(f"{where}: empty text (a line image with nothing to read cannot train CTC); drop it")
        image = Path(record["image"]) if Path(record["image"]).is_absolute() else path.parent / record["image"]
        if not image.is_file():
            raise FileNotFoundError(f"{where}: image {image} not found (paths are relative to the JSONL's directory)")
        records.append({"image": str(image), "text": record["text"]})
    if not records:
        raise ValueError(f"{path} holds no records")
    return records


def load_splits(data: str | Path, dev_fraction: float, seed: int) -> tuple[dict[str, list[dict]], str]:
    """``({"train", "dev", "test"}: records, note)``: the label files, with dev and test carved out
    or shared as the module docstring says; ``note`` says which."""
    data = Path(data)
    files = {name.split(".")[0]: data / name for name in SPLIT_FILES} if data.is_dir() else {"train": data}
    splits = {split: read_line_labels(path) for split, path in files.items() if split == "train" or path.is_file()}
    notes = []
    if "dev" not in splits:
        train = splits["train"]
        if len(train) < 2:
            raise ValueError(f"{data} has {len(train)} line(s): at least 2 are needed to hold one out for dev "
                             "(or give a dev.jsonl)")
        order = np.random.default_rng(seed).permutation(len(train))
        n_dev = max(1, round(dev_fraction * len(train)))
        splits["dev"] = [train[i] for i in sorted(order[:n_dev])]
        splits["train"] = [train[i] for i in sorted(order[n_dev:])]
        notes.append(f"dev: {n_dev} of the training lines (dev_fraction {dev_fraction}, seed {seed})")
    if "test" not in splits:
        splits["test"] = splits["dev"]
        notes.append("test: the dev lines (no test.jsonl), so the test figures are the selection's own")
    return splits, "; ".join(notes)


def run_ocr_rec(cfg: FinetuneConfig, callbacks=None) -> FinetuneResult:
    """Fine-tune ``cfg.model`` (a recogniser directory or store name) on ``cfg.data``; see the module
    docstring for the label format and what is written."""
    from sampan.store.models import resolve
    from sampan.vision.model_io import CONFIG_NAME, WEIGHTS_NAME
    from sampan.vision.rec_ctc import CHARSET_NAME, CTCRecognizer
    from sampan.vision.train_rec import BEST_DIR, LineDataset, RecTrainer, score_lines

    training = cfg.training
    out = Path(training.output_dir)
    if out.exists() and any(out.iterdir()):
        if not training.overwrite_output_dir:
            raise ValueError(f"output directory {out} is not empty; set training.overwrite_output_dir (--overwrite) "
                             "to replace it, or choose another training.output_dir (--output-dir)")
        shutil.rmtree(out)
    model_dir = Path(cfg.model) if Path(cfg.model).is_dir() else resolve(cfg.model)
    model = CTCRecognizer.from_pretrained(model_dir)
    known = set(model.codec.charset)
    splits, note = load_splits(cfg.data, cfg.dev_fraction, training.seed)
    sets, unknown = {}, set()
    for split, records in splits.items():
        kept = [r for r in records if set(r["text"]) <= known]
        unknown |= {c for r in records for c in r["text"] if c not in known}
        if len(kept) < len(records):
            print(f"ocr_rec: {len(records) - len(kept)} {split} line(s) left out: characters outside the model's "
                  f"charset {sorted(unknown)[:20]}")
        sets[split] = LineDataset(kept, "/", model.config)
        if not len(sets[split]):
            raise ValueError(f"no usable {split} lines in {cfg.data} (outside the charset, or too narrow for their "
                             "text)")
    if note:
        print(f"ocr_rec: {note}")
    initial = score_lines(model, sets["dev"])
    args = dataclasses.replace(training, output_dir=str(out / "training"))
    if args.per_device_train_batch_size > len(sets["train"]):
        args = dataclasses.replace(args, per_device_train_batch_size=len(sets["train"]))
    trainer = RecTrainer(model, args, sets["train"], {"dev": sets["dev"]}, callbacks=callbacks)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    best_dir = out / "training" / BEST_DIR
    best = json.loads((best_dir / "best.json").read_text(encoding="utf-8"))
    for name in (CONFIG_NAME, WEIGHTS_NAME, CHARSET_NAME):  # the model beside its training/ run
        shutil.copyfile(best_dir / name, out / name)
    tuned = CTCRecognizer.from_pretrained(out)
    metrics = score_lines(tuned, sets["test"])
    print(f"ocr_rec: test char accuracy {metrics['char_accuracy']:.4f}, line accuracy {metrics['line_accuracy']:.4f} "
          f"(dev before: {initial['char_accuracy']:.4f}); model -> {out}")
    dev = {"step": best["step"], "char_accuracy": best["dev_char_accuracy"], "line_accuracy": best["dev_line_accuracy"]}
    return FinetuneResult(
        output_dir=out, metrics=metrics, dev_metrics=dev,
        trainable_parameters=sum(p.numel() for p in model.parameters() if p.requires_grad),
        total_parameters=sum(p.numel() for p in model.parameters()), train_seconds=seconds, labels=[],
        data_sizes={split: len(ds) for split, ds in sets.items()}, load_report=f"{model_dir} ({note or 'given splits'})",
        initial_dev_metrics=initial)
