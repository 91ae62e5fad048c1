"""Throughput: TwoPhaseSink(DeltaSink).write(df) against df.write.parquet, same DataFrame, same
process, alternating, median of N after a warm-up. Prints a ratio (>= 1.0: the sink is at least
as fast as Spark's own Parquet writer).

Usage: python benchmarks/throughput.py [ROWS] [REPEATS]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, median, rows_df, spark_session, timed

from committers.delta import DeltaSink
from framework import TwoPhaseSink


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 3_000_000
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    spark = spark_session("throughput-benchmark")
    df = rows_df(spark, rows)
    work = Path(tempfile.mkdtemp(prefix="sink-bench-"))
    spark_times: list[float] = []
    sink_times: list[float] = []
    sizes: dict[str, int] = {}

    def spark_parquet(i: int) -> None:
        target = work / f"parquet-{i}"
        df.write.parquet(str(target))
        sizes["spark"] = sum(p.stat().st_size for p in target.rglob("*.parquet"))
        shutil.rmtree(target)

    def delta_sink(i: int) -> None:
        target = work / f"delta-{i}"
        TwoPhaseSink(DeltaSink(str(target), app_id="bench")).write(df)
        sizes["sink"] = sum(p.stat().st_size for p in target.rglob("*.parquet"))
        shutil.rmtree(target)

    spark_parquet(-1)  # warm-up: JVM, Python workers, code paths
    delta_sink(-1)
    for i in range(repeats):
        spark_times.append(timed(lambda i=i: spark_parquet(i)))
        sink_times.append(timed(lambda i=i: delta_sink(i)))
    shutil.rmtree(work, ignore_errors=True)
    spark_median, sink_median = median(spark_times), median(sink_times)
    print(f"machine: {machine()}")
    print(f"rows: {rows:,}, repeats: {repeats} (alternating, after one warm-up each)")
    for label, med, runs in (
        ("df.write.parquet", spark_median, spark_times),
        ("DeltaSink write ", sink_median, sink_times),
    ):
        print(f"{label}  median {med:.2f} s  runs {[round(t, 2) for t in runs]}")
    print(f"bytes: spark {sizes['spark']:,}  sink {sizes['sink']:,}")
    print(f"ratio (spark time / sink time): {spark_median / sink_median:.2f}")
    spark.stop()


if __name__ == "__main__":
    main()
