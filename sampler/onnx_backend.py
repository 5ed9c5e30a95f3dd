"""ONNX Runtime backend: the LLaDA denoiser exported with dynamic batch and sequence axes.

Two graphs, exported with the dynamo exporter (the legacy one bakes the sequence length in):
`full` maps (input_ids, attention_mask, position_ids) to logits and every layer's keys/values,
`cached` maps a window of tokens plus cached keys/values to the window's logits. The session
uses CUDAExecutionProvider when onnxruntime-gpu sees a GPU, else CPUExecutionProvider; the
provider that actually ran is reported, since onnxruntime falls back silently.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
import weakref
from typing import Any

import torch
from torch import nn

from models.llada import LLaDAOutput

_EXPORTED: weakref.WeakKeyDictionary[nn.Module, OnnxDenoiser] = weakref.WeakKeyDictionary()


class FullForward(nn.Module):
    """The graph run without a cache: logits and stacked keys/values `(layers, B, kv_heads, T, head_dim)`."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self.model(input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True)
        keys = torch.stack([k for k, _ in out.past_key_values])
        values = torch.stack([v for _, v in out.past_key_values])
        return out.logits, keys, values


class CachedForward(nn.Module):
    """The graph run on a window: its logits, given the other positions' cached keys/values."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        window_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_keys: torch.Tensor,
        past_values: torch.Tensor,
        past_mask: torch.Tensor,
    ) -> torch.Tensor:
        past = [(past_keys[i], past_values[i]) for i in range(past_keys.shape[0])]
        mask = torch.cat([past_mask, window_mask], dim=1)  # (B, S + T): cached keys first
        logits: torch.Tensor = self.model(
            input_ids, attention_mask=mask, position_ids=position_ids, past_key_values=past
        ).logits
        return logits


def pick_providers() -> list[str]:
    """CUDA first when onnxruntime offers it and a GPU is present, CPU always as the fallback."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    providers = ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in available and torch.cuda.is_available():
        providers.insert(0, "CUDAExecutionProvider")
    return providers


def export_graph(module: nn.Module, args: tuple[torch.Tensor, ...], dynamic: dict[str, dict[int, Any]]) -> bytes:
    """Serialized ONNX model of `module` traced on `args`, with the named axes left dynamic."""
    quiet = [
        logging.getLogger(name) for name in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript", "onnx_ir")
    ]
    levels = [logger.level for logger in quiet]
    try:
        for logger in quiet:
            logger.setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                module,
                args,
                dynamo=True,
                dynamic_shapes=dynamic,
                external_data=False,
                input_names=list(dynamic),
                verbose=False,
            )
    finally:
        for logger, level in zip(quiet, levels):
            logger.setLevel(level)
    assert program is not None, "dynamo=True always gives an ONNXProgram"
    buffer = io.BytesIO()
    # torch types `save`'s destination as a path, but with external_data=False it writes to a file object too
    program.save(buffer) if hasattr(program, "save") else buffer.write(  # type: ignore[arg-type]
        program.model_proto.SerializeToString()
    )
    return buffer.getvalue()


class OnnxDenoiser:
    """Callable like the torch model: `(input_ids, attention_mask=None, position_ids=None,
    past_key_values=None, use_cache=False) -> LLaDAOutput`, run by onnxruntime sessions."""

    def __init__(self, model: nn.Module, providers: list[str] | None = None):
        import onnxruntime as ort

        self.config = model.config
        self.providers = providers or pick_providers()
        self._ort = ort
        self._model = model
        self._full = self._session(self._export_full())
        self._cached: Any = None  # an InferenceSession, exported on first use: plain decoding never needs it
        self.provider = self._full.get_providers()[0]

    def _session(self, data: bytes) -> Any:  # an onnxruntime InferenceSession (onnxruntime ships no types)
        options = self._ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = torch.get_num_threads()
        return self._ort.InferenceSession(data, sess_options=options, providers=self.providers)

    def _example(self, B: int = 2, T: int = 7) -> tuple[torch.Tensor, ...]:
        ids = torch.zeros(B, T, dtype=torch.long)
        return ids, torch.ones(B, T, dtype=torch.long), torch.arange(T).expand(B, T).contiguous()

    def _export_full(self) -> bytes:
        batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
        axes = {0: batch, 1: seq}
        return export_graph(
            FullForward(self._model).eval(),
            self._example(),
            {"input_ids": axes, "attention_mask": axes, "position_ids": axes},
        )

    def _export_cached(self) -> bytes:
        batch, seq, past = torch.export.Dim("batch"), torch.export.Dim("seq"), torch.export.Dim("past")
        model: Any = self._model  # the native LLaDA module: `config` and `dtype` are its own, not nn.Module's
        cfg = model.config
        ids, mask, positions = self._example(2, 5)
        kv = torch.zeros(cfg.n_layers, 2, cfg.kv_heads, 9, cfg.head_dim, dtype=model.dtype)
        args = (ids, mask, positions, kv, kv.clone(), torch.ones(2, 9, dtype=torch.long))
        axes = {0: batch, 1: seq}
        dynamic = {
            "input_ids": axes,
            "window_mask": axes,
            "position_ids": axes,
            "past_keys": {1: batch, 3: past},
            "past_values": {1: batch, 3: past},
            "past_mask": {0: batch, 1: past},
        }
        return export_graph(CachedForward(self._model).eval(), args, dynamic)

    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        use_cache: bool = False,
    ) -> LLaDAOutput:
        B, T = input_ids.shape
        S = past_key_values[0][0].shape[2] if past_key_values else 0
        if attention_mask is None:
            attention_mask = torch.ones(B, S + T, dtype=torch.long)
        attention_mask = attention_mask.long()
        if position_ids is None:
            position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, S:]

        def np_(t: torch.Tensor) -> Any:
            return t.detach().cpu().contiguous().numpy()

        if not past_key_values:
            logits, keys, values = self._full.run(
                None,
                {"input_ids": np_(input_ids), "attention_mask": np_(attention_mask), "position_ids": np_(position_ids)},
            )
            kv = None
            if use_cache:
                keys, values = torch.from_numpy(keys), torch.from_numpy(values)
                kv = [(keys[i], values[i]) for i in range(keys.shape[0])]
            return LLaDAOutput(logits=torch.from_numpy(logits).to(input_ids.device), past_key_values=kv)
        if self._cached is None:
            self._cached = self._session(self._export_cached())
        (logits,) = self._cached.run(
            None,
            {
                "input_ids": np_(input_ids),
                "window_mask": np_(attention_mask[:, S:]),
                "position_ids": np_(position_ids),
                "past_keys": np_(torch.stack([k for k, _ in past_key_values])),
                "past_values": np_(torch.stack([v for _, v in past_key_values])),
                "past_mask": np_(attention_mask[:, :S]),
            },
        )
        return LLaDAOutput(logits=torch.from_numpy(logits).to(input_ids.device))


def onnx_denoiser(model: Any) -> OnnxDenoiser:
    """The ONNX Runtime twin of a torch LLaDA model, exported once per model object."""
    if isinstance(model, OnnxDenoiser):
        return model
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise ValueError(
            f"SamplerConfig.backend='onnxruntime' needs a native LLaDA torch module to export, got "
            f"{type(model).__name__}"
        )
    if model not in _EXPORTED:
        _EXPORTED[model] = OnnxDenoiser(model)
    return _EXPORTED[model]
