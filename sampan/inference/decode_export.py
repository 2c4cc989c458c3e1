"""A causal LM's prefill and one-step decode graphs: generation in O(n) per new token from an export.

``export_decode_graphs(model, out_dir)`` writes two inference directories beside the full-window
graph (``sampan.inference.export_pretrained`` calls it for every causal LM):

- ``prefill/``: ``(input_ids [B, S], attention_mask [B, S]) -> (logits [B, V], present.{i}.key,
  present.{i}.value ...)``: the prompt, left-padded, in one pass;
- ``decode/``: ``(input_ids [B, 1], attention_mask [B, P + 1], past_key_values.{i}.key,
  past_key_values.{i}.value ...) -> (logits [B, V], present.{i}.key, present.{i}.value ...)``: one
  new token per row over the cache.

The cache tensors are ``[B, kv_heads, P, head_dim]`` (ONNX ``past_key_values`` / ``present``
naming, as Hugging Face's exporters use); batch, prompt and past lengths are dynamic. ``logits``
are the next-token logits of each row's last position only (the language-model head runs on one
position per row, not on the whole prompt's). Inside the graphs the model runs on a
``sampan.nn.kv_cache.FunctionalKVCache`` (tensors in, tensors out), so the model code is the one
eager generation runs, with no export special case. Before they are kept, both graphs are run on
both backends for a few decoding steps (batch 1 and a left-padded batch of 3) and must give the
eager model's logits within 1e-4.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from sampan.inference.decoders import DECODE_DIR, PREFILL_DIR
from sampan.inference.export import export_model
from sampan.nn.kv_cache import FunctionalKVCache
from sampan.static import InputSpec

# (batch, prompt length, decoding steps) the graphs are checked on; the last row of a batch > 1 is
# left-padded to half the length, as a batch of unequal prompts is.
VERIFY_CASES = ((1, 5, 3), (3, 9, 3))
VERIFY_TOLERANCE = 1e-4


def cache_names(num_layers: int, prefix: str) -> list[str]:
    """``prefix.{i}.key``, ``prefix.{i}.value`` for each layer, in graph order (``past_key_values`` / ``present``)."""
    return [f"{prefix}.{i}.{kind}" for i in range(num_layers) for kind in ("key", "value")]


class CausalLMPrefill(nn.Module):
    """A causal LM as ``(input_ids, attention_mask) -> (last-position logits, *present)``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.num_layers = model.config.num_layers

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cache = FunctionalKVCache(self.num_layers)
        logits = self.model(input_ids, attention_mask=attention_mask, kv_cache=cache)
        return (logits[:, -1], *cache.flat_present())


class CausalLMDecode(nn.Module):
    """A causal LM as ``(input_ids [B, 1], attention_mask, *past) -> (logits, *present)``; ``past``
    is ``key_0, value_0, key_1, value_1, ...``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.num_layers = model.config.num_layers

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                *past_key_values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pairs = [(past_key_values[2 * i], past_key_values[2 * i + 1]) for i in range(self.num_layers)]
        cache = FunctionalKVCache(self.num_layers, pairs)
        logits = self.model(input_ids, attention_mask=attention_mask, kv_cache=cache)
        return (logits[:, -1], *cache.flat_present())


def _examples(model: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Example inputs of both graphs: a left-padded batch of 2 prompts of 3, then one step. The
    prefill run on them also shows the cache's shape (KV heads, head size) without reading the
    family's config."""
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (2, 3), generator=generator)
    mask = torch.ones(2, 3, dtype=torch.int64)
    mask[1, 0] = 0
    with torch.no_grad():
        present = CausalLMPrefill(model)(ids, mask)[1:]
    step = torch.randint(1, vocab, (2, 1), generator=generator)
    return [ids, mask], [step, torch.cat([mask, torch.ones(2, 1, dtype=torch.int64)], dim=1), *present]


def _specs(present: list[torch.Tensor], num_layers: int) -> tuple[list[InputSpec], list[InputSpec]]:
    mask = InputSpec([None, None], "int64", "attention_mask")
    prefill = [InputSpec([None, None], "int64", "input_ids"), mask]
    past = [InputSpec([None, t.shape[1], None, t.shape[3]], "float32", name)
            for t, name in zip(present, cache_names(num_layers, "past_key_values"), strict=True)]
    return prefill, [InputSpec([None, 1], "int64", "input_ids"), mask, *past]


def _verification_steps(model: nn.Module) -> list[tuple[np.ndarray, np.ndarray, list[np.ndarray]]]:
    """Per case: the prompt ids, its mask, and the tokens fed at each decoding step."""
    generator = np.random.default_rng(0)
    vocab = model.config.vocab_size
    cases = []
    for batch, length, steps in VERIFY_CASES:
        length = min(length, model.config.max_position_embeddings - steps)
        ids = generator.integers(1, vocab, (batch, length), dtype=np.int64)
        mask = np.ones((batch, length), dtype=np.int64)
        if batch > 1:
            mask[-1, : length // 2] = 0
        cases.append((ids, mask, [generator.integers(1, vocab, (batch, 1), dtype=np.int64) for _ in range(steps)]))
    return cases


def verify_decode_graphs(directory: Path, model: nn.Module, devices: dict[str, str] | None = None) -> None:
    """Run ``directory``'s prefill and decode graphs on both backends for a few steps and compare
    each step's logits with the eager model's full forward; raise ``RuntimeError`` naming the first
    difference over the tolerance."""
    from sampan.inference.config import Config
    from sampan.inference.predictor import create_predictor

    devices = devices or {"torch": "cpu", "onnxruntime": "cpu"}
    backends = ["torch"] + (["onnxruntime"] if (directory / PREFILL_DIR / "inference.onnx").is_file() else [])
    for backend in backends:
        prefill = create_predictor(Config(directory / PREFILL_DIR, backend=backend, device=devices[backend]))
        decode = create_predictor(Config(directory / DECODE_DIR, backend=backend, device=devices[backend]))
        for ids, mask, steps in _verification_steps(model):
            out = prefill.run({"input_ids": ids, "attention_mask": mask})
            logits, cache = out[0], out[1:]
            for step, token in enumerate([None, *steps]):
                if token is not None:
                    ids = np.concatenate([ids, token], axis=1)
                    mask = np.concatenate([mask, np.ones_like(token)], axis=1)
                    out = decode.run([token, mask, *cache])
                    logits, cache = out[0], out[1:]
                with torch.no_grad():
                    expected = model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))[:, -1].numpy()
                diff = float(np.abs(logits - expected).max()) if logits.shape == expected.shape else float("inf")
                if not diff <= VERIFY_TOLERANCE * max(1.0, float(np.abs(expected).max())):
                    graph = "prefill" if token is None else f"decode step {step}"
                    raise RuntimeError(f"the exported {backend} {graph} graph on {devices[backend]} differs from the "
                                       f"eager model for a batch of {ids.shape[0]} at length {ids.shape[1]}: max "
                                       f"|diff| {diff:.3g} (shape {list(logits.shape)} vs {list(expected.shape)}); "
                                       "the export is not kept")


def export_decode_graphs(model: nn.Module, out_dir: str | os.PathLike[str], *, verify: bool = True,
                         devices: dict[str, str] | None = None) -> dict[str, Any]:
    """Write ``out_dir/prefill`` and ``out_dir/decode`` (each an inference directory) for the causal
    LM ``model`` (float32, on the CPU, in eval mode: ``export_pretrained`` hands it over so), then
    check them (``verify_decode_graphs``) unless ``verify=False``. Returns what ``inference.json``
    records about them: ``{"prefill": "prefill", "decode": "decode", "num_layers": L, "kv_heads": H,
    "head_dim": D}``.
    """
    if getattr(type(model), "head", None) != "causal_lm":
        raise TypeError(f"decode graphs are for causal language models, got {type(model).__name__}")
    out = Path(out_dir)
    num_layers = model.config.num_layers
    prefill_examples, decode_examples = _examples(model)
    prefill_specs, decode_specs = _specs(decode_examples[2:], num_layers)
    outputs = ["logits", *cache_names(num_layers, "present")]
    export_model(CausalLMPrefill(model), out / PREFILL_DIR, prefill_specs, output_names=outputs,
                 examples=prefill_examples, overwrite=True)
    export_model(CausalLMDecode(model), out / DECODE_DIR, decode_specs, output_names=outputs,
                 examples=decode_examples, overwrite=True)
    if verify:
        verify_decode_graphs(out, model, devices)
    key = decode_examples[2]
    return {"prefill": PREFILL_DIR, "decode": DECODE_DIR, "num_layers": num_layers,
            "kv_heads": int(key.shape[1]), "head_dim": int(key.shape[3])}
