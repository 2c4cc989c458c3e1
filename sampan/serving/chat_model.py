"""``ChatModel``: a generating model with its tokenizer and chat template, as ``sampan serve --model`` loads it.

The directory is a sampan model directory, a Hugging Face one (``config.json``, safetensors,
``tokenizer.json`` and the chat template in ``tokenizer_config.json`` or ``chat_template.jinja``), or
the name of a stored model (``sampan hub list``). Prompts become token ids here: a conversation
through the model's own chat template, a plain prompt through the tokenizer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from sampan.serving.errors import ServingError


def resolve_model_dir(name_or_dir: str) -> Path:
    """A model directory, or the directory of stored model ``name_or_dir``."""
    path = Path(name_or_dir).expanduser()
    if path.is_dir():
        return path.resolve()
    from sampan.store.models import resolve

    return resolve(name_or_dir)


def pick_device(device: str) -> torch.device:
    """``auto`` -> the GPU when torch sees one, else the CPU; ``cuda`` / ``cuda:N`` / ``cpu`` as given."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class ChatModel:
    """Load ``directory`` (see the module docstring) for generation.

    Args:
        directory: a model directory or a store name.
        name: the id clients send as ``model`` (default: the directory's name).
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``. On the CPU a half-precision checkpoint
            runs in float32 (CPU kernels for fp16 / bf16 are slow or missing).
    """

    def __init__(self, directory: str | os.PathLike, name: str | None = None, device: str = "auto"):
        from sampan.models.pretrained import from_pretrained
        from sampan.text.pretrained_tokenizer import PretrainedTokenizer

        self.directory = resolve_model_dir(str(directory))
        self.name = name or Path(str(directory)).name or self.directory.name
        self.device = pick_device(device)
        if not (self.directory / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{self.directory} has no tokenizer.json: --model needs a directory with its "
                                    "tokenizer (save the model with its tokenizer, or copy tokenizer.json beside it)")
        self.tokenizer = PretrainedTokenizer.from_pretrained(self.directory)
        dtype = torch.float32 if self.device.type == "cpu" else None
        model = from_pretrained(self.directory, device=self.device, dtype=dtype)
        if not hasattr(model, "generate"):
            raise ValueError(f"{self.directory} holds a {type(model).__name__}, which does not generate text; "
                             "--model needs a causal language model (Llama, Qwen, GPT)")
        self.model = model.eval()
        config = model.config
        self.num_layers: int = config.num_layers
        self.context_length: int = int(config.max_position_embeddings)
        if self.tokenizer.model_max_length and 0 < self.tokenizer.model_max_length < self.context_length:
            self.context_length = int(self.tokenizer.model_max_length)
        self.eos_ids = sorted(_eos_ids(config, self.tokenizer, self.directory))
        self.pad_id = next((i for i in (config.pad_token_id, self.tokenizer.pad_token_id) if i is not None), 0)
        self.has_chat_template = bool(self.tokenizer.chat_template)
        self.created = int(self.directory.stat().st_mtime)

    # -- prompts ----------------------------------------------------------------------------------
    def chat_prompt(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """The token ids of a conversation rendered by the model's chat template, ready for the reply."""
        if not self.has_chat_template:
            raise ServingError(400, "no_chat_template",
                               f"model {self.name!r} has no chat template (its tokenizer_config.json names none); "
                               "use /v1/completions with a plain prompt, or serve a model with a chat template",
                               param="messages")
        try:
            return list(self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True))
        except ValueError as error:  # ChatTemplateError: the template refused this conversation
            raise ServingError(400, "invalid_messages", f"the chat template refused the messages: {error}",
                               param="messages") from None

    def text_prompt(self, prompt: str | Sequence[int]) -> list[int]:
        """A plain prompt's token ids (a list of ids is taken as given, as OpenAI's API allows)."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        vocab = int(self.model.config.vocab_size)
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise ServingError(400, "invalid_prompt", f"token ids {bad[:5]} are outside the model's vocabulary "
                                                      f"(0..{vocab - 1})", param="prompt")
        return list(prompt)

    def info(self) -> dict[str, Any]:
        return {"id": self.name, "object": "model", "created": self.created, "owned_by": "sampan",
                "context_length": self.context_length}


def _eos_ids(config: Any, tokenizer: Any, directory: Path) -> set[int]:
    """Every id that ends a reply: the model config's, the tokenizer's, generation_config.json's."""
    found: set[int] = set()

    def add(value: Any) -> None:
        if isinstance(value, int):
            found.add(value)
        elif isinstance(value, (list, tuple)):
            found.update(v for v in value if isinstance(v, int))

    add(getattr(config, "eos_token_id", None))
    add(tokenizer.eos_token_id)
    generation = directory / "generation_config.json"
    if generation.is_file():
        try:
            add(json.loads(generation.read_text(encoding="utf-8")).get("eos_token_id"))
        except (ValueError, AttributeError):
            pass  # an unreadable generation config adds nothing; the others still stop the reply
    return found
