"""Checking a Predictor's inputs against ``inference.json`` before they reach a backend.

A backend given a wrong input fails deep inside (an ONNX Runtime shape error naming an internal
node, a torch guard on ``s85``); these checks say which input is wrong and what was expected.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One input as ``inference.json`` describes it.

    Fields:
        name: the input's name.
        shape: per dimension its fixed size, or None where any size is accepted.
        dtype: the numpy dtype the model takes.
        symbols: per dimension, for dynamic ones, a name shared by every dimension that must have
            the same size (e.g. ``input_ids.shape[1]`` on both ``input_ids`` and
            ``attention_mask``); None where unknown (a directory written by plain ``jit.save``).
        max_shape: per dimension the largest size the exported graph accepts (None: no limit known).
    """

    name: str
    shape: tuple[int | None, ...]
    dtype: np.dtype
    symbols: tuple[str | None, ...]
    max_shape: tuple[int | None, ...]

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> TensorSpec:
        shape = tuple(None if d is None else int(d) for d in entry["shape"])
        dims = entry.get("dims") or [None] * len(shape)
        return cls(name=entry["name"], shape=shape, dtype=np.dtype(entry["dtype"]),
                   symbols=tuple(d["symbol"] if d else None for d in dims),
                   max_shape=tuple(d.get("max") if d else None for d in dims))

    def describe(self) -> str:
        """``int64 [?, ?]``-style text for error messages."""
        return f"{self.dtype.name} [{', '.join('?' if d is None else str(d) for d in self.shape)}]"


def _to_numpy(name: str, value: Any) -> np.ndarray:
    if type(value).__module__.startswith("torch"):  # a torch.Tensor, without importing torch here
        value = value.detach().cpu()
        if value.dtype.is_floating_point and value.dtype.itemsize < 4:  # bf16 has no numpy dtype
            value = value.float()
        return value.numpy()
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as e:  # ragged nested lists
        raise ValueError(f"input {name!r} is not a rectangular array ({e}); pad the rows to one length") from e
    return array


def _cast(spec: TensorSpec, array: np.ndarray) -> np.ndarray:
    """Apply the cast rules: widening within a kind and ints -> floats silently; anything lossy is an error."""
    if array.dtype == spec.dtype:
        return array
    want, have = spec.dtype.kind, array.dtype.kind
    if want in "iu" and have in "iub":
        return array.astype(spec.dtype)
    if want == "f" and have in "fiub":
        return array.astype(spec.dtype)
    if want == "b" and have == "b":
        return array
    hint = ""
    if want in "iu" and have == "f":
        hint = ("; floats are not turned into integers silently: if they hold whole numbers, "
                f"cast them yourself with array.astype('{spec.dtype.name}')")
    raise ValueError(f"input {spec.name!r} takes {spec.describe()}, got dtype {array.dtype}{hint}")


def _check_shape(spec: TensorSpec, array: np.ndarray, seen: dict[str, tuple[int, str]]) -> None:
    if array.ndim != len(spec.shape):
        raise ValueError(f"input {spec.name!r} takes {spec.describe()} (rank {len(spec.shape)}), "
                         f"got shape {list(array.shape)} (rank {array.ndim})")
    for axis, (want, size) in enumerate(zip(spec.shape, array.shape, strict=True)):
        if want is not None and size != want:
            raise ValueError(f"input {spec.name!r} dim {axis} must be {want} ({spec.describe()}), "
                             f"got shape {list(array.shape)}")
        if size == 0:
            raise ValueError(f"input {spec.name!r} has an empty dim {axis} (shape {list(array.shape)})")
        limit = spec.max_shape[axis]
        if limit is not None and size > limit:
            raise ValueError(f"input {spec.name!r} dim {axis} is {size}, over the model's limit of {limit} "
                             "(e.g. its position table); truncate the input")
        symbol = spec.symbols[axis]
        if symbol is None:
            continue
        if symbol in seen and seen[symbol][0] != size:
            first_size, where = seen[symbol]
            raise ValueError(f"input {spec.name!r} dim {axis} is {size} but must equal {where} = {first_size} "
                             "(the exported model ties these sizes)")
        seen.setdefault(symbol, (size, f"{spec.name}.shape[{axis}]"))


def prepare_inputs(specs: Sequence[TensorSpec], inputs: Any) -> list[np.ndarray]:
    """Validate ``inputs`` (a dict name -> array-like, or a list in input order) and return
    contiguous arrays of the exact dtypes, in input order. Errors name the input and what it takes."""
    names = [s.name for s in specs]
    if isinstance(inputs, Mapping):
        unknown = [k for k in inputs if k not in names]
        if unknown:
            raise ValueError(f"unknown input {unknown[0]!r}: this model takes {names}")
        missing = [s for s in specs if s.name not in inputs]
        if missing:
            raise ValueError(f"missing input {missing[0].name!r} ({missing[0].describe()}); this model takes {names}")
        values = [inputs[n] for n in names]
    elif isinstance(inputs, (list, tuple)):
        if len(inputs) != len(specs):
            raise ValueError(f"this model takes {len(specs)} inputs {names} (in that order), got {len(inputs)}")
        values = list(inputs)
    else:
        raise TypeError(f"inputs must be a dict name -> array or a list in the order {names}, "
                        f"got {type(inputs).__name__}; e.g. run({{'{names[0]}': array}})")
    seen: dict[str, tuple[int, str]] = {}
    arrays = []
    for spec, value in zip(specs, values, strict=True):
        array = _to_numpy(spec.name, value)
        if array.dtype.kind not in "biuf":
            raise ValueError(f"input {spec.name!r} takes {spec.describe()}, got an array of {array.dtype}")
        array = _cast(spec, array)
        _check_shape(spec, array, seen)
        arrays.append(np.ascontiguousarray(array))
    return arrays
