"""``sampan.inference``: run exported models (Paddle's ``paddle.inference``).

::

    from sampan.inference import Config, create_predictor, export_pretrained
    export_pretrained(model, "out/sentiment")                  # inference.onnx / .pt2 / .json
    predictor = create_predictor(Config("out/sentiment"))      # ONNX Runtime by default
    logits, = predictor.run({"input_ids": ids, "attention_mask": mask})

A causal LM's export also holds prefill and one-step decode graphs with the KV cache as inputs
and outputs; ``create_generator(Config(dir), tokenizer)`` generates on them in O(n) per new token
(greedy, temperature / top-k / top-p, repetition penalty, stop strings, seed)::

    generator = create_generator(Config("out/llama"), tokenizer=tok)
    out, = generator.generate(tok.encode("你好").ids, max_tokens=32, temperature=0.7, seed=0)

Backends: ONNX Runtime (the ``.onnx``, default) and torch (the ``.pt2``); ``precision="int8"``
quantizes the weights with ONNX Runtime's dynamic quantization. Either backend runs on a GPU with
``Config(dir, device="cuda")`` or Paddle's ``config.enable_use_gpu()`` (ONNX Runtime through the
onnxruntime-gpu wheel; ``sampan.inference.device``). See docs/inference.md.

The predictor side imports no torch (ONNX Runtime and numpy only), so running an exported model
does not pay torch's import time; the export functions, which run torch, load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sampan.inference.config import Config
from sampan.inference.generator import GenerationOutput, Generator, create_generator
from sampan.inference.int8 import int8_model_path
from sampan.inference.predictor import InputHandle, OutputHandle, Predictor, create_predictor
from sampan.inference.sampling import SamplingParams
from sampan.utils.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from sampan.inference.decode_export import export_decode_graphs
    from sampan.inference.export import export_model
    from sampan.inference.pretrained import export_model_dir, export_pretrained

_EXPORTERS = {"export_model": "sampan.inference.export", "export_decode_graphs": "sampan.inference.decode_export",
              "export_model_dir": "sampan.inference.pretrained", "export_pretrained": "sampan.inference.pretrained"}


__getattr__ = lazy_exports(__name__, _EXPORTERS)

__all__ = [
    "Config",
    "GenerationOutput",
    "Generator",
    "InputHandle",
    "OutputHandle",
    "Predictor",
    "SamplingParams",
    "create_generator",
    "create_predictor",
    "export_decode_graphs",
    "export_model",
    "export_model_dir",
    "export_pretrained",
    "int8_model_path",
]
