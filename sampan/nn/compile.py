"""``torch.compile`` applied to a model from outside, one transformer block at a time.

Why per block and not the whole model: every block of a transformer has the same code, so dynamo
compiles it once and reuses the graph for all of them (compile time does not grow with depth),
and the blocks stay ordinary modules that recompute, tensor parallel and FSDP wrap as before.
This is torchtitan's recipe, and its order: recompute first (the compiled region then includes the
checkpoint, so the recomputed ops are fused as well), then compile, then FSDP / sharding, whose
hooks sit outside the compiled region.

Model code carries no compile logic; ``apply_compile(model, True)`` is the whole switch.
"""

from __future__ import annotations

from torch import nn

from sampan.nn.recompute import recompute_targets


def apply_compile(model: nn.Module, enabled: bool = True, **options) -> int:
    """Compile each transformer block of ``model`` in place (``nn.Module.compile``); returns how many.

    ``options`` go to ``torch.compile`` (``mode``, ``fullgraph``, ``dynamic``, ...). Idempotent:
    a block compiled already is left alone. State-dict keys do not change (the module is not
    wrapped, unlike ``torch.compile(module)``), so checkpoints load either way. Disabled: returns 0.
    """
    if not enabled:
        return 0
    blocks = recompute_targets(model)
    if not blocks:
        raise ValueError(f"compile found no transformer blocks in {type(model).__name__} (sampan TransformerBlocks, "
                         "or the elements of an nn.ModuleList): compile the model yourself with torch.compile")
    for block in blocks:
        if getattr(block, "_compiled_call_impl", None) is None:
            block.compile(**options)
    return len(blocks)


def is_compiled(module: nn.Module) -> bool:
    """Whether ``module`` (or any module inside it) runs through ``torch.compile``."""
    return any(getattr(m, "_compiled_call_impl", None) is not None for m in module.modules())
