"""Packing encoded conversations into rows of ``max_length`` tokens, and the batches the model takes.

A packed row holds several conversations back to back. Each carries its own ``segment_ids``
(one number per conversation in the row) and ``position_ids`` restarting at 0, and the model turns
the segment ids into a block-diagonal causal mask (``sampan.nn.attention.build_segment_mask``):
no token sees another conversation, and every conversation computes what it computes alone. Each
conversation's first label is -100, so no conversation predicts the next one's first token; the
loss is then the mean over the assistant tokens of the batch, the same as unpacked.

Rows are filled best-fit decreasing (longest first, each into the fullest row it still fits),
which leaves rows nearly full; ``PaddedDataset`` is the unpacked alternative (one conversation
per row, padded per batch to its longest, as Hugging Face's collators pad).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import torch

from sampan.finetune.chat_encoding import IGNORE, EncodedChat

PAD_SEGMENT = -1  # the segment id of padding after a packed row's last conversation


def pack_lengths(lengths: Sequence[int], max_length: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped into rows whose lengths sum to at most ``max_length``
    (best-fit decreasing; deterministic). A length over ``max_length`` is an error."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (room left, row index), sorted: the fullest row that fits is the first >= n
    for i in order:
        n = lengths[i]
        if n > max_length:
            raise ValueError(f"sequence {i} has {n} tokens, more than a packed row's {max_length}")
        k = bisect.bisect_left(free, (n, -1))
        if k < len(free):
            room, row = free.pop(k)
            rows[row].append(i)
            room -= n
        else:
            rows.append([i])
            row, room = len(rows) - 1, max_length - n
        if room > 0:
            bisect.insort(free, (room, row))
    return rows


class PackedDataset:
    """Rows of packed conversations; item ``i`` is a dict of 1-D tensors: ``input_ids``, ``labels``,
    ``position_ids`` (restarting per conversation) and ``segment_ids`` (0, 1, ... per conversation).
    ``lengths`` (tokens per row) lets the Trainer group rows of similar length."""

    def __init__(self, sequences: Sequence[EncodedChat], max_length: int):
        self.rows = [[sequences[i] for i in row] for row in pack_lengths([len(s) for s in sequences], max_length)]
        self.lengths = [sum(len(s) for s in row) for row in self.rows]
        self.max_length = max_length

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids, labels, positions, segments = [], [], [], []
        for k, seq in enumerate(self.rows[index]):
            ids += seq.input_ids
            labels += [IGNORE, *seq.labels[1:]]  # never predicted from the previous conversation's last token
            positions += range(len(seq))
            segments += [k] * len(seq)
        return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels),
                "position_ids": torch.tensor(positions), "segment_ids": torch.tensor(segments)}

    def fill(self) -> float:
        """The share of the row slots that hold real tokens (1.0: no padding at all)."""
        return sum(self.lengths) / max(1, len(self.rows) * self.max_length)


class PaddedDataset:
    """One conversation per row (unpacked): ``input_ids`` and ``labels``, with ``lengths``."""

    def __init__(self, sequences: Sequence[EncodedChat]):
        self.sequences = list(sequences)
        self.lengths = [len(s) for s in self.sequences]

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        seq = self.sequences[index]
        return {"input_ids": torch.tensor(seq.input_ids), "labels": torch.tensor(seq.labels)}


class ChatCollator:
    """Pads a list of rows (packed or not) to the longest in the batch, on the right.

    Padding gets ``pad_id`` as input, -100 as label and 0 in ``attention_mask`` (so the Trainer
    counts real tokens); packed rows also get ``PAD_SEGMENT`` and position 0 there. ``pad_to``
    pads every batch to that length instead (a fleet strategy concatenates micro-batches, which
    must then share one length).
    """

    def __init__(self, pad_id: int = 0, pad_to: int | None = None):
        self.pad_id, self.pad_to = pad_id, pad_to

    def __call__(self, rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        longest = max(len(row["input_ids"]) for row in rows)
        if self.pad_to is not None:
            if longest > self.pad_to:
                raise ValueError(f"a row of {longest} tokens is longer than pad_to={self.pad_to}")
            longest = self.pad_to
        fills = {"input_ids": self.pad_id, "labels": IGNORE, "position_ids": 0, "segment_ids": PAD_SEGMENT}
        batch: dict[str, torch.Tensor] = {}
        for key in rows[0]:
            batch[key] = torch.full((len(rows), longest), fills[key], dtype=torch.long)
        mask = torch.zeros(len(rows), longest, dtype=torch.long)
        for r, row in enumerate(rows):
            n = len(row["input_ids"])
            for key, value in row.items():
                batch[key][r, :n] = value
            mask[r, :n] = 1
        batch["attention_mask"] = mask
        return batch
