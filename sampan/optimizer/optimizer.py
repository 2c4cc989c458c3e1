"""The optimizer base class: Paddle's optimizer API over a ``torch.optim.Optimizer``.

Sampan optimizers never implement update rules themselves; each subclass only says which
``torch.optim`` class to build and with which hyperparameters. This class adds what Paddle users
expect on top: ``learning_rate`` as a float or an ``LRScheduler``, ``grad_clip``, ``minimize(loss)``,
``clear_grad()``, Paddle-style parameter groups, and parameters found from the loss when none are given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from sampan.optimizer._checks import check_non_negative
from sampan.optimizer.lr import LRScheduler

__all__ = ["Optimizer", "ParametersLike", "GradClip"]

ParametersLike = Iterable[Tensor] | Iterable[tuple[str, Tensor]] | Iterable[dict[str, Any]]
GradClip = Callable[[list[Tensor]], Any]

_GROUP_KEYS = ("params", "weight_decay", "learning_rate")


@dataclass
class ParamGroup:
    """A parsed parameter group, before it becomes a ``torch.optim`` param group.

    ``names[i]`` is the name of ``params[i]`` when parameters were given as (name, tensor) pairs,
    else None. ``weight_decay`` None means the optimizer's own ``weight_decay``.
    """

    params: list[Tensor]
    names: list[str | None]
    weight_decay: float | None = None
    lr_mult: float = 1.0


def _split_named(items: Iterable[Any], where: str) -> tuple[list[Tensor], list[str | None]]:
    params: list[Tensor] = []
    names: list[str | None] = []
    for item in items:
        if isinstance(item, Tensor):
            params.append(item)
            names.append(None)
        elif (
            isinstance(item, tuple)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], Tensor)
        ):
            names.append(item[0])
            params.append(item[1])
        else:
            raise TypeError(
                f"{where} must hold tensors, (name, tensor) pairs or param-group dicts, "
                f"got {type(item).__name__}"
            )
    return params, names


def _parse_group(group: dict[str, Any], index: int) -> ParamGroup:
    unknown = sorted(set(group) - set(_GROUP_KEYS))
    if unknown:
        raise ValueError(
            f"param group {index} has unknown key(s) {unknown}; allowed keys: {list(_GROUP_KEYS)}"
        )
    if "params" not in group:
        raise ValueError(f"param group {index} has no 'params'")
    raw = group["params"]
    params, names = _split_named([raw] if isinstance(raw, Tensor) else raw, f"param group {index} 'params'")
    weight_decay = group.get("weight_decay")
    if weight_decay is not None:
        weight_decay = check_non_negative(f"param group {index} 'weight_decay'", weight_decay)
    lr_mult = check_non_negative(f"param group {index} 'learning_rate'", group.get("learning_rate", 1.0))
    return ParamGroup(params, names, weight_decay, lr_mult)


def parse_parameters(parameters: ParametersLike) -> list[ParamGroup]:
    """Read ``parameters`` once (it may be a generator) into parameter groups."""
    items = list(parameters)
    if not items:
        raise ValueError(
            "parameters is empty: pass model.parameters(), model.named_parameters() or a list of param-group dicts"
        )
    if all(isinstance(item, dict) for item in items):
        return [_parse_group(group, i) for i, group in enumerate(items)]
    return [ParamGroup(*_split_named(items, "parameters"))]


def trainable_leaves(loss: Tensor) -> list[Tensor]:
    """The leaf tensors with ``requires_grad`` that ``loss`` depends on, in first-seen DFS order.

    These are the ``.variable`` of the graph's ``AccumulateGrad`` nodes; frozen tensors and non-leaf
    tensors have none, so they are left out.
    """
    leaves: dict[int, Tensor] = {}
    seen: set[Any] = set()
    stack = [loss.grad_fn]
    # Iterative, not recursive: a deep network's graph would overflow Python's recursion limit.
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == "AccumulateGrad":
            leaves.setdefault(id(node.variable), node.variable)
        stack.extend(child for child, _ in reversed(node.next_functions))
    return list(leaves.values())


class Optimizer:
    """Base class of sampan optimizers; subclasses implement ``_create``.

    Args:
        learning_rate: a float, or an ``LRScheduler`` whose current value is read at every ``step()``
            (call ``scheduler.step()`` yourself, as in Paddle).
        parameters: what to optimise, read once: tensors (``model.parameters()``), (name, tensor) pairs
            (``model.named_parameters()``, which gives the names ``AdamW``'s ``apply_decay_param_fun``
            needs), or a list of param-group dicts with key ``'params'`` and optionally
            ``'weight_decay'`` and ``'learning_rate'`` (a multiplier of the global learning rate).
            None: collected at the first ``minimize(loss)`` from the loss's autograd graph.
        weight_decay: L2 coefficient (float); None means 0.
        grad_clip: a callable applied to the list of parameters that have a gradient before each update,
            e.g. ``sampan.nn.ClipGradByGlobalNorm(1.0)``.
    """

    def __init__(
        self,
        learning_rate: float | LRScheduler,
        parameters: ParametersLike | None = None,
        weight_decay: float | None = None,
        grad_clip: GradClip | None = None,
    ) -> None:
        if not isinstance(learning_rate, LRScheduler):
            learning_rate = check_non_negative("learning_rate", learning_rate)
        self._learning_rate: float | LRScheduler = learning_rate
        self._weight_decay = 0.0 if weight_decay is None else check_non_negative("weight_decay", weight_decay)
        if grad_clip is not None and not callable(grad_clip):
            raise TypeError(
                f"grad_clip must be callable (e.g. ClipGradByGlobalNorm), got {type(grad_clip).__name__}"
            )
        self._grad_clip = grad_clip
        self._inner: torch.optim.Optimizer | None = None
        if parameters is not None:
            self._build(parse_parameters(parameters))

    def _create(self, param_groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
        """Build the torch optimizer; each group already carries its 'lr' and 'weight_decay'."""
        raise NotImplementedError(f"{type(self).__name__} must implement _create()")

    def _split_groups(self, groups: list[ParamGroup]) -> list[ParamGroup]:
        """Hook to regroup parameters before the torch optimizer is built (AdamW uses it)."""
        return groups

    def _build(self, groups: list[ParamGroup]) -> None:
        lr = self.get_lr()
        torch_groups = [
            {
                "params": group.params,
                "weight_decay": self._weight_decay if group.weight_decay is None else group.weight_decay,
                # torch keeps extra keys in param_groups and in state_dict(), so the multiplier
                # travels with checkpoints.
                "lr_mult": group.lr_mult,
                "lr": lr * group.lr_mult,
            }
            for group in self._split_groups(groups)
        ]
        self._inner = self._create(torch_groups)

    def _require_inner(self) -> torch.optim.Optimizer:
        if self._inner is None:
            raise RuntimeError(
                f"{type(self).__name__} has no parameters yet: pass parameters=model.parameters() when "
                "creating it, or call minimize(loss) to collect them from the loss's autograd graph"
            )
        return self._inner

    def _sync_lr(self) -> None:
        lr = self.get_lr()
        for group in self._require_inner().param_groups:
            group["lr"] = lr * group["lr_mult"]

    @property
    def grad_clip(self) -> GradClip | None:
        """The gradient clipper applied before every update (None: no clipping)."""
        return self._grad_clip

    @grad_clip.setter
    def grad_clip(self, value: GradClip | None) -> None:
        if value is not None and not callable(value):
            raise TypeError(f"grad_clip must be callable (e.g. ClipGradByGlobalNorm), got {type(value).__name__}")
        self._grad_clip = value

    def rebind_parameters(self, new_parameter: Callable[[Tensor], Tensor]) -> None:
        """Point the optimizer at new parameter objects, e.g. after a model was sharded.

        Tensor and data parallelism replace each parameter by a DTensor; ``new_parameter(old)``
        returns the replacement, or None for a parameter this rank no longer holds (another pipeline
        stage's). Only allowed before the first step (there is no state to move yet).
        """
        inner = self._inner
        if inner is None:
            return  # parameters are collected from the first loss, which will see the new ones
        if any(inner.state.values()):
            raise RuntimeError("rebind_parameters() must be called before the first optimizer step: "
                               "create the optimizer, then fleet.distributed_model, then train")
        kept = ("weight_decay", "lr_mult", "lr")
        groups = []
        for group in inner.param_groups:
            params = [q for q in (new_parameter(p) for p in group["params"]) if q is not None]
            if params:
                groups.append({"params": params, **{k: group[k] for k in kept}})
        if not groups:
            raise RuntimeError("rebind_parameters() left the optimizer with no parameters")
        self._inner = self._create(groups)

    @property
    def torch_optimizer(self) -> torch.optim.Optimizer:
        """The wrapped ``torch.optim.Optimizer`` (RuntimeError while parameters are not known yet)."""
        return self._require_inner()

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The torch optimizer's param groups: 'lr' is the global LR times the group's 'lr_mult'."""
        return self._require_inner().param_groups

    def get_lr(self) -> float:
        """The current global learning rate (the scheduler's current value when there is one)."""
        if isinstance(self._learning_rate, LRScheduler):
            return self._learning_rate()
        return self._learning_rate

    def set_lr(self, value: float) -> None:
        """Set a float learning rate; not allowed when the learning rate is an ``LRScheduler``."""
        if isinstance(self._learning_rate, LRScheduler):
            raise RuntimeError(
                "set_lr() cannot be used when learning_rate is an LRScheduler: step or change the scheduler"
            )
        self._learning_rate = check_non_negative("learning_rate", value)
        if self._inner is not None:
            self._sync_lr()

    def step(self) -> None:
        """Clip gradients (if ``grad_clip``), then update the parameters at the current learning rate."""
        inner = self._require_inner()
        if self._grad_clip is not None:
            with_grad = [p for group in inner.param_groups for p in group["params"] if p.grad is not None]
            if with_grad:
                self._grad_clip(with_grad)
        self._sync_lr()
        inner.step()

    def clear_grad(self, set_to_zero: bool = False) -> None:
        """Drop the gradients (set them to None), or zero them in place with ``set_to_zero=True``.

        Unlike Paddle (which zeroes by default), sampan drops them by default, as torch does: the
        next backward then writes fresh gradients instead of adding into a zeroed buffer, which
        skips one pass over every gradient (measured: ~4% of a small GPT training step on CPU).
        """
        if self._inner is not None:
            self._inner.zero_grad(set_to_none=not set_to_zero)

    def minimize(self, loss: Tensor) -> None:
        """``loss.backward()``, ``step()``, ``clear_grad()``.

        Without ``parameters``, the first call takes the trainable leaf tensors that ``loss`` depends on
        as the parameters, and keeps them for later calls.
        """
        if not isinstance(loss, Tensor):
            raise TypeError(f"loss must be a torch.Tensor, got {type(loss).__name__}")
        if loss.grad_fn is None:
            raise ValueError(
                "loss has no autograd graph (grad_fn is None): it was computed under torch.no_grad(), "
                "from detached tensors, or only from tensors with requires_grad=False"
            )
        if self._inner is None:
            self._build(parse_parameters(trainable_leaves(loss)))
        loss.backward()
        self.step()
        self.clear_grad()

    def state_dict(self) -> dict[str, Any]:
        """The torch optimizer's state under 'optimizer', plus 'lr_scheduler' (the scheduler's state)
        or 'learning_rate' (the float LR)."""
        return {"optimizer": self._require_inner().state_dict(), **self.lr_state_dict()}

    def set_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a ``state_dict()`` from an optimizer built the same way (same parameters and groups)."""
        inner = self._require_inner()
        if "optimizer" not in state_dict:
            raise ValueError(f"state_dict keys {sorted(state_dict)} lack 'optimizer'; pass what state_dict() returned")
        self._check_lr_keys(set(state_dict) - {"optimizer"}, "state_dict", {"optimizer"})
        inner.load_state_dict(state_dict["optimizer"])
        self.set_lr_state_dict({k: v for k, v in state_dict.items() if k != "optimizer"})

    def lr_state_dict(self) -> dict[str, Any]:
        """The learning-rate part of ``state_dict()`` (plain JSON): ``{'lr_scheduler': ...}`` or
        ``{'learning_rate': float}``. Distributed checkpoints save it beside the DCP shards."""
        if isinstance(self._learning_rate, LRScheduler):
            return {"lr_scheduler": self._learning_rate.state_dict()}
        return {"learning_rate": self._learning_rate}

    def set_lr_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``lr_state_dict()``."""
        self._check_lr_keys(set(state), "lr state")
        if isinstance(self._learning_rate, LRScheduler):
            self._learning_rate.set_state_dict(state["lr_scheduler"])
        else:
            self._learning_rate = check_non_negative("learning_rate", state["learning_rate"])
        self._sync_lr()

    def _check_lr_keys(self, keys: set[str], what: str, also: frozenset[str] | set[str] = frozenset()) -> None:
        has_scheduler = isinstance(self._learning_rate, LRScheduler)
        expected = {"lr_scheduler" if has_scheduler else "learning_rate"}
        if keys != expected:
            kind = "an LRScheduler" if has_scheduler else "a float"
            raise ValueError(
                f"{what} keys {sorted(keys | also)} do not match this optimizer, whose learning_rate is "
                f"{kind}: expected {sorted(expected | also)}"
            )

    load_state_dict = set_state_dict
