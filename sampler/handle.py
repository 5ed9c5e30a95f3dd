"""What the sampler and serving read of a loaded model: the `Handle` protocol.

`models.load` gives a `models.adapters.base.ModelHandle`, which is one. The kind facts are properties,
so a decoder asks `handle.masked_diffusion` or `handle.native` instead of comparing strings or testing
the network's class; `handle.kind` stays the key of the decoder table (`sampler.decode.DECODERS`).
"""

from __future__ import annotations

from typing import Any, Protocol


class Handle(Protocol):
    kind: str  # the catalog kind: masked-diffusion, block-diffusion, autoregressive (api: text in, text out)
    model: Any  # the network: `model(input_ids, attention_mask=None).logits` `(batch, seq, vocab)`
    entry_id: str
    mask_id: int | None  # masked diffusion only
    pad_id: int | None
    eos_ids: tuple[int, ...]  # EOS first, then EoT

    @property
    def eos_id(self) -> int | None: ...

    @property
    def causal(self) -> bool:
        """Autoregressive."""

    @property
    def masked_diffusion(self) -> bool: ...

    @property
    def block_diffusion(self) -> bool: ...

    @property
    def native(self) -> bool:
        """The network is unmask's own LLaDA layout (models/llada.py)."""

    @property
    def context_length(self) -> int | None:
        """Prompt + generated positions the model takes; None when its config does not say."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def useful_length(self, tokens: list[int]) -> int: ...

    def sampler_ids(self) -> dict[str, int | None]: ...
