"""``sampan finetune --task detection``: train a :class:`~sampan.vision.detection.model.Detector` on a
COCO file (docs/detection.md), evaluate COCO mAP on the held-out images, save the model directory.

``model`` is a detector directory (``save_pretrained`` output) to continue from, or a JSON file of
:class:`DetectorConfig` fields for a fresh network (``num_classes``/``class_names`` come from the data).
A plain AdamW loop, not sampan's Trainer: the detector's loss needs the per-image box lists.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

import torch

from sampan.finetune.config import FinetuneConfig
from sampan.finetune.result import FinetuneResult
from sampan.vision.detection.box_augment import augment
from sampan.vision.detection.letterbox import letterbox


def _build_model(cfg: FinetuneConfig, class_names: list[str]):
    from sampan.vision.detection.model import Detector, DetectorConfig
    from sampan.vision.model_io import config_from_dict

    path = Path(cfg.model)
    if path.is_dir():
        model = Detector.from_pretrained(path)
        if list(model.config.class_names) != class_names:
            raise ValueError(f"detector {path} has classes {list(model.config.class_names)} but {cfg.data} has "
                             f"{class_names}; start from a config JSON for a fresh head")
        return model.train()
    if path.suffix == ".json" and path.is_file():
        fields = json.loads(path.read_text(encoding="utf-8"))
        fields.update(num_classes=len(class_names), class_names=class_names)
        return Detector(config_from_dict(DetectorConfig, fields))
    raise ValueError(f"model {cfg.model!r} for task='detection' must be a detector directory or a JSON file of "
                     "DetectorConfig fields (see docs/detection.md)")


def run_detection(cfg: FinetuneConfig, callbacks=None) -> FinetuneResult:
    """Train, evaluate mAP on the dev images, save ``config.json`` + ``model.safetensors`` to the output dir."""
    from PIL import Image

    from sampan.vision.detection.coco import evaluate_coco_map, read_coco
    from sampan.vision.detection.loss import detection_loss

    training = cfg.training
    out = Path(training.output_dir)
    if out.exists() and any(out.iterdir()):
        if not training.overwrite_output_dir:
            raise ValueError(f"output directory {out} is not empty; set training.overwrite_output_dir (--overwrite)")
        shutil.rmtree(out)
    data = read_coco(cfg.data)
    torch.manual_seed(training.seed)  # before the model: a fresh head's initial weights are the seed's too
    model = _build_model(cfg, data.class_names)
    size = model.config.input_size
    rng = random.Random(training.seed)
    images = list(data.images)
    rng.shuffle(images)
    n_dev = max(1, round(len(images) * cfg.dev_fraction))
    if len(images) < 2:
        raise ValueError(f"{cfg.data} has {len(images)} image; the detector needs at least 2 (train + dev)")
    dev, train = images[:n_dev], images[n_dev:]
    loaded = {im.id: letterbox(Image.open(im.path), im.boxes, size) for im in images}
    batch = min(training.per_device_train_batch_size, len(train))
    steps = training.max_steps if training.max_steps > 0 else int(training.num_train_epochs * -(-len(train) // batch))
    opt = torch.optim.AdamW(model.parameters(), lr=training.learning_rate, weight_decay=training.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, training.learning_rate, total_steps=max(steps, 1), pct_start=0.1)
    losses, start = [], time.perf_counter()
    model.train()
    for step in range(steps):
        chosen = rng.sample(train, batch)
        pairs = [augment(loaded[im.id][0], loaded[im.id][1], rng) for im in chosen]  # colour jitter; no flip (pages)
        cls, reg = model(torch.stack([p[0] for p in pairs]))
        parts = detection_loss(model, cls, reg, size, size, [p[1] for p in pairs],
                               [torch.tensor(im.labels, dtype=torch.long) for im in chosen])
        opt.zero_grad()
        parts["loss"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        sched.step()
        losses.append(float(parts["loss"].detach()))
        if step % max(1, training.logging_steps) == 0 or step == steps - 1:
            print(f"detection: step {step + 1}/{steps} loss {losses[-1]:.4f}")
    seconds = time.perf_counter() - start
    model.eval()
    detections = []
    for im in dev:
        tensor, _, scale = loaded[im.id]
        cls, reg = model(tensor[None])
        for d in model.decode(cls[0], reg[0], size, size, score_threshold=0.05):
            x0, y0, x1, y1 = (v / scale for v in d["box"])
            detections.append({"image_id": im.id, "category_id": data.category_ids[d["class_id"]],
                               "bbox": [x0, y0, x1 - x0, y1 - y0], "score": d["score"]})
    raw = json.loads(Path(cfg.data).read_text(encoding="utf-8"))
    dev_ids = {im.id for im in dev}
    raw["images"] = [im for im in raw["images"] if im["id"] in dev_ids]
    raw["annotations"] = [a for a in raw["annotations"] if a["image_id"] in dev_ids]
    metrics = evaluate_coco_map(raw, detections)
    metrics["first_loss"], metrics["last_loss"] = losses[0], sum(losses[-5:]) / len(losses[-5:])
    model.save_pretrained(out)
    print(f"detection: dev mAP {metrics['map']:.4f}, mAP@0.5 {metrics['map50']:.4f}; model -> {out}")
    params = sum(p.numel() for p in model.parameters())
    return FinetuneResult(output_dir=out, metrics=metrics, dev_metrics=dict(metrics), trainable_parameters=params,
                          total_parameters=params, train_seconds=seconds, labels=data.class_names,
                          data_sizes={"train": len(train), "dev": len(dev)}, load_report=str(cfg.model),
                          initial_dev_metrics={})
