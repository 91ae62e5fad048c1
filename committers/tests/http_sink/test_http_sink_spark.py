"""HttpSink run by Spark through TwoPhaseSink: at-least-once while the destination throttles
and fails, poison records in the dead-letter queue, and Spark's task retries.

The destination is our throttling server on 127.0.0.1, in the driver process; Spark's Python
workers reach it over loopback.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Any

import fsspec
import pytest

from committers.http import IDEMPOTENCY_KEY_HEADER, HttpSink
from committers.tests._spark_helpers import write_source_file
from committers.tests._throttling_server import ServerStats, ThrottlingServer
from framework import TwoPhaseSink
from framework.asyncsink import (
    DEFAULT_KEY_FIELD,
    AsyncSinkWriterConfig,
    IdempotencyKeys,
    JsonLinesDeadLetterQueue,
    RetryPolicy,
)
from framework.errors import ConfigurationError, FatalDeliveryError
from framework.sink import SinkWriter, WriterContext

pytestmark = [pytest.mark.spark]

CONFIG = AsyncSinkWriterConfig(
    max_batch_size=50,
    max_in_flight_requests=4,
    max_buffered_requests=500,
    max_time_in_buffer_ms=200,
    request_timeout_ms=5_000,
)
RETRIES = RetryPolicy(max_attempts=20, initial_backoff_ms=5, max_backoff_ms=100)


def make_sink(url: str, **kwargs: Any) -> HttpSink:
    return HttpSink(url, config=CONFIG, retry_policy=RETRIES, **kwargs)


def flaky_server() -> ThrottlingServer:
    """Capacity-limited (429 past 150 requests/s), and 10% of admitted requests fail: 5% with
    a 500, 5% with some entries reported failed in a 200."""
    return ThrottlingServer(capacity=150, failure_rate=0.05, partial_failure_rate=0.05, seed=11)


def test_a_bounded_job_delivers_every_row_while_the_destination_throttles_and_fails(spark):
    df = spark.range(0, 3000, numPartitions=4).selectExpr("id", "concat('row-', id) AS name")
    with flaky_server() as server:
        metrics = TwoPhaseSink(make_sink(server.url)).write(df)
        received = server.records
        stats = server.stats
    assert {record["id"] for record in received} == set(range(3000))
    assert all(record["name"] == f"row-{record['id']}" for record in received)
    assert (metrics.status, metrics.rows) == ("delivered", 3000)
    # The destination really misbehaved: rejections, failures and partial failures happened.
    assert stats.rejected_requests > 0
    assert stats.failed_requests > 0
    assert stats.partially_failed_requests > 0
    # The executors' writer counters reach the driver, summed over the tasks.
    counters = metrics.writer_metrics
    assert counters["num_records_out"] == 3000 and counters["num_dead_lettered"] == 0
    assert counters["num_requests"] == stats.requests
    assert counters["num_throttled_requests"] == stats.rejected_requests
    assert counters["num_retries"] > 0
    assert f"num_throttled_requests={stats.rejected_requests}" in metrics.log_line()


@pytest.mark.smoke  # make check: the end-to-end test of its feature
def test_a_streaming_query_delivers_every_micro_batch_before_spark_records_it(spark, tmp_path):
    source = tmp_path / "source"
    for index in range(3):
        write_source_file(source, f"part-{index}", range(index * 400, (index + 1) * 400))
    stream = spark.readStream.schema("id LONG").option("maxFilesPerTrigger", 1).json(str(source))
    with flaky_server() as server:
        runtime = TwoPhaseSink(make_sink(server.url))
        query = runtime.write_stream(
            stream,
            checkpoint_location=str(tmp_path / "checkpoint"),
            trigger={"availableNow": True},
        )
        query.awaitTermination(timeout=180)
        received = {record["id"] for record in server.records}
    assert query.exception() is None
    assert received == set(range(1200))
    assert [(b.status, b.rows) for b in runtime.batches] == [("delivered", 400)] * 3


def test_a_poison_record_lands_in_the_dead_letter_queue_and_the_rest_is_delivered(spark, tmp_path):
    df = spark.range(0, 1000, numPartitions=2).selectExpr("id", "id = 777 AS poison")
    queue = JsonLinesDeadLetterQueue(str(tmp_path / "dlq"))
    with ThrottlingServer(capacity=100) as server:
        TwoPhaseSink(make_sink(server.url, dead_letter_queue=queue, app_id="orders")).write(df)
        delivered = Counter(record["id"] for record in server.records)
    assert set(delivered) == set(range(1000)) - {777}
    assert max(delivered.values()) == 1
    fs = fsspec.filesystem("file")
    lines = [
        json.loads(line)
        for path in fs.glob(str(tmp_path / "dlq" / "*.jsonl"))
        for line in fs.cat(path).splitlines()
    ]
    assert [line["entry"] for line in lines] == [{"id": 777, "poison": True}]
    assert lines[0]["reason"] == "fatal"
    assert "answered 400" in lines[0]["error"]
    assert lines[0]["app_id"] == "orders:write"


def test_without_a_dead_letter_queue_a_poison_record_fails_the_job_clearly(spark):
    df = spark.range(0, 100, numPartitions=1).selectExpr("id", "id = 5 AS poison")
    with ThrottlingServer() as server, pytest.raises(FatalDeliveryError, match="answered 400"):
        TwoPhaseSink(make_sink(server.url)).write(df)


class _FailsAfterDelivering(SinkWriter[Any, None]):
    """Delivers everything, then fails the first attempt of partition 0."""

    def __init__(self, inner: SinkWriter[Any, None], context: WriterContext) -> None:
        self._inner = inner
        self._context = context

    def write(self, batch: Any) -> None:
        self._inner.write(batch)

    def prepare_commit(self, flush: bool) -> list[None]:
        result = self._inner.prepare_commit(flush)
        if self._context.partition_id == 0 and self._context.attempt_number == 0:
            raise RuntimeError("task lost after delivering")
        return result

    def abort(self) -> None:
        self._inner.abort()

    def close(self) -> None:
        self._inner.close()


class FirstAttemptFailsHttpSink(HttpSink):
    def create_writer(self, context: WriterContext) -> SinkWriter[Any, None]:
        return _FailsAfterDelivering(super().create_writer(context), context)


def test_a_failed_task_is_retried_by_spark_and_its_rows_arrive_at_least_once(spark):
    df = spark.range(0, 400, numPartitions=2).selectExpr("id")
    with ThrottlingServer() as server:
        sink = FirstAttemptFailsHttpSink(server.url, config=CONFIG, retry_policy=RETRIES)
        TwoPhaseSink(sink).write(df)
        delivered = Counter(record["id"] for record in server.records)
    assert set(delivered) == set(range(400))
    # Partition 0 ran twice: its rows arrived twice (at-least-once), the others once.
    assert sorted(Counter(delivered.values()).items()) == [(1, 200), (2, 200)]


def test_idempotency_keys_let_a_deduplicating_endpoint_store_every_row_once(spark):
    """Rows delivered again by a retried request whose answer was lost, by a retried task and by
    a replayed batch (the same epoch written again) carry the same key each time: the endpoint,
    deduplicating by it, stores every row exactly once and counts the duplicates it dropped.
    Without keys the same run stores duplicates."""
    df = spark.range(0, 2000, numPartitions=4).selectExpr("id", "concat('row-', id) AS name")

    def deliver(keys: IdempotencyKeys | None) -> tuple[Counter, ServerStats]:
        with ThrottlingServer(
            failure_rate=0.05,
            partial_failure_rate=0.05,
            lost_ack_rate=0.2,
            seed=5,
            dedup_field=DEFAULT_KEY_FIELD,
        ) as server:
            sink = FirstAttemptFailsHttpSink(
                server.url,
                config=CONFIG,
                retry_policy=RETRIES,
                app_id="keyed",
                idempotency_keys=keys,
            )
            for _ in range(2):  # the batch, then its replay
                TwoPhaseSink(sink).write(df, epoch_id=7)
            return Counter(record["id"] for record in server.records), server.stats

    stored, stats = deliver(IdempotencyKeys())
    assert stored == Counter(range(2000))  # each row once
    assert stats.lost_acks > 0 and stats.unkeyed_records == 0
    # Each row was delivered at least twice (the replay), partition 0's three times (its
    # failed first attempt): every delivery after the first was dropped as a duplicate.
    assert stats.duplicate_records >= 2000 + 500
    unkeyed, _ = deliver(None)
    assert set(unkeyed) == set(range(2000)) and max(unkeyed.values()) > 1


def test_keys_as_idempotency_key_headers_of_one_record_requests(spark):
    """Keys from a column of the rows, sent as the Idempotency-Key header: the endpoint
    deduplicates by the header."""
    df = spark.range(0, 120, numPartitions=2).selectExpr("id", "id * 10 AS order_id")
    with ThrottlingServer(lost_ack_rate=0.3, seed=3, dedup_header=IDEMPOTENCY_KEY_HEADER) as server:
        keys = IdempotencyKeys(field="key", from_column="order_id")
        sink = HttpSink(
            server.url,
            config=dataclasses.replace(CONFIG, max_batch_size=1),
            retry_policy=RETRIES,
            app_id="orders",
            idempotency_keys=keys,
            idempotency_header=True,
        )
        TwoPhaseSink(sink).write(df, epoch_id=0)
        TwoPhaseSink(sink).write(df, epoch_id=1)  # another epoch: the keys are the rows'
        records, stats = server.records, server.stats
    assert sorted(r["id"] for r in records) == list(range(120))
    assert all(r["key"] == str(r["order_id"]) for r in records)
    assert stats.duplicate_records >= 120 and stats.lost_acks > 0
    with pytest.raises(ConfigurationError, match="one-record requests"):
        make_sink(server.url, idempotency_keys=keys, idempotency_header=True)
