"""Staged-file uploads of the ``"arrow"`` staging through the async sink writer, against the
real S3 server, with faults injected by the proxy: multipart parts, completion, throttling,
fatal errors, aborts, and the multipart uploads a killed task leaves behind.
"""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
import pytest

from committers.delta import DeltaSink
from committers.delta.storage._storage import TableLocation
from committers.delta.storage._upload import S3Uploader, abort_incomplete_uploads
from framework import TwoPhaseSink
from framework.errors import StagingError
from integration_tests._fault_proxy import FAULT_KINDS, FaultProxy
from integration_tests._s3helpers import S3Table, assert_no_duplicates

PART = 5 * 1024 * 1024  # the smallest part S3 accepts


def _uploader(table: S3Table, options: dict[str, str], concurrency: int = 4) -> S3Uploader:
    location = TableLocation.of(table.uri, options)
    return S3Uploader(location, part_size=PART, concurrency=concurrency)


def _every_kind_of_fault(
    table: S3Table, *, rate: float, seed: int, path_pattern: str
) -> FaultProxy:
    """Faults of every kind, in turn, on the uploads (PUT) and the multipart creations and
    completions (POST) of the objects matching ``path_pattern``."""
    return FaultProxy(
        table.server.endpoint,
        fault_rate=rate,
        seed=seed,
        methods=("PUT", "POST"),
        kinds=FAULT_KINDS,
        cycle_kinds=True,
        path_pattern=path_pattern,
    )


def _upload(uploader: S3Uploader, table: S3Table, name: str, data: bytes) -> str:
    """Write ``data`` through a stream in uneven chunks, as a Parquet writer does."""
    stream = uploader.open(f"{table.bucket}/{table.prefix}/{name}")
    position, chunk = 0, 1_000_003
    while position < len(data):
        stream.write(data[position : position + chunk])
        position += chunk
    assert stream.tell() == len(data)
    stream.close()
    return f"{table.prefix}/{name}"


def _body(table: S3Table, key: str) -> bytes:
    body: bytes = table.server.client().get_object(Bucket=table.bucket, Key=key)["Body"].read()
    return body


def _incomplete_uploads(table: S3Table) -> list[dict[str, Any]]:
    listing = table.server.client().list_multipart_uploads(
        Bucket=table.bucket, Prefix=table.prefix + "/"
    )
    uploads: list[dict[str, Any]] = listing.get("Uploads", [])
    return uploads


def test_files_of_every_size_arrive_whole_through_every_kind_of_fault(table: S3Table) -> None:
    """Parts, single PUTs and completions meet 503 SlowDown, 500 and connections dropped before
    and after the server got the request: every object ends byte for byte what was written,
    and no incomplete multipart upload is left behind."""
    files = {
        "large.bin": os.urandom(3 * PART + 12_345),  # four parts
        "exact.bin": os.urandom(2 * PART),  # two full parts, no tail
        "small.bin": os.urandom(1000),  # one PUT
        "empty.bin": b"",
    }
    with _every_kind_of_fault(table, rate=0.5, seed=7, path_pattern=r"\.bin") as proxy:
        uploader = _uploader(table, {**table.options, "AWS_ENDPOINT_URL": proxy.endpoint})
        keys = {name: _upload(uploader, table, name, data) for name, data in files.items()}
        uploader.flush()
        metrics = uploader.metrics
        uploader.close()
        faults = dict(proxy.faults)

    assert set(faults) == set(FAULT_KINDS), faults
    for name, data in files.items():
        assert _body(table, keys[name]) == data, name
    assert _incomplete_uploads(table) == []
    # Every error answer reached the writer: no retry loop of botocore hid one. (aiohttp
    # re-sends a PUT once on a reused connection the server closed, so drops may not.)
    assert metrics.num_throttled_requests == faults["slowdown"]
    assert metrics.num_failed_requests >= faults["slowdown"] + faults["internal"]


def test_slowdown_is_throttling_not_a_spent_retry_budget(table: S3Table) -> None:
    """Three SlowDowns in four requests: far more than the retry budget allows for errors, yet
    the upload completes, since throttling only lowers the in-flight window and waits."""
    data = os.urandom(6 * PART)
    with FaultProxy(
        table.server.endpoint,
        fault_rate=0.75,
        seed=3,
        methods=("PUT", "POST"),
        kinds=("slowdown",),
        path_pattern=r"\.bin",
        max_faults=40,
    ) as proxy:
        uploader = _uploader(table, {**table.options, "AWS_ENDPOINT_URL": proxy.endpoint})
        key = _upload(uploader, table, "throttled.bin", data)
        uploader.flush()
        metrics = uploader.metrics
        uploader.close()
        slowdowns = proxy.faults["slowdown"]

    assert slowdowns >= 10
    assert metrics.num_throttled_requests == slowdowns
    assert _body(table, key) == data


def test_access_denied_fails_the_upload_at_once_with_the_s3_error(table: S3Table) -> None:
    uploader = _uploader(table, {**table.options, "AWS_SECRET_ACCESS_KEY": "not-the-secret"})
    stream = uploader.open(f"{table.bucket}/{table.prefix}/denied.bin")
    stream.write(b"x" * 100)
    stream.close()
    with pytest.raises(StagingError, match=r"SignatureDoesNotMatch|AccessDenied|InvalidAccessKey"):
        uploader.flush()
    assert uploader.metrics.num_requests == 1  # not retried
    uploader.abort()
    assert table.keys() == []


def test_abort_drops_the_started_multipart_uploads(table: S3Table) -> None:
    uploader = _uploader(table, table.options)
    stream = uploader.open(f"{table.bucket}/{table.prefix}/aborted.bin")
    stream.write(os.urandom(PART + 10))  # one part goes up; the file is never closed
    uploader._run(uploader._writer.flush(), "waiting for the part")
    assert len(_incomplete_uploads(table)) == 1
    uploader.abort()
    assert _incomplete_uploads(table) == []
    assert table.keys() == []


def test_uploads_of_a_killed_task_are_aborted_by_name(table: S3Table) -> None:
    """A task killed mid-upload leaves an incomplete multipart upload that no listing of
    objects shows; the driver aborts it by the name the manifest gave the file, and leaves
    other uploads alone."""
    uploader = _uploader(table, table.options)
    for name in ("killed.bin", "other.bin"):
        uploader.open(f"{table.bucket}/{table.prefix}/{name}").write(os.urandom(PART))
    uploader._run(uploader._writer.flush(), "waiting for the parts")
    # The task dies here: no complete, no abort.
    location = TableLocation.of(table.uri, table.options)
    assert abort_incomplete_uploads(location, ["killed.bin", "never-started.bin"]) == 1
    assert [item["Key"] for item in _incomplete_uploads(table)] == [f"{table.prefix}/other.bin"]
    assert abort_incomplete_uploads(location, ["other.bin"]) == 1


@pytest.mark.spark
def test_multipart_staging_under_faults_commits_every_row_once(spark, table: S3Table) -> None:  # type: ignore[no-untyped-def]
    """A Spark job whose tasks each stage files of several parts, through faults of every kind
    on data-file uploads (30%; with this seed every kind within the first five requests): the
    table holds every row once, nothing staged is left."""
    rows = 160_000  # 64 random bytes each: about 5 MiB per task after snappy, so >1 part
    df = spark.range(0, rows, numPartitions=2).selectExpr(
        "id", "unhex(sha2(cast(id as string), 512)) as blob"
    )
    with _every_kind_of_fault(
        table, rate=0.3, seed=4, path_pattern=r"/part-[^/]*\.parquet"
    ) as proxy:
        options = {**table.options, "AWS_ENDPOINT_URL": proxy.endpoint}
        sink = TwoPhaseSink(
            DeltaSink(
                table.uri,
                app_id="parts",
                storage_options=options,
                staging="arrow",
                upload_part_size=PART,
                row_group_bytes=2 * 1024 * 1024,
            )
        )
        metrics = sink.write(df)
        faults = dict(proxy.faults)
        requests = dict(proxy.requests)

    print(f"fault proxy: {faults} in {requests}")
    assert set(faults) == set(FAULT_KINDS), faults
    assert (metrics.status, metrics.rows) == ("committed", rows)
    # The tasks' upload counters reach the batch's metrics, summed over both tasks.
    uploads = metrics.writer_metrics
    assert uploads["upload_throttled_requests"] == faults["slowdown"]
    assert uploads["upload_retries"] >= faults["internal"] >= 1
    values = table.ids()
    assert_no_duplicates(values)
    assert values == list(range(rows))
    sizes = pa.table(table.delta().get_add_actions(flatten=True)).column("size_bytes").to_pylist()
    assert max(sizes) > PART, f"no file needed more than one part: {sizes}"
    table.assert_no_orphans()
    assert _incomplete_uploads(table) == []
