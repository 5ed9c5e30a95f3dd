"""LLaDA2.0 (inclusionAI): mixture-of-experts block diffusion in plain PyTorch, reading the published layout unchanged.

A Ling/Bailing-shaped network (`model.word_embeddings`, a fused `attention.query_key_value`, `attention.dense`)
whose layers after the first `first_k_dense_replace` replace the MLP by a sparse mixture: a sigmoid router picks
`num_experts_per_tok` experts per token among the best `topk_group` of `n_group` expert groups (the routing adds
a learned `expert_bias`, the weights do not), renormalises their scores, scales them by `routed_scaling_factor`
and adds the shared experts. RoPE turns only the first `partial_rotary_factor` of each head. Attention is block
causal as in SDAR (models/sdar.py, whose forward, KV cache and block mask this model inherits): a query sees its
own block and every earlier one. The block length is a decoding setting (generate's `block_length`, 32), not a
key of config.json, so the model takes it from the adapter.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from models.checkpoint import CheckpointError, read_json_object, read_tensors
from models.llada import RMSNorm, SwiGLU, apply_rope, rope_angles
from models.sdar import SDARForBlockDiffusion, assign_checked, attend

# config.json keys whose other values the published modeling code does not compute (key -> what it computes)
FIXED = (
    ("hidden_act", ("silu", None)),
    ("rope_scaling", (None,)),
    ("score_function", ("sigmoid", None)),
    ("norm_topk_prob", (True, None)),
    ("moe_router_enable_expert_bias", (True, None)),
)


@dataclass(frozen=True)
class LLaDA2Config:
    """The keys of LLaDA2's `config.json` that change the computation (names and defaults as published)."""

    vocab_size: int  # rows of the embedding and of lm_head
    hidden_size: int  # width of the residual stream
    intermediate_size: int  # SwiGLU width of the first `first_k_dense_replace` (dense) layers
    num_hidden_layers: int  # transformer blocks
    num_attention_heads: int  # query heads
    num_key_value_heads: int  # key/value heads (grouped-query attention)
    head_dim: int  # per-head width
    moe_intermediate_size: int = 0  # SwiGLU width of one routed expert (the shared experts: times their number)
    num_experts: int | None = 16  # routed experts per sparse layer; None: every layer dense
    num_experts_per_tok: int = 2  # experts each token is routed to (top-k)
    n_group: int = 8  # expert groups; routing first keeps the best `topk_group` of them
    topk_group: int = 4
    num_shared_experts: int | None = 0  # experts every token passes through, fused into one wider MLP
    first_k_dense_replace: int = 0  # leading layers that keep a dense MLP
    routed_scaling_factor: float = 2.5  # multiplies the renormalised routing weights
    partial_rotary_factor: float = 0.5  # share of each head's dims that RoPE turns
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    use_qkv_bias: bool = False  # bias on the fused query/key/value projection
    use_bias: bool = True  # bias on the attention output projection (`dense`)
    use_qk_norm: bool = True  # RMSNorm per head on queries and keys, before RoPE
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 16384
    pad_token_id: int | None = 126081
    eos_token_id: int | list[int] | None = 156892  # generate's default eos_id when config.json names none
    mask_token_id: int = 156895  # generate's default mask_id; the published config.json names none (a copy may)
    block_size: int = 32  # not in config.json: generate's block_length, which its block mask follows

    @property
    def rope_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def kv_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def sparse(self, layer: int) -> bool:
        return self.num_experts is not None and layer >= self.first_k_dense_replace

    @classmethod
    def from_dict(cls, raw: dict[str, Any], path: Path | str = "config.json") -> LLaDA2Config:
        """Read a published config, refusing what the native model does not compute (named by key)."""
        if raw.get("model_type") != "llada2_moe":
            raise CheckpointError(f"{path}: model_type is {raw.get('model_type')!r}, expected 'llada2_moe'")
        for key, allowed in FIXED:
            if raw.get(key) not in allowed:
                raise CheckpointError(f"{path}: key '{key}'={raw[key]!r} is not supported by the native LLaDA2 model")
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
        missing = [k for k in required if k not in raw]
        if missing:
            raise CheckpointError(f"{path}: required key '{missing[0]}' is missing")
        names = {f.name for f in fields(cls)} - {"block_size"}
        kwargs = {k: v for k, v in raw.items() if k in names and (v is not None or k == "num_experts")}
        kwargs["head_dim"] = raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"]
        kwargs["num_key_value_heads"] = raw.get("num_key_value_heads") or raw["num_attention_heads"]
        try:
            cfg = cls(**kwargs)
        except TypeError as e:
            raise CheckpointError(f"{path}: {e}") from None
        cfg.check(path)
        return cfg

    def check(self, path: Path | str) -> None:
        if self.num_attention_heads % self.num_key_value_heads or self.rope_dim % 2:
            raise CheckpointError(
                f"{path}: heads {self.num_attention_heads} / kv heads {self.num_key_value_heads} must divide and "
                f"head_dim x partial_rotary_factor ({self.rope_dim}) be even"
            )
        if self.num_experts is None:
            return
        size = self.num_experts // max(self.n_group, 1)
        if self.num_experts % max(self.n_group, 1) or size < 2 or self.topk_group * size < self.num_experts_per_tok:
            raise CheckpointError(
                f"{path}: num_experts {self.num_experts} must split into n_group {self.n_group} groups of at least "
                f"2 whose best topk_group {self.topk_group} hold num_experts_per_tok {self.num_experts_per_tok}"
            )


class LLaDA2Router(nn.Module):
    """Sigmoid scores in float32; `expert_bias` steers the choice only; the best groups first, then the top-k."""

    def __init__(self, cfg: LLaDA2Config):
        super().__init__()
        self.cfg = cfg
        assert cfg.num_experts is not None
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size))
        self.expert_bias: torch.Tensor
        self.register_buffer("expert_bias", torch.zeros(cfg.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(experts, weights), both `(N, top_k)`, for tokens `x` `(N, hidden)`; experts in order of choice."""
        cfg, N = self.cfg, x.shape[0]
        scores = F.linear(x.float(), self.weight.float()).sigmoid()  # (N, E)
        choice = scores + self.expert_bias
        groups = choice.view(N, cfg.n_group, -1)  # (N, G, E / G)
        group_score = groups.topk(2, dim=-1).values.sum(dim=-1)  # a group counts by its two best experts
        kept = torch.zeros_like(group_score, dtype=torch.bool)
        kept.scatter_(1, group_score.topk(cfg.topk_group, dim=-1).indices, True)
        choice = choice.masked_fill(~kept.repeat_interleave(groups.shape[-1], dim=1), float("-inf"))
        experts = choice.topk(cfg.num_experts_per_tok, dim=-1).indices  # (N, k)
        weights = scores.gather(1, experts)
        if cfg.num_experts_per_tok > 1:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return experts, weights * cfg.routed_scaling_factor


class LLaDA2Experts(nn.Module):
    """The sparse MLP: `gate` (the router), `experts.N`, `shared_experts` (published names)."""

    def __init__(self, cfg: LLaDA2Config):
        super().__init__()
        assert cfg.num_experts is not None
        self.gate = LLaDA2Router(cfg)
        self.experts = nn.ModuleList(SwiGLU(cfg.hidden_size, cfg.moe_intermediate_size) for _ in range(cfg.num_experts))
        shared = cfg.num_shared_experts
        width = cfg.moe_intermediate_size * (shared or 0)
        self.shared_experts: SwiGLU | None = None if shared is None else SwiGLU(cfg.hidden_size, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, H = x.shape
        flat = x.reshape(-1, H)
        experts, weights = self.gate(flat)  # (N, k)
        picked = flat.new_zeros(*experts.shape, H)  # (N, k, H): each token's output of each expert it chose
        for e in experts.unique().tolist():
            token, slot = (experts == e).nonzero(as_tuple=True)
            picked[token, slot] = self.experts[e](flat[token])
        y: torch.Tensor = (picked.to(weights.dtype) * weights[..., None]).sum(dim=1).to(x.dtype).view(B, T, H)
        if self.shared_experts is not None:
            y = y + self.shared_experts(x)
        return y


class LLaDA2Attention(nn.Module):
    def __init__(self, cfg: LLaDA2Config):
        super().__init__()
        self.cfg = cfg
        hs, heads = cfg.head_dim, cfg.num_attention_heads + 2 * cfg.num_key_value_heads
        self.query_key_value = nn.Linear(cfg.hidden_size, heads * hs, bias=cfg.use_qkv_bias)
        self.dense = nn.Linear(cfg.num_attention_heads * hs, cfg.hidden_size, bias=cfg.use_bias)
        if cfg.use_qk_norm:
            self.query_layernorm = RMSNorm(hs, cfg.rms_norm_eps)
            self.key_layernorm = RMSNorm(hs, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        allowed: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        cfg, (B, T, _) = self.cfg, x.shape
        qkv = self.query_key_value(x).view(B, T, -1, cfg.head_dim)  # (B, T, nh + 2 nkv, hs)
        q, k, v = qkv.split([cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_key_value_heads], dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, n, T, hs)
        if cfg.use_qk_norm:
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        q, k = partial_rope(q, rope), partial_rope(k, rope)
        y, new = attend(q, k, v, allowed, past)
        return self.dense(y), new


def partial_rope(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """RoPE on the first `rope` width of each head `x` `(B, n, T, hs)`; the rest passes unturned."""
    turned = rope[0].shape[-1]
    return torch.cat([apply_rope(x[..., :turned], *rope), x[..., turned:]], dim=-1)


class LLaDA2Layer(nn.Module):
    """Pre-norm block: x + attention(norm(x)), then x + mlp(norm(x)) with a dense or sparse mlp."""

    def __init__(self, cfg: LLaDA2Config, index: int):
        super().__init__()
        self.attention = LLaDA2Attention(cfg)
        self.mlp = LLaDA2Experts(cfg) if cfg.sparse(index) else SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        allowed: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        h, kv = self.attention(self.input_layernorm(x), rope, allowed, past)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class LLaDA2Backbone(nn.Module):
    """Holds the published names: `model.word_embeddings`, `model.layers.N`, `model.norm`."""

    def __init__(self, cfg: LLaDA2Config):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LLaDA2Layer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LLaDA2ForBlockDiffusion(SDARForBlockDiffusion):
    """LLaDA2's network on SDAR's block-causal forward: `model(input_ids, position_ids, key_mask, cache, store).logits`
    `(batch, T, vocab)`; `block_size` (settable) is the block the mask follows."""

    def __init__(self, cfg: LLaDA2Config):
        nn.Module.__init__(self)
        self.config = cfg  # type: ignore[assignment]  # the forward reads the keys both configs share
        self.block_size = cfg.block_size
        self.model = LLaDA2Backbone(cfg)  # type: ignore[assignment]
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @property
    def embeddings(self) -> nn.Embedding:
        return self.model.word_embeddings  # type: ignore[return-value]

    def output_weight(self) -> torch.Tensor:
        weight: torch.Tensor = self.embeddings.weight if self.config.tie_word_embeddings else self.lm_head.weight
        return weight

    def rope(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg: LLaDA2Config = self.config  # type: ignore[assignment]
        return rope_angles(position_ids, cfg.rope_dim, cfg.rope_theta)


def read_config(folder: Path) -> LLaDA2Config:
    path = folder / "config.json"
    return LLaDA2Config.from_dict(read_json_object(path), path)


def load_llada2(folder: Path, dtype: torch.dtype = torch.float32, block_size: int = 32) -> LLaDA2ForBlockDiffusion:
    """The network of a LLaDA2 folder (config.json + safetensors, single or sharded), names and shapes checked."""
    cfg = read_config(folder)
    with torch.device("meta"):
        model = LLaDA2ForBlockDiffusion(cfg)
    model.block_size = block_size
    loaded = assign_checked(model, read_tensors(folder), folder, dtype, "a LLaDA2")
    assert isinstance(loaded, LLaDA2ForBlockDiffusion)
    return loaded
