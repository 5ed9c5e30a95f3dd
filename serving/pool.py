"""The served names and the versions behind them: load, check weights, warm, and follow alias moves.

Each served name (an alias or a registered model) routes to one loaded version. A version is loaded
once however many names point at it, and only after its folder hashes to the weights sha256 the
registry recorded for it; a host without the folder fetches the weights pushed to the registry
(registry/weights.py). Every `poll_interval_s` the pool re-reads who holds each name; a move
loads and warms the new version beside the old, then switches the route in one step on the event
loop. Requests already queued on the old version are answered by it (it drains), new ones go to
the new one, and nothing fails in between. A move that cannot be served (weights differ, load
fails) keeps the old route and is retried only when the holder changes again.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import models
from registry import serving as registry_serving
from registry.connection import RegistryError
from registry.serving import ServedVersion
from registry.store import Registry
from registry.weights import WeightsDiffer, served_weights
from sampler.config import SamplerConfig
from sampler.handle import Handle
from sampler.memory import available_bytes
from serving.batching import Batcher, decode_rows
from serving.chat import ChatTemplate, chat_template
from serving.decoding import SERVED_KINDS, ServedHandle, operating_config

log = logging.getLogger("unmask.serve")


class ServeError(RuntimeError):
    """A name that cannot be served; the message says which and why."""


class WeightsMismatch(ServeError):
    """The folder a version loads from is not the weights the registry recorded for it."""


@dataclass
class Loaded:
    """One version in memory: its handle, chat template, batcher, and the names routed to it."""

    key: tuple[str, str]  # (model, version)
    handle: ServedHandle
    chat: ChatTemplate
    batcher: Batcher
    context: int | None  # the model's longest sequence, when its config says
    names: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Route:
    """A served name: the version it points at, the loaded model, and its base decoding config."""

    name: str
    version: ServedVersion
    loaded: Loaded
    base: SamplerConfig
    base_source: str  # "operating point" or "catalog defaults"


def weights_ref(version: ServedVersion, sources: dict[str, str], registry: Registry | None) -> str:
    """What `version` loads from: its `--weights` folder (`sources`), else its source here, else the weights pushed
    to `registry`, fetched (`registry.weights.served_weights` decides); its refusals as the server's."""
    try:
        return served_weights(registry, version, sources.get(version.model))
    except WeightsDiffer as e:
        raise WeightsMismatch(str(e)) from None
    except RegistryError as e:
        raise ServeError(str(e)) from None


def load_checked(
    version: ServedVersion, sources: dict[str, str], device: str, dtype: str, registry: Registry | None = None
) -> ServedHandle:
    """The model handle of `version` from `weights_ref`, refused unless its weights hash to the recorded sha256."""
    ref = weights_ref(version, sources, registry)
    try:
        handle: ServedHandle = models.load(ref, device=device, dtype=dtype)
    except (models.CheckpointError, ValueError) as e:
        raise ServeError(f"{version.ref} ({version.name}): cannot load {ref!r}: {e}") from None
    if handle.kind not in SERVED_KINDS:
        raise ServeError(f"{version.ref}: kind {handle.kind!r} is not served yet (served: {', '.join(SERVED_KINDS)})")
    if handle.weights_sha256 != version.weights_sha256:
        raise WeightsMismatch(
            f"refusing to serve {version.ref} ({version.name}) from {handle.path}: its weights hash to "
            f"{handle.weights_sha256 or 'nothing'} but the registry recorded {version.weights_sha256} for that "
            "version. "
            f"Serve the folder that was evaluated (--weights {version.model}=FOLDER), push it to the registry "
            f"(`unmask weights push {version.model} {version.version} --from FOLDER`), or register these weights."
        )
    return handle


def warm(handle: Handle, config: SamplerConfig) -> None:
    """One decode at the operating point, so the first request does not pay for lazy initialisation."""
    prompt = handle.encode("1 + 1") or [handle.eos_id or 0]
    decode_rows(handle, config, [prompt])


@dataclass
class PoolSettings:
    names: list[str]
    tracking_uri: str | None = None
    sources: dict[str, str] = field(default_factory=dict)  # registered model -> folder, overriding its `unmask.model`
    device: str = "cpu"
    dtype: str = "float32"
    poll_interval_s: float = 5.0
    max_batch: int = 16
    batch_window_s: float = 0.01
    max_pending: int = 64
    # deterministic masked-diffusion rows join a running batch at block boundaries; None: on a GPU only (on a CPU
    # the forward is compute bound, and the padding that aligns rows at different blocks costs its full price)
    continuous: bool | None = None
    memory_budget: int | None = None  # bytes a batch's decode may use at its peak; None: what the device has free


class ModelPool:
    """Routes from served names to loaded versions; `start()` loads them, `follow()` tracks alias moves."""

    def __init__(self, settings: PoolSettings, metrics: Any):
        self.settings, self.metrics = settings, metrics
        self.routes: dict[str, Route] = {}
        self.loaded: dict[tuple[str, str], Loaded] = {}
        self.ready = False
        self.error: str | None = None
        self.registry: Registry | None = None
        self._refused: dict[str, tuple[str, str]] = {}  # name -> holder we could not serve; not retried
        self._orphaned: set[str] = set()  # names whose alias nobody holds any more (the last version serves on)
        self._draining: set[asyncio.Task[None]] = set()
        # Every torch call of the pool (loading, warm-up, each version's batches) runs on this one thread: each
        # thread that runs a parallel torch op keeps its own OpenMP team, and on two cores two teams slow every
        # decode 1.5-4.5x even while one of them idles (docs/experiments/serving-batching, "one compute thread").
        self.compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="unmask-compute")
        metrics.expose_gateway_load(self.gateway_load)
        self._poll_problem: str | None = None

    # resolving ---------------------------------------------------------------------------------
    def route(self, name: str) -> Route:
        """The route of a served name, or of a registered model one of them points at."""
        if name in self.routes:
            return self.routes[name]
        for route in self.routes.values():
            if route.version.model == name:
                return route
        raise KeyError(name)

    def served(self) -> list[str]:
        return list(self.routes)

    # loading -----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load and warm every name that has a holder; at least one must. Sets `ready` or `error`."""
        try:
            self.registry = await asyncio.to_thread(Registry, self.settings.tracking_uri)
            held = await asyncio.to_thread(registry_serving.holders, self.registry, self.settings.names)
            empty = [n for n, h in held.items() if h is None]
            for name in empty:
                log.warning("nobody holds %r yet; it is served once an alias move gives it a version", name)
            if len(empty) == len(held):
                raise ServeError(
                    f"none of {', '.join(self.settings.names)} has a version in {self.registry.tracking_uri}"
                )
            for name, at in held.items():
                if at is not None:
                    await self._point(name, at)
            self.ready = True
            log.info("ready: %s", ", ".join(f"{n} -> {r.version.ref}" for n, r in self.routes.items()))
        except (ServeError, RegistryError) as e:
            self.error = str(e)
            log.error("%s", e)
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"
            log.error("cannot start serving: %s", self.error)

    async def _point(self, name: str, at: tuple[str, str]) -> None:
        """Route `name` to the version `at`, loading it first unless it is loaded already."""
        assert self.registry is not None, "start() opens the registry before any name is routed"
        version = await asyncio.to_thread(registry_serving.served_version, self.registry, name, at)
        loaded = self.loaded.get(at)
        loop = asyncio.get_running_loop()
        if loaded is None:
            # fetching pushed weights is network and disk work: not on the compute thread, which decodes meanwhile
            ref = await asyncio.to_thread(weights_ref, version, self.settings.sources, self.registry)
            s = self.settings
            handle = await loop.run_in_executor(
                self.compute, load_checked, version, {version.model: ref}, s.device, s.dtype
            )
        else:
            handle = loaded.handle
        try:
            base, source = operating_config(handle, version.operating_config)
        except ValueError as e:
            raise ServeError(f"{version.ref} ({name}): {e}") from None
        if loaded is None:
            try:
                await loop.run_in_executor(self.compute, warm, handle, base)
            except Exception as e:
                raise ServeError(f"{version.ref} ({name}): warm-up decode failed: {type(e).__name__}: {e}") from None
            loaded = self._admit(at, handle)
        previous = self.routes.get(name)
        loaded.names.add(name)
        self.routes[name] = Route(name, version, loaded, base, source)  # the switch: one assignment on the loop
        self.metrics.served.labels(name, version.model, version.version, version.weights_sha256).set(1)
        if previous is not None and previous.loaded is not loaded:
            old = previous.version
            self.metrics.served.labels(name, old.model, old.version, old.weights_sha256).set(0)
            self._release(previous.loaded, name)

    def gateway_load(self) -> list[tuple[str, int, int, int]]:
        """(served name, waiting, running, max batch) of each route: the gauges a gateway's endpoint picker reads."""
        return [
            (name, r.loaded.batcher.load - r.loaded.batcher.running, r.loaded.batcher.running, self.settings.max_batch)
            for name, r in list(self.routes.items())
        ]

    def _admit(self, key: tuple[str, str], handle: ServedHandle) -> Loaded:
        s, (model, version) = self.settings, key
        depth = self.metrics.queue_depth.labels(model, version)
        batches = (self.metrics.batch_size.labels(model, version), self.metrics.batches.labels(model, version))

        def on_batch(size: int) -> None:
            batches[0].observe(size)
            batches[1].inc()

        budget = s.memory_budget or available_bytes(s.device)  # measured once the weights are resident
        batcher = Batcher(
            handle,
            max_batch=s.max_batch,
            window_s=s.batch_window_s,
            max_pending=s.max_pending,
            on_batch=on_batch,
            on_depth=depth.set,
            name=f"{model}-{version}",
            memory_budget=budget,
            continuous=s.device != "cpu" if s.continuous is None else s.continuous,
            executor=self.compute,
        )
        loaded = Loaded(key, handle, chat_template(handle.path), batcher, handle.context_length)
        self.loaded[key] = loaded
        return loaded

    def _release(self, loaded: Loaded, name: str) -> None:
        loaded.names.discard(name)
        if loaded.names:
            return
        del self.loaded[loaded.key]
        task = asyncio.get_running_loop().create_task(loaded.batcher.drain())
        self._draining.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._draining.discard)
        log.info("%s/%s drains its queue and unloads", *loaded.key)

    # following alias moves ----------------------------------------------------------------------
    async def follow(self) -> None:
        """Poll the registry until cancelled; each move is picked up within one interval."""
        while True:
            await asyncio.sleep(self.settings.poll_interval_s)
            try:
                await self.poll_once()
                self._poll_problem = None
            except Exception as e:
                problem = f"{type(e).__name__}: {e}"
                if problem != self._poll_problem:  # once per distinct problem, not once per poll
                    log.warning("registry poll failed (%s); still serving the last versions", problem)
                self._poll_problem = problem

    async def poll_once(self) -> list[str]:
        """Re-read every name's holder and move the routes that changed; returns the names that moved."""
        assert self.registry is not None, "polled only after start() opened the registry"
        held = await asyncio.to_thread(registry_serving.holders, self.registry, self.settings.names)
        moved = []
        for name, at in held.items():
            current = self.routes.get(name)
            if at is None:
                if current is not None and name not in self._orphaned:  # say it once, not once a poll
                    self._orphaned.add(name)
                    log.warning(
                        "nobody holds %r any more; still serving %s until a version does", name, current.version.ref
                    )
                continue
            self._orphaned.discard(name)
            if current is not None and (current.version.model, current.version.version) == at:
                continue
            if self._refused.get(name) == at:
                continue
            try:
                await self._point(name, at)
            except (ServeError, RegistryError) as e:
                self._refused[name] = at
                self.metrics.swap_failures.labels(name).inc()
                log.error("%s moved to %s/%s, which is not served: %s", name, *at, e)
                continue
            self._refused.pop(name, None)
            self.metrics.swaps.labels(name).inc()
            moved.append(name)
            log.info("%s now -> %s/%s", name, *at)
        return moved

    async def close(self) -> None:
        for loaded in list(self.loaded.values()):
            await loaded.batcher.drain()
        if self._draining:
            await asyncio.gather(*self._draining, return_exceptions=True)
        self.compute.shutdown(wait=True)
