"""SamplerConfig: every setting that changes a decoder's output, as one frozen, hashable value."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields, replace
from typing import Any

from sampler.backends import BACKENDS
from sampler.cache import CACHE_POLICIES, REFRESH_SPANS
from sampler.commit import COMMIT_RULES
from sampler.early_exit import EARLY_EXIT_RULES
from sampler.end_of_text import END_OF_TEXT_RULES
from sampler.remasking import REMASKING_POLICIES

# The settings that name a policy, and the registry each name is looked up in. The policy modules
# import SamplerConfig only for type hints, so the config may import them.
POLICY_REGISTRIES: dict[str, dict[str, Any]] = {
    "remasking": REMASKING_POLICIES,
    "parallel": COMMIT_RULES,
    "cache": CACHE_POLICIES,
    "refresh_span": REFRESH_SPANS,
    "early_exit": EARLY_EXIT_RULES,
    "backend": BACKENDS,
    "eot_predict": END_OF_TEXT_RULES,
}


@dataclass(frozen=True)
class SamplerConfig:
    """Decoding settings. Its `hash()` keys caches, eval records and registry runs."""

    steps: int = 128  # model calls budgeted for the whole generation (split evenly over blocks)
    gen_length: int = 128  # masked positions appended after the prompt
    block_length: int = 32  # semi-autoregressive block width; gen_length must be a multiple
    temperature: float = 0.0  # 0 = argmax; > 0 = Gumbel-max sampling in float64
    cfg_scale: float = 0.0  # classifier-free guidance; > 0 adds an unconditional pass (prompt masked)
    remasking: str = "low_confidence"  # which masked positions are committed first
    mask_id: int = 126336  # the [MASK] token id (LLaDA's default; the CLI fills the model's own)
    eos_id: int = 126081  # end-of-sequence id
    eot_id: int | None = 126348  # end-of-turn id, or None when the tokenizer has none
    seed: int | None = 0  # seeds a private generator; None draws from torch's global RNG
    logits_eos_inf: bool = False  # forbid EOS outright
    confidence_eos_eot_inf: bool = False  # give EOS/EoT predictions confidence 0 (commit them last)
    # Fast decoding. Each field picks a small object (sampler/commit.py, cache.py, speculative.py,
    # early_exit.py, backends.py); the defaults are the exact vanilla sampler.
    # commit rule: top_k (the step schedule), threshold, factor, entropy, timesteps (Dream), ancestral (Dream's origin)
    parallel: str = "top_k"
    parallel_threshold: float = 0.9  # threshold rule: commit every masked position this confident
    parallel_factor: float = 1.0  # factor rule: commit the n-th most confident while (n + 1)(1 - c_n) < f
    entropy_bound: float = 1.0  # entropy rule: commit lowest-entropy positions while their sum (nats) stays under
    cache: str = "none"  # none, prefix (reuse keys/values before the block), dual (before and after it)
    cache_refresh: int = 0  # full forward every k steps of a block as well as at its start; 0 = block start only
    refresh_span: str = "canvas"  # what a refresh recomputes: canvas (all of it), from_cached_block (lossy, shorter)
    speculative_draft: int = 0  # steps drafted and verified per model call (lossless, temperature 0); 0 = off
    early_exit: str = "none"  # none, or eos_decided: stop once the text before the first EOS is final
    backend: str = "torch"  # torch, or onnxruntime (the exported denoiser)
    # Long canvases (sampler/horizon.py): a forward sees the block and this many positions after it; 0 = all.
    future_window: int = 0
    eot_predict: str = "none"  # none, or eos_run: fill the padding the model is sure of (sampler/end_of_text.py)
    eot_confidence: float = 0.9  # eos_run: the EOS probability a masked position needs to count as padding
    compile: bool = False  # torch backend: run the module through torch.compile (sampler/backends.py)
    speculative_rows: bool = False  # speculative rounds: each row accepts its own verified prefix (lossless)
    # Only the k likeliest tokens of a position count (proposal and confidence); 0 = all. Dream's generate keeps
    # 50 unless told otherwise (transformers 4.46's config default), which reorders its commits even at temperature 0.
    top_k: int = 0

    # Fields added after configs were first recorded: left out of `hash()` while at their default,
    # so every config recorded before they existed keeps its hash.
    _HASH_OPTIONAL = (
        "parallel",
        "parallel_threshold",
        "parallel_factor",
        "entropy_bound",
        "cache",
        "cache_refresh",
        "speculative_draft",
        "early_exit",
        "backend",
        "future_window",
        "eot_predict",
        "eot_confidence",
        "compile",
        "speculative_rows",
        "refresh_span",
        "top_k",
    )

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise ValueError naming the field and value that cannot work."""
        for name in ("steps", "gen_length", "block_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"SamplerConfig.{name} must be a positive integer, got {value!r}")
        if self.gen_length % self.block_length:
            raise ValueError(
                f"SamplerConfig.gen_length={self.gen_length} must be a multiple of block_length={self.block_length}"
            )
        blocks = self.gen_length // self.block_length
        if self.steps % blocks:
            raise ValueError(
                f"SamplerConfig.steps={self.steps} must be a multiple of the number of blocks "
                f"({self.gen_length} // {self.block_length} = {blocks})"
            )
        if self.temperature < 0:
            raise ValueError(f"SamplerConfig.temperature must be >= 0, got {self.temperature!r}")
        if self.cfg_scale < 0:
            raise ValueError(f"SamplerConfig.cfg_scale must be >= 0, got {self.cfg_scale!r}")
        for name, known in POLICY_REGISTRIES.items():
            if getattr(self, name) not in known:
                raise ValueError(f"SamplerConfig.{name}={getattr(self, name)!r}; known: {', '.join(sorted(known))}")
        for name, known in POLICY_REGISTRIES.items():  # a policy that works only beside certain others says which
            for other, allowed in getattr(known[getattr(self, name)], "requires", {}).items():
                if getattr(self, other) not in allowed:
                    raise ValueError(
                        f"SamplerConfig.{name}={getattr(self, name)!r} needs {other} in "
                        f"{', '.join(map(repr, allowed))}; got {other}={getattr(self, other)!r}"
                    )
        self._check_fast_modes()

    def _check_fast_modes(self) -> None:
        if not 0.0 < self.parallel_threshold <= 1.0:
            raise ValueError(f"SamplerConfig.parallel_threshold must be in (0, 1], got {self.parallel_threshold!r}")
        for name in ("compile", "speculative_rows"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"SamplerConfig.{name} must be true or false, got {getattr(self, name)!r}")
        if self.speculative_rows and (not self.speculative_draft or self.cache_refresh):
            raise ValueError(
                f"SamplerConfig.speculative_rows=True lets rows of one speculative round advance apart: needs "
                f"speculative_draft >= 2 and cache_refresh=0 (a refresh must fall on every row's same step; got "
                f"{self.speculative_draft!r}, {self.cache_refresh!r})"
            )
        if self.compile and self.backend != "torch":
            raise ValueError(
                f"SamplerConfig.compile=True compiles the torch module; backend={self.backend!r} runs its own graph"
            )
        if not 0.0 < self.eot_confidence <= 1.0:
            raise ValueError(f"SamplerConfig.eot_confidence must be in (0, 1], got {self.eot_confidence!r}")
        for name in ("parallel_factor", "entropy_bound"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SamplerConfig.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("cache_refresh", "speculative_draft", "future_window", "top_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"SamplerConfig.{name} must be a non-negative integer, got {value!r}")
        if self.speculative_draft == 1:
            raise ValueError("SamplerConfig.speculative_draft=1 drafts nothing to verify; use 0 (off) or >= 2")
        if self.speculative_draft and (self.temperature > 0 or self.remasking != "low_confidence"):
            raise ValueError(
                f"SamplerConfig.speculative_draft={self.speculative_draft} is lossless only for deterministic "
                f"decoding: needs temperature=0 and remasking='low_confidence' (got {self.temperature!r}, "
                f"{self.remasking!r})"
            )

    @property
    def draws(self) -> bool:
        """Whether a random draw decides the output, so the seed does: sampled tokens, or a policy that draws
        (random remasking, the ancestral commit rule) even at temperature 0."""
        chosen = (registry[getattr(self, name)] for name, registry in POLICY_REGISTRIES.items())
        return self.temperature > 0 or any(getattr(policy, "draws", False) for policy in chosen)

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def steps_per_block(self) -> int:
        return self.steps // self.num_blocks

    def to_dict(self) -> dict[str, Any]:
        # every field is a scalar, so a shallow read is what asdict's deep copy gave, at a fifth of the cost:
        # a served request reads its config's dict and hash several times
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SamplerConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"SamplerConfig: unknown setting '{unknown[0]}'; known: {', '.join(sorted(known))}")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> SamplerConfig:
        return cls.from_dict(json.loads(text))

    def hash(self) -> str:
        """Stable 16-hex digest of the canonical JSON form (newer fields only when set)."""
        # kept on the instance (frozen: its fields cannot change); never shared between equal configs, which
        # can still differ in their JSON (0 == 0.0)
        known = self.__dict__.get("_digest")
        if known is None:
            defaults = {f.name: f.default for f in fields(self)}
            data = {k: v for k, v in self.to_dict().items() if k not in self._HASH_OPTIONAL or v != defaults[k]}
            known = hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
            object.__setattr__(self, "_digest", known)
        return known

    def with_(self, **changes: Any) -> SamplerConfig:
        return replace(self, **changes)
