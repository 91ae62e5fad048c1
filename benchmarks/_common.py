"""Shared set-up for benchmarks: a local SparkSession and the benchmark DataFrame."""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time


def spark_session(app_name: str, configs: dict[str, str] | None = None):
    """The benchmarks' local[2] SparkSession, with ``configs`` added."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in (configs or {}).items():
        builder = builder.config(key, value)
    spark = (
        builder.master("local[2]")
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


#: Ratios are printed only when the 1-minute load average was at most this when the run began:
#: a loaded machine flatters the side with more threads.
QUIET_LOAD = 0.5


def print_sides(
    times: dict[str, list[float]],
    notes: dict[str, str] | None,
    notes_header: str,
    load_before: float,
) -> None:
    """The machine and the load before the run, then each side's median and runs, with its
    note (if ``notes``)."""
    width = max(map(len, times)) + 2
    print(f"\n{machine()}, Spark local[2]; 1-minute load average before: {load_before:.2f}")
    header = f"  ({notes_header})" if notes else ""
    print(f"{'':{width}} {'median':>8}  runs (s){header}")
    for name, values in times.items():
        runs = ", ".join(f"{v:.2f}" for v in values)
        note = f"  ({notes[name]})" if notes else ""
        print(f"{name:{width}} {median(values):7.2f}s  {runs}{note}")


def wait_for_quiet(max_seconds: float = 240.0) -> float:
    """Wait until the 1-minute load average is below ``QUIET_LOAD`` (the JVM's start or the
    previous scenario raised it), at most ``max_seconds``; returns the load average then."""
    deadline = time.monotonic() + max_seconds
    while (load := os.getloadavg()[0]) >= QUIET_LOAD and time.monotonic() < deadline:
        time.sleep(5)
    return load


def quiet_enough(load_before: float, force: bool) -> bool:
    """Whether ratios may be printed (a quiet start, or ``--force``); says why not if not."""
    if load_before < QUIET_LOAD or force:
        return True
    print(
        f"\nload average {load_before:.2f} >= {QUIET_LOAD}: ratio not printed (a loaded "
        "machine distorts it); rerun on a quiet machine, or pass --force"
    )
    return False
