"""``RowKVCache``: one KV cache for a batch whose rows have different lengths and come and go.

Continuous batching needs rows that join (after their own prefill) and leave (when they finish)
between decode steps. The scheme here is the one the eager models already understand for a
left-padded batch: every row's keys are *right-aligned* in one ``[rows, kv_heads, columns,
head_dim]`` buffer per layer, the columns before a row's first real token are padding, and an
attention mask ``[rows, columns]`` marks the real ones. A decode step feeds one token per row,
``position_ids`` = each row's real length, and the mask with one new column; the model's own
attention path (SDPA with a boolean mask) then ignores each row's padding exactly.

Why this scheme and not paged or per-row caches: it needs no change in the model (the cache is
duck-typed to ``sampan.nn.KVCache``: ``seq_len`` and ``update``), every step is one batched
forward over all rows, and the padding it wastes is bounded: leading columns that are padding for
every row are trimmed whenever a row leaves. The price is a copy of the buffers when a row joins
or leaves (not per step: a step writes one column in place into a buffer that grows by doubling).
"""

from __future__ import annotations

import torch


class RowKVCache:
    """Right-aligned per-row keys / values with a padding mask (see the module docstring).

    Columns ``[start, end)`` of each buffer are live; a row's real tokens are its last
    ``lengths[row]`` live columns. ``update`` (called by the model, layer by layer) writes new
    columns at ``end``; :meth:`open_columns` must be called first, once per forward.
    """

    def __init__(self, num_layers: int):
        self.num_layers = num_layers
        self._keys: list[torch.Tensor | None] = [None] * num_layers
        self._values: list[torch.Tensor | None] = [None] * num_layers
        self._mask: torch.Tensor | None = None  # [rows, capacity] bool
        self.start = 0
        self.end = 0
        self._written = [0] * num_layers  # columns each layer has written this forward
        self.lengths = torch.zeros(0, dtype=torch.long)

    @property
    def rows(self) -> int:
        return int(self.lengths.shape[0])

    # -- what the model calls ---------------------------------------------------------------------
    def seq_len(self, layer_idx: int = 0) -> int:
        """Live columns before the current forward (padding included): the model's ``past``."""
        return self.end - self.start

    def update(self, layer_idx: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this forward's ``key`` / ``value`` ``[rows, h, new, d]`` and return the live columns."""
        new = key.shape[2]
        if self._keys[layer_idx] is None or self._keys[layer_idx].shape[2] < self.end + new:
            self._grow(layer_idx, key, value, self.end + new)
        k_buf, v_buf = self._keys[layer_idx], self._values[layer_idx]
        k_buf[:, :, self.end:self.end + new] = key
        v_buf[:, :, self.end:self.end + new] = value
        self._written[layer_idx] = new
        return k_buf[:, :, self.start:self.end + new], v_buf[:, :, self.start:self.end + new]

    # -- what the engine calls --------------------------------------------------------------------
    def open_columns(self, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Before a forward of ``real.shape[1]`` new columns (``real [rows, new]``: 1 = a real token):
        the attention mask over live + new columns and the new tokens' positions."""
        new = real.shape[1]
        self._ensure_mask(self.end + new, real.device)
        assert self._mask is not None
        self._mask[:, self.end:self.end + new] = real.bool()
        positions = self.lengths[:, None] + (real.long().cumsum(1) - 1).clamp(min=0)
        return self._mask[:, self.start:self.end + new], positions

    def close_columns(self, real: torch.Tensor) -> None:
        """After the forward: the new columns become live."""
        new = real.shape[1]
        if any(w != new for w in self._written):
            raise RuntimeError(f"the model wrote {self._written} columns per layer, expected {new} in every layer")
        self.end += new
        self.lengths = self.lengths + real.long().sum(1)
        self._written = [0] * self.num_layers

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in that order): finished or cancelled rows leave. Leading columns that
        are padding in every remaining row are dropped."""
        if not rows:
            self.__init__(self.num_layers)
            return
        index = torch.tensor(rows, dtype=torch.long, device=self.lengths.device)
        self.lengths = self.lengths.index_select(0, index)
        width = int(self.lengths.max())
        start = self.end - width  # right-aligned: the longest row starts here
        for i in range(self.num_layers):
            if self._keys[i] is not None:
                self._keys[i] = self._keys[i].index_select(0, index.to(self._keys[i].device))
                self._values[i] = self._values[i].index_select(0, index.to(self._values[i].device))
        assert self._mask is not None
        self._mask = self._mask.index_select(0, index.to(self._mask.device))
        self.start = start

    def merge(self, other: RowKVCache) -> None:
        """Append ``other``'s rows (a prefill of newcomers) after this cache's rows."""
        if other.rows == 0:
            return
        if self.rows == 0:
            self.__dict__.update(other.__dict__)
            return
        width = max(self.end - self.start, other.end - other.start)
        # One fresh buffer holding both, right-aligned at `width`, with room for the next steps.
        capacity = width + max(16, width // 2)
        for i in range(self.num_layers):
            self._keys[i] = _stack_right(self._keys[i], self.start, self.end, other._keys[i], other.start,
                                         other.end, width, capacity)
            self._values[i] = _stack_right(self._values[i], self.start, self.end, other._values[i], other.start,
                                           other.end, width, capacity)
        assert self._mask is not None and other._mask is not None
        self._mask = _stack_right(self._mask, self.start, self.end, other._mask, other.start, other.end, width,
                                  capacity)
        self.start, self.end = 0, width
        self.lengths = torch.cat([self.lengths, other.lengths])

    # -- storage ----------------------------------------------------------------------------------
    def _grow(self, layer_idx: int, key: torch.Tensor, value: torch.Tensor, needed: int) -> None:
        old_k, old_v = self._keys[layer_idx], self._values[layer_idx]
        capacity = max(needed, 2 * (old_k.shape[2] if old_k is not None else 0), 16)
        new_k = key.new_zeros(key.shape[0], key.shape[1], capacity, key.shape[3])
        new_v = value.new_zeros(value.shape[0], value.shape[1], capacity, value.shape[3])
        if old_k is not None and self.end > self.start:
            new_k[:, :, self.start:self.end] = old_k[:, :, self.start:self.end]
            new_v[:, :, self.start:self.end] = old_v[:, :, self.start:self.end]
        self._keys[layer_idx], self._values[layer_idx] = new_k, new_v

    def _ensure_mask(self, needed: int, device: torch.device) -> None:
        if self._mask is None:
            self._mask = torch.zeros(self.rows, max(needed, 16), dtype=torch.bool, device=device)
        elif self._mask.shape[1] < needed:
            grown = torch.zeros(self.rows, max(needed, 2 * self._mask.shape[1]), dtype=torch.bool, device=device)
            grown[:, self.start:self.end] = self._mask[:, self.start:self.end]
            self._mask = grown

    @classmethod
    def empty(cls, num_layers: int, rows: int, device: torch.device | str = "cpu") -> RowKVCache:
        """A cache for ``rows`` new rows (a prefill): no columns yet."""
        cache = cls(num_layers)
        cache.lengths = torch.zeros(rows, dtype=torch.long, device=device)
        return cache


def _stack_right(a: torch.Tensor, a_start: int, a_end: int, b: torch.Tensor, b_start: int, b_end: int,
                 width: int, capacity: int) -> torch.Tensor:
    """Rows of ``a[..., a_start:a_end]`` then of ``b[..., b_start:b_end]`` (dim 0), each right-aligned
    at column ``width`` of a zero buffer with ``capacity`` columns (zeros = padding, masked out).
    Works for ``[rows, h, cols, d]`` buffers and ``[rows, cols]`` masks alike (columns are dim 2 / 1)."""
    col = 2 if a.dim() == 4 else 1
    shape = list(a.shape)
    shape[0] = a.shape[0] + b.shape[0]
    shape[col] = capacity
    out = a.new_zeros(shape)
    na, nb = a_end - a_start, b_end - b_start
    if col == 2:
        out[:a.shape[0], :, width - na:width] = a[:, :, a_start:a_end]
        out[a.shape[0]:, :, width - nb:width] = b[:, :, b_start:b_end]
    else:
        out[:a.shape[0], width - na:width] = a[:, a_start:a_end]
        out[a.shape[0]:, width - nb:width] = b[:, b_start:b_end]
    return out
