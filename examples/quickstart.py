"""Quickstart: an exactly-once streaming job into a local Delta table, interrupted and restarted.

Run with `make demo`. What it shows:

1. A streaming query reads order files and writes them through TwoPhaseSink(DeltaSink(...)):
   every micro-batch becomes ONE Delta transaction keyed by (app id, batch id).
2. The job stops, and we make things worse: the checkpoint "forgets" that its newest batch was
   finished, exactly what happens when a driver dies after the sink committed but before Spark
   recorded the batch. (The test suite also SIGKILLs a real driver between staging and commit.)
3. More files arrive and the query restarts from its checkpoint: Spark replays the forgotten
   batch, the sink finds its transaction already in the table and skips it before writing any
   file, and the new files are written.
4. The table is read back with delta-rs (no Spark, no JVM Delta jars) and checked: every order
   exactly once.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from collections import Counter
from pathlib import Path

FILES, ORDERS_PER_FILE = 6, 1000
OUT = Path(os.environ.get("DEMO_OUTPUT", Path(__file__).resolve().parent.parent / "demo-output"))


def write_order_files(directory: Path, first_file: int, count: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(first_file, first_file + count):
        lines = (
            json.dumps(
                {
                    "order_id": f * ORDERS_PER_FILE + i,
                    "day": f"2026-11-{21 + f % 3:02d}",
                    "amount": round((f * ORDERS_PER_FILE + i) * 0.37 % 500, 2),
                }
            )
            for i in range(ORDERS_PER_FILE)
        )
        tmp = directory / f".orders-{f:03d}.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(directory / f"orders-{f:03d}.json")


def spark_session():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("quickstart")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_query(spark, source: Path, table: Path, checkpoint: Path):
    """Process every file available now, then stop (as a restarted or interrupted job would)."""
    from committers.delta import DeltaSink
    from framework import TwoPhaseSink

    orders = (
        spark.readStream.schema("order_id LONG, day STRING, amount DOUBLE")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
    )
    sink = TwoPhaseSink(DeltaSink(str(table), app_id="orders-ingest", partition_by=["day"]))
    query = sink.write_stream(
        orders, checkpoint_location=str(checkpoint), trigger={"availableNow": True}
    )
    query.awaitTermination()
    return sink.batches


def forget_newest_batch(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    newest = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(newest)).unlink()
    (commits / f".{newest}.crc").unlink(missing_ok=True)
    return newest


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="  %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    shutil.rmtree(OUT, ignore_errors=True)
    source, table, checkpoint = OUT / "orders-in", OUT / "orders-delta", OUT / "checkpoint"
    half = FILES // 2
    write_order_files(source, 0, half)
    spark = spark_session()

    print(f"\n== run 1: streaming {half} order files into {table} (one file per batch)")
    first = run_query(spark, source, table, checkpoint)
    for b in first:
        print(f"   batch {b.batch_id}: {b.status} ({b.rows} rows)")
    forgotten = forget_newest_batch(checkpoint)
    print(f"   the job stops; crash simulation: the checkpoint forgets batch {forgotten} finished")

    write_order_files(source, half, FILES - half)
    print(f"\n== run 2: {FILES - half} more files arrive; restart from the same checkpoint")
    second = run_query(spark, source, table, checkpoint)
    for b in second:
        print(f"   batch {b.batch_id}: {b.status} ({b.rows} rows)")
    spark.stop()

    from deltalake import DeltaTable

    delta = DeltaTable(str(table))
    ids = delta.to_pyarrow_dataset().to_table(columns=["order_id"]).column(0).to_pylist()
    duplicates = sum(n - 1 for n in Counter(ids).values() if n > 1)
    expected = FILES * ORDERS_PER_FILE
    print("\n== result (read back with delta-rs)")
    print(f"   rows in source:      {expected}")
    print(f"   rows written:        {len(ids)}")
    print(f"   distinct order ids:  {len(set(ids))}")
    print(f"   duplicates found:    {duplicates}")
    print(f"   missing:             {expected - len(set(ids))}")
    print(f"   table versions:      0..{delta.version()} (0 = table creation)")
    print(f"   txn(orders-ingest):  {delta.transaction_version('orders-ingest')}")
    ok = duplicates == 0 and len(ids) == expected and set(ids) == set(range(expected))
    print("\nOK: every order exactly once" if ok else "\nFAILED: the table is not exact")
    return 0 if ok else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # deltalake's runtime can abort at interpreter exit after the work is done
