"""Compaction: ``DeltaSink.compact`` (Python tasks rewrite each group with pyarrow, one
delta-rs commit) against delta-rs's own ``DeltaTable.optimize.compact()``, on copies of the same
table of many small files; also ``staging="spark"`` (Spark's own reader and writer).

The table is written once by the sink itself (Spark staging, one job): ROWS rows (id, k, s, ts
of ``_common.rows_df``) partitioned by ``p = k % 10`` over FILES / 10 tasks, so FILES small
files, FILES / 10 per partition. Each repeat copies that pristine table and compacts one
copy with each tool, reversing the order every other round, with the same target size (128
MiB); every copy must then hold the same number of rows. Another side only reads the same files
with Spark (into the ``noop`` sink): the floor under any rewrite done by Spark's own reader. The
last reads each partition's files with pyarrow and writes them as one file, in two worker
processes started beforehand (no Delta, no Spark, no commit): the floor under a compaction
done in Python tasks that never move the rows through the JVM. Medians after a warm-up round.

The ratio printed is delta-rs time / our time (above 1.0: ours is faster). A loaded machine
flatters the side with more threads (both sides use both cores here, but not alike), so the
script refuses to print the ratio when the 1-minute load average is above 0.5 when it starts,
unless ``--force``.

Usage: python benchmarks/compaction.py [FILES] [ROWS] [REPEATS] [--force]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import median, print_sides, quiet_enough, rows_df, spark_session
from deltalake import DeltaTable

from committers.delta import DeltaSink
from framework import TwoPhaseSink
from framework.spark.connector import parquet_files

PARTITIONS = 10
TARGET = 128 * 1024 * 1024


def _live_files(uri: str) -> int:
    return len(DeltaTable(uri).file_uris())


def _rows(uri: str) -> int:
    return DeltaTable(uri).count()


def _pyarrow_rewrite(paths: list[str], out: str) -> int:
    """Read ``paths`` with pyarrow and write their rows as one file at ``out``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.concat_tables([pq.ParquetFile(p).read(use_threads=False) for p in paths])
    pq.write_table(table, out, compression="snappy")
    return table.num_rows


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    force = "--force" in sys.argv
    files = int(args[0]) if args else 2_000
    rows = int(args[1]) if len(args) > 1 else 1_000_000
    repeats = int(args[2]) if len(args) > 2 else 3
    if files % PARTITIONS:
        raise SystemExit(f"FILES must be a multiple of {PARTITIONS}")
    load_before = os.getloadavg()[0]
    spark = spark_session("compaction-benchmark")
    from pyspark.sql import functions as F

    work = Path(tempfile.mkdtemp(prefix="sink-compaction-bench-"))
    workers = ProcessPoolExecutor(2)
    list(workers.map(abs, range(2)))  # started before any timing
    try:
        pristine = str(work / "pristine")
        df = rows_df(spark, rows).withColumn("p", (F.col("k") % PARTITIONS).cast("int"))
        # Every task writes one file into each of the PARTITIONS directories.
        df = df.repartition(files // PARTITIONS)
        TwoPhaseSink(
            DeltaSink(pristine, app_id="bench", partition_by=["p"], staging="spark")
        ).write(df)
        before = _live_files(pristine)
        total_rows = _rows(pristine)
        size = sum(p.stat().st_size for p in Path(pristine).rglob("*.parquet"))
        print(f"table: {before} files, {total_rows} rows, {size} bytes, {PARTITIONS} partitions")

        def ours(uri: str) -> int:
            result = DeltaSink(uri).compact(spark, target_file_size=TARGET)
            return result.files_added

        def ours_spark(uri: str) -> int:
            sink = DeltaSink(uri, staging="spark")
            return sink.compact(spark, target_file_size=TARGET).files_added

        def delta_rs(uri: str) -> int:
            metrics = DeltaTable(uri).optimize.compact(target_size=TARGET)
            return int(metrics["numFilesAdded"])

        def spark_scan(uri: str) -> int:
            """The floor under any Spark rewrite: Spark reading the same files, writing nothing."""
            files = [f"file://{p}" for p in DeltaTable(uri).file_uris()]
            scan = parquet_files(spark, files, schema="id long, k int, s string, ts timestamp")
            scan.write.format("noop").mode("overwrite").save()
            return len(files)

        def pyarrow_only(uri: str) -> int:
            """The floor under a rewrite in Python tasks: pyarrow alone, two processes."""
            by_partition: dict[str, list[str]] = {}
            for path in DeltaTable(uri).file_uris():
                by_partition.setdefault(path.rsplit("/", 2)[-2], []).append(path)
            outputs = [str(Path(uri) / f"rewritten-{i}.parquet") for i in range(len(by_partition))]
            list(workers.map(_pyarrow_rewrite, by_partition.values(), outputs))
            return len(outputs)

        sides = {
            "ours (DeltaSink.compact)": ours,
            "delta-rs optimize.compact": delta_rs,
            "ours, staging='spark'": ours_spark,
            "floor: Spark scan of them": spark_scan,
            "floor: pyarrow, 2 processes": pyarrow_only,
        }
        times: dict[str, list[float]] = {name: [] for name in sides}
        added: dict[str, int] = {}
        for round_number in range(repeats + 1):  # round 0 is the warm-up
            order = list(sides.items())
            if round_number % 2:
                order.reverse()
            for name, run in order:
                copy = str(work / f"copy-{round_number}-{len(times[name])}-{name.split()[0]}")
                shutil.copytree(pristine, copy)
                start = time.perf_counter()
                added[name] = run(copy)
                elapsed = time.perf_counter() - start
                if _rows(copy) != total_rows:
                    raise SystemExit(f"{name} changed the row count of {copy}")
                if round_number:
                    times[name].append(elapsed)
                shutil.rmtree(copy)

        notes = {name: f"{n} files" for name, n in added.items()}
        print_sides(times, notes, f"files after: before {before}", load_before)
        if not quiet_enough(load_before, force):
            return 0
        ratio = median(times["delta-rs optimize.compact"]) / median(
            times["ours (DeltaSink.compact)"]
        )
        print(f"\nratio delta-rs time / our time: {ratio:.2f}")
        return 0
    finally:
        workers.shutdown()
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
