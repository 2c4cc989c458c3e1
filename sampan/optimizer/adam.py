"""Adam and AdamW: Paddle's API over ``torch.optim.Adam`` / ``torch.optim.AdamW``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from sampan.optimizer._checks import check_positive, check_unit_interval
from sampan.optimizer.lr import LRScheduler
from sampan.optimizer.optimizer import GradClip, Optimizer, ParametersLike, ParamGroup

__all__ = ["Adam", "AdamW"]

_FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def fused_supported(param_groups: list[dict[str, Any]]) -> bool:
    """Whether torch's fused Adam kernel takes these parameters.

    Only plain tensors qualify: tensor subclasses such as DTensor (tensor parallel, FSDP2) keep
    torch's default implementation, which is known to handle them.
    """
    params = [p for group in param_groups for p in group["params"]]
    return bool(params) and all(
        type(p) in (torch.Tensor, torch.nn.Parameter)
        and type(p.data) is torch.Tensor
        and p.device.type in ("cpu", "cuda")
        and p.dtype in _FUSED_DTYPES
        for p in params
    )


class Adam(Optimizer):
    """Adam; ``weight_decay`` is coupled L2 (added to the gradient), as in ``torch.optim.Adam``.

    Args:
        beta1, beta2: decay rates of the first and second moment estimates, in [0, 1).
        epsilon: added to the denominator for numerical stability, > 0.
        amsgrad: use the AMSGrad variant.
        fused: use torch's fused kernel (one pass over all parameters; ~10x faster than the
            per-tensor loop on CPU for a small transformer). None (default) picks it whenever every
            parameter is a plain floating tensor on CPU or CUDA, else torch's default.

    See ``Optimizer`` for ``learning_rate``, ``parameters`` and ``grad_clip``.
    """

    _torch_class: type[torch.optim.Optimizer] = torch.optim.Adam

    def __init__(
        self,
        learning_rate: float | LRScheduler = 0.001,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        parameters: ParametersLike | None = None,
        weight_decay: float | None = None,
        grad_clip: GradClip | None = None,
        amsgrad: bool = False,
        fused: bool | None = None,
    ) -> None:
        self._fused = fused
        self._betas = (check_unit_interval("beta1", beta1), check_unit_interval("beta2", beta2))
        self._epsilon = check_positive("epsilon", epsilon)
        self._amsgrad = bool(amsgrad)
        super().__init__(learning_rate, parameters, weight_decay, grad_clip)

    def _create(self, param_groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
        fused = self._fused if self._fused is not None else fused_supported(param_groups)
        return self._torch_class(
            param_groups, lr=self.get_lr(), betas=self._betas, eps=self._epsilon, amsgrad=self._amsgrad,
            fused=fused or None,
        )


class AdamW(Adam):
    """Adam with decoupled weight decay (``p -= lr * weight_decay * p``), as in ``torch.optim.AdamW``.

    Args:
        weight_decay: the decoupled decay coefficient (default 0.01).
        apply_decay_param_fun: ``name -> bool``; parameters for which it returns False get no weight
            decay (typically biases and norm weights). Names come from (name, tensor) pairs, so pass
            ``parameters=model.named_parameters()`` (or pairs in each group's ``'params'``); plain
            tensors have no names, and then this argument is a ValueError.

    See ``Adam`` for the other arguments.
    """

    _torch_class = torch.optim.AdamW

    def __init__(
        self,
        learning_rate: float | LRScheduler = 0.001,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        parameters: ParametersLike | None = None,
        weight_decay: float | None = 0.01,
        grad_clip: GradClip | None = None,
        apply_decay_param_fun: Callable[[str], bool] | None = None,
        amsgrad: bool = False,
        fused: bool | None = None,
    ) -> None:
        if apply_decay_param_fun is not None:
            if not callable(apply_decay_param_fun):
                raise TypeError(
                    f"apply_decay_param_fun must be callable, got {type(apply_decay_param_fun).__name__}"
                )
            if parameters is None:
                raise ValueError(
                    "apply_decay_param_fun needs parameter names, which a loss graph does not have: "
                    "pass parameters=model.named_parameters()"
                )
        self._apply_decay_param_fun = apply_decay_param_fun
        super().__init__(
            learning_rate, beta1, beta2, epsilon, parameters, weight_decay, grad_clip, amsgrad=amsgrad,
            fused=fused,
        )

    def _split_groups(self, groups: list[ParamGroup]) -> list[ParamGroup]:
        decides = self._apply_decay_param_fun
        if decides is None:
            return groups
        split: list[ParamGroup] = []
        for index, group in enumerate(groups):
            if any(name is None for name in group.names):
                raise ValueError(
                    f"apply_decay_param_fun needs parameter names, but param group {index} holds plain "
                    "tensors: pass (name, tensor) pairs, e.g. parameters=model.named_parameters()"
                )
            decay: list[tuple[torch.Tensor, str | None]] = []
            keep: list[tuple[torch.Tensor, str | None]] = []
            for param, name in zip(group.params, group.names, strict=True):
                (decay if decides(name) else keep).append((param, name))
            for pairs, weight_decay in ((decay, group.weight_decay), (keep, 0.0)):
                if pairs:
                    params, names = zip(*pairs, strict=True)
                    split.append(ParamGroup(list(params), list(names), weight_decay, group.lr_mult))
        return split
