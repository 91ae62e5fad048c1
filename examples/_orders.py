"""The order-stream demo shared by quickstart.py (local table) and minio_streaming.py (S3).

A streaming job writes order files, one per micro-batch, through TwoPhaseSink(DeltaSink(...)).
It stops, its checkpoint "forgets" the newest finished batch (as when a driver dies after the
sink committed but before Spark recorded the batch), more files arrive and it restarts: the
replay is skipped before anything is written, the new batches are committed, and the table,
read back with delta-rs, must hold every order exactly once.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections import Counter
from pathlib import Path


def write_order_files(directory: Path, first_file: int, count: int, per_file: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(first_file, first_file + count):
        lines = (
            json.dumps(
                {
                    "order_id": f * per_file + i,
                    "day": f"2026-11-{21 + f % 3:02d}",
                    "amount": round((f * per_file + i) * 0.37 % 500, 2),
                }
            )
            for i in range(per_file)
        )
        tmp = directory / f".orders-{f:03d}.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(directory / f"orders-{f:03d}.json")


def spark_session(app_name: str):  # type: ignore[no-untyped-def]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_query(spark, source: Path, uri: str, options, checkpoint: Path):  # type: ignore[no-untyped-def]
    """Process every file available now, then stop (as a restarted or stopped job would)."""
    from committers.delta import DeltaSink
    from framework import TwoPhaseSink

    orders = (
        spark.readStream.schema("order_id LONG, day STRING, amount DOUBLE")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
    )
    sink = TwoPhaseSink(
        DeltaSink(uri, app_id="orders-ingest", partition_by=["day"], storage_options=options)
    )
    query = sink.write_stream(
        orders, checkpoint_location=str(checkpoint), trigger={"availableNow": True}
    )
    query.awaitTermination()
    for b in sink.batches:
        print(f"   batch {b.batch_id}: {b.status} ({b.rows} rows)")
    return sink.batches


def forget_newest_batch(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    newest = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(newest)).unlink()
    (commits / f".{newest}.crc").unlink(missing_ok=True)
    return newest


def run_demo(spark, *, uri: str, options, work: Path, files: int, per_file: int) -> None:  # type: ignore[no-untyped-def]
    """Run 1, the simulated crash, run 2 (see the module docstring)."""
    source, checkpoint = work / "orders-in", work / "checkpoint"
    half = files // 2
    write_order_files(source, 0, half, per_file)
    print(f"\n== run 1: streaming {half} order files into {uri} (one file per batch)")
    run_query(spark, source, uri, options, checkpoint)
    forgotten = forget_newest_batch(checkpoint)
    print(f"   the job stops; crash simulation: the checkpoint forgets batch {forgotten} finished")
    write_order_files(source, half, files - half, per_file)
    print(f"\n== run 2: {files - half} more files arrive; restart from the same checkpoint")
    run_query(spark, source, uri, options, checkpoint)


def report(uri: str, delta_options, expected: int) -> bool:  # type: ignore[no-untyped-def]
    """Read the table back with delta-rs and print whether every order is there exactly once."""
    from deltalake import DeltaTable

    delta = DeltaTable(uri, storage_options=delta_options)
    ids = delta.to_pyarrow_dataset().to_table(columns=["order_id"]).column(0).to_pylist()
    duplicates = sum(n - 1 for n in Counter(ids).values() if n > 1)
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
    return ok


def quiet_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="  %(message)s")
    for noisy in ("py4j", "botocore", "aiobotocore", "s3fs", "fsspec"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
