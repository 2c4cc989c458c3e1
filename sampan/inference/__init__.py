"""``sampan.inference``: run exported models (Paddle's ``paddle.inference``).

::

    from sampan.inference import Config, create_predictor, export_pretrained
    export_pretrained(model, "out/sentiment")                  # inference.onnx / .pt2 / .json
    predictor = create_predictor(Config("out/sentiment"))      # ONNX Runtime by default
    logits, = predictor.run({"input_ids": ids, "attention_mask": mask})

Backends: ONNX Runtime (the ``.onnx``, default) and torch (the ``.pt2``); ``precision="int8"``
quantizes the weights with ONNX Runtime's dynamic quantization. See docs/inference.md.
"""

from sampan.inference.config import Config
from sampan.inference.export import export_model
from sampan.inference.int8 import int8_model_path
from sampan.inference.predictor import InputHandle, OutputHandle, Predictor, create_predictor
from sampan.inference.pretrained import export_model_dir, export_pretrained

__all__ = [
    "Config",
    "InputHandle",
    "OutputHandle",
    "Predictor",
    "create_predictor",
    "export_model",
    "export_model_dir",
    "export_pretrained",
    "int8_model_path",
]
