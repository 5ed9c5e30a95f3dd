"""Dream 7B in plain PyTorch, reading the published checkpoint layout unchanged.

Dream is Qwen2.5-7B retrained as a masked diffusion model: the Qwen2 backbone (grouped-query attention
with q/k/v biases, RoPE, SwiGLU, RMSNorm) with the causal mask removed, so every position sees every
other (padding excepted). It kept the autoregressive habit of scoring the *next* position: the logits
at position i are the model's guess for the token at i + 1. `DreamModel.forward` returns those raw
logits, as the published model does; `DreamDenoiser` shifts them so that position i scores token i,
which is what unmask's sampler reads of every masked-diffusion model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from models.llada import RMSNorm, SwiGLU, rope_angles


@dataclass(frozen=True)
class DreamConfig:
    """The keys of Dream's ``config.json`` (model_type "Dream") that change the computation."""

    hidden_size: int = 3584  # width of the residual stream
    intermediate_size: int = 18944  # SwiGLU hidden width
    num_hidden_layers: int = 28  # transformer blocks
    num_attention_heads: int = 28  # query heads
    num_key_value_heads: int = 4  # key/value heads (grouped-query attention)
    vocab_size: int = 152064  # rows of the embedding and of lm_head
    rms_norm_eps: float = 1e-6  # added to the mean square before rsqrt
    rope_theta: float = 1_000_000.0  # RoPE base
    max_position_embeddings: int = 131072  # longest canvas the positions allow
    tie_word_embeddings: bool = False  # lm_head shares the embedding matrix
    mask_token_id: int = 151666  # the [MASK] token the sampler fills
    pad_token_id: int = 151643  # padding (Qwen's <|endoftext|>)
    eos_token_id: int = 151643  # end of text
    bos_token_id: int | None = 151643

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass
class DreamOutput:
    """logits (`torch.FloatTensor` of shape `(batch, seq, vocab)`)."""

    logits: torch.Tensor


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on `x` (B, nh, T, hs) in its own dtype, with float32 angles cast to it (Qwen2's order of rounding)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat([-x2, x1], dim=-1) * sin.to(x.dtype)


class DreamAttention(nn.Module):
    """Bidirectional grouped-query attention with biased q/k/v projections (Qwen2's layout)."""

    def __init__(self, cfg: DreamConfig):
        super().__init__()
        self.cfg = cfg
        d, hs = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(d, cfg.num_attention_heads * hs, bias=True)
        self.k_proj = nn.Linear(d, cfg.num_key_value_heads * hs, bias=True)
        self.v_proj = nn.Linear(d, cfg.num_key_value_heads * hs, bias=True)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hs, d, bias=False)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], allowed: torch.Tensor | None
    ) -> torch.Tensor:
        cfg = self.cfg
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, cfg.num_attention_heads, cfg.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        k = self.k_proj(x).view(B, T, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)  # (B, nkv, T, hs)
        v = self.v_proj(x).view(B, T, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        q, k = rotate(q, *rope), rotate(k, *rope)
        group = cfg.num_attention_heads // cfg.num_key_value_heads
        if group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # a row allowed nothing comes out zero
        out: torch.Tensor = self.o_proj(y.transpose(1, 2).reshape(B, T, cfg.num_attention_heads * cfg.head_dim))
        return out


class DreamLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: DreamConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DreamAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], allowed: torch.Tensor | None
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, allowed)
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class DreamBackbone(nn.Module):
    """Holds the parameters named ``model.*`` in the published checkpoint."""

    def __init__(self, cfg: DreamConfig):
        super().__init__()
        # no init draw: a checkpoint's skeleton is built on the meta device and then assigned its tensors
        self.embed_tokens = nn.Embedding(
            cfg.vocab_size, cfg.hidden_size, _weight=torch.empty(cfg.vocab_size, cfg.hidden_size)
        )
        self.layers = nn.ModuleList(DreamLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DreamModel(nn.Module):
    """Dream's network: ``model(input_ids, attention_mask=None).logits``, the *raw* (next-position) logits."""

    def __init__(self, cfg: DreamConfig):
        super().__init__()
        self.config = cfg
        self.model = DreamBackbone(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> DreamOutput:
        """Raw logits `(B, T, vocab)` of `input_ids` `(B, T)`; position i scores the token at i + 1.

        attention_mask (B, T): 1 for real tokens, 0 for padding. A padded row attends only between real
        tokens and counts RoPE positions over them (a left-padded row sees the angles it sees alone); as in
        Dream's own generate, a padding query attends to nothing (its output is zero) and sits at position 1.
        A mask without zeros is the same as none.
        """
        cfg = self.config
        B, T = input_ids.shape
        allowed = None
        positions = torch.arange(T, device=input_ids.device).expand(B, T)
        if attention_mask is not None and bool((attention_mask == 0).any()):
            real = attention_mask.bool()
            positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(~real, 1)
            allowed = real[:, None, :, None] & real[:, None, None, :]  # (B, 1, T, T): query and key both real
        rope = rope_angles(positions, cfg.head_dim, cfg.rope_theta)
        x = self.model.embed_tokens(input_ids)  # (B, T, d)
        for layer in self.model.layers:
            x = layer(x, rope, allowed)
        x = self.model.norm(x)
        weight = self.model.embed_tokens.weight if cfg.tie_word_embeddings else self.lm_head.weight
        return DreamOutput(logits=F.linear(x, weight))


class DreamDenoiser(nn.Module):
    """The Dream network as unmask's sampler reads every masked-diffusion model: logits aligned to positions.

    ``denoiser(input_ids, attention_mask=None).logits[:, i]`` scores the token at position i: Dream's raw
    logits moved one place right, position 0 keeping its own (as Dream's generate does). The sampler then
    needs to know nothing of the shift.
    """

    def __init__(self, network: DreamModel):
        super().__init__()
        self.network = network
        self.config = network.config

    @property
    def device(self) -> torch.device:
        return self.network.device

    @property
    def dtype(self) -> torch.dtype:
        return self.network.dtype

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
    ) -> DreamOutput:
        if kwargs:
            raise ValueError(
                f"Dream scores position i from position i - 1, so a window of cached keys/values cannot be scored "
                f"alone; decode Dream with cache='none' (got {', '.join(sorted(kwargs))})"
            )
        raw = self.network(input_ids, attention_mask).logits
        return DreamOutput(logits=torch.cat([raw[:, :1], raw[:, :-1]], dim=1))


def init_dream_weights(model: DreamModel, seed: int = 0, std: float = 0.02) -> DreamModel:
    """Deterministic normal(0, std) weights and biases, norms at 1: random-weight and parity checkpoints."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                scale = std / math.sqrt(2 * model.config.num_hidden_layers) if name.endswith("o_proj.weight") else std
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return model
