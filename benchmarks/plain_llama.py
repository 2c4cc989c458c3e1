"""A Llama-family causal LM written in plain PyTorch: the baseline sampan's Llama is timed against.

Written from the published architecture, not from sampan's code: RMSNorm in fp32, rotary
embeddings (with Llama 3's frequency scaling when the config has it), grouped-query attention
through ``scaled_dot_product_attention``, a SwiGLU MLP, an optional tied head. Parameter names
follow the Hugging Face layout (which sampan also uses), so ``load_state_dict(strict=True)`` from a
sampan model is the check that the two have the same parameters, and an equal loss on the same
batch is the check that they compute the same function.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def inverse_frequencies(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if scaling and scaling.get("rope_type") == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        original = scaling["original_max_position_embeddings"]
        wavelength = 2 * math.pi / inv
        smooth = (original / wavelength - low) / (high - low)
        scaled = torch.where(wavelength > original / low, inv / factor, inv)
        middle = (wavelength <= original / low) & (wavelength >= original / high)
        inv = torch.where(middle, (1 - smooth) * inv / factor + smooth * inv, scaled)
    return inv.float()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c.head_dim
        self.head_dim = d
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * d, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * d, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * d, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.num_heads * d, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class PlainLlama(nn.Module):
    """``forward(input_ids, labels)`` -> the mean next-token cross-entropy (position t predicts t + 1).

    Takes a sampan ``LlamaConfig`` for its shape only (plain dataclass fields); the features this
    baseline does not have (QK-norm, biases on the output projection or MLP) are refused.
    """

    def __init__(self, c):
        super().__init__()
        if c.qk_norm or c.out_bias or c.mlp_bias or c.activation != "silu":
            raise ValueError("PlainLlama covers Llama / Qwen2 shapes (no QK-norm, no output or MLP biases, SiLU)")
        self.model = Decoder(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", inverse_frequencies(c.head_dim, c.rope_theta, c.rope_scaling),
                             persistent=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        angles = torch.arange(input_ids.shape[1], device=x.device, dtype=torch.float32)[:, None] * self.inv_freq
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.model.norm(x)[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
