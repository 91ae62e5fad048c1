"""Throughput: TwoPhaseSink(DeltaSink).write(df) with each staging strategy against
df.write.parquet, same DataFrame, same process, alternating, median of N after a warm-up.

Also measured: the "arrow" path's ceiling, moving the rows into Python workers through
``mapInArrow`` with no Parquet at all (the function only counts rows); and
``df.write.format("deltalake")``, the same exactly-once commit through Spark's Python Data
Source API (Arrow writers in the tasks).

Ratios are Spark time / sink time (1.0: as fast as Spark's own Parquet writer), against Spark
writing the same file format as the sink (timestamps as INT64 microseconds; Spark's default,
INT96, is slower to write and is shown for information). A loaded machine flatters the side
with more threads, so the script refuses to print ratios when the 1-minute load average is
above 0.5 when it starts (its own two busy cores raise the figure it prints at the end), unless
``--force``.

Usage: python benchmarks/throughput.py [ROWS] [REPEATS] [--force]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, median, rows_df, spark_session, timed

from committers.delta import DeltaSink, register
from framework import TwoPhaseSink

QUIET_LOAD = 0.5


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    force = "--force" in sys.argv
    rows = int(args[0]) if args else 3_000_000
    repeats = int(args[1]) if len(args) > 1 else 5
    load_before = os.getloadavg()[0]
    spark = spark_session("throughput-benchmark")
    df = rows_df(spark, rows)
    register(spark)
    work = Path(tempfile.mkdtemp(prefix="sink-bench-"))
    sizes: dict[str, int] = {}

    def spark_parquet(timestamps: str) -> Callable[[int], None]:
        def run(i: int) -> None:
            target = work / f"parquet-{timestamps}-{i}"
            spark.conf.set("spark.sql.parquet.outputTimestampType", timestamps)
            try:
                df.write.parquet(str(target))
            finally:
                spark.conf.unset("spark.sql.parquet.outputTimestampType")
            sizes[f"parquet {timestamps}"] = sum(
                p.stat().st_size for p in target.rglob("*.parquet")
            )
            shutil.rmtree(target)

        return run

    def delta_sink(staging: str) -> Callable[[int], None]:
        def run(i: int) -> None:
            target = work / f"delta-{staging}-{i}"
            TwoPhaseSink(DeltaSink(str(target), app_id="bench", staging=staging)).write(df)
            sizes[f"staging={staging}"] = sum(p.stat().st_size for p in target.rglob("*.parquet"))
            shutil.rmtree(target)

        return run

    def format_writer(i: int) -> None:
        target = work / f"format-{i}"
        df.write.format("deltalake").mode("append").save(str(target))
        sizes["format deltalake"] = sum(p.stat().st_size for p in target.rglob("*.parquet"))
        shutil.rmtree(target)

    def transfer_only(i: int) -> None:
        def count(batches):  # type: ignore[no-untyped-def]
            import pyarrow as pa

            total = sum(b.num_rows for b in batches)
            yield pa.RecordBatch.from_pydict({"rows": [total]})

        df.mapInArrow(count, "rows long").collect()

    reference = "parquet TIMESTAMP_MICROS"
    contenders: dict[str, Callable[[int], None]] = {
        reference: spark_parquet("TIMESTAMP_MICROS"),
        "parquet INT96": spark_parquet("INT96"),
        "staging=spark": delta_sink("spark"),
        "staging=arrow": delta_sink("arrow"),
        "format deltalake": format_writer,
        "mapInArrow only": transfer_only,
    }
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for run in contenders.values():
        run(-1)  # warm-up: JVM, Python workers, code paths
    for i in range(repeats):
        for name, run in contenders.items():
            times[name].append(timed(lambda run=run, i=i: run(i)))
    shutil.rmtree(work, ignore_errors=True)
    spark.stop()
    load_after = os.getloadavg()[0]

    print(f"machine: {machine()}")
    print(f"load average (1 min): before {load_before:.2f}, after {load_after:.2f}")
    print(f"rows: {rows:,}, repeats: {repeats} (alternating, after one warm-up each)")
    medians = {name: median(runs) for name, runs in times.items()}
    for name, runs in times.items():
        size = f"  bytes {sizes[name]:,}" if name in sizes else ""
        print(f"{name:24} median {medians[name]:.2f} s  runs {[round(t, 2) for t in runs]}{size}")
    if load_before >= QUIET_LOAD and not force:
        print(f"load not below {QUIET_LOAD}: ratios not reported (they would flatter the sink)")
        return 1
    names = (
        "staging=spark",
        "staging=arrow",
        "format deltalake",
        "mapInArrow only",
        "parquet INT96",
    )
    for name in names:
        print(f"ratio {name:16} {medians[reference] / medians[name]:.2f}  (vs {reference})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
