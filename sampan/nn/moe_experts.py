"""The experts of an MoE block: all routed experts' SwiGLU weights in two stacked tensors, run on
tokens sorted by expert; and the shared-expert SwiGLU every token runs."""

from __future__ import annotations

import functools

import torch
from torch import nn

from sampan.nn.layer import Layer
from sampan.nn.mlp import ACTIVATIONS
from sampan.nn.moe_config import MoEConfig

BACKENDS = ("auto", "grouped_mm", "padded")


class GroupedExperts(Layer):
    """``gate_up_proj [E, 2f, h]`` (gate rows, then up rows) and ``down_proj [E, h, f]``.

    The layout is transformers 5's fused experts'. ``forward`` takes the token copies already
    sorted by expert and how many each expert gets; the number of experts is read from
    ``gate_up_proj.shape[0]`` at run time, so an expert-parallel shard holding ``E / ep`` of
    them runs this code unchanged.

    Two ways to run, the same numbers (a test holds them to each other):

    * ``grouped_mm``: ``torch._grouped_mm``, one kernel for all experts; it needs every row
      stride to be a multiple of 16 bytes (``h`` and ``f`` multiples of 4 in fp32, of 8 in bf16)
      and a torch that has it for the device and dtype (probed once per device and dtype);
    * ``padded``: the copies are scattered into an ``[E, max_count, h]`` buffer and run as two
      batched matmuls. It reads ``max_count`` from the counts, one host sync per call.

    ``backend`` (attribute, default "auto") picks: "auto" uses ``grouped_mm`` on accelerators
    where it works and ``padded`` elsewhere, the CPU included: torch 2.13's CPU ``_grouped_mm``
    took 2-4x the padded path's time for forward + backward at 16-64 experts, h 512, f 256, 2,048
    tokens (``benchmarks/moe_block.py`` records both). Set "grouped_mm" or "padded" to force one
    (forcing ``grouped_mm`` where it cannot run raises).
    """

    def __init__(self, config: MoEConfig):
        super().__init__()
        e, h, f = config.num_experts, config.hidden_size, config.expert_intermediate_size
        self.activation = config.activation
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * f, h))
        self.down_proj = nn.Parameter(torch.empty(e, h, f))
        self.backend = "auto"
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        """Normal(0, std) for both stacked weights."""
        nn.init.normal_(self.gate_up_proj, mean=0.0, std=std)
        nn.init.normal_(self.down_proj, mean=0.0, std=std)

    @property
    def num_local_experts(self) -> int:
        """Experts this module holds (all of them, or an expert-parallel shard's share)."""
        return self.gate_up_proj.shape[0]

    def forward(self, x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
        """``x [N, h]`` sorted by expert, ``num_tokens_per_expert [E_local]`` int64 summing to ``N``
        -> ``[N, h]``: each row through its expert's SwiGLU, not yet weighted."""
        if self.backend not in BACKENDS:
            raise ValueError(f"GroupedExperts.backend={self.backend!r} is not one of {list(BACKENDS)}")
        if num_tokens_per_expert.shape[0] != self.num_local_experts:
            raise ValueError(f"num_tokens_per_expert has {num_tokens_per_expert.shape[0]} entries but this "
                             f"module holds {self.num_local_experts} experts")
        x = x.contiguous()
        use_grouped = self.backend == "grouped_mm" or (
            self.backend == "auto" and x.device.type != "cpu" and self.grouped_mm_fits(x))
        if use_grouped:
            out = self._grouped_mm(x, num_tokens_per_expert)
        else:
            out = self._padded(x, num_tokens_per_expert)
        return _ContiguousGrad.apply(out)

    def grouped_mm_fits(self, x: torch.Tensor) -> bool:
        """Whether ``torch._grouped_mm`` runs on ``x``'s device and dtype at these widths."""
        f = self.down_proj.shape[-1]
        h = self.gate_up_proj.shape[-1]
        if x.dtype != self.gate_up_proj.dtype:
            return False
        if any(n * x.element_size() % 16 for n in (h, f)):
            return False
        return _grouped_mm_works(x.device.type, x.dtype)

    def _grouped_mm(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        # offs are the cumulative row ends, int32, as _grouped_mm wants them.
        offs = torch.cumsum(counts, dim=0).to(torch.int32)
        gate_up = torch._grouped_mm(x, self.gate_up_proj.transpose(-2, -1), offs=offs)
        hidden = self._swiglu(gate_up)
        return torch._grouped_mm(hidden, self.down_proj.transpose(-2, -1), offs=offs)

    def _padded(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        e, n = self.num_local_experts, x.shape[0]
        if torch.compiler.is_exporting():
            # ONNX has no repeat_interleave with a tensor of repeats: a row's expert is the number
            # of expert ends at or before it (the same numbers, [N, E] comparisons).
            ends = torch.cumsum(counts, dim=0)
            expert_of_row = (torch.arange(n, device=x.device).unsqueeze(1) >= ends).sum(dim=1)
        else:
            expert_of_row = torch.repeat_interleave(torch.arange(e, device=x.device), counts, output_size=n)
        starts = torch.cumsum(counts, dim=0) - counts
        slot = torch.arange(n, device=x.device) - starts[expert_of_row]
        # The one host sync of this path. Under torch.export it is an unbacked size, bounded here.
        capacity = counts.max().item() if counts.numel() else 0
        torch._check(capacity >= 0)
        torch._check(capacity <= n)
        buf = x.new_zeros(e, capacity, x.shape[1])
        buf = buf.index_put((expert_of_row, slot), x)
        gate_up = torch.bmm(buf, self.gate_up_proj.transpose(-2, -1).to(x.dtype))
        hidden = self._swiglu(gate_up)
        out = torch.bmm(hidden, self.down_proj.transpose(-2, -1).to(x.dtype))
        return out[expert_of_row, slot]

    def _swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return ACTIVATIONS[self.activation](gate) * up


class SharedExperts(Layer):
    """The SwiGLU MLP every token runs beside the routed experts: ``down(act(gate(x)) * up(x))``."""

    def __init__(self, hidden_size: int, intermediate_size: int, activation: str = "silu"):
        super().__init__()
        self.activation = activation
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(ACTIVATIONS[self.activation](self.gate_proj(x)) * self.up_proj(x))


class _ContiguousGrad(torch.autograd.Function):
    """Identity that hands its input a contiguous gradient: ``_grouped_mm``'s backward refuses
    the stride-0 gradient that ``out.sum().backward()`` produces."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def _grouped_mm_works(device_type: str, dtype: torch.dtype) -> bool:
    """Whether ``torch._grouped_mm`` runs (forward and backward) on this device type and dtype."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    if torch.compiler.is_compiling():
        # No probing while tracing. The op's meta kernel (what export and compile trace) takes
        # bf16 only, although the CPU kernel also runs fp32.
        return dtype == torch.bfloat16
    return _probe_grouped_mm(device_type, dtype)


@functools.cache
def _probe_grouped_mm(device_type: str, dtype: torch.dtype) -> bool:
    # A tiny aligned run, once per device type and dtype: torch versions differ in where the op
    # exists (the CPU kernel is recent; CUDA builds want sm90+ and bf16).
    # It may run inside a checkpointed forward (activation recompute), whose saved-tensor hooks
    # count what the forward saves: identity hooks on top keep the probe's tensors out of that
    # count (the replay, with the probe cached, would save fewer and fail).
    try:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            x = torch.randn(8, 16, device=device_type, dtype=dtype, requires_grad=True)
            w = torch.randn(2, 16, 16, device=device_type, dtype=dtype, requires_grad=True)
            offs = torch.tensor([3, 8], device=device_type, dtype=torch.int32)
            torch._grouped_mm(x, w, offs=offs).backward(torch.ones(8, 16, device=device_type, dtype=dtype))
        return True
    except (RuntimeError, NotImplementedError):
        return False
