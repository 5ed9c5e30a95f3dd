"""A registry holding the bundled tiny models, and a real uvicorn server over it on a free loopback port.

The registry is a real MLflow SQLite store filled by `registry.register_evidence` (the function
`unmask run` registers with), with evidence whose weights digest is the bundled folders' real one
and whose operating point is small enough for two cores: tiny-llada at 32 tokens in 16 steps.
`production` is given to tiny-llada the way a promotion's commit point sets it (one alias write).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.gate_fixtures import evidence, fresh_registry, record
from tests.support.servers import free_port, wait_healthy

OPERATING = {
    "tiny-llada": {
        "gen_length": 32,
        "block_length": 32,
        "steps": 16,
        "temperature": 0.0,
        "remasking": "low_confidence",
        "seed": 0,
    },
    "tiny-ar": {"gen_length": 32, "block_length": 32, "steps": 32, "temperature": 0.0, "seed": 0},
}
PROMPTS = [  # arith prompts of several lengths, so a batch needs left padding
    "A box has 10 cups. Tom adds 14. How many in the box?",
    "Mia has 37 pens and buys 45 more. How many now?",
    "Leo has 82 eggs and gives away 45. How many left?",
    "A box has 9 coins. Zoe takes 3. How many remain?",
]


def digest(name: str) -> str:
    from models.digest import weights_sha256
    from models.loading import resolve_model_path

    return weights_sha256(resolve_model_path(name))


@dataclass(frozen=True)
class ServingRegistry:
    tracking_uri: str
    versions: dict[str, str]  # registered model -> version


def serving_registry(folder: Path, weights: dict[str, str] | None = None) -> ServingRegistry:
    """tiny-ar (fallback) and tiny-llada (candidate, production) registered at their operating points."""
    from registry import register_evidence

    reg = fresh_registry(folder)
    versions, recs = {}, {}
    for name in ("tiny-ar", "tiny-llada"):
        sha = (weights or {}).get(name) or digest(name)
        recs[name] = rec = record(name, "arith", config=OPERATING[name], weights_sha256=sha)
        ev = evidence(name, [rec], weights_sha256=sha, serving=[], fallback=recs["tiny-ar"])
        versions[name], _ = register_evidence(reg, ev)
    # a settled, audited move (what a promotion ends in), so production has not drifted and can be rolled back
    from registry.promotion import _move

    _move(
        reg,
        "production",
        None,
        ("tiny-llada", versions["tiny-llada"]),
        "serving-fixture",
        "serving tests",
        {"kind": "promotion"},
    )
    return ServingRegistry(reg.tracking_uri, versions)


@dataclass
class RunningServer:
    base_url: str
    app: object
    server: object

    @property
    def pool(self):
        return self.app.state.pool


@contextlib.contextmanager
def running_server(settings, timeout_s: float = 120.0) -> Iterator[RunningServer]:
    """uvicorn serving `create_app(settings)` on 127.0.0.1 in a thread; stopped (and drained) on exit."""
    import uvicorn

    from serving import create_app

    app = create_app(settings)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="on")
    )
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), name="uvicorn-test", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"

    def gone() -> str | None:
        if app.state.pool.error:
            return f"server failed to load: {app.state.pool.error}"
        return None if thread.is_alive() else "the server thread stopped before it was healthy"

    try:
        wait_healthy(base + "/health", timeout_s=timeout_s, gone=gone)
        yield RunningServer(base, app, server)
    finally:
        server.should_exit = True
        thread.join(30)


@functools.lru_cache(maxsize=1)
def shared_serving_registry() -> ServingRegistry:
    """One registry per test process for the tests that only read it (building one costs seconds)."""
    root = Path(tempfile.mkdtemp(prefix="unmask-serving-"))
    atexit.register(shutil.rmtree, root, True)
    return serving_registry(root)


def settings_for(tracking_uri: str, names=("production", "fallback"), log_dir: Path | None = None, **pool):
    """ServeSettings over a test registry; `pool` overrides PoolSettings fields (max_batch, max_pending, ...)."""
    from serving import Limits, PoolSettings, ServeSettings

    options = {"poll_interval_s": 0.5, "batch_window_s": 0.02} | pool
    return ServeSettings(
        pool=PoolSettings(names=list(names), tracking_uri=tracking_uri, **options),
        limits=Limits(max_tokens=128, max_prompt_tokens=200, max_prompt_chars=2000),
        request_timeout_s=60.0,
        max_body_bytes=64_000,
        request_log_dir=log_dir,
    )


def openai_client(server):
    """The real `openai` client on a running server's /v1: no retries (a test sees each answer), 60 s per call."""
    import openai

    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)


def ext(response) -> dict:
    """The `unmask` object an answer carries (route, arm, version, config hash ...)."""
    return response.model_extra["unmask"]
