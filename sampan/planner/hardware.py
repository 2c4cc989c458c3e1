"""The cluster a plan is for: named presets and explicit numbers.

Bandwidths are given in the units vendors quote, and converted here once:

* ``intra_node_gbps``: NVLink bandwidth per GPU in GB/s, both directions summed (A100: 600,
  H100/H200: 900, as NVIDIA's datasheets list it). One direction carries half.
* ``host_gbps``: copies between device and host memory in GB/s, one direction, as pinned
  ``cudaMemcpyAsync`` reaches over the GPU's PCIe x16 link (about 80% of PCIe 4.0's 32 GB/s on
  A100, of PCIe 5.0's 64 GB/s on H100 / H200); what activation offload moves.
* ``inter_node_gbps``: the network bandwidth per GPU in Gb/s (bits; one 200 Gb/s HDR or
  400 Gb/s NDR InfiniBand NIC per GPU in DGX-class nodes), one direction.

``link_efficiency`` is the share of that a large NCCL ring collective reaches (bus bandwidth over
link bandwidth); ``latency_*_us`` are the alpha terms of the alpha-beta model, per ring step.

Compute runs at a share of peak that grows with the model's width ``h`` (:meth:`Hardware.efficiency`):
``efficiency_max * h / (h + efficiency_h0)``. Why this form: per token, a block's matmuls do
``~24 h^2`` FLOPs while its element-wise work (norms, GELU, bias, residual adds, softmax
statistics) moves ``~c h`` bytes and runs at memory speed, so the matmul share of the time is
``h / (h + h0)``. The two constants are fitted in ``benchmarks/planner.py`` on five rows of
Narayanan et al. 2021, Table 1 (A100), and checked on the other published runs; see
docs/planner.md. ``--matmul-efficiency`` replaces the curve by one constant.
"""

from __future__ import annotations

import dataclasses

# Fitted by benchmarks/planner.py (part "published": least squares in log throughput over its
# calibration rows); tests/test_planner_efficiency.py checks these equal benchmarks/results/planner.json.
EFFICIENCY_MAX = 0.7295501874219076
EFFICIENCY_H0 = 1119.0575355506635


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
    host_gbps: float = 25.0
    """Device-host copy bandwidth in GB/s, one direction (prices activation offload)."""
    link_efficiency: float = 0.8
    latency_intra_us: float = 5.0
    latency_inter_us: float = 15.0
    matmul_efficiency: float | None = None
    """A fixed share of peak for the model's FLOPs; None: the width curve (:meth:`efficiency`)."""
    efficiency_max: float = EFFICIENCY_MAX
    efficiency_h0: float = EFFICIENCY_H0
    fp8_tflops: float | None = None
    """Peak dense FP8 TFLOP/s (``Workload.fp8`` GEMMs); None: twice ``tflops``, as Hopper's datasheets
    list it (1,979 against 989)."""

    def __post_init__(self) -> None:
        for name in ("gpus_per_node",):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"hardware {name} must be an integer >= 1, got {value!r}")
        for name in ("memory_gb", "tflops", "intra_node_gbps", "inter_node_gbps", "hbm_gbps", "host_gbps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"hardware {name} must be a number > 0, got {value!r}")
        if not 0 < self.link_efficiency <= 1 or not 0 < self.efficiency_max <= 1:
            raise ValueError("hardware link_efficiency and efficiency_max must be in (0, 1]")
        if self.matmul_efficiency is not None and not 0 < self.matmul_efficiency <= 1:
            raise ValueError(f"matmul efficiency must be in (0, 1], got {self.matmul_efficiency!r}")
        if self.fp8_tflops is not None and (isinstance(self.fp8_tflops, bool) or self.fp8_tflops <= 0):
            raise ValueError(f"hardware fp8_tflops must be a number > 0 or None, got {self.fp8_tflops!r}")
        if self.efficiency_h0 < 0:
            raise ValueError(f"efficiency_h0 must be >= 0, got {self.efficiency_h0!r}")

    def efficiency(self, hidden: int) -> float:
        """Share of peak the FLOPs of a model of width ``hidden`` run at (see the module docstring)."""
        if self.matmul_efficiency is not None:
            return self.matmul_efficiency
        return self.efficiency_max * hidden / (hidden + self.efficiency_h0)

    # -- derived, in SI units -------------------------------------------------------------------
    @property
    def peak_flops(self) -> float:
        return self.tflops * 1e12

    @property
    def fp8_peak_flops(self) -> float:
        """Peak FP8 FLOP/s (twice the bf16 peak unless ``fp8_tflops`` says otherwise)."""
        return (self.fp8_tflops if self.fp8_tflops is not None else 2 * self.tflops) * 1e12

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
# H800 (the export H100): the H100 SXM's compute, HBM and PCIe, NVLink cut to 400 GB/s; its network is
# DeepSeek-V3's cluster as the paper describes it (one 400 Gb/s = 50 GB/s InfiniBand NIC per GPU; the
# paper measures 160 GB/s NVLink and 50 GB/s IB, which 0.8 link efficiency turns 400 / 400 into: 160 / 40).
PRESETS: dict[str, Hardware] = {
    "a100-80g": Hardware("a100-80g", 8, 80.0, 312.0, 600.0, 200.0, 2039.0),
    "h100-80g": Hardware("h100-80g", 8, 80.0, 989.0, 900.0, 400.0, 3350.0, host_gbps=50.0),
    "h200": Hardware("h200", 8, 141.0, 989.0, 900.0, 400.0, 4800.0, host_gbps=50.0),
    "h800-80g": Hardware("h800-80g", 8, 80.0, 989.0, 400.0, 400.0, 3350.0, host_gbps=50.0),
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
