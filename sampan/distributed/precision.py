"""Pure-bf16 parameters (``amp_configs`` level "O2") through FSDP2's mixed precision.

At level O1 (``strategy.amp = "bf16"`` alone) the parameters stay fp32 and autocast casts each
weight to bf16 where a matmul reads it: the fp32 parameters, their bf16 copies and fp32 gradients
all sit in memory, and FSDP gathers fp32. At O2 FSDP2 holds the sharded fp32 parameters (the
master weights the optimizer updates, with fp32 state) and gathers bf16 copies for compute, so
the gathered parameters, their all-gathers and the activations between layers are bf16; the
gradients come out bf16 and are reduced in fp32 (``use_master_grad``) or in bf16.

``use_master_weight=False`` casts the parameters themselves to bf16 before sharding: the
optimizer then updates bf16 weights with bf16 state (6 bytes per parameter of model state
instead of 16, and updates rounded to bf16).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from sampan.distributed.strategy import DistributedStrategy


def mixed_precision_policy(strategy: DistributedStrategy) -> MixedPrecisionPolicy | None:
    """FSDP2's policy for the strategy's AMP level (None at O1 or without AMP: no casting by FSDP)."""
    if not strategy.pure_bf16:
        return None
    amp = strategy.amp_configs
    reduce = torch.float32 if amp.use_master_grad else torch.bfloat16
    if not amp.use_master_weight:  # the parameters are bf16 already (cast_parameters)
        return MixedPrecisionPolicy(param_dtype=None, reduce_dtype=reduce)
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce)


def cast_parameters(module: nn.Module, strategy: DistributedStrategy) -> None:
    """Without master weights (O2, ``use_master_weight=False``), hold the parameters in bf16."""
    if strategy.pure_bf16 and not strategy.amp_configs.use_master_weight:
        module.to(torch.bfloat16)
