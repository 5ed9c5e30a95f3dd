"""On a lent GPU: `unmask serve` over a random-weight model of LLaDA-8B's shape in bf16, tokens/s at 1 and 16 in flight,
with static batches and with rows joining a running batch at every block.

    python3 docs/experiments/serving-batching/gpu.py              # on the GPU host: about 16 GB of weights
    .venv/bin/python docs/experiments/serving-batching/gpu.py --smoke   # the same path on the CPU, a tiny shape

The model has LLaDA-8B's shape (32 layers, d_model 4096, 32 heads, SwiGLU 12288, vocabulary 126464,
RoPE theta 500000) with random weights, and the bundled tiny tokenizer (ids it does not know decode
to nothing; the throughput is counted in tokens from `usage.completion_tokens`). The script writes the
checkpoint (safetensors shards), registers it in a scratch SQLite registry (real `register_evidence`,
its real weights digest), serves it with `unmask loadtest`'s own local server (`unmask serve`'s app
on a free loopback port, dynamic batching up to 16) and loads it with `evals.loadtest` at
concurrency 1 and 16, twice: with static batches (`--static-batches`: a batch runs start to finish) and
with continuous batching (the default: a request joins the running batch at its next block; GEN has
four blocks), and a third time at a dual-cache threshold point whose refreshes recompute only from the cached
block on (SPAN, registered under a second name over the same weights; static batches). The table and
`gpu-loadtest.json` land in --out (default $OUT, else a temp folder).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

NAME = "llada-8b-random"
# the policy's operating point length, in four blocks so that a request can join a running batch mid-answer
GEN = {"gen_length": 32, "block_length": 8, "steps": 32}
# the same weights registered a second time at a cached operating point whose refreshes recompute only from the
# cached block on (sampler/cache.py SinceCachedBlock; it batches statically: a span row never joins a running batch)
SPAN_NAME, SPAN = f"{NAME}-span", GEN | {"cache": "dual", "parallel": "threshold", "parallel_threshold": 0.9,
                                        "refresh_span": "from_cached_block"}
MODES = {"static": (NAME, False), "continuous": (NAME, True), "static, dual cache + span": (SPAN_NAME, False)}


def build(folder: Path, shape: dict, device: str, dtype: str) -> Path:
    """A random-weight LLaDA-layout checkpoint of `shape`, initialised on `device` in `dtype`, saved as shards."""
    from models.random_weights import write_random_llada

    return write_random_llada(folder, shape, device, dtype)


def register(folder: Path, registry_dir: Path) -> str:
    """The checkpoint registered as NAME (candidate) at the GEN operating point and as SPAN_NAME at SPAN; returns the
    tracking URI."""
    from evals.records import CandidateEvidence, EvalRecord
    from models.digest import weights_sha256
    from registry import Registry, register_evidence
    from sampler.config import SamplerConfig

    config = json.loads((folder / "config.json").read_text())
    sha = weights_sha256(folder)
    reg = Registry(f"sqlite:///{registry_dir / 'mlflow.db'}")
    for name, point in ((NAME, GEN), (SPAN_NAME, SPAN)):
        sampler = SamplerConfig(**point, mask_id=config["mask_token_id"], eos_id=config["eos_token_id"],
                                eot_id=config["eot_token_id"])
        record = EvalRecord(candidate=name, role="candidate", kind="masked-diffusion", task="arith", split="test",
                            config=sampler.to_dict(), config_hash=sampler.hash(), gen_length=point["gen_length"],
                            n_items=1, accuracy=0.0, valid=True, weights_sha256=sha)
        register_evidence(reg, CandidateEvidence(name, "candidate", "masked-diffusion", [record], weights_sha256=sha))
    return reg.tracking_uri


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny shape on the CPU in float32 (checks the path)")
    parser.add_argument("--requests", type=int, default=None, help="requests per level (default 32, smoke 4)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import torch

    from evals.loadtest import LoadSpec, run_load, serving_records
    from evals.fingerprint import environment_fingerprint
    from flows.commands.loadtest import local_server, results_table
    from flows.commands.table import table_console

    device, dtype = ("cpu", "float32") if args.smoke else ("cuda", "bfloat16")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here; run with --smoke on the CPU")
    requests = args.requests or (4 if args.smoke else 32)
    out = args.out or Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="unmask-gpu-serve-"))
    work = Path(tempfile.mkdtemp(prefix="unmask-gpu-serve-work-"))
    try:
        started = time.perf_counter()
        from models.random_weights import LLADA_8B, SMOKE

        folder = build(work / NAME, SMOKE if args.smoke else LLADA_8B, device, dtype)
        built = time.perf_counter() - started
        uri = register(folder, work)
        registered = time.perf_counter() - started - built
        from evals.evaluate import load_task

        prompts = [item.prompt for item in load_task("arith", "test", requests).items]
        fingerprint = environment_fingerprint(device, dtype, shape="smoke" if args.smoke else "LLaDA-8B")
        console, summary = table_console(200), {"shape": "smoke" if args.smoke else "LLaDA-8B", "device": device,
                                                "dtype": dtype, "build_s": round(built, 1),
                                                "register_s": round(registered, 1), "modes": {}}
        for mode, (name, continuous) in MODES.items():
            with local_server([name], uri, sources={name: str(folder)}, device=device, dtype=dtype, max_batch=16,
                              max_tokens=GEN["gen_length"], continuous=continuous) as server:
                spec = LoadSpec(base_url=server.url, models=(name,), concurrency=(1, 16), requests=requests,
                                max_tokens=GEN["gen_length"], timeout_s=600)
                result = run_load(spec, prompts)
            records = serving_records(result, fingerprint)
            console.print(f"{mode} batching", highlight=False)
            console.print(results_table(result, records))
            for note in result.notes:
                console.print(f"note: {note}", highlight=False, markup=False)
            solo, sixteen = records[0], records[-1]
            ratio = sixteen.tokens_per_s / solo.tokens_per_s if solo.tokens_per_s and sixteen.tokens_per_s else None
            summary["modes"][mode] = {"tokens_per_s": {str(r.concurrency): r.tokens_per_s for r in records},
                                      "ratio_16_vs_1": ratio, "same_answer_share_16": sixteen.same_answer_share,
                                      "errors": {str(r.concurrency): r.error_rate for r in records},
                                      "records": [r.to_dict() for r in records], "notes": result.notes}
        static, running, span = (summary["modes"][m]["tokens_per_s"]["16"] for m in MODES)
        summary["continuous_vs_static_16"] = running / static if static and running else None
        summary["span_vs_static_16"] = span / static if static and span else None
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu-loadtest.json").write_text(json.dumps(summary, indent=2))
        for mode, row in summary["modes"].items():
            print(f"{mode}: tokens/s at 1: {row['tokens_per_s']['1']}, at 16: {row['tokens_per_s']['16']} "
                  f"(x{row['ratio_16_vs_1']}); same answers at 16: {row['same_answer_share_16']}")
        print(f"continuous / static at 16: {summary['continuous_vs_static_16']}; dual cache + span / static at 16: "
              f"{summary['span_vs_static_16']}; build {built:.0f} s; "
              f"written {out / 'gpu-loadtest.json'}")
        return summary
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
