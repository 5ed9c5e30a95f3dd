"""Remasking policies: how confident the sampler is in each proposed token.

A policy maps (logits, proposed tokens) to a confidence per position; the commit rule then keeps
the most confident masked positions. A new policy is one class and one line in the registry.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from sampler.rng import RowGenerators, uniform


class RemaskingPolicy(Protocol):
    def confidence(
        self, logits: torch.Tensor, x0: torch.Tensor, generator: torch.Generator | RowGenerators | None
    ) -> torch.Tensor:
        """Confidence of shape `(batch, seq)` for proposed tokens `x0` given `logits` `(batch, seq, vocab)`."""
        ...


class LowConfidenceRemasking:
    """Softmax probability of the proposed token: commit what the model is surest of."""

    def confidence(
        self, logits: torch.Tensor, x0: torch.Tensor, generator: torch.Generator | RowGenerators | None
    ) -> torch.Tensor:
        p = F.softmax(logits, dim=-1)
        return torch.gather(p, dim=-1, index=x0.unsqueeze(-1)).squeeze(-1)


class RandomRemasking:
    """Uniform float32 noise, drawn after the Gumbel noise (the reference's order)."""

    # One stream of draws over the whole `(batch, seq)` canvas, as the reference draws it: a row's
    # order depends on what it is batched with (unless each row has its own: sampler/rng.py).
    # Policies without this attribute are batch-invariant.
    batch_invariant = False
    draws = True  # the seed decides the output even at temperature 0

    def confidence(
        self, logits: torch.Tensor, x0: torch.Tensor, generator: torch.Generator | RowGenerators | None
    ) -> torch.Tensor:
        return uniform(x0.shape, None, x0.device, generator)


class MarginRemasking:
    """Top-2 probability margin, p(first) - p(second): commit where the model is least torn between
    two tokens (the adaptive order of Kim et al. 2025, "Train for the Worst, Plan for the Best")."""

    def confidence(
        self, logits: torch.Tensor, x0: torch.Tensor, generator: torch.Generator | RowGenerators | None
    ) -> torch.Tensor:
        top = torch.topk(F.softmax(logits.float(), dim=-1), k=2, dim=-1).values
        return top[..., 0] - top[..., 1]


class EntropyRemasking:
    """exp(-entropy) of the position's distribution, in (0, 1]: commit where the whole distribution
    is sharpest, not only its top token."""

    def confidence(
        self, logits: torch.Tensor, x0: torch.Tensor, generator: torch.Generator | RowGenerators | None
    ) -> torch.Tensor:
        logp = F.log_softmax(logits.float(), dim=-1)
        return torch.exp((logp.exp() * logp).sum(-1))


class NegEntropyRemasking:
    """Dream's `entropy` order: sum p log(p + 1e-10), the negative entropy, computed as Dream computes it so
    near-ties break the same way (`entropy` above orders alike in exact arithmetic)."""

    def confidence(
        self, logits: torch.Tensor, x0: torch.Tensor, generator: torch.Generator | RowGenerators | None
    ) -> torch.Tensor:
        p = torch.softmax(logits, dim=-1)
        return (p * torch.log(p + 1e-10)).sum(dim=-1)


REMASKING_POLICIES: dict[str, type] = {
    "low_confidence": LowConfidenceRemasking,
    "random": RandomRemasking,
    "margin": MarginRemasking,
    "entropy": EntropyRemasking,
    "neg_entropy": NegEntropyRemasking,
}


def remasking_policy(name: str) -> RemaskingPolicy:
    try:
        policy: RemaskingPolicy = REMASKING_POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown remasking policy {name!r}; known: {', '.join(sorted(REMASKING_POLICIES))}") from None
    return policy
