"""Next-token logits for a batch of growing sequences: the one interface a generation loop drives.

A decoder is started on the prompts and then fed one token per row at a time; each call returns the
next-token logits of every row still in the batch (``float32 [rows, vocab]``, numpy). Three kinds:

- :class:`GraphDecoder`: an export's prefill and one-step decode graphs (``prefill/``, ``decode/``,
  written by ``sampan.inference.export_pretrained``), the KV cache passed from one call to the
  next as arrays: O(n) per new token. Runs on ONNX Runtime or the ``.pt2``, without torch for
  ONNX Runtime.
- :class:`EagerDecoder`: the torch model with ``sampan.nn.KVCache``: the same work in eager mode.
- :class:`FullWindowDecoder`: an export's full-window graph (``input_ids -> logits [B, S, V]``) run
  on every row's whole sequence at each step, as exports without decode graphs must: O(n^2).

Rows are left-padded (with an ``attention_mask``) in the cached decoders, so every row's newest
token sits in the last column; the full-window one right-pads and reads each row at its own end.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

# The subdirectories of an inference directory that hold a causal LM's decode graphs.
PREFILL_DIR = "prefill"
DECODE_DIR = "decode"


def has_decode_graphs(directory: str | Path) -> bool:
    """Whether the inference directory ``directory`` holds a prefill and a decode graph."""
    root = Path(directory)
    return all((root / sub / "inference.json").is_file() for sub in (PREFILL_DIR, DECODE_DIR))


class Decoder(Protocol):
    """What a generation loop needs from a model (see the module docstring)."""

    max_positions: int | None  # the longest sequence (prompt + new tokens) it takes; None: no limit known

    def start(self, prompts: Sequence[Sequence[int]]) -> np.ndarray:
        """Begin a batch: the next-token logits ``[len(prompts), V]`` after each prompt."""

    def advance(self, tokens: np.ndarray) -> np.ndarray:
        """Append ``tokens [rows]`` (one per row still in the batch); the next logits ``[rows, V]``."""

    def keep(self, rows: np.ndarray) -> None:
        """Keep only the rows at positions ``rows`` (in that order); the others are finished."""


def _check_prompts(prompts: Sequence[Sequence[int]]) -> None:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token (and there must be at least one prompt)")


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, attention_mask)`` int64 ``[b, longest]``: each prompt at the right end of its row."""
    _check_prompts(prompts)
    width = max(len(p) for p in prompts)
    ids = np.full((len(prompts), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(prompts), width), dtype=np.int64)
    for i, prompt in enumerate(prompts):
        ids[i, width - len(prompt):] = prompt
        mask[i, width - len(prompt):] = 1
    return ids, mask


class GraphDecoder:
    """Prefill and decode graphs, each a :class:`~sampan.inference.Predictor`; the cache travels
    between calls as the graphs' ``present.*`` outputs fed back as ``past_key_values.*``."""

    def __init__(self, prefill: Any, decode: Any, pad_id: int = 0, max_positions: int | None = None):
        self.prefill, self.decode = prefill, decode
        self.pad_id = pad_id
        self.max_positions = max_positions
        self._mask: np.ndarray | None = None
        self._cache: list[np.ndarray] = []

    @classmethod
    def open(cls, config: Any, pad_id: int | None = None) -> GraphDecoder:
        """The decode graphs of the inference directory ``config.model_dir``, on ``config``'s backend,
        device, precision and threads (a :class:`~sampan.inference.Config`)."""
        import dataclasses

        from sampan.inference.predictor import create_predictor

        root = Path(config.model_dir)
        if not has_decode_graphs(root):
            raise FileNotFoundError(f"{root} has no decode graphs ({PREFILL_DIR}/ and {DECODE_DIR}/): it was exported "
                                    "before sampan wrote them; export it again (sampan export --overwrite, or "
                                    "export_pretrained(..., overwrite=True)) for O(n) generation")
        predictors = [create_predictor(dataclasses.replace(config, model_dir=root / sub))
                      for sub in (PREFILL_DIR, DECODE_DIR)]
        model_config = model_config_of(config)
        if pad_id is None:
            pad_id = model_config.get("pad_token_id") or 0
        return cls(*predictors, pad_id=pad_id, max_positions=model_config.get("max_position_embeddings"))

    def start(self, prompts: Sequence[Sequence[int]]) -> np.ndarray:
        ids, mask = left_pad(prompts, self.pad_id)
        out = self.prefill.run({"input_ids": ids, "attention_mask": mask})
        self._mask, self._cache = mask, out[1:]
        return out[0]

    def advance(self, tokens: np.ndarray) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1, 1)
        self._mask = np.concatenate([self._mask, np.ones_like(tokens)], axis=1)
        out = self.decode.run([tokens, self._mask, *self._cache])
        self._cache = out[1:]
        return out[0]

    def keep(self, rows: np.ndarray) -> None:
        self._mask = self._mask[rows]
        self._cache = [c[rows] for c in self._cache]


class FullWindowDecoder:
    """A full-window graph (``input_ids [B, S] -> logits [B, S, V]``) run on every row's whole
    sequence (the last ``max_positions`` tokens when longer) at every step; rows are right-padded,
    which a causal model never reads before a row's end."""

    def __init__(self, predictor: Any, pad_id: int = 0, max_positions: int | None = None):
        self.predictor = predictor
        self.pad_id = pad_id
        self.max_positions = max_positions
        self._rows: list[list[int]] = []

    def _logits(self) -> np.ndarray:
        rows = [r[-self.max_positions:] if self.max_positions else r for r in self._rows]
        width = max(len(r) for r in rows)
        ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
        (logits,) = self.predictor.run({"input_ids": ids})
        return logits[np.arange(len(rows)), [len(r) - 1 for r in rows]]

    def start(self, prompts: Sequence[Sequence[int]]) -> np.ndarray:
        _check_prompts(prompts)
        self._rows = [list(p) for p in prompts]
        return self._logits()

    def advance(self, tokens: np.ndarray) -> np.ndarray:
        for row, token in zip(self._rows, np.asarray(tokens).reshape(-1).tolist(), strict=True):
            row.append(int(token))
        return self._logits()

    def keep(self, rows: np.ndarray) -> None:
        self._rows = [self._rows[i] for i in np.asarray(rows).tolist()]


class EagerDecoder:
    """The torch model itself, with a ``sampan.nn.KVCache`` (its preallocated buffer grows by
    doubling): what the decode graphs compute, run eagerly. Logits come back as float32 numpy."""

    def __init__(self, model: Any, pad_id: int | None = None):
        self.model = model
        config = model.config
        self.pad_id = pad_id if pad_id is not None else (config.pad_token_id or 0)
        self.max_positions = config.max_position_embeddings
        self._cache = None
        self._mask = None

    def _run(self, ids: Any) -> np.ndarray:
        import torch

        with torch.inference_mode():
            logits = self.model(ids, attention_mask=self._mask, kv_cache=self._cache)
        return logits[:, -1].float().cpu().numpy()

    def start(self, prompts: Sequence[Sequence[int]]) -> np.ndarray:
        import torch

        from sampan.nn.kv_cache import KVCache

        ids, mask = left_pad(prompts, self.pad_id)
        device = next(self.model.parameters()).device
        self.model.eval()
        self._cache = KVCache(self.model.config.num_layers)
        self._mask = torch.from_numpy(mask).to(device)
        return self._run(torch.from_numpy(ids).to(device))

    def advance(self, tokens: np.ndarray) -> np.ndarray:
        import torch

        step = torch.as_tensor(np.asarray(tokens, dtype=np.int64).reshape(-1, 1), device=self._mask.device)
        self._mask = torch.cat([self._mask, torch.ones_like(step)], dim=1)
        return self._run(step)

    def keep(self, rows: np.ndarray) -> None:
        import torch

        index = torch.as_tensor(np.asarray(rows, dtype=np.int64), device=self._mask.device)
        self._mask = self._mask.index_select(0, index)
        self._cache.reorder(index)


def model_config_of(config: Any) -> dict[str, Any]:
    """The model config ``export_pretrained`` recorded in the directory's ``inference.json``
    (``sampan_model.config``); empty for an export that did not record one."""
    return ((config.meta().get("sampan_model") or {}).get("config")) or {}
