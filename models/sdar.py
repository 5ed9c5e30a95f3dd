"""SDAR (JetAstra): block diffusion on a Qwen3-shaped network, in plain PyTorch, reading the published layout unchanged.

SDAR keeps Qwen3's weights and names (`model.layers.N.self_attn.q_norm`, ...) and changes only what attends to
what: positions are cut into blocks of `block_size` (4 by default); a query sees every key of its own block and
of every earlier block, never a later one. Decoding fills one block at a time from mask tokens while the blocks
before it sit in a KV cache, so a forward takes the new block's tokens and the cached keys of the committed ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from models.checkpoint import CheckpointError, read_json_object, read_tensors
from models.llada import SwiGLU, apply_rope, rope_angles

M = TypeVar("M", bound=nn.Module)  # a network built on the meta device, filled by `assign_checked`


@dataclass(frozen=True)
class SDARConfig:
    """The keys of SDAR's `config.json` that change the computation (names as published)."""

    vocab_size: int  # rows of the embedding and of lm_head
    hidden_size: int  # width of the residual stream
    intermediate_size: int  # SwiGLU hidden width
    num_hidden_layers: int  # transformer blocks
    num_attention_heads: int  # query heads
    num_key_value_heads: int  # key/value heads (grouped-query attention)
    head_dim: int  # per-head width; Qwen3 sets it apart from hidden_size / heads
    rms_norm_eps: float = 1e-6  # added to the mean square before rsqrt
    rope_theta: float = 1_000_000.0  # RoPE base
    max_position_embeddings: int = 32768  # longest sequence trained on
    tie_word_embeddings: bool = False  # lm_head shares the embedding matrix
    attention_bias: bool = False  # q/k/v/o projections carry biases
    block_size: int = 4  # positions per diffusion block
    mask_token_id: int | None = None  # the [MASK] id a fresh block is filled with (151669 in the published models)
    eos_token_id: int | list[int] | None = None  # end of text
    pad_token_id: int | None = None  # fills what follows an EOS (generation_config.json may name it instead)

    @property
    def kv_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, raw: dict[str, Any], path: Path | str = "config.json") -> SDARConfig:
        """Read a published config, refusing what the native model does not compute (named by key)."""
        if raw.get("model_type") != "sdar":
            raise CheckpointError(f"{path}: model_type is {raw.get('model_type')!r}, expected 'sdar'")
        for key, allowed in (
            ("hidden_act", ("silu", None)),
            ("rope_scaling", (None,)),
            ("use_sliding_window", (False, None)),
        ):
            if raw.get(key) not in allowed:
                raise CheckpointError(f"{path}: key '{key}'={raw[key]!r} is not supported by the native SDAR model")
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in raw.items() if k in names and v is not None}
        kwargs.setdefault("head_dim", raw.get("hidden_size", 0) // max(1, raw.get("num_attention_heads", 1)))
        kwargs.setdefault("num_key_value_heads", raw.get("num_attention_heads"))
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers") if k not in raw]
        missing += [k for k in ("num_attention_heads",) if k not in raw]
        if missing:
            raise CheckpointError(f"{path}: required key '{missing[0]}' is missing")
        try:
            cfg = cls(**kwargs)
        except TypeError as e:
            raise CheckpointError(f"{path}: {e}") from None
        if cfg.num_attention_heads % cfg.num_key_value_heads or cfg.head_dim % 2 or cfg.block_size <= 0:
            raise CheckpointError(
                f"{path}: heads {cfg.num_attention_heads} / kv heads {cfg.num_key_value_heads} must divide, "
                f"head_dim {cfg.head_dim} be even and block_size {cfg.block_size} positive"
            )
        return cfg


class SDARNorm(nn.Module):
    """RMSNorm in float32 with the weight applied before the cast back, as flash-attn's rms_norm_fn that SDAR calls."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)


class SDARAttention(nn.Module):
    def __init__(self, cfg: SDARConfig):
        super().__init__()
        self.cfg = cfg
        hs, bias = cfg.head_dim, cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_attention_heads * hs, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * hs, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * hs, bias=bias)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hs, cfg.hidden_size, bias=bias)
        self.q_norm = SDARNorm(hs, cfg.rms_norm_eps)  # Qwen3: per head, before RoPE
        self.k_norm = SDARNorm(hs, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        allowed: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        cfg = self.cfg
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, -1, cfg.head_dim)).transpose(1, 2)  # (B, nh, T, hs)
        k = self.k_norm(self.k_proj(x).view(B, T, -1, cfg.head_dim)).transpose(1, 2)  # (B, nkv, T, hs)
        v = self.v_proj(x).view(B, T, -1, cfg.head_dim).transpose(1, 2)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        y, new = attend(q, k, v, allowed, past)
        return self.o_proj(y), new


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor,
    past: tuple[torch.Tensor, torch.Tensor] | None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Grouped-query attention of `q` `(B, nh, T, hs)` over the cached keys and the new `k`, `v` `(B, nkv, T, hs)`
    (after RoPE) where `allowed` `(B, 1, T, S + T)`; returns `(B, T, nh * hs)` and the new keys/values."""
    B, nh, T, hs = q.shape
    new = (k, v)
    if past is not None:
        k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)  # (B, nkv, S + T, hs)
    groups = nh // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=hs**-0.5)  # (B, nh, T, hs)
    return y.transpose(1, 2).reshape(B, T, nh * hs), new


class SDARLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: SDARConfig):
        super().__init__()
        self.self_attn = SDARAttention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = SDARNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = SDARNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        allowed: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        h, kv = self.self_attn(self.input_layernorm(x), rope, allowed, past)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class SDARBackbone(nn.Module):
    """Holds the Qwen3 names: `model.embed_tokens`, `model.layers.N`, `model.norm`."""

    def __init__(self, cfg: SDARConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(SDARLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = SDARNorm(cfg.hidden_size, cfg.rms_norm_eps)


@dataclass
class SDARCache:
    """Keys/values of the committed positions, per layer `(k, v)` of shape `(batch, kv_heads, S, head_dim)`
    after RoPE, with `key_mask` `(batch, S)` (False: left padding)."""

    layers: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    key_mask: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.key_mask is None else self.key_mask.shape[1]

    def rows(self, index: torch.Tensor) -> SDARCache:
        """A cache of the batch rows `index` `(n,)` only; this one is untouched."""
        mask = None if self.key_mask is None else self.key_mask[index]
        return SDARCache([(k[index], v[index]) for k, v in self.layers], mask)


def run_layers(
    layers: nn.ModuleList,
    x: torch.Tensor,
    rope: Any,
    allowed: torch.Tensor,
    cache: SDARCache,
    store: bool,
    key_mask: torch.Tensor,
) -> torch.Tensor:
    """`x` `(B, T, d)` through `layers`, each reading its cached keys/values; with `store`, the new ones (and
    `key_mask` `(B, T)`, False: left padding) are appended to `cache`."""
    new: list[tuple[torch.Tensor, torch.Tensor]] = []
    for i, layer in enumerate(layers):
        x, kv = layer(x, rope, allowed, cache.layers[i] if cache.layers else None)
        new.append(kv)
    if store:
        stored = [(torch.cat([k0, k], 2), torch.cat([v0, v], 2)) for (k0, v0), (k, v) in zip(cache.layers, new)]
        cache.layers = stored if cache.layers else new
        mask = key_mask.bool()
        cache.key_mask = mask if cache.key_mask is None else torch.cat([cache.key_mask, mask], 1)
    return x


@dataclass
class SDAROutput:
    """logits (`torch.FloatTensor` of shape `(batch, T, vocab)`) for the positions of one call."""

    logits: torch.Tensor


class SDARForBlockDiffusion(nn.Module):
    """SDAR's network: `model(input_ids, position_ids, key_mask, cache, store).logits` `(batch, T, vocab)`."""

    def __init__(self, cfg: SDARConfig):
        super().__init__()
        self.config = cfg
        self.block_size = cfg.block_size  # the block the attention mask follows
        self.model = SDARBackbone(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @property
    def device(self) -> torch.device:
        return self.embeddings.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embeddings.weight.dtype

    # What a block-causal network on this forward names differently (LLaDA2, models/llada2.py, overrides them).
    @property
    def embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def output_weight(self) -> torch.Tensor:
        """`(vocab, hidden)`: lm_head's, or the embedding's when tied."""
        return self.model.embed_tokens.weight if self.config.tie_word_embeddings else self.lm_head.weight

    def rope(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_angles(position_ids, self.config.head_dim, self.config.rope_theta)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        cache: SDARCache | None = None,
        store: bool = False,
    ) -> SDAROutput:
        """Score `input_ids` `(B, T)` at `position_ids` `(B, T)` (default: after the cache), block-causally.

        A query sees the cached keys and the new keys whose block (`position // block_size`) is not after its own;
        `key_mask` `(B, T)` marks the new keys that are real (False: left padding). With `store`, the new keys
        and values are appended to `cache`."""
        B, T = input_ids.shape
        cache = cache if cache is not None else SDARCache()
        if position_ids is None:
            position_ids = torch.arange(cache.length, cache.length + T, device=input_ids.device).expand(B, T)
        if key_mask is None:
            key_mask = torch.ones(B, T, dtype=torch.bool, device=input_ids.device)
        allowed = self._allowed(position_ids, key_mask.bool(), cache)
        rope = self.rope(position_ids)
        x = run_layers(self.model.layers, self.embeddings(input_ids), rope, allowed, cache, store, key_mask)
        x = self.model.norm(x)
        return SDAROutput(logits=F.linear(x, self.output_weight()).float())

    def _allowed(self, positions: torch.Tensor, key_mask: torch.Tensor, cache: SDARCache) -> torch.Tensor:
        """Boolean `(B, 1, T, S + T)` of allowed (query, key) pairs: the block-causal rule over real keys."""
        blocks = torch.div(positions, self.block_size, rounding_mode="floor")  # (B, T)
        within = blocks[:, None, :] <= blocks[:, :, None]  # (B, Tq, Tk)
        within &= key_mask[:, None, :]
        # a padded query with no real key in view would give NaN, which its values would carry on: it sees itself
        within |= torch.eye(positions.shape[1], dtype=torch.bool, device=positions.device)
        if cache.key_mask is not None:
            past = cache.key_mask[:, None, :].expand(-1, positions.shape[1], -1)
            within = torch.cat([past, within], dim=2)
        return within[:, None]


def read_config(folder: Path) -> SDARConfig:
    path = folder / "config.json"
    return SDARConfig.from_dict(read_json_object(path), path)


def load_sdar(folder: Path, dtype: torch.dtype = torch.float32) -> SDARForBlockDiffusion:
    """The network of an SDAR folder (config.json + safetensors, single or sharded), names and shapes checked."""
    cfg = read_config(folder)
    with torch.device("meta"):
        model = SDARForBlockDiffusion(cfg)
    return assign_checked(model, read_tensors(folder), folder, dtype, "an SDAR")


def assign_checked(model: M, tensors: dict[str, torch.Tensor], folder: Path, dtype: torch.dtype, family: str) -> M:
    """`model` (built on the meta device) holding `tensors`, every name and shape checked against its own."""
    expected = {name: tuple(p.shape) for name, p in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)  # some tied checkpoints still write it
    for name, shape in expected.items():
        if name not in tensors:
            raise CheckpointError(f"{folder}: tensor '{name}' missing from the weights (expected shape {shape})")
        if tuple(tensors[name].shape) != shape:
            raise CheckpointError(f"{folder}: tensor '{name}' has shape {tuple(tensors[name].shape)}, expected {shape}")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise CheckpointError(f"{folder}: unexpected tensor '{extra[0]}' ({len(extra)} in all); not {family} layout?")
    model.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, assign=True, strict=True)
    return model.eval()


def random_sdar(cfg: SDARConfig, seed: int = 0, std: float = 0.02) -> SDARForBlockDiffusion:
    """Random weights (norm weights drawn around 1, so they are exercised too), for tests and parity checks."""
    g = torch.Generator().manual_seed(seed)
    model = SDARForBlockDiffusion(cfg)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return model.eval()


def save_sdar(model: SDARForBlockDiffusion, folder: Path, extra_config: dict[str, Any] | None = None) -> Path:
    """Write `model` in the published layout: config.json (model_type sdar, Qwen3 keys) and model.safetensors."""
    from dataclasses import asdict

    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = asdict(model.config) | {"model_type": "sdar", "architectures": ["SDARForCausalLM"], "hidden_act": "silu"}
    (folder / "config.json").write_text(json.dumps(config | (extra_config or {}), indent=2) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder
