"""Reading a Delta table into Spark: the ``"deltalake"`` Python data source, ``read_table``'s
native path, and ``spark.read.parquet`` of the same files, side by side in one run.

The table is written once by the sink (Spark staging, one job): ROWS rows of
``_common.rows_df`` (id long, k int, s string, ts timestamp) in FILES files, unpartitioned, or
partitioned by ``p = k % 10`` with ``--partitioned``. Each round reads the whole table with
each reader, in alternating order, into Spark's ``noop`` sink (every row and column is
materialized, nothing is written) and checks the row count; medians after a warm-up round.

* python:  ``spark.read.format("deltalake").load(uri)``: pyarrow in Python workers, Arrow
  batches into the JVM;
* native:  ``committers.delta.read_table(spark, uri)``: the snapshot's files to Spark's own
  Parquet reader;
* parquet: ``spark.read.parquet(*files)`` of the snapshot's files (the floor: no Delta at all).

The ratios printed are python / native and native / parquet. A loaded machine distorts them, so
they are not printed when the 1-minute load average is above 0.5 when the script starts,
unless ``--force``.

Usage: python benchmarks/delta_scan.py [ROWS] [FILES] [REPEATS] [--partitioned] [--force]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, median, rows_df, spark_session
from deltalake import DeltaTable

from committers.delta import DeltaSink, read_table, register
from framework import TwoPhaseSink

QUIET_LOAD = 0.5
PARTITIONS = 10


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    force = "--force" in sys.argv
    partitioned = "--partitioned" in sys.argv
    rows = int(args[0]) if args else 3_000_000
    files = int(args[1]) if len(args) > 1 else 8
    repeats = int(args[2]) if len(args) > 2 else 3
    load_before = os.getloadavg()[0]
    spark = spark_session("delta-scan-benchmark")
    from pyspark.sql import functions as F

    work = Path(tempfile.mkdtemp(prefix="sink-scan-bench-"))
    try:
        uri = str(work / "table")
        df = rows_df(spark, rows).repartition(files)
        partition_by = ["p"] if partitioned else []
        if partitioned:
            df = df.withColumn("p", (F.col("k") % PARTITIONS).cast("int"))
        TwoPhaseSink(
            DeltaSink(uri, app_id="bench", partition_by=partition_by, staging="spark")
        ).write(df)
        table = DeltaTable(uri)
        paths = [p if "://" in p else f"file://{p}" for p in table.file_uris()]
        size = sum(Path(p.removeprefix("file://")).stat().st_size for p in paths)
        print(f"table: {len(paths)} files, {table.count()} rows, {size} bytes, {partition_by}")
        register(spark)

        readers = {
            "python (format deltalake)": lambda: spark.read.format("deltalake").load(uri),
            "native (read_table)": lambda: read_table(spark, uri),
            "parquet (spark.read)": lambda: spark.read.parquet(*paths),
        }
        times: dict[str, list[float]] = {name: [] for name in readers}
        for round_number in range(repeats + 1):  # round 0 is the warm-up
            order = list(readers.items())
            if round_number % 2:
                order.reverse()
            for name, make in order:
                start = time.perf_counter()
                make().write.format("noop").mode("overwrite").save()
                elapsed = time.perf_counter() - start
                if round_number == 0 and make().count() != rows:
                    raise SystemExit(f"{name} did not read {rows} rows")
                if round_number:
                    times[name].append(elapsed)

        print(f"\n{machine()}, Spark local[2]; 1-minute load average before: {load_before:.2f}")
        print(f"{rows} rows x 4 columns{' + p' if partitioned else ''}, {len(paths)} files")
        print(f"{'':28} {'median':>8}  runs (s)")
        for name, values in times.items():
            runs = ", ".join(f"{v:.2f}" for v in values)
            print(f"{name:28} {median(values):7.2f}s  {runs}")
        if load_before > QUIET_LOAD and not force:
            print(
                f"\nload average {load_before:.2f} > {QUIET_LOAD}: ratios not printed (a loaded "
                "machine distorts them); rerun on a quiet machine, or pass --force"
            )
            return 0
        python, native, parquet = (median(v) for v in times.values())
        print(
            f"\npython / native: {python / native:.2f}   native / parquet: {native / parquet:.2f}"
        )
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
