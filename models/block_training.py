"""Train a tiny DiffusionGemma (transformers' DiffusionGemmaForBlockDiffusion) with the block-diffusion SFT objective.

The objective is the one DiffusionGemma's fine-tuning recipes describe (NeMo AutoModel's
DiffusionGemma SFT guide): the response is cut into canvases of `canvas_length` positions (the
response, one EOS, then EOS padding to a whole canvas). A step picks one canvas index k; the causal
encoder reads the clean prompt and response up to the end of canvas k (its KV cache is what the
decoder attends to), and the decoder denoises canvas k corrupted by *uniform-state* noise: with a
noise level t ~ U(eps, 1] per row, each canvas position is replaced by a uniform random vocabulary
token with probability t (there is no mask token). The decoder attends bidirectionally within the
canvas and to the cached prefix before canvas k only (the cache positions of canvas k itself are
masked out, as block-causal training does).

Loss = flat cross-entropy over every canvas position (corrupted or not) + `encoder_loss_weight` x
next-token cross-entropy of the encoder on the clean response. Self-conditioning (two passes, as
Analog Bits trains it): with probability `self_conditioning_p` per row, a first decoder pass without
gradient gives logits that the second pass reads as its self-conditioning signal; other rows get
the zero signal, which is what the first denoising step sees at inference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from models.tokenizer_build import special_ids

if TYPE_CHECKING:  # models/training.py picks this objective; it only reads the recipe and the batch
    import transformers

    from models.training import Batch, TrainConfig

NOISE_EPS = 1e-3  # floor on the corruption level: every canvas sees some noise


@dataclass(frozen=True)
class BlockDiffusionShape:
    """The tiny DiffusionGemma's architecture (a Gemma-4-style stack with a small mixture of experts, full
    attention)."""

    hidden_size: int = 128  # residual width
    n_layers: int = 4  # transformer blocks, shared by the encoder and the decoder
    n_heads: int = 4  # attention heads (head dim 32)
    n_kv_heads: int = 2  # grouped-query attention
    intermediate_size: int = 384  # GELU-tanh MLP width
    n_experts: int = 4  # DiffusionGemma's layers always carry a routed expert block beside the MLP
    top_k_experts: int = 2
    expert_size: int = 64  # each expert's hidden width
    canvas_length: int = 32  # positions denoised together; the shortest task answer fits one canvas
    max_positions: int = 1024  # prompt + canvases the rotary tables cover


def diffusion_gemma_config(
    shape: BlockDiffusionShape, tokenizer: Tokenizer, ids: dict[str, int]
) -> transformers.DiffusionGemmaConfig:
    """A DiffusionGemmaConfig for the char tokenizer; image ids sit just past the text vocabulary."""
    import transformers

    vocab = tokenizer.get_vocab_size()
    head_dim = shape.hidden_size // shape.n_heads
    text = dict(
        vocab_size=vocab + 3,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.n_layers,
        num_attention_heads=shape.n_heads,
        num_key_value_heads=shape.n_kv_heads,
        head_dim=head_dim,
        global_head_dim=head_dim,
        sliding_window=shape.max_positions,
        max_position_embeddings=shape.max_positions,
        layer_types=["full_attention"] * shape.n_layers,
        use_bidirectional_attention="vision",
        num_experts=shape.n_experts,
        top_k_experts=shape.top_k_experts,
        moe_intermediate_size=shape.expert_size,
        pad_token_id=ids["pad_token_id"],
        eos_token_id=ids["eos_token_id"],
        bos_token_id=ids["eot_token_id"],
    )
    # No image ever reaches this model; a None vision config would build the full-size default tower.
    vision = dict(
        model_type="gemma4_vision",
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        position_embedding_size=64,
        patch_size=4,
        pooling_kernel_size=2,
    )
    return transformers.DiffusionGemmaConfig(
        text_config=text,
        vision_config=vision,
        canvas_length=shape.canvas_length,
        boi_token_id=vocab,
        eoi_token_id=vocab + 1,
        image_token_id=vocab + 2,
    )


def build_diffusion_gemma(
    shape: BlockDiffusionShape, tokenizer: Tokenizer, ids: dict[str, int], seed: int
) -> transformers.DiffusionGemmaForBlockDiffusion:
    """A freshly initialised DiffusionGemmaForBlockDiffusion (transformers' own init, seeded)."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.DiffusionGemmaForBlockDiffusion(diffusion_gemma_config(shape, tokenizer, ids))
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = (
        ids["eos_token_id"],
        ids["pad_token_id"],
    )
    return model


def encode_canvases(
    tokenizer: Tokenizer, pairs: list[tuple[str, str]], L: int, ids: dict[str, int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(tokens, attention, target) `(B, P + n * L)` and P: left-padded prompts, responses + EOS padded to n canvases.

    `target` marks the response tokens and the first EOS (what the encoder's next-token loss predicts)."""
    prompts = [tokenizer.encode(p, add_special_tokens=False).ids for p, _ in pairs]
    responses = [tokenizer.encode(r, add_special_tokens=False).ids for _, r in pairs]
    P = max(len(p) for p in prompts)
    n = max(math.ceil((len(r) + 1) / L) for r in responses)
    B = len(pairs)
    tokens = torch.full((B, P + n * L), ids["eos_token_id"], dtype=torch.long)
    attention = torch.ones_like(tokens)
    target = torch.zeros_like(tokens, dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        tokens[i, : P - len(p)] = ids["pad_token_id"]
        attention[i, : P - len(p)] = 0
        tokens[i, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        tokens[i, P : P + len(r)] = torch.tensor(r, dtype=torch.long)
        target[i, P : P + len(r) + 1] = True
    return tokens, attention, target, P


def _softcapped_logits(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head as DiffusionGemmaForBlockDiffusion.forward applies it (float32, tanh soft-cap)."""
    cap = model.final_logit_softcapping
    logits: torch.Tensor = model.lm_head(hidden).float()
    return torch.tanh(logits / cap) * cap if cap else logits


def encode_clean(model: Any, tokens: torch.Tensor, attention: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """Run the causal encoder over clean `tokens` `(B, T)`: (its KV cache, last hidden states `(B, T, H)`)."""
    from transformers import DynamicCache

    encoder = model.model.encoder
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    positions = torch.arange(tokens.shape[1], device=tokens.device)[None]
    shape_only = torch.empty((*tokens.shape, 0), dtype=model.dtype, device=tokens.device)
    masks = encoder.create_masks_for_generate(
        config=model.config,
        inputs_embeds=shape_only,
        attention_mask=attention,
        cache=cache,
        position_ids=positions,
        mm_token_type_ids=None,
    )
    out = encoder(input_ids=tokens, attention_mask=masks, cache=cache, position_ids=positions)
    return out.cache, out.last_hidden_state


def block_diffusion_loss(
    model: Any,
    tokens: torch.Tensor,
    attention: torch.Tensor,
    target: torch.Tensor,
    P: int,
    generator: torch.Generator,
    self_conditioning_p: float = 0.5,
    encoder_loss_weight: float = 1.0,
) -> torch.Tensor:
    """The block-diffusion SFT loss of one batch (module docstring); every random draw comes from `generator` (CPU)."""
    L, V = model.config.canvas_length, model.config.text_config.vocab_size
    B, T = tokens.shape
    k = int(torch.randint(0, (T - P) // L, (1,), generator=generator))
    start = P + k * L
    clean = tokens[:, start : start + L]  # (B, L)
    strata = torch.randperm(B, generator=generator).unsqueeze(1)  # stratified t, as the LLaDA recipe draws it
    t = (1 - NOISE_EPS) * (strata + torch.rand(B, 1, generator=generator)) / B + NOISE_EPS  # (B, 1)
    corrupt = torch.rand(B, L, generator=generator) < t
    noisy = torch.where(corrupt, torch.randint(0, V, (B, L), generator=generator), clean)
    use_sc = torch.rand(B, generator=generator) < self_conditioning_p  # (B,)

    device = model.device
    tokens, attention, target = tokens.to(device), attention.to(device), target.to(device)
    cache, hidden = encode_clean(model, tokens[:, : start + L], attention[:, : start + L])
    # the canvas reads the clean prefix before it, never its own clean positions in the cache
    dec_mask = torch.cat(
        [
            attention[:, :start],
            torch.zeros(B, L, dtype=attention.dtype, device=device),
            torch.ones(B, L, dtype=attention.dtype, device=device),
        ],
        dim=1,
    )
    positions = torch.arange(start, start + L, device=device)[None]
    call = dict(
        decoder_input_ids=noisy.to(device), cache=cache, decoder_attention_mask=dec_mask, decoder_position_ids=positions
    )
    self_conditioning = None
    if bool(use_sc.any()):
        with torch.no_grad():
            self_conditioning = model(**call).logits.to(model.dtype)
    logits = model(
        **call,
        self_conditioning_logits=self_conditioning,
        self_conditioning_mask=use_sc.to(device) if self_conditioning is not None else None,
    ).logits
    diffusion = F.cross_entropy(logits.reshape(-1, V), clean.to(device).reshape(-1))
    if not encoder_loss_weight:
        return diffusion
    ar_logits = _softcapped_logits(model, hidden[:, :-1])  # (B, start + L - 1, V)
    predict = target[:, 1 : start + L]
    if not bool(predict.any()):
        return diffusion
    ar = F.cross_entropy(ar_logits[predict], tokens[:, 1 : start + L][predict])
    return diffusion + encoder_loss_weight * ar


class DiffusionGemmaObjective:
    """`unmask train`'s objective for architecture "diffusion-gemma" (models/training.py OBJECTIVES)."""

    def shape(self, cfg: TrainConfig) -> BlockDiffusionShape:
        return BlockDiffusionShape(
            hidden_size=cfg.d_model,
            n_layers=cfg.n_layers,
            n_heads=cfg.n_heads,
            intermediate_size=cfg.mlp_hidden,
            canvas_length=cfg.canvas_length,
            max_positions=cfg.max_sequence_length,
        )

    def build(self, cfg: TrainConfig, tokenizer: Tokenizer) -> transformers.DiffusionGemmaForBlockDiffusion:
        return build_diffusion_gemma(self.shape(cfg), tokenizer, special_ids(tokenizer), cfg.seed)

    def loss(
        self,
        cfg: TrainConfig,
        model: Any,
        batch: Batch,
        tokenizer: Tokenizer,
        ids: dict[str, int],
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, int]:
        tokens, attention, target, P = encode_canvases(tokenizer, batch.pairs, cfg.canvas_length, ids)
        loss = block_diffusion_loss(
            model, tokens, attention, target, P, generator, cfg.self_conditioning_p, cfg.encoder_loss_weight
        )
        return loss, tokens.numel()

    def write(self, model: Any, folder: Path, tokenizer: Tokenizer, extra: dict[str, Any]) -> None:
        """transformers' own layout (config.json, model.safetensors, generation_config.json) plus tokenizer.json."""
        folder = Path(folder)
        for key, value in extra.items():
            setattr(model.config, key, value)
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save(str(folder / "tokenizer.json"))

    def read(self, model: Any, folder: Path) -> None:
        """Load through transformers (it restores the tied encoder/decoder weights save_pretrained folds)."""
        saved = type(model).from_pretrained(
            folder, dtype=torch.float32, use_safetensors=True, trust_remote_code=False, local_files_only=True
        )
        model.load_state_dict(saved.state_dict())
