"""The micro-batcher, the server's core: one endpoint's waiting requests in, each request's own
rows out, one model call at a time over slices of them in fair-queueing order, within the
token budget, a request whose client has gone skipped (the package docstring says why, with
the measurements).
It knows no web framework: a request is its items, its options and a way to tell it has gone;
what it refuses is an HTTPError with its status (413 over max_request_tokens, 503 when full,
499 when gone)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ItemError
from .errors import GONE, HTTPError
from .limits import Limits
from .metrics import Metrics

# pieces each input of a list is read as (every window's row, [CLS] and [SEP] included), given
# the request's options
Cost = Callable[[list[Any], dict[str, Any]], list[int]]


@dataclass(eq=False)
class Job:
    """A request in its endpoint's batcher: its items and the pieces each is read as, its
    options (requests with the same `key` share model calls), its rows as slices come back."""

    items: list[Any]
    costs: list[int]
    options: dict[str, Any]
    key: str
    future: asyncio.Future
    arrived: float  # the event loop's clock
    order: int  # arrival order in its batcher
    rows: list[Any]
    tag: int  # its place in the batcher's queue, lowest first (Batcher.take): the pieces the
    # batcher had handed to model calls when it came, plus its own
    taken: int = 0  # items handed to model calls so far

    @property
    def waiting(self) -> bool:
        """Items not yet handed to a model call, for a client still waiting for them."""
        return self.taken < len(self.items) and not self.future.done()


@dataclass(frozen=True)
class Slice:
    """A request's items [start, end) in one model call (Batcher.take)."""

    job: Job
    start: int
    end: int

    @property
    def items(self) -> list[Any]:
        return self.job.items[self.start : self.end]


class Batcher:
    """One endpoint's requests and worker: (items, options) in, each request's own rows out,
    one model call at a time, each call slices of the waiting requests, lowest tag first (see
    `take`)."""

    def __init__(
        self,
        run: Callable[[list[Any], dict[str, Any]], list[Any]],
        limits: Limits,
        cost: Cost,
        metrics: Metrics,
    ) -> None:
        self.run, self.limits, self.cost, self.metrics = run, limits, cost, metrics
        self.jobs: list[Job] = []
        self.arrivals = itertools.count()
        self.calls = 0  # model calls made so far
        self.work = 0  # pieces handed to model calls so far: the clock requests are tagged by
        self.task: asyncio.Task | None = None  # its worker, in the event loop it started in
        self.wake: asyncio.Event | None = None  # set when a request comes

    @property
    def waiting(self) -> int:
        """Requests with items not yet handed to a model call."""
        return sum(j.waiting for j in self.jobs)

    async def read(
        self, items: list[Any], options: dict[str, Any], field: str = "texts", spent: int = 0
    ) -> list[int]:
        """The pieces each item is read as (the batcher's `cost`: what a request's usage
        counts); 413 if more than max_request_tokens in all, with the `spent` pieces the
        request has had read by another batcher (`field`: the request's field the message
        names). Counted in a thread (it tokenizes): the event loop serves the other clients
        meanwhile."""
        costs = await asyncio.to_thread(self.cost, items, options) if items else []
        total, limit = spent + sum(costs), self.limits.max_request_tokens
        if total > limit:
            raise HTTPError(
                413,
                f"{field}: read as {total:,} pieces (every window, [CLS] and [SEP] "
                f"included), more than the limit of {limit:,} per request (max_request_tokens)",
                field,
            )
        return costs

    async def submit(
        self,
        items: list[Any],
        options: dict[str, Any],
        gone: Callable[[], Awaitable[Any]] | None = None,
        field: str = "texts",
        costs: list[int] | None = None,
    ) -> list[Any]:
        """The rows of `items`, computed in slices that share model calls with other requests;
        413 before any model work if the items are read as more than max_request_tokens pieces
        (`read`, unless their `costs` are given, read already); `gone` returns when the client
        has left: the request then leaves uncomputed (499), even half done."""
        if not items:
            return []
        costs = await self.read(items, options, field) if costs is None else costs
        total = sum(costs)
        if self.waiting >= self.limits.max_queue:
            raise HTTPError(503, "server busy: the request queue is full; retry later")
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        key = json.dumps(options, sort_keys=True, default=repr)
        order, tag = next(self.arrivals), self.work + total
        job = Job(items, costs, options, key, future, loop.time(), order, [None] * len(items), tag)
        self.jobs.append(job)
        self._wake(loop)
        watch = asyncio.ensure_future(gone()) if gone else None
        try:
            if watch is not None:
                await asyncio.wait([future, watch], return_when=asyncio.FIRST_COMPLETED)
                # gone, unless the watch itself failed: that says nothing of the client
                if not future.done() and watch.exception() is None:
                    raise HTTPError(GONE, "the client closed the connection")
            return await future
        finally:  # answered, the client gone or this handler cancelled: no more slices of it
            future.cancel()
            if watch:
                watch.cancel()

    def _wake(self, loop: asyncio.AbstractEventLoop) -> None:
        """Tell the worker a request has come (started in this event loop if need be)."""
        if self.task is None or self.task.done() or self.task.get_loop() is not loop:
            self.wake = asyncio.Event()
            self.task = loop.create_task(self._work(self.wake))
        assert self.wake is not None
        self.wake.set()

    async def _work(self, wake: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while True:
            delay = self.delay(loop.time())
            if delay is None or delay:  # none waits, or the first waits for company
                wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(wake.wait(), delay)
                continue
            slices = self.take()
            self.metrics.batch(sum(s.end - s.start for s in slices), self.waiting)
            try:
                await self.answer(slices)
            except Exception as e:  # a bug here must not stop the worker: a 500 each
                for s in slices:
                    if not s.job.future.done():
                        s.job.future.set_exception(e)

    def delay(self, now: float) -> float | None:
        """Seconds before this endpoint's next model call should start (None: nothing waits):
        none once its waiting items fill a call or its oldest request has waited max_wait_ms."""
        self.jobs = [j for j in self.jobs if not j.future.done()]
        jobs, limits = [j for j in self.jobs if j.waiting], self.limits
        if not jobs:
            return None
        items = sum(len(j.items) - j.taken for j in jobs)
        pieces = sum(sum(j.costs[j.taken :]) for j in jobs)
        if items >= limits.max_batch or pieces >= limits.max_batch_tokens:
            return 0.0
        return max(0.0, min(j.arrived for j in jobs) + limits.max_wait_ms / 1000 - now)

    def take(self) -> list[Slice]:
        """The next model call's slices (Slice: request, start, end), the requests in the order
        of their tags (the batcher's work clock when each came, plus its own pieces: fair
        queueing's virtual finish times, lowest first), each giving its next items while the
        call stays within max_batch items and max_batch_tokens pieces (its first item always:
        an input longer than that runs alone). So requests of one size are answered in the
        order they came, each as soon as it can be (not all together at the end, as turns
        would), a small one goes before a big one that came not long before it, and a big
        one waits behind later ones for at most its own pieces of their work. Only requests
        with the options of the first share the call."""
        queue = sorted((j for j in self.jobs if j.waiting), key=lambda j: (j.tag, j.order))
        self.calls += 1
        limits, n, pieces = self.limits, 0, 0
        slices: list[Slice] = []
        for job in queue:
            if job.key != queue[0].key:
                continue
            start = end = job.taken
            while end < len(job.items) and n < limits.max_batch:
                if n and pieces + job.costs[end] > limits.max_batch_tokens:
                    break
                pieces, n, end = pieces + job.costs[end], n + 1, end + 1
            if end > start:
                slices.append(Slice(job, start, end))
                job.taken = end
        self.work += pieces
        return slices

    async def answer(self, slices: list[Slice]) -> None:
        """One model call for the slices, each request given its own rows (answered once all
        its rows are in); if it fails, each slice runs alone, so that one bad input fails only
        its own request, named by its place in the request (not in the slice: ItemError)."""
        slices = [s for s in slices if not s.job.future.done()]  # clients gone meanwhile
        if not slices:
            return
        items = [x for s in slices for x in s.items]
        first = slices[0].job
        loop = asyncio.get_running_loop()
        try:
            rows = await loop.run_in_executor(None, self.run, items, first.options)
        except Exception as e:
            if len(slices) > 1:
                for s in slices:
                    await self.answer([s])
            elif not first.future.done():  # an input named by its place in the request
                shifted = e.shifted(slices[0].start) if isinstance(e, ItemError) else e
                first.future.set_exception(shifted)
            return
        i = 0
        for s in slices:
            job, n = s.job, s.end - s.start
            job.rows[s.start : s.end] = rows[i : i + n]
            i += n
            if s.end == len(job.items) and not job.future.done():
                job.future.set_result(job.rows)
