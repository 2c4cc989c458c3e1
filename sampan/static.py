"""``sampan.static``: descriptions of a static graph's inputs (Paddle's ``paddle.static.InputSpec``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from sampan.tensor import DTypeLike, to_dtype

__all__ = ["InputSpec"]


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """The shape and dtype of one tensor input of a static function.

    Fields:
        shape: one entry per dimension; ``None`` (or ``-1``, Paddle's spelling) marks a dynamic
            dimension, which the compiled graph and the exported model accept at any size.
        dtype: a torch dtype or its name ("float32", "int64", ...).
        name: the input's name in the exported model (defaults to the parameter name).
    """

    shape: tuple[int | None, ...]
    dtype: torch.dtype = torch.float32
    name: str | None = None

    def __init__(self, shape: Sequence[int | None], dtype: DTypeLike = "float32", name: str | None = None):
        dims = tuple(None if d is None or d == -1 else int(d) for d in shape)
        if any(d is not None and d < 0 for d in dims):
            raise ValueError(f"InputSpec shape {list(shape)} has a negative size; use None for a dynamic dimension")
        object.__setattr__(self, "shape", dims)
        object.__setattr__(self, "dtype", to_dtype(dtype) or torch.float32)
        object.__setattr__(self, "name", name)

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor, name: str | None = None) -> InputSpec:
        """The spec of ``tensor`` with every dimension static."""
        return cls(tuple(tensor.shape), tensor.dtype, name)

    @property
    def dynamic_dims(self) -> tuple[int, ...]:
        """Indices of the dynamic dimensions."""
        return tuple(i for i, d in enumerate(self.shape) if d is None)

    def matches(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` fits this spec (same rank and dtype, equal static sizes)."""
        return (tensor.dtype == self.dtype and tensor.dim() == len(self.shape)
                and all(d is None or d == s for d, s in zip(self.shape, tensor.shape, strict=False)))

    def example(self, dynamic_size: int = 2) -> torch.Tensor:
        """A zero tensor of this spec, with ``dynamic_size`` for every dynamic dimension."""
        return torch.zeros([dynamic_size if d is None else d for d in self.shape], dtype=self.dtype)

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": str(self.dtype).removeprefix("torch.")}
