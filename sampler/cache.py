"""Where a step's logits come from: a full forward each step, or keys/values reused across steps.

Attention in a masked diffusion model is bidirectional, so a cached key is stale as soon as any
token it saw is committed; caching is an approximation that Fast-dLLM showed to cost little:

- `prefix`: at a refresh (every block start, and every `cache_refresh` steps) one full forward;
  until the next refresh the keys/values of everything before the block are reused, the block
  and the suffix are recomputed.
- `dual`: prefix and suffix keys/values are reused, only the current block is recomputed.

Every policy computes only the canvas its horizon (`horizon.py`) shows: with `future_window` the
positions beyond it are neither run nor cached, so the dual cache's suffix is the window alone.

A refresh step runs exactly the no-cache call, so `cache_refresh=1` gives the no-cache tokens,
unless `refresh_span` shortens it (`SinceCachedBlock`: a refresh recomputes from the start of the block
the cache was built for and keeps the keys/values before it; lossy, measured in
docs/experiments/refresh-span). Keys are cached after RoPE with their own positions; every call
passes its true position ids, so it sees the same angles as a full forward would. A cache is a set of
keys with a mask, not a sequence: attention does not read their order.

A call whose keys/values are not kept (a cached window) computes only the rows with a mask in it:
the others have nothing to commit, and get zero logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from sampler.horizon import canvas_horizon

if TYPE_CHECKING:  # the config names these policies; the policies only read its fields
    from sampler.config import SamplerConfig
    from sampler.generate import DecodeState

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (k, v), each (batch, kv_heads, seq, head_dim)


@dataclass
class Window:
    """logits (`torch.FloatTensor` of shape `(batch, W, vocab)`) for canvas positions `[lo, lo + W)`."""

    logits: torch.Tensor
    lo: int


class ModelCall:
    """Calls the denoiser on `n` stacked canvases `(n * batch, ...)`, folding in classifier-free guidance."""

    def __init__(
        self, model: Any, attention_mask: torch.Tensor | None, prompt_index: torch.Tensor, config: SamplerConfig
    ):
        self.model, self.attention_mask, self.prompt_index, self.config = model, attention_mask, prompt_index, config
        B, T = prompt_index.shape
        mask = (
            attention_mask
            if attention_mask is not None
            else torch.ones(B, T, dtype=torch.long, device=prompt_index.device)
        )
        self.key_mask = mask  # (B, T) with the generation's ones
        self.position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T): a padded row sees its solo angles
        self.skip_settled = config.early_exit != "none"  # rows without a mask need no logits

    def _run(
        self, x: torch.Tensor, lo: int, attention_mask: torch.Tensor | None, **kwargs: Any
    ) -> tuple[torch.Tensor, KV | None]:
        """`x` holds canvas positions `[lo, lo + W)` of `n * batch` rows; the model sees only rows with a mask
        when settled rows are skipped (early exit) or the call's keys/values are not kept; the others get zero
        logits and keys/values."""
        reps = x.shape[0] // self.prompt_index.shape[0]
        prompt = self.prompt_index[:, lo : lo + x.shape[1]].repeat(reps, 1)
        live = (x == self.config.mask_id).any(dim=-1)  # (rows,)
        skip = self.skip_settled or not kwargs.get("use_cache")
        if not skip or bool(live.all()):
            return self._guided(x, prompt, attention_mask, **kwargs)
        rows, idx = x.shape[0], live.nonzero()[:, 0]
        guided_rows = idx if self.config.cfg_scale <= 0 else torch.cat([idx, idx + rows])  # cache rows: cond, uncond
        kw = dict(kwargs)
        if "position_ids" in kw:
            kw["position_ids"] = kw["position_ids"][idx]
        if kw.get("past_key_values") is not None:
            kw["past_key_values"] = [(k[guided_rows], v[guided_rows]) for k, v in kw["past_key_values"]]
        logits, kv = self._guided(x[idx], prompt[idx], None if attention_mask is None else attention_mask[idx], **kw)
        full = logits.new_zeros((rows, *logits.shape[1:]))
        full[idx] = logits
        if kv is not None:
            kv = [
                (
                    _scatter_rows(k, guided_rows, rows * (1 + (self.config.cfg_scale > 0))),
                    _scatter_rows(v, guided_rows, rows * (1 + (self.config.cfg_scale > 0))),
                )
                for k, v in kv
            ]
        return full, kv

    def _guided(
        self, x: torch.Tensor, prompt: torch.Tensor, attention_mask: torch.Tensor | None, **kwargs: Any
    ) -> tuple[torch.Tensor, KV | None]:
        """One model call; with CFG a copy with the `prompt` positions masked joins the batch."""
        cfg = self.config
        if cfg.cfg_scale <= 0:
            out = self.model(x, attention_mask=attention_mask, **kwargs)
            return out.logits, out.past_key_values if kwargs.get("use_cache") else None
        un_x = x.clone()
        un_x[prompt] = cfg.mask_id

        def both(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else torch.cat([t, t], dim=0)

        if "position_ids" in kwargs:  # past_key_values already hold the cond and uncond rows
            kwargs["position_ids"] = both(kwargs["position_ids"])
        out = self.model(torch.cat([x, un_x], dim=0), attention_mask=both(attention_mask), **kwargs)
        cond, uncond = torch.chunk(out.logits, 2, dim=0)
        return uncond + (cfg.cfg_scale + 1) * (cond - uncond), out.past_key_values if kwargs.get("use_cache") else None

    def full(self, x: torch.Tensor, use_cache: bool = False) -> tuple[torch.Tensor, KV | None]:
        """Logits of canvases `x` `(n * batch, T')` (positions `[0, T')`, `T'` the horizon's end) by the exact
        vanilla call; kv when `use_cache` (with CFG, the cond rows then the uncond rows)."""
        reps = x.shape[0] // self.prompt_index.shape[0]
        mask = None if self.attention_mask is None else self.attention_mask[:, : x.shape[1]]  # a horizon may cut x
        mask = mask if reps == 1 or mask is None else mask.repeat(reps, 1)
        return self._run(x, 0, mask, **({"use_cache": True} if use_cache else {}))

    def window(self, x: torch.Tensor, lo: int, past_mask: torch.Tensor, past: KV) -> torch.Tensor:
        """Logits of positions `[lo, lo + W)` given cached keys/values `past`, of which `past_mask` `(batch, S)`
        says which to attend to.

        x `(n * batch, W)`; past per layer `(n * batch [* 2 with CFG], kv_heads, S, head_dim)`.
        """
        return self._cached(x, lo, past_mask, past)[0]

    def span(self, x: torch.Tensor, lo: int, past_mask: torch.Tensor, past: KV) -> tuple[torch.Tensor, KV]:
        """`window`'s logits of one batch (`n` = 1), and the keys/values of positions `[lo, lo + W)`."""
        logits, kv = self._cached(x, lo, past_mask, past, use_cache=True)
        assert kv is not None, "use_cache=True: the torch module returns the window's keys/values"
        return logits, kv

    def _cached(
        self, x: torch.Tensor, lo: int, past_mask: torch.Tensor, past: KV, **kwargs: Any
    ) -> tuple[torch.Tensor, KV | None]:
        reps = x.shape[0] // self.prompt_index.shape[0]
        hi = lo + x.shape[1]
        keys = torch.cat([past_mask, self.key_mask[:, lo:hi]], dim=-1).repeat(reps, 1)
        positions = self.position_ids[:, lo:hi].repeat(reps, 1)
        return self._run(x, lo, keys, position_ids=positions, past_key_values=past, **kwargs)


class LogitsSource(Protocol):
    def logits(self, states: list[DecodeState]) -> list[Window]:
        """One model call evaluating every state (a DecodeState) in `states`; one Window each."""
        ...

    def refresh_due(self, state: DecodeState) -> bool:
        """Whether `state` needs a full forward (so it cannot share a call with other states)."""
        ...


class NoCache:
    """Every step recomputes the whole canvas up to the horizon (the reference's behaviour)."""

    def __init__(self, call: ModelCall, prompt_length: int, config: SamplerConfig):
        self.call = call
        self.horizon = canvas_horizon(config, prompt_length)
        self.windowed = bool(config.future_window)
        self.block: int | None = None  # the block of the last call

    def refresh_due(self, state: DecodeState) -> bool:
        # A windowed canvas ends where the block says: states of two blocks cannot share one call.
        return self.windowed and state.block != self.block

    def logits(self, states: list[DecodeState]) -> list[Window]:
        end = self.horizon.end(states[0].block)
        self.block = states[0].block
        logits, _ = self.call.full(torch.cat([s.x[:, :end] for s in states], dim=0))
        return [Window(part, 0) for part in torch.chunk(logits, len(states), dim=0)]


class BlockCache:
    """Shared by prefix and dual caches: refresh at block starts and every `cache_refresh` steps."""

    def __init__(self, call: ModelCall, prompt_length: int, config: SamplerConfig):
        self.call, self.P, self.config = call, prompt_length, config
        self.horizon = canvas_horizon(config, prompt_length)
        self.span = REFRESH_SPANS[config.refresh_span]()
        self.block: int | None = None  # the block whose cache is held
        self.past: KV | None = None
        self.past_mask: torch.Tensor | None = None  # (B, S): the cached keys a window attends to

    def refresh_due(self, state: DecodeState) -> bool:
        k = self.config.cache_refresh
        return self.block != state.block or state.step == 0 or (k > 0 and state.step % k == 0)

    def region(self, block: int) -> tuple[int, int, int]:
        """(start, end, hi): the block's bounds and the end of the recomputed window."""
        raise NotImplementedError

    def logits(self, states: list[DecodeState]) -> list[Window]:
        if len(states) == 1 and self.refresh_due(states[0]):
            return [self._refresh(states[0])]
        if any(self.refresh_due(s) for s in states):
            raise RuntimeError("a refresh state cannot share a model call with other states")
        start, end, hi = self.region(states[0].block)
        x = torch.cat([s.x[:, start:hi] for s in states], dim=0)  # (n * B, W)
        n = len(states)
        cached, past_mask = self.past, self.past_mask
        assert cached is not None and past_mask is not None, "refresh_due holds until a refresh has filled the cache"
        past = cached if n == 1 else [(k.repeat(n, 1, 1, 1), v.repeat(n, 1, 1, 1)) for k, v in cached]
        if n > 1 and self.config.cfg_scale > 0:  # cache rows are [cond B, uncond B]; repeat each half
            past = [(_repeat_halves(k, n), _repeat_halves(v, n)) for k, v in cached]
        logits = self.call.window(x, start, past_mask, past)
        return [Window(part, start) for part in torch.chunk(logits, n, dim=0)]

    def _refresh(self, state: DecodeState) -> Window:
        T = self.horizon.end(state.block)
        cached = self.past
        lo = 0 if cached is None else self.span.first(self.block, self.P, self.config.block_length)
        kv: KV | None
        if cached is not None and lo:
            kept = [(k[:, :, :lo], v[:, :, :lo]) for k, v in cached]
            logits, new = self.call.span(state.x[:, lo:T], lo, self.call.key_mask[:, :lo], kept)
            kv = [(torch.cat([k, nk], dim=2), torch.cat([v, nv], dim=2)) for (k, v), (nk, nv) in zip(kept, new)]
        else:
            logits, kv = self.call.full(state.x[:, :T], use_cache=True)
        start, end, hi = self.region(state.block)
        # every position's keys/values stay cached, the recomputed window's masked out: no copy of the cache
        self.past = kv  # (B, nkv, T, hs)
        self.past_mask = self.call.key_mask[:, :T].clone()
        self.past_mask[:, start:hi] = 0
        self.block = state.block
        return Window(logits, lo)


def _scatter_rows(t: torch.Tensor, rows: torch.Tensor, total: int) -> torch.Tensor:
    full = t.new_zeros((total, *t.shape[1:]))
    full[rows] = t
    return full


def _repeat_halves(t: torch.Tensor, n: int) -> torch.Tensor:
    cond, uncond = torch.chunk(t, 2, dim=0)
    return torch.cat([cond.repeat(n, 1, 1, 1), uncond.repeat(n, 1, 1, 1)], dim=0)


class PrefixCache(BlockCache):
    """Reuse everything before the block; recompute the block and the suffix."""

    def region(self, block: int) -> tuple[int, int, int]:
        start = self.P + block * self.config.block_length
        return start, start + self.config.block_length, self.horizon.end(block)


class DualCache(BlockCache):
    """Reuse the prefix and the suffix (up to the horizon); recompute only the block."""

    def region(self, block: int) -> tuple[int, int, int]:
        start = self.P + block * self.config.block_length
        end = start + self.config.block_length
        return start, end, end


CACHE_POLICIES: dict[str, type] = {"none": NoCache, "prefix": PrefixCache, "dual": DualCache}


class WholeCanvas:
    """A refresh is the no-cache call over the canvas up to the horizon (Fast-dLLM's, and the reference's tokens
    at `cache_refresh=1`)."""

    def first(self, cached_block: int | None, prompt_length: int, block_length: int) -> int:
        return 0


class SinceCachedBlock:
    """A refresh recomputes from the start of the block the cache was built for (at a block start: the block
    just finished, whose tokens are new) to the horizon; the prompt's and older blocks' keys/values are kept
    from the refresh that computed them. Lossy: they saw the canvas as it was then."""

    requires = {"cache": ("dual", "prefix"), "backend": ("torch",)}  # the ONNX cached graph returns no keys/values
    joins_running_batch = False  # a row's keys/values would have to follow it from one batch to the next

    def first(self, cached_block: int, prompt_length: int, block_length: int) -> int:
        return prompt_length + cached_block * block_length


REFRESH_SPANS: dict[str, type] = {"canvas": WholeCanvas, "from_cached_block": SinceCachedBlock}


def logits_source(config: SamplerConfig, call: ModelCall, prompt_length: int) -> LogitsSource:
    if config.cache != "none" and bool((call.prompt_index[:, :prompt_length] == False).any()):  # noqa: E712
        raise ValueError(
            f"SamplerConfig.cache={config.cache!r} cannot decode masks inside the prompt (infilling): "
            "the prompt's keys are cached; use cache='none'"
        )
    source: LogitsSource = CACHE_POLICIES[config.cache](call, prompt_length, config)
    return source
