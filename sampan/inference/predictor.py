"""``Predictor``: run an exported model on numpy inputs (Paddle's ``paddle.inference`` predictor)."""

from __future__ import annotations

from typing import Any

import numpy as np

from sampan.inference.backends import OnnxRuntimeBackend, TorchBackend
from sampan.inference.config import Config
from sampan.inference.inputs import TensorSpec, prepare_inputs
from sampan.inference.int8 import int8_model_path


class InputHandle:
    """Paddle's input tensor handle: ``copy_from_cpu(array)`` before ``predictor.run()``."""

    def __init__(self, spec: TensorSpec):
        self.spec = spec
        self._value: Any = None
        self._shape: tuple[int, ...] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def reshape(self, shape: list[int] | tuple[int, ...]) -> None:
        """Declare the next array's shape (optional; ``copy_from_cpu`` then checks it)."""
        self._shape = tuple(int(d) for d in shape)

    def copy_from_cpu(self, array: Any) -> None:
        """Hold a copy of ``array`` (numpy, array-like or torch tensor) as this input; checked at ``run``."""
        value = array.detach().cpu().clone() if type(array).__module__.startswith("torch") else np.array(array)
        if self._shape is not None and tuple(value.shape) != self._shape:
            raise ValueError(f"input {self.name!r}: reshape() declared {list(self._shape)}, "
                             f"copy_from_cpu got {list(value.shape)}")
        self._value = value

    def shape(self) -> list[int]:
        if self._value is not None:
            return list(self._value.shape)
        return list(self._shape) if self._shape is not None else []


class OutputHandle:
    """Paddle's output tensor handle: ``copy_to_cpu()`` after ``predictor.run()``."""

    def __init__(self, name: str):
        self.name = name
        self._value: np.ndarray | None = None

    def copy_to_cpu(self) -> np.ndarray:
        if self._value is None:
            raise RuntimeError(f"output {self.name!r} has no value yet: call predictor.run() first")
        return self._value.copy()

    def shape(self) -> list[int]:
        return [] if self._value is None else list(self._value.shape)


class Predictor:
    """An exported model ready to run: ``run(inputs) -> [outputs]`` or Paddle's handle style.

    Built by :func:`create_predictor`, on the device ``config.device`` names (a GPU that is not
    there, or that the backend cannot use, is a ``DeviceError`` naming the fix). Inputs are
    validated against ``inference.json`` (names, rank, fixed and tied sizes, dtypes: narrower ints
    are widened, floats are never turned into ints) before they reach the backend.
    """

    def __init__(self, config: Config):
        config.validate()
        self.config = config
        self.meta = config.meta()
        self._input_specs = [TensorSpec.from_json(e) for e in self.meta["inputs"]]
        self._output_names = [e["name"] for e in self.meta["outputs"]]
        input_names = [s.name for s in self._input_specs]
        if config.backend == "torch":
            self.model_path = config.pt2_path
            self._backend: OnnxRuntimeBackend | TorchBackend = TorchBackend(config.pt2_path, config.device)
        else:
            self.model_path = int8_model_path(config.onnx_path) if config.precision == "int8" else config.onnx_path
            self._backend = OnnxRuntimeBackend(self.model_path, input_names, config.num_threads, config.fuse,
                                               config.device)
        self._inputs = {s.name: InputHandle(s) for s in self._input_specs}
        self._outputs = {n: OutputHandle(n) for n in self._output_names}

    @property
    def device(self) -> str:
        """Where the model runs: "cpu" or "cuda:N" (``Config.device`` "auto" resolved). Inputs and
        outputs are numpy arrays on the host either way."""
        return self._backend.device

    @property
    def fusions(self) -> dict[str, int]:
        """ONNX Runtime fusions in the graph the session runs, by kind (``Config.fuse``); empty on the
        torch backend, with ``fuse=False``, or when none matched."""
        return dict(getattr(self._backend, "fusions", {}))

    def get_input_names(self) -> list[str]:
        return [s.name for s in self._input_specs]

    def get_output_names(self) -> list[str]:
        return list(self._output_names)

    def get_input_handle(self, name: str) -> InputHandle:
        if name not in self._inputs:
            raise ValueError(f"unknown input {name!r}: this model takes {self.get_input_names()}")
        return self._inputs[name]

    def get_output_handle(self, name: str) -> OutputHandle:
        if name not in self._outputs:
            raise ValueError(f"unknown output {name!r}: this model gives {self.get_output_names()}")
        return self._outputs[name]

    def run(self, inputs: Any = None) -> list[np.ndarray]:
        """Run once and return the outputs (numpy, in output order); they also fill the output handles.

        ``inputs``: a dict name -> numpy array / array-like / torch tensor, or a list in input
        order. Without it, the arrays given to the input handles' ``copy_from_cpu`` are used.
        """
        if inputs is None:
            empty = [n for n, h in self._inputs.items() if h._value is None]
            if empty:
                raise ValueError(f"input {empty[0]!r} has no data: call predictor.get_input_handle({empty[0]!r})"
                                 ".copy_from_cpu(array) first, or pass the inputs to run()")
            inputs = {n: h._value for n, h in self._inputs.items()}
        arrays = prepare_inputs(self._input_specs, inputs)
        outputs = self._backend.run(arrays)
        for name, value in zip(self._output_names, outputs, strict=True):
            self._outputs[name]._value = value
        return outputs


def create_predictor(config: Config) -> Predictor:
    """A :class:`Predictor` for ``config`` (Paddle's ``paddle.inference.create_predictor``)."""
    return Predictor(config)
