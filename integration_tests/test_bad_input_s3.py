"""Unusable S3 destinations fail fast with a clear error; nothing is committed or left staged."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from committers.delta import DeltaSink
from committers.delta.storage._s3safety import PROCESS_CACHE
from framework import TwoPhaseSink
from framework.errors import LocationNotWritableError, UnsafeStorageError
from integration_tests._fault_proxy import FaultProxy
from integration_tests._s3helpers import S3Table
from integration_tests._s3server import free_port

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def df(spark):  # type: ignore[no-untyped-def]
    return spark.range(0, 100, numPartitions=2).selectExpr("id", "cast(id % 3 as string) as day")


@pytest.fixture(autouse=True)
def fresh_probe_cache() -> None:
    """Each test starts from an unverified endpoint (the proxies reuse no ports, but be sure)."""
    PROCESS_CACHE.clear()


def _sink(table_uri: str, options: dict[str, str], **kwargs: object) -> TwoPhaseSink:
    return TwoPhaseSink(
        DeltaSink(
            table_uri,
            app_id="bad",
            partition_by=["day"],
            storage_options=options,
            **kwargs,  # type: ignore[arg-type]
        )
    )


def test_wrong_credentials(df, table: S3Table) -> None:  # type: ignore[no-untyped-def]
    options = {**table.options, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    with pytest.raises(LocationNotWritableError, match="access denied") as caught:
        _sink(table.uri, options).write(df)
    message = str(caught.value)
    assert table.server.endpoint in message and "AWS_SECRET_ACCESS_KEY" in message
    assert "not-the-secret" not in message
    table.assert_nothing_written()


def test_missing_bucket(df, table: S3Table) -> None:  # type: ignore[no-untyped-def]
    uri = "s3://sink-no-such-bucket/t"
    with pytest.raises(LocationNotWritableError, match="bucket 'sink-no-such-bucket' does not"):
        _sink(uri, table.options).write(df)
    assert "sink-no-such-bucket" not in table.server.client().list_buckets()["Buckets"]


def test_unreachable_endpoint_fails_within_bounded_time(df, table: S3Table) -> None:  # type: ignore[no-untyped-def]
    dead = f"http://127.0.0.1:{free_port()}"
    options = {**table.options, "AWS_ENDPOINT_URL": dead}
    started = time.monotonic()
    with pytest.raises(LocationNotWritableError, match="unreachable") as caught:
        _sink(table.uri, options).write(df)
    assert time.monotonic() - started < 30
    assert dead in str(caught.value)
    table.assert_nothing_written()


def test_endpoint_failing_the_self_test_is_refused(df, table: S3Table) -> None:  # type: ignore[no-untyped-def]
    server = table.server
    with FaultProxy(
        server.endpoint,
        ignore_if_none_match=True,
        access_key=server.access_key,
        secret_key=server.secret_key,
    ) as gateway:
        options = {**table.options, "AWS_ENDPOINT_URL": gateway.endpoint}
        with pytest.raises(UnsafeStorageError) as caught:
            _sink(table.uri, options).write(df)
        message = str(caught.value)
        assert gateway.endpoint in message
        assert "If-None-Match" in message and "unsafe_skip_conditional_put_check" in message
        table.assert_nothing_written()

        # the loudly named override lets a user who knows better write anyway
        metrics = _sink(table.uri, options, unsafe_skip_conditional_put_check=True).write(df)
    assert (metrics.status, metrics.rows) == ("committed", 100)
    assert table.ids() == list(range(100))
    table.assert_no_orphans()


def test_errors_do_not_depend_on_what_ran_before(df, table: S3Table) -> None:  # type: ignore[no-untyped-def]
    """Once the endpoint passed the self-test in this process, wrong credentials and a missing
    bucket are still classified (not raw delta-rs text)."""
    assert _sink(table.uri, table.options).write(df).status == "committed"
    assert PROCESS_CACHE.is_verified(table.server.endpoint)

    other = f"{table.uri}-second"
    wrong = {**table.options, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    with pytest.raises(LocationNotWritableError, match="access denied") as caught:
        _sink(other, wrong).write(df)
    assert "\x1b[" not in str(caught.value) and "<?xml" not in str(caught.value)
    with pytest.raises(LocationNotWritableError, match="bucket 'sink-no-such-bucket' does not"):
        _sink("s3://sink-no-such-bucket/t", table.options).write(df)


def test_no_credentials_is_said_plainly_and_nothing_else(  # type: ignore[no-untyped-def]
    df, table: S3Table, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    options = {
        name: value
        for name, value in table.options.items()
        if name not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    }
    with (
        caplog.at_level(logging.WARNING),
        pytest.raises(LocationNotWritableError, match="no AWS credentials found"),
    ):
        _sink(table.uri, options).write(df)
    assert "probe" not in caplog.text  # no warning about an object that was never written
    table.assert_nothing_written()
