"""``Generator``: text generation over an export's decode graphs (or the eager model), O(n) per token.

::

    from sampan.inference import Config, create_generator
    generator = create_generator(Config("out/llama"), tokenizer=tok)    # prefill/ + decode/ graphs
    out = generator.generate([tok.encode("你好").ids], max_tokens=64, temperature=0.7, top_p=0.9,
                             stop=["。"], seed=0)
    out[0].text, out[0].token_ids, out[0].finish_reason               # "stop" or "length"

One loop serves every :mod:`~sampan.inference.decoders` decoder: the decode graphs on ONNX Runtime or
the ``.pt2`` (:class:`GraphDecoder`), the torch model with its KV cache (``Generator.from_model``),
and an older export's full-window graph (:class:`FullWindowDecoder`, O(n^2); ``create_generator``
warns and says to export again). Sampling is ``sampan.inference.sampling``'s.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sampan.inference.config import Config
from sampan.inference.decoders import (
    Decoder,
    EagerDecoder,
    FullWindowDecoder,
    GraphDecoder,
    has_decode_graphs,
    model_config_of,
)
from sampan.inference.sampling import SamplingParams, next_token


@dataclasses.dataclass
class GenerationOutput:
    """One prompt's continuation.

    Fields:
        token_ids: the new tokens (an end-of-sequence token is not included; with stop strings,
            up to the token that completed one).
        text: the decoded new tokens, cut before the first stop string; None without a tokenizer.
        finish_reason: "stop" (an end-of-sequence token or a stop string) or "length" (``max_tokens``).
        prompt_tokens: how many tokens the prompt had.
    """

    token_ids: list[int]
    text: str | None
    finish_reason: str
    prompt_tokens: int


class _Row:
    """A prompt's progress: its tokens so far, and for stop strings its text."""

    def __init__(self, prompt: Sequence[int]):
        self.prompt = [int(t) for t in prompt]
        self.new: list[int] = []
        self.text: str | None = None
        self.finish_reason = "length"

    def history(self) -> list[int]:
        return self.prompt + self.new


def _find_stop(text: str, stops: Sequence[str], search_from: int) -> int | None:
    """The earliest index in ``text`` at which a stop string starts, looking only at matches that
    end after ``search_from`` (earlier text was checked already); None when there is none."""
    found = [i for s in stops if (i := text.find(s, max(0, search_from - len(s) + 1))) >= 0]
    return min(found) if found else None


class Generator:
    """Generation on a :class:`~sampan.inference.decoders.Decoder` with greedy or sampled decoding,
    repetition penalty, end-of-sequence ids, stop strings, ``max_tokens`` and a seed.

    Args:
        decoder: what gives the next-token logits (``GraphDecoder``, ``EagerDecoder``, ``FullWindowDecoder``).
        eos_token_id: the id (or ids) that end a row; default none.
        tokenizer: anything with ``decode(ids) -> str``; needed for stop strings and ``text``.
    """

    def __init__(self, decoder: Decoder, eos_token_id: int | Sequence[int] | None = None, tokenizer: Any = None):
        self.decoder = decoder
        eos = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        self.eos_token_ids = [int(e) for e in eos]
        self.tokenizer = tokenizer

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any = None, eos_token_id: int | Sequence[int] | None = None,
                   pad_token_id: int | None = None) -> Generator:
        """The same loop on the torch model (eval mode, ``sampan.nn.KVCache``); ``eos_token_id``
        defaults to the model config's."""
        eos = model.config.eos_token_id if eos_token_id is None else eos_token_id
        return cls(EagerDecoder(model, pad_token_id), eos, tokenizer)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def generate(self, prompts: Sequence[Sequence[int]] | Sequence[int], max_tokens: int = 16, *,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, repetition_penalty: float = 1.0,
                 seed: int | None = None, stop: str | Sequence[str] | None = None,
                 sampling: SamplingParams | None = None) -> list[GenerationOutput]:
        """Continue each prompt (token ids; one list or a list of lists) by up to ``max_tokens``.

        Greedy by default; ``temperature > 0`` samples, within ``top_k`` / ``top_p``, from a numpy
        generator seeded with ``seed`` (the same seed gives the same tokens); ``sampling`` gives all
        of these at once instead. A row ends at an end-of-sequence id, at a stop string in its text
        (needs ``tokenizer``; the text is cut before it) or after ``max_tokens``; finished rows
        leave the batch, so the others go on at their own cost. Prompt plus ``max_tokens`` must
        fit the model's positions.
        """
        if prompts and isinstance(prompts[0], (int, np.integer)):
            prompts = [prompts]  # one prompt
        params = sampling or SamplingParams(temperature, top_k, top_p, repetition_penalty, seed)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        if stops and self.tokenizer is None:
            raise ValueError("stop strings are matched in the text: give the Generator a tokenizer")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        rows = [_Row(p) for p in prompts]
        limit = self.decoder.max_positions
        longest = max((len(r.prompt) for r in rows), default=0)
        if limit is not None and longest + max_tokens > limit:
            raise ValueError(f"the longest prompt ({longest} tokens) + max_tokens ({max_tokens}) = {longest + max_tokens} "
                             f"exceeds the model's {limit} positions; shorten the prompt or lower max_tokens")
        rng = params.rng()
        live = list(range(len(rows)))
        logits = self.decoder.start([r.prompt for r in rows])
        for _ in range(max_tokens):
            tokens, still = [], []
            for j, i in enumerate(live):
                row = rows[i]
                token = next_token(logits[j], row.history(), params, rng)
                if token in self.eos_token_ids:
                    row.finish_reason = "stop"
                    continue
                row.new.append(token)
                if stops and self._stopped(row, stops):
                    continue
                tokens.append(token)
                still.append(j)
            if len(still) < len(live):
                live = [live[j] for j in still]
                if live:
                    self.decoder.keep(np.asarray(still, dtype=np.int64))
            if not live or len(rows[live[0]].new) == max_tokens:
                break
            logits = self.decoder.advance(np.asarray(tokens, dtype=np.int64))
        return [GenerationOutput(r.new, self._final_text(r), r.finish_reason, len(r.prompt)) for r in rows]

    def _stopped(self, row: _Row, stops: Sequence[str]) -> bool:
        checked = len(row.text or "")
        row.text = self._decode(row.new)
        cut = _find_stop(row.text, stops, checked)
        if cut is None:
            return False
        row.text, row.finish_reason = row.text[:cut], "stop"
        return True

    def _final_text(self, row: _Row) -> str | None:
        if self.tokenizer is None:
            return None
        return row.text if row.finish_reason == "stop" and row.text is not None else self._decode(row.new)


def create_generator(config: Config | str, tokenizer: Any = None, eos_token_id: int | Sequence[int] | None = None,
                     *, warn: Callable[[str], None] | None = None) -> Generator:
    """A :class:`Generator` on the inference directory of ``config`` (a :class:`Config` or a path).

    With decode graphs (``prefill/``, ``decode/``: every causal LM ``export_pretrained`` writes now)
    it runs them on ``config``'s backend and device. An older export has only the full-window
    graph: it still generates, recomputing the whole sequence per token, with a warning saying to
    export again. ``eos_token_id`` defaults to the recorded model config's.
    """
    if not isinstance(config, Config):
        config = Config(config)
    model_config = model_config_of(config)
    eos = model_config.get("eos_token_id") if eos_token_id is None else eos_token_id
    pad = model_config.get("pad_token_id") or 0
    if has_decode_graphs(config.model_dir):
        return Generator(GraphDecoder.open(config, pad), eos, tokenizer)
    from sampan.inference.predictor import create_predictor

    message = (f"{config.model_dir} has no decode graphs (prefill/, decode/), so generation recomputes the "
               "whole sequence for every new token; export it again (sampan export --overwrite) for O(n) decoding")
    (warn or (lambda m: warnings.warn(m, stacklevel=3)))(message)
    predictor = create_predictor(config)
    if predictor.get_input_names() != ["input_ids"]:
        raise ValueError(f"{config.model_dir} is not a causal language model's export (its graph takes "
                         f"{predictor.get_input_names()}, not input_ids alone)")
    return Generator(FullWindowDecoder(predictor, pad, model_config.get("max_position_embeddings")), eos, tokenizer)
