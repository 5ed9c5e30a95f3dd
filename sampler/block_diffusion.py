"""Block diffusion decoding for uniform-state models (DiffusionGemma), token-exact with transformers.

The sequence grows one canvas (block) at a time. A causal encoder caches the prompt and every
committed canvas; a bidirectional decoder refines the new canvas, reading the cache and its own
previous logits (self-conditioning). The canvas starts as uniform random tokens; each step samples
every position, accepts the lowest-entropy positions while their summed entropy (less the largest)
stays under a bound, and re-noises the rest with fresh random tokens. A block ends after
`max_denoising_steps` or once its argmax is stable and confident; its argmax is committed.

What varies lives in small objects (temperature schedule, acceptance rule, re-noising, stopping
rule); the loop below owns the canvas, the cache and the model calls. Random draws come from one
generator in the reference's order (initial canvas; then per step: sample, re-noise), so a seeded
run reproduces `DiffusionGemmaForBlockDiffusion.generate()` after `torch.manual_seed(seed)`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol

import torch

from sampler.generate import make_generator
from sampler.masked_blocks import MASKED_COMMITS, generate_masked_blocks
from sampler.output import BlockDiffusionStats, GenerateOutput, StepCallback, StepInfo
from sampler.seeded_blocks import SEEDED_MODES, generate_seeded_blocks

# The canvases of mask tokens and the loop that decodes each (the uniform canvas is this module's own loop below).
MASKED_LOOPS: dict[str, Callable[..., GenerateOutput]] = {
    "masked": generate_masked_blocks,
    "seeded": generate_seeded_blocks,
}


@dataclass(frozen=True)
class BlockDiffusionConfig:
    """Settings that change a block-diffusion decode; defaults are DiffusionGemma's published ones."""

    max_new_tokens: int = 256  # rounded up to whole canvases
    max_denoising_steps: int = 48  # decoder calls per canvas at most
    entropy_bound: float = 0.1  # acceptance budget: summed entropy of accepted positions minus the largest
    t_min: float = 0.4  # temperature at the last step
    t_max: float = 0.8  # temperature at the first step
    stability_threshold: int = 1  # steps the argmax must repeat before a canvas may stop early (0: no check)
    confidence_threshold: float | None = 0.005  # mean entropy under which a stable canvas stops; None: never
    eos_ids: tuple[int, ...] = ()  # a canvas holding one ends its row
    pad_id: int | None = None  # replaces tokens after EOS and canvases of finished rows
    seed: int | None = 0  # private generator; None draws from torch's global RNG
    # The masked canvas (SDAR: sampler/masked_blocks.py). Left out of a uniform canvas's `to_dict()` and `hash()`
    # (where they must keep their defaults), so every config recorded before they existed keeps its hash.
    # uniform: DiffusionGemma's uniform-state canvas; masked: mask tokens unmasked in steps; seeded: masked, each block
    # opened by the token a causal pass predicts (Nemotron-Labs-Diffusion: sampler/seeded_blocks.py)
    canvas: str = "uniform"
    remasking: str = "low_confidence_dynamic"  # masked: which masked positions a step commits (MASKED_COMMITS)
    commit_threshold: float = 0.9  # low_confidence_dynamic: commit every masked position this confident
    temperature: float = 1.0  # masked: sampling temperature; 0 takes the argmax
    top_k: int = 0  # masked: sample among the k most likely tokens; 0 = all
    top_p: float = 1.0  # masked: sample within the smallest set of probability p
    mask_id: int | None = None  # masked: the model's mask token
    # seeded: how a block is filled (SEEDED_MODES): diffusion (denoised in steps), self_speculative (one diffusion draft
    # verified by one causal pass: autoregressive greedy's tokens) or autoregressive (one causal pass a token)
    mode: str = "diffusion"

    _OPTIONAL = ("canvas", "remasking", "commit_threshold", "temperature", "top_k", "top_p", "mask_id", "mode")

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "max_denoising_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"BlockDiffusionConfig.{name} must be a positive integer, got {value!r}")
        if not self.entropy_bound > 0:
            raise ValueError(f"BlockDiffusionConfig.entropy_bound must be > 0, got {self.entropy_bound!r}")
        if not 0 <= self.t_min < self.t_max:
            raise ValueError(
                f"BlockDiffusionConfig needs 0 <= t_min < t_max, got t_min={self.t_min!r} t_max={self.t_max!r}"
            )
        if self.stability_threshold < 0:
            raise ValueError(f"BlockDiffusionConfig.stability_threshold must be >= 0, got {self.stability_threshold!r}")
        self._check_masked()

    def _check_masked(self) -> None:
        known = {"canvas": ("uniform", *MASKED_LOOPS), "remasking": tuple(MASKED_COMMITS), "mode": SEEDED_MODES}
        for name, allowed in known.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"BlockDiffusionConfig.{name}={getattr(self, name)!r}; known: {', '.join(allowed)}")
        if self.canvas == "uniform":
            changed = [k for k in self._OPTIONAL[1:] if getattr(self, k) != BLOCK_FIELD_DEFAULTS[k]]
            if changed:
                raise ValueError(
                    f"BlockDiffusionConfig.{changed[0]} is read by the masked canvas only (canvas='masked')"
                )
        if self.mode != "diffusion" and self.canvas != "seeded":
            raise ValueError(
                f"BlockDiffusionConfig.mode={self.mode!r} is read by the seeded canvas only (canvas='seeded')"
            )
        if self.mode == "self_speculative" and self.temperature != 0:
            raise ValueError(
                "BlockDiffusionConfig.mode='self_speculative' is lossless for greedy decoding only: needs "
                f"temperature=0, got {self.temperature!r}"
            )
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0 or not 0 <= self.commit_threshold <= 1:
            raise ValueError(
                f"BlockDiffusionConfig needs temperature >= 0, 0 < top_p <= 1, top_k >= 0, 0 <= commit_threshold <= 1; "
                f"got {self.temperature!r}, {self.top_p!r}, {self.top_k!r}, {self.commit_threshold!r}"
            )

    @property
    def gen_length(self) -> int:
        """New tokens asked for (the SamplerConfig name, which records and reports read)."""
        return self.max_new_tokens

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.canvas == "uniform":
            return {k: v for k, v in data.items() if k not in self._OPTIONAL}
        # the mode joined after masked canvases were recorded: left out at its default, so their hashes hold
        return data if self.mode != "diffusion" else {k: v for k, v in data.items() if k != "mode"}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def hash(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]


BLOCK_FIELD_DEFAULTS = {f.name: f.default for f in fields(BlockDiffusionConfig)}


class BlockDenoiser(Protocol):
    """What an adapter offers the block-diffusion loop (DiffusionGemma's adapter implements it)."""

    canvas_length: int
    vocab_size: int
    dtype: torch.dtype  # self-conditioning logits are cast to it, as the reference does

    def new_cache(self) -> Any:
        """An empty prefix cache."""

    def encode_prefix(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, cache: Any
    ) -> Any:
        """Append `input_ids` `(batch, n)` to the cache; `attention_mask` `(batch, cached + n)` covers all keys."""

    def denoise(
        self,
        canvas: torch.Tensor,
        self_conditioning: torch.Tensor | None,
        cache: Any,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Float32 logits `(batch, canvas_length, vocab)` for `canvas`; the cache is read, not written."""

    # Optional: `cache_rows(cache, rows)`, a cache of only the batch rows `rows` `(n,)` (the original untouched).
    # With it, a denoising call computes only the rows still denoising (see `RowsToDenoise`).


class LinearTemperatureSchedule:
    """t = t_min + (t_max - t_min) * remaining / total, in the reference's tensor arithmetic."""

    def __init__(self, t_min: float, t_max: float, steps: int):
        self.t_min, self.t_max, self.steps = t_min, t_max, steps

    def apply(self, logits: torch.Tensor, remaining: int) -> torch.Tensor:
        step = torch.tensor(remaining, device=logits.device, dtype=torch.int32)
        return logits / (self.t_min + (self.t_max - self.t_min) * (step / self.steps))


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy `(batch, seq)` of the categorical distribution of each position."""
    # torch leaves Categorical.entropy unannotated
    entropy: torch.Tensor = torch.distributions.Categorical(logits=logits).entropy()  # type: ignore[no-untyped-call]
    return entropy


class EntropyBoundAcceptance:
    """Accept the k lowest-entropy positions with sum(entropy) - max(entropy) <= bound."""

    def __init__(self, bound: float):
        self.bound = bound

    def accepted(self, logits: torch.Tensor) -> torch.Tensor:
        ordered, order = torch.sort(token_entropy(logits), dim=-1)
        keep = torch.cumsum(ordered, dim=-1) - ordered <= self.bound  # ascending: the running max is `ordered`
        return torch.scatter(torch.zeros_like(keep), -1, order, keep)  # (B, L) bool, back in canvas order


class BatchDraws:
    """The reference's random draws: one generator (None: torch's global one) over the whole `(batch, ...)` tensor."""

    # A finished row's stopping rule still decides when the batch's canvas ends (and so the next draws): it denoises.
    rows_apart = False

    def __init__(self, generator: torch.Generator | None):
        self.generator = generator

    def tokens(self, shape: tuple[int, int], high: int, device: torch.device, live: torch.Tensor) -> torch.Tensor:
        return torch.randint(0, high, shape, device=device, generator=self.generator)

    def categorical(self, probs: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        """One draw per position of `probs` `(batch, L, vocab)`: ids `(batch, L)`."""
        B, L, V = probs.shape
        return torch.multinomial(probs.view(-1, V), 1, generator=self.generator).view(B, L)


class RowDraws:
    """One generator per row, drawing only for `live` rows: a row draws what it would draw decoded alone.

    A row whose canvas (or whole answer) is finished waits for the batch without drawing, as it would
    have stopped there alone; its slots hold zeros, which the loop never reads.
    """

    rows_apart = True  # a row draws nothing once finished, so nothing it computes then is ever read

    def __init__(self, seeds: list[int], device: torch.device):
        self.generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]

    def tokens(self, shape: tuple[int, int], high: int, device: torch.device, live: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(shape, dtype=torch.long, device=device)
        for row in live.nonzero().flatten().tolist():
            out[row] = torch.randint(0, high, shape[1:], device=device, generator=self.generators[row])
        return out

    def categorical(self, probs: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(probs.shape[:2], dtype=torch.long, device=probs.device)
        for row in live.nonzero().flatten().tolist():
            out[row] = torch.multinomial(probs[row], 1, generator=self.generators[row]).view(-1)
        return out


class UniformNoise:
    """Uniform random tokens: the starting canvas and the re-noising of rejected positions."""

    def __init__(self, vocab_size: int, canvas_length: int):
        self.vocab_size, self.canvas_length = vocab_size, canvas_length

    def sample(self, live: torch.Tensor, draws: BatchDraws | RowDraws) -> torch.Tensor:
        return draws.tokens((live.shape[0], self.canvas_length), self.vocab_size, live.device, live)

    def renoise(
        self, canvas: torch.Tensor, accepted: torch.Tensor, draws: BatchDraws | RowDraws, live: torch.Tensor
    ) -> torch.Tensor:
        return torch.where(accepted, canvas, self.sample(live, draws))


class StableAndConfidentStop:
    """A row's canvas is done when its argmax repeated for `stability` steps and mean entropy < threshold."""

    def __init__(self, stability: int, confidence: float):
        self.stability, self.confidence = stability, confidence
        self.history: torch.Tensor | None = None

    def reset(self) -> None:
        self.history = None

    def done(self, argmax: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if self.stability == 0:
            stable = torch.ones(argmax.shape[0], dtype=torch.bool, device=argmax.device)
        else:
            if self.history is None:
                self.history = torch.full((self.stability, *argmax.shape), -1, dtype=argmax.dtype, device=argmax.device)
            stable = (self.history == argmax[None]).all(dim=-1).all(dim=0)
            self.history = torch.cat([self.history[1:], argmax[None]])  # oldest out, newest in
        return stable & (token_entropy(logits).mean(dim=-1) < self.confidence)


@torch.no_grad()
def generate_block_diffusion(
    model: BlockDenoiser,
    input_ids: torch.Tensor,
    config: BlockDiffusionConfig,
    attention_mask: torch.Tensor | None = None,
    on_step: StepCallback | None = None,
    row_seeds: list[int] | None = None,
) -> GenerateOutput:
    """Append whole canvases after `input_ids` `(batch, prompt_len)`; report tokens per forward.

    Returns sequences `(batch, prompt_len + canvases * canvas_length)`; `nfe` counts decoder calls
    (the batch's), and `block_diffusion.row_tokens_per_forward` per row counts non-pad generated
    tokens over the decoder calls that row needed, as transformers does. `on_step` receives a
    StepInfo per decoder call: a canvas is committed whole, at its last call.

    `row_seeds`: each row draws from its own generator and counts its positions from its first
    prompt token (left padding skipped), so every row decodes exactly as it would alone (what a
    served batch needs); without it, one generator and shared positions, as transformers' generate.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape (batch, prompt_len), got {tuple(input_ids.shape)}")
    device, (B, P), L = input_ids.device, input_ids.shape, model.canvas_length
    if row_seeds is not None and len(row_seeds) != B:
        raise ValueError(f"row_seeds: {len(row_seeds)} seeds for {B} rows")
    draws = BatchDraws(make_generator(config.seed, device)) if row_seeds is None else RowDraws(row_seeds, device)
    if config.canvas in MASKED_LOOPS:
        return MASKED_LOOPS[config.canvas](model, input_ids, config, draws, attention_mask, on_step)
    rules = CanvasRules.of(config, model.vocab_size, L)
    eos = torch.tensor(config.eos_ids, dtype=torch.long, device=device)

    mask = torch.ones(B, P, dtype=torch.bool, device=device) if attention_mask is None else attention_mask.bool()
    sequences, new_tokens = input_ids, input_ids  # new_tokens: what the encoder has not cached yet
    # (1, P) shared positions as the reference; (B, P) counted from each row's first token with row seeds
    pads = (~mask).long().cumprod(dim=1).sum(dim=1, keepdim=True) if row_seeds is not None else 0
    enc_pos = (torch.arange(0, P, device=device)[None] - pads).clamp(min=0).to(torch.int32)
    row_done = torch.zeros(B, dtype=torch.bool, device=device)
    forwards = torch.zeros(B, dtype=torch.int, device=device)
    cache, nfe, canvases = model.new_cache(), 0, 0
    block_nfe: list[int] = []  # decoder calls per canvas, the batch's
    for _ in range(math.ceil(config.max_new_tokens / L)):
        cur = sequences.shape[1]
        cache = model.encode_prefix(new_tokens, mask, enc_pos, cache)
        dec_pos = (torch.arange(cur, cur + L, device=device)[None] - pads).to(torch.int32)
        dec_mask = torch.nn.functional.pad(mask, (0, L), value=True)
        report = None if on_step is None else functools.partial(_report_step, on_step, sequences, canvases)
        argmax, nfe = denoise_canvas(
            model, rules, config, cache, dec_mask, dec_pos, row_done, forwards, nfe, draws, report
        )
        sequences = torch.cat([sequences, argmax], dim=-1)
        canvases += 1
        block_nfe.append(nfe - sum(block_nfe))
        live = ~row_done  # rows finished before this canvas only get padding
        row_done = finish_rows(sequences, row_done, eos, config.pad_id, L)
        if on_step is not None:
            committed = torch.zeros_like(sequences, dtype=torch.bool)
            committed[:, -L:] = live[:, None]
            on_step(
                StepInfo(step=nfe - 1, block=canvases - 1, block_done=True, sequences=sequences, committed=committed)
            )
        if row_done.all():
            break
        mask = torch.nn.functional.pad(mask, (0, L), value=True)
        new_tokens, enc_pos = sequences[:, -L:], dec_pos
    generated = sequences[:, P:]
    valid = (
        (generated != config.pad_id).sum(dim=-1)
        if config.pad_id is not None
        else torch.full((B,), generated.shape[1], device=device)
    )
    return GenerateOutput(
        sequences=sequences,
        prompt_length=P,
        nfe=nfe,
        sequential_calls=nfe,
        block_nfe=block_nfe,
        tokens_per_forward=generated.shape[1] / max(nfe, 1),
        block_diffusion=BlockDiffusionStats(
            row_tokens_per_forward=(valid / forwards).tolist(),
            decoder_forwards=forwards.tolist(),
            canvases=canvases,
            canvas_length=L,
        ),
    )


@dataclass(frozen=True)
class CanvasRules:
    """What decides one canvas's denoising: the temperature schedule, acceptance, noise and the early stop."""

    schedule: LinearTemperatureSchedule
    acceptance: EntropyBoundAcceptance
    noise: UniformNoise
    stop: StableAndConfidentStop | None  # None: every canvas takes max_denoising_steps

    @classmethod
    def of(cls, config: BlockDiffusionConfig, vocab_size: int, L: int) -> CanvasRules:
        stop = (
            None
            if config.confidence_threshold is None
            else StableAndConfidentStop(config.stability_threshold, config.confidence_threshold)
        )
        return cls(
            LinearTemperatureSchedule(config.t_min, config.t_max, config.max_denoising_steps),
            EntropyBoundAcceptance(config.entropy_bound),
            UniformNoise(vocab_size, L),
            stop,
        )


class RowsToDenoise:
    """Denoise only the rows whose result is read; the others get `filler` (their last logits), which nothing reads.

    A row whose canvas stopped early keeps its canvas, argmax and self-conditioning (`denoise_canvas`), so its
    new logits are never read; with row draws the same holds for a row that finished its answer. Its probabilities
    still feed the batch's one multinomial draw with the reference's draws (the draw consumes the same random
    numbers whatever the probabilities), so every other row's tokens are what the whole batch computes. Needs the
    denoiser's optional `cache_rows`; the cache of a subset is made once per change of the subset."""

    def __init__(self, model: BlockDenoiser, cache: Any):
        self.model, self.cache = model, cache
        self.select = getattr(model, "cache_rows", None)
        self.key: tuple[int, ...] | None = None
        self.rows_cache: Any = None

    def logits(
        self,
        canvas: torch.Tensor,
        self_cond: torch.Tensor | None,
        dec_mask: torch.Tensor,
        dec_pos: torch.Tensor,
        rows: torch.Tensor,
    ) -> torch.Tensor:
        """Logits `(batch, L, vocab)`, computed for the rows where `rows` `(batch,)` is True."""
        if self.select is None or self_cond is None or bool(rows.all()):
            return self.model.denoise(canvas, self_cond, self.cache, dec_mask, dec_pos)
        index = rows.nonzero().flatten()
        key = tuple(index.tolist())
        if key != self.key:
            self.key, self.rows_cache = key, self.select(self.cache, index)
        position = dec_pos if dec_pos.shape[0] == 1 else dec_pos[index]
        computed = self.model.denoise(canvas[index], self_cond[index], self.rows_cache, dec_mask[index], position)
        logits = self_cond.to(computed.dtype, copy=True)  # a copy: self_cond stays as it was (`.to` alone may alias it)
        logits[index] = computed
        return logits


def _report_step(on_step: StepCallback, sequences: torch.Tensor, canvas: int, nfe: int) -> None:
    """A decoder call that did not commit its canvas: nothing of `sequences` changed."""
    on_step(
        StepInfo(
            step=nfe - 1,
            block=canvas,
            block_done=False,
            sequences=sequences,
            committed=torch.zeros_like(sequences, dtype=torch.bool),
        )
    )


def denoise_canvas(
    model: BlockDenoiser,
    rules: CanvasRules,
    config: BlockDiffusionConfig,
    cache: Any,
    dec_mask: torch.Tensor,
    dec_pos: torch.Tensor,
    row_done: torch.Tensor,
    forwards: torch.Tensor,
    nfe: int,
    draws: BatchDraws | RowDraws,
    report: Callable[[int], None] | None,
) -> tuple[torch.Tensor, int]:
    """Denoise one fresh canvas `(batch, L)` until every row stops or the steps run out; (its argmax, nfe so far).

    `forwards` `(batch,)` counts, in place, the decoder calls each live row needed; `report(nfe)` hears each
    call but the last (the caller reports that one once the canvas is committed)."""
    schedule, acceptance, noise, stop = rules.schedule, rules.acceptance, rules.noise, rules.stop
    canvas = noise.sample(~row_done, draws)
    argmax, self_cond = canvas, None
    canvas_done = torch.zeros_like(row_done)
    denoiser = RowsToDenoise(model, cache)
    if stop is not None:
        stop.reset()
    for remaining in range(config.max_denoising_steps, 0, -1):
        live = ~(canvas_done | row_done)  # rows still denoising this canvas
        forwards += live
        read = live if draws.rows_apart else ~canvas_done  # the rows whose new logits are read
        logits = schedule.apply(denoiser.logits(canvas, self_cond, dec_mask, dec_pos, read), remaining)
        nfe += 1
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        sampled = draws.categorical(probs, live)
        new_argmax = logits.argmax(dim=-1)
        accepted = acceptance.accepted(logits)
        new_canvas = noise.renoise(torch.where(accepted, sampled, canvas), accepted, draws, live)
        if stop is not None:
            if canvas_done.any():  # finished rows keep their canvas, argmax and self-conditioning
                assert self_cond is not None, "a canvas is done only after a step, which sets self_cond"
                new_argmax = torch.where(canvas_done[:, None], argmax, new_argmax)
                new_canvas = torch.where(canvas_done[:, None], canvas, new_canvas)
                logits = torch.where(canvas_done[:, None, None], self_cond, logits)
            canvas_done |= stop.done(new_argmax, logits)
        canvas, argmax, self_cond = new_canvas, new_argmax, logits.to(model.dtype)
        # with row draws a finished row's canvas is padding whatever it holds: the canvas ends with the live rows'
        settled = canvas_done | row_done if draws.rows_apart else canvas_done
        last = bool(settled.all()) or remaining == 1
        if report is not None and not last:  # the last call is reported once the canvas is committed
            report(nfe)
        if last:
            break
    return argmax, nfe


def finish_rows(
    sequences: torch.Tensor, row_done: torch.Tensor, eos: torch.Tensor, pad_id: int | None, L: int
) -> torch.Tensor:
    """Mark rows whose new canvas holds EOS; pad what follows EOS and whole canvases of earlier-finished rows."""
    canvas = sequences[:, -L:]  # a view: edits land in `sequences`
    just_done = torch.isin(canvas, eos).any(dim=-1) if eos.numel() else torch.zeros_like(row_done)
    done = row_done | just_done
    if pad_id is not None and done.any():
        canvas[row_done] = pad_id
        if just_done.any():
            is_eos = torch.isin(canvas, eos)
            seen = is_eos.cumsum(dim=-1)
            canvas[(seen > 0) & ~((seen == 1) & is_eos)] = pad_id
    return done
