"""Dynamic batching: concurrent requests to one loaded version, decoded together when that cannot change them.

Each loaded version has one `Batcher`: a bounded queue and one worker task on the server's event
loop. The worker takes the oldest request, waits up to `window_s` (from that request's arrival) for
more with the same batch key (`serving.decoding.batch_key`: the same effective SamplerConfig, and a
deterministic one or, for sampled decoding, one that differs only in its seed: each row then gets
its own generator, seeded by its request), left-pads up to `max_batch` prompts and decodes them in the version's own
thread. The sampler is batch invariant under left padding, so each row is what it would have been
alone; a request whose key is None (sampled decoding) always decodes alone.

While a batch decodes, the sampler's `on_step` reports each step: the worker notes when each row's
first block was final, hands a streamed request its row's newly final tokens (`Job.on_tokens`, on
the event loop), and stops the decode once every request of the batch is gone (hung up, timed out).

A deterministic masked-diffusion request instead joins a running batch (`sampler.continuous`): the
worker decodes one block at a time over the rows running, and between two blocks a finished row
(its last block, early exit, EOS padding decided) is answered and leaves while queued requests of the
same key join, oldest first, as long as the oldest queued request is one of them (a request of another
key waits for the running rows to finish, never longer). Requests that differ only in their length
(`max_tokens`) share a running batch. Each row still decodes as it would alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar, TypeVarTuple

import torch

from registry.clock import SYSTEM_CLOCK, Clock
from sampler.config import SamplerConfig
from sampler.continuous import Row, decode_block, joins_running_batch, running_key
from sampler.decode import batch_row_seeds, decode_prompts, padding_id
from sampler.handle import Handle
from sampler.likelihood import CommitLogprobs
from sampler.output import FinalPrefix, StepCallback, StepInfo

log = logging.getLogger("unmask.serve")
# How long a request seen arriving while another was queued or decoding keeps the batching window open: an
# idle server, or one whose clients send one request at a time, does not make a request wait for company.
COMPANY_MEMORY_S = 1.0
# The window closes early once no request has arrived for this share of it: a burst of clients has arrived
# by then, and waiting out the rest would only add latency (two closed-loop clients: 1439 -> 2221 tokens/s).
QUIET_SHARE = 0.25

T = TypeVar("T")
Ts = TypeVarTuple("Ts")
Scored = tuple[float | None, dict[int, float]]  # a token's log-probability (None: not committed) and alternatives
OnTokens = Callable[[list[int], list[Scored] | None], None]  # a stream's newly final tokens and, if asked, scores


class QueueFull(RuntimeError):
    """The version's queue holds `max_pending` requests already; the client should retry later."""


class Draining(RuntimeError):
    """The version stopped taking requests (an alias moved away from it); resolve the name again."""


class Abandoned(RuntimeError):
    """Raised from `on_step` to stop a batch whose every request is gone: nobody reads its rows."""


@dataclass
class Job:
    prompt_ids: list[int]
    config: SamplerConfig
    key: str | None  # None: decode alone
    future: asyncio.Future[Decoded]
    arrived: float  # monotonic time it was queued (the batcher's clock)
    on_tokens: OnTokens | None = None  # streamed: hears its newly final tokens (and their scores), on the loop
    first_block: float | None = None  # monotonic time its first block (AR: token) was final
    logprobs: int | None = None  # wants each generated token's log-probability and this many alternatives
    peak: int = 0  # bytes its row needs at the decode's peak (sampler/memory.py), at its own prompt length
    started: float | None = None  # monotonic time its first block (a running batch) began
    sent: int = 0  # generated ids handed to `on_tokens` so far (a running batch)
    client: str = ""  # who asked (serving.local.client_of): admission is fair between clients


@dataclass(frozen=True)
class Decoded:
    """One request's share of a batch: its generated ids `(gen_length,)` and what the batch cost."""

    generated: list[int]
    nfe: int
    batch_size: int
    queue_s: float
    decode_s: float
    first_block_s: float | None = None  # from arrival until its first block (AR: first token) was final
    # per generated position: (log-probability at the step that committed it, or None; {top id: log-probability}),
    # when the request asked for log-probabilities (sampler.likelihood.CommitLogprobs)
    logprobs: list[tuple[float | None, dict[int, float]]] | None = None


def decode_rows(
    handle: Handle,
    config: SamplerConfig,
    prompts: list[list[int]],
    on_step: StepCallback | None = None,
    row_seeds: list[int] | None = None,
    logprobs: CommitLogprobs | None = None,
) -> tuple[list[list[int]], int]:
    """`decode_prompts` in inference mode; (generated ids per row, NFE of the batch).

    `row_seeds`: one generator per row (sampled decoding in a batch), in place of `config.seed`'s.
    `logprobs`: told every step too (it records each committed token's log-probability).
    """
    steps = on_step if logprobs is None else _both(logprobs, on_step)  # recorded first: a stream sends its scores
    with torch.inference_mode():
        out = decode_prompts(handle, prompts, config, on_step=steps, row_seeds=row_seeds)
    return out.generated.tolist(), int(out.nfe)


def _both(first: StepCallback, second: StepCallback | None) -> StepCallback:
    def on_step(info: StepInfo) -> None:
        first(info)
        if second is not None:
            second(info)

    return on_step


def watch_rows(
    handle: Handle,
    config: SamplerConfig,
    group: list[Job],
    loop: asyncio.AbstractEventLoop,
    clock: Clock = SYSTEM_CLOCK,
    recorder: CommitLogprobs | None = None,
) -> StepCallback:
    """The `on_step` of one batch (runs in the decode thread): first-block times, streamed tokens (with their
    log-probabilities from `recorder`, which has seen the step already, for a job that asked), abandonment."""
    prompt_length = max(len(job.prompt_ids) for job in group)  # left padding: every row's generation starts here
    sent = [0] * len(group)

    def on_final(info: StepInfo, lengths: list[int]) -> None:
        now, deliveries = clock.monotonic(), []
        for row, (job, length) in enumerate(zip(group, lengths)):
            if job.first_block is None:
                job.first_block = now
            if length > sent[row] and job.on_tokens is not None and not job.future.done():
                start, end = prompt_length + sent[row], prompt_length + length
                tokens = info.sequences[row, start:end].tolist()
                scored = recorder.span(row, start, end) if recorder is not None and job.logprobs is not None else None
                deliveries.append((job.on_tokens, tokens, scored))
            sent[row] = max(sent[row], length)
        if deliveries:  # in order, before the batch's results: the loop runs callbacks first in, first out
            loop.call_soon_threadsafe(_deliver, deliveries)

    prefix = FinalPrefix(prompt_length, config.block_length, config.mask_id, handle.masked_diffusion, on_final)

    def on_step(info: StepInfo) -> None:
        stop_when_gone(group)
        prefix(info)

    return on_step


def stop_when_gone(group: list[Job]) -> None:
    """Raise Abandoned once every request of `group` hung up or timed out: stop computing for nobody."""
    if all(job.future.done() for job in group):
        raise Abandoned(f"all {len(group)} requests of the batch are gone")


def decode_running(handle: Handle, config: SamplerConfig, rows: list[Row], group: list[Job]) -> int:
    """One block of every running row (`sampler.continuous.decode_block`) in inference mode; its NFE."""
    with torch.inference_mode():
        return decode_block(handle.model, rows, config, padding_id(handle), on_step=lambda info: stop_when_gone(group))


def _deliver(deliveries: list[tuple[OnTokens, list[int], list[Scored] | None]]) -> None:
    for on_tokens, tokens, scored in deliveries:
        on_tokens(tokens, scored)


def _report_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:  # queued requests would only time out: say why
        log.error("batching worker stopped: %r", task.exception())


class Batcher:
    """The queue and the batching worker of one loaded version."""

    def __init__(
        self,
        handle: Handle,
        max_batch: int = 16,
        window_s: float = 0.01,
        max_pending: int = 64,
        on_batch: Callable[[int], None] | None = None,
        on_depth: Callable[[int], None] | None = None,
        name: str = "model",
        memory_budget: int | None = None,
        continuous: bool = True,
        executor: ThreadPoolExecutor | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ):
        if max_batch < 1 or max_pending < 1 or window_s < 0:
            raise ValueError(
                f"batching: max_batch={max_batch} and max_pending={max_pending} must be >= 1, window_s={window_s} >= 0"
            )
        self.handle, self.max_batch, self.window_s, self.max_pending = handle, max_batch, window_s, max_pending
        self.clock = clock  # arrivals, windows and the times each Decoded reports (registry/clock.py)
        self.memory_budget = memory_budget  # a batch's rows x its largest row's peak stay within it; None: no cap
        self.continuous = continuous  # False: every batch static, start to finish (the comparison's baseline)
        self._on_batch = on_batch or (lambda size: None)
        self._on_depth = on_depth or (lambda depth: None)
        # torch releases the GIL in its kernels; one thread keeps the batches in order. `executor`: a one-thread
        # executor shared with other versions (serving.pool: one compute thread), not shut down by `drain`
        self._own_executor = executor is None
        self._executor = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"decode-{name}")
        self._pending: deque[Job] = deque()
        self._running = 0
        self._decoding: list[Job] = []  # the jobs of the batch being decoded now (its clients hold their rows)
        self._wake = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._company_at = float("-inf")  # monotonic time a request last arrived while others were in (never yet)

    # the request side -------------------------------------------------------------------------
    def submit(
        self,
        prompt_ids: list[int],
        config: SamplerConfig,
        key: str | None,
        on_tokens: OnTokens | None = None,
        peak: int = 0,
        logprobs: int | None = None,
        client: str = "",
    ) -> asyncio.Future[Decoded]:
        """Queue one request; its future gives a `Decoded`. Raises QueueFull or Draining at once.

        `on_tokens` (a streamed request) hears, on the event loop, each run of its tokens that became final.
        `logprobs` (top alternatives, 0 for none): the `Decoded` carries each generated token's log-probability;
        it changes no token, so such a request batches with others.
        """
        if self._closing:
            raise Draining("this version is draining")
        if self.load >= self.max_pending:
            raise QueueFull(f"{self.load} requests queued or decoding (limit {self.max_pending})")
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._work())
            self._task.add_done_callback(_report_crash)
        job = Job(
            prompt_ids,
            config,
            key,
            asyncio.get_running_loop().create_future(),
            self.clock.monotonic(),
            on_tokens=on_tokens,
            peak=peak,
            logprobs=logprobs,
            client=client,
        )
        if self.load:
            self._company_at = job.arrived
        self._pending.append(job)
        self._depth_changed()
        self._wake.set()
        return job.future

    @property
    def most_one_client_holds(self) -> int:
        """The rows one client may hold while no other has any: the queue less an eighth kept for others' requests
        (none below 8: a queue that short is a test's or a one-client server's)."""
        return self.max_pending - self.max_pending // 8

    def admit(self, client: str, rows: int) -> None:
        """QueueFull unless `rows` more rows of `client` fit: in the queue, and within the client's fair share.

        A client holding rows (queued or decoding) while others hold some too may hold at most an equal share of
        the queue; one alone may hold all but a reserve (`most_one_client_holds`), so another client's request
        always finds room. A heavy client is then the one that gets 429, not the client that asks once."""
        if self.load + rows > self.max_pending:
            raise QueueFull(f"{self.load} requests queued or decoding (limit {self.max_pending})")
        held: dict[str, int] = {}
        for job in [*self._pending, *self._decoding]:
            if not job.future.done():
                held[job.client] = held.get(job.client, 0) + 1
        others = len(set(held) - {client})
        share = self.max_pending // (others + 1) if others else self.most_one_client_holds
        if held.get(client, 0) + rows > share:
            raise QueueFull(
                f"this client holds {held.get(client, 0)} of the {self.load} requests queued or decoding; its fair "
                f"share is {share} while {others} other client(s) wait"
                if others
                else f"one client may hold {share} of the {self.max_pending} requests a model queues"
            )

    @property
    def load(self) -> int:
        """Requests queued or in the batch being decoded; one that timed out or was cancelled no longer counts."""
        return sum(1 for j in self._pending if not j.future.done()) + self._running

    @property
    def running(self) -> int:
        """Requests in the batch being decoded now."""
        return self._running

    async def run(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """`fn(*args)` in this version's decode thread, between batches (scoring a prompt needs the model too)."""
        if self._closing:
            raise Draining("this version is draining")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def drain(self) -> None:
        """Take no new requests, answer every queued one, then stop the worker and its thread."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
        if self._own_executor:
            self._executor.shutdown(wait=True)

    # the worker ---------------------------------------------------------------------------------
    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._drop_abandoned()
            if not self._pending:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            first = self._pending[0]
            if first.key is not None:
                await self._gather(first)
            if self._joins(first):
                await self._decode_blocks(running_key(first.config))
                continue
            group = self._take()
            if not group:
                continue
            self._running, self._decoding = len(group), group
            self._depth_changed()
            started = self.clock.monotonic()
            config = group[0].config
            # a sampled batch is row-seeded: batch_key keys a sampled request only when it has a seed
            keyed = group[0].key is not None
            seeds = batch_row_seeds(self.handle, config, [j.config.seed for j in group]) if keyed else None
            tops = [j.logprobs for j in group if j.logprobs is not None]
            recorder = CommitLogprobs(top=max(tops)) if tops else None
            try:
                rows, nfe = await loop.run_in_executor(
                    self._executor,
                    decode_rows,
                    self.handle,
                    config,
                    [j.prompt_ids for j in group],
                    watch_rows(self.handle, config, group, loop, self.clock, recorder),
                    seeds,
                    recorder,
                )
            except Abandoned as e:
                log.info("stopped a batch early: %s", e)
            except Exception as e:  # the model failed on this batch: each of its requests hears why
                for job in group:
                    if not job.future.done():
                        job.future.set_exception(e)
            else:
                took = self.clock.monotonic() - started
                width = max(len(job.prompt_ids) for job in group)  # left padding: generation starts here in every row
                scored = recorder.generated(width) if recorder is not None else [None] * len(group)
                for job, generated, logprobs in zip(group, rows, scored):
                    if not job.future.done():  # a request that timed out meanwhile is not answered
                        first_block_s = None if job.first_block is None else job.first_block - job.arrived
                        job.future.set_result(
                            Decoded(
                                generated,
                                nfe,
                                len(group),
                                started - job.arrived,
                                took,
                                first_block_s,
                                logprobs if job.logprobs is not None else None,
                            )
                        )
                self._on_batch(len(group))
            finally:
                self._running, self._decoding = 0, []
                self._depth_changed()

    def _joins(self, job: Job) -> bool:
        """Whether `job` decodes in a running batch, block by block (else in a static batch, or alone)."""
        return (
            self.continuous
            and job.key is not None
            and job.logprobs is None
            and self.handle.masked_diffusion
            and joins_running_batch(job.config)
        )

    async def _decode_blocks(self, key: str) -> None:
        """Run batches of `key` (`sampler.continuous.running_key`: lengths may differ) block by block until no
        row is left: rows leave when done, queued ones join."""
        loop = asyncio.get_running_loop()
        running: list[tuple[Job, Row]] = []
        try:
            while True:
                running = [(job, row) for job, row in running if not job.future.done()]  # hung up: leave
                running += [
                    (job, Row(job.prompt_ids, job.config.gen_length))
                    for job in self._join(key, [job for job, _ in running])
                ]
                if not running:
                    return
                self._running = len(running)
                self._decoding = [job for job, _ in running]
                jobs, rows = [job for job, _ in running], [row for _, row in running]
                started = self.clock.monotonic()
                for job in jobs:
                    job.started = job.started or started
                try:
                    await loop.run_in_executor(self._executor, decode_running, self.handle, jobs[0].config, rows, jobs)
                except Abandoned as e:
                    log.info("stopped a batch early: %s", e)
                    continue
                except Exception as e:  # the model failed on this block: each of its requests hears why
                    for job in jobs:
                        if not job.future.done():
                            job.future.set_exception(e)
                    running = []
                    continue
                self._on_batch(len(rows))
                for job, row in running:
                    self._hand_over(job, row)
                running = [(job, row) for job, row in running if not row.done]
        finally:
            self._running, self._decoding = 0, []
            self._depth_changed()

    def _join(self, key: str, running: list[Job]) -> list[Job]:
        """Queued requests that join the running rows now: the oldest first, while the oldest is of `key`."""
        joined: list[Job] = []
        while self._pending and len(running) + len(joined) < self.max_batch:
            head = self._pending[0]
            if head.future.done():
                self._pending.popleft()
            elif self._joins(head) and running_key(head.config) == key and self._within_budget(running + joined, head):
                joined.append(self._pending.popleft())
            else:
                break
        self._depth_changed()
        return joined

    def _hand_over(self, job: Job, row: Row) -> None:
        """After a block: the request's newly final ids to its stream, and its answer once its row is done."""
        now = self.clock.monotonic()
        if job.future.done():
            return
        if job.first_block is None:
            job.first_block = now
        final = row.final_length(job.config)
        if job.on_tokens is not None and final > job.sent:
            try:
                job.on_tokens(row.tokens[job.sent : final], None)  # a running batch holds no job that asked for scores
            except Exception as e:  # a stream that cannot take its tokens fails alone; the rows beside it go on
                log.exception("a stream's token callback failed; its request ends here")
                job.future.set_exception(e)
                return
            job.sent = final
        if row.done:
            assert job.started is not None, "_decode_blocks sets it before the row's first block"
            job.future.set_result(
                Decoded(
                    list(row.tokens),
                    row.nfe,
                    round(sum(row.batches) / len(row.batches)),
                    job.started - job.arrived,
                    now - job.started,
                    job.first_block - job.arrived,
                )
            )

    async def _gather(self, first: Job) -> None:
        """Wait until `max_batch` requests share `first`'s key, or its window closes, or no request has arrived
        for QUIET_SHARE of the window; at once when no request has arrived beside another for COMPANY_MEMORY_S
        (one request at a time: waiting would only add latency)."""
        if self.clock.monotonic() - self._company_at > COMPANY_MEMORY_S:
            return
        deadline, quiet = first.arrived + self.window_s, self.window_s * QUIET_SHARE
        while not self._closing and self._count(first.key) < self.max_batch:
            now = self.clock.monotonic()
            left = min(deadline, self._pending[-1].arrived + quiet) - now
            if left <= 0:
                return
            self._wake.clear()
            if not await self.clock.wait(self._wake, left):
                return

    def _count(self, key: str | None) -> int:
        return sum(1 for j in self._pending if j.key == key and not j.future.done())

    def _take(self) -> list[Job]:
        """The oldest live job, and with it up to `max_batch` in all of the same key: when more are queued than
        fit, those whose prompts are closest to its length (left padding to the longest is computed too),
        the older of two as close. Every job left is then older than any that arrives: none waits forever."""
        live = [job for job in self._pending if not job.future.done()]
        if not live:
            self._pending = deque()
            return []
        first, group = live[0], [live[0]]
        if first.key is not None:
            same = [job for job in live[1:] if job.key == first.key]
            for job in sorted(
                same, key=lambda j: abs(len(j.prompt_ids) - len(first.prompt_ids))
            ):  # stable: age breaks ties
                if len(group) < self.max_batch and self._within_budget(group, job):
                    group.append(job)
        taken = {id(job) for job in group}
        self._pending = deque(job for job in live if id(job) not in taken)
        return group

    def _within_budget(self, group: list[Job], job: Job) -> bool:
        """Whether `job` may join `group`: rows are left-padded to the longest prompt, so each costs the largest
        peak."""
        if self.memory_budget is None or not group:
            return True
        return (len(group) + 1) * max(job.peak, *(j.peak for j in group)) <= self.memory_budget

    def _drop_abandoned(self) -> None:
        if any(j.future.done() for j in self._pending):  # timed out or cancelled while queued: free the slot
            self._pending = deque(j for j in self._pending if not j.future.done())
            self._depth_changed()

    def _depth_changed(self) -> None:
        self._on_depth(len(self._pending))
