"""The Spark job of ``test_deploy.py``, run by ``spark-submit`` as a user would run theirs.

The test copies this file out of the repository and submits it with a packed virtualenv in
``--archives``; it must therefore import only what a deployed job may import (pyspark and the
installed ``sparksink`` wheel), never a test helper.

Usage: ``spark-submit ... _deploy_job.py TABLE_URI``. Prints one JSON line: what every Python
worker reported about its interpreter and where it imported the packages from, the
metrics of the two bounded writes, what ``read_table`` and the ``"deltalake"`` format read, and
how long each step took. The format also writes ``TABLE_URI-copy`` (a batch write) and
``TABLE_URI-stream`` (a stream of the table, checkpointed in ``TABLE_URI-checkpoint``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql import SparkSession

from committers.delta import DeltaSink, read_table, register
from framework import TwoPhaseSink

PARTITIONS = 4


def probe(_: Iterator[int]) -> Iterator[dict[str, Any]]:
    """Runs in an executor's Python worker: where does this worker get its code from?"""
    import importlib.metadata
    import os

    import pyspark

    import committers
    import committers.delta
    import framework

    yield {
        "python": sys.executable,
        "cwd": os.getcwd(),
        "sys_path": sys.path,
        "committers": committers.__file__,
        "committers_delta": committers.delta.__file__,
        "framework": framework.__file__,
        "pyspark": pyspark.__file__,
        "version": framework.__version__,
        "distribution": importlib.metadata.version("sparksink"),
    }


def main(table: str) -> None:
    started = time.monotonic()
    spark = SparkSession.builder.appName("sparksink-deploy-check").getOrCreate()
    seconds = {"session": time.monotonic() - started}
    spark.sparkContext.setLogLevel("ERROR")
    try:
        probes = spark.sparkContext.parallelize(range(PARTITIONS), PARTITIONS)
        reports = probes.mapPartitions(probe).collect()
        seconds["probe"] = time.monotonic() - started - sum(seconds.values())

        def rows(first: int, count: int):  # type: ignore[no-untyped-def]
            return spark.range(first, first + count, numPartitions=2).selectExpr(
                "id", "concat('row-', id) AS label", "IF(id % 2 = 0, 'even', 'odd') AS part"
            )

        # "arrow": Python writers in mapInArrow tasks on the executors (they unpickle the sink,
        # so they import committers.delta from the shipped environment). "spark": Spark's own
        # Parquet writer on the executors, footers read and the commit made on the driver.
        metrics = []
        for epoch, staging in ((1, "arrow"), (2, "spark")):
            sink = TwoPhaseSink(
                DeltaSink(table, app_id="deploy-check", partition_by=["part"], staging=staging)
            )
            result = sink.write(rows((epoch - 1) * 100, 100), epoch_id=epoch)
            metrics.append({"staging": staging, "rows": result.rows, "files": result.files})
            seconds[staging] = time.monotonic() - started - sum(seconds.values())

        formats = read_back(spark, table)
        seconds["format"] = time.monotonic() - started - sum(seconds.values())
    finally:
        spark.stop()
    print(json.dumps({"workers": reports, "writes": metrics, "reads": formats, "seconds": seconds}))


def read_back(spark: SparkSession, table: str) -> dict[str, Any]:
    """Read the table with read_table (Spark's Parquet reader) and the "deltalake" format, and
    write through the format: a batch copy of the even rows and a stream of the whole table.
    The format is planned in Python processes Spark starts on the driver, where the workers'
    ./environment/bin/python does not exist; its rows are read and written by the executors'
    Python workers."""
    register(spark)
    loaded = spark.read.format("deltalake").load(table)
    loaded.where("part = 'even'").write.format("deltalake").mode("append").option(
        "partitionBy", "part"
    ).save(f"{table}-copy")
    query = (
        spark.readStream.format("deltalake")
        .load(table)
        .writeStream.format("deltalake")
        .option("checkpointLocation", f"{table}-checkpoint")
        .trigger(availableNow=True)
        .start(f"{table}-stream")
    )
    query.awaitTermination()
    return {
        "read_table": sorted(r.id for r in read_table(spark, table).select("id").collect()),
        "format": sorted(r.id for r in loaded.select("id").collect()),
    }


if __name__ == "__main__":
    main(sys.argv[1])
