"""Kafka into Delta, exactly once: a real broker, Spark's Kafka source, a crash and a restart.

    make kafka-demo        # or: python examples/kafka_to_delta.py (after `make jars`)

What it does: starts a single-node Kafka broker on 127.0.0.1 (KRaft mode, from the jars
``make jars`` fetched; ``tools/kafka_broker.py``), produces order events to a topic of three
partitions, and streams them with ``spark.readStream.format("kafka")`` through
``TwoPhaseSink(DeltaSink(...))`` into a local Delta table, keeping each record's partition and
offset. The job stops; a crash is simulated by making the checkpoint forget its newest finished
batch; more events arrive; the job restarts from its checkpoint. The replayed batch is
recognised by its transaction id and skipped, the new ones are committed, and the table, read
back with delta-rs, holds every Kafka record exactly once by (partition, offset).

Against your own cluster, set ``KAFKA_BOOTSTRAP_SERVERS`` (and ``KAFKA_TOPIC``): no broker is
started then, and the topic's existing records are read from the earliest offset.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

from _orders import forget_newest_batch, quiet_logging

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

from jars import JarsError, cached_jars, fetch_broker, installed_jar_set  # noqa: E402
from kafka_broker import BrokerError, LocalBroker  # noqa: E402

ORDERS_PER_RUN = 3_000
PER_BATCH = 1_000  # maxOffsetsPerTrigger: Kafka records per micro-batch


def produce_orders(bootstrap: str, topic: str, first: int, count: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    for order_id in range(first, first + count):
        order = {"order_id": order_id, "day": f"2026-11-{21 + order_id % 3}", "amount": 9.5}
        producer.produce(topic, key=str(order_id), value=json.dumps(order))
    if producer.flush(60):
        raise RuntimeError(f"could not deliver every order to {topic}")


def spark_session():  # type: ignore[no-untyped-def]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    jars = os.pathsep.join(str(jar) for jar in cached_jars(installed_jar_set()))
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("kafka-to-delta")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.extraClassPath", jars)  # Spark's Kafka source
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_query(spark, bootstrap: str, topic: str, uri: str, checkpoint: Path) -> None:  # type: ignore[no-untyped-def]
    """Process every record available now, then stop (as a restarted or stopped job would)."""
    from pyspark.sql import functions as F

    from committers.delta import DeltaSink
    from framework import TwoPhaseSink

    records = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", PER_BATCH)
        .load()
    )
    orders = records.select(
        F.from_json(
            F.col("value").cast("string"), "order_id LONG, day STRING, amount DOUBLE"
        ).alias("order"),
        "partition",
        "offset",
    ).select("order.*", "partition", "offset")
    sink = TwoPhaseSink(DeltaSink(uri, app_id="orders-from-kafka", partition_by=["day"]))
    query = sink.write_stream(
        orders, checkpoint_location=str(checkpoint), trigger={"availableNow": True}
    )
    query.awaitTermination()
    for b in sink.batches:
        print(f"   batch {b.batch_id}: {b.status} ({b.rows} rows)")


def report(uri: str, expected: int) -> bool:
    from deltalake import DeltaTable

    table = DeltaTable(uri).to_pyarrow_table(columns=["order_id", "partition", "offset"])
    positions = list(zip(table["partition"].to_pylist(), table["offset"].to_pylist(), strict=True))
    duplicates = sum(n - 1 for n in Counter(positions).values())
    ids = set(table["order_id"].to_pylist())
    print("\n== result (read back with delta-rs)")
    print(f"   records produced:              {expected}")
    print(f"   rows in the table:             {len(positions)}")
    print(f"   duplicate (partition, offset): {duplicates}")
    print(f"   missing orders:                {expected - len(ids)}")
    ok = duplicates == 0 and len(positions) == expected and ids == set(range(expected))
    print("\nOK: every Kafka record exactly once" if ok else "\nFAILED: the table is not exact")
    return ok


def run(spark, bootstrap: str, topic: str, work: Path) -> bool:  # type: ignore[no-untyped-def]
    uri, checkpoint = str(work / "orders"), work / "checkpoint"
    produce_orders(bootstrap, topic, 0, ORDERS_PER_RUN)
    print(f"\n== run 1: {ORDERS_PER_RUN} orders in {topic} -> {uri}")
    run_query(spark, bootstrap, topic, uri, checkpoint)
    forgotten = forget_newest_batch(checkpoint)
    print(f"   the job stops; crash simulation: the checkpoint forgets batch {forgotten} finished")
    produce_orders(bootstrap, topic, ORDERS_PER_RUN, ORDERS_PER_RUN)
    print(f"\n== run 2: {ORDERS_PER_RUN} more orders arrive; restart from the same checkpoint")
    run_query(spark, bootstrap, topic, uri, checkpoint)
    return report(uri, 2 * ORDERS_PER_RUN)


def main() -> int:
    quiet_logging()
    work = Path(tempfile.mkdtemp(prefix="kafka-to-delta-"))
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    topic = os.environ.get("KAFKA_TOPIC", "orders")
    try:
        broker = None if external else LocalBroker(fetch_broker(), work / "broker").start()
        spark = spark_session()
    except (JarsError, BrokerError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        bootstrap = external or broker.bootstrap  # type: ignore[union-attr]
        print(f"\n== Kafka at {bootstrap}" + ("" if external else " (started for this demo)"))
        return 0 if run(spark, bootstrap, topic, work) else 1
    finally:
        spark.stop()
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    sys.exit(main())
