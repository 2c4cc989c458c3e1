"""The few numbers of a transformer that a plan needs, from a model name, a config file or a shape."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """A decoder / encoder stack: ``layers`` blocks of width ``hidden`` with ``heads`` heads.

    ``extra_params`` are parameters outside the blocks, embeddings and final norm (ERNIE's pooler
    and MLM transform, token-type embeddings); they are placed on the last pipeline stage.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    ffn: int = 0
    max_positions: int = 2048
    tied: bool = True
    extra_params: int = 0
    family: str = "gpt"

    def __post_init__(self) -> None:
        for field in ("layers", "hidden", "heads", "vocab", "max_positions"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"model {field} must be an integer >= 1, got {value!r}")
        if self.hidden % self.heads:
            raise ValueError(f"model hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.ffn == 0:
            object.__setattr__(self, "ffn", 4 * self.hidden)

    # -- parameter counts (exact for sampan's GPT: biases everywhere, pre-norm, learned positions) --
    @property
    def layer_params(self) -> int:
        h, f = self.hidden, self.ffn
        return 4 * (h * h + h) + (h * f + f + f * h + h) + 4 * h

    def layer_params_per_mp(self, mp: int) -> float:
        """One block's parameters on one tensor-parallel rank: the matmuls split, norms and
        row-parallel biases replicated (as sampan's DTensor plan does)."""
        h, f = self.hidden, self.ffn
        split = 3 * (h * h + h) + h * h + (h * f + f) + f * h
        return split / mp + 2 * h + 4 * h

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def num_parameters(self) -> int:
        head = 0 if self.tied else self.embedding_params
        return (self.embedding_params + self.max_positions * self.hidden + self.layers * self.layer_params
                + 2 * self.hidden + head + self.extra_params)

    def flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs per trained token: ``6 N + 12 L h s`` where ``N`` leaves out the embedding
        lookups but counts the head's ``V h`` (tied or not), as ``GPTConfig.flops_per_token`` counts
        and Megatron / PaLM count MFU."""
        n = self.layers * self.layer_params + 2 * self.hidden + self.extra_params + self.vocab * self.hidden
        return 6 * n + 12 * self.layers * self.hidden * seq_len

    def padded_vocab(self, mp: int, multiple: int = 128) -> int:
        """The vocabulary padded so every tensor-parallel rank gets an equal slice (as Megatron pads)."""
        unit = multiple * mp
        return -(-self.vocab // unit) * unit if self.vocab % mp else self.vocab

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"parameters": self.num_parameters}


def _from_config(name: str, config) -> ModelShape:
    gpt_like = ModelShape(name, config.num_layers, config.hidden_size, config.num_heads, config.vocab_size,
                          config.intermediate_size, config.max_position_embeddings,
                          bool(getattr(config, "tie_word_embeddings", True)), 0, config.model_type)
    extra = config.num_parameters() - gpt_like.num_parameters
    return dataclasses.replace(gpt_like, extra_params=max(0, extra))


def parse_shape(text: str) -> ModelShape:
    """``layers=96,hidden=12288,heads=96,vocab=51200[,ffn=..,max_positions=..,tied=..]``."""
    fields = {}
    allowed = ("layers", "hidden", "heads", "vocab", "ffn", "max_positions", "tied")
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in allowed:
            raise ValueError(f"--model-shape part {part!r} must be KEY=VALUE with KEY one of {list(allowed)}")
        if key == "tied":
            fields[key] = value.strip().lower() in ("1", "true", "yes")
            continue
        try:
            fields[key] = int(value)
        except ValueError:
            raise ValueError(f"--model-shape {key}={value!r} must be an integer") from None
    missing = [k for k in ("layers", "hidden", "heads", "vocab") if k not in fields]
    if missing:
        raise ValueError(f"--model-shape needs {missing} (e.g. layers=96,hidden=12288,heads=96,vocab=51200)")
    return ModelShape(f"shape(L={fields['layers']},h={fields['hidden']})", **fields)


def load_model(spec: str | None = None, shape: str | None = None) -> ModelShape:
    """A model by registry name, by config file (config.json / .toml / .yaml), or by inline shape."""
    if (spec is None) == (shape is None):
        raise ValueError("give exactly one of --model (a name from `sampan models` or a config file) or --model-shape")
    if shape is not None:
        return parse_shape(shape)
    from sampan.planner.zoo import ZOO

    if spec in ZOO:  # the zoo's shapes without importing torch (cold start of `sampan plan`)
        return ZOO[spec]
    from sampan.models import get_config, list_models

    if spec in list_models():
        return _from_config(spec, get_config(spec))
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"--model {spec!r} is neither a model name ({', '.join(list_models())}) nor a config file")
    if path.suffix.lower() == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
    else:
        from sampan.trainer.arguments import load_config_file

        data = load_config_file(path)
        data = data.get("model", data)  # a run file's [model] table works too
    data = dict(data)
    data.pop("architecture", None)  # save_pretrained records the head class; the shape does not depend on it
    base = data.pop("name", None)
    from sampan.models.ernie.config import ErnieConfig
    from sampan.models.gpt.config import GPTConfig

    if base is not None:
        config = get_config(base, **{k: v for k, v in data.items() if k != "model_type"})
    else:
        cls = {"gpt": GPTConfig, "ernie": ErnieConfig}.get(data.get("model_type", "gpt"))
        if cls is None:
            raise ValueError(f"config {path}: model_type must be 'gpt' or 'ernie', got {data.get('model_type')!r}")
        config = cls.from_dict(data)
    # save_pretrained's files are all called config.json: name the model by its directory then
    return _from_config(base or (path.parent.name if path.stem == "config" else path.stem), config)
