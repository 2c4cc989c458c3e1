"""Served exported models: an inference directory (``inference.json`` + ``.onnx`` / ``.pt2``) behind
a batched call.

A request's ``inputs`` maps each input name to a nested list; the first dimension is the batch.
Requests whose other dimensions agree are concatenated along it, run once, and their output rows
are split back. Inputs with a fixed first dimension are run one request at a time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sampan.serving.errors import ServingError

_DTYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16, "int64": np.int64,
           "int32": np.int32, "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_}


class _OnnxPredictor:
    """Fallback when ``sampan.inference`` is absent: the ``.onnx`` file through onnxruntime directly."""

    def __init__(self, model_dir: Path, num_threads: int | None):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        if num_threads is not None:
            options.intra_op_num_threads = options.inter_op_num_threads = num_threads
        self._session = onnxruntime.InferenceSession(str(model_dir / "inference.onnx"), options,
                                                     providers=["CPUExecutionProvider"])

    def get_input_names(self) -> list[str]:
        return [i.name for i in self._session.get_inputs()]

    def get_output_names(self) -> list[str]:
        return [o.name for o in self._session.get_outputs()]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return list(self._session.run(None, feeds))


def open_predictor(model_dir: Path, num_threads: int | None = None, device: str = "cpu") -> Any:
    """``sampan.inference.create_predictor`` on the ONNX file on ``device`` (a spec: a GPU needs
    onnxruntime-gpu), or onnxruntime directly, on the CPU, before ``sampan.inference`` exists."""
    try:
        from sampan.inference import Config, create_predictor
    except ImportError:
        return _OnnxPredictor(model_dir, num_threads)
    return create_predictor(Config(str(model_dir), backend="onnxruntime", num_threads=num_threads, device=device))


@dataclass
class ModelRequest:
    """One request's inputs, converted and checked: arrays by input name, and its batch rows."""

    arrays: dict[str, np.ndarray]
    rows: int

    def signature(self) -> tuple:
        return tuple((name, a.shape[1:]) for name, a in sorted(self.arrays.items()))


class ServedModel:
    """An exported model directory opened for serving, on ``device`` (ONNX Runtime; a spec as in
    ``sampan.inference.Config``)."""

    def __init__(self, name: str, model_dir: str | Path, num_threads: int | None = None, device: str = "cpu"):
        self.name = name
        self.model_dir = Path(model_dir)
        meta_path = self.model_dir / "inference.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"model '{name}': {meta_path} not found; --model-dir takes a folder written by "
                                    "sampan.jit.save(fn, DIR / 'inference', input_spec=...)")
        self.meta = json.loads(meta_path.read_text())
        if not (self.model_dir / "inference.onnx").is_file():
            reason = self.meta.get("onnx_error") or "the file is missing"
            raise FileNotFoundError(f"model '{name}': {self.model_dir / 'inference.onnx'} not found ({reason}); "
                                    "serving runs the ONNX export")
        self.inputs = self.meta["inputs"]
        self.outputs = self.meta["outputs"]
        self.predictor = open_predictor(self.model_dir, num_threads, device)
        # Batching concatenates along dim 0, which is only possible when every input's dim 0 is dynamic.
        self.batchable = all(i["shape"] and i["shape"][0] is None for i in self.inputs)

    def info(self) -> dict[str, Any]:
        info = {"inputs": self.inputs, "outputs": self.outputs, "batchable": self.batchable}
        device = getattr(self.predictor, "device", None)
        return info if device is None else {**info, "device": device}

    def parse(self, inputs: Any, max_rows: int) -> ModelRequest:
        """Check a request's ``inputs`` against ``inference.json``; 422 / 413 naming the input at fault."""
        names = [i["name"] for i in self.inputs]
        if not isinstance(inputs, dict):
            raise ServingError(422, "invalid_request", f'"inputs" must be an object mapping the input names '
                                                       f"{names} to nested lists")
        missing = [n for n in names if n not in inputs]
        extra = [n for n in inputs if n not in names]
        if missing or extra:
            raise ServingError(422, "wrong_inputs", f"model '{self.name}' takes inputs {names}; "
                                                    f"missing {missing}, unknown {extra}")
        arrays, rows = {}, None
        for spec in self.inputs:
            name, shape = spec["name"], spec["shape"]
            dtype = _DTYPES.get(spec["dtype"])
            if dtype is None:
                raise ServingError(500, "unsupported_dtype", f"input '{name}' has dtype {spec['dtype']}, "
                                                             "which the JSON API cannot carry")
            arrays[name] = array = _to_array(name, inputs[name], dtype)
            if array.ndim != len(shape):
                raise ServingError(422, "wrong_shape", f"input '{name}' must have {len(shape)} dimensions "
                                                       f"(shape {shape}, None = any), got shape {list(array.shape)}")
            for d, (want, got) in enumerate(zip(shape, array.shape, strict=True)):
                if want is not None and want != got:
                    raise ServingError(422, "wrong_shape", f"input '{name}' dimension {d} must be {want} "
                                                           f"(shape {shape}), got {got}")
                if got == 0:
                    raise ServingError(422, "empty_input", f"input '{name}' has an empty dimension {d}")
            if rows is not None and array.shape[0] != rows:
                raise ServingError(422, "wrong_shape", f"all inputs must have the same batch size (dim 0); "
                                                       f"'{name}' has {array.shape[0]}, others {rows}")
            rows = array.shape[0]
        assert rows is not None
        if rows > max_rows:
            raise ServingError(413, "too_many_inputs", f"the request has {rows} rows, more than the limit of "
                                                       f"{max_rows} per request (max_inputs_per_request)")
        return ModelRequest(arrays, rows)

    def run_batch(self, requests: Sequence[ModelRequest]) -> list[dict[str, list]]:
        """Run requests with the same non-batch shapes as one call each; split the outputs by rows."""
        results: list[dict[str, list] | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for i, req in enumerate(requests):
            key = req.signature() if self.batchable else (i,)
            groups.setdefault(key, []).append(i)
        names = [o["name"] for o in self.outputs]
        for members in groups.values():
            feeds = {n: np.concatenate([requests[i].arrays[n] for i in members]) for n in requests[members[0]].arrays}
            outs = self.predictor.run(feeds)
            total = sum(requests[i].rows for i in members)
            if len(members) > 1 and any(o.ndim == 0 or o.shape[0] != total for o in outs):
                raise RuntimeError(f"model '{self.name}' outputs are not batch-major; cannot split a batch")
            start = 0
            for i in members:
                rows = requests[i].rows
                part = outs if len(members) == 1 else [o[start:start + rows] for o in outs]
                results[i] = {n: np.asarray(o).tolist() for n, o in zip(names, part, strict=True)}
                start += rows
        return results  # type: ignore[return-value]


def _to_array(name: str, value: Any, dtype: type) -> np.ndarray:
    if not isinstance(value, list):
        raise ServingError(422, "wrong_type", f"input '{name}' must be a nested list of numbers, "
                                              f"got {type(value).__name__}")
    try:
        array = np.asarray(value)
    except ValueError as err:  # ragged nesting
        raise ServingError(422, "wrong_shape", f"input '{name}' is a ragged list ({str(err).split('.')[0]}); "
                                               "every row must have the same length") from None
    except (RecursionError, OverflowError, TypeError) as err:
        raise ServingError(422, "wrong_type", f"input '{name}' is not a nested list of numbers "
                                              f"({type(err).__name__})") from None
    if array.dtype == object or array.dtype.kind not in "biuf":
        raise ServingError(422, "wrong_type", f"input '{name}' must contain only numbers "
                                              f"(got elements of kind {array.dtype.kind!r})")
    if array.dtype.kind == "f" and not np.isfinite(array).all():  # JSON's NaN / Infinity extensions
        raise ServingError(422, "non_finite", f"input '{name}' contains NaN or Infinity; send finite numbers")
    if np.dtype(dtype).kind in "iub" and array.dtype.kind == "f":
        raise ServingError(422, "wrong_type", f"input '{name}' takes integers ({np.dtype(dtype).name}), got floats")
    converted = array.astype(dtype)
    if converted.dtype.kind == "f" and not np.isfinite(converted).all():
        raise ServingError(422, "out_of_range", f"input '{name}' has numbers too large for {np.dtype(dtype).name}")
    return converted
