"""Early exit: stop spending model calls once the text before the first EOS is final.

LLaDA never re-masks a committed token, so once a committed EOS has only committed tokens before
it, the text up to it cannot change whatever later steps do. `eos_decided` then fills that row's
remaining masks with EOS and stops calling the model for it; the text before the first EOS is
exactly the text the full run would give, under any commit rule, cache or temperature.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from sampler.output import EarlyExitStats

if TYPE_CHECKING:  # the config names these rules; the rules only read its fields
    from sampler.config import SamplerConfig


class EarlyExit(Protocol):
    def apply(self, x: torch.Tensor, prompt_length: int | torch.Tensor) -> torch.Tensor:
        """`x` `(batch, seq)` with the rows whose text is decided padded with EOS; the generation starts at
        `prompt_length` (one per row `(batch,)` where rows started at different positions)."""
        ...

    def all_decided(self, x: torch.Tensor) -> bool:
        """Whether no row needs another model call."""
        ...

    def stats(self, config: SamplerConfig, nfe: int, blocks_run: int) -> EarlyExitStats | None:
        """What exiting saved, after a run of `nfe` evaluations that entered `blocks_run` blocks."""
        ...


class NoEarlyExit:
    """Run every scheduled step (the reference's behaviour)."""

    def __init__(self, config: SamplerConfig):
        pass

    def apply(self, x: torch.Tensor, prompt_length: int | torch.Tensor) -> torch.Tensor:
        return x

    def all_decided(self, x: torch.Tensor) -> bool:
        return False

    def stats(self, config: SamplerConfig, nfe: int, blocks_run: int) -> EarlyExitStats | None:
        return None


class EosDecidedExit:
    """A row is decided when a committed EOS in its generation has no mask anywhere before it."""

    def __init__(self, config: SamplerConfig):
        self.mask_id, self.eos_id = config.mask_id, config.eos_id

    def decided(self, x: torch.Tensor, prompt_length: int | torch.Tensor) -> torch.Tensor:
        """Boolean `(batch,)`: rows whose text before the first EOS is final."""
        no_mask_so_far = (x == self.mask_id).long().cumsum(dim=-1) == 0  # (B, T)
        eos = x == self.eos_id
        if isinstance(prompt_length, int):
            eos[:, :prompt_length] = False
        else:  # each row's own generation start
            eos &= torch.arange(x.shape[1], device=x.device)[None, :] >= prompt_length[:, None]
        return (eos & no_mask_so_far).any(dim=-1)

    def apply(self, x: torch.Tensor, prompt_length: int | torch.Tensor) -> torch.Tensor:
        pad = self.decided(x, prompt_length)[:, None] & (x == self.mask_id)
        return x.masked_fill(pad, self.eos_id)  # no `pad.any()`: a host sync per step for nothing

    def all_decided(self, x: torch.Tensor) -> bool:
        return not bool((x == self.mask_id).any())

    def stats(self, config: SamplerConfig, nfe: int, blocks_run: int) -> EarlyExitStats | None:
        scheduled = config.parallel == "top_k" and not config.speculative_draft  # a fixed budget, one evaluation a step
        return EarlyExitStats(
            blocks_skipped=config.num_blocks - blocks_run, nfe_saved=config.steps - nfe if scheduled else None
        )


EARLY_EXIT_RULES: dict[str, type] = {"none": NoEarlyExit, "eos_decided": EosDecidedExit}


def early_exit_rule(config: SamplerConfig) -> EarlyExit:
    rule: EarlyExit = EARLY_EXIT_RULES[config.early_exit](config)
    return rule
