"""AsyncSinkWriter: buffering, batching, retries, rate limiting and dead letters on asyncio.

A destination implements two methods, :meth:`AsyncSinkWriter.submit_request_entries` (send one
batch, return the entries to retry or raise) and :meth:`AsyncSinkWriter.size_in_bytes`; this
class does the rest (FLIP-171, FLIP-242), with the retry handling done better than Flink's:

* failed entries wait for a capped, jittered exponential backoff (at least the destination's
  ``Retry-After``) and then rejoin the *head* of the buffer in their original order;
* each entry has a retry budget; an entry that exhausts it, or that the destination rejects
  fatally, goes to the dead-letter queue when one is configured (a poison record is isolated by
  splitting its request in halves) and fails the job with a clear message otherwise;
* a ``Retry-After`` also holds back every new request until it has passed;
* metrics count each record once, not once per retry.

Guarantee: when :meth:`AsyncSinkWriter.flush` returns, every entry written before the call was
accepted by the destination or handed to the dead-letter queue (at-least-once: an entry whose
request timed out or failed after reaching the destination may be delivered twice). When it
raises, some entries may be neither: the caller must fail, so that the input is replayed.

All methods must be called from the writer's event loop (one loop, one writer).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import random
from abc import ABC, abstractmethod
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from framework.asyncsink._classify import (
    DEFAULT_ERROR_CLASSIFIER,
    ErrorClassification,
    ErrorClassifier,
)
from framework.asyncsink._config import AsyncSinkWriterConfig, RetryPolicy
from framework.asyncsink._converter import ElementConverter
from framework.asyncsink._deadletter import (
    DeadLetter,
    DeadLetterQueue,
    DeadLetterReason,
    DeadLetterWriter,
)
from framework.asyncsink._idempotency import IdempotencyKeys
from framework.asyncsink._metrics import WriterMetrics, _Counters
from framework.asyncsink._ratelimit import (
    CongestionControlRateLimitingStrategy,
    RateLimitingStrategy,
    RequestInfo,
    ResultInfo,
    SupportsInFlightLimit,
    SupportsUnblockTime,
)
from framework.asyncsink._state import BufferedRequestState, RequestEntryWrapper
from framework.errors import (
    DeliveryError,
    FatalDeliveryError,
    RecordTooLargeError,
    RetriesExhaustedError,
    RetryableDeliveryError,
    SinkError,
)
from framework.sink import WriterContext

__all__ = ["AsyncSinkWriter", "PartialFailure"]

InputT = TypeVar("InputT")
RequestEntryT = TypeVar("RequestEntryT")

logger = logging.getLogger(__name__)

# How long to wait before asking again a strategy that blocks while nothing is in flight and
# cannot say when it will unblock.
_BLOCKED_POLL_INTERVAL_S = 0.005


@dataclass(frozen=True, slots=True)
class PartialFailure(Generic[RequestEntryT]):
    """What ``submit_request_entries`` may return instead of a plain list of entries to retry,
    to say that the failures were throttling (e.g. Kinesis' ProvisionedThroughputExceeded).

    Attributes:
        entries: the entries to retry, each one of the objects the request was given.
        throttled: the destination refused them for capacity; the rate limiter hears it.
        retry_after_s: how long the destination asked to wait, if it said.
    """

    entries: Sequence[RequestEntryT]
    throttled: bool = False
    retry_after_s: float | None = None


class _Buffered:
    """A buffered entry. Mutable on purpose: its failure counts grow with every retry."""

    __slots__ = ("attempts", "entry", "size", "throttles")

    def __init__(self, entry: Any, size: int, attempts: int = 0) -> None:
        self.entry = entry
        self.size = size
        self.attempts = attempts  # failures that count against the retry budget
        self.throttles = 0  # refusals for capacity: they only lengthen the backoff


@dataclass(frozen=True, slots=True)
class _Outcome:
    failed: int = 0
    throttled: bool = False
    retry_after_s: float | None = None

    def combine(self, other: _Outcome) -> _Outcome:
        retry_after = [value for value in (self.retry_after_s, other.retry_after_s) if value]
        return _Outcome(
            self.failed + other.failed,
            self.throttled or other.throttled,
            max(retry_after) if retry_after else None,
        )


_DELIVERED = _Outcome()


class AsyncSinkWriter(ABC, Generic[InputT, RequestEntryT]):
    """Buffers request entries and sends them in batches, at-least-once.

    Subclasses implement :meth:`submit_request_entries` and :meth:`size_in_bytes`, and may
    override :meth:`sizes_in_bytes` (vectorised sizes), :meth:`describe_entry` (how an entry
    appears in the dead-letter queue) and :meth:`release_resources` (close clients).

    Args:
        element_converter: turns input elements into request entries.
        config: buffering hints and request timeout.
        retry_policy: retry budget and backoff.
        error_classifier: decides which errors raised by a request are retryable.
        rate_limiting_strategy: when to send and how large a batch may be; Flink's default
            (AIMD congestion control) when ``None``.
        dead_letter_queue: where rejected entries go; ``None`` fails the job instead.
        context: the task this writer runs in, passed to the converter and the dead letters.
        initial_state: snapshots to restore; their entries are sent first, in order, keeping
            their failed-attempt counts.
        rng: random source for the backoff jitter (seed it in tests).
        idempotency_keys: stamp each element (a row) with its key before converting it
            (:class:`~framework.asyncsink.IdempotencyKeys`; positions count from 0 per writer).
    """

    def __init__(
        self,
        *,
        element_converter: ElementConverter[InputT, RequestEntryT],
        config: AsyncSinkWriterConfig | None = None,
        retry_policy: RetryPolicy | None = None,
        error_classifier: ErrorClassifier = DEFAULT_ERROR_CLASSIFIER,
        rate_limiting_strategy: RateLimitingStrategy | None = None,
        dead_letter_queue: DeadLetterQueue | None = None,
        context: WriterContext | None = None,
        initial_state: Iterable[BufferedRequestState[RequestEntryT]] = (),
        rng: random.Random | None = None,
        idempotency_keys: IdempotencyKeys | None = None,
    ) -> None:
        self._converter = element_converter
        self._keys = idempotency_keys
        self._position = 0  # elements converted so far: the next one's position in the task
        self._config = config if config is not None else AsyncSinkWriterConfig()
        self._backoff = (retry_policy if retry_policy is not None else RetryPolicy()).backoff()
        self._classifier = error_classifier
        self._strategy: RateLimitingStrategy = (
            rate_limiting_strategy
            if rate_limiting_strategy is not None
            else CongestionControlRateLimitingStrategy.from_config(self._config)
        )
        # Optional strategy capabilities, checked once: runtime protocol checks are slow.
        self._strategy_unblock_time = isinstance(self._strategy, SupportsUnblockTime)
        self._strategy_reports_limit = isinstance(self._strategy, SupportsInFlightLimit)
        self._dead_letters: DeadLetterWriter | None = (
            dead_letter_queue.open(context) if dead_letter_queue is not None else None
        )
        self._context = context
        self._rng = rng if rng is not None else random.Random()
        self._timeout_s = self._config.request_timeout_ms / 1000.0
        self._max_time_in_buffer_s = self._config.max_time_in_buffer_ms / 1000.0

        self._loop: asyncio.AbstractEventLoop | None = None
        self._buffer: deque[_Buffered] = deque()
        self._buffered_bytes = 0
        # Entries waiting for their backoff: (ready time, request sequence, entries).
        self._retry_heap: list[tuple[float, int, list[_Buffered]]] = []
        self._retry_count = 0
        self._retry_handle: asyncio.TimerHandle | None = None
        self._retry_handle_time = 0.0
        self._buffer_handle: asyncio.TimerHandle | None = None
        self._wake_handle: asyncio.TimerHandle | None = None
        self._wake_time = 0.0
        self._time_flush_due = False
        self._flushing = 0
        self._paused_until = 0.0
        self._in_flight = 0
        self._request_seq = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._waiters: list[asyncio.Future[None]] = []
        self._failure: BaseException | None = None
        self._closed = False
        self._counters = _Counters()

        # Restored entries are held to the same limit as new ones (Flink refuses them at
        # construction): without a dead-letter queue an oversized one fails here, with one it
        # is dead-lettered before anything is sent.
        self._restored_oversized: list[RequestEntryWrapper[RequestEntryT]] = []
        limit = self._config.max_record_size_in_bytes
        for state in initial_state:
            for wrapper in state.entries:
                if wrapper.size_in_bytes > limit:
                    self._restored_oversized.append(wrapper)
                    continue
                self._buffer.append(
                    _Buffered(wrapper.entry, wrapper.size_in_bytes, wrapper.failed_attempts)
                )
                self._buffered_bytes += wrapper.size_in_bytes
        if self._restored_oversized and self._dead_letters is None:
            sizes = [wrapper.size_in_bytes for wrapper in self._restored_oversized]
            raise RecordTooLargeError(
                f"{len(sizes)} restored entries are larger than max_record_size_in_bytes "
                f"({limit}): {sizes[:5]} bytes. They were buffered by a writer with a higher "
                "limit; raise the limit back, or configure a dead_letter_queue to divert them"
            )

    # ----------------------------------------------------------------- destination interface

    @abstractmethod
    async def submit_request_entries(
        self, entries: list[RequestEntryT]
    ) -> Sequence[RequestEntryT] | PartialFailure[RequestEntryT]:
        """Send one batch to the destination.

        Returns:
            The entries that failed and should be retried (the very objects of ``entries``), or
            an empty sequence when the destination accepted all of them; or a
            :class:`PartialFailure` to say the failures were throttling.

        Raises:
            RetryableDeliveryError: the whole request may succeed if sent again
                (``ThrottledError`` when the destination is over capacity).
            FatalDeliveryError: the destination will never accept these entries.
            Exception: anything else is classified by the writer's error classifier.
        """

    @abstractmethod
    def size_in_bytes(self, entry: RequestEntryT) -> int:
        """The size of ``entry`` as the destination counts it (0 if unknown)."""

    def sizes_in_bytes(self, entries: Sequence[RequestEntryT]) -> list[int]:
        """Sizes of many entries; override with a vectorised version when that is faster."""
        size = self.size_in_bytes
        return [size(entry) for entry in entries]

    def describe_entry(self, entry: RequestEntryT) -> Any:
        """How ``entry`` appears in a dead letter: a JSON-friendly value (default: itself)."""
        return entry

    async def release_resources(self) -> None:
        """Close clients and sessions; called once by :meth:`close`."""

    # -------------------------------------------------------------------------- public API

    @property
    def config(self) -> AsyncSinkWriterConfig:
        """The buffering hints this writer runs with."""
        return self._config

    @property
    def rate_limiting_strategy(self) -> RateLimitingStrategy:
        """The strategy consulted before every request."""
        return self._strategy

    def convert(self, elements: Iterable[InputT]) -> list[RequestEntryT]:
        """Convert elements to request entries. Without idempotency keys it is pure and may run
        on any thread; with them each element is stamped with its key first, and its position
        counts: convert the task's elements in their input order, each once."""
        apply = self._converter.apply
        context = self._context
        keys = self._keys
        if keys is None:
            return [apply(element, context) for element in elements]
        first = self._position
        rows = cast(Iterable[Mapping[str, Any]], elements)  # (keyed sinks take rows)
        entries = [
            apply(cast(InputT, keys.stamped(context, first + i, row)), context)
            for i, row in enumerate(rows)
        ]
        self._position = first + len(entries)
        return entries

    async def write(self, element: InputT) -> None:
        """Buffer one element; see :meth:`write_entries`."""
        await self.write_entries(self.convert([element]))

    async def write_many(self, elements: Iterable[InputT]) -> None:
        """Buffer many elements, converting them first; see :meth:`write_entries`."""
        await self.write_entries(self.convert(elements))

    async def write_entries(self, entries: Sequence[RequestEntryT]) -> None:
        """Buffer converted entries, in order, and send every batch that is ready.

        Blocks while the buffer holds ``max_buffered_requests`` entries (back-pressure).

        Raises:
            RecordTooLargeError: an entry exceeds ``max_record_size_in_bytes`` and there is no
                dead-letter queue; no entry of this call was buffered.
            DeliveryError: an earlier request failed for good (fatal rejection or exhausted
                retry budget without a dead-letter queue); the writer is unusable.
        """
        self._raise_if_failed()
        if self._restored_oversized:
            await self._divert_restored_oversized()
        if not entries:
            return
        loop = self._ensure_loop()
        sizes = self.sizes_in_bytes(entries)
        if max(sizes) > self._config.max_record_size_in_bytes:
            entries, sizes = await self._divert_oversized(entries, sizes)
        capacity = self._config.max_buffered_requests
        buffer = self._buffer
        count = len(entries)
        start = 0
        while start < count:
            room = capacity - len(buffer) - self._retry_count
            if room <= 0:
                await self._wait_for_change(loop)
                self._raise_if_failed()
                continue
            stop = min(count, start + room)
            if start == 0 and stop == count:
                buffer.extend(map(_Buffered, entries, sizes))
                self._buffered_bytes += sum(sizes)
            else:
                buffer.extend(map(_Buffered, entries[start:stop], sizes[start:stop]))
                self._buffered_bytes += sum(sizes[start:stop])
            start = stop
            if self._buffer_handle is None:
                self._buffer_handle = loop.call_later(
                    self._max_time_in_buffer_s, self._on_buffer_timer
                )
            self._dispatch()

    async def flush(self) -> None:
        """Send everything buffered and wait until every entry is delivered or dead-lettered.

        Retries continue (with their backoff) until they succeed or exhaust their budget, so
        unless the destination keeps throttling, this returns within roughly ``max_attempts``
        times (request timeout + maximum backoff). A destination that throttles forever blocks
        it, as it blocks ``write``: back-pressure, not data loss.

        Raises:
            DeliveryError: an entry was rejected for good without a dead-letter queue
                (``FatalDeliveryError``, ``RetriesExhaustedError``), or the dead-letter queue
                failed. Entries may then be undelivered: fail the task so its input is replayed.
        """
        loop = self._ensure_loop()
        if self._restored_oversized:
            await self._divert_restored_oversized()
        self._flushing += 1
        try:
            while True:
                self._raise_if_failed()
                if not self._buffer and not self._retry_count and not self._in_flight:
                    break
                self._dispatch()
                await self._wait_for_change(loop)
        finally:
            self._flushing -= 1
        if self._dead_letters is not None:
            await self._dead_letters.flush()
        self._raise_if_failed()
        if logger.isEnabledFor(logging.INFO):
            logger.info("async sink flushed: %s", self.metrics)

    def snapshot_state(self) -> BufferedRequestState[RequestEntryT]:
        """The entries not yet handed to the destination, oldest first.

        Entries in flight are not included: snapshot after :meth:`flush` (or accept that
        in-flight entries are covered by the replay of the input).
        """
        waiting = sorted(self._retry_heap, key=lambda item: item[1])
        wrappers = [
            RequestEntryWrapper(item.entry, item.size, item.attempts)
            for _, _, group in waiting
            for item in group
        ]
        wrappers.extend(
            RequestEntryWrapper(item.entry, item.size, item.attempts) for item in self._buffer
        )
        # Not dead-lettered yet (that happens on first use): they must not vanish meanwhile.
        wrappers.extend(self._restored_oversized)
        return BufferedRequestState(tuple(wrappers))

    @property
    def metrics(self) -> WriterMetrics:
        """A snapshot of the counters (see :class:`~framework.asyncsink.WriterMetrics`)."""
        counters = self._counters
        limit: float | None = None
        if self._strategy_reports_limit:
            limit = self._strategy.in_flight_limit  # type: ignore[attr-defined]
        return WriterMetrics(
            current_send_time_ms=counters.current_send_time_ms,
            num_records_out=counters.num_records_out,
            num_bytes_out=counters.num_bytes_out,
            num_requests=counters.num_requests,
            num_failed_requests=counters.num_failed_requests,
            num_throttled_requests=counters.num_throttled_requests,
            num_retries=counters.num_retries,
            num_dead_lettered=counters.num_dead_lettered,
            current_in_flight_limit=limit,
            in_flight_requests=self._in_flight,
            buffered_entries=len(self._buffer) + self._retry_count,
        )

    async def abort(self) -> None:
        """Stop sending and drop everything buffered or in flight (the task is failing and its
        input will be replayed). The writer is unusable afterwards; call :meth:`close`."""
        self._closed = True
        self._cancel_timers()
        self._buffer.clear()
        self._buffered_bytes = 0
        self._retry_heap.clear()
        self._retry_count = 0
        await self._cancel_tasks()
        self._notify()

    async def close(self) -> None:
        """Release timers, tasks, the dead-letter writer and the destination's clients.

        Does not flush: entries still buffered are dropped (call :meth:`flush` first).
        Idempotent.
        """
        if self._closed and self._loop is None:
            return
        self._closed = True
        self._cancel_timers()
        await self._cancel_tasks()
        self._notify()
        try:
            if self._dead_letters is not None:
                await self._dead_letters.close()
        finally:
            await self.release_resources()
            self._loop = None

    # ------------------------------------------------------------------------ internals

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            if self._closed:
                raise SinkError("the async sink writer is closed")
            loop = self._loop = asyncio.get_running_loop()
        return loop

    async def _divert_restored_oversized(self) -> None:
        """Dead-letter the oversized restored entries (only kept when a queue exists)."""
        oversized, self._restored_oversized = self._restored_oversized, []
        if not oversized or self._dead_letters is None:
            return
        limit = self._config.max_record_size_in_bytes
        letters = [
            DeadLetter.from_error(
                self.describe_entry(wrapper.entry),
                "record_too_large",
                RecordTooLargeError(
                    f"restored entry of {wrapper.size_in_bytes} bytes, larger than "
                    f"max_record_size_in_bytes ({limit})"
                ),
                wrapper.failed_attempts,
            )
            for wrapper in oversized
        ]
        await self._dead_letters.write(letters)
        self._counters.num_dead_lettered += len(letters)

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise SinkError("the async sink writer is closed or aborted")

    def _fail(self, error: BaseException) -> None:
        if self._failure is None:
            self._failure = error
            logger.error("async sink writer failed: %s", error)
        self._notify()

    async def _wait_for_change(self, loop: asyncio.AbstractEventLoop) -> None:
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        await waiter

    def _notify(self) -> None:
        waiters = self._waiters
        if waiters:
            self._waiters = []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def _divert_oversized(
        self, entries: Sequence[RequestEntryT], sizes: list[int]
    ) -> tuple[list[RequestEntryT], list[int]]:
        limit = self._config.max_record_size_in_bytes
        oversized = [index for index, size in enumerate(sizes) if size > limit]
        if self._dead_letters is None:
            first = oversized[0]
            raise RecordTooLargeError(
                f"entry {first} of this write is {sizes[first]} bytes, larger than "
                f"max_record_size_in_bytes ({limit}); {len(oversized)} entries are too large. "
                f"Shrink the records, raise the limit if the destination accepts larger ones, "
                f"or configure a dead_letter_queue to divert them"
            )
        letters = [
            DeadLetter.from_error(
                self.describe_entry(entries[index]),
                "record_too_large",
                RecordTooLargeError(
                    f"{sizes[index]} bytes, larger than max_record_size_in_bytes ({limit})"
                ),
                0,
            )
            for index in oversized
        ]
        await self._dead_letters.write(letters)
        self._counters.num_dead_lettered += len(letters)
        skip = set(oversized)
        kept = [index for index in range(len(sizes)) if index not in skip]
        return [entries[index] for index in kept], [sizes[index] for index in kept]

    def _dispatch(self) -> None:
        """Start every request that the thresholds, the in-flight cap and the strategy allow."""
        if self._failure is not None or self._closed:
            return
        loop = self._loop
        if loop is None:
            return
        buffer = self._buffer
        config = self._config
        strategy = self._strategy
        while buffer:
            limit = max(1, min(config.max_batch_size, strategy.get_max_batch_size()))
            if (
                not self._flushing
                and not self._time_flush_due
                and len(buffer) < limit
                and self._buffered_bytes < config.max_batch_size_in_bytes
            ):
                return
            if self._in_flight >= config.max_in_flight_requests:
                return
            now = loop.time()
            if now < self._paused_until:
                self._wake_at(self._paused_until)
                return
            info = RequestInfo(min(limit, len(buffer)), now)
            if strategy.should_block(info):
                self._wake_when_unblocked(info, now)
                return
            batch = self._take_batch(limit)
            if len(batch) != info.batch_size:
                info = RequestInfo(len(batch), now)
            strategy.register_in_flight_request(info)
            self._in_flight += 1
            self._request_seq += 1
            task = loop.create_task(self._run_request(batch, info, self._request_seq))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._time_flush_due = False

    def _take_batch(self, limit: int) -> list[_Buffered]:
        buffer = self._buffer
        max_bytes = self._config.max_batch_size_in_bytes
        if self._buffered_bytes <= max_bytes:
            # Everything buffered fits in one request: only the count limits the batch.
            popleft = buffer.popleft
            batch = [popleft() for _ in range(min(limit, len(buffer)))]
            self._buffered_bytes -= sum(item.size for item in batch)
            return batch
        batch = []
        total = 0
        while buffer and len(batch) < limit:
            size = buffer[0].size
            if batch and total + size > max_bytes:
                break
            batch.append(buffer.popleft())
            total += size
        self._buffered_bytes -= total
        return batch

    def _wake_at(self, when: float) -> None:
        if self._wake_handle is not None:
            if self._wake_time <= when:
                return
            self._wake_handle.cancel()
        assert self._loop is not None
        self._wake_time = when
        self._wake_handle = self._loop.call_at(when, self._on_wake)

    def _on_wake(self) -> None:
        self._wake_handle = None
        self._dispatch()

    def _wake_when_unblocked(self, info: RequestInfo, now: float) -> None:
        delay = 0.0
        if self._strategy_unblock_time:
            delay = self._strategy.seconds_until_unblocked(info)  # type: ignore[attr-defined]
        if delay > 0:
            self._wake_at(now + delay)
        elif not self._in_flight:
            # Nothing in flight will complete and re-dispatch: ask again shortly.
            self._wake_at(now + _BLOCKED_POLL_INTERVAL_S)

    def _on_buffer_timer(self) -> None:
        self._buffer_handle = None
        if not self._buffer or self._closed:
            return
        self._time_flush_due = True
        self._dispatch()
        if self._buffer and self._loop is not None:
            self._buffer_handle = self._loop.call_later(
                self._max_time_in_buffer_s, self._on_buffer_timer
            )

    def _schedule_retry(self, items: list[_Buffered], delay_s: float, seq: int) -> None:
        assert self._loop is not None
        ready = self._loop.time() + delay_s
        heapq.heappush(self._retry_heap, (ready, seq, items))
        self._retry_count += len(items)
        if self._retry_handle is not None:
            if self._retry_handle_time <= ready:
                return
            self._retry_handle.cancel()
        self._retry_handle_time = ready
        self._retry_handle = self._loop.call_at(ready, self._release_retries)

    def _release_retries(self) -> None:
        self._retry_handle = None
        loop = self._loop
        if loop is None or self._closed:
            return
        now = loop.time()
        heap = self._retry_heap
        ready: list[tuple[float, int, list[_Buffered]]] = []
        while heap and heap[0][0] <= now:
            ready.append(heapq.heappop(heap))
        # Older requests first, each in its original order, ahead of newer input.
        ready.sort(key=lambda item: item[1])
        for _, _, items in reversed(ready):
            self._buffer.extendleft(reversed(items))
            self._buffered_bytes += sum(item.size for item in items)
            self._retry_count -= len(items)
        if heap:
            self._retry_handle_time = heap[0][0]
            self._retry_handle = loop.call_at(heap[0][0], self._release_retries)
        if self._buffer_handle is None and self._buffer:
            self._buffer_handle = loop.call_later(self._max_time_in_buffer_s, self._on_buffer_timer)
        self._dispatch()

    async def _run_request(self, batch: list[_Buffered], info: RequestInfo, seq: int) -> None:
        assert self._loop is not None
        outcome = _DELIVERED
        try:
            outcome = await self._deliver(batch, seq)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a bug or a failing dead-letter queue: never lose it in a task
            self._fail(err)
        finally:
            self._in_flight -= 1
            self._strategy.register_completed_request(
                ResultInfo(
                    batch_size=info.batch_size,
                    failed_messages=outcome.failed,
                    request_start_time=info.request_start_time,
                    latency_s=self._loop.time() - info.request_start_time,
                    throttled=outcome.throttled,
                    retry_after_s=outcome.retry_after_s,
                )
            )
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "request of %d entries done: %d to retry, throttled=%s; %s",
                    info.batch_size,
                    outcome.failed,
                    outcome.throttled,
                    self.metrics,
                )
            self._notify()
            self._dispatch()

    async def _deliver(self, batch: list[_Buffered], seq: int) -> _Outcome:
        """Send ``batch`` once and sort its entries into delivered, retried and rejected."""
        assert self._loop is not None
        loop = self._loop
        counters = self._counters
        entries = [item.entry for item in batch]
        counters.num_requests += 1
        started = loop.time()
        try:
            result = await asyncio.wait_for(self.submit_request_entries(entries), self._timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            counters.current_send_time_ms = (loop.time() - started) * 1000.0
            counters.num_failed_requests += 1
            classification = self._classifier.classify(err)
            if classification.retryable:
                return await self._retry(batch, err, classification, seq)
            return await self._reject(batch, err, classification, seq)
        counters.current_send_time_ms = (loop.time() - started) * 1000.0
        if isinstance(result, PartialFailure):
            failed_entries: Sequence[RequestEntryT] = result.entries
            classification = ErrorClassification(
                retryable=True, throttled=result.throttled, retry_after_s=result.retry_after_s
            )
        else:
            failed_entries = result
            classification = ErrorClassification(retryable=True)
        if not failed_entries:
            counters.num_records_out += len(batch)
            counters.num_bytes_out += sum(item.size for item in batch)
            return _DELIVERED
        counters.num_failed_requests += 1
        failed, delivered = self._split_failed(batch, failed_entries)
        counters.num_records_out += len(delivered)
        counters.num_bytes_out += sum(item.size for item in delivered)
        error = RetryableDeliveryError(
            f"the destination reported {len(failed)} of {len(batch)} entries of a request as "
            f"failed",
            retry_after_s=classification.retry_after_s,
        )
        return await self._retry(failed, error, classification, seq)

    def _split_failed(
        self, batch: list[_Buffered], failed_entries: Sequence[RequestEntryT]
    ) -> tuple[list[_Buffered], list[_Buffered]]:
        """Match the returned entries to the buffered ones: by identity, else by equality."""
        for key in (id, None):
            pending: Counter[Any] = Counter(
                key(entry) if key else _EqualityKey(entry) for entry in failed_entries
            )
            failed: list[_Buffered] = []
            delivered: list[_Buffered] = []
            for item in batch:
                marker = key(item.entry) if key else _EqualityKey(item.entry)
                if pending[marker] > 0:
                    pending[marker] -= 1
                    failed.append(item)
                else:
                    delivered.append(item)
            if len(failed) == len(failed_entries):
                return failed, delivered
        raise DeliveryError(
            f"submit_request_entries returned {len(failed_entries)} entries to retry, but only "
            f"{len(failed)} of them were part of the request; a destination must return the "
            f"entry objects it was given"
        )

    async def _retry(
        self,
        items: list[_Buffered],
        error: BaseException,
        classification: ErrorClassification,
        seq: int,
    ) -> _Outcome:
        assert self._loop is not None
        backoff = self._backoff
        counters = self._counters
        if classification.throttled:
            counters.num_throttled_requests += 1
        retry_after = backoff.capped_retry_after(classification.retry_after_s)
        if retry_after:
            # The destination asked every client to hold off, not just these entries.
            self._paused_until = max(self._paused_until, self._loop.time() + retry_after)
        again: list[_Buffered] = []
        exhausted: list[_Buffered] = []
        if classification.throttled:
            # A busy destination is no fault of the entries: throttling slows the job down
            # (back-pressure) instead of spending the budget and dead-lettering good records.
            for item in items:
                item.throttles += 1
            again = items
        else:
            for item in items:
                item.attempts += 1
                (exhausted if item.attempts >= backoff.max_attempts else again).append(item)
        if again:
            counters.num_retries += len(again)
            if classification.throttled and classification.retry_after_s is not None:
                # The destination said when to come back: an ever-longer backoff on top would
                # only leave capacity unused (pacing is the rate limiting strategy's job).
                failures = max(item.attempts for item in again)
            else:
                failures = max(item.attempts + item.throttles for item in again)
            retry_number = max(1, failures) - 1
            delay = backoff.delay(retry_number, self._rng, classification.retry_after_s)
            self._schedule_retry(again, delay, seq)
        if exhausted:
            await self._dead_letter_or_fail(
                exhausted,
                "retries_exhausted",
                error,
                lambda: RetriesExhaustedError(
                    f"{len(exhausted)} entries still failed after {backoff.max_attempts} attempts "
                    f"(last error: {type(error).__name__}: {error}); raise "
                    f"RetryPolicy.max_attempts, lower the send rate, or configure a "
                    f"dead_letter_queue to divert them"
                ),
            )
        return _Outcome(len(items), classification.throttled, classification.retry_after_s)

    async def _reject(
        self,
        batch: list[_Buffered],
        error: BaseException,
        classification: ErrorClassification,
        seq: int,
    ) -> _Outcome:
        """A fatal error: isolate the offending entries for the dead-letter queue, or fail."""
        if self._dead_letters is None or not classification.caused_by_entries:
            hint = (
                "configure a dead_letter_queue to divert rejected entries and keep the job running"
                if self._dead_letters is None
                else "the destination refused the request as a whole, so dead-lettering its "
                "entries would only hide the problem; check the destination's configuration"
            )
            self._fail_fatally(batch, error, hint)
            return _DELIVERED
        if len(batch) == 1:
            await self._dead_letter_or_fail(batch, "fatal", error, lambda: error)
            return _DELIVERED
        # Split to isolate the poison entries; the halves share this request's in-flight slot
        # and do not consume the retry budget of the innocent entries.
        middle = len(batch) // 2
        first = await self._deliver(batch[:middle], seq)
        second = await self._deliver(batch[middle:], seq)
        return first.combine(second)

    def _fail_fatally(self, batch: list[_Buffered], error: BaseException, hint: str) -> None:
        failure = FatalDeliveryError(
            f"the destination rejected a request of {len(batch)} entries with a fatal error "
            f"({type(error).__name__}: {error}); {hint}",
            caused_by_entries=False,
        )
        failure.__cause__ = error
        self._fail(failure)

    async def _dead_letter_or_fail(
        self,
        items: list[_Buffered],
        reason: DeadLetterReason,
        error: BaseException,
        failure: Callable[[], BaseException],
    ) -> None:
        if self._dead_letters is None:
            exception = failure()
            if exception is not error:
                exception.__cause__ = error
            self._fail(exception)
            return
        letters = [
            DeadLetter.from_error(self.describe_entry(item.entry), reason, error, item.attempts)
            for item in items
        ]
        await self._dead_letters.write(letters)
        self._counters.num_dead_lettered += len(letters)
        logger.warning("dead-lettered %d entries (%s): %s", len(letters), reason, error)

    def _cancel_timers(self) -> None:
        for handle in (self._retry_handle, self._buffer_handle, self._wake_handle):
            if handle is not None:
                handle.cancel()
        self._retry_handle = self._buffer_handle = self._wake_handle = None

    async def _cancel_tasks(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


class _EqualityKey:
    """Hashes any entry (even an unhashable one) by equality, for matching returned entries."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __hash__(self) -> int:
        try:
            return hash(self.value)
        except TypeError:
            return hash(repr(self.value))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _EqualityKey) and bool(self.value == other.value)
