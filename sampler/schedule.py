"""Transfer schedules: how many masked positions a step commits."""

from __future__ import annotations

from typing import Protocol

import torch


class TransferSchedule(Protocol):
    def counts(self, block_mask: torch.Tensor, steps: int) -> torch.Tensor:
        """Positions to commit per step, `(batch, steps)` int64, from `block_mask` `(batch, block)`."""
        ...


class UniformTransferSchedule:
    """LLaDA's schedule: n masks over s steps, n // s each, the first n % s steps one more."""

    def counts(self, block_mask: torch.Tensor, steps: int) -> torch.Tensor:
        n = block_mask.sum(dim=1, keepdim=True)  # (B, 1)
        base, remainder = n // steps, n % steps
        step = torch.arange(steps, device=block_mask.device)[None]  # (1, s)
        return (base + (step < remainder).long()).to(torch.int64)  # (B, s)
