"""SGD and Momentum: Paddle's API over ``torch.optim.SGD``."""

from __future__ import annotations

from typing import Any

import torch

from sampan.optimizer._checks import check_non_negative
from sampan.optimizer.lr import LRScheduler
from sampan.optimizer.optimizer import GradClip, Optimizer, ParametersLike

__all__ = ["SGD", "Momentum"]


class SGD(Optimizer):
    """Plain stochastic gradient descent; ``weight_decay`` is L2 added to the gradient.

    See ``Optimizer`` for ``learning_rate``, ``parameters`` and ``grad_clip``.
    """

    def __init__(
        self,
        learning_rate: float | LRScheduler = 0.001,
        parameters: ParametersLike | None = None,
        weight_decay: float | None = None,
        grad_clip: GradClip | None = None,
    ) -> None:
        super().__init__(learning_rate, parameters, weight_decay, grad_clip)

    def _create(self, param_groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
        return torch.optim.SGD(param_groups, lr=self.get_lr())


class Momentum(Optimizer):
    """SGD with (optionally Nesterov) momentum: ``v = momentum * v + g; p -= lr * v``.

    ``weight_decay`` is L2 added to the gradient. See ``Optimizer`` for the other arguments.
    """

    def __init__(
        self,
        learning_rate: float | LRScheduler = 0.001,
        momentum: float = 0.9,
        parameters: ParametersLike | None = None,
        use_nesterov: bool = False,
        weight_decay: float | None = None,
        grad_clip: GradClip | None = None,
    ) -> None:
        self._momentum = check_non_negative("momentum", momentum)
        if use_nesterov and self._momentum == 0.0:
            raise ValueError("use_nesterov=True needs momentum in (0, inf), got 0")
        self._use_nesterov = bool(use_nesterov)
        super().__init__(learning_rate, parameters, weight_decay, grad_clip)

    def _create(self, param_groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
        return torch.optim.SGD(
            param_groups, lr=self.get_lr(), momentum=self._momentum, nesterov=self._use_nesterov
        )
