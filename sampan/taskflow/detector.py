"""A saved :class:`~sampan.vision.detection.model.Detector` exported through ``jit.save`` and run by
the inference predictor (ONNX Runtime by default), as OCR's models are.

The graph holds the network up to its raw head outputs, ``cls`` ``(b, n, classes)`` and ``reg``
``(b, n, 4 * (reg_max + 1))``, for a batch of letterboxed ``input_size`` squares; letterboxing (numpy)
and DFL decoding + class-aware NMS (``model.decode``, torch) run outside it, the same code the eager
``Detector.predict`` runs, so the two give the same boxes up to the exporter's float rounding.

The export is made once per model directory (digest of its config and weights) into the export
cache, ``$SAMPAN_HOME/cache/inference/<name>-<digest>``, under a file lock (threads and processes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

EXPORT_VERSION = "detector-1"  # bump when the exported signature changes, to invalidate old caches


def export_detector(directory: str | Path) -> Path:
    """The cached inference directory (``inference.onnx`` + ``.pt2`` + ``.json``) of the detector saved
    in ``directory``, exported now unless it is there already."""
    from sampan.taskflow.runtime import cached_export, files_digest
    from sampan.utils.paths import cache_dir

    directory = Path(directory).resolve()
    target = cache_dir("inference", f"{directory.name}-{files_digest(directory, EXPORT_VERSION)}")
    return cached_export(directory.name, target, lambda out: _export_into(directory, out))


def _export_into(directory: Path, target: Path) -> None:
    import torch

    from sampan.inference.export import export_model
    from sampan.static import InputSpec
    from sampan.vision.detection.model import Detector

    model = Detector.from_pretrained(directory).float().eval()  # stored fp16: exported in fp32
    size = model.config.input_size
    example = torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    export_model(model, target, [InputSpec([None, 3, size, size], "float32", "images")], overwrite=True,
                 output_names=["cls", "reg"], examples=[example])


class DetectorPredictor:
    """A detector directory run through the inference predictor.

    ``predict(images)`` takes RGB ``uint8`` arrays (``sampan.vision.image_input.load_image``'s) or PIL
    images and returns, per image, ``[{"label", "class_id", "score", "box"}]`` best first, boxes
    x0,y0,x1,y1 in the image's own pixels: what ``Detector.predict`` returns for the same image.
    """

    def __init__(self, directory: str | Path, backend: str = "onnxruntime", precision: str = "fp32",
                 num_threads: int | None = None, device: str = "cpu"):
        from sampan.inference import Config, create_predictor
        from sampan.taskflow.runtime import _default_threads
        from sampan.vision.detection.model import MODEL_TYPE, DetectorConfig
        from sampan.vision.model_io import load_config

        self.directory = Path(directory)
        self.config = load_config(DetectorConfig, MODEL_TYPE, self.directory)
        self.inference_dir = export_detector(self.directory)
        self.predictor = create_predictor(Config(str(self.inference_dir), backend=backend, precision=precision,
                                                 num_threads=num_threads or _default_threads(), device=device))

    def raw(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The exported network's ``(cls, reg)`` logits of a ``(b, 3, size, size)`` float32 batch."""
        cls, reg = self.predictor.run({"images": np.ascontiguousarray(batch, np.float32)})
        return cls, reg

    def predict(self, images: list[Any], score_threshold: float = 0.3, iou_threshold: float = 0.6,
                batch_size: int = 8) -> list[list[dict]]:
        """Detections per image (see the class docstring), ``batch_size`` images per predictor call."""
        import torch
        from PIL import Image

        from sampan.vision.detection.letterbox import letterbox_pixels
        from sampan.vision.detection.model import decode, to_image_pixels

        size = self.config.input_size
        out: list[list[dict]] = []
        for start in range(0, len(images), batch_size):
            chunk = [im if isinstance(im, Image.Image) else Image.fromarray(np.asarray(im, np.uint8))
                     for im in images[start:start + batch_size]]
            prepared = [letterbox_pixels(im, size) for im in chunk]
            cls, reg = self.raw(np.stack([p[0] for p in prepared]))
            for i, (image, (_, scale)) in enumerate(zip(chunk, prepared, strict=True)):
                found = decode(self.config, torch.from_numpy(cls[i]), torch.from_numpy(reg[i]), size, size,
                               score_threshold, iou_threshold)
                out.append(to_image_pixels(found, scale, image.width, image.height))
        return out
