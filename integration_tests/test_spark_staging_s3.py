"""Spark's own Parquet writer staging S3 tables through ``s3a://`` (hadoop-aws, from
`make jars`): ``staging="auto"`` picks it, the table's options configure Spark's s3a for its
bucket, upserts rewrite files on S3, and settings that disagree are refused before anything is
written. Rows are read back with deltalake and with delta-spark (through the same s3a)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator

import pytest

from committers.delta import DeltaSink
from committers.delta.spark._spark_staging import RUN_DIR_PREFIX
from committers.tests._delta_spark import comparable
from framework import TwoPhaseSink
from framework.errors import ConfigurationError
from integration_tests._s3helpers import S3Table, assert_no_duplicates

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _rows(spark, count: int, start: int = 0):  # type: ignore[no-untyped-def]
    return spark.range(start, start + count, numPartitions=2).selectExpr(
        "id", "cast(id % 3 as string) as day", "concat('v', id) as v", "0 as seq"
    )


def _delta_spark_rows(spark, table: S3Table) -> list[dict]:  # type: ignore[no-untyped-def]
    s3a = "s3a://" + table.uri[len("s3://") :]
    return comparable(spark.read.format("delta").load(s3a).toArrow().to_pylist())


def _delta_rs_rows(table: S3Table) -> list[dict]:
    return comparable(table.delta().to_pyarrow_table().to_pylist())


@pytest.fixture
def hadoop_conf(spark) -> Iterator[Callable[[str, str], None]]:  # type: ignore[no-untyped-def]
    """``set(name, value)`` in the SparkContext's Hadoop configuration for the test; each
    setting is put back as it was after it (``unset`` would drop Hadoop's default too)."""
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    before: dict[str, str | None] = {}

    def set_for_test(name: str, value: str) -> None:
        before.setdefault(name, conf.get(name))
        conf.set(name, value)

    yield set_for_test
    for name, value in before.items():
        if value is None:
            conf.unset(name)
        else:
            conf.set(name, value)


def test_auto_stages_s3_tables_with_spark_through_s3a(
    delta_spark, table: S3Table, caplog: pytest.LogCaptureFixture
) -> None:
    sink = DeltaSink(table.uri, app_id="auto", partition_by=["day"], **table.sink_kwargs())
    with caplog.at_level(logging.INFO, logger="committers.delta"):
        metrics = TwoPhaseSink(sink).write(_rows(delta_spark, 300), epoch_id=1)

    assert (metrics.status, metrics.rows) == ("committed", 300)
    assert "stages with Spark's Parquet writer" in caplog.text
    assert all(key.startswith(RUN_DIR_PREFIX) for key in table.committed_keys())
    by_delta_rs = _delta_rs_rows(table)
    assert [row["id"] for row in sorted(by_delta_rs, key=lambda r: r["id"])] == list(range(300))
    assert _delta_spark_rows(delta_spark, table) == by_delta_rs
    table.assert_no_orphans()
    assert table.server.secret_key not in caplog.text


def test_upsert_on_s3_with_spark_staging(delta_spark, table: S3Table) -> None:
    first = DeltaSink(table.uri, app_id="load", partition_by=["day"], **table.sink_kwargs())
    TwoPhaseSink(first).write(_rows(delta_spark, 100), epoch_id=1)
    changes = delta_spark.createDataFrame(
        [(5, "2", "five", 1, "U"), (7, "1", None, 1, "D"), (500, "2", "new", 1, "U")],
        "id LONG, day STRING, v STRING, seq INT, op STRING",
    )
    upsert = DeltaSink(
        table.uri,
        app_id="cdc",
        mode="upsert",
        keys=["id"],
        sequence_by="seq",
        delete_when="op = 'D'",
        **table.sink_kwargs(staging="spark"),
    )
    metrics = TwoPhaseSink(upsert).write(changes)
    assert metrics.status == "committed"

    expected = {i: f"v{i}" for i in range(100) if i != 7} | {5: "five", 500: "new"}
    by_delta_rs = _delta_rs_rows(table)
    assert {row["id"]: row["v"] for row in by_delta_rs} == expected
    ids = [row["id"] for row in by_delta_rs]
    assert_no_duplicates(ids)
    assert _delta_spark_rows(delta_spark, table) == by_delta_rs
    # On storage: the live files and those the upsert removed (kept for time travel) only.
    removed = {
        json.loads(line)["remove"]["path"]
        for text in table.log_texts()
        for line in text.splitlines()
        if '"remove"' in line
    }
    assert removed and table.data_keys() == table.committed_keys() | removed
    assert table.staged_leftovers() == []


def test_s3a_settings_that_disagree_are_refused(
    spark, table: S3Table, hadoop_conf: Callable[[str, str], None]
) -> None:
    """A per-bucket endpoint in Spark's configuration other than the table's: refused by both
    stagings' Spark path before anything is written (auto too: the user's settings are not
    silently bypassed)."""
    name = f"fs.s3a.bucket.{table.bucket}.endpoint"
    hadoop_conf(name, "http://127.0.0.1:9")
    for staging in ("spark", "auto"):
        sink = DeltaSink(table.uri, app_id="mismatch", **table.sink_kwargs(staging=staging))
        with pytest.raises(ConfigurationError) as caught:
            TwoPhaseSink(sink).write(_rows(spark, 10))
        assert name in str(caught.value) and "disagree" in str(caught.value)
        assert table.server.secret_key not in str(caught.value)
    table.assert_nothing_written()


def test_without_hadoop_aws_auto_falls_back_to_arrow_and_spark_is_refused(
    spark, table: S3Table, hadoop_conf: Callable[[str, str], None], caplog: pytest.LogCaptureFixture
) -> None:
    """No S3A file system class (as without hadoop-aws on the classpath): staging="spark" is
    refused naming what is missing; "auto" stages with the Python writers and says why."""
    hadoop_conf("fs.s3a.impl", "org.example.NoSuchS3AFileSystem")
    refused = DeltaSink(table.uri, app_id="no-s3a", **table.sink_kwargs(staging="spark"))
    with pytest.raises(ConfigurationError, match="hadoop-aws"):
        TwoPhaseSink(refused).write(_rows(spark, 10))
    table.assert_nothing_written()

    sink = DeltaSink(table.uri, app_id="no-s3a", **table.sink_kwargs())
    with caplog.at_level(logging.INFO, logger="committers.delta"):
        metrics = TwoPhaseSink(sink).write(_rows(spark, 10))
    assert metrics.rows == 10
    assert "stages with Python writers (Spark has no s3a:// file system" in caplog.text
    assert not any(key.startswith(RUN_DIR_PREFIX) for key in table.committed_keys())
    assert table.ids() == list(range(10))
    table.assert_no_orphans()


def test_keys_from_the_environment_reach_s3a(
    delta_spark, table: S3Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys botocore finds in the driver's environment (none in storage_options) are handed to
    Spark's s3a as to delta-rs: Spark's writer, in the driver's JVM, stages with them even
    though they were set after the session started."""
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", table.server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", table.server.secret_key)
    options = {k: v for k, v in table.options.items() if k not in _KEYS}
    sink = DeltaSink(table.uri, app_id="env", storage_options=options, staging="spark")
    metrics = TwoPhaseSink(sink).write(_rows(delta_spark, 20))

    assert metrics.rows == 20
    assert all(key.startswith(RUN_DIR_PREFIX) for key in table.committed_keys())
    assert table.ids() == list(range(20))
    table.assert_no_orphans()


_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def test_an_s3a_file_system_built_with_other_settings_is_refused(spark, s3) -> None:  # type: ignore[no-untyped-def]
    """Hadoop reuses the S3A file system it built for a bucket whatever later jobs configure:
    one built before the sink configured the bucket, for another endpoint, is refused."""
    bucket = s3.create_bucket()
    table = S3Table(s3, f"s3://{bucket}/t", s3.storage_options())
    jvm = spark._jvm
    conf = jvm.org.apache.hadoop.conf.Configuration(spark.sparkContext._jsc.hadoopConfiguration())
    conf.set(f"fs.s3a.bucket.{bucket}.endpoint", "http://127.0.0.1:9")
    elsewhere = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI(f"s3a://{bucket}/"), conf)
    try:
        sink = DeltaSink(table.uri, app_id="cached", **table.sink_kwargs(staging="spark"))
        with pytest.raises(ConfigurationError, match="already holds an S3A file system") as caught:
            TwoPhaseSink(sink).write(_rows(spark, 10))
        assert "fs.s3a.endpoint" in str(caught.value)
        table.assert_nothing_written()
    finally:
        elsewhere.close()
        s3.delete_bucket(bucket)
