"""Tensor creation with Paddle's calling conventions (list shapes, dtype names as strings).

Everything returns a plain ``torch.Tensor``; these helpers only translate arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

DTypeLike = str | torch.dtype | None
ShapeLike = int | Sequence[int] | torch.Size

_DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
}
_DTYPES.update({"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64})


def to_dtype(dtype: DTypeLike) -> torch.dtype | None:
    """Resolve a dtype given as a torch dtype or a name such as ``"float32"`` or ``"bf16"``."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    raise ValueError(f"unknown dtype {dtype!r}; use a torch.dtype or one of {sorted(_DTYPES)}")


def _shape(shape: ShapeLike) -> tuple[int, ...]:
    if isinstance(shape, int):
        dims: tuple[int, ...] = (shape,)
    elif isinstance(shape, torch.Tensor):
        dims = tuple(int(s) for s in shape.reshape(-1).tolist())
    else:
        dims = tuple(int(s) for s in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"shape {list(dims)} has a negative dimension; every dimension must be >= 0")
    return dims


def randn(shape: ShapeLike, dtype: DTypeLike = None, device: Any = None, *, requires_grad: bool = False):
    """Standard-normal tensor of ``shape`` (e.g. ``sampan.randn([64, 784])``)."""
    return torch.randn(_shape(shape), dtype=to_dtype(dtype), device=device, requires_grad=requires_grad)


def rand(shape: ShapeLike, dtype: DTypeLike = None, device: Any = None):
    """Uniform [0, 1) tensor of ``shape``."""
    return torch.rand(_shape(shape), dtype=to_dtype(dtype), device=device)


def randint(low: int = 0, high: int | None = None, shape: ShapeLike = (1,), dtype: DTypeLike = "int64",
            device: Any = None):
    """Integers in ``[low, high)``; with ``high=None`` the range is ``[0, low)`` as in Paddle."""
    if high is None:
        low, high = 0, low
    if high <= low:
        raise ValueError(f"randint needs high > low, got low={low}, high={high}")
    return torch.randint(low, high, _shape(shape), dtype=to_dtype(dtype), device=device)


def zeros(shape: ShapeLike, dtype: DTypeLike = None, device: Any = None):
    """Tensor of zeros of ``shape``."""
    return torch.zeros(_shape(shape), dtype=to_dtype(dtype), device=device)


def ones(shape: ShapeLike, dtype: DTypeLike = None, device: Any = None):
    """Tensor of ones of ``shape``."""
    return torch.ones(_shape(shape), dtype=to_dtype(dtype), device=device)


def full(shape: ShapeLike, fill_value: Any, dtype: DTypeLike = None, device: Any = None):
    """Tensor of ``shape`` filled with ``fill_value``."""
    return torch.full(_shape(shape), fill_value, dtype=to_dtype(dtype), device=device)


def arange(start: float = 0, end: float | None = None, step: float = 1, dtype: DTypeLike = None,
           device: Any = None):
    """``[start, end)`` in steps of ``step``; ``arange(n)`` is ``[0, n)``."""
    if end is None:
        start, end = 0, start
    return torch.arange(start, end, step, dtype=to_dtype(dtype), device=device)


def to_tensor(data: Any, dtype: DTypeLike = None, place: Any = None, stop_gradient: bool = True):
    """Copy ``data`` (list, numpy array, scalar or tensor) into a new tensor.

    ``stop_gradient=False`` makes a leaf that requires grad, as in Paddle.
    """
    if isinstance(data, torch.Tensor):
        out = data.detach().clone().to(dtype=to_dtype(dtype), device=place)
    else:
        out = torch.tensor(data, dtype=to_dtype(dtype), device=place)
    if not stop_gradient:
        if not (out.is_floating_point() or out.is_complex()):
            raise ValueError(f"stop_gradient=False needs a floating dtype, got {out.dtype}")
        out.requires_grad_(True)
    return out


def concat(x: Sequence[torch.Tensor], axis: int = 0) -> torch.Tensor:
    """Concatenate along ``axis`` (Paddle's name for ``torch.cat``)."""
    return torch.cat(list(x), dim=axis)


def stack(x: Sequence[torch.Tensor], axis: int = 0) -> torch.Tensor:
    """Stack along a new ``axis``."""
    return torch.stack(list(x), dim=axis)


def seed(value: int) -> torch.Generator:
    """Seed torch's global RNG (Paddle's ``paddle.seed``)."""
    return torch.manual_seed(value)


manual_seed = seed
no_grad = torch.no_grad


def set_default_dtype(dtype: DTypeLike) -> None:
    """Set the default floating dtype for new tensors and parameters."""
    torch.set_default_dtype(to_dtype(dtype))


def get_default_dtype() -> torch.dtype:
    """The default floating dtype for new tensors and parameters."""
    return torch.get_default_dtype()
