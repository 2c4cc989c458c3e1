"""Reading a data build: memory-mapped token rows with their span flags."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sampan.io import Dataset
from sampan.text.build import load_manifest
from sampan.text.tokenizer import PAD_ID


class SpanShardDataset(Dataset):
    """The rows of a ``sampan data build`` for one split, across its corpora.

    Each item is ``{"input_ids": int64[seq_len], "span_flags": uint8[seq_len]}``, unmasked:
    masking happens per batch at training time (``sampan.pretraining``), so one build serves
    every masking level and schedule. Shards are memory-mapped; only rows read are paged in.

    Args:
        directory: the build directory (holds ``manifest.json``).
        split: "train" or "test" (the held-out documents).
        corpora: restrict to these corpora (default: every corpus in the build).
    """

    def __init__(self, directory: str | os.PathLike, split: str = "train", corpora: list[str] | None = None):
        self.directory = Path(directory)
        self.manifest = load_manifest(directory)
        self.seq_len = int(self.manifest["seq_len"])
        self.split = split
        built = [s for s in self.manifest["shards"] if s["split"] == split]
        if corpora is not None:
            missing = sorted(set(corpora) - {s["corpus"] for s in built})
            if missing:
                raise ValueError(f"{directory} has no {split} split of {missing}; it holds "
                                 f"{sorted({s['corpus'] for s in built})}")
            built = [s for s in built if s["corpus"] in corpora]
        self.shards = [s for s in built if s["rows"] > 0]
        if not self.shards:
            raise ValueError(f"{directory} holds no {split} rows"
                             + (f" for corpora {corpora}" if corpora else "") + "; rebuild with more documents")
        self._offsets = np.cumsum([0] + [s["rows"] for s in self.shards])
        self._maps: list[tuple[np.ndarray, np.ndarray]] | None = None

    def _open(self) -> list[tuple[np.ndarray, np.ndarray]]:
        if self._maps is None:
            maps = []
            for shard in self.shards:
                shape = (shard["rows"], self.seq_len)
                tokens = np.memmap(self.directory / shard["files"]["tokens"], dtype="<u2", mode="r", shape=shape)
                flags = np.memmap(self.directory / shard["files"]["spans"], dtype=np.uint8, mode="r", shape=shape)
                maps.append((tokens, flags))
            self._maps = maps
        return self._maps

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def row_lengths(self) -> np.ndarray:
        """Tokens before the padding of every row (``[CLS]`` and ``[SEP]`` included), in row order."""
        return np.concatenate([(tokens != PAD_ID).sum(axis=1) for tokens, _ in self._open()])

    def row(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """``(token ids, span flags)`` of row ``index`` as numpy arrays."""
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} out of range for {len(self)} rows")
        shard = int(np.searchsorted(self._offsets, index, side="right")) - 1
        tokens, flags = self._open()[shard]
        local = index - int(self._offsets[shard])
        return np.asarray(tokens[local], dtype=np.int64), np.array(flags[local], dtype=np.uint8)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids, flags = self.row(int(index))
        return {"input_ids": torch.from_numpy(ids), "span_flags": torch.from_numpy(flags)}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_maps"] = None  # a worker process reopens the memmaps
        return state
