"""HttpSink run by Spark through TwoPhaseSink: at-least-once while the destination throttles
and fails, poison records in the dead-letter queue, and Spark's task retries.

The destination is our throttling server on 127.0.0.1, in the driver process; Spark's Python
workers reach it over loopback.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import fsspec
import pytest

from committers.http import HttpSink
from committers.tests._spark_helpers import write_source_file
from committers.tests._throttling_server import ThrottlingServer
from framework import TwoPhaseSink
from framework.asyncsink import AsyncSinkWriterConfig, JsonLinesDeadLetterQueue, RetryPolicy
from framework.errors import FatalDeliveryError
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
