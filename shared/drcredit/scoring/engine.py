"""The event loop that runs work units, and the writer that batches what they store.

A chain spends ~all its life waiting on the judge. Running chains as coroutines on one
event loop per process (instead of one thread each) lets a worker keep hundreds of
judge calls in flight with no thread switches; the short database transactions run on
a small thread pool, and judgments from all chains are written together, a batch per
transaction, so the database work per judgment is a row in a multi-row statement.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from drcredit.process import IdleCollector, new_event_loop
from drcredit.scoring.priority import PrioritySlots
from drcredit.scoring.start_order import StartOrder

log = logging.getLogger("drcredit.engine")

T = TypeVar("T")
Item = TypeVar("Item")
Out = TypeVar("Out")


class Engine:
    """One asyncio loop in a daemon thread, a database thread pool and the judge slots."""

    def __init__(self, judge_concurrency: int, db_threads: int = 6):
        self.judge_concurrency = judge_concurrency
        self.db_threads = db_threads
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._db_pool = ThreadPoolExecutor(db_threads, thread_name_prefix="drcredit-db")
        self._judge_slots: PrioritySlots | None = None
        self._start_order: StartOrder | None = None
        self._start_lock = threading.Lock()
        self._closing: list[Callable[[], Awaitable[None]]] = []
        #: Cyclic garbage collected between steps, not during them (see :meth:`busy`).
        self.idle_collector = IdleCollector()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._start_lock:
            if self._loop is None:
                loop = new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=run, name="drcredit-engine", daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    def submit(self, work: Coroutine[Any, Any, T]) -> Future[T]:
        """Run a coroutine on the engine loop from any thread."""
        return asyncio.run_coroutine_threadsafe(work, self.loop)

    async def db(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking database call on the pool without blocking the loop."""
        return await asyncio.get_running_loop().run_in_executor(self._db_pool, fn, *args)

    @property
    def judge_slots(self) -> PrioritySlots:
        """Judge calls in flight in this process, longest remaining chain first."""
        if self._judge_slots is None:
            self._judge_slots = PrioritySlots(self.judge_concurrency)
        return self._judge_slots

    @property
    def start_order(self) -> StartOrder:
        """The order in which this process's units make their first call: deepest first."""
        if self._start_order is None:
            self._start_order = StartOrder()
        return self._start_order

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Work of this process (from any thread): no idle garbage collection meanwhile."""
        self.idle_collector.started()
        try:
            yield
        finally:
            self.idle_collector.finished(self.loop)

    def on_close(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Run ``hook`` on the loop when the engine closes (release connections)."""
        self._closing.append(hook)

    def close(self, timeout: float = 10.0) -> None:
        loop = self._loop
        if loop is not None and loop.is_running():

            async def finish() -> None:
                for hook in self._closing:
                    try:
                        await hook()
                    except Exception:
                        log.warning("engine close hook failed", exc_info=True)
                # What is still waiting on the loop (a judge fleet's health check, a
                # unit's call) is cancelled and run to its end here, as asyncio.run does:
                # a loop stopped with tasks pending leaves them to no one.
                current = asyncio.current_task()
                pending = [t for t in asyncio.all_tasks() if t is not current]
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)

            try:
                asyncio.run_coroutine_threadsafe(finish(), loop).result(timeout)
            except Exception:
                log.warning("engine did not close cleanly", exc_info=True)
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(timeout)
            if not loop.is_running():
                loop.close()
        self._db_pool.shutdown(wait=True, cancel_futures=True)


class BatchWriter(Generic[Item, Out]):
    """Coalesces writes from many coroutines into one database call per batch.

    ``write(items)`` runs on the engine's database pool and returns one result per item.
    While batches are being written, new items queue up and form the next batch, so under
    load each transaction carries many writes and with one chain it adds no delay. Up to
    ``concurrency`` batches are written at once, so one slow transaction does not hold
    up every chain of the process. A batch short of ``max_batch`` waits ``linger_s`` for
    more writes first: a transaction costs about the same for one write as for a
    hundred, and at a few hundred judgments a second without it most batches carried a
    handful (a chain does not wait for its stores, see the pipeline).
    """

    def __init__(
        self,
        engine: Engine,
        write: Callable[[Sequence[Item]], list[Out]],
        max_batch: int = 500,
        concurrency: int = 3,
        linger_s: float = 0.0,
    ):
        self.engine = engine
        self._write = write
        self.max_batch = max_batch
        self.concurrency = concurrency
        self.linger_s = linger_s
        self._pending: list[tuple[Item, asyncio.Future[Out]]] = []
        self._running = 0
        self._drains: set[asyncio.Task[None]] = set()  # referenced until done (not collected)

    async def put(self, item: Item) -> Out:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Out] = loop.create_future()
        self._pending.append((item, future))
        if self._running < self.concurrency:
            self._running += 1
            drain = loop.create_task(self._drain())
            self._drains.add(drain)
            drain.add_done_callback(self._drains.discard)
        return await future

    async def _drain(self) -> None:
        try:
            while self._pending:
                if self.linger_s and len(self._pending) < self.max_batch:
                    await asyncio.sleep(self.linger_s)
                batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
                try:
                    results = await self.engine.db(self._write, [item for item, _ in batch])
                except BaseException as exc:  # noqa: BLE001 - every waiter gets the error
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._running -= 1
