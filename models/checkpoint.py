"""Read a LLaDA-layout checkpoint folder: config.json, safetensors (single or sharded), tokenizer.json.

Only safetensors are read; there is no pickle path and no remote code. Every failure names the
file and the key it was reading.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors import SafetensorError, safe_open
from tokenizers import Tokenizer

from models.llada import LLaDAConfig, LLaDAModelLM
from models.unique_keys import DuplicateJSONKeyError, load_json, load_yaml

SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_SINGLE = "model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
EOT_TOKENS = ("<|eot_id|>", "<|im_end|>", "<eot>", "<|endoftext|>")

# Config keys that exist in LLaDA's config.json and would change the computation if switched on;
# the native model does not implement them, so a checkpoint that sets them is refused.
UNSUPPORTED_FLAGS = (
    "input_emb_norm",
    "scale_logits",
    "attention_layer_norm",
    "clip_qkv",
    "alibi",
    "multi_query_attention",
)
SUPPORTED_VALUES = {"layer_norm_type": ("rms",), "block_type": ("llama",), "activation_type": ("silu", "swiglu")}


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file and the key."""


class TextCodec:
    """encode/decode through a folder's tokenizer.json (the `tokenizers` library; no remote code)."""

    tokenizer: Tokenizer | None
    path: Path | None
    codec_error: type[Exception] = CheckpointError

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise self.codec_error(f"{self.path}: no tokenizer.json, cannot encode text")
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            raise self.codec_error(f"{self.path}: no tokenizer.json, cannot decode ids")
        return self.tokenizer.decode(ids, skip_special_tokens=True)


@dataclass
class LoadedModel(TextCodec):
    """A model ready for the sampler, with what the sampler and the reports need to know of it."""

    model: torch.nn.Module
    tokenizer: Tokenizer | None
    mask_id: int
    eos_id: int
    eot_id: int | None
    pad_id: int | None
    path: Path
    config: LLaDAConfig
    card: dict[str, Any] = field(default_factory=dict)
    model_id: str = ""

    @property
    def causal(self) -> bool:
        return self.config.causal


def _type_ok(value: Any, annotation: Any) -> bool:
    hint = annotation if not isinstance(annotation, str) else eval(annotation, {}, {})  # dataclass string types
    origins = (
        typing.get_args(hint)
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
        else (hint,)
    )
    for t in origins:
        if t is type(None) and value is None:
            return True
        if t is bool and isinstance(value, bool):
            return True
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if t is str and isinstance(value, str):
            return True
    return False


def read_json_object(path: Path) -> dict[str, Any]:
    """A checkpoint's JSON object file (config.json); CheckpointError naming the file when it is missing, not
    JSON, gives a key twice or is not an object."""
    try:
        raw = load_json(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except DuplicateJSONKeyError as e:
        raise CheckpointError(f"{path}: {e}; each key once") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    return raw


def read_config(folder: Path) -> tuple[LLaDAConfig, dict[str, Any]]:
    """Parse and type-check `config.json`; unknown keys are kept in the raw dict and ignored."""
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; a LLaDA checkpoint needs config.json")
    raw = read_json_object(path)
    types_ = LLaDAConfig.field_types()
    kwargs: dict[str, Any] = {}  # JSON values, each checked against its field's type
    for key, annotation in types_.items():
        if key not in raw:
            continue
        if not _type_ok(raw[key], annotation):
            raise CheckpointError(
                f"{path}: key '{key}' must be {annotation}, got {type(raw[key]).__name__} {raw[key]!r}"
            )
        kwargs[key] = float(raw[key]) if annotation in ("float", float) else raw[key]
    for key in ("d_model", "n_heads", "n_layers", "vocab_size"):
        if key not in raw:
            raise CheckpointError(f"{path}: required key '{key}' is missing")
    for key in UNSUPPORTED_FLAGS:
        if raw.get(key):
            raise CheckpointError(f"{path}: key '{key}'={raw[key]!r} is not supported by the native LLaDA model")
    for key, allowed in SUPPORTED_VALUES.items():
        if key in raw and raw[key] not in allowed:
            raise CheckpointError(f"{path}: key '{key}'={raw[key]!r}; supported: {', '.join(allowed)}")
    cfg = LLaDAConfig(**kwargs)
    if cfg.d_model % cfg.n_heads or cfg.n_heads % cfg.kv_heads:
        raise CheckpointError(
            f"{path}: d_model {cfg.d_model} / n_heads {cfg.n_heads} / n_kv_heads {cfg.kv_heads} do not divide"
        )
    for key in ("mask_token_id", "eos_token_id"):
        value = getattr(cfg, key, None)
        if isinstance(value, int) and not 0 <= value < cfg.vocab_size:
            raise CheckpointError(f"{path}: key '{key}'={value} is outside the vocabulary (0..{cfg.vocab_size - 1})")
    if cfg.head_dim % 2:
        raise CheckpointError(f"{path}: head dimension {cfg.head_dim} must be even for RoPE")
    return cfg, raw


def weight_files(folder: Path) -> dict[str, Path]:
    """Map each tensor name to the safetensors file that holds it."""
    index = folder / SAFETENSORS_INDEX
    single = folder / SAFETENSORS_SINGLE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: expected a JSON object with 'weight_map' ({e})") from e
        return {name: folder / fname for name, fname in weight_map.items()}
    if single.is_file():
        return {}  # filled from the file header
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES) if folder.is_dir() else []
    if pickles:
        raise CheckpointError(f"{folder}: only pickle weights ({', '.join(pickles)}); unmask loads safetensors only")
    raise CheckpointError(f"{folder}: no {SAFETENSORS_SINGLE} and no {SAFETENSORS_INDEX}")


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Read every tensor of the checkpoint; a truncated or corrupt file is named in the error."""
    mapping = weight_files(folder)
    files = sorted(set(mapping.values())) if mapping else [folder / SAFETENSORS_SINGLE]
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        if not path.is_file():
            names = [n for n, p in mapping.items() if p == path]
            raise CheckpointError(f"{path}: missing shard (holds {names[0]} and {len(names) - 1} more)")
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    if mapping and mapping.get(name) != path:
                        continue
                    tensors[name] = f.get_tensor(name)
        except SafetensorError as e:
            raise CheckpointError(f"{path}: unreadable safetensors file ({e}); truncated or corrupt?") from e
    for name, path in mapping.items():
        if name not in tensors:
            raise CheckpointError(f"{path}: tensor '{name}' listed in {SAFETENSORS_INDEX} is not in the file")
    return tensors


def build_model(cfg: LLaDAConfig, tensors: dict[str, torch.Tensor], folder: Path, dtype: torch.dtype) -> LLaDAModelLM:
    """Check names and shapes against the architecture, then assign the tensors without copying twice."""
    with torch.device("meta"):
        model = LLaDAModelLM(cfg)
    expected = {name: tuple(p.shape) for name, p in model.state_dict().items()}
    for name, shape in expected.items():
        if name not in tensors:
            raise CheckpointError(f"{folder}: tensor '{name}' missing from the weights (expected shape {shape})")
        got = tuple(tensors[name].shape)
        if got != shape:
            raise CheckpointError(f"{folder}: tensor '{name}' has shape {got}, expected {shape}")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise CheckpointError(f"{folder}: unexpected tensor '{extra[0]}' ({len(extra)} in all); not a LLaDA layout?")
    model.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, assign=True, strict=True)
    return model.eval()


def read_card(folder: Path) -> dict[str, Any]:
    """The YAML header of MODEL_CARD.md or README.md (license and friends), plus the body text."""
    for name in ("MODEL_CARD.md", "README.md"):
        path = folder / name
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        card: dict[str, Any] = {"file": name, "text": text}
        if text.startswith("---"):
            end = text.find("\n---", 3)
            if end > 0:
                try:
                    header = load_yaml(text[3:end]) or {}
                except yaml.YAMLError as e:
                    raise CheckpointError(f"{path}: YAML header is malformed ({e})") from e
                if isinstance(header, dict):
                    card.update(header)
        return card
    return {}


def special_id(tokenizer: Tokenizer | None, names: tuple[str, ...]) -> int | None:
    if tokenizer is None:
        return None
    for name in names:
        tid = tokenizer.token_to_id(name)
        if tid is not None:
            return tid
    return None


def resolve_device(device: str) -> torch.device:
    """`device` as a torch device, or a ValueError that says why it cannot be used here."""
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"device {device!r}: {exc}") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            build = f"torch {torch.__version__}" + (", a CPU-only build" if torch.version.cuda is None else "")
            raise ValueError(f"device {device!r}: no CUDA device is visible to {build}")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    elif resolved.type != "cpu":
        raise ValueError(f"device {device!r}: models run on 'cpu' or 'cuda[:N]'")
    return resolved


def load_checkpoint(
    folder: Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> LoadedModel:
    """Load a LLaDA-layout folder (config.json, safetensors, tokenizer.json, card)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a directory")
    cfg, raw = read_config(folder)
    model = build_model(cfg, read_tensors(folder), folder, dtype).to(device)
    tok_path = folder / "tokenizer.json"
    tokenizer = None
    if tok_path.is_file():
        try:
            tokenizer = Tokenizer.from_file(str(tok_path))
        except Exception as e:  # the tokenizers library raises a bare Exception on bad JSON
            raise CheckpointError(f"{tok_path}: unreadable tokenizer ({e})") from e
    eot = raw.get("eot_token_id")
    if eot is None:
        eot = special_id(tokenizer, EOT_TOKENS)
    pad = raw.get("pad_token_id")
    if pad is None:
        pad = special_id(tokenizer, ("<|pad|>", "<pad>", "[PAD]"))
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        mask_id=cfg.mask_token_id,
        eos_id=cfg.eos_token_id,
        eot_id=eot,
        pad_id=pad if pad is not None else cfg.eos_token_id,
        path=folder,
        config=cfg,
        card=read_card(folder),
        model_id=folder.name,
    )


def save_checkpoint(
    model: LLaDAModelLM,
    folder: Path,
    *,
    max_shard_bytes: int | None = None,
    tokenizer: Tokenizer | None = None,
    extra_config: dict[str, Any] | None = None,
) -> Path:
    """Write `model` in the published LLaDA layout: config.json and safetensors (sharded when asked)."""
    from dataclasses import asdict

    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = asdict(model.config) | {"architectures": ["LLaDAModelLM"], "model_type": "llada"} | (extra_config or {})
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if max_shard_bytes is None:
        save_file(state, str(folder / SAFETENSORS_SINGLE), metadata={"format": "pt"})
    else:
        shards: list[dict[str, torch.Tensor]] = [{}]
        size = 0
        for name, t in state.items():
            nbytes = t.numel() * t.element_size()
            if shards[-1] and size + nbytes > max_shard_bytes:
                shards.append({})
                size = 0
            shards[-1][name] = t
            size += nbytes
        weight_map: dict[str, str] = {}
        for i, shard in enumerate(shards, 1):
            fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(folder / fname), metadata={"format": "pt"})
            weight_map |= {name: fname for name in shard}
        total = sum(t.numel() * t.element_size() for t in state.values())
        (folder / SAFETENSORS_INDEX).write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n"
        )
    if tokenizer is not None:
        tokenizer.save(str(folder / "tokenizer.json"))
    return folder
