"""Nemotron-Labs-Diffusion (NVIDIA): one Ministral-3-shaped network that attends causally or bidirectionally.

The published checkpoint keeps Ministral 3's layer names under `encoder.` (`encoder.layers.N.self_attn.q_proj`, ...)
and calls its output layer `diffusion_head`. Its attention is Ministral 3's: grouped-query, RoPE with YaRN scaling,
then Llama 4's query scaling `1 + beta * log(1 + floor(position / original_max_position_embeddings))`. What changes
is only what a query sees: in the causal pass (autoregressive decoding, and the verify pass of self-speculation)
every key up to its own position; in the diffusion pass every key of the block it denoises and of the cached
prefix before it. One forward serves both: `causal` picks the mask, `store` appends the new keys to the cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from models.checkpoint import CheckpointError, read_json_object, read_tensors
from models.llada import RMSNorm, SwiGLU, apply_rope
from models.sdar import SDARCache, assign_checked, attend, run_layers

# The KV cache is SDAR's: per layer (k, v) `(batch, kv_heads, S, head_dim)` after RoPE, with a key mask `(batch, S)`.
NemotronCache = SDARCache
MODEL_TYPE = "nemotron_labs_diffusion"
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


@dataclass(frozen=True)
class RopeParameters:
    """`rope_parameters` of config.json: YaRN (or plain RoPE) and Llama 4's query scaling, read as transformers does."""

    rope_theta: float  # RoPE base
    rope_type: str = "yarn"  # yarn or default (no scaling)
    factor: float | None = None  # YaRN: context extension; None: max_position_embeddings / original
    beta_fast: float = 32.0  # YaRN ramp bounds, in rotations over the original context
    beta_slow: float = 1.0
    mscale: float | None = None  # YaRN attention factor = mscale(factor, mscale) / mscale(factor, mscale_all_dim)
    mscale_all_dim: float | None = None
    attention_factor: float | None = None  # given outright instead of from mscale
    original_max_position_embeddings: int | None = None  # the pre-extension context (None: max_position_embeddings)
    truncate: bool = True  # YaRN: floor/ceil the correction range
    llama_4_scaling_beta: float | None = None  # query scale slope per original context length; None: no scaling


@dataclass(frozen=True)
class NemotronDiffusionConfig:
    """The keys of Nemotron-Labs-Diffusion's `config.json` that change the computation (names as published)."""

    vocab_size: int  # rows of the embedding and of diffusion_head
    hidden_size: int  # width of the residual stream
    intermediate_size: int  # SwiGLU width
    num_hidden_layers: int  # transformer blocks
    num_attention_heads: int  # query heads
    num_key_value_heads: int  # key/value heads (grouped-query attention)
    head_dim: int  # per-head width (128 in the published models, apart from hidden / heads)
    rope_parameters: RopeParameters
    rms_norm_eps: float = 1e-5  # added to the mean square before rsqrt
    max_position_embeddings: int = 262144  # longest context after YaRN
    tie_word_embeddings: bool = False  # diffusion_head shares the embedding matrix
    attention_bias: bool = False  # q/k/v/o projections carry biases
    block_size: int = 32  # positions per diffusion block (the draft of self-speculation)
    mask_token_id: int | None = None  # the [MASK] id a block is filled with (100 in the published models)
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None  # end of text (11 in the published models)
    pad_token_id: int | None = None
    dlm_paradigm: str = "bidirectional"  # what the diffusion pass attends: the block bidirectionally

    @property
    def original_context(self) -> int:
        return self.rope_parameters.original_max_position_embeddings or self.max_position_embeddings

    @classmethod
    def from_dict(cls, raw: dict[str, Any], path: Path | str = "config.json") -> NemotronDiffusionConfig:
        """Read a published config (unknown keys ignored), refusing what the native model does not compute."""
        if raw.get("model_type") != MODEL_TYPE:
            raise CheckpointError(f"{path}: model_type is {raw.get('model_type')!r}, expected '{MODEL_TYPE}'")
        missing = [k for k in (*REQUIRED, "rope_parameters") if k not in raw]
        if missing:
            raise CheckpointError(f"{path}: required key '{missing[0]}' is missing")
        for key, allowed in (("hidden_act", ("silu", None)), ("dlm_paradigm", ("bidirectional", None))):
            if raw.get(key) not in allowed:
                raise CheckpointError(f"{path}: key '{key}'={raw[key]!r} is not supported by the native model")
        rope = raw["rope_parameters"]
        if not isinstance(rope, dict) or "rope_theta" not in rope:
            raise CheckpointError(f"{path}: key 'rope_parameters' must be an object with 'rope_theta'")
        if rope.get("rope_type", "default") not in ("yarn", "default"):
            raise CheckpointError(
                f"{path}: key 'rope_parameters.rope_type'={rope['rope_type']!r}; known: yarn, default"
            )
        names = {f.name for f in fields(RopeParameters)}
        kwargs = {k: v for k, v in raw.items() if k in {f.name for f in fields(cls)} and v is not None}
        kwargs.setdefault("head_dim", raw["hidden_size"] // raw["num_attention_heads"])
        kwargs.setdefault("num_key_value_heads", raw["num_attention_heads"])
        try:
            kwargs["rope_parameters"] = RopeParameters(
                **{"rope_type": "default"} | {k: v for k, v in rope.items() if k in names and v is not None}
            )
            cfg = cls(**kwargs)
        except TypeError as e:
            raise CheckpointError(f"{path}: {e}") from None
        if cfg.num_attention_heads % cfg.num_key_value_heads or cfg.head_dim % 2 or cfg.block_size <= 0:
            raise CheckpointError(
                f"{path}: heads {cfg.num_attention_heads} / kv heads {cfg.num_key_value_heads} must divide, "
                f"head_dim {cfg.head_dim} be even and block_size {cfg.block_size} positive"
            )
        return cfg


def yarn_inv_freq(cfg: NemotronDiffusionConfig) -> tuple[torch.Tensor, float]:
    """(inverse frequencies `(head_dim / 2,)`, the cos/sin factor): transformers' YaRN (`_compute_yarn_parameters`)."""
    rope, dim = cfg.rope_parameters, cfg.head_dim
    base = rope.rope_theta
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    if rope.rope_type == "default":
        return 1.0 / pos_freqs, 1.0
    original = cfg.original_context
    factor = rope.factor if rope.factor is not None else cfg.max_position_embeddings / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    factor_out = rope.attention_factor
    if factor_out is None:
        if rope.mscale and rope.mscale_all_dim:
            factor_out = mscale(factor, rope.mscale) / mscale(factor, rope.mscale_all_dim)
        else:
            factor_out = mscale(factor)

    def correction_dim(rotations: float) -> float:  # the dimension whose wavelength fits `rotations` times
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast or 32), correction_dim(rope.beta_slow or 1)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = torch.clamp(
        (torch.arange(dim // 2, dtype=torch.float32) - low) / ((high + 0.001 if low == high else high) - low), 0, 1
    )
    extrapolation = 1 - ramp  # 1: keep the original frequency; 0: divide it by `factor`
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(factor_out)


class NemotronAttention(nn.Module):
    def __init__(self, cfg: NemotronDiffusionConfig):
        super().__init__()
        self.cfg = cfg
        hs, bias = cfg.head_dim, cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_attention_heads * hs, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * hs, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * hs, bias=bias)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hs, cfg.hidden_size, bias=bias)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        allowed: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        B, T, _ = x.shape
        hs = self.cfg.head_dim
        cos, sin, q_scale = rope
        q = self.q_proj(x).view(B, T, -1, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = self.k_proj(x).view(B, T, -1, hs).transpose(1, 2)  # (B, nkv, T, hs)
        v = self.v_proj(x).view(B, T, -1, hs).transpose(1, 2)
        q = apply_rope(q, cos, sin) * q_scale.to(q.dtype)  # Llama 4: queries scaled by their position
        y, new = attend(q, apply_rope(k, cos, sin), v, allowed, past)
        return self.o_proj(y), new


class NemotronLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: NemotronDiffusionConfig):
        super().__init__()
        self.self_attn = NemotronAttention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)  # Ministral 3's: weight after the cast
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        allowed: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        h, kv = self.self_attn(self.input_layernorm(x), rope, allowed, past)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class NemotronEncoder(nn.Module):
    """Holds the published names: `encoder.embed_tokens`, `encoder.layers.N`, `encoder.norm`."""

    def __init__(self, cfg: NemotronDiffusionConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(NemotronLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


@dataclass
class NemotronOutput:
    """logits (`torch.FloatTensor` of shape `(batch, T, vocab)`) for the positions of one call."""

    logits: torch.Tensor


class NemotronDiffusionModel(nn.Module):
    """`model(input_ids, position_ids, key_mask, cache, store, causal).logits` `(batch, T, vocab)`."""

    def __init__(self, cfg: NemotronDiffusionConfig):
        super().__init__()
        self.config = cfg
        self.encoder = NemotronEncoder(cfg)
        if not cfg.tie_word_embeddings:
            self.diffusion_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        inv_freq, self.rope_factor = yarn_inv_freq(cfg)
        self.inv_freq = nn.Buffer(inv_freq, persistent=False)

    @property
    def device(self) -> torch.device:
        return self.encoder.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.encoder.embed_tokens.weight.dtype

    def output_weight(self) -> torch.Tensor:
        """`(vocab, hidden)`: diffusion_head's, or the embedding's when tied."""
        return self.encoder.embed_tokens.weight if self.config.tie_word_embeddings else self.diffusion_head.weight

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """cos, sin `(B, 1, T, hs)` (times YaRN's factor) and Llama 4's query scale `(B, 1, T, 1)` at `positions`."""
        freqs = positions.float()[..., None] * self.inv_freq.float()  # (B, T, hs/2)
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # (B, 1, T, hs): non-interleaved halves
        beta = self.config.rope_parameters.llama_4_scaling_beta
        scale = torch.ones_like(positions, dtype=torch.float)
        if beta is not None:
            scale = 1 + beta * torch.log(1 + torch.floor(positions.float() / self.config.original_context))
        return emb.cos() * self.rope_factor, emb.sin() * self.rope_factor, scale[:, None, :, None]

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        cache: SDARCache | None = None,
        store: bool = False,
        causal: bool = True,
    ) -> NemotronOutput:
        """Score `input_ids` `(B, T)` at `position_ids` `(B, T)` (default: after the cache).

        Every query sees the cached keys that are real (`cache.key_mask`); among the new ones, `causal` lets it see
        those up to its own index, else all of them; `key_mask` `(B, T)` marks the new keys that are real (False:
        left padding). With `store`, the new keys and values are appended to `cache`."""
        B, T = input_ids.shape
        cache = cache if cache is not None else SDARCache()
        if position_ids is None:
            position_ids = torch.arange(cache.length, cache.length + T, device=input_ids.device).expand(B, T)
        if key_mask is None:
            key_mask = torch.ones(B, T, dtype=torch.bool, device=input_ids.device)
        allowed = self._allowed(key_mask.bool(), cache, causal)
        rope = self.rope(position_ids)
        x = run_layers(self.encoder.layers, self.encoder.embed_tokens(input_ids), rope, allowed, cache, store, key_mask)
        x = self.encoder.norm(x)
        return NemotronOutput(logits=F.linear(x, self.output_weight()).float())

    @staticmethod
    def _allowed(key_mask: torch.Tensor, cache: SDARCache, causal: bool) -> torch.Tensor:
        """Boolean `(B, 1, T, S + T)` of allowed (query, key) pairs."""
        T = key_mask.shape[1]
        eye = torch.eye(T, dtype=torch.bool, device=key_mask.device)
        within = key_mask[:, None, :].expand(-1, T, -1)  # (B, Tq, Tk)
        if causal:
            within = within & torch.tril(torch.ones_like(eye))
        within = within | eye  # a padded query with no real key in view would give NaN: it sees itself
        if cache.key_mask is not None:
            within = torch.cat([cache.key_mask[:, None, :].expand(-1, T, -1), within], dim=2)
        return within[:, None]


def read_config(folder: Path) -> NemotronDiffusionConfig:
    path = folder / "config.json"
    return NemotronDiffusionConfig.from_dict(read_json_object(path), path)


def load_nemotron(folder: Path, dtype: torch.dtype = torch.float32) -> NemotronDiffusionModel:
    """The network of a Nemotron-Labs-Diffusion folder (config.json + safetensors), names and shapes checked."""
    cfg = read_config(folder)
    with torch.device("meta"):
        model = NemotronDiffusionModel(cfg)
    model = assign_checked(model, read_tensors(folder), folder, dtype, "a Nemotron-Labs-Diffusion")
    inv_freq, _ = yarn_inv_freq(cfg)  # a buffer, not a weight: built on the meta device, computed here
    model.inv_freq = nn.Buffer(inv_freq, persistent=False)
    return model
