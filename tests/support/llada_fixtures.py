"""Build small LLaDA-layout models with peaky random weights for sampler and loader tests."""

from __future__ import annotations

import torch

from models.llada import LLaDAConfig, LLaDAModelLM, init_weights

VOCAB = 48
MASK_ID, EOS_ID, EOT_ID, PAD_ID = 47, 46, 45, 44


def tiny_config(**overrides) -> LLaDAConfig:
    base = dict(
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        n_layers=2,
        mlp_hidden_size=48,
        vocab_size=VOCAB,
        embedding_size=VOCAB,
        rope_theta=10000.0,
        max_sequence_length=128,
        mask_token_id=MASK_ID,
        eos_token_id=EOS_ID,
    )
    return LLaDAConfig(**(base | overrides))


def tiny_model(seed: int = 0, **overrides) -> LLaDAModelLM:
    """Random weights scaled up so logits are peaky: argmax ties are rare and EOS/EoT do get chosen."""
    model = init_weights(LLaDAModelLM(tiny_config(**overrides)), seed=seed, std=0.3)
    head = model.model.transformer.wte if model.config.weight_tying else model.model.transformer.ff_out
    with torch.no_grad():  # make EOS and EoT frequent winners, as in a real model's padded tail
        head.weight[[EOS_ID, EOT_ID]] *= 2.5
    return model.eval()


def left_padded_prompts(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random prompts of the given lengths, left-padded with PAD_ID, and their attention mask."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, width - n :] = torch.randint(0, PAD_ID, (n,), generator=g)
        mask[row, width - n :] = 1
    return ids, mask
