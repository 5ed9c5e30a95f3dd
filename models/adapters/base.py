"""The model handle: how everything above `models/` sees a loaded candidate, whatever its kind.

An adapter loads a model and tokenizes; it does not decode. `sampler.decode.decode(handle, input_ids,
config)` (a layer above) picks the decoder by `handle.kind`: unmask's masked-diffusion sampler, the
block sampler, or KV-cached autoregressive decoding. `models.load(ref)` picks the adapter.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any, Self

import torch
from tokenizers import Tokenizer

from models import checkpoint
from models.checkpoint import CheckpointError, weight_files
from models.digest import weights_sha256
from models.llada import LLaDAModelLM


class AdapterError(CheckpointError):
    """A model that cannot be loaded or called; the message says why and what to do."""


class NotEvaluable(AdapterError):
    """A catalog entry that unmask lists but cannot run (API without a key, no native adapter)."""


class TextCodec(checkpoint.TextCodec):
    """Tokenizer-backed encode/decode whose failures are AdapterErrors."""

    codec_error = AdapterError


class ModelHandle(TextCodec):
    """One loaded candidate: its kind, the network, its special ids, card, weights digest and text codec.

    Subclasses set `kind`, `model`, `tokenizer`, `path`, `entry_id`, `eos_ids` (EOS first, then EoT),
    `pad_id`, `card`, and `mask_id` when the model masks (masked diffusion); `defaults` holds the
    catalog's decoding defaults (empty for a plain folder).
    """

    kind: str  # the catalog kind: masked-diffusion, block-diffusion, autoregressive
    model: Any
    path: Path | None
    entry_id: str
    eos_ids: tuple[int, ...] = ()
    mask_id: int | None = None  # only masked-diffusion models mask
    pad_id: int | None = None
    card: dict[str, Any]
    defaults: dict[str, Any]

    @property
    def model_id(self) -> str:
        return self.entry_id

    @property
    def causal(self) -> bool:
        return self.kind == "autoregressive"

    @property
    def masked_diffusion(self) -> bool:
        """LLaDA-style: masked positions filled block by block with the model's `mask_id`."""
        return self.kind == "masked-diffusion"

    @property
    def block_diffusion(self) -> bool:
        """DiffusionGemma-style uniform-state block diffusion."""
        return self.kind == "block-diffusion"

    @property
    def native(self) -> bool:
        """Whether the network is unmask's own LLaDA layout (models/llada.py), which unmask's decoders drive
        directly (a causal one with its own KV cache); else a Hugging Face model (transformers' generate)."""
        return isinstance(self.model, LLaDAModelLM)

    @property
    def context_length(self) -> int | None:
        """The longest canvas (prompt + generated positions) the model was trained on; None when it does not say."""
        config = getattr(self.model, "config", None)
        return getattr(config, "max_sequence_length", None) or getattr(config, "max_position_embeddings", None)

    @property
    def eos_id(self) -> int | None:
        return self.eos_ids[0] if self.eos_ids else None

    @property
    def eot_id(self) -> int | None:
        """The second stop id (an end-of-turn token), when the model has one."""
        return self.eos_ids[1] if len(self.eos_ids) > 1 else None

    @property
    def stop_ids(self) -> frozenset[int]:
        return frozenset(self.eos_ids)

    @functools.cached_property
    def weights_sha256(self) -> str:
        """The digest of the weights this handle was loaded from, computed once per handle."""
        return weights_sha256(self.path) if self.path is not None else ""

    def sampler_ids(self) -> dict[str, int | None]:
        """The token ids a SamplerConfig for this model must carry: its mask (when it has one), EOS and EoT."""
        ids = {"mask_id": self.mask_id, "eos_id": self.eos_id, "eot_id": self.eot_id}
        return {k: v for k, v in ids.items() if v is not None or k == "eot_id"}

    def useful_length(self, tokens: list[int]) -> int:
        """Generated tokens before the first stop id (EOS or EoT)."""
        stops = self.stop_ids
        return next((i for i, t in enumerate(tokens) if t in stops), len(tokens))

    def response_text(self, tokens: list[int]) -> str:
        """The generated text up to the first stop id."""
        return self.decode(list(tokens[: self.useful_length(tokens)]))

    def with_model(self, model: Any) -> ModelHandle:
        """The same handle over another network (a wrapped or instrumented copy of this one's)."""
        other = copy.copy(self)
        other.model = model
        return other

    def _read_card(self) -> None:
        try:
            self.card = checkpoint.read_card(self.path) if self.path is not None else {}
        except CheckpointError as e:
            raise AdapterError(str(e)) from None


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise AdapterError(f"{path}: missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AdapterError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise AdapterError(f"{path}: expected a JSON object")
    return data


def read_tokenizer(folder: Path) -> Tokenizer | None:
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the tokenizers library raises a bare Exception on bad JSON
        raise AdapterError(f"{path}: unreadable tokenizer ({e})") from None


def require_safetensors(folder: Path) -> None:
    """Refuse a folder whose weights are pickle only (or absent) before any library opens it."""
    try:
        weight_files(folder)
    except CheckpointError as e:
        raise AdapterError(str(e)) from None


def eos_list(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else (int(value),)


class BlockCheckpointAdapter(ModelHandle):
    """A published block-diffusion folder (config.json, safetensors, tokenizer.json; no remote code) behind the
    model handle: what SDAR's, LLaDA2's and Nemotron-Labs-Diffusion's adapters share. A subclass names its
    decoding `DEFAULTS`, the fallback `NAME` and `load(folder, dtype)`; it adds the calls its block loop makes."""

    kind = "block-diffusion"
    DEFAULTS: dict[str, Any] = {}
    NAME = "block-diffusion"

    def __init__(
        self,
        model: Any,
        tokenizer: Tokenizer | None = None,
        defaults: dict[str, Any] | None = None,
        path: Path | None = None,
        entry_id: str = "",
        generation: dict[str, Any] | None = None,
    ):
        self.model, self.tokenizer, self.path = model, tokenizer, path
        self.entry_id = entry_id or (path.name if path else self.NAME)
        self.defaults = self.DEFAULTS | dict(defaults or {})
        cfg = model.config
        self.canvas_length = cfg.block_size
        self.vocab_size = cfg.vocab_size
        self.mask_id = self.defaults.get("mask_id", cfg.mask_token_id)
        if self.mask_id is None:
            raise AdapterError(f"{path or self.entry_id}: config.json has no mask_token_id and the catalog none")
        gen = generation or {}
        self.eos_ids = eos_list(self.defaults.get("eos_id", gen.get("eos_token_id", cfg.eos_token_id)))
        self.pad_id = self.defaults.get("pad_id", gen.get("pad_token_id", cfg.pad_token_id))
        self.defaults.setdefault("mask_id", self.mask_id)
        self._read_card()

    @staticmethod
    def load(folder: Path, dtype: torch.dtype) -> Any:
        """The network in `folder`; a CheckpointError names what is missing or wrong."""
        raise NotImplementedError

    @property
    def dtype(self) -> torch.dtype:
        dtype: torch.dtype = self.model.dtype
        return dtype

    @classmethod
    def from_folder(
        cls,
        folder: Path,
        entry_id: str = "",
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        defaults: dict[str, Any] | None = None,
    ) -> Self:
        """The adapter over `folder`; AdapterError names what is missing or wrong."""
        folder = Path(folder)
        require_safetensors(folder)
        try:
            model = cls.load(folder, dtype)
        except CheckpointError as e:
            raise AdapterError(str(e)) from None
        generation = (
            read_json(folder / "generation_config.json") if (folder / "generation_config.json").is_file() else {}
        )
        return cls(model.to(device), read_tokenizer(folder), defaults, folder, entry_id, generation)

    def cache_rows(self, cache: Any, rows: Any) -> Any:
        return cache.rows(rows)
