"""The few numbers of a transformer that a plan needs, from a model name, a config file or a shape.

Every model family's config is torch-free (``sampan.models.registry``), so a shape is built from
the config itself: ``sampan plan --model qwen2.5-72b`` reads ``get_config("qwen2.5-72b")`` and
imports no torch. Config files may be sampan's own (``model_type`` gpt / ernie / llama, as
``save_pretrained`` writes them, or a run file's ``[model]`` table) or Hugging Face's; HF files
go through the family's adapter (``config_from_hf``) where that adapter imports no torch.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sampan.models.config_base import MoEShape
from sampan.utils.config_files import load_config_file

NORMS = ("layernorm", "rmsnorm")
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
"""Multi-head latent attention (DeepSeek-V2 / V3): read from a config by these names when present."""


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """A decoder / encoder stack: ``layers`` blocks of width ``hidden`` with ``heads`` heads.

    The defaults describe sampan's GPT / ERNIE block: LayerNorm with bias, 4 h x h attention
    matrices with biases, a 2-matrix MLP with biases, a learned position table. The Llama family
    (``family="llama"``) sets RMSNorm, grouped-query attention (``kv_heads`` key/value heads of
    ``head_dim``), the 3-matrix SwiGLU MLP, its own biases and no position table (RoPE).

    ``extra_params`` are parameters outside the blocks, embeddings and final norm (ERNIE's pooler
    and MLM transform, token-type embeddings); they are placed on the last pipeline stage.
    ``extra_lookup_params`` is the part of them that is an embedding table (token types, pinyin
    features): held in memory, but a lookup does no FLOPs.

    Mixture of Experts (``moe``, the config's ``moe_shape()``): the layers in ``moe.moe_layers``
    replace the dense MLP (width ``ffn`` = ``moe.dense_intermediate_size``) by a router ``E x h``,
    ``E`` routed SwiGLU experts of width ``moe.expert_intermediate_size`` (``top_k`` of them run
    per token) and a shared SwiGLU of width ``moe.shared_intermediate_size``. Multi-head latent
    attention (``kv_lora_rank > 0``, DeepSeek-V3): q through a rank-``q_lora_rank`` bottleneck
    (or one ``h -> H (d_nope + d_rope)`` matrix when it is 0), keys and values from a compressed
    ``kv_lora_rank`` latent plus one shared ``d_rope`` key, values ``v_head_dim`` wide.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    ffn: int = 0
    """MLP width (0: ``4 * hidden``); for a gated MLP, the width of gate and up."""
    max_positions: int = 2048
    """The config's ``max_position_embeddings`` (the longest sequence it was built for)."""
    tied: bool = True
    extra_params: int = 0
    family: str = "gpt"
    kv_heads: int = 0
    """Key / value heads (grouped-query attention); 0: as many as ``heads``."""
    head_dim: int = 0
    """Width of one head; 0: ``hidden // heads`` (Qwen3 sets it so ``heads * head_dim != hidden``)."""
    gated_mlp: bool = False
    """SwiGLU: gate and up ``h -> ffn`` (column-parallel), down ``ffn -> h`` (row-parallel)."""
    norm: str = "layernorm"
    """"layernorm" (weight and bias) or "rmsnorm" (weight only)."""
    qkv_bias: bool = True
    out_bias: bool = True
    mlp_bias: bool = True
    qk_norm: bool = False
    """Per-head RMSNorm of q and k (Qwen3): two ``head_dim`` weights per layer."""
    learned_positions: int | None = None
    """Rows of the position-embedding table; None: ``max_positions``; 0 with rotary positions."""
    extra_lookup_params: int = 0
    registered: str | None = dataclasses.field(default=None, compare=False)
    """The registry name the shape was read from (None for a config file or an inline shape)."""
    config: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False, repr=False)
    """The source config's fields (``ModelConfig.to_dict()``), for the run file's ``[model]`` table."""
    moe: MoEShape | None = None
    """The Mixture-of-Experts MLPs (``config.moe_shape()``); None: a dense model."""
    q_lora_rank: int = 0
    """MLA: rank of the query bottleneck (0: one ``h -> H (d_nope + d_rope)`` query matrix)."""
    kv_lora_rank: int = 0
    """MLA: rank of the compressed key/value latent; 0: ordinary (grouped-query) attention."""
    qk_nope_head_dim: int = 0
    """MLA: per-head query/key width without rotary positions."""
    qk_rope_head_dim: int = 0
    """MLA: per-head query/key width with rotary positions (the key's part is shared by all heads)."""
    v_head_dim: int = 0
    """MLA: per-head value width."""
    n_group: int = 1
    """MoE group-limited routing: the experts form ``n_group`` equal groups (1 = off) ..."""
    topk_group: int = 1
    """... and a token picks experts only in its best ``topk_group`` groups (DeepSeek-V3: 4 of 8)."""
    shared_expert_gate: bool = False
    """MoE: the shared experts' output is scaled by ``sigmoid(Linear(h, 1)(x))`` (Qwen2-MoE)."""

    def __post_init__(self) -> None:
        for field in ("layers", "hidden", "heads", "vocab", "max_positions"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"model {field} must be an integer >= 1, got {value!r}")
        for field in ("kv_heads", "head_dim", "ffn", "extra_params", "extra_lookup_params"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"model {field} must be an integer >= 0, got {value!r}")
        for field in (*MLA_FIELDS, "n_group", "topk_group"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"model {field} must be an integer >= 0, got {value!r}")
        if self.mla:
            if not (self.qk_nope_head_dim + self.qk_rope_head_dim) or not self.v_head_dim:
                raise ValueError("multi-head latent attention (kv_lora_rank > 0) needs qk_nope_head_dim + "
                                 "qk_rope_head_dim > 0 and v_head_dim > 0 (DeepSeek-V3: 128, 64, 128)")
            # Every query head has its own key and value (decompressed from the latent): no KV groups.
            object.__setattr__(self, "kv_heads", self.heads)
            object.__setattr__(self, "head_dim", self.qk_nope_head_dim + self.qk_rope_head_dim)
        if self.head_dim == 0:
            if self.hidden % self.heads:
                raise ValueError(f"model hidden ({self.hidden}) must be divisible by heads ({self.heads})")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.heads % self.kv_heads:
            raise ValueError(f"model kv_heads ({self.kv_heads}) must divide heads ({self.heads}): each key/value "
                             "head serves a whole group of query heads")
        if self.ffn == 0:
            object.__setattr__(self, "ffn", 4 * self.hidden)
        if self.norm not in NORMS:
            raise ValueError(f"model norm must be one of {list(NORMS)}, got {self.norm!r}")
        if self.learned_positions is None:
            object.__setattr__(self, "learned_positions", self.max_positions)
        if self.extra_lookup_params > self.extra_params:
            raise ValueError(f"model extra_lookup_params ({self.extra_lookup_params}) cannot exceed extra_params "
                             f"({self.extra_params})")
        if self.moe is not None:
            bad = [i for i in self.moe.moe_layers if not 0 <= i < self.layers]
            if bad or len(set(self.moe.moe_layers)) != len(self.moe.moe_layers):
                raise ValueError(f"model moe_layers must be distinct layer indices in [0, {self.layers}), "
                                 f"got {list(self.moe.moe_layers)}")
            for field in ("num_experts", "expert_intermediate_size"):
                if getattr(self.moe, field) < 1:
                    raise ValueError(f"model moe {field} must be >= 1, got {getattr(self.moe, field)!r}")
            if self.n_group < 1 or self.moe.num_experts % self.n_group or not 1 <= self.topk_group <= self.n_group:
                raise ValueError(f"model n_group ({self.n_group}) must divide the {self.moe.num_experts} experts and "
                                 f"topk_group ({self.topk_group}) be in [1, n_group]")

    # -- widths ---------------------------------------------------------------------------------
    @property
    def q_width(self) -> int:
        """Width of the query projection and of the attention output, ``heads * head_dim``."""
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of each of the key and value projections, ``kv_heads * head_dim``."""
        return self.kv_heads * self.head_dim

    @property
    def mlp_in_matrices(self) -> int:
        """Column-parallel MLP matrices ``h -> ffn``: fc1 (1), or gate and up (2)."""
        return 2 if self.gated_mlp else 1

    @property
    def norm_params(self) -> int:
        """Parameters of one norm over ``hidden``."""
        return self.hidden * (2 if self.norm == "layernorm" else 1)

    @property
    def mla(self) -> bool:
        """Whether attention is multi-head latent attention (``kv_lora_rank > 0``)."""
        return self.kv_lora_rank > 0

    @property
    def uniform(self) -> bool:
        """Every block the same dense block with (grouped-query) attention: the families before MoE
        and MLA, priced by the original closed forms."""
        return self.moe is None and not self.mla

    @property
    def v_width(self) -> int:
        """Width of the attention output (the values of all heads): ``H d``, or ``H d_v`` with MLA."""
        return self.heads * self.v_head_dim if self.mla else self.q_width

    @property
    def moe_layer_ids(self) -> frozenset[int]:
        """Indices of the layers whose MLP is a Mixture-of-Experts block (empty for a dense model)."""
        return frozenset(self.moe.moe_layers) if self.moe is not None else frozenset()

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe.moe_layers) if self.moe is not None else 0

    # -- parameter counts (exact per family: tests/test_planner_cold_start.py checks every name) ---
    def _attention_split(self) -> int:
        """Attention parameters tensor parallel splits: q / k / v (column-parallel, with biases) and
        the out-projection's weight; with MLA the up-projections ``q_b`` (or ``q``), ``kv_b`` and ``o``."""
        h, q, kv = self.hidden, self.q_width, self.kv_width
        if not self.mla:
            return (h * q + q * self.qkv_bias) + 2 * (h * kv + kv * self.qkv_bias) + q * h
        q_in = self.q_lora_rank or h
        kv_b = self.kv_lora_rank * self.heads * (self.qk_nope_head_dim + self.v_head_dim)
        return q_in * q + kv_b + self.v_width * h

    def _attention_whole(self) -> int:
        """MLA's down-projections and their norms, which every tensor-parallel rank holds whole (the
        latents are narrow: splitting them saves little and costs a gather): ``q_a`` ``h x r_q`` and
        its norm, ``kv_a`` ``h x (r_kv + d_rope)`` and its norm. 0 without MLA."""
        if not self.mla:
            return 0
        per_norm = 2 if self.norm == "layernorm" else 1
        q_a = (self.hidden + per_norm) * self.q_lora_rank
        kv_a = self.hidden * (self.kv_lora_rank + self.qk_rope_head_dim) + per_norm * self.kv_lora_rank
        return q_a + kv_a

    def _split_params(self) -> int:
        """One block's parameters that tensor parallel splits over mp ranks: column-parallel
        q / k / v and fc1 (or gate / up) with their biases, row-parallel out-proj and fc2 (or down)
        weights."""
        h, f, q, kv = self.hidden, self.ffn, self.q_width, self.kv_width
        if self.mla:
            attention = self._attention_split()
        else:
            attention = (h * q + q * self.qkv_bias) + 2 * (h * kv + kv * self.qkv_bias) + q * h
        mlp = self.mlp_in_matrices * (h * f + f * self.mlp_bias) + f * h
        return attention + mlp

    def _row_biases(self) -> int:
        # Row-parallel biases are added after the all-reduce, so every rank holds them whole.
        return self.hidden * self.out_bias + self.hidden * self.mlp_bias

    def _qk_norm_params(self) -> int:
        return 2 * self.head_dim * self.qk_norm

    @property
    def layer_params(self) -> int:
        """One dense block's parameters (attention, MLP of width ``ffn``, norms)."""
        return (self._split_params() + self._row_biases() + 2 * self.norm_params + self._qk_norm_params()
                + self._attention_whole())

    def layer_params_per_mp(self, mp: int) -> float:
        """One dense block's parameters on one tensor-parallel rank: the matmuls split, norms and
        row-parallel biases replicated (as sampan's DTensor plans do)."""
        return _layer_params_per_mp(self, mp)

    # -- Mixture of Experts ------------------------------------------------------------------------
    @property
    def expert_params(self) -> int:
        """One routed expert: a SwiGLU ``h -> f_e`` (gate, up) and ``f_e -> h`` (down), no biases."""
        return 3 * self.hidden * self.moe.expert_intermediate_size if self.moe is not None else 0

    @property
    def router_params(self) -> int:
        """One MoE block's router, ``E x h``."""
        return self.moe.num_experts * self.hidden if self.moe is not None else 0

    @property
    def shared_expert_params(self) -> int:
        """One MoE block's shared-expert SwiGLU (all shared experts together) and its gate, if any."""
        if self.moe is None:
            return 0
        return 3 * self.hidden * self.moe.shared_intermediate_size + self.hidden * self.shared_expert_gate

    def moe_layer_params_per_mp(self, mp: int) -> float:
        """One MoE block's parameters on one tensor-parallel rank, routed experts left out (expert
        parallelism places those): attention split as in a dense block; router and shared experts
        whole (tensor parallel leaves MoE blocks replicated: the MoE contract)."""
        return (self._attention_split() / mp + self.hidden * self.out_bias + 2 * self.norm_params
                + self._qk_norm_params() + self._attention_whole() + self.router_params + self.shared_expert_params)

    @property
    def moe_layer_params(self) -> int:
        """One MoE block's parameters, every routed expert included."""
        if self.moe is None:
            return 0
        return (self._attention_split() + self.hidden * self.out_bias + 2 * self.norm_params + self._qk_norm_params()
                + self._attention_whole() + self.router_params + self.shared_expert_params
                + self.moe.num_experts * self.expert_params)

    def local_expert_params(self, ep: int) -> float:
        """Routed-expert parameters of one MoE block on one expert-parallel rank (``E / ep`` experts)."""
        return self.moe.num_experts / ep * self.expert_params if self.moe is not None else 0.0

    @property
    def blocks_params(self) -> int:
        """Every block's parameters."""
        if self.uniform:
            return self.layers * self.layer_params
        n_moe = self.num_moe_layers
        return (self.layers - n_moe) * self.layer_params + n_moe * self.moe_layer_params

    @property
    def inactive_params(self) -> int:
        """Routed-expert parameters a token does not use: ``(E - k)`` experts in every MoE block."""
        if self.moe is None:
            return 0
        return self.num_moe_layers * (self.moe.num_experts - self.moe.top_k) * self.expert_params

    @property
    def embedding_params(self) -> int:
        """The token-embedding table (and an untied head's matrix), ``vocab * hidden``."""
        return self.vocab * self.hidden

    @property
    def num_parameters(self) -> int:
        """Every parameter of the model (a tied head counted once), as the config's ``num_parameters()``."""
        head = 0 if self.tied else self.embedding_params
        if self.uniform:
            return (self.embedding_params + self.learned_positions * self.hidden + self.layers * self.layer_params
                    + self.norm_params + head + self.extra_params)
        return (self.embedding_params + self.learned_positions * self.hidden + self.blocks_params
                + self.norm_params + head + self.extra_params)

    @property
    def num_active_parameters(self) -> int:
        """Parameters one token uses (``top_k`` routed experts per MoE block), as the config's
        ``num_active_parameters()``; ``num_parameters`` for a dense model."""
        return self.num_parameters - self.inactive_params

    def attention_flops_per_position(self) -> int:
        """Per token, layer and key position: ``6 (H d_qk + H d_v)``, the score and value matmuls,
        forward and backward (``12 H d`` when keys and values are ``d`` wide)."""
        return 12 * self.q_width if not self.mla else 6 * (self.q_width + self.v_width)

    def flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs per trained token: ``6 N + 12 L H d s`` where ``N`` leaves out the embedding
        lookups but counts the head's ``V h`` (tied or not), as the families' ``flops_per_token``
        count and Megatron / PaLM count MFU. The attention term uses the query heads' width
        ``H d`` (``h`` for GPT): grouped-query attention shares keys and values between heads but
        every query head still scores every key. An MoE model's ``N`` is its active parameters
        (router included); MLA's attention term is ``6 L H (d_qk + d_v) s``."""
        if self.uniform:
            n = (self.layers * self.layer_params + self.norm_params + self.extra_params - self.extra_lookup_params
                 + self.vocab * self.hidden)
            return 6 * n + 12 * self.layers * self.q_width * seq_len
        n = (self.blocks_params - self.inactive_params + self.norm_params + self.extra_params
             - self.extra_lookup_params + self.vocab * self.hidden)
        return 6 * n + self.layers * self.attention_flops_per_position() * seq_len

    def padded_vocab(self, mp: int, multiple: int = 128) -> int:
        """The vocabulary padded so every tensor-parallel rank gets an equal slice (as Megatron pads)."""
        unit = multiple * mp
        return -(-self.vocab // unit) * unit if self.vocab % mp else self.vocab

    def describe(self) -> str:
        """One line saying what the blocks are (the table prints it under its title)."""
        heads = (f"{self.heads} heads x {self.head_dim}" if self.kv_heads == self.heads
                 else f"{self.heads} q / {self.kv_heads} kv heads x {self.head_dim} (GQA)")
        biases = "/".join(name for name, on in (("qkv", self.qkv_bias), ("out", self.out_bias), ("mlp", self.mlp_bias))
                          if on)
        parts = [f"{self.family}: {self.layers} layers", f"h {self.hidden}", heads,
                 f"SwiGLU {self.ffn}" if self.gated_mlp else f"MLP {self.ffn}",
                 "RMSNorm" if self.norm == "rmsnorm" else "LayerNorm", f"{biases} bias" if biases else "no bias"]
        if self.qk_norm:
            parts.append("q/k norm")
        parts.append("learned positions" if self.learned_positions else "RoPE")
        parts.append("tied head" if self.tied else "untied head")
        if self.moe is not None and self.n_group > 1:
            parts.append(f"routing in {self.topk_group} of {self.n_group} expert groups")
        if self.mla:
            parts[2] = (f"{self.heads} heads MLA (q rank {self.q_lora_rank}, kv rank {self.kv_lora_rank}, "
                        f"d {self.qk_nope_head_dim}+{self.qk_rope_head_dim} / v {self.v_head_dim})")
        if self.moe is not None:
            m = self.moe
            shared = f" + shared {m.shared_intermediate_size}" if m.shared_intermediate_size else ""
            parts[3] = (f"MoE {m.num_experts} experts top-{m.top_k} x {m.expert_intermediate_size}{shared} in "
                        f"{self.num_moe_layers} layers, dense {self.ffn} in {self.layers - self.num_moe_layers}")
        return ", ".join(parts)

    def to_dict(self) -> dict:
        """The shape's fields (not the source config) and its parameter count, as plain JSON values."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "config"}
        if self.moe is None:
            out.pop("moe")
        else:
            out["moe"] = dataclasses.asdict(self.moe)
            out["active_parameters"] = self.num_active_parameters
        if not self.mla:
            for field in MLA_FIELDS:
                out.pop(field)
        if self.moe is None:
            for field in ("n_group", "topk_group", "shared_expert_gate"):
                out.pop(field)
        return out | {"parameters": self.num_parameters}


@functools.lru_cache(maxsize=4096)  # the planner's search asks for the same few shapes millions of times
def _layer_params_per_mp(model: ModelShape, mp: int) -> float:
    # The terms are added in this order so GPT shapes give the float they always gave.
    per_rank = model._split_params() / mp + model._row_biases() + 2 * model.norm_params + model._qk_norm_params()
    return per_rank + model._attention_whole() if model.mla else per_rank


def shape_from_config(name: str, config: Any, registered: str | None = None) -> ModelShape:
    """The :class:`ModelShape` of a family's config (``GPTConfig``, ``ErnieConfig``, ``LlamaConfig``,
    an MoE family's).

    The block is read from the config's fields; what lies outside blocks, embeddings and the final
    norm (ERNIE's pooler, MLM transform and token-type tables) is taken from the config's own
    ``num_parameters()`` / ``flops_per_token()``, so the shape's totals equal the config's. An MoE
    family's ``moe_shape()`` gives the experts (the dense layers' MLP is
    ``moe.dense_intermediate_size`` wide); MLA is read from ``kv_lora_rank`` and the other
    ``MLA_FIELDS`` when the config has them.
    """
    # The block's make-up comes from the config's own description (ModelConfig's gated_mlp,
    # norm_kind, biases, qk_norm, position_table_rows), so a new family needs no code here.
    moe = config.moe_shape() if hasattr(config, "moe_shape") else None
    mla = bool(getattr(config, "kv_lora_rank", 0))
    extra_fields = {field: int(getattr(config, field, 0) or 0) for field in MLA_FIELDS} if mla else {}
    if moe is not None:  # group-limited routing (DeepSeek-V3), when the config has it
        extra_fields |= {field: int(getattr(config, field, 1) or 1) for field in ("n_group", "topk_group")}
        layer_fields = config.moe_config_fields() if hasattr(config, "moe_config_fields") else {}
        extra_fields["shared_expert_gate"] = bool(layer_fields.get("shared_expert_gate", False))
    block = ModelShape(
        name=name, layers=config.num_layers, hidden=config.hidden_size, heads=config.num_heads,
        vocab=config.vocab_size, ffn=moe.dense_intermediate_size if moe is not None else config.intermediate_size,
        max_positions=config.max_position_embeddings,
        tied=bool(getattr(config, "tie_word_embeddings", True)), family=config.model_type,
        kv_heads=0 if mla else getattr(config, "num_kv_heads", 0), head_dim=0 if mla else getattr(config, "head_dim", 0),
        gated_mlp=config.gated_mlp, norm=config.norm_kind,
        qkv_bias=config.qkv_bias, out_bias=config.out_bias, mlp_bias=config.mlp_bias, qk_norm=config.qk_norm,
        learned_positions=config.position_table_rows, registered=registered, config=config.to_dict(), moe=moe, **extra_fields)
    extra = max(0, config.num_parameters() - block.num_parameters)
    # The config's FLOP count says how much of the extra multiplies on every token (6 N + attention).
    attention = block.layers * block.attention_flops_per_position()
    active_blocks = block.blocks_params - block.inactive_params
    matmul_extra = (config.flops_per_token(1) - attention) // 6 - (
        active_blocks + block.norm_params + block.vocab * block.hidden)
    lookup = min(extra, max(0, extra - matmul_extra))
    return dataclasses.replace(block, extra_params=extra, extra_lookup_params=lookup)


INLINE_LLAMA_BASE = "llama2-7b"
"""The registered config whose non-shape settings an inline Llama-style ``--model-shape`` takes."""

SHAPE_KEYS = ("layers", "hidden", "heads", "vocab", "ffn", "max_positions", "tied", "kv_heads", "head_dim", "gated")


def parse_shape(text: str) -> ModelShape:
    """``layers=96,hidden=12288,heads=96,vocab=51200[,ffn=..,max_positions=..,tied=..]``: a GPT block.

    ``gated=true`` (or ``kv_heads=`` / ``head_dim=``) makes it a Llama-family block instead:
    RMSNorm, no biases, rotary positions, a SwiGLU MLP of width ``ffn`` (required) and ``kv_heads``
    key/value heads of ``head_dim``; ``tied`` defaults to false there, as in Llama.
    """
    from sampan.utils.settings import coerce, parse_bool, split_assignment

    fields: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, value = split_assignment(part, "--model-shape part", "layers=96")
        if key not in SHAPE_KEYS:
            raise ValueError(f"--model-shape part {part!r} must be KEY=VALUE with KEY one of {list(SHAPE_KEYS)}")
        if key in ("tied", "gated"):
            fields[key] = parse_bool(value, f"--model-shape {key}")
        else:
            fields[key] = coerce(value, 0, f"--model-shape {key}")
    missing = [k for k in ("layers", "hidden", "heads", "vocab") if k not in fields]
    if missing:
        raise ValueError(f"--model-shape needs {missing} (e.g. layers=96,hidden=12288,heads=96,vocab=51200)")
    name = f"shape(L={fields['layers']},h={fields['hidden']})"
    llama_keys = [k for k in ("kv_heads", "head_dim") if k in fields]
    gated = fields.pop("gated", True if llama_keys else False)
    if not gated:
        if llama_keys:
            raise ValueError(f"--model-shape {'/'.join(llama_keys)}= describe a Llama-family block, whose MLP is "
                             "gated (SwiGLU); drop gated=false, or drop them for a GPT block")
        return ModelShape(name, **fields)
    if "ffn" not in fields:
        raise ValueError("--model-shape gated=true needs ffn= (the SwiGLU width of gate and up, e.g. ffn=14336 "
                         "for hidden=4096)")
    from sampan.models.registry import get_config  # torch-free; the config validates the shape too

    # Llama 2's other settings (plain RoPE, no biases), so a run file can name it as the base.
    config = get_config(INLINE_LLAMA_BASE, num_layers=fields["layers"], hidden_size=fields["hidden"],
                        num_heads=fields["heads"], num_kv_heads=fields.get("kv_heads", 0),
                        head_dim=fields.get("head_dim", 0), vocab_size=fields["vocab"],
                        intermediate_size=fields["ffn"], max_position_embeddings=fields.get("max_positions", 2048),
                        tie_word_embeddings=fields.get("tied", False))
    return shape_from_config(name, config)


def _read_file(path: Path) -> dict[str, Any]:
    """A config file: a Hugging Face or sampan ``config.json``, or a run file (TOML / YAML) whose
    ``[model]`` table names the model."""
    data = load_config_file(path)
    if path.suffix.lower() != ".json":
        data = data.get("model", data)  # a run file's [model] table works too
    return dict(data)


def _is_sampan_config(data: Mapping[str, Any], families: Mapping[str, Any]) -> bool:
    """sampan's config.json names one ``architecture``, HF's lists ``architectures``. Without
    either: sampan's if it says ``num_layers`` (HF says ``num_hidden_layers`` / ``n_layer``) or
    if every key is a field of the family's config."""
    if "architecture" in data:
        return True
    if "architectures" in data:
        return False
    if "num_layers" in data:
        return True
    spec = families.get(data.get("model_type", "gpt"))
    if spec is None:
        return False
    fields = {f.name for f in dataclasses.fields(spec.config_class)}
    return set(data) - {"model_type"} <= fields


def _config_from_hf(data: Mapping[str, Any], path: Path):
    from sampan.models.registry import spec_for_hf_model_type

    model_type = data.get("model_type")
    if not isinstance(model_type, str):
        raise ValueError(f"config {path} has no model_type: it is neither a sampan config (gpt / ernie / llama) "
                         "nor a Hugging Face one")
    spec = spec_for_hf_model_type(model_type)
    try:  # the families' HF adapters import no torch (tests/test_planner_cold_start.py checks)
        return spec.hf_adapter().config_from_hf(data)
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"config {path}: {err}") from err


def load_config(spec: str) -> tuple[str, Any]:
    """``(name, config)`` of a registered model name or a config file (sampan's or Hugging Face's
    config.json, a run file .toml / .yaml). Imports no torch (except for a YAML file)."""
    from sampan.models.registry import FAMILIES, get_config, list_models

    if spec in list_models():
        return spec, get_config(spec)
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"--model {spec!r} is neither a model name ({', '.join(list_models())}) nor a config file")
    data = _read_file(path)
    sampan_config = _is_sampan_config(data, FAMILIES)
    data.pop("architecture", None)  # save_pretrained records the head class; the shape does not depend on it
    base = data.pop("name", None)
    if base is not None:  # a run file's [model]: a registered name and overrides of its fields
        config = get_config(base, **{k: v for k, v in data.items() if k != "model_type"})
    elif sampan_config:
        model_type = data.get("model_type", "gpt")
        if model_type not in FAMILIES:
            raise ValueError(f"config {path}: model_type must be one of sampan's families {sorted(FAMILIES)} or a "
                             f"Hugging Face model_type in a Hugging Face config.json, got {model_type!r}")
        config = FAMILIES[model_type].config_class.from_dict(data)
    else:
        config = _config_from_hf(data, path)
    # save_pretrained's files are all called config.json: name the model by its directory then
    return base or (path.parent.name if path.stem == "config" else path.stem), config


def load_model(spec: str | None = None, shape: str | None = None) -> ModelShape:
    """A model by registry name, by config file (sampan's or Hugging Face's config.json, a run file
    .toml / .yaml), or by inline shape. Imports no torch (except for a YAML file)."""
    if (spec is None) == (shape is None):
        raise ValueError("give exactly one of --model (a name from `sampan models` or a config file) or --model-shape")
    if shape is not None:
        return parse_shape(shape)
    from sampan.models.registry import list_models

    name, config = load_config(spec)
    return shape_from_config(name, config, registered=spec if spec in list_models() else None)
