"""A bounded write with speculative execution on a standalone cluster, as its own process (one
SparkContext per Python process, and the test session already has a local one).

Usage: python -m committers.tests._speculation_driver MASTER_URL TABLE MARKERS STAGING

Two tasks. The first attempt of the first task holds its last row until a speculative copy
of it (launched by Spark on the other worker's host, since the original runs too long) has
reached its last row too; then both go on and write, at the same time, the same rows. Each
attempt leaves ``<partition>-<attempt>`` under MARKERS when it starts and
``passed-<partition>-<attempt>`` when it passes that point. Prints ``STATUS <status> ROWS
<rows>``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROWS = 2000
BARRIER_TIMEOUT_S = 60.0


def main(master_url: str, table: str, markers: str, staging: str) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import TaskContext
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import udf
    from pyspark.sql.types import LongType

    from committers.delta import DeltaSink
    from committers.tests._spark_helpers import DRIVER_JVM_OPTIONS, TEST_JVM_OPTIONS
    from framework import TwoPhaseSink

    root = str(Path(__file__).resolve().parents[2])
    spark = (
        SparkSession.builder.master(master_url)
        .appName("speculation")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.executorEnv.PYTHONPATH", root)
        .config("spark.pyspark.python", sys.executable)
        .config("spark.speculation", "true")
        .config("spark.speculation.interval", "100ms")
        .config("spark.speculation.multiplier", "1.5")
        .config("spark.speculation.quantile", "0.5")
        .config("spark.speculation.minTaskRuntime", "500ms")
        .config("spark.driver.extraJavaOptions", DRIVER_JVM_OPTIONS)
        .config("spark.executor.extraJavaOptions", TEST_JVM_OPTIONS)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")

    def record_attempt(value: int) -> int:
        context = TaskContext.get()
        partition, attempt = context.partitionId(), context.attemptNumber()
        marker = Path(markers) / f"{partition}-{attempt}"
        if not marker.exists():
            marker.touch()
        if partition == 0 and value == ROWS // 2 - 1:  # the last row of the first task
            deadline = time.monotonic() + BARRIER_TIMEOUT_S
            both = [Path(markers) / "0-0", Path(markers) / "0-1"]
            while time.monotonic() < deadline and not all(m.exists() for m in both):
                time.sleep(0.05)
            (Path(markers) / f"passed-{partition}-{attempt}").touch()
        return value

    tag = udf(record_attempt, LongType())
    df = spark.range(0, ROWS, numPartitions=2).select(tag("id").alias("id"))
    sink = TwoPhaseSink(DeltaSink(table, app_id="speculative", staging=staging))  # type: ignore[arg-type]
    metrics = sink.write(df)
    print(f"STATUS {metrics.status} ROWS {metrics.rows}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
