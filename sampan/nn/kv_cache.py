"""Key/value cache for incremental decoding."""

from __future__ import annotations

import torch


class KVCache:
    """Holds each attention layer's past keys and values, shaped ``[batch, heads, seq, head_dim]``.

    Layers append with :meth:`update` and get back the full keys and values to attend over.
    Storage grows by doubling a preallocated buffer, so a long generation does O(n) copying in
    total rather than the O(n^2) of concatenating one step at a time.
    """

    def __init__(self, num_layers: int):
        if num_layers <= 0:
            raise ValueError(f"num_layers must be > 0, got {num_layers}")
        self._keys: list[torch.Tensor | None] = [None] * num_layers
        self._values: list[torch.Tensor | None] = [None] * num_layers
        self._lengths = [0] * num_layers

    @property
    def num_layers(self) -> int:
        return len(self._keys)

    def seq_len(self, layer_idx: int = 0) -> int:
        """How many positions layer ``layer_idx`` has cached."""
        return self._lengths[layer_idx]

    def get(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Layer ``layer_idx``'s cached keys and values ``[b, kv_heads, seq, d]``, or None before any."""
        if self._keys[layer_idx] is None:
            return None
        end = self._lengths[layer_idx]
        return self._keys[layer_idx][:, :, :end], self._values[layer_idx][:, :, :end]

    def update(self, layer_idx: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``key``/``value`` (``[b, h, new, d]``) and return all cached keys and values."""
        start = self._lengths[layer_idx]
        end = start + key.shape[2]
        buf_k, buf_v = self._keys[layer_idx], self._values[layer_idx]
        if buf_k is None or buf_k.shape[2] < end:
            capacity = max(end, 2 * (buf_k.shape[2] if buf_k is not None else 0), 16)
            new_k = key.new_empty(key.shape[0], key.shape[1], capacity, key.shape[3])
            new_v = value.new_empty(value.shape[0], value.shape[1], capacity, value.shape[3])
            if buf_k is not None and start:
                new_k[:, :, :start] = buf_k[:, :, :start]
                new_v[:, :, :start] = buf_v[:, :, :start]
            buf_k, buf_v = self._keys[layer_idx], self._values[layer_idx] = new_k, new_v
        buf_k[:, :, start:end] = key
        buf_v[:, :, start:end] = value
        self._lengths[layer_idx] = end
        return buf_k[:, :, :end], buf_v[:, :, :end]

    def reorder(self, index: torch.Tensor) -> None:
        """Keep only the batch rows in ``index`` (in that order), e.g. for beam search."""
        for i, (k, v) in enumerate(zip(self._keys, self._values, strict=True)):
            if k is not None:
                self._keys[i], self._values[i] = k.index_select(0, index), v.index_select(0, index)


class FunctionalKVCache:
    """A KV cache that is tensors in, tensors out: what an exported decode graph carries.

    Built for one forward call from the past keys and values (``past``: per layer a
    ``(key, value)`` pair ``[b, kv_heads, past_len, d]``; empty for a prefill), it answers the
    model's ``seq_len`` / ``update`` as :class:`KVCache` does, but appends by concatenation and
    keeps nothing between calls: after the forward, :attr:`present` holds each layer's keys and
    values, past and new, for the caller to return and feed to the next call. So a traced graph
    holds no Python state, and the model code needs no export special case: the same
    ``kv_cache.update`` runs eagerly with :class:`KVCache` and in ``torch.export`` with this one.
    (Concatenation copies the cache once per step, which ONNX graphs with ``past_key_values``
    inputs do anyway; eager generation keeps :class:`KVCache`'s preallocated buffer.)
    """

    def __init__(self, num_layers: int, past: list[tuple[torch.Tensor, torch.Tensor]] | None = None):
        if num_layers <= 0:
            raise ValueError(f"num_layers must be > 0, got {num_layers}")
        past = list(past or [])
        if past and len(past) != num_layers:
            raise ValueError(f"past holds {len(past)} layers' keys and values but the model has {num_layers} layers")
        self._past = past
        self.present: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers

    @property
    def num_layers(self) -> int:
        return len(self.present)

    def seq_len(self, layer_idx: int = 0) -> int:
        """How many positions layer ``layer_idx`` had before this call (a symbolic size under export)."""
        return self._past[layer_idx][0].shape[2] if self._past else 0

    def get(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Layer ``layer_idx``'s keys and values so far (past, then this call's), or None before any."""
        return self.present[layer_idx] or (self._past[layer_idx] if self._past else None)

    def update(self, layer_idx: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``key``/``value`` (``[b, h, new, d]``) to the past and return all keys and values."""
        if self.present[layer_idx] is not None:
            raise RuntimeError(f"layer {layer_idx} was updated twice in one call: a FunctionalKVCache serves "
                               "one forward; build a new one from its .present for the next")
        if self._past:
            past_k, past_v = self._past[layer_idx]
            key, value = torch.cat([past_k, key], dim=2), torch.cat([past_v, value], dim=2)
        self.present[layer_idx] = (key, value)
        return key, value

    def flat_present(self) -> tuple[torch.Tensor, ...]:
        """``present`` as ``(key_0, value_0, key_1, value_1, ...)``: a graph's outputs in ONNX order."""
        missing = [i for i, kv in enumerate(self.present) if kv is None]
        if missing:
            raise RuntimeError(f"layers {missing} were never updated: the model did not run every layer on this cache")
        return tuple(t for kv in self.present for t in kv)
