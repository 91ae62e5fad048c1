"""A Kafka broker killed (SIGKILL) while a stream reads it into Delta, then restarted with its
data: the query waits or fails as Spark's Kafka source does, nothing is committed that should
not be, and once the broker is back (and the query restarted from its checkpoint if it
failed) every record is in the table exactly once by (partition, offset)."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from committers.delta import DeltaSink
from committers.tests._campaign_kafka import produce, start_broker
from framework import TwoPhaseSink

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TOPIC = "orders"
WAIT_SECONDS = 120


def _produce(bootstrap: str, first: int, count: int) -> set[tuple[int, int]]:
    """Records of ids first..first+count-1; where each landed."""
    records = [(str(i), json.dumps({"id": i})) for i in range(first, first + count)]
    return produce(bootstrap, TOPIC, records)


def _query(spark, bootstrap: str, table: str, checkpoint: str, trigger: dict):  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    records = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 50)
        # Fail within seconds, not minutes, while the broker is away.
        .option("kafka.default.api.timeout.ms", "5000")
        .option("kafka.request.timeout.ms", "3000")
        .option("fetchOffset.numRetries", "2")
        .option("fetchOffset.retryIntervalMs", "500")
        .load()
    )
    rows = records.select(
        F.get_json_object(F.col("value").cast("string"), "$.id").cast("long").alias("id"),
        "partition",
        "offset",
    )
    sink = TwoPhaseSink(DeltaSink(table, app_id="kafka-restart"))
    return sink.write_stream(rows, checkpoint_location=checkpoint, trigger=trigger)


def _rows(table: str) -> list[dict]:
    from deltalake import DeltaTable

    try:
        return DeltaTable(table).to_pyarrow_table(columns=["id", "partition", "offset"]).to_pylist()
    except Exception:  # (not created yet)
        return []


def _wait_for(condition, seconds: float = WAIT_SECONDS) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.5)
    return False


@pytest.mark.smoke  # make check: the end-to-end test of its feature
def test_a_broker_killed_and_restarted_under_a_running_stream_loses_and_doubles_nothing(
    spark, tmp_path
):
    broker = start_broker(tmp_path / "broker")
    table, checkpoint = str(tmp_path / "table"), str(tmp_path / "checkpoint")
    try:
        landed = _produce(broker.bootstrap, 0, 300)
        query = _query(spark, broker.bootstrap, table, checkpoint, {"processingTime": "1 second"})
        assert _wait_for(lambda: len(_rows(table)) >= 100), "no batch committed"
        broker.kill()  # mid-stream: batches may be planned, staged or committing
        time.sleep(5)
        broker.start()  # same ports, same data
        landed |= _produce(broker.bootstrap, 300, 300)
        _wait_for(lambda: len(_rows(table)) >= 600 or not query.isActive)
        failed = not query.isActive
        query.stop()
        if failed:  # as Spark's Kafka source may: restart from the checkpoint and drain
            _query(
                spark, broker.bootstrap, table, checkpoint, {"availableNow": True}
            ).awaitTermination()
        rows = _rows(table)
        positions = Counter((r["partition"], r["offset"]) for r in rows)
        assert sum(n - 1 for n in positions.values()) == 0  # no duplicates
        assert set(positions) == landed  # nothing lost, nothing else
        assert sorted(r["id"] for r in rows) == list(range(600))
    finally:
        broker.stop()
