"""Dynamic batching on vs off, side by side in one run: throughput, latency and whether the answers agree.

    PYTHONPATH=. .venv/bin/python docs/experiments/serving-batching/bench.py --requests 32 --concurrency 16

For each served alias it starts `unmask serve`'s app twice on loopback (uvicorn in a thread): once with
batching off (`max_batch=1`) and once on (`max_batch=16`), sends the same arith prompts through the
`openai` async client at the given concurrency, and prints requests/s, answer tokens/s (tokens before
the first stop, so EOS padding does not count), p50/p95 latency, the mean batch size, and the share
of answers equal between the two runs. Without `--tracking-uri` it registers the bundled tiny models
(real `registry.register_evidence`) in a scratch SQLite store with tiny-llada holding `production`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
from pathlib import Path

OPERATING = {"tiny-llada": {"gen_length": 32, "block_length": 32, "steps": 16},
             "tiny-ar": {"gen_length": 32, "block_length": 32, "steps": 32}}


def scratch_registry(folder: Path) -> str:
    """tiny-ar (fallback) and tiny-llada (production) registered at OPERATING, with their real weights digests."""
    from evals.records import CandidateEvidence, EvalRecord
    from models.digest import weights_sha256
    from models.loading import resolve_model_path
    from registry import Registry, register_evidence
    from sampler.config import SamplerConfig

    reg = Registry(f"sqlite:///{folder / 'mlflow.db'}")
    versions = {}
    for name, kind, role in (("tiny-ar", "autoregressive", "fallback"), ("tiny-llada", "masked-diffusion", "candidate")):
        sha = weights_sha256(resolve_model_path(name))
        config = SamplerConfig(**OPERATING[name])
        record = EvalRecord(candidate=name, role=role, kind=kind, task="arith", split="test", config=config.to_dict(),
                            config_hash=config.hash(), gen_length=config.gen_length, n_items=1, accuracy=1.0,
                            valid=True, weights_sha256=sha)
        versions[name], _ = register_evidence(reg, CandidateEvidence(name, role, kind, [record], weights_sha256=sha))
    reg.client.set_registered_model_alias("tiny-llada", "production", versions["tiny-llada"])
    return reg.tracking_uri


class Server:
    """The app on a free loopback port, in a thread, until `stop()`."""

    def __init__(self, tracking_uri: str, alias: str, max_batch: int):
        import socket

        import uvicorn

        from serving import Limits, PoolSettings, ServeSettings, create_app

        self.app = create_app(ServeSettings(
            pool=PoolSettings(names=[alias], tracking_uri=tracking_uri, max_batch=max_batch, batch_window_s=0.02,
                              max_pending=1024), limits=Limits(), request_timeout_s=600))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True)
        self.thread.start()
        while not self.app.state.pool.ready:
            if self.app.state.pool.error:
                raise SystemExit(self.app.state.pool.error)
            time.sleep(0.1)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


async def load(port: int, alias: str, prompts: list[str], concurrency: int) -> dict:
    import openai

    gate = asyncio.Semaphore(concurrency)
    async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0,
                                  timeout=600) as client:
        async def one(prompt: str):
            async with gate:
                started = time.perf_counter()
                r = await client.completions.create(model=alias, prompt=prompt)
                return r, time.perf_counter() - started

        started = time.perf_counter()
        results = await asyncio.gather(*(one(p) for p in prompts))
        wall = time.perf_counter() - started
    latencies = sorted(t for _, t in results)
    return {"texts": [r.choices[0].text for r, _ in results], "wall": wall,
            "tokens": sum(r.usage.completion_tokens for r, _ in results), "model": results[0][0].model,
            "p50": statistics.median(latencies), "p95": latencies[max(0, round(0.95 * len(latencies)) - 1)],
            "batch": statistics.mean(r.model_extra["unmask"]["batch_size"] for r, _ in results)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--alias", action="append", help="served name; repeat (default: production, fallback)")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--tracking-uri", help="a registry to serve from (default: a scratch one, see above)")
    args = parser.parse_args()
    from rich.console import Console
    from rich.table import Table

    from evals.evaluate import load_task

    prompts = [item.prompt for item in load_task("arith", "test", args.requests).items]
    uri = args.tracking_uri or scratch_registry(Path(tempfile.mkdtemp(prefix="unmask-serving-bench-")))
    table = Table(title=f"{args.requests} arith prompts at concurrency {args.concurrency}")
    for column in ("alias", "model", "batching", "req/s", "tokens/s", "p50 s", "p95 s", "mean batch",
                   "same answers", "throughput on/off"):
        table.add_column(column, justify="left" if column in ("alias", "model", "batching") else "right")
    for alias in args.alias or ["production", "fallback"]:
        runs = {}
        for mode, max_batch in (("off", 1), ("on", args.max_batch)):
            server = Server(uri, alias, max_batch)
            try:
                runs[mode] = asyncio.run(load(server.port, alias, prompts, args.concurrency))
            finally:
                server.stop()
        same = sum(a == b for a, b in zip(runs["off"]["texts"], runs["on"]["texts"])) / len(prompts)
        ratio = runs["off"]["wall"] / runs["on"]["wall"]
        for mode, run in runs.items():
            table.add_row(alias, run["model"], f"{mode} (max {1 if mode == 'off' else args.max_batch})",
                          f"{len(prompts) / run['wall']:.2f}", f"{run['tokens'] / run['wall']:.1f}", f"{run['p50']:.3f}",
                          f"{run['p95']:.3f}", f"{run['batch']:.1f}", f"{same:.0%}", f"{ratio:.2f}x" if mode == "on" else "")
    Console(width=160).print(table)  # piped output keeps its columns


if __name__ == "__main__":
    main()
