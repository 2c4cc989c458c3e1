"""Optimizers with Paddle's API (``learning_rate=``, ``parameters=``, ``grad_clip=``, ``minimize``,
``clear_grad``) over ``torch.optim``, and LR schedules in ``sampan.optimizer.lr``."""

from sampan.optimizer import lr
from sampan.optimizer.adam import Adam, AdamW
from sampan.optimizer.optimizer import Optimizer
from sampan.optimizer.sgd import SGD, Momentum

__all__ = ["Optimizer", "SGD", "Momentum", "Adam", "AdamW", "lr"]
