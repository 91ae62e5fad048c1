"""A driver that leaves logging unconfigured, as a user's script does: it shows which of the
sink's log lines reach stderr by default, after one setLevel, and after logging.basicConfig.

Usage: python _logging_driver.py <table-uri>
"""

from __future__ import annotations

import logging
import sys

from pyspark.sql import SparkSession

from committers.delta import DeltaSink
from committers.tests._spark_helpers import DRIVER_JVM_OPTIONS
from framework import TwoPhaseSink


def broken_exporter(metrics: object) -> None:
    raise RuntimeError("exporter down")


def main(table: str) -> None:
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", DRIVER_JVM_OPTIONS)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.range(4)
    # 1. Default configuration: the warning is visible, the INFO line is not.
    TwoPhaseSink(DeltaSink(table, app_id="logs"), on_batch=broken_exporter).write(df, epoch_id=1)
    # 2. The documented one line: one INFO line per batch.
    logging.getLogger("framework.spark").setLevel(logging.INFO)
    TwoPhaseSink(DeltaSink(table, app_id="logs")).write(df, epoch_id=2)
    # 3. The application configures logging: its handler prints the line, the fallback does not.
    logging.basicConfig(stream=sys.stdout, format="ROOT %(levelname)s %(message)s")
    TwoPhaseSink(DeltaSink(table, app_id="logs")).write(df, epoch_id=2)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
