"""Environment fingerprint: everything needed to re-run an eval record and expect the same tokens."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent


def package_version(name: str) -> str | None:
    """Installed distribution version, or None when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def git_commit(root: Path = REPO_ROOT) -> tuple[str | None, bool | None]:
    """(HEAD commit, whether tracked files differ from it) of the unmask checkout; (None, None) outside git."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode:
            return None, None
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return head.stdout.strip(), bool(status.stdout.strip()) if status.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None, None


def dataset_hash(items: Iterable[Any]) -> str:
    """sha256 over the items' canonical JSON (objects with `to_dict`, dicts, or plain values), in order."""
    h = hashlib.sha256()
    for item in items:
        value = item.to_dict() if hasattr(item, "to_dict") else item
        h.update(json.dumps(value, sort_keys=True, ensure_ascii=False, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()


def config_hash(config: Any) -> str:
    """A SamplerConfig's own hash, else sha256 of the canonical JSON of a dict."""
    if hasattr(config, "hash"):
        digest: str = config.hash()  # SamplerConfig.hash
        return digest
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def output_hash(token_rows: Iterable[Iterable[int] | None]) -> str:
    """sha256 over generated token ids, row by row in order; a failed row (None) hashes as `error`."""
    h = hashlib.sha256()
    for row in token_rows:
        h.update(b"error" if row is None else ",".join(str(int(t)) for t in row).encode())
        h.update(b"\n")
    return h.hexdigest()


def environment_fingerprint(device: str = "cpu", dtype: Any = "float32", **extra: Any) -> dict[str, Any]:
    """Versions, device, dtype, threads, determinism flags and the unmask commit, as plain JSON values.

    `extra` (weights_sha256, dataset_hash, config_hash, model path, ...) is merged in as given.
    """
    import torch

    commit, dirty = git_commit()
    fp: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "transformers": package_version("transformers"),
        "onnxruntime": package_version("onnxruntime") or package_version("onnxruntime-gpu"),
        "numpy": package_version("numpy"),
        "unmask": package_version("unmask"),
        "git_commit": commit,
        "git_dirty": dirty,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(0)
        if str(device).startswith("cuda") and torch.cuda.is_available()
        else platform.processor() or platform.machine(),
        "dtype": str(dtype).replace("torch.", ""),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "cpu_count": os.cpu_count(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda": torch.version.cuda,
        "env": {
            k: os.environ[k]
            for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG")
            if k in os.environ
        },
        "executable": sys.executable,
    }
    return fp | extra
