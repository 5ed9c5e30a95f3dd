"""The adapter protocol: how evaluation loads and calls any candidate, whatever its kind.

An adapter loads a model and tokenizes; it does not decode. `sampler.decode.decode(adapter,
input_ids, config)` (a layer above) picks the decoder by `adapter.kind`: unmask's masked-diffusion
sampler, the block sampler, or KV-cached autoregressive decoding. Text goes through `encode` / `decode`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from tokenizers import Tokenizer

from models import checkpoint
from models.checkpoint import CheckpointError, weight_files


class AdapterError(ValueError):
    """A model that cannot be loaded or called; the message says why and what to do."""


class NotEvaluable(AdapterError):
    """A catalog entry that unmask lists but cannot run (API without a key, no native adapter)."""


class ModelAdapter(Protocol):
    entry_id: str
    kind: str  # the catalog kind: masked-diffusion, block-diffusion, autoregressive, api
    path: Path | None
    eos_ids: tuple[int, ...]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class TextCodec(checkpoint.TextCodec):
    """Tokenizer-backed encode/decode whose failures are AdapterErrors."""

    codec_error = AdapterError


class EvaluationSurface:
    """What evaluation reads of a loaded model beyond encode/decode, for adapters that `models.load_model`
    hands to sweeps, probes and gates in place of a `models.LoadedModel`: the stop ids as `eos_id` /
    `eot_id`, no mask id, the model card and the id. Needs `eos_ids`, `path` and `entry_id`."""

    mask_id = None  # evaluation never masks tokens for these kinds

    def _read_card(self) -> None:
        try:
            self.card = checkpoint.read_card(self.path) if self.path is not None else {}
        except CheckpointError as e:
            raise AdapterError(str(e)) from None
        self.model_id = self.entry_id

    @property
    def eos_id(self) -> int | None:
        return self.eos_ids[0] if self.eos_ids else None

    @property
    def eot_id(self) -> int | None:
        """The second stop id (an end-of-turn token), when the model has one."""
        return self.eos_ids[1] if len(self.eos_ids) > 1 else None


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise AdapterError(f"{path}: missing") from None
    except json.JSONDecodeError as e:
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
