"""Dream: unmask's native Dream network (models/dream.py) behind the model handle, no remote code.

The published folder loads as it is: config.json with model_type "Dream", safetensors named as Qwen2's
(``model.embed_tokens``, ``model.layers.N.self_attn.{q,k,v,o}_proj``, ``model.layers.N.mlp.*``,
``model.norm``, ``lm_head``), tokenizer.json. The handle's network is the `DreamDenoiser`, whose logits are
aligned to positions, so the masked-diffusion sampler decodes Dream as it decodes LLaDA; Dream's own
decode is one block with ``parallel="timesteps"``, or ``parallel="ancestral"`` for its ``origin`` algorithm
(see sampler/commit.py and `dream_settings`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch

from models.adapters.base import AdapterError, ModelHandle, read_json, read_tokenizer, require_safetensors
from models.checkpoint import EOT_TOKENS, SAFETENSORS_SINGLE, CheckpointError, read_tensors, special_id
from models.dream import DreamConfig, DreamDenoiser, DreamModel

MODEL_TYPE = "Dream"
REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
# config.json keys whose other values the native model does not compute: refused, never ignored
SUPPORTED = {"hidden_act": ("silu",), "use_sliding_window": (False, None), "rope_scaling": (None,)}


# Dream's `diffusion_generate(alg=...)` -> the commit rule and remasking policy that decode as it does. `origin` is
# the reverse process (`ancestral`: each mask revealed at random with the step's probability, its token drawn after);
# the others commit the masks their confidence ranks first, on Dream's time grid.
ALGORITHMS: dict[str, dict[str, str]] = {
    "origin": {"parallel": "ancestral"},
    "maskgit_plus": {"parallel": "timesteps", "remasking": "low_confidence"},
    "topk_margin": {"parallel": "timesteps", "remasking": "margin"},
    "entropy": {"parallel": "timesteps", "remasking": "neg_entropy"},
}
# Those whose draws at temperature > 0 the sampler makes as Dream makes them. The others, sampling, score each drawn
# token on the tempered distribution after a categorical draw over every mask, which the sampler does not reproduce.
SAMPLED = ("origin",)


def dream_settings(
    alg: str, gen_length: int, steps: int, top_k: int | None = None, temperature: float = 0.0
) -> dict[str, Any]:
    """The SamplerConfig settings that decode as Dream's `diffusion_generate(alg=alg, temperature=temperature,
    max_new_tokens=gen_length, steps=steps, top_k=top_k)`: one block, Dream's time grid. Where the decode draws
    (`origin`), SamplerConfig.seed = s draws what Dream draws after `torch.manual_seed(s)` (on the CPU)."""
    if alg not in ALGORITHMS:
        raise ValueError(f"Dream algorithm {alg!r}; unmask decodes {', '.join(ALGORITHMS)}")
    if temperature and alg not in SAMPLED:
        raise ValueError(
            f"Dream algorithm {alg!r} at temperature {temperature!r}: unmask decodes it as Dream does at temperature 0 "
            f"only; sampled, only {', '.join(SAMPLED)}"
        )
    return {
        "gen_length": gen_length,
        "block_length": gen_length,
        "steps": steps,
        **ALGORITHMS[alg],
        "temperature": temperature,
        "top_k": top_k or 0,
    }


def read_dream_config(folder: Path) -> DreamConfig:
    """The DreamConfig of `folder/config.json`; AdapterError names the key that does not fit."""
    path = folder / "config.json"
    raw = read_json(path)
    if raw.get("model_type") != MODEL_TYPE:
        raise AdapterError(f"{path}: model_type is {raw.get('model_type')!r}, expected {MODEL_TYPE!r}")
    for key in REQUIRED:
        if key not in raw:
            raise AdapterError(f"{path}: required key '{key}' is missing")
    for key, allowed in SUPPORTED.items():
        if raw.get(key) not in allowed:
            raise AdapterError(f"{path}: key '{key}'={raw[key]!r} is not supported by the native Dream model")
    kwargs: dict[str, Any] = {}
    for f in fields(DreamConfig):
        if raw.get(f.name) is None:
            continue
        value = raw[f.name]
        want = bool if f.name == "tie_word_embeddings" else float if f.name in ("rms_norm_eps", "rope_theta") else int
        ok = (
            isinstance(value, bool) if want is bool else isinstance(value, (int, float)) and not isinstance(value, bool)
        )
        if not ok or (want is int and not isinstance(value, int)):
            raise AdapterError(f"{path}: key '{f.name}' must be {want.__name__}, got {value!r}")
        kwargs[f.name] = want(value)
    cfg = DreamConfig(**kwargs)
    kv = cfg.num_key_value_heads
    if cfg.hidden_size % cfg.num_attention_heads or cfg.num_attention_heads % kv or cfg.head_dim % 2:
        raise AdapterError(
            f"{path}: hidden_size {cfg.hidden_size} / num_attention_heads {cfg.num_attention_heads} / "
            f"num_key_value_heads {kv} do not give an even head dimension shared by whole groups"
        )
    if not 0 <= cfg.mask_token_id < cfg.vocab_size:
        raise AdapterError(f"{path}: key 'mask_token_id'={cfg.mask_token_id} is outside the vocabulary")
    return cfg


def build_dream(cfg: DreamConfig, tensors: dict[str, torch.Tensor], folder: Path, dtype: torch.dtype) -> DreamModel:
    """Check every tensor's name and shape against the architecture, then assign them (no second copy)."""
    with torch.device("meta"):
        model = DreamModel(cfg)
    expected = {name: tuple(p.shape) for name, p in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        tensors = {k: v for k, v in tensors.items() if k != "lm_head.weight"}  # a tied copy some exports keep
    for name, shape in expected.items():
        if name not in tensors:
            raise AdapterError(f"{folder}: tensor '{name}' missing from the weights (expected shape {shape})")
        if tuple(tensors[name].shape) != shape:
            raise AdapterError(f"{folder}: tensor '{name}' has shape {tuple(tensors[name].shape)}, expected {shape}")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise AdapterError(f"{folder}: unexpected tensor '{extra[0]}' ({len(extra)} in all); not a Dream layout?")
    model.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, assign=True, strict=True)
    return model.eval()


class DreamAdapter(ModelHandle):
    """A Dream checkpoint: the aligned-logits denoiser for unmask's masked-diffusion sampler."""

    kind = "masked-diffusion"

    def __init__(
        self,
        network: DreamModel,
        tokenizer: Any = None,
        defaults: dict[str, Any] | None = None,
        path: Path | None = None,
        entry_id: str = "",
    ):
        cfg = network.config
        self.model, self.tokenizer, self.path = DreamDenoiser(network), tokenizer, path
        self.config = cfg
        self.entry_id = entry_id or (path.name if path else "dream")
        self.defaults = dict(defaults or {})
        self.mask_id = int(self.defaults.get("mask_id", cfg.mask_token_id))
        eos = int(self.defaults.get("eos_id", cfg.eos_token_id))
        eot = self.defaults.get("eot_id", special_id(tokenizer, EOT_TOKENS))
        self.eos_ids = (eos,) if eot is None or eot == eos else (eos, int(eot))
        self.pad_id = int(self.defaults.get("pad_id", cfg.pad_token_id))
        self._read_card()

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
    ) -> DreamAdapter:
        folder = Path(folder)
        cfg = read_dream_config(folder)
        require_safetensors(folder)
        try:
            tensors = read_tensors(folder)
        except CheckpointError as e:
            raise AdapterError(str(e)) from None
        network = build_dream(cfg, tensors, folder, dtype).to(device)
        return cls(network, read_tokenizer(folder), defaults, folder, entry_id)


def save_dream(network: DreamModel, folder: Path, extra_config: dict[str, Any] | None = None) -> Path:
    """Write `network` in Dream's published layout: config.json (model_type "Dream") and model.safetensors."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["DreamModel"], "model_type": MODEL_TYPE} | asdict(network.config)
    config |= {"hidden_act": "silu", "rope_scaling": None, "use_sliding_window": False} | (extra_config or {})
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in network.state_dict().items()}
    save_file(state, str(folder / SAFETENSORS_SINGLE), metadata={"format": "pt"})
    return folder
