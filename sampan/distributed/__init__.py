"""Hybrid-parallel training on torch.distributed: ``fleet``, ``DistributedStrategy``, the topology.

The names load on first use, so the package's plain-data parts (``launch.LaunchConfig``, which
``sampan launch --help`` reads) import without torch.
"""

from typing import TYPE_CHECKING

from sampan.utils.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from sampan.distributed import fleet
    from sampan.distributed.strategy import DistributedStrategy
    from sampan.distributed.topology import HybridCommunicateGroup

__getattr__ = lazy_exports(__name__, {"fleet": "sampan.distributed.fleet",
                                      "DistributedStrategy": "sampan.distributed.strategy",
                                      "HybridCommunicateGroup": "sampan.distributed.topology"})

__all__ = ["DistributedStrategy", "HybridCommunicateGroup", "fleet"]
