"""Shared set-up for benchmarks: a local SparkSession and the benchmark DataFrame."""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time


def spark_session(app_name: str):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.memory", "4g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def rows_df(spark, rows: int):
    """The benchmark schema: id long, k int, s string, ts timestamp."""
    from pyspark.sql import functions as F

    return spark.range(0, rows).select(
        F.col("id"),
        (F.col("id") % 1000).cast("int").alias("k"),
        F.concat(F.lit("customer-"), (F.col("id") * 7919 % 1000003).cast("string")).alias("s"),
        F.timestamp_seconds(F.lit(1_790_000_000) + F.col("id") % 86400).alias("ts"),
    )


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median(values) -> float:
    return statistics.median(values)


def machine() -> str:
    python = platform.python_version()
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, Python {python}"
