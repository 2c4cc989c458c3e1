"""Hugging Face chat templates (Jinja) rendered the way ``transformers`` renders them.

A chat template comes from a model directory, that is from whoever published the model, so it is
untrusted code: it runs in Jinja's immutable sandbox, whose known escapes are fixed from jinja2
3.1.6 on. The environment matches transformers' so a template renders to the same text:
``trim_blocks`` and ``lstrip_blocks``, ``{% break %}`` / ``{% continue %}``, a ``tojson`` that does
not escape HTML (``tojson(indent=2, separators=..., sort_keys=True)`` work), ``raise_exception(msg)``,
``strftime_now(fmt)``, a ``{% generation %}`` block (rendered as its body), and ``dict`` /
``namespace`` helpers that cannot reach Python internals.

    text = render_chat(template, messages, add_generation_prompt=True, variables={"eos_token": "<|im_end|>"})
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import numpy as np

# Names a message's reasoning travels under; templates read the first (Qwen3) or "thinking" (gpt-oss).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class ChatTemplateError(ValueError):
    """A chat template is missing, is not valid Jinja, or refused the conversation (``raise_exception``)."""


def select_template(templates: str | Mapping[str, str] | None, chat_template: str | None = None,
                    tools: Sequence[Any] | None = None, where: str = "this tokenizer") -> str:
    """The template text to render: ``chat_template`` (a template, or the name of one of ``templates``),
    else the only template, else ``"tool_use"`` when tools are given, else ``"default"``."""
    if isinstance(templates, Mapping):
        if chat_template is not None:
            return templates.get(chat_template, chat_template)
        if tools is not None and "tool_use" in templates:
            return templates["tool_use"]
        if "default" in templates:
            return templates["default"]
        raise ChatTemplateError(f"{where} has several chat templates and none is named 'default'; pass "
                                f"chat_template= one of {sorted(templates)}")
    if chat_template is not None:
        return chat_template
    if templates is None:
        raise ChatTemplateError(f"{where} has no chat template (no chat_template in tokenizer_config.json and no "
                                "chat_template.jinja); it is probably a base model's tokenizer: pass "
                                "chat_template='...' (a Jinja template) or load a chat model's tokenizer")
    return templates


@lru_cache(maxsize=32)
def compile_template(source: str) -> Any:
    """A ``jinja2.Template`` for ``source`` (cached: a tokenizer renders the same template many times)."""
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    if tuple(int(part) for part in jinja2.__version__.split(".")[:3] if part.isdigit()) < (3, 1, 6):
        raise ImportError(f"chat templates need jinja2>=3.1.6 (older sandboxes have known escapes, and a template is "
                          f"untrusted code); found {jinja2.__version__}: pip install -U 'jinja2>=3.1.6'")

    class GenerationBlock(Extension):
        # transformers uses {% generation %} to find assistant tokens; outside that it is its body.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class SafeNamespace(jinja2.utils.Namespace):
        # An underscore attribute on a namespace is the first step of most sandbox escapes.
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                _check_attribute(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            _check_attribute(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = _DictMaker()
    env.globals["namespace"] = SafeNamespace
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as err:
        raise ChatTemplateError(f"the chat template is not valid Jinja (line {err.lineno}: {err.message})") from err


def _check_attribute(name: object) -> None:
    import jinja2

    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"a chat template may not set the underscore attribute {name!r}")


class _DictMaker:
    # Only construction: the real ``dict`` type would hand the template its class attributes.
    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes < > & ' for HTML, which would change the text a model was trained on.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    import jinja2

    err = jinja2.exceptions.TemplateError(message)
    err.raised_by_template = True  # lets render_chat tell a refusal apart from a broken template
    raise err


def plain_data(value: Any) -> Any:
    """``value`` rebuilt from plain JSON types; anything else becomes an inert ``"<TypeName>"``.

    The sandbox only knows Python's own types are harmless, so objects callers put in messages
    (arrays, images, enums, pydantic models) must not reach the template with their methods."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    # Subclasses (str enums, numpy floats) carry methods of their own: back to the base type.
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_data(key): plain_data(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain_data(item) for item in value]
    if isinstance(value, tuple):
        return tuple(plain_data(item) for item in value)
    if isinstance(value, np.generic):  # np.bool_(False) would otherwise be a truthy placeholder
        return plain_data(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: plain_data(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return plain_data(value.model_dump())
    return f"<{type(value).__name__}>"


def _messages(conversation: Any) -> list[dict]:
    messages = []
    for message in plain_data(list(getattr(conversation, "messages", conversation))):
        if not isinstance(message, dict):
            raise TypeError(f"chat messages must be dicts like {{'role': 'user', 'content': '...'}}, got {message!r}")
        # Many templates print a None content as "None"; all of them handle a missing key.
        message = {key: item for key, item in message.items() if item is not None}
        reasoning = next((message[key] for key in _REASONING_FIELDS if key in message), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        messages.append(message)
    return messages


def render_chat(template: str, conversation: Any, *, add_generation_prompt: bool = False,
                continue_final_message: bool | str = False, tools: Sequence[Mapping] | None = None,
                documents: Sequence[Mapping] | None = None, variables: Mapping[str, Any] | None = None) -> str:
    """Render one conversation (a list of ``{"role", "content", ...}`` dicts) with ``template``.

    ``variables`` are the extra template variables (the special tokens, ``enable_thinking``...).
    ``continue_final_message`` (True, or the message field to continue) leaves the last message
    open, so a model continues it instead of starting a new one. Raises ``ChatTemplateError`` when
    the template calls ``raise_exception``.
    """
    import jinja2

    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt exclude each other: the first continues "
                         "the last message, the second opens a new assistant message")
    if tools is not None and not all(isinstance(tool, Mapping) for tool in tools):
        raise TypeError("tools must be JSON-schema dicts ({'type': 'function', 'function': {...}}); "
                        "transformers.utils.get_json_schema(fn) makes one from a typed, documented function")
    if documents is not None and not all(isinstance(doc, Mapping) for doc in documents):
        raise TypeError("documents must be dicts with 'title' and 'text' keys")
    messages = _messages(conversation)
    if not messages:
        raise ValueError("cannot apply a chat template to an empty conversation; pass at least one message")
    final = None
    if continue_final_message:
        final = _tag_final_message(template, messages, continue_final_message)
    try:
        text = compile_template(template).render(messages=messages, tools=plain_data(tools),
                                                 documents=plain_data(documents),
                                                 add_generation_prompt=add_generation_prompt,
                                                 **plain_data(dict(variables or {})))
    except jinja2.exceptions.SecurityError:
        raise
    except jinja2.TemplateError as err:
        if getattr(err, "raised_by_template", False):
            raise ChatTemplateError(f"the chat template refused this conversation: {err}") from err
        raise ChatTemplateError(f"the chat template failed on this conversation ({type(err).__name__}: {err})") from err
    if final is not None:
        if final.strip() not in text or _CONTINUE_TAG.strip() not in text:
            raise ValueError("continue_final_message: the chat template dropped part of the final message, so it "
                             f"cannot be continued; final message: {final.strip()!r}")
        cut = text.rindex(_CONTINUE_TAG.strip())
        # A template that strips the message also stripped the space after the tag: cut before it, trimmed.
        text = text[:cut] if text[cut:cut + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:cut].rstrip()
    return text


def _tag_final_message(template: str, messages: list[dict], field: bool | str) -> str:
    """Append a tag to the final message so the end of its text can be found in the rendered chat."""
    field = field if isinstance(field, str) else "content"
    last = messages[-1]
    if last.get(field) is None:
        raise ValueError(f"continue_final_message: the final message has no {field!r} to continue")
    fields = [field]
    if field in _REASONING_FIELDS:  # reasoning is copied under several names: tag every copy
        fields = [name for name in _REASONING_FIELDS if last.get(name) == last[field]]
    if not any(name in template for name in fields):
        raise ValueError(f"continue_final_message: the chat template never reads {field!r}")
    final = last[field]
    if isinstance(final, list):  # content blocks: continue the last text block
        block = next((block for block in reversed(final) if isinstance(block, dict) and "text" in block), None)
        if block is None:
            raise ValueError("continue_final_message: the final message has no text block to continue")
        text = block["text"]
        block["text"] = text + _CONTINUE_TAG
        return text
    for name in fields:
        last[name] = last[name] + _CONTINUE_TAG
    return final
