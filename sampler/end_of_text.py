"""End-of-text prediction: decide the EOS padding from the model's confidence instead of decoding it.

A model trained on EOS-padded canvases (LLaDA's SFT) predicts the padding long before it commits
it: with one token per step the reference spends a step on every padding position, creeping from
the canvas's end towards the text (docs/experiments/sort-diffusion). `eos_run` reads each step's
logits: where, from some position j of the current block to the block's end, every position is
either a committed EOS or a mask whose EOS probability is at least `eot_confidence`, and nothing
after the block is text yet, it fills every mask from j to the end of the canvas with EOS at once.
The padding is then never decoded, and with `future_window` never computed. Lossy (a run of
confident EOS predictions may be wrong): measured in docs/experiments/long-canvas/. The idea is
Learn2PD's end-of-text prediction; this rule needs no training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:  # the config names these rules; the rules only read its fields
    from sampler.cache import Window
    from sampler.config import SamplerConfig


class EndOfText(Protocol):
    def observe(self, window: Window) -> torch.Tensor | None:
        """What the rule needs of a step's logits, read before proposing may edit them in place."""
        ...

    def apply(
        self, x: torch.Tensor, seen: torch.Tensor | None, lo: int, block: tuple[int, int], prompt_length: int
    ) -> torch.Tensor:
        """`x` `(batch, seq)` after a step's commits, with the predicted padding filled with EOS.

        seen: `observe`'s result for the window starting at canvas position `lo`; block: its `(start, end)`.
        """
        ...


class NoEndPrediction:
    """Decode the padding like any other position (the reference)."""

    def __init__(self, config: SamplerConfig):
        pass

    def observe(self, window: Window) -> torch.Tensor | None:
        return None

    def apply(
        self, x: torch.Tensor, seen: torch.Tensor | None, lo: int, block: tuple[int, int], prompt_length: int
    ) -> torch.Tensor:
        return x


class EosRunPrediction:
    """Fill from the start of a run of confident-or-committed EOS that reaches the block's end."""

    def __init__(self, config: SamplerConfig):
        self.mask_id, self.eos_id, self.bound = config.mask_id, config.eos_id, config.eot_confidence

    def observe(self, window: Window) -> torch.Tensor | None:
        return torch.softmax(window.logits.float(), dim=-1)[..., self.eos_id]  # (B, W) EOS probability

    def apply(
        self, x: torch.Tensor, seen: torch.Tensor | None, lo: int, block: tuple[int, int], prompt_length: int
    ) -> torch.Tensor:
        start, end = block
        lo_b = max(start, lo, prompt_length)
        if seen is None or lo_b >= end:
            return x
        part = x[:, lo_b:end]  # (B, L) the block's positions the window covers
        p_eos = seen[:, lo_b - lo : end - lo]
        padding = ((part == self.mask_id) & (p_eos >= self.bound)) | (part == self.eos_id)  # (B, L)
        run = padding.flip(-1).long().cumprod(-1).flip(-1).bool()  # run[:, i]: padding all the way from i to `end`
        after = x[:, end:]
        run &= ((after == self.mask_id) | (after == self.eos_id)).all(dim=-1, keepdim=True)  # no text after the block
        fill = torch.zeros_like(x, dtype=torch.bool)
        fill[:, lo_b:end] = run
        fill[:, end:] = run[:, -1:]
        return x.masked_fill(fill & (x == self.mask_id), self.eos_id)


END_OF_TEXT_RULES: dict[str, type] = {"none": NoEndPrediction, "eos_run": EosRunPrediction}


def end_of_text_rule(config: SamplerConfig) -> EndOfText:
    rule: EndOfText = END_OF_TEXT_RULES[config.eot_predict](config)
    return rule
