"""Context parallelism: each of ``cp`` ranks holds part of every sequence; attention gathers the rest.

Every token-wise part of a transformer (embeddings, norms, projections, MLP, the loss) works on a
rank's own tokens unchanged; only attention needs the other tokens. Here each rank gathers the
keys and values of the whole sequence from its ``cp`` group and attends its own queries to them,
under a causal mask built from the true token positions. This is the variant Llama 3 405B was
trained with for long contexts (all-gather of K / V rather than a ring; Dubey et al. 2024,
section 3.3.2): its cost is one gather of K and V per layer, which grouped-query attention keeps
small, and it is exact, since every query sees exactly the keys it would see in one process.

Load balance: the sequence is cut into ``2 cp`` equal chunks and rank ``r`` holds chunks ``r``
and ``2 cp - 1 - r`` (an early and a late one), so under the causal mask every rank does the
same amount of attention work.

Why not ``torch.distributed.tensor.experimental.context_parallel``: in torch 2.13 it rewrites only
the CUDA attention kernels (flash, memory-efficient, cuDNN); on CPU attention runs
``aten._scaled_dot_product_flash_attention_for_cpu``, which it does not handle ("does not have a
sharding strategy registered", measured on gloo), and it shards the buffers it is given in place,
which fails for tensors that require grad. The model code stays untouched either way: attention is
intercepted at ``F.scaled_dot_product_attention`` while :class:`ContextParallelAttention` is active.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed._functional_collectives import all_gather_tensor_autograd
from torch.overrides import TorchFunctionMode


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


def causal_mask(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """``[s / cp, s]``: which of the gathered keys (in rank order) each of this rank's queries sees."""
    keys = torch.cat([rank_positions(seq_len, cp, r) for r in range(cp)])
    return keys[None, :] <= rank_positions(seq_len, cp, rank)[:, None]


class ContextParallelAttention(TorchFunctionMode):
    """While active, ``F.scaled_dot_product_attention`` gathers keys and values over ``group``.

    Enter it around forward *and* backward: recompute replays attention during backward. The
    gather's backward reduce-scatters the key / value gradients back to their ranks.
    """

    def __init__(self, group, seq_len: int, cp: int, rank: int):
        super().__init__()
        self.group = group
        self.local_len = seq_len // cp
        self.mask = causal_mask(seq_len, cp, rank)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return self._attention(*args, **kwargs)
        return func(*args, **kwargs)

    def _attention(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False):
        if attn_mask is not None:
            raise ValueError("context parallel attention takes no attention mask (padding): pack sequences "
                             "without padding, or train with cp_degree=1")
        if key.shape[-2] != self.local_len or query.shape[-2] != self.local_len:
            raise ValueError(f"context parallel expects this rank's {self.local_len} tokens in attention, got "
                             f"{query.shape[-2]} queries and {key.shape[-2]} keys (a KV cache or generation "
                             "does not run under context parallel)")
        key = all_gather_tensor_autograd(key.contiguous(), gather_dim=-2, group=self.group)
        value = all_gather_tensor_autograd(value.contiguous(), gather_dim=-2, group=self.group)
        mask = self.mask.to(query.device) if is_causal else None
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p, scale=scale,
                                              enable_gqa=enable_gqa)


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
