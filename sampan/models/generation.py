"""Autoregressive generation with a KV cache: greedy or sampled (temperature, top-k, top-p)."""

from __future__ import annotations

import torch

from sampan.nn.kv_cache import KVCache


def apply_repetition_penalty(logits: torch.Tensor, seqs: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's penalty: divide positive (multiply negative) logits of tokens already generated."""
    scores = logits.gather(1, seqs)
    scores = torch.where(scores > 0, scores / penalty, scores * penalty)
    return logits.scatter(1, seqs, scores)


def filter_top_k_top_p(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Set to -inf every logit outside the ``top_k`` best and outside the nucleus of mass ``top_p``.

    The most likely token always survives, so sampling never faces an all -inf row.
    """
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the mass before it already reaches top_p (so the first always stays).
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
        drop = drop_sorted.scatter(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


class GenerationMixin:
    """``generate`` for models whose forward takes ``(input_ids, attention_mask, kv_cache=...)``."""

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int = 32,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        repetition_penalty: float = 1.0,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
        do_sample: bool = False,
        attention_mask: torch.Tensor | None = None,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Continue ``input_ids [b, s]`` by up to ``max_new_tokens``; returns ``[b, s + n]``.

        Greedy unless ``do_sample=True``, which samples from ``softmax(logits / temperature)``
        restricted to ``top_k`` tokens and the ``top_p`` nucleus (``generator`` makes it
        repeatable). ``repetition_penalty > 1`` discourages tokens already in the sequence. A row
        that emits ``eos_token_id`` (an id or a list of ids; default: the config's) is finished and
        padded with ``pad_token_id`` (default: the config's, else the first eos); generation stops
        when all rows are.
        For a batch of prompts of different lengths, left-pad them and pass ``attention_mask``.
        """
        config = self.config
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must be [batch, seq_len] with seq_len >= 1, got {tuple(input_ids.shape)}")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if do_sample and temperature <= 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
        if top_k < 0 or not 0.0 < top_p <= 1.0 or repetition_penalty <= 0:
            raise ValueError(f"need top_k >= 0, 0 < top_p <= 1, repetition_penalty > 0; got "
                             f"top_k={top_k}, top_p={top_p}, repetition_penalty={repetition_penalty}")
        total = input_ids.shape[1] + max_new_tokens
        if total > config.max_position_embeddings:
            raise ValueError(
                f"prompt ({input_ids.shape[1]}) + max_new_tokens ({max_new_tokens}) = {total} exceeds "
                f"max_position_embeddings ({config.max_position_embeddings}); shorten one of them"
            )
        eos = config.eos_token_id if eos_token_id is None else eos_token_id
        eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        if pad_token_id is None:
            pad_token_id = config.pad_token_id if config.pad_token_id is not None else (eos_ids or [None])[0]
        pad = pad_token_id
        eos = torch.tensor(eos_ids, dtype=torch.long, device=input_ids.device) if eos_ids else None

        was_training = self.training
        self.eval()
        try:
            cache = KVCache(config.num_layers) if use_cache else None
            seqs, step_input, mask = input_ids, input_ids, attention_mask
            finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
            for _ in range(max_new_tokens):
                logits = self(step_input if use_cache else seqs, attention_mask=mask, kv_cache=cache)
                logits = logits[:, -1].float()
                if repetition_penalty != 1.0:
                    logits = apply_repetition_penalty(logits, seqs, repetition_penalty)
                if do_sample:
                    logits = filter_top_k_top_p(logits / temperature, top_k, top_p)
                    next_token = torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(1)
                else:
                    next_token = logits.argmax(dim=-1)
                if eos is not None:
                    next_token = torch.where(finished, torch.full_like(next_token, pad), next_token)
                    finished |= torch.isin(next_token, eos)
                seqs = torch.cat([seqs, next_token[:, None]], dim=1)
                step_input = next_token[:, None]
                if mask is not None:
                    mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
                if eos is not None and bool(finished.all()):
                    break
            return seqs
        finally:
            self.train(was_training)
