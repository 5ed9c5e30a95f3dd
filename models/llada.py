"""The LLaDA architecture in plain PyTorch, reading the published checkpoint layout unchanged.

A LLaDA model is a Llama-shaped transformer whose attention is bidirectional: every position sees
every other (padded keys excepted), so it can predict all masked positions of a canvas at once.
The same backbone with ``causal=True`` is the autoregressive twin that unmask ships as fallback.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LLaDAConfig:
    """The keys of a LLaDA ``config.json`` that change the computation."""

    d_model: int = 4096  # width of the residual stream
    n_heads: int = 32  # query heads
    n_kv_heads: int | None = None  # key/value heads; fewer than n_heads means grouped-query attention
    n_layers: int = 32  # transformer blocks
    mlp_ratio: int = 4  # hidden = mlp_ratio * d_model when mlp_hidden_size is unset
    mlp_hidden_size: int | None = None  # SwiGLU hidden width (LLaDA-8B: 12288)
    vocab_size: int = 126464  # tokenizer vocabulary
    embedding_size: int | None = None  # rows of the embedding (>= vocab_size, padded for speed)
    rope: bool = True  # rotary position embedding on q and k
    rope_theta: float = 10000.0  # RoPE base (LLaDA-8B: 500000)
    layer_norm_type: str = "rms"  # only RMSNorm is used by LLaDA
    rms_norm_eps: float = 1e-5  # added to the mean square before rsqrt
    block_type: str = "llama"  # separate q/k/v projections and SwiGLU
    activation_type: str = "silu"  # gate activation of the MLP
    weight_tying: bool = False  # output projection shares the embedding matrix
    include_bias: bool = False  # linear layers carry biases
    max_sequence_length: int = 4096  # longest canvas the model was trained on
    mask_token_id: int = 126336  # the [MASK] token the sampler fills
    eos_token_id: int = 126081  # end of sequence; generation pads with it
    causal: bool = False  # unmask extension: True turns the backbone into an AR model

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def hidden_size(self) -> int:
        return self.mlp_hidden_size or self.mlp_ratio * self.d_model

    @property
    def output_size(self) -> int:
        return self.embedding_size or self.vocab_size

    @classmethod
    def field_types(cls) -> dict[str, Any]:
        return {f.name: f.type for f in fields(cls)}


@dataclass
class LLaDAOutput:
    """What a forward pass returns, Hugging Face style.

    logits (`torch.FloatTensor` of shape `(batch, seq, vocab)`): scores for every query position.
    past_key_values: per layer, `(k, v)` of shape `(batch, kv_heads, seq, head_dim)` after RoPE,
        for the positions of this call only (set when ``use_cache=True``).
    """

    logits: torch.Tensor
    past_key_values: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    extras: dict[str, Any] = field(default_factory=dict)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)) with the names Qwen-shaped checkpoints publish (`gate_proj`, `up_proj`,
    `down_proj`, no biases): the MLP of Dream, SDAR and LLaDA2's dense layers and experts."""

    def __init__(self, hidden: int, width: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, width, bias=False)
        self.up_proj = nn.Linear(hidden, width, bias=False)
        self.down_proj = nn.Linear(width, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 whatever the model dtype, as LLaDA does."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape `(batch, 1, seq, head_dim)` for integer `positions` of shape `(batch, seq)`."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float()[..., None] * inv_freq  # (B, T, hs/2)
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # (B, 1, T, hs): non-interleaved halves
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` (B, nh, T, hs) in float32: the first half pairs with the second half."""
    dtype = x.dtype
    x = x.float()
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x * cos + rotated * sin).to(dtype)


class LLaDABlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + ff_out(silu(ff_proj(h)) * up_proj(h))."""

    def __init__(self, cfg: LLaDAConfig):
        super().__init__()
        self.cfg = cfg
        d, hs, bias = cfg.d_model, cfg.head_dim, cfg.include_bias
        self.attn_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.q_proj = nn.Linear(d, cfg.n_heads * hs, bias=bias)
        self.k_proj = nn.Linear(d, cfg.kv_heads * hs, bias=bias)
        self.v_proj = nn.Linear(d, cfg.kv_heads * hs, bias=bias)
        self.attn_out = nn.Linear(d, d, bias=bias)
        self.ff_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.ff_proj = nn.Linear(d, cfg.hidden_size, bias=bias)
        self.up_proj = nn.Linear(d, cfg.hidden_size, bias=bias)
        self.ff_out = nn.Linear(cfg.hidden_size, d, bias=bias)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        attn_bias: torch.Tensor | None,
        past_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        cfg = self.cfg
        B, T, _ = x.shape
        h = self.attn_norm(x)
        q = self.q_proj(h).view(B, T, cfg.n_heads, cfg.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        k = self.k_proj(h).view(B, T, cfg.kv_heads, cfg.head_dim).transpose(1, 2)  # (B, nkv, T, hs)
        v = self.v_proj(h).view(B, T, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        new_kv = (k, v)
        if past_kv is not None:
            k = torch.cat([past_kv[0], k], dim=2)  # (B, nkv, S + T, hs)
            v = torch.cat([past_kv[1], v], dim=2)
        if cfg.kv_heads != cfg.n_heads:
            group = cfg.n_heads // cfg.kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias)  # (B, nh, T, hs)
        x = x + self.attn_out(y.transpose(1, 2).reshape(B, T, cfg.d_model))
        h = self.ff_norm(x)
        x = x + self.ff_out(F.silu(self.ff_proj(h)) * self.up_proj(h))
        return x, new_kv


class LLaDATransformer(nn.Module):
    def __init__(self, cfg: LLaDAConfig):
        super().__init__()
        # nn.Embedding's own init, drawn only off the meta device: a checkpoint's skeleton (models/checkpoint.py
        # builds on meta) has nothing to draw, and a meta normal_ imports torch._dynamo, 1.6 s of every load
        self.wte = nn.Embedding(cfg.output_size, cfg.d_model, _weight=torch.empty(cfg.output_size, cfg.d_model))
        if not self.wte.weight.is_meta:
            nn.init.normal_(self.wte.weight)
        self.blocks = nn.ModuleList(LLaDABlock(cfg) for _ in range(cfg.n_layers))
        self.ln_f = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        if not cfg.weight_tying:
            self.ff_out = nn.Linear(cfg.d_model, cfg.output_size, bias=cfg.include_bias)


class LLaDAModel(nn.Module):
    """Holds ``transformer`` so parameter names read ``model.transformer.*`` inside LLaDAModelLM."""

    def __init__(self, cfg: LLaDAConfig):
        super().__init__()
        self.transformer = LLaDATransformer(cfg)


class LLaDAModelLM(nn.Module):
    """LLaDA denoiser: ``model(input_ids, attention_mask=None).logits`` of shape `(batch, seq, vocab)`."""

    def __init__(self, cfg: LLaDAConfig):
        super().__init__()
        self.config = cfg
        self.model = LLaDAModel(cfg)

    @property
    def device(self) -> torch.device:
        return self.model.transformer.wte.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.transformer.wte.weight.dtype

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        use_cache: bool = False,
    ) -> LLaDAOutput:
        """Score every position of `input_ids` (B, T).

        attention_mask (B, S + T): 1 for real keys, 0 for padding; covers cached keys first when
            `past_key_values` is given. Padded keys are never attended to.
        position_ids (B, T): RoPE positions; by default counted over the real tokens of each row,
            so a left-padded row sees the same angles it would see alone.
        past_key_values: per layer `(k, v)` for S positions computed earlier (after RoPE). The
            keys may come from any positions (prefix, suffix): attention is bidirectional, or, for
            a causal model, they must all precede the new tokens.
        """
        cfg, tr = self.config, self.model.transformer
        B, T = input_ids.shape
        S = past_key_values[0][0].shape[2] if past_key_values else 0
        if position_ids is None:
            if attention_mask is not None:
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, S:]
            else:
                position_ids = torch.arange(S, S + T, device=input_ids.device).expand(B, T)
        rope = rope_angles(position_ids, cfg.head_dim, cfg.rope_theta) if cfg.rope else None
        attn_bias = self._attention_bias(attention_mask, B, S, T, input_ids.device)

        x = tr.wte(input_ids)  # (B, T, d)
        new_cache = []
        for i, block in enumerate(tr.blocks):
            x, kv = block(x, rope, attn_bias, past_key_values[i] if past_key_values else None)
            new_cache.append(kv)
        x = tr.ln_f(x)
        weight = tr.wte.weight if cfg.weight_tying else tr.ff_out.weight
        logits = F.linear(x, weight, None if cfg.weight_tying else tr.ff_out.bias)
        return LLaDAOutput(logits=logits, past_key_values=new_cache if use_cache else None)

    def _attention_bias(
        self, attention_mask: torch.Tensor | None, B: int, S: int, T: int, device: torch.device
    ) -> torch.Tensor | None:
        """Boolean `(B, 1, T, S + T)` of allowed (query, key) pairs, or None when all are allowed."""
        allowed = None
        if attention_mask is not None:
            allowed = attention_mask[:, None, None, :].bool()  # (B, 1, 1, S + T)
        if self.config.causal and T > 1:
            causal = torch.ones(T, S + T, dtype=torch.bool, device=device).tril(diagonal=S)
            allowed = causal[None, None] if allowed is None else allowed & causal
        if allowed is None:
            return None
        # A query whose every key is padding (a left pad) would give NaN; let it see itself.
        eye = torch.zeros(T, S + T, dtype=torch.bool, device=device)
        eye[torch.arange(T), torch.arange(S, S + T)] = True
        return allowed | eye


def init_weights(model: LLaDAModelLM, seed: int = 0, std: float = 0.02) -> LLaDAModelLM:
    """Deterministic small-normal initialisation for random-weight and freshly trained models."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("ln_f.weight"):
                p.fill_(1.0)
            elif p.dim() >= 2:
                scale = (
                    std / math.sqrt(2 * model.config.n_layers)
                    if name.endswith(("attn_out.weight", "ff_out.weight")) and "blocks" in name
                    else std
                )
                p.copy_(torch.randn(p.shape, generator=g) * scale)
            else:
                p.zero_()
    return model
