"""Token ids in, whole characters out: incremental detokenization and stop strings for streaming.

Byte-level BPE (GPT-2, Llama 3, Qwen) spends several tokens on one Chinese character: decoding
after each token would show a half character as U+FFFD and then a different text once the rest
arrives. :class:`IncrementalDecoder` decodes a short window of recent tokens twice (without and
with the newest) and releases only the new text, holding it back while it ends in U+FFFD (an
incomplete UTF-8 tail) - the scheme of Hugging Face's text-generation-inference and vLLM.
:class:`StopMatcher` then cuts the text at the first stop string and holds back a tail that may
be the start of one, so a partial match never reaches the client either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_REPLACEMENT = "\ufffd"


class IncrementalDecoder:
    """Feed token ids one at a time with :meth:`push`; each call returns the newly complete text.

    The concatenation of every ``push`` and the final :meth:`flush` equals
    ``tokenizer.decode(all ids, skip_special_tokens)``: nothing is lost or duplicated.
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the window decoded for context (tokenizers that strip a leading space)
        self._read = 0  # ids up to here are already released as text

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def push(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        before = self._decode(self._ids[self._prefix:self._read])
        after = self._decode(self._ids[self._prefix:])
        if len(after) > len(before) and not after.endswith(_REPLACEMENT):
            self._prefix, self._read = self._read, len(self._ids)
            return after[len(before):]
        return ""  # an incomplete character (or a token with no text yet): wait for more

    def flush(self) -> str:
        """What is still held back (at the end of a generation: an incomplete tail decodes as U+FFFD)."""
        before = self._decode(self._ids[self._prefix:self._read])
        after = self._decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return after[len(before):] if after.startswith(before) else after


class StopMatcher:
    """Cut a text stream at the first of ``stops``; hold back a tail that could begin one.

    ``push(text)`` returns ``(releasable text, stopped)``; once stopped, the stop string and
    everything after it are dropped (OpenAI's rule: the stop sequence is not returned).
    """

    def __init__(self, stops: Sequence[str] = ()):
        self.stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False

    def push(self, text: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        if not self.stops:
            return text, False
        buffer = self._held + text
        hits = [i for i in (buffer.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            self._held = ""
            return buffer[:min(hits)], True
        keep = self._partial_tail(buffer)
        self._held = buffer[len(buffer) - keep:] if keep else ""
        return buffer[:len(buffer) - keep], False

    def flush(self) -> str:
        """At the end of a generation the held tail was no stop after all: release it."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _partial_tail(self, buffer: str) -> int:
        """Length of the longest suffix of ``buffer`` that is a proper prefix of a stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(buffer)), best, -1):
                if buffer.endswith(stop[:n]):
                    best = n
                    break
        return best


class TextStream:
    """Token ids -> text deltas that hold whole characters and never a partial stop string."""

    def __init__(self, tokenizer: Any, stops: Sequence[str] = ()):
        self._decoder = IncrementalDecoder(tokenizer)
        self._stop = StopMatcher(stops)

    def push(self, token_id: int) -> tuple[str, bool]:
        """``(text to send, a stop string was reached)``."""
        return self._stop.push(self._decoder.push(token_id))

    def flush(self) -> str:
        text, _ = self._stop.push(self._decoder.flush())
        return text + self._stop.flush()


__all__ = ["IncrementalDecoder", "StopMatcher", "TextStream"]
