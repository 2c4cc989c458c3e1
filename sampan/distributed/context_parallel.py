"""Context parallelism: each of ``cp`` ranks holds part of every sequence; attention gathers the rest.

Every token-wise part of a transformer (embeddings, norms, projections, MLP, the loss) works on a
rank's own tokens unchanged; only attention needs the other tokens. Here each rank gathers the
keys and values of the other ranks from its ``cp`` group and attends its own queries to the ones
the causal mask lets them see, by their true positions. This is the variant Llama 3 405B was
trained with for long contexts (all-gather of K / V rather than a ring; Dubey et al. 2024,
section 3.3.2): its cost is one gather of K and V per layer, which grouped-query attention keeps
small, and it is exact, since every query sees exactly the keys it would see in one process.

Load balance: the sequence is cut into ``2 cp`` equal chunks of ``c`` tokens and rank ``r`` holds
chunks ``r`` and ``2 cp - 1 - r`` (an early and a late one). The early halves are gathered apart
from the late ones, so the early chunk attends to the ``(r + 1) c`` keys before it and the late chunk
to the ``(2 cp - r) c`` keys before it: every rank does ``(2 cp + 1) c^2`` of the ``(2 cp c)^2`` query-key
pairs per head, about the half a causal kernel computes in one process, and the same amount on
every rank.

Why not ``torch.distributed.tensor.experimental.context_parallel``: in torch 2.13 it rewrites only
the CUDA attention kernels (flash, memory-efficient, cuDNN); on CPU attention runs
``aten._scaled_dot_product_flash_attention_for_cpu``, which it does not handle ("does not have a
sharding strategy registered", measured on gloo), and it shards the buffers it is given in place,
which fails for tensors that require grad. The model code stays untouched either way: attention is
swapped at ``F.scaled_dot_product_attention`` while :class:`ContextParallelAttention` is active, so a
model must call it through ``torch.nn.functional`` (sampan's all do).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.distributed._functional_collectives import all_gather_tensor_autograd


def check_sequence(seq_len: int, cp: int) -> None:
    """A clear error unless ``seq_len`` cuts into the ``2 cp`` equal chunks the ranks share."""
    if seq_len % (2 * cp):
        multiple = 2 * cp
        raise ValueError(f"context parallel cp_degree={cp} cuts each sequence into {multiple} equal chunks (two per "
                         f"rank, for load balance), but the sequence length is {seq_len}; use a length that is a "
                         f"multiple of {multiple} (e.g. {-(-seq_len // multiple) * multiple})")


def rank_positions(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """The token positions rank ``rank`` of ``cp`` holds: chunks ``rank`` and ``2 cp - 1 - rank``."""
    check_sequence(seq_len, cp)
    chunk = seq_len // (2 * cp)
    early, late = rank, 2 * cp - 1 - rank
    return torch.cat([torch.arange(early * chunk, (early + 1) * chunk),
                      torch.arange(late * chunk, (late + 1) * chunk)])


def _lower_right_mask(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``[len(queries), len(keys)]``: which keys (by position) each query (by position) sees."""
    return keys[None, :] <= queries[:, None]


class ContextParallelAttention:
    """While active (a context manager), ``F.scaled_dot_product_attention`` gathers keys and values over ``group``.

    Enter it around forward *and* backward: recompute replays attention during backward. The
    function is swapped on ``torch.nn.functional`` itself, not intercepted by a torch-function mode,
    because activation checkpointing replays the forward outside such modes (measured: the
    replayed attention skipped the mode, so recompute saved fewer tensors than the forward and
    failed). The gathers' backward reduce-scatters the key / value gradients back to their ranks.
    """

    def __init__(self, group, seq_len: int, cp: int, rank: int):
        check_sequence(seq_len, cp)
        self.group, self.cp, self.rank = group, cp, rank
        self.chunk = c = seq_len // (2 * cp)
        self.local_len = 2 * c
        # The early halves gather in position order (chunks 0 .. cp-1); the late halves in rank
        # order, which is reversed position order (chunks 2cp-1 .. cp). The early chunk needs the
        # first r + 1 early chunks; the late chunk all early chunks and late ranks r .. cp-1.
        early = torch.arange(seq_len)[: cp * c]
        late = torch.cat([torch.arange((2 * cp - 1 - q) * c, (2 * cp - q) * c) for q in range(rank, cp)])
        mine = rank_positions(seq_len, cp, rank)
        self.early_keys = (rank + 1) * c
        self.early_mask = _lower_right_mask(mine[:c], early[: self.early_keys])
        self.late_mask = _lower_right_mask(mine[c:], torch.cat([early, late]))
        self._original = None

    def __enter__(self) -> ContextParallelAttention:
        if self._original is not None:
            raise RuntimeError("ContextParallelAttention is already active")
        self._original = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = self._attention
        return self

    def __exit__(self, *exc) -> None:
        F.scaled_dot_product_attention = self._original
        self._original = None

    def _gather(self, t: torch.Tensor) -> torch.Tensor:
        return all_gather_tensor_autograd(t.contiguous(), gather_dim=t.dim() - 2, group=self.group)

    def _attention(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False):
        if attn_mask is not None:
            raise ValueError("context parallel attention takes no attention mask (padding): pack sequences "
                             "without padding, or train with cp_degree=1")
        if key.shape[-2] != self.local_len or query.shape[-2] != self.local_len:
            raise ValueError(f"context parallel expects this rank's {self.local_len} tokens in attention, got "
                             f"{query.shape[-2]} queries and {key.shape[-2]} keys (a KV cache or generation "
                             "does not run under context parallel)")
        c, dim = self.chunk, key.dim() - 2
        early_k, late_k = self._gather(key.narrow(dim, 0, c)), self._gather(key.narrow(dim, c, c))
        early_v, late_v = self._gather(value.narrow(dim, 0, c)), self._gather(value.narrow(dim, c, c))
        attend = functools.partial(self._original, dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa)
        if not is_causal:  # every query sees every key
            keys, values = torch.cat([early_k, late_k], dim=dim), torch.cat([early_v, late_v], dim=dim)
            return attend(query, keys, values)
        device = query.device
        first = attend(query.narrow(dim, 0, c), early_k.narrow(dim, 0, self.early_keys),
                       early_v.narrow(dim, 0, self.early_keys), attn_mask=self.early_mask.to(device))
        start = self.rank * c
        keys = torch.cat([early_k, late_k.narrow(dim, start, late_k.shape[dim] - start)], dim=dim)
        values = torch.cat([early_v, late_v.narrow(dim, start, late_v.shape[dim] - start)], dim=dim)
        second = attend(query.narrow(dim, c, c), keys, values, attn_mask=self.late_mask.to(device))
        return torch.cat([first, second], dim=dim)


def next_token_targets(labels: torch.Tensor) -> torch.Tensor:
    """``labels`` moved one position left (``-100`` at the end): position ``t``'s target is token
    ``t + 1``. A causal LM shifts its labels itself, which only works on whole sequences; a rank
    holding scattered chunks gets its targets shifted first, then scores every position."""
    return torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)


class ContextShard:
    """This rank's part of every sequence, and the attention that sees the rest.

    ``shard(batch, loss_kind)`` keeps this rank's token positions of ``input_ids`` and of the
    labels (next-token targets for a causal LM, so the loss becomes per-position: "token"), and adds
    ``position_ids``; ``attention(seq_len)`` is the mode to run forward and backward under.
    """

    def __init__(self, group, cp: int, rank: int):
        self.group, self.cp, self.rank = group, cp, rank

    def shard(self, batch: dict, loss_kind: str) -> dict:
        unknown = sorted(set(batch) - {"input_ids", "labels"})
        if unknown:
            raise ValueError(f"context-parallel batches hold input_ids and labels only; got also {unknown}")
        ids, labels = batch["input_ids"], batch["labels"]
        positions = rank_positions(ids.shape[1], self.cp, self.rank).to(ids.device)
        if loss_kind == "causal_lm":
            labels = next_token_targets(labels)
        return {"input_ids": ids[:, positions], "labels": labels[:, positions],
                "position_ids": positions[None].expand(ids.shape[0], -1)}

    def attention(self, seq_len: int) -> ContextParallelAttention:
        return ContextParallelAttention(self.group, seq_len, self.cp, self.rank)
