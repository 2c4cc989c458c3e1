"""DeepSeek-V3: multi-head latent attention (MLA), dense then MoE layers, optional multi-token prediction.

Module names follow Hugging Face's (``model.layers.3.self_attn.kv_b_proj``, ``model.layers.3.mlp.gate``),
so checkpoints map one to one except for the experts (stacked here, one by one on the Hub) and the
MTP modules (``mtp.K`` here, ``model.layers.{num_layers + K}`` on the Hub). No parallelism lives
here: ``parallelize.py`` declares the splits.

The KV cache holds what MLA compresses a token into, not per-head keys and values: the
normalised latent ``[b, 1, s, kv_lora_rank]`` as the cache's "key" and the rotated shared key
``[b, 1, s, qk_rope_head_dim]`` as its "value" (``sampan.nn.KVCache`` takes any last widths), i.e.
``kv_lora_rank + qk_rope_head_dim`` numbers per token per layer (576 for DeepSeek-V3, against
``128 * (192 + 128)`` = 40,960 for its per-head keys and values). Each step expands the whole
cached latent through ``kv_b_proj`` into keys and values; the weight-absorbed form (folding
``kv_b_proj`` into the query and output projections, so decoding attends in the latent space) is
a later optimisation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sampan.models.deepseek_v3.config import DeepseekV3Config
from sampan.models.generation import GenerationMixin
from sampan.models.init import init_transformer_weights
from sampan.models.losses import next_token_count, next_token_loss, token_cross_entropy
from sampan.models.pretrained import PretrainedModel
from sampan.nn import KVCache, Layer
from sampan.nn.attention import build_decoder_mask, default_position_ids
from sampan.nn.mlp import ACTIVATIONS
from sampan.nn.moe import MoE
from sampan.nn.moe_config import MoEConfig
from sampan.nn.rms_norm import RMSNorm
from sampan.nn.rope import RotaryEmbedding, apply_rotary, yarn_mscale

# The q / kv latent norms use RMSNorm's default epsilon, not rms_norm_eps (as DeepSeek's and
# transformers' code build them).
LATENT_NORM_EPS = 1e-6


def apply_rotary_interleaved(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                             sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q, k [b, heads, s, d]`` whose dimensions are interleaved pairs ``(x0, x1), (x2, x3) ...``
    (DeepSeek's checkpoints); ``cos, sin [b | 1, s, d]`` are :class:`RotaryEmbedding`'s tables.

    The result is in the half-split layout (rotated even dimensions, then odd ones), as
    transformers returns it: q and k are permuted alike, so their dot products are unchanged."""
    half = cos.shape[-1] // 2
    cos, sin = cos[..., :half].unsqueeze(1), sin[..., :half].unsqueeze(1)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    return rotate(q), rotate(k)


def softmax_scale(config: DeepseekV3Config) -> float:
    """``qk_head_dim ** -0.5``, times YaRN's ``mscale(factor, mscale_all_dim) ** 2`` when the rope is
    scaled with ``mscale_all_dim`` (DeepSeek scales the whole ``q k^T``, not only the rotary part)."""
    scale = config.qk_head_dim ** -0.5
    scaling = config.rope_scaling or {}
    if scaling.get("mscale_all_dim"):
        mscale = yarn_mscale(scaling["factor"], scaling["mscale_all_dim"])
        scale *= mscale * mscale
    return scale


class DeepseekV3Attention(Layer):
    """Multi-head latent attention through ``scaled_dot_product_attention``.

    Queries: ``q_b_proj(norm(q_a_proj(x)))`` (or ``q_proj(x)``), split per head into a part without
    positions and a rotary part. Keys and values: ``kv_a_proj_with_mqa(x)`` gives the latent and
    one rotary key shared by all heads; the normalised latent goes through ``kv_b_proj`` into
    per-head key parts and values. Heads are inferred from the projections' width at run time, so
    a tensor-parallel split of q_b_proj / kv_b_proj / o_proj by heads runs this code unchanged.
    """

    def __init__(self, config: DeepseekV3Config):
        super().__init__()
        h, H, bias = config.hidden_size, config.num_heads, config.attention_bias
        self.nope_dim, self.rope_dim, self.v_dim = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        self.kv_lora_rank = config.kv_lora_rank
        self.dropout = config.attention_dropout
        self.interleave = config.rope_interleave
        self.scaling = softmax_scale(config)
        if config.q_lora_rank is None:
            self.q_proj = nn.Linear(h, H * config.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(h, config.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(config.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(config.q_lora_rank, H * config.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, config.kv_lora_rank + config.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(config.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(config.kv_lora_rank, H * (config.qk_nope_head_dim + config.v_head_dim), bias=False)
        self.o_proj = nn.Linear(H * config.v_head_dim, h, bias=bias)
        self.rotary = RotaryEmbedding(config.qk_rope_head_dim, config.rope_theta, config.rope_scaling)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        kv_cache: KVCache | None = None,
        layer_idx: int = 0,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``x [b, s, h]``; ``position_embeddings`` are the rotary ``(cos, sin)`` of the rope width,
        computed for positions after the cache when omitted (a pipeline stage runs layers alone)."""
        b, s, _ = x.shape
        q = self.q_proj(x) if hasattr(self, "q_proj") else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(b, s, -1, self.nope_dim + self.rope_dim).transpose(1, 2)
        q_nope, q_rot = q.split([self.nope_dim, self.rope_dim], dim=-1)
        latent, k_rot = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        latent = self.kv_a_layernorm(latent).view(b, 1, s, self.kv_lora_rank)
        k_rot = k_rot.reshape(b, 1, s, self.rope_dim)
        if position_embeddings is None:
            past = kv_cache.seq_len(layer_idx) if kv_cache is not None else 0
            position_embeddings = self.rotary(torch.arange(past, past + s, device=x.device)[None], x.dtype)
        rotate = apply_rotary_interleaved if self.interleave else apply_rotary
        q_rot, k_rot = rotate(q_rot, k_rot, *position_embeddings)
        if kv_cache is not None:  # the compressed form is what is cached
            latent, k_rot = kv_cache.update(layer_idx, latent, k_rot)
        t = latent.shape[2]
        kv = self.kv_b_proj(latent).view(b, t, -1, self.nope_dim + self.v_dim).transpose(1, 2)
        k_nope, v = kv.split([self.nope_dim, self.v_dim], dim=-1)
        k = torch.cat([k_nope, k_rot.expand(-1, k_nope.shape[1], -1, -1)], dim=-1)
        q = torch.cat([q_nope, q_rot], dim=-1)
        # Flash-style kernels (the CPU's among them) want one head width for q, k and v; with a
        # narrower v SDPA falls back to the math kernel, which keeps the whole fp32 score matrix
        # (8.6 GB a layer for DeepSeek-V3 at 4,096 tokens). Zero columns leave the output unchanged.
        pad = q.shape[-1] - self.v_dim
        if pad > 0:
            v = F.pad(v, (0, pad))
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=self.scaling,
            dropout_p=self.dropout if self.training else 0.0,
        )
        if pad > 0:
            out = out[..., : self.v_dim]
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class DeepseekV3MLP(Layer):
    """SwiGLU: ``down(act(gate(x)) * up(x))`` (the dense layers' MLP)."""

    def __init__(self, config: DeepseekV3Config):
        super().__init__()
        h, f = config.hidden_size, config.intermediate_size
        self.activation = config.activation
        self.gate_proj = nn.Linear(h, f, bias=False)
        self.up_proj = nn.Linear(h, f, bias=False)
        self.down_proj = nn.Linear(f, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(ACTIVATIONS[self.activation](self.gate_proj(x)) * self.up_proj(x))


def moe_config(config: DeepseekV3Config) -> MoEConfig:
    """The MoE block of DeepSeek-V3's MoE layers: sigmoid scores, group-limited top-k, the
    aux-loss-free correction bias, routed scaling and the shared experts."""
    return MoEConfig(
        hidden_size=config.hidden_size, num_experts=config.n_routed_experts, top_k=config.num_experts_per_tok,
        expert_intermediate_size=config.moe_intermediate_size, activation=config.activation,
        shared_intermediate_size=config.n_shared_experts * config.moe_intermediate_size, score_func="sigmoid",
        norm_topk_prob=config.norm_topk_prob, routed_scaling_factor=config.routed_scaling_factor,
        n_group=config.n_group, topk_group=config.topk_group, score_correction_bias=True,
        bias_update_rate=config.bias_update_rate, aux_loss=config.aux_loss, aux_loss_coef=config.aux_loss_coef,
    )


class DeepseekV3DecoderLayer(Layer):
    """``x + attn(norm(x))`` then ``h + mlp(norm(h))``; ``mlp`` is a SwiGLU or a ``sampan.nn.MoE``."""

    def __init__(self, config: DeepseekV3Config, moe: bool):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DeepseekV3Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MoE(moe_config(config)) if moe else DeepseekV3MLP(config)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        kv_cache: KVCache | None = None,
        layer_idx: int = 0,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), attn_mask, is_causal, kv_cache, layer_idx,
                               position_embeddings)
        return x + self.mlp(self.post_attention_layernorm(x))


class SharedHead(Layer):
    """An MTP module's output norm; the vocabulary projection after it is the main model's head
    (held there, not here: the Hub checkpoint's ``shared_head.head`` is a copy of ``lm_head``)."""

    def __init__(self, config: DeepseekV3Config):
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DeepseekV3MTPModule(DeepseekV3DecoderLayer):
    """One multi-token-prediction module (DeepSeek-V3 section 2.2): an MoE decoder layer over
    ``eh_proj([enorm(embed(t_{i+k})); hnorm(h_i)])``, then ``shared_head.norm`` and the main head.

    The order of the concatenation (embedding first) and ``h`` being the previous depth's output
    after its final norm follow vLLM's DeepSeek MTP, which runs the published MTP weights."""

    def __init__(self, config: DeepseekV3Config):
        super().__init__(config, moe=True)
        h = config.hidden_size
        self.enorm = RMSNorm(h, config.rms_norm_eps)
        self.hnorm = RMSNorm(h, config.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.shared_head = SharedHead(config)


def _init_weights(model: nn.Module, std: float) -> None:
    init_transformer_weights(model, std)
    for module in model.modules():  # the router and the stacked experts are raw parameters, not Linears
        if isinstance(module, MoE):
            module.reset_parameters(std)


class DeepseekV3Model(Layer, PretrainedModel):
    """Token embeddings, ``num_layers`` decoder layers (the first ``first_k_dense_replace`` dense,
    the rest MoE) and a final RMSNorm; returns hidden states."""

    config_class = DeepseekV3Config
    head = "none"

    def __init__(self, config: DeepseekV3Config):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.layers = nn.ModuleList(DeepseekV3DecoderLayer(config, moe=i >= config.first_k_dense_replace)
                                    for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.qk_rope_head_dim, config.rope_theta, config.rope_scaling)
        _init_weights(self, config.initializer_range)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        segment_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``input_ids [b, s]`` -> hidden states ``[b, s, h]``, as ``LlamaModel.forward``:
        ``attention_mask [b, past + s]`` (1 = real token; left padding counts positions from each
        row's first real token), ``kv_cache`` (the MLA latents of earlier calls), ``segment_ids``
        for packed sequences (give ``position_ids`` restarting per sequence with them)."""
        seq_len = input_ids.shape[1]
        past = kv_cache.seq_len() if kv_cache is not None else 0
        if position_ids is None:
            position_ids = default_position_ids(attention_mask, seq_len, past, input_ids.device)
        mask, is_causal = build_decoder_mask(attention_mask, segment_ids, seq_len, past, kv_cache is not None)
        x = self.embed_tokens(input_ids)
        rotary = self.rotary(position_ids, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, mask, is_causal, kv_cache, i, rotary)
        return self.norm(x)


class DeepseekV3ForCausalLM(Layer, PretrainedModel, GenerationMixin):
    """The decoder with a language-model head, ``generate``, and ``num_nextn_predict_layers`` MTP
    modules that add ``mtp_loss_weight`` x their mean loss in training (unused when decoding)."""

    config_class = DeepseekV3Config
    head = "causal_lm"

    def __init__(self, config: DeepseekV3Config):
        super().__init__()
        self.config = config
        self.model = DeepseekV3Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.mtp = nn.ModuleList(DeepseekV3MTPModule(config) for _ in range(config.num_nextn_predict_layers))
        self.last_mtp_loss: torch.Tensor | None = None  # detached: reading it is the only host sync
        if config.tie_word_embeddings:
            self.tie_weights()
        else:
            nn.init.normal_(self.lm_head.weight, mean=0.0, std=config.initializer_range)
        _init_weights(self.mtp, config.initializer_range)

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        segment_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``[b, s, vocab]``, or with ``labels`` the mean next-token loss (plus the weighted
        MTP loss when the model has MTP modules; ``last_mtp_loss`` keeps its value for logging).

        ``labels`` are aligned with ``input_ids`` (usually a copy of them); -100 is ignored;
        ``segment_ids`` packs several sequences into a row, each one's first label -100.
        ``loss_token_count`` (how data-parallel steps weight each part's loss) counts the main
        loss's terms; the MTP term is a mean of its own, added with its weight.
        """
        hidden = self.model(input_ids, attention_mask, position_ids, kv_cache, segment_ids)
        if labels is None:
            return self.lm_head(hidden)
        loss = next_token_loss(self.lm_head, hidden, labels, input_ids)
        if len(self.mtp) and self.config.mtp_loss_weight:
            mtp = self.mtp_loss(hidden, input_ids, labels, attention_mask, position_ids, segment_ids)
            if mtp is not None:
                self.last_mtp_loss = mtp.detach()
                loss = loss + self.config.mtp_loss_weight * mtp
        return loss

    def mtp_loss(self, hidden: torch.Tensor, input_ids: torch.Tensor, labels: torch.Tensor,
                 attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                 segment_ids: torch.Tensor | None = None) -> torch.Tensor | None:
        """The MTP modules' mean loss (None when the sequence is too short for any of them).

        Module ``k`` (from 1) combines the previous depth's state at position ``i`` with the
        embedding of token ``i + k`` and predicts label ``i + k + 1``. In a packed row a position
        whose target lies in another sequence than itself is ignored.
        """
        if labels.shape != input_ids.shape:
            raise ValueError(f"labels shape {tuple(labels.shape)} must equal input_ids shape {tuple(input_ids.shape)}")
        seq_len = input_ids.shape[1]
        if position_ids is None:
            position_ids = default_position_ids(attention_mask, seq_len, 0, input_ids.device)
        losses, state = [], hidden
        for k, module in enumerate(self.mtp, start=1):
            n = seq_len - k  # positions this depth computes
            if n < 2:
                break
            emb = self.model.embed_tokens(input_ids[:, k:])
            x = module.eh_proj(torch.cat([module.enorm(emb), module.hnorm(state[:, :n])], dim=-1))
            pad = None if attention_mask is None else attention_mask[:, :n] * attention_mask[:, k:]
            seg = None if segment_ids is None else segment_ids[:, :n]
            mask, is_causal = build_decoder_mask(pad, seg, n, 0, False)
            rotary = self.model.rotary(position_ids[:, :n], x.dtype)
            state = module.shared_head.norm(module(x, mask, is_causal, None, 0, rotary))
            target = labels[:, k + 1:]
            if segment_ids is not None:
                target = target.masked_fill(segment_ids[:, :n - 1] != segment_ids[:, k + 1:], -100)
            losses.append(token_cross_entropy(self.lm_head(state[:, :-1]), target))
        return torch.stack(losses).mean() if losses else None

    loss_token_count = staticmethod(next_token_count)


def from_pretrained_with_mtp(directory, device: str | torch.device | None = None,
                             dtype=None) -> DeepseekV3ForCausalLM:
    """A Hugging Face DeepSeek-V3 directory loaded with its MTP modules (``model.layers.{L}.*``), for
    training on with the MTP loss; ``sampan.models.from_pretrained`` leaves them out."""
    from sampan.models.deepseek_v3.hf import LOAD_MTP_KEY
    from sampan.models.hf_checkpoint import load_hf_model
    from sampan.models.pretrained import read_config

    hf_config = {**read_config(directory), LOAD_MTP_KEY: True}
    return load_hf_model(directory, hf_config, head="causal_lm", device=device, dtype=dtype).eval()
