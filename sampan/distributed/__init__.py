"""Hybrid-parallel training on torch.distributed: ``fleet``, ``DistributedStrategy``, the topology.

The names load on first use, so the package's plain-data parts (``launch.LaunchConfig``, which
``sampan launch --help`` reads) import without torch.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from sampan.distributed import fleet
    from sampan.distributed.strategy import DistributedStrategy
    from sampan.distributed.topology import HybridCommunicateGroup

_WHERE = {"DistributedStrategy": "sampan.distributed.strategy",
          "HybridCommunicateGroup": "sampan.distributed.topology"}


def __getattr__(name: str):
    if name == "fleet":  # a submodule: `from sampan.distributed import fleet`
        return importlib.import_module("sampan.distributed.fleet")
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sampan.distributed' has no attribute {name!r}")


__all__ = ["DistributedStrategy", "HybridCommunicateGroup", "fleet"]
