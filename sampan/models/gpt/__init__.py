"""GPT: decoder-only causal language models."""

from sampan.models.gpt.config import GPTConfig
from sampan.models.gpt.modeling import GPTForCausalLM, GPTModel

__all__ = ["GPTConfig", "GPTForCausalLM", "GPTModel"]
