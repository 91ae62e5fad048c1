"""AsyncSink's synchronous task writer: what the Spark runtime drives, tested without Spark."""

from __future__ import annotations

import pickle
import threading
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest

from framework.asyncsink import (
    AsyncSink,
    AsyncSinkTaskWriter,
    AsyncSinkWriter,
    AsyncSinkWriterConfig,
    BufferedRequestState,
    BufferedRequestStateSerializer,
    BytesEntrySerializer,
    RetryPolicy,
)
from framework.errors import FatalDeliveryError, UnsupportedTypeError
from framework.sink import Epoch, SinkWriter, VersionedSerializer, WriterContext

CONTEXT = WriterContext(
    epoch=Epoch(app_id="app", epoch_id=0, writer_identity="w", run_id="r"),
    partition_id=0,
    attempt_number=0,
    task_attempt_id=1,
)


class CsvConverter:
    """Row -> b"id,name"; refuses rows without an id."""

    def apply(self, element: dict[str, Any], context: WriterContext | None) -> bytes:
        if element.get("id") is None:
            raise UnsupportedTypeError("row without id")
        return f"{element['id']},{element['name']}".encode()


class ListWriter(AsyncSinkWriter[dict[str, Any], bytes]):
    def __init__(self, delivered: list[bytes], reject: bytes | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.delivered = delivered
        self.reject = reject

    async def submit_request_entries(self, entries: list[bytes]) -> list[bytes]:
        if self.reject is not None and self.reject in entries:
            raise FatalDeliveryError("rejected")
        self.delivered.extend(entries)
        return []

    def size_in_bytes(self, entry: bytes) -> int:
        return len(entry)


class ListSink(AsyncSink[bytes]):
    """Delivers into a list of this process (the runtime would pickle a real sink). Builds its
    writer from the shared settings, as HttpSink and KinesisSink do."""

    def __init__(self, *, max_batch_size: int = 4, reject: bytes | None = None) -> None:
        super().__init__(
            element_converter=CsvConverter(),
            config=AsyncSinkWriterConfig(
                max_batch_size=max_batch_size,
                max_buffered_requests=100,
                max_time_in_buffer_ms=60_000,
            ),
            retry_policy=RetryPolicy(initial_backoff_ms=1, max_backoff_ms=2),
        )
        self.delivered: list[bytes] = []
        self.reject = reject

    def create_async_writer(
        self,
        context: WriterContext | None,
        initial_state: Sequence[BufferedRequestState[bytes]] = (),
    ) -> ListWriter:
        return ListWriter(self.delivered, self.reject, **self.writer_kwargs(context, initial_state))

    def state_serializer(self) -> VersionedSerializer[BufferedRequestState[bytes]]:
        return BufferedRequestStateSerializer(BytesEntrySerializer())


def batch(ids: range) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"id": list(ids), "name": [f"n{i}" for i in ids]})


def expected(ids: range) -> list[bytes]:
    return [f"{i},n{i}".encode() for i in ids]


def test_the_runtime_contract_write_prepare_commit_close():
    sink = ListSink()
    assert sink.create_global_committer() is None
    threads_before = threading.active_count()
    writer = sink.create_writer(CONTEXT)
    assert isinstance(writer, SinkWriter)
    writer.write(batch(range(0, 5)))
    writer.write(batch(range(5, 7)))
    writer.write(pa.RecordBatch.from_pydict({"id": [], "name": []}))
    assert writer.prepare_commit(flush=True) == []
    # Complete on return of prepare_commit: every row delivered, in order.
    assert sink.delivered == expected(range(7))
    assert writer.snapshot_state() == []
    assert isinstance(writer, AsyncSinkTaskWriter)
    metrics = writer.async_writer.metrics if writer.async_writer else None
    assert metrics is not None and metrics.num_records_out == 7
    writer.close()
    writer.close()
    assert threading.active_count() == threads_before


def test_tables_and_plain_rows_are_accepted_too():
    sink = ListSink()
    writer = sink.create_writer(CONTEXT)
    writer.write(pa.table({"id": [1], "name": ["a"]}))
    writer.write([{"id": 2, "name": "b"}])
    writer.prepare_commit(flush=True)
    writer.close()
    assert sink.delivered == [b"1,a", b"2,b"]


def test_a_fatal_rejection_surfaces_from_prepare_commit_and_abort_then_close_clean_up():
    sink = ListSink(reject=b"3,n3")
    writer = sink.create_writer(CONTEXT)
    writer.write(batch(range(0, 6)))
    with pytest.raises(FatalDeliveryError, match="dead_letter_queue"):
        writer.prepare_commit(flush=True)
    writer.abort()
    writer.close()


def test_a_conversion_error_fails_the_write():
    writer = ListSink().create_writer(CONTEXT)
    with pytest.raises(UnsupportedTypeError, match="row without id"):
        writer.write([{"id": None, "name": "x"}])
    writer.abort()
    writer.close()


def test_buffered_entries_survive_snapshot_and_restore():
    sink = ListSink(max_batch_size=50)
    writer = sink.create_writer(CONTEXT)
    writer.write(batch(range(3)))  # below every threshold: still buffered
    state = writer.snapshot_state()
    assert len(state) == 1 and isinstance(state[0], bytes)
    writer.abort()
    writer.close()
    assert sink.delivered == []

    restored = sink.restore_writer(CONTEXT, pickle.loads(pickle.dumps(state)))
    restored.write(batch(range(3, 4)))
    restored.prepare_commit(flush=True)
    restored.close()
    assert sink.delivered == expected(range(4))


def test_a_restored_writer_without_new_input_still_delivers_on_prepare_commit():
    sink = ListSink(max_batch_size=50)
    first = sink.create_writer(CONTEXT)
    first.write(batch(range(2)))
    state = first.snapshot_state()
    first.abort()
    first.close()
    restored = sink.restore_writer(CONTEXT, state)
    assert restored.prepare_commit(flush=True) == []
    restored.close()
    assert sink.delivered == expected(range(2))


def test_a_sink_of_plain_values_pickles():
    sink = ListSink()
    clone = pickle.loads(pickle.dumps(sink))
    assert clone.config == sink.config
