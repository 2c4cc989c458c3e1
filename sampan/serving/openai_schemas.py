"""Request bodies of the OpenAI-compatible endpoints (pydantic; they drive validation and the schema).

The fields are OpenAI's, with OpenAI's ranges. A field OpenAI has but sampan does not implement
(``logprobs``, ``tools``, penalties ...) is refused by name rather than silently ignored, so a
client never believes it got what it did not (``extra="forbid"``). ``ignore_eos`` is an extension
(vLLM's name) for benchmarks: generate exactly ``max_tokens``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

MAX_STOPS = 4  # OpenAI's limit


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = Field(False, description="send a last chunk with the request's token usage")


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart] | None = None
    name: StrictStr | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class _Sampling(BaseModel):
    """What both endpoints share."""

    model_config = ConfigDict(extra="forbid")
    model: StrictStr = Field(description="the served model's id (GET /v1/models)")
    max_tokens: StrictInt | None = Field(None, ge=1, description="most new tokens per choice (default: the "
                                                                 "server's chat_max_tokens, within the context)")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: StrictInt = Field(1, ge=1, description="choices to generate (each decodes as its own sequence)")
    stop: StrictStr | list[StrictStr] | None = Field(None, description="up to 4 strings that end a choice")
    seed: StrictInt | None = Field(None, description="seeds sampling: the same request gives the same reply")
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: StrictStr | None = None
    ignore_eos: StrictBool = Field(False, description="(extension) keep going past end-of-sequence")

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return tuple(s for s in stops if s)


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "MODEL", "messages": [{"role": "user", "content": "你好"}], "max_tokens": 32}]})
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1, description="OpenAI's newer name for max_tokens")


class CompletionRequest(_Sampling):
    """``POST /v1/completions``."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "MODEL", "prompt": "床前明月光，", "max_tokens": 16}]})
    prompt: StrictStr | list[StrictInt] = Field(description="a text, or its token ids")
    echo: StrictBool = Field(False, description="put the prompt before the completion")


__all__ = ["MAX_STOPS", "ChatCompletionRequest", "ChatMessage", "CompletionRequest", "StreamOptions"]
