"""Sampan: train, scale, compile and ship large Chinese-language models on PyTorch.

The front door mirrors Paddle's so that ``import sampan as paddle`` code reads as users expect::

    import sampan as paddle
    model = paddle.nn.Linear(784, 10)
    out = model(paddle.randn([64, 784]))

PyTorch is the engine: every tensor is a ``torch.Tensor`` and every layer a ``torch.nn.Module``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from sampan._version import __version__

# The tensor front door (sampan.randn, sampan.no_grad, ...) also loads on first use: importing torch
# costs 7-13 s on a loaded machine, and `sampan plan` (on paper, torch-free) must not pay it.
_TENSOR_NAMES = ("arange", "concat", "full", "get_default_dtype", "manual_seed", "no_grad", "ones", "rand", "randint",
                 "randn", "seed", "set_default_dtype", "stack", "to_tensor", "zeros")

# Subpackages load on first use so `import sampan` stays as cheap as `import torch`.
_LAZY_SUBMODULES = ("amp", "checkpoint", "finetune", "hub", "inference", "io", "jit", "models", "nn", "optimizer", "pretraining",
                    "serving", "static", "taskflow", "text", "trainer")

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from sampan import amp, checkpoint, io, jit, models, nn, optimizer, pretraining, static, text, trainer
    from sampan.tensor import (
        arange,
        concat,
        full,
        get_default_dtype,
        manual_seed,
        no_grad,
        ones,
        rand,
        randint,
        randn,
        seed,
        set_default_dtype,
        stack,
        to_tensor,
        zeros,
    )


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES or name == "tensor":
        return importlib.import_module(f"sampan.{name}")
    if name == "Taskflow":  # the one-line front door: from sampan import Taskflow
        from sampan.taskflow import Taskflow

        return Taskflow
    if name in _TENSOR_NAMES:
        value = getattr(importlib.import_module("sampan.tensor"), name)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module 'sampan' has no attribute {name!r}")


__all__ = [
    "__version__",
    "Taskflow",
    "amp",
    "checkpoint",
    "io",
    "jit",
    "static",
    "trainer",
    "arange",
    "concat",
    "full",
    "get_default_dtype",
    "manual_seed",
    "models",
    "nn",
    "no_grad",
    "ones",
    "optimizer",
    "pretraining",
    "rand",
    "randint",
    "randn",
    "seed",
    "set_default_dtype",
    "stack",
    "text",
    "to_tensor",
    "zeros",
]
