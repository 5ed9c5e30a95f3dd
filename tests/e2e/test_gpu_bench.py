"""bench/gpu.sh --smoke: the GPU bench's whole path (random LLaDA-layout models built in memory, unmask bench's rows,
positions counted per pass, tokens/s and MFU, gpu-bench.json) on the CPU at a tiny shape. No speed is asserted."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.support import REPO

ROOT = REPO


def test_gpu_sh_smoke_runs_every_row_and_estimates_mfu_from_the_positions_it_counted(tmp_path):
    import sys

    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path))
    done = subprocess.run(
        [str(ROOT / "bench" / "gpu.sh"), "--smoke", "--gen-lengths", "16", "--warmup", "0", "--peak-tflops", "0.5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "gpu-bench.json").read_text())
    assert summary["shape"] == "smoke" and summary["device"] == "cpu" and summary["peak_tflops"] == 0.5
    rows = {r["config"]: r for r in summary["rows"]}
    assert set(rows) == {
        "vanilla",
        "4 per step",
        "dual-cache",
        "dual-cache, 4 per step",
        "dual+parallel+exit",
        "AR twin",
    }
    # vanilla computes the whole canvas (prompt + 16) at each of its 16 steps; 4 per step: a quarter of the calls
    canvas = rows["vanilla"]["positions_per_pass"] / 16
    assert canvas == int(canvas) > 16 and rows["4 per step"]["positions_per_pass"] == 4 * canvas
    # the AR twin: its prompt once, then one position per token it feeds back (at most 15 more)
    assert canvas - 16 < rows["AR twin"]["positions_per_pass"] <= canvas - 1
    assert rows["vanilla"]["tokens_per_forward"] == 1.0 and rows["4 per step"]["tokens_per_forward"] == 4.0
    for r in rows.values():
        flops = 2 * summary["matmul_parameters"] * r["positions_per_pass"] / r["seconds"]
        assert r["achieved_tflops"] == pytest.approx(flops / 1e12) and r["mfu"] == pytest.approx(flops / 0.5e12)
    assert "verdict gen 16: " in done.stdout and "MFU" in done.stdout
    onnx = summary["onnx"]  # the ONNX Runtime rows beside torch's, and the provider that ran (the CPU's here)
    assert [r["config"] for r in onnx["rows"]] == ["torch, dual+parallel+exit", "onnxruntime, dual+parallel+exit"]
    assert onnx["provider"] == "CPUExecutionProvider" and not onnx["cuda_provider_ran"]
    assert all(r["tokens_per_s"] > 0 for r in onnx["rows"])


def test_matmul_parameters_of_a_shape_counts_what_each_position_is_multiplied_by():
    from models.random_weights import SMOKE, matmul_parameters, random_llada

    model, _, _ = random_llada(SMOKE, "cpu", "float32")
    d, layers, hidden, vocab = SMOKE["d_model"], SMOKE["n_layers"], SMOKE["mlp_hidden_size"], model.config.output_size
    attention, mlp = 4 * d * d, 3 * d * hidden  # q, k, v, out; SwiGLU's gate, up, down
    head = vocab * d  # the output head (tied or not, every position is multiplied by it)
    assert matmul_parameters(model) == layers * (attention + mlp) + head
