"""Commit rules: which masked positions of the current block a step fills.

`top_k` is LLaDA's: a fixed number per step from the transfer schedule, so a block takes exactly
`steps_per_block` model calls; `timesteps` is Dream's, a share of the masks left that grows step by
step; `ancestral` is the reverse process itself (Dream's `origin`): on the same time grid each mask is
revealed at random, with that step's probability. The parallel rules commit as many positions as the
model is sure of (always at least the most confident one) and a block ends when it holds no mask. A new
rule is one class and one line in COMMIT_RULES.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F

from sampler.rng import Draws, uniform_at
from sampler.schedule import UniformTransferSchedule

if TYPE_CHECKING:  # the config names these rules; the rules only read its fields
    from sampler.config import SamplerConfig


class CommitRule(Protocol):
    def plan(self, block_mask: torch.Tensor, steps: int) -> torch.Tensor | None:
        """Per-block plan from `block_mask` `(batch, block)` at the block's start (top_k: counts per step)."""
        ...

    def select(
        self,
        confidence: torch.Tensor,
        entropy: Callable[[], torch.Tensor],
        step: int,
        plan: torch.Tensor | None,
        generator: Draws = None,
    ) -> torch.Tensor:
        """Boolean `(batch, seq)` of positions to commit; `confidence` is -inf where nothing may be committed.

        entropy: a callable giving the `(batch, seq)` predictive entropy, for rules that need it.
        generator: the step's random stream, for rules that draw (`ancestral`).
        """
        ...

    def block_done(self, step: int, steps: int, block_mask: torch.Tensor) -> bool:
        """Whether the block is finished after `step` steps, given its remaining `block_mask`."""
        ...


def commit_top_k(confidence: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Boolean `(batch, seq)`: per row, the `k[row]` most confident positions.

    One `topk` per distinct count (the schedule gives at most two per step), over all the rows that
    share it: a row's top k, ties included, is the one `topk` picks for that row alone.
    """
    commit = torch.zeros_like(confidence, dtype=torch.bool)
    counts = k.tolist()  # one host read per step
    for count in sorted(set(counts)):
        if count == 0:
            continue
        if len(counts) == 1 or all(c == count for c in counts):
            _, index = torch.topk(confidence, k=count, dim=-1)  # (B, count)
            commit.scatter_(1, index, True)
            continue
        rows = torch.tensor([j for j, c in enumerate(counts) if c == count], device=confidence.device)
        _, index = torch.topk(confidence[rows], k=count, dim=-1)  # (rows, count)
        commit[rows[:, None], index] = True
    return commit


def commit_sorted_prefix(confidence: torch.Tensor, keep: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Commit, per row, the leading run of `order` (a sort of positions) where `keep` holds; at least one.

    keep (`(batch, seq)` bool) is indexed in sorted order; positions with -inf confidence never commit.
    """
    count = keep.long().cumprod(dim=-1).sum(dim=-1).clamp(min=1)  # (B,)
    rank = torch.arange(confidence.shape[1], device=confidence.device)[None]  # (1, T)
    chosen = torch.zeros_like(keep)
    chosen.scatter_(1, order, rank < count[:, None])
    return chosen & torch.isfinite(confidence)


class TopKCommit:
    """LLaDA's rule: the schedule's count of most confident positions per step."""

    def __init__(self, config: SamplerConfig):
        self.schedule = UniformTransferSchedule()

    def plan(self, block_mask: torch.Tensor, steps: int) -> torch.Tensor | None:
        return self.schedule.counts(block_mask, steps)  # (B, steps)

    def select(
        self,
        confidence: torch.Tensor,
        entropy: Callable[[], torch.Tensor],
        step: int,
        plan: torch.Tensor | None,
        generator: Draws = None,
    ) -> torch.Tensor:
        assert plan is not None, "top_k's plan() always gives the per-step counts"
        return commit_top_k(confidence, plan[:, step])

    def block_done(self, step: int, steps: int, block_mask: torch.Tensor) -> bool:
        return step >= steps


class TimestepCommit:
    """Dream's rule: the block's steps walk a time grid from 1 down to `eps`; step i commits
    int(n * (1 - t_{i+1} / t_i)) of the n masks the row still holds (the most confident), the last step all.

    The count follows the masks each row really holds at that step, so a row decodes as it would alone.
    """

    eps = 1e-3  # Dream's published generation default: the grid ends at t = eps, not 0
    # Early steps of a long schedule round down to nothing (16 masks, 16 steps: step 0 commits int(0.999) = 0);
    # Dream's generate spends those calls too, so the exact decode does.
    commits_every_step = False

    def __init__(self, config: SamplerConfig):
        pass

    def plan(self, block_mask: torch.Tensor, steps: int) -> torch.Tensor | None:
        """`(batch, steps)` float32: the share of the remaining masks each step commits."""
        t = torch.linspace(1, self.eps, steps + 1, device=block_mask.device)  # float32, as Dream's own grid
        share = 1 - t[1:] / t[:-1]
        share[-1] = 1.0
        return share[None].expand(block_mask.shape[0], steps)

    def select(
        self,
        confidence: torch.Tensor,
        entropy: Callable[[], torch.Tensor],
        step: int,
        plan: torch.Tensor | None,
        generator: Draws = None,
    ) -> torch.Tensor:
        assert plan is not None, "timesteps' plan() always gives the per-step shares"
        left = torch.isfinite(confidence).sum(dim=-1)  # (B,) masks each row still holds
        return commit_top_k(confidence, (left.float() * plan[:, step]).long())  # int() of the float32 product

    def block_done(self, step: int, steps: int, block_mask: torch.Tensor) -> bool:
        return step >= steps


class AncestralCommit(TimestepCommit):
    """The reverse process itself (Dream's `origin`, MDLM's ancestral sampler): on Dream's time grid, step i reveals
    each mask still open with probability 1 - t_{i+1} / t_i, drawn independently, and the last step every one.

    Which masks, and so how many, are drawn: one U[0, 1) per open position in row-major order, before any token
    (the sampler then draws tokens only where a mask was revealed: `sample_revealed`). The remasking policy is
    not read. With one generator the draws run over the whole batch as Dream's do, so a row depends on its
    neighbours; `row_seeds` gives each row its own stream.
    """

    reveals_first = True  # positions are drawn before tokens (sampler/generate.py)
    draws = True  # the seed decides the output even at temperature 0
    batch_invariant = False
    counts_scheduled = False  # how many a step commits is drawn too, not the row's schedule
    requires = {"speculative_draft": (0,)}  # a drafted step would spend draws that only the kept step may make

    def select(
        self,
        confidence: torch.Tensor,
        entropy: Callable[[], torch.Tensor],
        step: int,
        plan: torch.Tensor | None,
        generator: Draws = None,
    ) -> torch.Tensor:
        assert plan is not None, "ancestral's plan() always gives the per-step reveal probabilities"
        open_ = torch.isfinite(confidence)
        return open_ & (uniform_at(open_, generator) < plan[:, step, None])  # float32 < float32, as Dream compares


class ParallelCommit:
    """Shared by the parallel rules: no plan, the block ends when no row has a mask left in it.

    Every step commits at least one position, so a block needs at most `block` steps; the cap
    matters when the model proposes the mask token itself, which leaves a committed position masked.
    """

    def plan(self, block_mask: torch.Tensor, steps: int) -> torch.Tensor | None:
        return None

    def block_done(self, step: int, steps: int, block_mask: torch.Tensor) -> bool:
        return step >= block_mask.shape[1] or not bool(block_mask.any())


class ThresholdCommit(ParallelCommit):
    """Commit every position with confidence >= tau, and always the most confident one."""

    def __init__(self, config: SamplerConfig):
        self.tau = config.parallel_threshold

    def select(
        self,
        confidence: torch.Tensor,
        entropy: Callable[[], torch.Tensor],
        step: int,
        plan: torch.Tensor | None,
        generator: Draws = None,
    ) -> torch.Tensor:
        order = confidence.argsort(dim=-1, descending=True, stable=True)
        keep = torch.gather(confidence, 1, order) >= self.tau
        return commit_sorted_prefix(confidence, keep, order)


class FactorCommit(ParallelCommit):
    """Sorted confidences c_1 >= c_2 >= ...: commit the n-th while (n + 1) * (1 - c_n) < f."""

    def __init__(self, config: SamplerConfig):
        self.factor = config.parallel_factor

    def select(
        self,
        confidence: torch.Tensor,
        entropy: Callable[[], torch.Tensor],
        step: int,
        plan: torch.Tensor | None,
        generator: Draws = None,
    ) -> torch.Tensor:
        order = confidence.argsort(dim=-1, descending=True, stable=True)
        c = torch.gather(confidence, 1, order).double()
        n = torch.arange(1, c.shape[1] + 1, device=c.device, dtype=c.dtype)[None]
        return commit_sorted_prefix(confidence, (n + 1) * (1 - c) < self.factor, order)


class EntropyBoundedCommit(ParallelCommit):
    """Commit the lowest-entropy positions while their summed entropy stays at most the bound."""

    def __init__(self, config: SamplerConfig):
        self.bound = config.entropy_bound

    def select(
        self,
        confidence: torch.Tensor,
        entropy: Callable[[], torch.Tensor],
        step: int,
        plan: torch.Tensor | None,
        generator: Draws = None,
    ) -> torch.Tensor:
        h = torch.where(torch.isfinite(confidence), entropy(), torch.inf)  # (B, T)
        order = h.argsort(dim=-1, stable=True)
        keep = torch.gather(h, 1, order).cumsum(dim=-1) <= self.bound
        return commit_sorted_prefix(confidence, keep, order)


def entropy_of(logits: torch.Tensor) -> torch.Tensor:
    """Predictive entropy in nats, `(batch, seq)` from `(batch, seq, vocab)` logits."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


COMMIT_RULES: dict[str, type] = {
    "top_k": TopKCommit,
    "threshold": ThresholdCommit,
    "factor": FactorCommit,
    "entropy": EntropyBoundedCommit,
    "timesteps": TimestepCommit,
    "ancestral": AncestralCommit,
}


def commit_rule(config: SamplerConfig) -> CommitRule:
    rule: CommitRule = COMMIT_RULES[config.parallel](config)
    return rule
