"""Reading a Delta table into Spark: the ``"deltalake"`` Python data source, ``read_table``'s
native path, and ``spark.read.parquet`` of the same files, side by side in one run.

The table is written once by the sink (Spark staging, one job): ROWS rows of
``_common.rows_df`` (id long, k int, s string, ts timestamp) range-partitioned by ``id`` into
FILES files (so each file's ``id`` min/max stats cover a narrow range), unpartitioned, or
partitioned by ``p = k % 10`` with ``--partitioned``. Each round runs every scan with each
reader, in alternating order, into Spark's ``noop`` sink (every row and column is
materialized, nothing is written), and the warm-up round checks each reader's row count
against the others; medians after the warm-up round. The scans:

* full:      every row;
* partition: ``p = 3`` (with ``--partitioned`` only): a tenth of the partitions;
* sorted:    ``id < ROWS / 20``: the 5 % of rows in the first files by ``id``.

The readers:

* python:  ``spark.read.format("deltalake").load(uri)``: pyarrow in Python workers, Arrow
  batches into the JVM; the filtered scans use ``filterPushdown`` (partitions pruned and files
  skipped by their stats before any is opened);
* native:  ``committers.delta.read_table(spark, uri)``: the snapshot's files to Spark's own
  Parquet reader;
* parquet: ``spark.read.option("basePath", uri).parquet(*files)`` of the snapshot's files (the
  reference: no Delta at all; Spark prunes the partition directories itself).

The ratios printed are throughputs against ``parquet`` (parquet time / reader time: above 1.0,
faster than Spark's own scan). A loaded machine distorts them, so they are not printed when the
1-minute load average is above 0.5 when the script starts, unless ``--force``.

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
        df = rows_df(spark, rows).repartitionByRange(files, "id")
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
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")

        scans = {"full": None, "sorted": f"id < {rows // 20}"}
        if partitioned:
            scans["partition"] = "p = 3"

        def python(condition):
            reader = spark.read.format("deltalake")
            if condition:  # each query from its own load(): see docs/reading.md
                reader = reader.option("filterPushdown", "true")
            return reader.load(uri)

        readers = {
            "python (format deltalake)": python,
            "native (read_table)": lambda _: read_table(spark, uri),
            "parquet (spark.read)": lambda _: spark.read.option("basePath", uri).parquet(*paths),
        }
        times = {(scan, name): [] for scan in scans for name in readers}
        for round_number in range(repeats + 1):  # round 0 is the warm-up
            for scan, condition in scans.items():
                order = list(readers.items())
                if round_number % 2:
                    order.reverse()
                counts = set()
                for name, make in order:
                    start = time.perf_counter()
                    frame = make(condition)
                    if condition:
                        frame = frame.where(condition)
                    frame.write.format("noop").mode("overwrite").save()
                    elapsed = time.perf_counter() - start
                    if round_number == 0:
                        frame = make(condition)
                        counts.add((frame.where(condition) if condition else frame).count())
                    else:
                        times[(scan, name)].append(elapsed)
                if round_number == 0 and len(counts) != 1:
                    raise SystemExit(f"the readers disagree on the {scan} scan: {counts}")

        print(f"\n{machine()}, Spark local[2]; 1-minute load average before: {load_before:.2f}")
        print(f"{rows} rows x 4 columns{' + p' if partitioned else ''}, {len(paths)} files")
        quiet = load_before < QUIET_LOAD or force
        for scan, condition in scans.items():
            print(f"\n{scan} scan{f' (where {condition})' if condition else ''}")
            print(f"{'':28} {'median':>8}  {'vs parquet':>10}  runs (s)")
            reference = median(times[(scan, "parquet (spark.read)")])
            for name in readers:
                values = times[(scan, name)]
                runs = ", ".join(f"{v:.2f}" for v in values)
                ratio = f"{reference / median(values):10.2f}" if quiet else f"{'-':>10}"
                print(f"{name:28} {median(values):7.2f}s  {ratio}  {runs}")
        if not quiet:
            print(
                f"\nload average {load_before:.2f} >= {QUIET_LOAD}: ratios not printed (a loaded "
                "machine distorts them); rerun on a quiet machine, or pass --force"
            )
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
