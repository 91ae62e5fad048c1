"""Exactly-once streaming into a Delta table on S3 (MinIO by default), stopped and restarted.

With Docker::

    docker compose -f docker/docker-compose.yml up -d     # MinIO on 127.0.0.1:9000 + bucket "lake"
    python examples/minio_streaming.py

Against any other S3 endpoint, set the standard variables (they win over the MinIO defaults)::

    AWS_ENDPOINT_URL=https://s3.example.com AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... \\
    AWS_REGION=eu-west-1 SINK_TABLE_URI=s3://my-bucket/orders python examples/minio_streaming.py

(For AWS itself leave ``AWS_ENDPOINT_URL`` unset and set ``SINK_TABLE_URI``; credentials may
also come from ``AWS_PROFILE``.) Plain ``http://`` endpoints need ``AWS_ALLOW_HTTP=true``,
which is set automatically for the default MinIO.

What it does: streams order files (one per micro-batch) through
``TwoPhaseSink(DeltaSink("s3://..."))``; the sink first proves the endpoint rejects a second
conditional PUT (the safe-commit self-test); the job stops, its checkpoint "forgets" the newest
finished batch, more files arrive and the job restarts: the replayed batch is skipped, the new
ones are committed, and the table, read back with delta-rs, holds every order exactly once.
The checkpoint and the source stay on local disk; only the table is on S3.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import uuid
from collections import Counter
from pathlib import Path

FILES, ORDERS_PER_FILE = 4, 500

# The docker compose defaults (docker/docker-compose.yml).
MINIO_DEFAULTS = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
    "AWS_ACCESS_KEY_ID": "sinkadmin",
    "AWS_SECRET_ACCESS_KEY": "sinkadmin-secret",
    "AWS_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
}


def storage_options() -> dict[str, str] | None:
    """The compose MinIO unless the environment names an endpoint or credentials.

    Returns ``None`` when the environment is configured: the sink then resolves endpoint,
    region and credentials from the standard AWS variables and profiles itself.
    """
    configured = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_PROFILE")
    if any(os.environ.get(name) for name in configured):
        return None
    return dict(MINIO_DEFAULTS)


def table_uri() -> str:
    if os.environ.get("SINK_TABLE_URI"):
        return os.environ["SINK_TABLE_URI"]
    bucket = os.environ.get("SINK_BUCKET", "lake")
    return f"s3://{bucket}/orders-{uuid.uuid4().hex[:8]}"


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


def spark_session():  # type: ignore[no-untyped-def]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("minio-streaming")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_query(spark, source: Path, uri: str, options, checkpoint: Path):  # type: ignore[no-untyped-def]
    """Process every file available now, then stop."""
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
    return sink.batches


def forget_newest_batch(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    newest = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(newest)).unlink()
    (commits / f".{newest}.crc").unlink(missing_ok=True)
    return newest


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="  %(message)s")
    for noisy in ("py4j", "botocore", "aiobotocore", "s3fs", "fsspec"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from committers.delta._storage import TableLocation
    from framework.errors import SinkError

    uri, options = table_uri(), storage_options()
    location = TableLocation.of(uri, options)
    print(f"\n== table {location.uri} at {location.endpoint}")
    print(f"   options: {location.redacted_options() or '(from the AWS environment)'}")

    work = Path(tempfile.mkdtemp(prefix="minio-streaming-"))
    source, checkpoint = work / "orders-in", work / "checkpoint"
    half = FILES // 2
    write_order_files(source, 0, half)
    spark = spark_session()
    try:
        print(f"\n== run 1: streaming {half} order files (one file per batch)")
        try:
            first = run_query(spark, source, uri, options, checkpoint)
        except SinkError as err:
            print(f"\nCannot write: {err}")
            if options is not None:
                print("Is MinIO running? docker compose -f docker/docker-compose.yml up -d")
            return 2
        for b in first:
            print(f"   batch {b.batch_id}: {b.status} ({b.rows} rows)")
        forgotten = forget_newest_batch(checkpoint)
        print(f"   the job stops; crash simulation: the checkpoint forgets batch {forgotten}")

        write_order_files(source, half, FILES - half)
        print(f"\n== run 2: {FILES - half} more files arrive; restart from the same checkpoint")
        for b in run_query(spark, source, uri, options, checkpoint):
            print(f"   batch {b.batch_id}: {b.status} ({b.rows} rows)")
    finally:
        spark.stop()

    from deltalake import DeltaTable

    delta = DeltaTable(uri, storage_options=location.delta_storage_options())
    ids = delta.to_pyarrow_dataset().to_table(columns=["order_id"]).column(0).to_pylist()
    duplicates = sum(n - 1 for n in Counter(ids).values() if n > 1)
    expected = FILES * ORDERS_PER_FILE
    print("\n== result (read back with delta-rs)")
    print(f"   rows in source:      {expected}")
    print(f"   rows written:        {len(ids)}")
    print(f"   duplicates found:    {duplicates}")
    print(f"   missing:             {expected - len(set(ids))}")
    print(f"   txn(orders-ingest):  {delta.transaction_version('orders-ingest')}")
    ok = duplicates == 0 and len(ids) == expected and set(ids) == set(range(expected))
    print("\nOK: every order exactly once" if ok else "\nFAILED: the table is not exact")
    return 0 if ok else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # deltalake's runtime can abort at interpreter exit after the work is done
