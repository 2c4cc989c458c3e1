"""The ``layout-det-zh`` recipe's code: render the pages (cached), train the detector with sampan's
Trainer (seeded, checkpointed, resumed by a rerun), score COCO mAP on the held-out test pages.

The data set is a COCO train file read by :func:`~sampan.vision.detection.coco.read_coco` (checked, with
named errors), so nothing here is tied to layout but the recipe's settings: item ``i`` is image
``i % n`` letterboxed to the detector's input, colour-jittered by ``random.Random(seed * 1_000_003 + i)``
(so a resumed run draws what an unbroken one would).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sampan.utils.config import to_dict
from sampan.utils.paths import home
from sampan.vision.detection.box_augment import augment
from sampan.vision.detection.letterbox import letterbox
from sampan.vision.detection.loss import detection_loss
from sampan.vision.detection.model import Detector

RECIPE = "layout-det-zh"


# -- data ----------------------------------------------------------------------------------------
def pages_dir(data: Any) -> Path:
    """Where the page set of ``data`` (a ``LayoutDataConfig``) is cached: named by a digest of its settings."""
    settings = {k: v for k, v in to_dict(data).items() if k not in ("out", "workers")}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]
    return home() / "build" / f"layout-pages-{digest}"


def build_pages(data: Any, log: Callable[[str], None]) -> Path:
    """The page set, rendered now unless a finished one is cached (``sampan data build-layout``)."""
    from sampan.vision.layout.build import MANIFEST, build_layout_data

    out = pages_dir(data)
    if (out / MANIFEST).is_file():
        log(f"layout-det: reusing pages {out}")
        return out
    log(f"layout-det: rendering {data.train_pages:,} train + {data.test_pages:,} test pages -> {out}")
    build_layout_data(dataclasses.replace(data, out=str(out)), log=log)
    return out


class CocoImages(torch.utils.data.Dataset):
    """The images of a checked COCO file, letterboxed to ``size`` with their boxes (see the module docstring)."""

    def __init__(self, coco_file: str | Path, size: int, seed: int, colour: float = 0.2):
        from sampan.vision.detection.coco import read_coco

        self.data = read_coco(coco_file)
        if not self.data.images:
            raise ValueError(f"{coco_file} holds no images to train on")
        self.size, self.seed, self.colour = size, seed, colour

    def __len__(self) -> int:
        return len(self.data.images)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        from PIL import Image

        image = self.data.images[index % len(self.data.images)]
        with Image.open(image.path) as f:
            tensor, boxes, _ = letterbox(f, image.boxes, self.size)
        tensor, boxes = augment(tensor, boxes, random.Random(self.seed * 1_000_003 + int(index)), colour=self.colour)
        return {"images": tensor, "gt_boxes": boxes, "gt_labels": torch.tensor(image.labels, dtype=torch.long)}


def collate(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack the images; pad each image's boxes to the batch's most (label -1 marks padding)."""
    most = max(1, max(len(s["gt_labels"]) for s in samples))
    boxes = torch.zeros(len(samples), most, 4)
    labels = torch.full((len(samples), most), -1, dtype=torch.long)
    for i, s in enumerate(samples):
        boxes[i, : len(s["gt_labels"])] = s["gt_boxes"]
        labels[i, : len(s["gt_labels"])] = s["gt_labels"]
    return {"images": torch.stack([s["images"] for s in samples]), "gt_boxes": boxes, "gt_labels": labels}


class DetectionTrainingModel(nn.Module):
    """The detector and its loss as one module for the Trainer: ``forward(images, gt_boxes, gt_labels)``
    (boxes padded, labels -1 for padding) returns ``loss`` and its parts ``qfl``, ``giou``, ``dfl``."""

    def __init__(self, detector: Detector):
        super().__init__()
        self.detector = detector

    def forward(self, images, gt_boxes, gt_labels) -> dict[str, torch.Tensor]:
        cls, reg = self.detector(images)
        keep = [labels >= 0 for labels in gt_labels]
        size = images.shape[-2:]
        return detection_loss(self.detector, cls, reg, size[0], size[1],
                              [b[k] for b, k in zip(gt_boxes, keep, strict=True)],
                              [lab[k] for lab, k in zip(gt_labels, keep, strict=True)])


# -- evaluation ----------------------------------------------------------------------------------
@torch.no_grad()
def evaluate_map(detector: Detector, coco_file: str | Path, score_threshold: float = 0.05) -> dict[str, float]:
    """COCO mAP (``map`` = 0.5:0.95, ``map50``, ``ap/<class>``) of ``detector`` on every image of
    ``coco_file``, through pycocotools, plus ``seconds_per_image`` (eager torch, letterbox to boxes)."""
    from PIL import Image

    from sampan.vision.detection.coco import coco_detection, evaluate_coco_map, read_coco

    data = read_coco(coco_file)
    names = list(detector.config.class_names)
    if names != data.class_names:
        raise ValueError(f"the detector's classes {names} are not {coco_file}'s {data.class_names}")
    detector.eval()
    detections, start = [], time.perf_counter()
    for image in data.images:
        with Image.open(image.path) as f:
            found = detector.predict(f.convert("RGB"), score_threshold=score_threshold)
        detections += [coco_detection(image.id, data.category_ids[d["class_id"]], d["box"], d["score"]) for d in found]
    seconds = (time.perf_counter() - start) / max(1, len(data.images))
    return {**evaluate_coco_map(str(coco_file), detections), "seconds_per_image": seconds,
            "images": float(len(data.images))}


# -- the recipe ----------------------------------------------------------------------------------
def train_layout_detector(recipe: Any, out: Path, work: Path, paused: type[Exception],
                          log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run (or resume) ``recipe``'s (a ``LayoutDetRecipe``) training in ``work``, score the held-out
    test pages, write the model into ``out`` (fp32; the hub stores it in fp16) and return the figures.
    A sitting stopped by ``training.max_minutes`` raises ``paused`` (the hub's ``BuildPaused``, passed
    in because vision sits below the hub; the checkpoint stays; rerun to continue)."""
    from sampan.tensor import seed as seed_all
    from sampan.trainer.trainer import Trainer

    pages = build_pages(recipe.data, log)
    work.mkdir(parents=True, exist_ok=True)
    seed_all(recipe.training.seed)  # the initial weights depend on the seed only
    detector = Detector(recipe.detector_config())
    model = DetectionTrainingModel(detector)
    dataset = CocoImages(pages / "train.json", recipe.input_size, recipe.training.seed, recipe.colour_jitter)
    params = sum(p.numel() for p in detector.parameters())
    log(f"layout-det: {params:,} parameters; {len(dataset):,} train pages at {recipe.input_size} px; run {work} "
        "(a rerun with the same settings continues it)")
    args = dataclasses.replace(recipe.training, output_dir=str(work))
    trainer = Trainer(model, args, dataset, data_collator=collate)
    started = time.perf_counter()
    state = trainer.train()
    if state.global_step < trainer.max_steps:
        raise paused(f"{RECIPE} stopped at step {state.global_step} of {trainer.max_steps} (max_minutes "
                          f"{recipe.training.max_minutes:g}); its checkpoint is in {work}")
    train_seconds = time.perf_counter() - started
    detector = model.detector.float().eval()
    scores = evaluate_map(detector, pages / "test.json", recipe.score_threshold)
    log(f"layout-det: held-out test pages: mAP@0.5 {scores['map50']:.4f}, mAP@0.5:0.95 {scores['map']:.4f}, "
        f"{scores['seconds_per_image'] * 1000:.0f} ms/page (eager)")
    detector.save_pretrained(out)
    return {"parameters": params, "trained_steps": state.global_step, "test_pages": int(scores.pop("images")),
            "test_map50": scores.pop("map50"), "test_map": scores.pop("map"),
            "seconds_per_page": scores.pop("seconds_per_image"), "train_seconds_this_sitting": train_seconds,
            **{f"test_{k}": v for k, v in scores.items()}}
