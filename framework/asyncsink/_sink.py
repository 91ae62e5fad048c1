"""AsyncSink: runs an asyncio :class:`AsyncSinkWriter` behind the synchronous Sink API.

The engine (the Spark runtime) creates one :class:`AsyncSinkTaskWriter` per task attempt, calls
``write(batch)`` for every Arrow record batch, then ``prepare_commit(flush=True)`` and
``close()`` (or ``abort()`` and ``close()`` on failure). Each task writer owns an event loop in a
dedicated thread, so requests keep progressing while the task thread reads and converts the next
batch; ``write`` hands the converted entries over and blocks only for back-pressure.

Guarantee (at-least-once): ``prepare_commit(flush=True)`` returns ``[]`` only once every entry
written so far was accepted by the destination or dead-lettered; otherwise it raises, the task
fails and the engine replays its input. There is no global committer.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from abc import abstractmethod
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any, Generic, TypeVar

from framework.asyncsink._classify import DEFAULT_ERROR_CLASSIFIER, ErrorClassifier
from framework.asyncsink._config import AsyncSinkWriterConfig, RetryPolicy
from framework.asyncsink._converter import ElementConverter
from framework.asyncsink._deadletter import DeadLetterQueue
from framework.asyncsink._idempotency import IdempotencyKeys
from framework.asyncsink._ratelimit import (
    CongestionControlRateLimitingStrategy,
    RateLimitingStrategyFactory,
)
from framework.asyncsink._state import BufferedRequestState
from framework.asyncsink._writer import AsyncSinkWriter
from framework.errors import ConfigurationError, SinkError
from framework.sink import (
    GlobalCommitter,
    Sink,
    SinkWriter,
    VersionedSerializer,
    WriterContext,
    deserialize_versioned,
    serialize_versioned,
)

__all__ = ["AsyncSink", "AsyncSinkTaskWriter", "Row"]

RequestEntryT = TypeVar("RequestEntryT")
T = TypeVar("T")

Row = dict[str, Any]
"""One input row, as ``pyarrow.RecordBatch.to_pylist()`` produces it."""

logger = logging.getLogger(__name__)
_thread_ids = itertools.count(1)


class AsyncSink(Sink[Any, None, None], Generic[RequestEntryT]):
    """Base of at-least-once sinks for destinations without transactions.

    A subclass builds its :class:`AsyncSinkWriter` in :meth:`create_async_writer`; everything
    else (per-task event loop, back-pressure, flushing at the end of each task) is done here.
    The sink is pickled to every task: keep only plain values in it (URLs, options, configs,
    classifiers, factories) and create clients inside the writer, on the executor.

    The constructor holds the settings every destination shares, and :meth:`writer_kwargs`
    turns them into the writer's keyword arguments, so a destination keeps only what is its
    own (an endpoint, headers, client options) and its defaults::

        class MySink(AsyncSink[bytes]):
            def __init__(self, url: str, **settings: Any) -> None:
                super().__init__(element_converter=MyConverter(), **settings)
                self.url = url

            def create_async_writer(self, context, initial_state=()):
                return MyWriter(url=self.url, **self.writer_kwargs(context, initial_state))

    Args:
        element_converter: turns rows into request entries.
        config: buffering hints; :class:`AsyncSinkWriterConfig` defaults when ``None``.
        retry_policy: retry budget and backoff; :class:`RetryPolicy` defaults when ``None``.
        rate_limiting: factory of each writer's rate limiting strategy; Flink's AIMD
            congestion control when ``None``.
        error_classifier: decides which errors raised by a request are retryable.
        dead_letter_queue: where rejected entries go; ``None`` fails the job instead.
        app_id: application identity (see :class:`~framework.sink.Sink`).
        idempotency_keys: stamp every row with a key that stays the same when it is delivered
            again (see :class:`IdempotencyKeys`); ``None``: no key.
    """

    def __init__(
        self,
        *,
        element_converter: ElementConverter[Row, RequestEntryT],
        config: AsyncSinkWriterConfig | None = None,
        retry_policy: RetryPolicy | None = None,
        rate_limiting: RateLimitingStrategyFactory | None = None,
        error_classifier: ErrorClassifier = DEFAULT_ERROR_CLASSIFIER,
        dead_letter_queue: DeadLetterQueue | None = None,
        app_id: str | None = None,
        idempotency_keys: IdempotencyKeys | None = None,
    ) -> None:
        if idempotency_keys is not None and not isinstance(idempotency_keys, IdempotencyKeys):
            raise ConfigurationError(
                f"idempotency_keys must be an IdempotencyKeys or None, got {idempotency_keys!r}"
            )
        self.element_converter = element_converter
        self.idempotency_keys = idempotency_keys
        self.config = config if config is not None else AsyncSinkWriterConfig()
        self.retry_policy = retry_policy if retry_policy is not None else RetryPolicy()
        self.rate_limiting: RateLimitingStrategyFactory = (
            rate_limiting
            if rate_limiting is not None
            else CongestionControlRateLimitingStrategy.from_config
        )
        self.error_classifier = error_classifier
        self.dead_letter_queue = dead_letter_queue
        self.app_id = app_id

    def writer_kwargs(
        self,
        context: WriterContext | None,
        initial_state: Sequence[BufferedRequestState[RequestEntryT]] = (),
    ) -> dict[str, Any]:
        """The keyword arguments of :class:`AsyncSinkWriter` for one task attempt: this sink's
        converter, config, retry policy, classifier and dead-letter queue, a fresh rate limiting
        strategy, ``context`` and ``initial_state``. Needs the constructor to have run."""
        return {
            "element_converter": self.element_converter,
            "config": self.config,
            "retry_policy": self.retry_policy,
            "error_classifier": self.error_classifier,
            "rate_limiting_strategy": self.rate_limiting(self.config),
            "dead_letter_queue": self.dead_letter_queue,
            "idempotency_keys": self.idempotency_keys,
            "context": context,
            "initial_state": initial_state,
        }

    @abstractmethod
    def create_async_writer(
        self,
        context: WriterContext | None,
        initial_state: Sequence[BufferedRequestState[RequestEntryT]] = (),
    ) -> AsyncSinkWriter[Row, RequestEntryT]:
        """Build the writer of one task attempt. Runs on the writer's event loop thread."""

    def state_serializer(self) -> VersionedSerializer[BufferedRequestState[RequestEntryT]] | None:
        """How buffered entries are stored in snapshots; ``None`` keeps them as objects."""
        return None

    def create_writer(self, context: WriterContext) -> SinkWriter[Any, None]:
        """A task writer running this sink's async writer; see :class:`AsyncSinkTaskWriter`."""
        return AsyncSinkTaskWriter(self, context)

    def restore_writer(
        self, context: WriterContext, recovered_state: list[Any]
    ) -> SinkWriter[Any, None]:
        """A task writer that first sends the entries of ``recovered_state`` (the output of
        earlier ``snapshot_state`` calls).

        Raises:
            SinkError: a snapshot cannot be read.
        """
        serializer = self.state_serializer()
        states: list[BufferedRequestState[RequestEntryT]] = []
        for item in recovered_state:
            if isinstance(item, BufferedRequestState):
                states.append(item)
            elif serializer is not None and isinstance(item, bytes | bytearray):
                states.append(deserialize_versioned(serializer, bytes(item)))
            else:
                raise SinkError(
                    f"cannot restore buffered state of type {type(item).__name__}; "
                    f"expected the output of snapshot_state()"
                )
        return AsyncSinkTaskWriter(self, context, initial_state=states)

    def create_global_committer(self) -> GlobalCommitter[None, None] | None:
        """Async sinks commit nothing: the end of each task is their checkpoint."""
        return None


#: WriterMetrics counters that add up across tasks (the others are gauges).
SUMMED_COUNTERS = (
    "num_records_out",
    "num_bytes_out",
    "num_requests",
    "num_failed_requests",
    "num_throttled_requests",
    "num_retries",
    "num_dead_lettered",
)


class AsyncSinkTaskWriter(SinkWriter[Any, None], Generic[RequestEntryT]):
    """Drives an :class:`AsyncSinkWriter` for one task from synchronous code.

    Input batches may be ``pyarrow.RecordBatch`` / ``pyarrow.Table`` (rows come from
    ``to_pylist()``) or any iterable of rows. Conversion to request entries runs on the calling
    thread; buffering and requests run on the writer's own event-loop thread.

    Args:
        sink: the sink whose writer to run.
        context: the task attempt.
        initial_state: buffered entries to send first (see :meth:`AsyncSink.restore_writer`).
    """

    def __init__(
        self,
        sink: AsyncSink[RequestEntryT],
        context: WriterContext | None,
        initial_state: Sequence[BufferedRequestState[RequestEntryT]] = (),
    ) -> None:
        self._sink = sink
        self._context = context
        self._initial_state = list(initial_state)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._writer: AsyncSinkWriter[Row, RequestEntryT] | None = None
        self._closed = False

    @property
    def async_writer(self) -> AsyncSinkWriter[Row, RequestEntryT] | None:
        """The underlying writer (``None`` before the first write), e.g. to read its metrics."""
        return self._writer

    def write(self, batch: Any) -> None:
        """Convert and buffer the rows of ``batch``; blocks while the buffer is full.

        Raises:
            InputError: a row cannot be converted, or a record is too large (no dead-letter
                queue configured).
            DeliveryError: an earlier request failed for good.
        """
        writer = self._ensure_writer()
        rows = batch.to_pylist() if hasattr(batch, "to_pylist") else list(batch)
        if not rows:
            return
        entries = writer.convert(rows)
        self._call(writer.write_entries(entries))

    def prepare_commit(self, flush: bool) -> list[None]:
        """With ``flush=True``, wait until every entry is delivered or dead-lettered.

        Raises:
            DeliveryError: some entries were rejected for good; the task must fail.
        """
        if flush and (self._writer is not None or self._initial_state):
            writer = self._ensure_writer()
            self._call(writer.flush())
        return []

    def task_metrics(self) -> dict[str, int]:
        """The writer's cumulative counters (records and bytes out, requests, failed,
        throttled, retries, dead-lettered), summed per batch by the engine."""
        if self._writer is None:
            return {}
        return {name: int(getattr(self._writer.metrics, name)) for name in SUMMED_COUNTERS}

    def snapshot_state(self) -> list[Any]:
        """The entries not yet sent, serialized with the sink's state serializer if it has one
        (empty after ``prepare_commit(flush=True)``)."""
        if self._writer is None:
            return list(self._initial_state)
        state = self._call(_snapshot(self._writer))
        if not state.entries:
            return []
        serializer = self._sink.state_serializer()
        return [state if serializer is None else serialize_versioned(serializer, state)]

    def abort(self) -> None:
        """Drop buffered and in-flight entries; the engine replays the task's input."""
        if self._writer is not None and self._loop is not None:
            self._call(self._writer.abort())

    def close(self) -> None:
        """Close the writer and stop its event-loop thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            if self._writer is not None:
                self._call(self._writer.close())
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
            self._loop = self._thread = None

    def _ensure_writer(self) -> AsyncSinkWriter[Row, RequestEntryT]:
        if self._writer is not None:
            return self._writer
        if self._closed:
            raise SinkError("the async sink task writer is closed")
        loop = asyncio.new_event_loop()
        partition = self._context.partition_id if self._context is not None else "local"
        thread = threading.Thread(
            target=_run_loop,
            args=(loop,),
            name=f"async-sink-p{partition}-{next(_thread_ids)}",
            daemon=True,  # a killed task must not keep its worker alive
        )
        thread.start()
        self._loop, self._thread = loop, thread
        self._writer = self._call(_create(self._sink, self._context, self._initial_state))
        self._initial_state = []
        return self._writer

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    loop.run_forever()


async def _create(
    sink: AsyncSink[RequestEntryT],
    context: WriterContext | None,
    initial_state: Iterable[BufferedRequestState[RequestEntryT]],
) -> AsyncSinkWriter[Row, RequestEntryT]:
    return sink.create_async_writer(context, tuple(initial_state))


async def _snapshot(
    writer: AsyncSinkWriter[Row, RequestEntryT],
) -> BufferedRequestState[RequestEntryT]:
    return writer.snapshot_state()
