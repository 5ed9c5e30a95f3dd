"""Memory admission: the peak a decode needs per row, computed from the model's config, and the rows a budget admits.

The peak of a diffusion decode is set by its `(canvas, vocabulary)` float32 temporaries, not by the
weights: each denoising step holds the step's logits, their softmax, the previous step's logits (block
diffusion's self-conditioning) and the entropy's intermediates (normalised logits, probabilities, the
clamped logits and p log p) at once. For a real DiffusionGemma (canvas 256, vocabulary 262,144) that
is about 7 x 256 MiB, some 1.9 GiB a row, the order of what engines that serve it were seen to run
out of memory on (about 2.1 GiB a sequence). Beside it: the KV cache of the prompt and every
committed canvas, and the encoder's activations over the prompt.

`peak_bytes(fn)` measures what a call really allocated at its peak, from the CPU allocator's own
running total as torch's profiler reports it (each allocation event carries `total_allocated`), so a
test can hold the computed figure against the measured one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sampler.block_diffusion import MASKED_LOOPS, BlockDiffusionConfig
from sampler.effective import EffectiveConfig, effective_config

F32 = 4


@dataclass(frozen=True)
class Footprint:
    """The peak bytes one decode needs: `per_row` for each row of the batch (weights already resident)."""

    per_row: int
    terms: dict[str, int]  # what per_row is made of, bytes per row

    def batch(self, rows: int) -> int:
        return rows * self.per_row

    def rows_within(self, budget: int) -> int:
        """How many rows fit `budget` bytes (0: not even one)."""
        return max(0, budget // max(1, self.per_row))


def peak_bytes(fn: Callable[[], Any]) -> tuple[Any, int]:
    """(fn's result, the most bytes allocated at once above what was allocated when it began), CPU allocator."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    allocations: list[tuple[int, int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            allocations.append((node.start_time_ns, node.extra_fields.alloc_size, node.extra_fields.total_allocated))
        stack.extend(node.children)
    if not allocations:
        return result, 0
    allocations.sort()
    base = allocations[0][2] - allocations[0][1]  # allocated before the first event
    return result, max(total for _, _, total in allocations) - base


def canvas_logits_bytes(kind: str, positions: int, canvas: int, vocab: int, dtype_bytes: int) -> int:
    """The `(canvas, vocab)` float32 temporaries one row of a decode holds at its peak: a block-diffusion step's
    seven `(L, V)` tensors (six in float32, the self-conditioning copy in the model's dtype) over its canvas `L`;
    a masked-diffusion forward's logits over every position; an autoregressive step's logits and their softmax."""
    if kind == "block-diffusion":
        return 6 * canvas * vocab * F32 + canvas * vocab * dtype_bytes
    if kind == "masked-diffusion":
        return positions * vocab * F32
    return 2 * positions * vocab * F32


def kv_cache_bytes(layers: int, kv_heads: int, head_dim: int, positions: int, dtype_bytes: int) -> int:
    """Keys and values of `positions` tokens in `layers` layers of `kv_heads` heads of `head_dim`, one row."""
    return 2 * layers * kv_heads * head_dim * positions * dtype_bytes


def _dtype_bytes(model: torch.nn.Module) -> int:
    return next(model.parameters()).element_size()


def block_diffusion_footprint(handle: Any, prompt_tokens: int, config: EffectiveConfig) -> Footprint:
    """DiffusionGemma: the denoising step's `(canvas, vocab)` temporaries, or the encoder's pass over the prompt
    if larger, plus the KV cache of the prompt and every committed canvas.

    Per denoising step a row holds seven `(L, V)` tensors at its peak (measured on CPU in float32): the
    self-conditioning logits of the previous step, the step's tempered logits and their softmax, and
    Categorical's normalised logits, probabilities, clamped logits and p log p inside the entropy."""
    block = effective_config(handle, config)
    assert isinstance(block, BlockDiffusionConfig), "a block-diffusion handle decodes a block config"
    text = handle.model.config.get_text_config(decoder=True)
    L, V, dtype = handle.canvas_length, int(text.vocab_size), _dtype_bytes(handle.model)
    canvases = -(-block.max_new_tokens // L)
    positions = prompt_tokens + canvases * L
    per_layer = getattr(text, "per_layer_config", None)  # Gemma 4: head sizes may differ layer by layer
    layers = [per_layer[i] if per_layer is not None else text for i in range(len(text.layer_types))]
    kv = 0
    for layer, kind in zip(layers, text.layer_types):
        kept = min(positions, text.sliding_window) if kind == "sliding_attention" else positions
        kv += kv_cache_bytes(1, layer.num_key_value_heads, layer.head_dim, kept, dtype)
    denoise = canvas_logits_bytes("block-diffusion", positions, L, V, dtype)
    # the encoder's pass: residual, norms and queries/keys/values/attention output, the MLP and the routed experts
    attention = max(
        (2 * layer.num_attention_heads + 2 * layer.num_key_value_heads) * layer.head_dim for layer in layers
    )
    width = (
        text.hidden_size * 4
        + attention
        + text.intermediate_size * 3
        + (text.moe_intermediate_size or 0) * 3 * (text.top_k_experts or 0)
    )
    encoder = prompt_tokens * width * dtype
    return Footprint(
        per_row=max(denoise, encoder) + kv,
        terms={"canvas_x_vocab": denoise, "encoder_activations": encoder, "kv_cache": kv},
    )


def masked_blocks_footprint(handle: Any, prompt_tokens: int, config: EffectiveConfig) -> Footprint:
    """SDAR and LLaDA2 (a masked canvas of `block_size` positions, sampler/masked_blocks.py): the KV cache of the
    prompt and every committed block, plus the larger of the prompt's forward (the widest layer's activations,
    `layer_bytes_per_token`, and float32 logits over every prompt position) and a denoising step's `(block, vocab)`
    float32 temporaries (the logits, their softmax and the draw's probabilities). An estimate from the shapes, not a
    measured peak."""
    block = effective_config(handle, config)
    assert isinstance(block, BlockDiffusionConfig), "a block-diffusion handle decodes a block config"
    cfg = handle.model.config
    L, V, dtype = handle.canvas_length, int(cfg.vocab_size), _dtype_bytes(handle.model)
    positions = prompt_tokens + -(-block.max_new_tokens // L) * L
    kv = kv_cache_bytes(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, positions, dtype)
    prefill = prompt_tokens * (layer_bytes_per_token(cfg, dtype) + V * F32)
    step = 3 * L * V * F32
    return Footprint(
        per_row=max(step, prefill) + kv,
        terms={"canvas_x_vocab": step, "encoder_activations": prefill, "kv_cache": kv},
    )


def layer_bytes_per_token(cfg: Any, dtype: int) -> int:
    """The activations one prompt token holds in the forward's widest layer, in bytes, for an SDAR or LLaDA2 config.

    Every layer: the residual, its norms and the attention's queries, keys, values and output. A dense layer adds its
    SwiGLU (`intermediate_size`: gate, up and their product). A sparse LLaDA2 layer (after `first_k_dense_replace`,
    when `num_experts` is set; SDAR has none) adds instead what models/llada2.py's mixture holds at once: the
    router's float32 scores over `num_experts`, each token's `num_experts_per_tok` expert outputs `(k, hidden)` and
    their float32 weighted copies, and the wider of one routed expert's SwiGLU (`moe_intermediate_size`; the experts
    run one after another, so at worst one of them over every token, never k at once) and the shared experts' (their
    `num_shared_experts` SwiGLUs fused into one)."""
    hidden, layers = int(cfg.hidden_size), int(cfg.num_hidden_layers)
    common = hidden * 4 + int((2 * cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim)
    dense = (common + int(cfg.intermediate_size) * 3) * dtype
    experts = getattr(cfg, "num_experts", None)
    if experts is None:
        return dense
    first_sparse = min(int(cfg.first_k_dense_replace), layers)
    k, moe, shared = int(cfg.num_experts_per_tok), int(cfg.moe_intermediate_size), int(cfg.num_shared_experts or 0)
    # the (k, hidden) outputs in the model's dtype, their float32 copy (none when already float32), the weighted ones
    outputs = k * hidden * (dtype + (F32 if dtype != F32 else 0) + F32)
    sparse = (common + moe * 3 * max(1, shared)) * dtype + 2 * int(experts) * F32 + outputs
    widths = ([dense] if first_sparse > 0 else []) + ([sparse] if first_sparse < layers else [])
    return max(widths)


def masked_diffusion_footprint(handle: Any, prompt_tokens: int, config: EffectiveConfig) -> Footprint:
    """LLaDA (the native layout): one forward over the prompt and canvas, per position: the residual and its
    norm (2d), SwiGLU's four hidden-width tensors (4I), every layer's keys and values, RoPE's cos and sin,
    and the sampler's logits (V) held across the forward."""
    cfg = handle.model.config
    T = prompt_tokens + config.gen_length
    per_position = (
        2 * cfg.d_model
        + 4 * cfg.hidden_size
        + 2 * cfg.kv_heads * cfg.head_dim * cfg.n_layers
        + 2 * cfg.head_dim
        + cfg.vocab_size
    )
    if getattr(config, "cache", "none") != "none":  # cached keys/values of the positions outside the block
        per_position += 2 * cfg.kv_heads * cfg.head_dim * cfg.n_layers
    activations = T * (per_position - cfg.vocab_size) * F32
    logits = canvas_logits_bytes("masked-diffusion", T, T, cfg.vocab_size, F32)
    return Footprint(per_row=activations + logits, terms={"canvas_x_vocab": logits, "activations": activations})


def generic_footprint(handle: Any, prompt_tokens: int, config: EffectiveConfig) -> Footprint:
    """A Hugging Face causal LM: logits and a few hidden-width tensors per position, plus its KV cache."""
    cfg = handle.model.config
    T = prompt_tokens + config.gen_length
    hidden = getattr(cfg, "hidden_size", 0)
    width = 4 * hidden + 4 * getattr(cfg, "intermediate_size", 4 * hidden)
    kv = 2 * hidden * getattr(cfg, "num_hidden_layers", 1)
    logits = canvas_logits_bytes("autoregressive", T, T, getattr(cfg, "vocab_size", 0), F32)
    return Footprint(per_row=logits + T * (width + kv) * F32, terms={"canvas_x_vocab": logits})


def footprint(handle: Any, prompt_tokens: int, config: EffectiveConfig) -> Footprint:
    """The peak bytes per row of decoding `prompt_tokens` + `config.gen_length` on `handle`'s model."""
    if handle.kind == "block-diffusion":
        masked = getattr(effective_config(handle, config), "canvas", "") in MASKED_LOOPS
        return (masked_blocks_footprint if masked else block_diffusion_footprint)(handle, prompt_tokens, config)
    if getattr(handle, "native", False):
        return masked_diffusion_footprint(handle, prompt_tokens, config)
    return generic_footprint(handle, prompt_tokens, config)


def available_bytes(device: str | torch.device = "cpu") -> int:
    """Memory a decode may use now: CUDA's free memory on that device, else the host's MemAvailable."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """'8GiB', '512MiB', '2.5GB', '1000000' -> bytes; ValueError naming what was expected."""
    import re

    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in UNITS:
        raise ValueError(
            f"{text!r} is not a size; expected a number with an optional unit "
            f"(B, KB, MB, GB, KiB, MiB, GiB, TiB), e.g. 8GiB"
        )
    value = int(float(match.group(1)) * UNITS[unit])
    if value <= 0:
        raise ValueError(f"{text!r}: a memory budget must be above 0 bytes")
    return value


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
