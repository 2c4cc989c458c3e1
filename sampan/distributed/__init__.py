"""Hybrid-parallel training on torch.distributed: ``fleet``, ``DistributedStrategy``, the topology."""

from sampan.distributed import fleet
from sampan.distributed.strategy import DistributedStrategy
from sampan.distributed.topology import HybridCommunicateGroup

__all__ = ["DistributedStrategy", "HybridCommunicateGroup", "fleet"]
