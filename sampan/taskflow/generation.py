"""``text_generation`` and ``poetry_generation``: continuations from a Chinese GPT, decoded here.

The export holds a prefill and a one-step decode graph with the KV cache as inputs and outputs
(``sampan.inference.decoders.GraphDecoder``), so each new token costs one step over the cache; an
older export with only the full-window graph (``input_ids -> logits``) still runs, re-reading the
whole window per token. Past the model's window (its position table) the last window of tokens is
re-read each step, as the full-window path always did. Sampling (temperature, top-k, repetition
penalty, a seeded numpy generator) is ``sampan.inference.sampling``'s, around the graphs.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from sampan.inference.decoders import Decoder, FullWindowDecoder, GraphDecoder, has_decode_graphs
from sampan.inference.sampling import SamplingParams, next_token
from sampan.taskflow.task import Task
from sampan.text.tokenizer import CLS_ID, MASK_ID, PAD_ID, SEP_ID, UNK_ID

_HANZI = re.compile(r"^[\u4e00-\u9fff]$")
# Never generated; [SEP] ends a text (and is allowed once min_new_tokens are out).
_NEVER = (PAD_ID, UNK_ID, CLS_ID, MASK_ID)


def open_decoder(loaded) -> Decoder:
    """The decode graphs of a loaded model's export, on its predictor's backend and device; the
    full-window graph for an export made before they existed."""
    window = int(loaded.config.get("max_position_embeddings", 128))
    if has_decode_graphs(loaded.inference_dir):
        return GraphDecoder.open(loaded.predictor.config, pad_id=PAD_ID)
    return FullWindowDecoder(loaded.predictor, PAD_ID, window)


class _Stream:
    """Rows being continued on a decoder: each new token is fed once, while the rows fit the
    window; beyond it, every row's last ``window`` tokens are read afresh each step."""

    def __init__(self, decoder: Decoder, window: int, rows: list[list[int]]):
        self.decoder, self.window = decoder, window
        self.rows = [list(r) for r in rows]
        self.logits = decoder.start([r[-window:] for r in self.rows])

    def push(self, tokens: list[int], keep: list[int] | None = None) -> None:
        """Append ``tokens`` to the rows at positions ``keep`` (default: all), dropping the rest;
        ``logits`` become the next-token logits of the rows kept."""
        if keep is not None and len(keep) < len(self.rows):
            self.decoder.keep(np.asarray(keep, dtype=np.int64))
            self.rows = [self.rows[i] for i in keep]
        for row, token in zip(self.rows, tokens, strict=True):
            row.append(token)
        if max(len(r) for r in self.rows) > self.window:
            self.logits = self.decoder.start([r[-self.window:] for r in self.rows])
        else:
            self.logits = self.decoder.advance(np.asarray(tokens, dtype=np.int64))


class _Decoder:
    """Sampling around an exported causal LM."""

    def __init__(self, loaded, seed: int, temperature: float, top_k: int, repetition_penalty: float):
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = no limit), got {top_k}")
        self.model = open_decoder(loaded)
        self.rng = np.random.default_rng(seed)
        self.params = SamplingParams(temperature=temperature, top_k=top_k, repetition_penalty=repetition_penalty)
        self.window = int(loaded.config.get("max_position_embeddings", 128))

    def stream(self, rows: list[list[int]]) -> _Stream:
        return _Stream(self.model, self.window, rows)

    def sample(self, logits: np.ndarray, history: list[int], allowed: np.ndarray | None = None,
               allow_end: bool = True) -> int:
        banned = _NEVER if allow_end else (*_NEVER, SEP_ID)
        return next_token(logits, history, self.params, self.rng, banned=banned, allowed=allowed)


class TextGeneration(Task):
    name = "text_generation"
    description = "continue a Chinese text (GPT trained on People's Daily 1998, 三国演义 and Tang poems)"
    default_model = "gpt-zh"
    models = ("gpt-zh",)
    option_names = ("max_new_tokens", "min_new_tokens", "seed", "temperature", "top_k", "repetition_penalty")

    def _construct_model(self, model: str) -> None:
        self.loaded = self._load(model)
        o = self.options
        self.max_new_tokens = int(o.get("max_new_tokens", 48))
        # The training rows end documents with [SEP]; a headline-like prompt would often end at once.
        self.min_new_tokens = int(o.get("min_new_tokens", min(16, self.max_new_tokens)))
        if self.max_new_tokens < 1 or not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(f"need 1 <= max_new_tokens and 0 <= min_new_tokens <= max_new_tokens, got "
                             f"{self.max_new_tokens} and {self.min_new_tokens}")
        self.decoder = _Decoder(self.loaded, int(o.get("seed", 0)), float(o.get("temperature", 0.8)),
                                int(o.get("top_k", 20)), float(o.get("repetition_penalty", 1.2)))

    def _prompt_ids(self, text: str) -> list[int]:
        ids = self.loaded.tokenizer.encode(text, add_special_tokens=False).ids
        return [CLS_ID] + list(ids)

    def _preprocess(self, texts: list[str]) -> list[list[int]]:
        return [self._prompt_ids(t) for t in texts]

    def _run_model(self, rows: list[list[int]]) -> list[list[int]]:
        rows = [list(r) for r in rows]
        new: list[list[int]] = [[] for _ in rows]
        live = list(range(len(rows)))
        stream = self.decoder.stream(rows)
        for step in range(self.max_new_tokens):
            still, keep, tokens = [], [], []
            for j, i in enumerate(live):
                token = self.decoder.sample(stream.logits[j], rows[i], allow_end=step >= self.min_new_tokens)
                if token == SEP_ID:  # end of a document in the training rows
                    continue
                rows[i].append(token)
                new[i].append(token)
                still.append(i)
                keep.append(j)
                tokens.append(token)
            live = still
            if not live or step + 1 == self.max_new_tokens:
                break
            stream.push(tokens, keep)
        return new

    def _postprocess(self, texts: list[str], inputs: Any, outputs: list[list[int]]) -> list[dict[str, Any]]:
        tok = self.loaded.tokenizer
        return [{"text": t, "generated": tok.decode(ids)} for t, ids in zip(texts, outputs, strict=True)]


class PoetryGeneration(TextGeneration):
    """Regulated verse: ``lines`` lines of ``line_chars`` hanzi, "，" and "。" alternating at line ends.

    The form is enforced while decoding (only single-hanzi tokens inside a line, the punctuation
    at its end), the words come from the model (the shipped gpt-zh trained on 12,000 Tang poems
    among its prose).
    """

    name = "poetry_generation"
    description = "a poem (4 lines of 5 or 7 characters) starting from the given characters"
    option_names = (*TextGeneration.option_names, "line_chars", "lines")

    def _construct_model(self, model: str) -> None:
        super()._construct_model(model)
        self.line_chars = int(self.options.get("line_chars", 7))
        self.lines = int(self.options.get("lines", 4))
        if self.line_chars not in (5, 7) or self.lines < 1:
            raise ValueError(f"poetry needs line_chars 5 or 7 and lines >= 1, got {self.line_chars}, {self.lines}")
        tokens = self.loaded.tokenizer.tokens()
        self.hanzi = np.array([bool(_HANZI.match(t)) for t in tokens])
        self.marks = {}
        for mark in ("，", "。"):
            ids = self.loaded.tokenizer.encode(mark, add_special_tokens=False).ids
            if len(ids) != 1:
                raise ValueError(f"the model's tokenizer cannot write {mark!r} as one token")
            self.marks[mark] = ids[0]

    def _run_model(self, rows: list[list[int]]) -> list[list[int]]:
        tok = self.loaded.tokenizer
        out = []
        for row in rows:  # one poem at a time: each row is at its own place in the form
            row = list(row)
            written = [t for t in row[1:] if self.hanzi[t]]
            poem = list(written)
            total = self.lines * self.line_chars
            stream, fed = None, 0
            while len(poem) < total or len(poem) % self.line_chars:
                if poem and len(poem) % self.line_chars == 0 and row[-1] not in self.marks.values():
                    mark = "，" if (len(poem) // self.line_chars) % 2 else "。"
                    row.append(self.marks[mark])
                    continue
                if stream is None:
                    stream = self.decoder.stream([row])
                else:
                    for token in row[fed:]:  # what was written since the model last read the row
                        stream.push([token])
                fed = len(row)
                token = self.decoder.sample(stream.logits[0], row, allowed=self.hanzi)
                row.append(token)
                poem.append(token)
            text = ""
            for k in range(0, len(poem), self.line_chars):
                line = tok.decode(poem[k: k + self.line_chars])
                text += line + ("，" if (k // self.line_chars) % 2 == 0 else "。")
            out.append(text)
        return out

    def _postprocess(self, texts: list[str], inputs: Any, outputs: list[str]) -> list[dict[str, Any]]:
        return [{"text": t, "poem": poem} for t, poem in zip(texts, outputs, strict=True)]
