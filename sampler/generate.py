"""The diffusion sampler: LLaDA's semi-autoregressive masked decoding, token-exact by default.

The loop owns the canvas, the blocks and the model calls; what varies lives in small objects
chosen by the SamplerConfig: which tokens a step commits (`commit.py`), which keys/values are
reused between calls (`cache.py`), whether several steps are verified per call
(`speculative.py`), when the rest is decided as padding (`early_exit.py`, `end_of_text.py`), how
much of the canvas a forward sees (`horizon.py`) and what runs the
network (`backends.py`). One step is a pure function of (state, logits), so speculative
decoding can replay it on drafted states and accept exactly what the plain loop would do.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from sampler.backends import denoiser_for
from sampler.cache import LogitsSource, ModelCall, Window, logits_source
from sampler.commit import CommitRule, commit_rule, entropy_of
from sampler.config import SamplerConfig
from sampler.early_exit import EarlyExit, early_exit_rule
from sampler.end_of_text import end_of_text_rule
from sampler.output import GenerateOutput, StepCallback, StepInfo
from sampler.proposal import check_logits, propose, sample_revealed
from sampler.remasking import remasking_policy
from sampler.rng import Draws, RowGenerators, left_pads
from sampler.speculative import decode_speculative


class Denoiser(Protocol):
    """Hugging Face convention: `model(input_ids, attention_mask=None).logits` `(batch, seq, vocab)`."""

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Any: ...


def make_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    """A private generator for a seed (same stream as `torch.manual_seed(seed)` on CPU), else the global one."""
    if seed is None:
        return None
    return torch.Generator(device=device).manual_seed(seed)


def check_inputs(input_ids: torch.Tensor, config: SamplerConfig, attention_mask: torch.Tensor | None) -> None:
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape (batch, prompt_len), got {tuple(input_ids.shape)}")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} must equal input_ids shape {tuple(input_ids.shape)}"
        )


@dataclass(frozen=True)
class DecodeState:
    """Where decoding stands: the canvas `x` `(batch, prompt_len + gen_length)`, the block and the step in it."""

    x: torch.Tensor
    block: int
    step: int
    plan: torch.Tensor | None  # the commit rule's per-block plan (top_k: counts per step)
    committed: torch.Tensor | None = None  # `(batch, seq)` bool: what the step that led here committed
    steps_done: int = 0  # decoding steps since the first block began
    # `(batch,)` steps each row has taken in the block when rows advance on their own (per-row
    # speculative rounds); None: every row has taken `step`.
    row_steps: torch.Tensor | None = None
    window: Window | None = None  # the logits the step that led here read (what `on_step` reports)

    def same_as(self, other: DecodeState) -> bool:
        return self.block == other.block and self.step == other.step and torch.equal(self.x, other.x)

    def rows_same_as(self, other: DecodeState) -> torch.Tensor:
        """`(batch,)` bool: rows that stand where they stand in `other` (same block, row steps and canvas row)."""
        if self.block != other.block:
            return torch.zeros(self.x.shape[0], dtype=torch.bool, device=self.x.device)
        return (self.x == other.x).all(dim=-1) & (self.row_steps == other.row_steps)


class BlockDecoder:
    """One decoding step as a function of (state, logits); the drivers below decide when to call the model.

    `advance` is pure, so speculative decoding may run it on drafts; `step` is a step decoding keeps,
    and only those reach `on_step`.
    """

    def __init__(
        self,
        config: SamplerConfig,
        prompt_length: int,
        generator: torch.Generator | RowGenerators | None,
        exit_rule: EarlyExit,
        on_step: StepCallback | None = None,
        text_start: torch.Tensor | None = None,
    ):
        self.config, self.P, self.generator = config, prompt_length, generator
        # where each row's generation starts, for the early-exit rule: `(batch,)` when rows began at
        # different blocks (sampler/continuous.py), else the prompt length
        self.text_start = prompt_length if text_start is None else text_start
        self.policy = remasking_policy(config.remasking)
        self.rule: CommitRule = commit_rule(config)
        self.reveals_first = getattr(self.rule, "reveals_first", False)  # positions drawn before tokens (ancestral)
        self.exit_rule = exit_rule
        self.end_rule = end_of_text_rule(config)
        self.per_row = config.speculative_rows  # rows advance on their own (sampler/speculative.py)
        self.on_step = on_step

    def bounds(self, block: int) -> tuple[int, int]:
        start = self.P + block * self.config.block_length
        return start, start + self.config.block_length

    def enter_block(self, x: torch.Tensor, block: int, steps_done: int = 0) -> DecodeState:
        start, end = self.bounds(block)
        plan = self.rule.plan(x[:, start:end] == self.config.mask_id, self.config.steps_per_block)
        row_steps = torch.zeros(x.shape[0], dtype=torch.long, device=x.device) if self.per_row else None
        return DecodeState(x=x, block=block, step=0, plan=plan, steps_done=steps_done, row_steps=row_steps)

    def rows_done(self, row_steps: torch.Tensor, block_mask: torch.Tensor) -> torch.Tensor:
        """`(batch,)` bool: rows whose block is finished after their own `row_steps`, by the commit rule."""
        steps = self.config.steps_per_block
        return torch.tensor(
            [self.rule.block_done(n, steps, block_mask[r : r + 1]) for r, n in enumerate(row_steps.tolist())],
            dtype=torch.bool,
            device=block_mask.device,
        )

    def finished(self, state: DecodeState) -> bool:
        return state.block >= self.config.num_blocks

    def advance(self, state: DecodeState, window: Window) -> DecodeState:
        """Commit one step from `window` (logits of positions `[lo, lo + W)` of `state.x`)."""
        edits = self.config.logits_eos_inf or self.config.confidence_eos_eot_inf  # `propose` writes into the logits
        read = Window(window.logits.clone(), window.lo) if edits and self.on_step is not None else window
        return replace(self._advance(state, window), window=read)

    def _advance(self, state: DecodeState, window: Window) -> DecodeState:
        cfg, x = self.config, state.x
        start, end = self.bounds(state.block)
        check_logits(window.logits, f"block {state.block} step {state.step}")
        mask_index = x == cfg.mask_id
        seen = self.end_rule.observe(window)  # before `propose` may edit the logits in place
        generator = self.generator
        if isinstance(generator, RowGenerators):  # rows whose block has no mask left wait without drawing
            generator = generator.at(window.lo, mask_index[:, start:end].any(dim=1).tolist())
        choose = self._reveal if self.reveals_first else self._propose_and_select
        x0, commit, frozen = choose(state, window, mask_index, generator)
        commit &= mask_index  # top_k picks k positions even in a row an early exit filled: decided, not committed now
        x = x.clone()
        x[commit] = x0[commit]
        x = self.end_rule.apply(x, seen, window.lo, (start, end), self.P)
        x = self.exit_rule.apply(x, self.text_start)
        step, done = state.step + 1, state.steps_done + 1
        if self.exit_rule.all_decided(x):
            return DecodeState(x=x, block=cfg.num_blocks, step=0, plan=None, committed=commit, steps_done=done)
        if frozen is not None and state.row_steps is not None:  # set together above
            row_steps = state.row_steps + (~frozen).long()
            block_done = bool(self.rows_done(row_steps, x[:, start:end] == cfg.mask_id).all())
        else:
            row_steps, block_done = (
                None,
                self.rule.block_done(step, cfg.steps_per_block, x[:, start:end] == cfg.mask_id),
            )
        if block_done:
            if state.block + 1 < cfg.num_blocks:
                return replace(self.enter_block(x, state.block + 1, done), committed=commit)
            return replace(
                state, x=x, block=cfg.num_blocks, step=0, plan=None, committed=commit, steps_done=done, row_steps=None
            )
        return replace(state, x=x, step=step, committed=commit, steps_done=done, row_steps=row_steps)

    def _propose_and_select(
        self, state: DecodeState, window: Window, mask_index: torch.Tensor, generator: Draws
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Tokens for every position first, then the rule's commits by their confidence: `(x0, commit, frozen)`, each
        `(batch, seq)` but `frozen` (`(batch,)`: rows at their own step whose block is done; None when rows step
        together)."""
        x = state.x
        start, end = self.bounds(state.block)
        x0_w, conf_w = propose(window.logits, self.config, self.policy, generator)
        lo, hi = window.lo, window.lo + window.logits.shape[1]
        x0, confidence = x.clone(), torch.full(x.shape, -torch.inf, dtype=conf_w.dtype, device=x.device)
        x0[:, lo:hi], confidence[:, lo:hi] = x0_w, conf_w
        confidence[:, end:] = -torch.inf  # nothing beyond the current block
        x0 = torch.where(mask_index, x0, x)
        confidence = torch.where(mask_index, confidence, -torch.inf)
        step, plan, frozen = state.step, state.plan, None
        if state.row_steps is not None:  # each row at its own step; a row whose block is done waits
            frozen = self.rows_done(state.row_steps, mask_index[:, start:end])
            confidence = confidence.masked_fill(frozen[:, None], -torch.inf)
            if plan is not None:  # the plan's column for each row's own step, as a one-step plan
                plan = plan.gather(1, state.row_steps.clamp(max=plan.shape[1] - 1)[:, None]).masked_fill(
                    frozen[:, None], 0
                )
                step = 0
        commit = self.rule.select(confidence, lambda: self._entropy(window, x.shape), step, plan, generator)
        return x0, commit, frozen

    def _reveal(
        self, state: DecodeState, window: Window, mask_index: torch.Tensor, generator: Draws
    ) -> tuple[torch.Tensor, torch.Tensor, None]:
        """The reverse process's order (Dream's `origin`): the rule draws which open masks to reveal, then only
        those draw their tokens. Open: masked, inside the window and before the block's end."""
        x = state.x
        _, end = self.bounds(state.block)
        lo, hi = window.lo, window.lo + window.logits.shape[1]
        confidence = torch.full(x.shape, -torch.inf, device=x.device)  # the rule reads only where it is finite
        confidence[:, lo : min(hi, end)] = 0.0
        confidence = confidence.masked_fill(~mask_index, -torch.inf)
        commit = self.rule.select(confidence, lambda: self._entropy(window, x.shape), state.step, state.plan, generator)
        x0 = x.clone()
        x0[:, lo:hi] = sample_revealed(window.logits, commit[:, lo:hi], self.config, generator)
        return x0, commit, None

    def step(self, state: DecodeState, window: Window) -> DecodeState:
        """`advance` for a step that decoding keeps: the step is reported to `on_step`."""
        after = self.advance(state, window)
        self.report(state, after)
        return after

    def report(self, state: DecodeState, after: DecodeState) -> DecodeState:
        """Tell `on_step` of a kept transition from `state` to `after`; gives back `after`."""
        if self.on_step is not None:
            assert after.committed is not None, "every state `advance` gives carries its step's commits"
            window = after.window
            self.on_step(
                StepInfo(
                    step=state.steps_done,
                    block=state.block,
                    block_done=after.block != state.block,
                    sequences=after.x,
                    committed=after.committed,
                    logits=None if window is None else window.logits,
                    logits_lo=0 if window is None else window.lo,
                )
            )
        return after

    @staticmethod
    def _entropy(window: Window, shape: torch.Size) -> torch.Tensor:
        h = torch.full(shape, torch.inf, device=window.logits.device)
        h[:, window.lo : window.lo + window.logits.shape[1]] = entropy_of(window.logits)
        return h


@dataclass
class CallCounter:
    """Model calls, the canvases they evaluated, and how many went to each block."""

    sequential_calls: int = 0
    nfe: int = 0
    block_nfe: list[int] = field(default_factory=list)

    def add(self, block: int, states: int) -> None:
        self.sequential_calls += 1
        self.nfe += states
        while len(self.block_nfe) <= block:
            self.block_nfe.append(0)
        self.block_nfe[block] += 1


def decode_plain(
    decoder: BlockDecoder, source: LogitsSource, state: DecodeState, calls: CallCounter
) -> tuple[DecodeState, None]:
    """One model call per step; no mode statistics of its own."""
    while not decoder.finished(state):
        calls.add(state.block, 1)
        (window,) = source.logits([state])
        state = decoder.step(state, window)
    return state, None


@torch.no_grad()
def generate(
    model: Denoiser,
    input_ids: torch.Tensor,
    config: SamplerConfig,
    attention_mask: torch.Tensor | None = None,
    on_step: StepCallback | None = None,
    row_seeds: list[int] | None = None,
) -> GenerateOutput:
    """Fill `config.gen_length` masked positions after `input_ids` `(batch, prompt_len)`, block by block.

    Masks inside the prompt (infilling) are decoded too, as in the reference: they compete with
    the current block's masks for each step's commits. `on_step` receives a `StepInfo` after every
    step decoding keeps (never a rejected speculative draft); it does not change the output.
    `row_seeds` (one per row) gives each row its own generator in place of `config.seed`'s one for
    the batch, so a sampled row decodes as it would alone with `seed=row_seeds[row]`.
    """
    check_inputs(input_ids, config, attention_mask)
    device = input_ids.device
    B, P = input_ids.shape
    x = torch.full((B, P + config.gen_length), config.mask_id, dtype=torch.long, device=device)
    x[:, :P] = input_ids
    if attention_mask is not None:
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(B, config.gen_length)], dim=-1)
    prompt_index = x != config.mask_id
    denoiser, provider = denoiser_for(model, config)
    call = ModelCall(denoiser, attention_mask, prompt_index, config)
    source = logits_source(config, call, P)
    exit_rule = early_exit_rule(config)
    generator: torch.Generator | RowGenerators | None
    if row_seeds is None:
        generator = make_generator(config.seed, device)
    else:
        generator = RowGenerators(
            row_seeds, left_pads(None if attention_mask is None else attention_mask[:, :P], B), device
        )
    decoder = BlockDecoder(config, P, generator, exit_rule, on_step)
    calls = CallCounter()
    drive = decode_speculative if config.speculative_draft else decode_plain
    state, speculative = drive(decoder, source, decoder.enter_block(x, 0), calls)
    return GenerateOutput(
        sequences=state.x,
        prompt_length=P,
        nfe=calls.nfe,
        sequential_calls=calls.sequential_calls,
        block_nfe=calls.block_nfe,
        tokens_per_forward=config.gen_length / max(calls.sequential_calls, 1),
        speculative=speculative,
        early_exit=exit_rule.stats(config, calls.nfe, len(calls.block_nfe)),
        provider=provider,
    )
