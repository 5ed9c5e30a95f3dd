"""How much of the canvas a forward sees: all of it, or the current block and a window of future masks.

A block-start forward of the reference runs every position of the canvas, though the positions far
beyond the current block are still masks that only tell the model how long the canvas is. With
`future_window=W` a forward for block b sees the canvas up to W positions past the block's end and
nothing after: the rest is never computed (lossy: the model then sees a shorter canvas, measured in
docs/experiments/long-canvas/). The cache policies ask the horizon where a forward's canvas ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the config picks the horizon; the horizon only reads its fields
    from sampler.config import SamplerConfig


class CanvasHorizon(Protocol):
    def end(self, block: int) -> int:
        """Canvas positions `[0, end)` that a forward for `block` runs on."""
        ...


class WholeCanvas:
    """Every forward sees the whole canvas (the reference)."""

    def __init__(self, config: SamplerConfig, prompt_length: int):
        self.T = prompt_length + config.gen_length

    def end(self, block: int) -> int:
        return self.T


class FutureWindow:
    """The prompt, the text decoded so far, the current block and the next `future_window` positions."""

    def __init__(self, config: SamplerConfig, prompt_length: int):
        self.P, self.block_length, self.window = prompt_length, config.block_length, config.future_window
        self.T = prompt_length + config.gen_length

    def end(self, block: int) -> int:
        return min(self.T, self.P + (block + 1) * self.block_length + self.window)


HORIZONS: dict[str, type] = {"whole": WholeCanvas, "window": FutureWindow}


def canvas_horizon(config: SamplerConfig, prompt_length: int) -> CanvasHorizon:
    horizon: CanvasHorizon = HORIZONS["window" if config.future_window else "whole"](config, prompt_length)
    return horizon
