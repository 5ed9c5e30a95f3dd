"""What a decoder gives back: one `StepInfo` per kept step while it runs, a `GenerateOutput` at the end.

Every decoder (the masked-diffusion sampler, the two autoregressive ones, block diffusion) fills
the same typed fields, so evaluation reads them alike. What only one mode measures sits in that
mode's own small record, None when the mode is off.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class StepInfo:
    """One decoding step that the decoder kept; a rejected speculative draft is never reported.

    sequences (`torch.LongTensor` of shape `(batch, seq)`): the sequence after the step: the whole
    canvas `prompt_len + gen_length` for masked diffusion, the tokens so far for the autoregressive
    and block decoders (transformers hands them over on the CPU). Read-only: the decoder goes on from it.
    committed (`torch.BoolTensor` of shape `(batch, seq)`): the positions this step committed.
    logits (`torch.FloatTensor` of shape `(batch, W, vocab)`): what the step read, for sequence positions
    `[logits_lo, logits_lo + W)`, before any sampling noise (None where the decoder does not expose them:
    transformers' generate, block diffusion). Read-only.
    """

    step: int  # kept steps before this one, counted over the whole generation
    block: int  # the block the step worked on (AR decoders: tokens // block_length; block diffusion: the canvas)
    block_done: bool  # the step finished `block` (an early exit, or every AR row ending, finishes all at once)
    sequences: torch.Tensor
    committed: torch.Tensor
    logits: torch.Tensor | None = None
    logits_lo: int = 0


StepCallback = Callable[[StepInfo], None]


class CommitTrace:
    """An `on_step` callback that notes which step committed each position.

    steps (`torch.LongTensor` of shape `(batch, seq)`): the last step that committed each position,
    -1 where none did (the prompt, an early exit's padding).
    """

    def __init__(self) -> None:
        self.steps: torch.Tensor | None = None

    def __call__(self, info: StepInfo) -> None:
        steps = self.steps
        if steps is None:
            steps = torch.full(info.committed.shape, -1, dtype=torch.long, device=info.committed.device)
        elif steps.shape[1] < info.committed.shape[1]:  # AR and block decoders grow the sequence
            steps = F.pad(steps, (0, info.committed.shape[1] - steps.shape[1]), value=-1)
        self.steps = steps.masked_fill(info.committed, info.step)

    def generated(self, prompt_length: int) -> list[list[int]]:
        """Per row, the step that committed each generated position."""
        if self.steps is None:
            raise ValueError("CommitTrace: no step was reported (was it passed as on_step?)")
        return self.steps[:, prompt_length:].tolist()


class FinalPrefix:
    """An `on_step` callback that tells, per row, how many generated tokens no later step can change.

    On a masked-diffusion canvas (`canvas=True`, `sequences` is the whole `prompt_len + gen_length`)
    a position is final once its block is done, short of a position still masked (a later step may
    fill it); with no mask left anywhere, everything is. The growing decoders (autoregressive, block
    diffusion) report only committed tokens, so all of `sequences` after the prompt is final.
    `on_final(info, lengths)` hears each finished block (canvas) or each step (growing decoders), with
    the per-row final lengths (never shrinking); it may raise to stop the decode.
    """

    def __init__(
        self,
        prompt_length: int,
        block_length: int,
        mask_id: int | None,
        canvas: bool,
        on_final: Callable[[StepInfo, list[int]], None],
    ):
        self.P, self.block_length, self.mask_id, self.canvas = prompt_length, block_length, mask_id, canvas
        self.on_final = on_final
        self.lengths: list[int] | None = None

    def __call__(self, info: StepInfo) -> None:
        generated = info.sequences[:, self.P :]  # (B, generated so far)
        if not self.canvas:
            lengths = [generated.shape[1]] * generated.shape[0]
        elif not info.block_done:
            return
        else:
            assert self.mask_id is not None, "a masked-diffusion canvas has a mask id (callers pass config.mask_id)"
            masked = generated == self.mask_id  # (B, gen_length)
            end = (
                generated.shape[1]
                if not bool(masked.any())
                else min((info.block + 1) * self.block_length, generated.shape[1])
            )
            head = masked[:, :end]
            first_mask = torch.where(head.any(dim=1), head.int().argmax(dim=1), end)  # (B,)
            lengths = first_mask.tolist()
        if self.lengths is not None:
            lengths = [max(a, b) for a, b in zip(lengths, self.lengths)]
        self.lengths = lengths
        self.on_final(info, lengths)


@dataclass(frozen=True)
class SpeculativeStats:
    """Steps drafted from a guess of the logits, and how many of them the verifying call confirmed."""

    drafted_steps: int
    accepted_steps: int

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_steps / self.drafted_steps if self.drafted_steps else 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"acceptance_rate": self.acceptance_rate}


@dataclass(frozen=True)
class EarlyExitStats:
    """What stopping at a decided EOS saved."""

    blocks_skipped: int  # blocks never entered: every row's text was decided before them
    nfe_saved: int | None  # scheduled steps not run; None where no fixed budget exists (parallel rules, speculative)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class AutoregressiveStats:
    """The causal decoders: one token per forward, keys/values kept between tokens."""

    stopped_early: bool  # every row ended (EOS/EoT) before gen_length tokens
    kv_cache: bool = True  # both causal decoders reuse keys/values; kept for readers of the old stats

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BlockDiffusionStats:
    """Per-row counts of block diffusion, where rows finish their canvases at different calls."""

    row_tokens_per_forward: list[float]  # per row: non-pad generated tokens / its decoder calls (transformers' count)
    decoder_forwards: list[int]  # per row: decoder calls until its canvases were done
    canvases: int
    canvas_length: int

    def as_dict(self) -> dict[str, Any]:
        stats = asdict(self)
        stats["tokens_per_forward"] = stats.pop("row_tokens_per_forward")  # the old stats key
        return stats


@dataclass
class GenerateOutput:
    """sequences (`torch.LongTensor` of shape `(batch, prompt_len + generated)`): prompt + generation.

    Every decoder fills the counts; `speculative`, `early_exit`, `provider`, `autoregressive` and
    `block_diffusion` are filled by the mode or decoder they describe and are None otherwise.
    """

    sequences: torch.Tensor
    prompt_length: int
    nfe: int  # canvases the model evaluated; a CFG step's batched (cond + uncond) call counts once
    sequential_calls: int  # model calls one after another; a speculative call verifying n states counts once
    block_nfe: list[int]  # sequential calls per block (AR decoders: per block_length tokens)
    tokens_per_forward: float  # generated positions per sequential call (AR decoders: 1, one token per forward)
    speculative: SpeculativeStats | None = None
    early_exit: EarlyExitStats | None = None
    provider: str | None = None  # the ONNX Runtime execution provider that ran (backend='onnxruntime')
    autoregressive: AutoregressiveStats | None = None
    block_diffusion: BlockDiffusionStats | None = None

    @property
    def generated(self) -> torch.Tensor:
        return self.sequences[:, self.prompt_length :]

    @property
    def stats(self) -> dict[str, Any]:
        """The untyped dict of earlier versions, for readers outside unmask; unmask reads the fields."""
        stats: dict[str, Any] = {
            "nfe": self.nfe,
            "sequential_calls": self.sequential_calls,
            "tokens_per_forward": self.tokens_per_forward,
            "block_nfe": list(self.block_nfe),
        }
        for part in (self.early_exit, self.autoregressive, self.block_diffusion, self.speculative):
            if part is not None:
                stats |= part.as_dict()
        if self.provider is not None:
            stats["provider"] = self.provider
        return stats
