"""A CDC upsert stream, run in the test process or as its own process (so a test can kill it).

Usage: python -m committers.tests._upsert_driver SOURCE TABLE CHECKPOINT [GO_FILE]

Reads change files (``id, name, day, ts, op``; one file per micro-batch) into ``DeltaSink(TABLE,
mode="upsert", keys=["id"], sequence_by="ts", delete_when="op = 'D'", partition_by=["day"])``.
``SPARKSINK_CRASH_AT`` (see ``framework._crash``) decides where the process dies. Logs each
batch's line (``framework.spark`` at INFO, on stderr) and prints ``BATCHES [(batch id,
status), ...]`` when it ends on its own. With GO_FILE, it starts Spark first and waits for that
file to exist before it starts the query (so a test overlaps the start-up with its own work).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

CHANGE_SCHEMA = "id LONG, name STRING, day STRING, ts LONG, op STRING"
APP_ID = "cdc"


def cdc_sink(table: str):  # type: ignore[no-untyped-def]
    from committers.delta import DeltaSink
    from framework import TwoPhaseSink

    return TwoPhaseSink(
        DeltaSink(
            table,
            app_id=APP_ID,
            partition_by=["day"],
            mode="upsert",
            keys=["id"],
            sequence_by="ts",
            delete_when="op = 'D'",
        )
    )


def run_cdc_stream(spark, source: str, table: str, checkpoint: str):  # type: ignore[no-untyped-def]
    """Process every change file available now; returns the sink (its ``batches``)."""
    from committers.tests._spark_helpers import run_available_now

    stream = spark.readStream.schema(CHANGE_SCHEMA).option("maxFilesPerTrigger", 1).json(source)
    sink = cdc_sink(table)
    run_available_now(sink, stream, Path(checkpoint))
    return sink


def write_changes(directory: Path, order: int, changes: list[tuple]) -> None:
    """The change file ``part-<order>.json``, JSON lines of ``(id, name, day, ts, op)``, written
    atomically. Its modification time is ``order`` seconds after the first file's: Spark's
    file source takes files in that order (files written within one clock tick could come in
    any order)."""
    directory.mkdir(parents=True, exist_ok=True)
    keys = ("id", "name", "day", "ts", "op")
    tmp = directory / f".part-{order}.tmp"
    tmp.write_text("".join(json.dumps(dict(zip(keys, c, strict=True))) + "\n" for c in changes))
    first = min((p.stat().st_mtime for p in directory.glob("part-*.json")), default=time.time())
    moment = first + order
    os.utime(tmp, (moment, moment))
    tmp.rename(directory / f"part-{order}.json")


def main() -> None:
    source, table, checkpoint = sys.argv[1:4]
    logging.getLogger("framework.spark").setLevel(logging.INFO)  # a line per batch, on stderr
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from committers.tests._spark_helpers import driver_session

    spark = driver_session()
    if len(sys.argv) > 4:
        go = Path(sys.argv[4])
        while not go.exists():
            time.sleep(0.05)
    sink = run_cdc_stream(spark, source, table, checkpoint)
    print("BATCHES", [(b.batch_id, b.status) for b in sink.batches], flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
