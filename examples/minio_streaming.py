"""Exactly-once streaming into a Delta table on S3 (a local S3 by default), stopped and restarted.

With Docker, either compose file serves the default endpoint, keys and bucket::

    make images && docker compose -f docker/docker-compose.yml up -d   # SeaweedFS, built here
    docker compose -f docker/docker-compose.minio.yml up -d            # or MinIO (Docker Hub)
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

import os
import sys
import tempfile
import uuid
from pathlib import Path

from _orders import quiet_logging, report, run_demo, spark_session

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


def main() -> int:
    quiet_logging()
    from committers.delta.storage._storage import TableLocation
    from framework.errors import SinkError

    uri, options = table_uri(), storage_options()
    location = TableLocation.of(uri, options)
    print(f"\n== table {location.uri} at {location.endpoint}")
    print(f"   options: {location.redacted_options() or '(from the AWS environment)'}")

    work = Path(tempfile.mkdtemp(prefix="minio-streaming-"))
    spark = spark_session("minio-streaming")
    try:
        run_demo(spark, uri=uri, options=options, work=work, files=FILES, per_file=ORDERS_PER_FILE)
    except SinkError as err:
        print(f"\nCannot write: {err}")
        if options is not None:
            print("Is the local S3 running? docker compose -f docker/docker-compose.yml up -d")
        return 2
    finally:
        spark.stop()
    return 0 if report(uri, location.delta_storage_options(), FILES * ORDERS_PER_FILE) else 1


if __name__ == "__main__":
    sys.exit(main())
