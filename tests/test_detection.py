"""Detection toolkit core (issue 41 part 1): box ops, losses, TAL assigner, COCO reader, mAP. Costs ~11.5 s in pytest on 2 busy cores (training ~6.5 s, ONNX export ~4 s, the rest <1 s)."""

from __future__ import annotations

import json

import pytest
import torch

from sampan.vision.box_ops import batched_nms, box_iou
from sampan.vision.detection.assigner import task_aligned_assign
from sampan.vision.detection.coco import CocoFormatError, evaluate_coco_map, read_coco
from sampan.vision.detection.losses import distribution_focal_loss, giou_loss, quality_focal_loss


def test_iou_and_class_aware_nms_hand_computed():
    a = torch.tensor([[0.0, 0, 10, 10]])
    b = torch.tensor([[5.0, 0, 15, 10]])
    assert box_iou(a, b).item() == pytest.approx(50 / 150)
    boxes = torch.tensor([[0.0, 0, 10, 10], [1, 0, 11, 10], [0, 0, 10, 10]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    # Box 1 overlaps box 0 (IoU 9/11) in the same class and goes; box 2 is another class and stays.
    keep = batched_nms(boxes, scores, torch.tensor([0, 0, 1]), 0.5)
    assert keep.tolist() == [0, 2]


def test_giou_values_and_gradients():
    box = torch.tensor([[0.0, 0, 10, 10]])
    assert giou_loss(box, box).item() == pytest.approx(0.0, abs=1e-6)
    # Disjoint: IoU 0, hull 20x10=200, union 200 -> GIoU 0 -> loss 1; farther apart -> larger loss.
    assert giou_loss(box, torch.tensor([[10.0, 0, 20, 10]])).item() == pytest.approx(1.0)
    assert giou_loss(box, torch.tensor([[30.0, 0, 40, 10]])).item() > 1.0
    pred = torch.tensor([[1.0, 2, 8, 9]], requires_grad=True)
    giou_loss(pred, box).sum().backward()
    assert torch.isfinite(pred.grad).all() and pred.grad.abs().sum() > 0


def test_dfl_minimised_at_split_target_and_qfl_zero_when_exact():
    target = torch.tensor([2.25])
    logits = torch.full((1, 8), -20.0)
    logits[0, 2], logits[0, 3] = torch.log(torch.tensor(0.75)), torch.log(torch.tensor(0.25))
    best = distribution_focal_loss(logits, target).item()
    worse = torch.zeros(1, 8)
    assert distribution_focal_loss(worse, target).item() > best
    q = torch.tensor([[0.0, 0.7]])
    exact = torch.logit(q.clamp(1e-6, 1 - 1e-6))
    assert quality_focal_loss(exact, q).sum().item() == pytest.approx(0.0, abs=1e-6)
    logits = torch.zeros(1, 2, requires_grad=True)
    quality_focal_loss(logits, q).sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_assigner_picks_only_anchors_inside_the_gt():
    ys, xs = torch.meshgrid(torch.arange(4.0, 64, 8), torch.arange(4.0, 64, 8), indexing="ij")
    points = torch.stack([xs.flatten(), ys.flatten()], 1)
    pred = torch.cat([points - 6, points + 6], 1)
    gt = torch.tensor([[10.0, 10, 30, 30], [40, 40, 60, 60]])
    a = task_aligned_assign(torch.full((64, 3), 0.5), pred, points, gt, torch.tensor([1, 2]), top_k=4)
    for g in range(2):
        chosen = points[a.gt_index == g]
        assert len(chosen) == 4
        assert ((chosen > gt[g, :2]) & (chosen < gt[g, 2:])).all()
    assert set(a.labels[a.gt_index >= 0].tolist()) == {1, 2}
    assert (a.quality[a.gt_index < 0] == 0).all() and (a.quality[a.gt_index >= 0] > 0).all()


def _coco(tmp_path, **edits):
    from PIL import Image

    Image.new("RGB", (64, 64)).save(tmp_path / "a.png")
    data = {"images": [{"id": 1, "file_name": "a.png", "width": 64, "height": 64}],
            "annotations": [{"id": 7, "image_id": 1, "category_id": 3, "bbox": [4, 4, 20, 20],
                             "area": 400, "iscrowd": 0}],
            "categories": [{"id": 3, "name": "box"}]}
    for key, value in edits.items():
        if key == "ann":
            data["annotations"][0].update(value)
        else:
            data[key] = value
    path = tmp_path / "coco.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("edits, words", [
    ({"ann": {"bbox": [50, 50, 20, 20]}}, ["annotation 7", "outside image 1"]),
    ({"ann": {"category_id": 9}}, ["annotation 7", "unknown category_id 9"]),
    ({"ann": {"bbox": [4, 4, 0, 5]}}, ["annotation 7", "non-positive"]),
    ({"images": []}, ["'images' is empty"]),
    ({"annotations": []}, ["'annotations' is empty"]),
    ({"images": [{"id": 1, "file_name": "gone.png", "width": 64, "height": 64}]}, ["gone.png", "does not exist"]),
])
def test_coco_reader_names_each_bad_annotation(tmp_path, edits, words):
    with pytest.raises(CocoFormatError) as err:
        read_coco(_coco(tmp_path, **edits))
    for word in words:
        assert word in str(err.value)


def test_coco_reader_empty_file_and_good_file(tmp_path):
    empty = tmp_path / "e.json"
    empty.write_text("")
    with pytest.raises(CocoFormatError, match="empty"):
        read_coco(empty)
    ds = read_coco(_coco(tmp_path))
    assert ds.class_names == ["box"] and ds.images[0].boxes == [[4, 4, 24, 24]] and ds.images[0].labels == [0]


def test_map_is_one_for_exact_predictions_and_lower_when_shifted(tmp_path):
    path = _coco(tmp_path)
    exact = evaluate_coco_map(path, [{"image_id": 1, "category_id": 3, "bbox": [4, 4, 20, 20], "score": 0.9}])
    assert exact["map"] == pytest.approx(1.0) and exact["ap/box"] == pytest.approx(1.0)
    shifted = evaluate_coco_map(path, [{"image_id": 1, "category_id": 3, "bbox": [10, 10, 20, 20], "score": 0.9}])
    assert shifted["map"] < 0.5


def _rectangles_coco(tmp_path, n=40, seed=0):
    """Red and green filled rectangles on 64x64 grey images: class = colour."""
    import random

    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    images, anns = [], []
    for i in range(n):
        img = Image.new("RGB", (64, 64), (40, 40, 40))
        draw = ImageDraw.Draw(img)
        for _ in range(rng.randint(1, 2)):
            c, w, h = rng.randint(0, 1), rng.randint(14, 28), rng.randint(14, 28)
            x, y = rng.randint(0, 64 - w), rng.randint(0, 64 - h)
            draw.rectangle([x, y, x + w - 1, y + h - 1], fill=[(220, 30, 30), (30, 220, 30)][c])
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": c + 1, "bbox": [x, y, w, h],
                         "area": w * h, "iscrowd": 0})
        img.save(tmp_path / f"{i}.png")
        images.append({"id": i + 1, "file_name": f"{i}.png", "width": 64, "height": 64})
    path = tmp_path / "rects.json"
    path.write_text(json.dumps({"images": images, "annotations": anns,
                                "categories": [{"id": 1, "name": "red"}, {"id": 2, "name": "green"}]}))
    return path


@pytest.mark.slow  # ~6.5 s: 400 steps on 32 images of 64x64
def test_tiny_detector_trains_through_finetune_and_round_trips(tmp_path):
    from sampan.finetune.config import FinetuneConfig
    from sampan.finetune.run import finetune
    from sampan.vision.detection.model import Detector

    data = _rectangles_coco(tmp_path)
    shape = tmp_path / "tiny.json"
    shape.write_text(json.dumps({"backbone": {"stem_channels": 8, "stage_channels": [8, 16, 24, 32],
                                              "stage_blocks": [1, 1, 1, 1]}, "width": 16, "input_size": 64}))
    result = finetune(FinetuneConfig(task="detection", model=str(shape), data=str(data), dev_fraction=0.2, training={
        "output_dir": str(tmp_path / "out"), "max_steps": 600, "per_device_train_batch_size": 8,
        "learning_rate": 3e-3, "logging_steps": 50}))
    assert result.metrics["last_loss"] < 0.5 * result.metrics["first_loss"]
    assert result.metrics["map50"] > 0.5, result.metrics
    model = Detector.from_pretrained(result.output_dir)
    x = torch.rand(1, 3, 64, 64)
    again = Detector.from_pretrained(result.output_dir)
    for a, b in zip(model(x), again(x), strict=True):
        assert torch.equal(a, b)
    found = model.predict(tmp_path / "0.png", score_threshold=0.05)
    assert found and {"label", "score", "box"} <= set(found[0]) and found[0]["label"] in {"red", "green"}


@pytest.mark.slow  # one torch.export + ONNX export
def test_onnx_export_matches_eager(tmp_path):
    import numpy as np
    import onnxruntime

    from sampan.jit import save
    from sampan.static import InputSpec
    from sampan.vision.backbone import BackboneConfig
    from sampan.vision.detection.model import Detector, DetectorConfig

    torch.manual_seed(0)
    model = Detector(DetectorConfig(num_classes=2, backbone=BackboneConfig(stage_channels=(8, 16, 24, 32)),
                                    width=16, input_size=64)).eval()
    x = torch.rand(1, 3, 64, 64)
    files = save(model, tmp_path / "det", input_spec=[InputSpec([1, 3, 64, 64], name="images")], examples=[x])
    session = onnxruntime.InferenceSession(str(files["onnx"]), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        want = model(x)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w.numpy(), atol=1e-4)
    # The raw outputs decode outside the graph exactly as the eager ones do.
    ort = model.decode(torch.from_numpy(got[0][0]), torch.from_numpy(got[1][0]), 64, 64, score_threshold=0.0)
    assert [d["class_id"] for d in ort] == [d["class_id"] for d in model.decode(want[0][0], want[1][0], 64, 64,
                                                                                 score_threshold=0.0)]


def test_flip_mirrors_boxes_and_colour_jitter_keeps_them():
    import random

    from sampan.vision.detection.box_augment import augment

    image = torch.zeros(3, 8, 10)
    image[:, 2:4, 1:3] = 1.0
    boxes = torch.tensor([[1.0, 2, 3, 4]])
    rng = random.Random(0)
    while True:  # until the coin says flip
        out, moved = augment(image, boxes, rng, flip=True, colour=0.0)
        if not torch.equal(moved, boxes):
            break
    assert moved.tolist() == [[7.0, 2, 9, 4]] and out[0, 2:4, 7:9].eq(1).all() and out.sum() == image.sum()
    jittered, same = augment(image, boxes, rng, colour=0.2)
    assert torch.equal(same, boxes) and jittered.min() >= 0 and jittered.max() <= 1
