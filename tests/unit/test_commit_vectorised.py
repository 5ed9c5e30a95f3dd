"""The vectorised top-k commit picks, row for row, what a per-row `torch.topk` picks: ties included,
with the schedule's mixed counts in one batch."""

from __future__ import annotations

import pytest
import torch

from sampler.commit import commit_top_k


def per_row_top_k(confidence: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    commit = torch.zeros_like(confidence, dtype=torch.bool)
    for j in range(confidence.shape[0]):
        _, index = torch.topk(confidence[j], k=int(k[j]))
        commit[j, index] = True
    return commit


@pytest.mark.parametrize("seed", range(6))
def test_batched_top_k_equals_the_per_row_loop_with_ties_and_mixed_counts(seed):
    g = torch.Generator().manual_seed(seed)
    B, T = 9, 70
    confidence = torch.randint(0, 3, (B, T), generator=g).float() / 2  # many exact ties, as saturated softmaxes give
    confidence[torch.rand(B, T, generator=g) < 0.4] = -torch.inf
    k = torch.randint(0, 3, (B,), generator=g) + torch.tensor([0, 5] * 4 + [0])  # counts 0-7, several per batch
    got = commit_top_k(confidence, k)
    assert torch.equal(got, per_row_top_k(confidence, k))
    assert got.sum(dim=1).tolist() == k.tolist()


def test_one_shared_count_and_a_zero_count():
    confidence = torch.tensor([[0.1, 0.9, 0.5], [0.7, 0.7, 0.2]])
    assert (
        commit_top_k(confidence, torch.tensor([2, 2])).tolist()
        == per_row_top_k(confidence, torch.tensor([2, 2])).tolist()
    )
    assert not commit_top_k(confidence, torch.tensor([0, 0])).any()
