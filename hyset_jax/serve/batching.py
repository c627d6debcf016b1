"""Micro-batching: concurrent requests answered by one device call.

Requests wait in an asyncio queue. One worker takes the first, then keeps collecting for at
most ``max_wait_s`` or until ``max_batch`` queries are gathered (whatever is already queued
when the wait ends is taken too, up to ``max_batch``), and hands the batch to ``run`` on a
single worker thread — the event loop keeps accepting requests meanwhile, and those queue up
for the next batch. So under load batches fill up by themselves, and a lone request waits at
most ``max_wait_s``.

A request larger than ``max_batch`` is a batch of its own. An exception in ``run`` fails the
requests of that batch only; the worker carries on.

With ``key``, a batch holds only requests of one key: a request whose key differs from the
batch's first ends the batch and starts the next. The server keys requests by the catalogue
snapshot they were validated against, so a batch never mixes two tool libraries while the
catalogue changes (:mod:`hyset_jax.serve.catalogue`). :meth:`MicroBatcher.call` runs other
work (a catalogue update's encoder call) on the batches' own thread, between two batches.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any


@dataclasses.dataclass
class _Job:
  texts: Sequence[str]
  options: Any
  future: asyncio.Future


@dataclasses.dataclass
class BatchStats:
  """Counters for /healthz and the load benchmark (``waiting``: requests submitted and not yet
  answered, the queue depth an operator watches)."""
  batches: int = 0
  queries: int = 0
  requests: int = 0
  largest: int = 0
  waiting: int = 0

  def as_dict(self) -> dict[str, float]:
    mean = self.queries / self.batches if self.batches else 0.0
    return {"batches": self.batches, "queries": self.queries, "requests": self.requests,
            "largest_batch": self.largest, "mean_batch": round(mean, 3),
            "waiting": self.waiting}


class MicroBatcher:
  """Collects ``submit`` calls into calls of ``run(list of (texts, options))``.

  Args:
    run: answers a batch; returns one result per (texts, options) pair, in order. Called
      on one thread, never twice at once.
    max_batch: most queries (texts) per call.
    max_wait_s: longest a request waits for others to join it.
    key: options -> a batch key; only requests whose keys are the same object share a batch
      (None: any requests may).
  """

  def __init__(self, run: Callable[[list[tuple[Sequence[str], Any]]], list[Any]], *,
               max_batch: int, max_wait_s: float, key: Callable[[Any], Any] | None = None):
    if max_batch < 1 or max_wait_s < 0:
      raise ValueError("max_batch must be ≥ 1 and max_wait_s ≥ 0")
    self._run = run
    self._key = key
    self.max_batch = max_batch
    self.max_wait_s = max_wait_s
    self.stats = BatchStats()
    self._queue: asyncio.Queue | None = None
    self._worker: asyncio.Task | None = None
    self._carry: _Job | None = None
    self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hyset-batch")

  async def start(self) -> None:
    if self._worker is None:
      self._queue = asyncio.Queue()
      self._worker = asyncio.get_running_loop().create_task(self._loop())

  async def stop(self) -> None:
    """Answer everything queued, then stop the worker and its thread."""
    if self._worker is not None:
      await self._queue.put(None)
      await self._worker
      self._worker = None
    self._executor.shutdown(wait=True)

  async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on the batches' thread: never at the same time as a batch (the encoder and
    its tokenizer are used from that one thread only)."""
    return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

  def _joins(self, batch: list[_Job], job: _Job) -> bool:
    """Whether ``job`` may share ``batch`` (same key as its first request)."""
    return self._key is None or self._key(job.options) is self._key(batch[0].options)

  async def submit(self, texts: Sequence[str], options: Any) -> Any:
    """The result of ``run`` for this request, once its batch has run."""
    await self.start()
    future = asyncio.get_running_loop().create_future()
    self.stats.waiting += 1
    try:
      await self._queue.put(_Job(texts, options, future))
      return await future
    finally:
      self.stats.waiting -= 1

  async def _next(self, timeout: float | None) -> _Job | None | bool:
    """The next job; None for the stop sentinel; False when ``timeout`` passed first."""
    if self._carry is not None:
      job, self._carry = self._carry, None
      return job
    if timeout is None:
      return await self._queue.get()
    if timeout <= 0:
      try:
        return self._queue.get_nowait()
      except asyncio.QueueEmpty:
        return False
    try:
      return await asyncio.wait_for(self._queue.get(), timeout)
    except asyncio.TimeoutError:
      return False

  async def _loop(self) -> None:
    loop = asyncio.get_running_loop()
    stopping = False
    while not stopping:
      first = await self._next(None)
      if first is None:
        break
      batch, size = [first], len(first.texts)
      deadline = loop.time() + self.max_wait_s
      while size < self.max_batch:
        job = await self._next(deadline - loop.time())
        if job is False:
          break
        if job is None:
          stopping = True  # answer this batch, then stop
          break
        if size + len(job.texts) > self.max_batch or not self._joins(batch, job):
          self._carry = job
          break
        batch.append(job)
        size += len(job.texts)
      live = [j for j in batch if not j.future.done()]  # a cancelled client is skipped
      if not live:
        continue
      self.stats.batches += 1
      self.stats.requests += len(live)
      self.stats.queries += sum(len(j.texts) for j in live)
      self.stats.largest = max(self.stats.largest, sum(len(j.texts) for j in live))
      try:
        results = await loop.run_in_executor(
            self._executor, self._run, [(j.texts, j.options) for j in live])
      except Exception as e:  # noqa: BLE001 - reported to the waiting requests
        for j in live:
          if not j.future.done():
            j.future.set_exception(e)
        continue
      for j, result in zip(live, results):
        if not j.future.done():
          j.future.set_result(result)
