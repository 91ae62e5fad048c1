"""The streaming job of the crash-point campaign, run as its own process (group).

Usage: python -m committers.tests._campaign_driver SOURCE TABLE CHECKPOINT STAGING EXTRA KIND

Reads the source's files of unique ids one file per micro-batch into ``DeltaSink(TABLE,
app_id="campaign", partition_by=["day"], schema_mode="merge")`` (the table created with
``delta.checkpointInterval`` 2): JSON files (KIND ``json``) or a Delta table through the
``"deltalake"`` format (KIND ``delta``, its schema the table's) or a Kafka topic's JSON
records (KIND ``kafka``, SOURCE ``host:port/topic``, read by Spark's Kafka source, the table
keeping each record's ``kafka_partition`` and ``kafka_offset``). The JSON schema has EXTRA more
columns ``note1``..``noteN``: the first batch of a run with a new one merges it into the
table. Storage options (S3 campaigns) come as JSON in ``SPARKSINK_CAMPAIGN_STORAGE_OPTIONS``.
With ``SPARKSINK_CAMPAIGN_AUTO_COMPACT`` set (the campaign sets it when its plan holds the
steps ``compaction_commit`` or ``compaction_committed``) the sink compacts a partition once it
holds ``AUTO_COMPACT_MIN_FILES`` small files, so runs compact between batches; otherwise it
does not compact (shorter runs). KIND ``changes``: JSON files of changes upserted by ``id``
(``sequence_by="seq"``, ``delete_when="op = 'D'"``) into the table the campaign created; KIND
``kafka-changes``: the same changes as Debezium-style events in a Kafka topic.
``SPARKSINK_CRASH_AT`` (see ``framework._crash``) decides where
the process dies.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from committers.tests._campaign import (
    AUTO_COMPACT_VARIABLE,
    IDS_PER_FILE,
    STORAGE_OPTIONS_VARIABLE,
)
from framework._crash import DRIVER_GROUP_VARIABLE

CHECKPOINT_INTERVAL = 2
AUTO_COMPACT_MIN_FILES = 3


def main() -> None:
    source, table, checkpoint, staging, extra, kind = sys.argv[1:7]
    os.environ[DRIVER_GROUP_VARIABLE] = str(os.getpgid(0))  # a worker's crash kills us all
    from committers.delta import DeltaSink, register
    from committers.delta.write import AutoCompact
    from committers.tests._spark_helpers import driver_session
    from framework import TwoPhaseSink

    spark = driver_session()
    if kind == "delta":
        register(spark)
        stream = spark.readStream.format("deltalake").option("maxFilesPerTrigger", 1).load(source)
    elif kind in ("changes", "kafka-changes"):  # upserted by key into the campaign's table
        if kind == "kafka-changes":
            bootstrap, topic = source.split("/", 1)
            stream = _debezium_changes(spark, bootstrap, topic)
        else:
            schema = "id LONG, day STRING, v STRING, seq LONG, op STRING"
            stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(source)
        sink = TwoPhaseSink(
            DeltaSink(
                table,
                app_id="campaign",
                mode="upsert",
                keys=["id"],
                sequence_by="seq",
                delete_when="op = 'D'",
                staging=staging,  # type: ignore[arg-type]
                storage_options=json.loads(os.environ.get(STORAGE_OPTIONS_VARIABLE, "{}")) or None,
            )
        )
        _run(sink, stream, checkpoint)
        spark.stop()
        return
    else:
        schema = "id LONG, day STRING" + "".join(
            f", note{n} STRING" for n in range(1, int(extra) + 1)
        )
        if kind == "kafka":  # SOURCE is bootstrap/topic; a file's worth of records a batch
            bootstrap, topic = source.split("/", 1)
            stream = _kafka_rows(spark, bootstrap, topic, schema)
        else:
            stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(source)
    sink = TwoPhaseSink(
        DeltaSink(
            table,
            app_id="campaign",
            partition_by=["day"],
            schema_mode="merge",
            staging=staging,  # type: ignore[arg-type]
            # A checkpoint every two versions: background checkpoints (and their crash step
            # checkpoint_started) happen in every few runs, and restarts read the log from one.
            table_configuration={"delta.checkpointInterval": str(CHECKPOINT_INTERVAL)},
            storage_options=json.loads(os.environ.get(STORAGE_OPTIONS_VARIABLE, "{}")) or None,
            auto_compact=(
                AutoCompact(min_num_files=AUTO_COMPACT_MIN_FILES)
                if os.environ.get(AUTO_COMPACT_VARIABLE)
                else False
            ),
        )
    )
    _run(sink, stream, checkpoint)
    spark.stop()


def _kafka_records(spark: Any, bootstrap: str, topic: str) -> Any:
    """The topic's records from the earliest offset, a file's worth per micro-batch."""
    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", IDS_PER_FILE)
        .load()
    )


def _kafka_rows(spark: Any, bootstrap: str, topic: str, schema: str) -> Any:
    """The topic's JSON records as rows of ``schema``, with where each was read from."""
    from pyspark.sql import functions as F

    return (
        _kafka_records(spark, bootstrap, topic)
        .select(
            F.from_json(F.col("value").cast("string"), schema).alias("record"),
            F.col("partition").alias("kafka_partition"),
            F.col("offset").alias("kafka_offset"),
        )
        .select("record.*", "kafka_partition", "kafka_offset")
    )


def _debezium_changes(spark: Any, bootstrap: str, topic: str) -> Any:
    """Debezium-style change events as the ``changes`` rows (id, day, v, seq, op I/U/D)."""
    from pyspark.sql import functions as F

    envelope = (
        "payload STRUCT<before: STRUCT<id: LONG, day: STRING>, "
        "after: STRUCT<id: LONG, day: STRING, v: STRING>, op: STRING, source: STRUCT<seq: LONG>>"
    )
    event = F.from_json(F.col("value").cast("string"), envelope).getField("payload")
    before, after = event.getField("before"), event.getField("after")
    return _kafka_records(spark, bootstrap, topic).select(
        F.coalesce(after.getField("id"), before.getField("id")).alias("id"),
        F.coalesce(after.getField("day"), before.getField("day")).alias("day"),
        after.getField("v").alias("v"),
        event.getField("source").getField("seq").alias("seq"),
        F.when(event.getField("op") == "d", "D")
        .when(event.getField("op") == "c", "I")
        .otherwise("U")
        .alias("op"),
    )


def _run(sink: Any, stream: Any, checkpoint: str) -> None:
    query = sink.write_stream(
        stream, checkpoint_location=checkpoint, trigger={"availableNow": True}
    )
    query.awaitTermination()
    print("BATCHES", [(b.batch_id, b.status) for b in sink.batches], flush=True)


if __name__ == "__main__":
    main()
