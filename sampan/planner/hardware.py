"""The cluster a plan is for: named presets and explicit numbers.

Bandwidths are given in the units vendors quote, and converted here once:

* ``intra_node_gbps``: NVLink bandwidth per GPU in GB/s, both directions summed (A100: 600,
  H100/H200: 900, as NVIDIA's datasheets list it). One direction carries half.
* ``inter_node_gbps``: the network bandwidth per GPU in Gb/s (bits; one 200 Gb/s HDR or
  400 Gb/s NDR InfiniBand NIC per GPU in DGX-class nodes), one direction.

``link_efficiency`` is the share of that a large NCCL ring collective reaches (bus bandwidth over
link bandwidth); ``latency_*_us`` are the alpha terms of the alpha-beta model, per ring step.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Hardware:
    """One kind of accelerator and how the accelerators are connected."""

    name: str = "custom"
    gpus_per_node: int = 8
    memory_gb: float = 80.0
    """Usable device memory in GB (10^9 bytes), as sold."""
    tflops: float = 312.0
    """Peak dense bf16 TFLOP/s of one accelerator (the MFU denominator)."""
    intra_node_gbps: float = 600.0
    """NVLink GB/s per GPU, both directions summed."""
    inter_node_gbps: float = 200.0
    """Network Gb/s per GPU, one direction."""
    hbm_gbps: float = 2039.0
    """Device memory bandwidth in GB/s (prices the optimizer step)."""
    link_efficiency: float = 0.8
    latency_intra_us: float = 5.0
    latency_inter_us: float = 15.0
    matmul_efficiency: float = 0.56
    """Share of peak that the model's matmuls reach at large per-GPU shapes (calibrated; see docs/planner.md)."""

    def __post_init__(self) -> None:
        for name in ("gpus_per_node",):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"hardware {name} must be an integer >= 1, got {value!r}")
        for name in ("memory_gb", "tflops", "intra_node_gbps", "inter_node_gbps", "hbm_gbps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"hardware {name} must be a number > 0, got {value!r}")
        if not 0 < self.link_efficiency <= 1 or not 0 < self.matmul_efficiency <= 1:
            raise ValueError("hardware link_efficiency and matmul_efficiency must be in (0, 1]")

    # -- derived, in SI units -------------------------------------------------------------------
    @property
    def peak_flops(self) -> float:
        return self.tflops * 1e12

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9

    def link(self, crosses_nodes: bool) -> tuple[float, float]:
        """``(alpha seconds, bytes per second one way)`` of the slowest link a ring over a group uses."""
        if crosses_nodes:
            return self.latency_inter_us * 1e-6, self.inter_node_gbps / 8 * 1e9 * self.link_efficiency
        return self.latency_intra_us * 1e-6, self.intra_node_gbps / 2 * 1e9 * self.link_efficiency


# NVIDIA datasheet figures (SXM parts): dense bf16 tensor-core peak, HBM size and bandwidth, NVLink.
# Networks are the DGX reference designs: one 200 Gb/s HDR NIC per A100, one 400 Gb/s NDR NIC per H100/H200.
PRESETS: dict[str, Hardware] = {
    "a100-80g": Hardware("a100-80g", 8, 80.0, 312.0, 600.0, 200.0, 2039.0),
    "h100-80g": Hardware("h100-80g", 8, 80.0, 989.0, 900.0, 400.0, 3350.0),
    "h200": Hardware("h200", 8, 141.0, 989.0, 900.0, 400.0, 4800.0),
}


def get_hardware(preset: str | None = None, **overrides: float | int | None) -> Hardware:
    """A preset (default ``a100-80g``) with the explicit numbers that are not None applied."""
    name = preset or "a100-80g"
    if name not in PRESETS:
        raise ValueError(f"unknown hardware preset {name!r}; known: {', '.join(sorted(PRESETS))} "
                         "(or give --gpu-memory-gb / --gpu-tflops / --intra-node-gbps / --inter-node-gbps)")
    given = {k: v for k, v in overrides.items() if v is not None}
    fields = {f.name for f in dataclasses.fields(Hardware)}
    unknown = sorted(set(given) - fields)
    if unknown:
        raise ValueError(f"unknown hardware field(s) {unknown}; allowed: {sorted(fields)}")
    hw = dataclasses.replace(PRESETS[name], **given)
    if given and preset is None:
        hw = dataclasses.replace(hw, name="custom")
    return hw
