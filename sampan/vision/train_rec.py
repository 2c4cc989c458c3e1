"""``sampan hub build ocr-rec-zh``: the CTC line recogniser trained on the data engine's rendered lines.

The recipe renders a pool of training lines once (``sampan data build-ocr`` settings, cached under
``$SAMPAN_HOME/build/ocr-rec-data-<digest>`` and reused by later runs and resumes) plus two held-out
sets: the build's own test lines that carry degradations ("degraded") and a second build of test
lines with none ("clean"); both use only the held-out fonts and documents. It trains with sampan's
``Trainer`` (AdamW, warmup + cosine, gradient clipping, resumable checkpoints holding model,
optimizer, data position and RNG streams, progress lines with ETA); lines are batched with others of
similar width (``group_by_length``) so little of a batch is padding. Every ``eval_steps`` the
held-out character and exact-line accuracies are logged and the best model so far is kept in
``<run>/best``; the store model is that best model in fp16.

Rerunning the same command resumes the run from its newest checkpoint. ``--set export_only=true``
writes the store model from the best checkpoint so far without training (for a run still going).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from sampan.trainer.arguments import TrainingArguments
from sampan.trainer.trainer import Trainer
from sampan.utils.config import merge, to_dict
from sampan.vision.augment import AugmentConfig
from sampan.vision.build import CHARSET_FILE, MANIFEST, read_records
from sampan.vision.model_io import config_from_dict, config_to_dict
from sampan.vision.rec_ctc import WIDTH_STRIDE, CTCRecognizer, RecognizerConfig
from sampan.vision.rec_metrics import line_accuracy
from sampan.vision.rec_recipe import NAME, OcrRecRecipe

BEST_DIR = "best"
BEST_FILE = "best.json"


# -- data ----------------------------------------------------------------------------------------------
def resized_width(width: int, height: int, config: RecognizerConfig) -> int:
    """The width ``CTCRecognizer.prepare`` gives a ``width`` x ``height`` line (for batching by width)."""
    return min(config.max_width, max(WIDTH_STRIDE, math.ceil(width * config.height / height)))


class LineDataset(torch.utils.data.Dataset):
    """Labelled line images: ``{"image": PIL RGB, "text": str}`` per item.

    ``records`` hold ``image`` (a path, relative to ``image_root`` or absolute) and ``text``, and
    ``width`` / ``height`` when known (else read from the file's header). Lines whose text has more
    characters than the model makes frames from their image cannot be aligned by CTC and are left
    out (counted in ``dropped``). ``lengths`` holds each line's width after resizing, for
    ``group_by_length``.
    """

    def __init__(self, records: Sequence[dict], image_root: str | Path, config: RecognizerConfig):
        self.root = Path(image_root)
        sizes = [(r["width"], r["height"]) if "width" in r and "height" in r else self._size(r) for r in records]
        widths = [resized_width(w, h, config) for w, h in sizes]
        fits = [len(r["text"]) <= w // WIDTH_STRIDE for r, w in zip(records, widths, strict=True)]
        self.records = [r for r, ok in zip(records, fits, strict=True) if ok]
        self.lengths = [w for w, ok in zip(widths, fits, strict=True) if ok]
        self.dropped = len(records) - len(self.records)

    @classmethod
    def from_build(cls, root: str | Path, split: str, config: RecognizerConfig,
                   keep: Callable[[dict], bool] = lambda record: True) -> LineDataset:
        """The lines of ``split`` of a ``sampan data build-ocr`` directory that ``keep`` accepts."""
        return cls([r for r in read_records(root, split, "lines") if keep(r)], Path(root) / split, config)

    def _size(self, record: dict) -> tuple[int, int]:
        with Image.open(self.root / record["image"]) as image:  # the header only: pixels load lazily
            return image.size

    def __len__(self) -> int:
        return len(self.records)

    def image(self, index: int) -> Image.Image:
        with Image.open(self.root / self.records[index]["image"]) as image:
            return image.convert("RGB")

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"image": self.image(index), "text": self.records[index]["text"]}


class LineCollator:
    """Samples to ``{"images", "widths", "texts"}`` through the model's own ``prepare`` (the resizing
    and padding ``recognize`` uses, so training sees what inference sees)."""

    def __init__(self, model: CTCRecognizer):
        self.prepare = model.prepare

    def __call__(self, samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        images, widths = self.prepare([s["image"] for s in samples])
        return {"images": images, "widths": widths, "texts": [s["text"] for s in samples]}


def _digest(data: dict) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:10]


def build_data(settings: OcrRecRecipe, root: Path, log: Callable[[str], None]) -> tuple[Path, Path]:
    """The training build (train pool + degraded test lines) and the clean test build under ``root``,
    each rendered now unless a finished build with the same settings is there."""
    from sampan.vision.build import build_ocr_data

    main = dataclasses.replace(settings.data, workers=1)
    clean = dataclasses.replace(main, train_lines=0, test_lines=settings.clean_test_lines,
                                line_augment=AugmentConfig.none())
    dirs = []
    for what, cfg in (("lines", main), ("clean test lines", clean)):
        key = {k: v for k, v in to_dict(cfg).items() if k not in ("out", "workers")}
        out = root / f"ocr-rec-data-{_digest(key)}"
        if (out / MANIFEST).is_file():
            log(f"hub: reusing OCR {what} {out}")
        else:
            log(f"hub: rendering OCR {what} ({cfg.train_lines:,} train, {cfg.test_lines:,} test) -> {out}")
            build_ocr_data(dataclasses.replace(cfg, out=str(out)), log=log)
        dirs.append(out)
    if (dirs[0] / CHARSET_FILE).read_bytes() != (dirs[1] / CHARSET_FILE).read_bytes():
        raise RuntimeError(f"the two OCR builds {dirs[0]} and {dirs[1]} have different charsets; delete them "
                           "and build again")
    return dirs[0], dirs[1]


def eval_sets(data: Path, clean: Path, config: RecognizerConfig) -> dict[str, LineDataset]:
    """The held-out sets: "clean" (rendered with no degradation) and "degraded" (the test split's
    lines that got at least one)."""
    return {"clean": LineDataset.from_build(clean, "test", config),
            "degraded": LineDataset.from_build(data, "test", config, keep=lambda r: bool(r["augment"]))}


def model_config(settings: OcrRecRecipe, num_classes: int) -> RecognizerConfig:
    """``RecognizerConfig`` with the recipe's ``model`` changes merged over its defaults (a nested
    ``backbone`` mapping too); an unknown field is an error naming it."""
    defaults = config_to_dict(RecognizerConfig(num_classes))
    return config_from_dict(RecognizerConfig, merge(defaults, {**settings.model, "num_classes": num_classes}))


# -- training and scoring ------------------------------------------------------------------------------
@torch.no_grad()
def score_lines(model: CTCRecognizer, dataset: LineDataset, batch_size: int = 64) -> dict[str, float]:
    """Character and exact-line accuracy of ``model`` reading ``dataset`` (leaves it in eval mode)."""
    predictions = []
    for start in range(0, len(dataset), batch_size):
        images = [dataset.image(i) for i in range(start, min(start + batch_size, len(dataset)))]
        predictions += [r.text for r in model.recognize(images)]
    return line_accuracy(predictions, [r["text"] for r in dataset.records])


def score_sets(model: CTCRecognizer, sets: dict[str, LineDataset], batch_size: int) -> dict[str, float]:
    """``{"<set>_char_accuracy", "<set>_line_accuracy", ...}`` over every held-out set."""
    figures = {}
    for name, dataset in sets.items():
        for key, value in score_lines(model, dataset, batch_size).items():
            figures[f"{name}_{key}"] = value
    return figures


class RecTrainer(Trainer):
    """The Trainer with the recogniser's CTC loss, and an evaluation that reads the held-out lines
    and keeps the best model so far (by mean character accuracy over the sets) in ``best_dir``."""

    def __init__(self, model: CTCRecognizer, args: TrainingArguments, train: LineDataset,
                 sets: dict[str, LineDataset], eval_batch_size: int = 64, callbacks=None):
        super().__init__(model, args, train, eval_dataset=sets, data_collator=LineCollator(model),
                         callbacks=callbacks)
        self.sets, self.eval_batch_size = sets, eval_batch_size
        self.best_dir = Path(args.output_dir) / BEST_DIR

    def compute_loss(self, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        logits = model(batch["images"], batch["widths"])
        return model.loss(logits, batch["texts"], batch["widths"])

    def evaluate(self, eval_dataset=None) -> dict[str, float]:
        figures = score_sets(self.model, self.sets, self.eval_batch_size)
        self.model.train()
        score = sum(figures[f"{name}_char_accuracy"] for name in self.sets) / len(self.sets)
        best = read_best(self.best_dir)
        step = self.state.global_step
        if best is None or score > best["score"] or best["step"] > step:  # a restarted run replaces an old best
            from sampan.utils.atomic import atomic_dir

            with atomic_dir(self.best_dir) as tmp:
                self.model.save_pretrained(tmp)
                (tmp / BEST_FILE).write_text(json.dumps({"step": step, "score": score, **figures}, indent=2) + "\n",
                                             encoding="utf-8")
        best = read_best(self.best_dir)
        print(f"eval step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in figures.items() if not k.endswith("_lines"))
              + f" (best: step {best['step']}, mean char accuracy {best['score']:.4f})", flush=True)
        return self._report_eval({"step": step, **{f"eval_{k}": v for k, v in figures.items()},
                                  "eval_mean_char_accuracy": score})


def read_best(best_dir: Path) -> dict[str, Any] | None:
    """The figures the best model so far was saved with, or None when there is none yet."""
    path = Path(best_dir) / BEST_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def build_ocr_rec(settings: OcrRecRecipe, out: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """The recipe: render (or reuse) the data, train (or resume) unless ``export_only``, then write the
    best model in fp16 to ``out`` and score that fp16 model on the held-out sets."""
    from sampan.tensor import seed
    from sampan.utils.paths import home
    from sampan.vision.charset import load_charset

    model_config(settings, 2)  # a wrong model setting fails now, not after the data build
    data, clean = build_data(settings, home() / "build", log)
    charset = load_charset(data / CHARSET_FILE)
    config = model_config(settings, len(charset) + 1)
    run_dir = home() / "build" / NAME
    sets = eval_sets(data, clean, config)
    train = LineDataset.from_build(data, "train", config)
    log(f"hub: {len(train):,} training lines ({train.dropped} too narrow for their text left out), held out "
        + ", ".join(f"{name} {len(ds):,}" for name, ds in sets.items()) + f"; {len(charset):,} characters")
    if not settings.export_only:
        seed(settings.training.seed)
        model = CTCRecognizer(config, charset)
        args = dataclasses.replace(settings.training, output_dir=str(run_dir))
        log(f"hub: training {sum(p.numel() for p in model.parameters()):,} parameters for {args.max_steps:,} "
            f"steps of {args.per_device_train_batch_size} lines -> {run_dir}")
        RecTrainer(model, args, train, sets, settings.eval_batch_size).train()
    best = read_best(run_dir / BEST_DIR)
    if best is None:
        raise FileNotFoundError(f"{run_dir / BEST_DIR} holds no evaluated model yet: let the run reach its first "
                                f"evaluation (every training.eval_steps={settings.training.eval_steps} steps)")
    CTCRecognizer.from_pretrained(run_dir / BEST_DIR).half().save_pretrained(out)
    stored = CTCRecognizer.from_pretrained(out)  # what ships: fp16 weights, read back into fp32
    figures = score_sets(stored, sets, settings.eval_batch_size)
    log("hub: ocr-rec-zh (fp16) held out: " + ", ".join(f"{k} {v:.4f}" for k, v in figures.items()
                                                        if not k.endswith("_lines")))
    return {"parameters": sum(p.numel() for p in stored.parameters()), "step": best["step"],
            "train_lines": len(train), **{f"heldout_{k}": v for k, v in figures.items()}}
