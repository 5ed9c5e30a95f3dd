"""On a lent GPU, in under 5 minutes: vanilla vs the fast configs of a LLaDA-8B-shaped model, tokens/s and MFU.

    bench/gpu.sh                      # on the GPU host: two random-weight models of LLaDA-8B's shape in bf16
    bench/gpu.sh --smoke              # the same code path on the CPU, a tiny shape
                                      # (tests/e2e/test_gpu_bench.py runs it)

The models are random-weight LLaDA-layout networks of LLaDA-8B's shape (models.random_weights.LLADA_8B),
built in memory on the device: a masked-diffusion one and its causal twin (the AR reference, KV-cached).
Each row is `unmask bench`'s own measurement (evals.bench: held-out arith prompts, median of 3 reps
after a warm-up, the device synchronised before the clock stops) at generation lengths 256 and 512.

Random weights are never confident, so a confidence rule (parallel threshold, early exit) decodes about
one token per step here; the rows `N per step` fix the parallelism instead (steps = gen_length / N), which
is what a trained model's parallel rule buys. Accuracy is not measured: the weights are random.

MFU, how it is estimated: a forward hook counts the positions each model call computes (batch x
sequence, whole canvases and cached blocks alike, the AR twin's one token a step included). Each
position costs 2 x P FLOPs, P the weights it is multiplied by (every parameter but the input embedding
and the norms, models.random_weights.matmul_parameters: 7.50e9 of LLaDA-8B's 8.02e9). Attention's score and
value products (4 x layers x d_model x keys per position: about 2% more at 512) are left out, so MFU is
a slight under-estimate. MFU = 2 x P x positions per pass / (median seconds per pass x peak), the peak
the device's dense bf16 tensor rate (H100/H200 989 TFLOPS; --peak-tflops for another device).

ONNX Runtime: a smaller random model (ORT_SHAPE, float32: its single-file export stays under protobuf's
2 GB) decodes the dual+parallel+exit row under torch and under `backend: onnxruntime`, whose session asks
for CUDAExecutionProvider first; the row names the provider that actually ran (onnxruntime falls back to
the CPU silently when onnxruntime-gpu or its CUDA libraries are missing: the summary says so).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# LLaDA-8B's head width at a tenth of its depth and width: about 170M parameters, 0.7 GB in float32
ORT_SHAPE = {
    "d_model": 1024,
    "n_heads": 8,
    "n_layers": 8,
    "mlp_hidden_size": 2816,
    "vocab_size": 32000,
    "rope_theta": 500000.0,
    "max_sequence_length": 4096,
}
PEAK_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.1, "L4": 121.0, "A10": 125.0}


def gpu_variants():
    from evals.bench import DUAL_PARALLEL, Variant

    return [
        Variant("vanilla"),
        Variant("4 per step", tokens_per_step=4),
        Variant("dual-cache", {"cache": "dual"}),
        Variant("dual-cache, 4 per step", {"cache": "dual"}, tokens_per_step=4),
        Variant("dual+parallel+exit", DUAL_PARALLEL | {"early_exit": "eos_decided"}),
        Variant("AR twin", kind="ar"),
    ]


def onnx_variants():
    from evals.bench import DUAL_PARALLEL, Variant

    fast = DUAL_PARALLEL | {"early_exit": "eos_decided"}
    return [
        Variant("torch, dual+parallel+exit", fast),
        Variant("onnxruntime, dual+parallel+exit", fast | {"backend": "onnxruntime"}),
    ]


def onnx_section(smoke: bool, device: str, gen_length: int, reps: int) -> dict:
    """The ONNX Runtime rows (torch beside it, same random model) and the provider that ran."""
    from evals.bench import BenchSetup, run_bench
    from models.random_weights import SMOKE, random_handle

    handle = random_handle(SMOKE if smoke else ORT_SHAPE, device, "float32", name="ort-random")
    setup = BenchSetup(
        gen_lengths=(gen_length,),
        block_length=min(32, gen_length),
        prompts=1,
        reps=reps,
        warmup=1,
        tasks=("arith",),
        batch_sizes=(1,),
    )
    report = run_bench(handle, setup, onnx_variants())
    rows = [
        {
            "config": r.config,
            "gen_length": r.gen_length,
            "tokens_per_s": r.tokens_per_s,
            "seconds": r.seconds,
            "provider": r.provider,
        }
        for r in report.rows
    ]
    ran = next((r["provider"] for r in rows if r["provider"]), None)
    return {
        "shape": "smoke" if smoke else "ORT_SHAPE",
        "rows": rows,
        "provider": ran,
        "cuda_provider_ran": ran == "CUDAExecutionProvider",
        "note": None
        if ran == "CUDAExecutionProvider" or device == "cpu"
        else f"onnxruntime ran on {ran}: install onnxruntime-gpu (make setup ONNX_FLAVOUR=gpu) for the CUDA provider",
    }


class PositionCounter:
    """Positions (batch x sequence) computed by a model's forward calls, read per finished bench pass."""

    def __init__(self, *models):
        self.total, self.last, self.per_pass = 0, 0, {}
        self.handles = [m.register_forward_pre_hook(self._count, with_kwargs=True) for m in models]

    def _count(self, module, args, kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        self.total += ids.numel()

    def tick(self, label: str) -> None:
        """`run_bench`'s tick: the positions of the pass just finished, kept for timed passes by row label."""
        done, self.last = self.total - self.last, self.total
        if label.startswith("rep "):
            self.per_pass.setdefault(label.split(" ", 2)[2], []).append(done)

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def peak_tflops(device: str, given: float | None) -> float | None:
    if given is not None:
        return given
    if device.startswith("cuda"):
        import torch

        name = torch.cuda.get_device_name(device)
        return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    return None


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny shape on the CPU in float32 (checks the path)")
    parser.add_argument("--gen-lengths", default=None, help="comma-separated (default 256,512; smoke 16,32)")
    parser.add_argument("--batch", default="1", help="comma-separated prompts per decode call (default 1)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's dense peak (default: by name)")
    parser.add_argument("--no-onnx", action="store_true", help="skip the ONNX Runtime rows")
    parser.add_argument("--out", type=Path, default=None, help="folder for gpu-bench.json (default $OUT, else temp)")
    args = parser.parse_args(argv)
    import torch

    from evals.bench import BenchSetup, run_bench
    from evals.bench_summary import report_lines
    from flows.commands.bench import render
    from flows.commands.table import table_console
    from models.random_weights import LLADA_8B, SMOKE, matmul_parameters, random_handle

    device, dtype = ("cpu", "float32") if args.smoke else ("cuda", "bfloat16")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here; run bench/gpu.sh --smoke on the CPU")
    lengths = tuple(int(n) for n in (args.gen_lengths or ("16,32" if args.smoke else "256,512")).split(","))
    batches = tuple(int(b) for b in args.batch.split(","))
    shape = SMOKE if args.smoke else LLADA_8B
    started = time.perf_counter()
    diffusion = random_handle(shape, device, dtype)
    ar = random_handle(shape, device, dtype, causal=True, name="llada-8b-random-ar")
    built = time.perf_counter() - started
    setup = BenchSetup(
        gen_lengths=lengths,
        block_length=min(32, *lengths),
        prompts=max(batches),
        reps=args.reps,
        warmup=args.warmup,
        threads=torch.get_num_threads(),
        tasks=("arith",),
        batch_sizes=batches,
    )
    counter = PositionCounter(diffusion.model, ar.model)
    try:
        report = run_bench(diffusion, setup, gpu_variants(), ar_loaded=ar, tick=counter.tick)
    finally:
        counter.close()
    peak = peak_tflops(device, args.peak_tflops)
    flops_per_position = 2 * matmul_parameters(diffusion.model)
    several = len(batches) > 1
    rows = []
    for r in report.rows:
        label = f"{r.config} @ {r.gen_length}" + (f" batch {r.batch}" if several else "")
        positions = sum(counter.per_pass[label]) / len(counter.per_pass[label])
        tflops = flops_per_position * positions / r.seconds / 1e12
        rows.append(
            {
                "config": r.config,
                "gen_length": r.gen_length,
                "batch": r.batch,
                "seconds": r.seconds,
                "tokens_per_s": r.tokens_per_s,
                "text_tokens_per_s": r.text_tokens_per_s,
                "tokens_per_forward": r.tokens_per_forward,
                "speedup_vs_vanilla": r.speedup_vs_vanilla,
                "positions_per_pass": positions,
                "achieved_tflops": tflops,
                "mfu": None if peak is None else tflops / peak,
                "peak_mem_mb": r.peak_mem_mb,
            }
        )
    console = table_console(220)
    console.print(render(report))
    for line in report_lines(report):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    console.print(
        f"{'config':<24} {'gen':>4} {'batch':>5} {'tokens/s':>10} {'positions/pass':>15} {'TFLOPS':>9} {'MFU':>7}",
        highlight=False,
    )
    for row in rows:
        mfu = "-" if row["mfu"] is None else f"{100 * row['mfu']:.1f}%"
        console.print(
            f"{row['config']:<24} {row['gen_length']:>4} {row['batch']:>5} {row['tokens_per_s']:>10.1f} "
            f"{row['positions_per_pass']:>15.0f} {row['achieved_tflops']:>9.3g} {mfu:>7}",
            highlight=False,
        )
    onnx = None if args.no_onnx else onnx_section(args.smoke, device, min(lengths), args.reps)
    for row in onnx["rows"] if onnx else ():
        console.print(
            f"{row['config']:<34} {row['gen_length']:>4} {row['tokens_per_s']:>10.1f} tokens/s "
            f"on {row['provider'] or device}",
            highlight=False,
        )
    if onnx and onnx["note"]:
        console.print(f"note: {onnx['note']}", highlight=False)
    summary = {
        "shape": "smoke" if args.smoke else "LLaDA-8B",
        "device": device,
        "dtype": dtype,
        "onnx": onnx,
        "device_name": torch.cuda.get_device_name(device) if device == "cuda" else "cpu",
        "peak_tflops": peak,
        "matmul_parameters": flops_per_position // 2,
        "build_s": round(built, 1),
        "total_s": round(time.perf_counter() - started, 1),
        "rows": rows,
        "bench": report.to_dict(),
        "mfu_estimate": "2 x matmul parameters x positions computed per pass (forward hook) / median seconds "
        "per pass / peak dense bf16 FLOPs; attention products left out",
    }
    out = args.out or Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="unmask-gpu-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-bench.json").write_text(json.dumps(summary, indent=2, default=str))
    console.print(
        f"built in {built:.0f} s, {summary['total_s']:.0f} s in all; wrote {out / 'gpu-bench.json'}", highlight=False
    )
    return summary


if __name__ == "__main__":
    main()
