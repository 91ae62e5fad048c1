"""The safe-commit self-test against the session's real S3 server (the root conftest's ``s3``)."""

from __future__ import annotations

import logging
import time
import uuid

import pytest

from committers.delta.storage._s3safety import (
    PROBE_DIR,
    PROCESS_CACHE,
    ConditionalPutCache,
    verify_conditional_put,
)
from committers.delta.storage._storage import TableLocation
from framework.errors import LocationNotWritableError, UnsafeStorageError
from framework.retry import Backoff
from integration_tests._fault_proxy import FaultProxy
from integration_tests._s3server import S3Server, free_port


@pytest.fixture
def table(bucket: str) -> str:
    return f"s3://{bucket}/tables/{uuid.uuid4().hex[:8]}"


def _proxy(s3: S3Server, **kwargs: object) -> FaultProxy:
    return FaultProxy(
        s3.endpoint,
        access_key=s3.access_key,
        secret_key=s3.secret_key,
        **kwargs,  # type: ignore[arg-type]
    )


def _keys(s3: S3Server, table_uri: str) -> list[str]:
    bucket, prefix = table_uri[len("s3://") :].split("/", 1)
    return s3.list_keys(bucket, prefix + "/")


@pytest.mark.integration
def test_real_server_passes_and_leaves_nothing(s3: S3Server, table: str) -> None:
    cache = ConditionalPutCache()
    location = TableLocation.of(table, s3.storage_options())
    verify_conditional_put(location, cache=cache)
    assert cache.is_verified(location.endpoint)
    assert _keys(s3, table) == []


@pytest.mark.integration
def test_result_is_cached_per_endpoint(s3: S3Server, table: str) -> None:
    cache = ConditionalPutCache()
    with _proxy(s3) as proxy:
        location = TableLocation.of(table, s3.storage_options(AWS_ENDPOINT_URL=proxy.endpoint))
        verify_conditional_put(location, cache=cache)
        first = sum(proxy.requests.values())
        assert first >= 5  # LIST (access check), PUT, PUT, GET, DELETE
        other_table = TableLocation.of(table + "-other", dict(location.storage_options))
        verify_conditional_put(other_table, cache=cache)
        # same endpoint: no second probe, only the access check (one listing) again
        assert sum(proxy.requests.values()) == first + 1
        verify_conditional_put(location, cache=ConditionalPutCache())
        assert sum(proxy.requests.values()) == 2 * first + 1  # a fresh cache probes again


@pytest.mark.integration
def test_default_cache_is_the_process_cache(s3: S3Server, table: str) -> None:
    location = TableLocation.of(table, s3.storage_options())
    PROCESS_CACHE.clear()
    try:
        verify_conditional_put(location)
        assert PROCESS_CACHE.is_verified(location.endpoint)
    finally:
        PROCESS_CACHE.clear()


@pytest.mark.integration
def test_gateway_ignoring_if_none_match_is_refused(s3: S3Server, table: str) -> None:
    cache = ConditionalPutCache()
    with _proxy(s3, ignore_if_none_match=True) as proxy:
        location = TableLocation.of(table, s3.storage_options(AWS_ENDPOINT_URL=proxy.endpoint))
        with pytest.raises(UnsafeStorageError) as caught:
            verify_conditional_put(location, cache=cache)
    message = str(caught.value)
    assert proxy.endpoint in message
    assert "accepted a second PUT with 'If-None-Match: *'" in message
    assert "unsafe_skip_conditional_put_check" in message
    assert not cache.is_verified(location.endpoint)
    assert _keys(s3, table) == []  # the probe object was removed


@pytest.mark.integration
def test_gateway_rejecting_the_header_is_refused(s3: S3Server, table: str) -> None:
    with _proxy(s3, reject_if_none_match=True) as proxy:
        location = TableLocation.of(table, s3.storage_options(AWS_ENDPOINT_URL=proxy.endpoint))
        with pytest.raises(UnsafeStorageError, match="501 NotImplemented") as caught:
            verify_conditional_put(location, cache=ConditionalPutCache())
    assert proxy.endpoint in str(caught.value)
    assert _keys(s3, table) == []


@pytest.mark.integration
def test_wrong_credentials(s3: S3Server, table: str) -> None:
    options = s3.storage_options(AWS_SECRET_ACCESS_KEY="definitely-wrong-secret")
    location = TableLocation.of(table, options)
    with pytest.raises(LocationNotWritableError, match="access denied") as caught:
        verify_conditional_put(location, cache=ConditionalPutCache())
    assert s3.endpoint in str(caught.value)
    assert "definitely-wrong-secret" not in str(caught.value)
    assert _keys(s3, table) == []


@pytest.mark.integration
def test_missing_bucket(s3: S3Server) -> None:
    location = TableLocation.of("s3://no-such-bucket-sinktest/t", s3.storage_options())
    with pytest.raises(LocationNotWritableError, match="bucket 'no-such-bucket-sinktest'"):
        verify_conditional_put(location, cache=ConditionalPutCache())


@pytest.mark.integration
def test_unreachable_endpoint_fails_fast(s3: S3Server, table: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    location = TableLocation.of(table, s3.storage_options(AWS_ENDPOINT_URL=dead))
    fast = Backoff(max_attempts=3, initial_delay=0.05, max_delay=0.2, deadline=10.0)
    started = time.monotonic()
    with pytest.raises(LocationNotWritableError, match="unreachable") as caught:
        verify_conditional_put(location, cache=ConditionalPutCache(), backoff=fast)
    assert time.monotonic() - started < 10
    assert dead in str(caught.value)


def test_default_backoff_is_bounded_for_an_unreachable_endpoint() -> None:
    table = f"s3://sink-unreachable/tables/{uuid.uuid4().hex[:8]}"  # no server needed
    dead = f"http://127.0.0.1:{free_port()}"
    options = {
        "AWS_ENDPOINT_URL": dead,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_REGION": "us-east-1",
    }
    started = time.monotonic()
    with pytest.raises(LocationNotWritableError):
        verify_conditional_put(TableLocation.of(table, options), cache=ConditionalPutCache())
    assert time.monotonic() - started < 20


@pytest.mark.integration
def test_passes_through_transient_faults(s3: S3Server, table: str) -> None:
    with _proxy(s3, fault_rate=0.4, seed=7) as proxy:
        location = TableLocation.of(table, s3.storage_options(AWS_ENDPOINT_URL=proxy.endpoint))
        verify_conditional_put(location, cache=ConditionalPutCache())
        assert sum(proxy.faults.values()) > 0
    assert _keys(s3, table) == []


@pytest.mark.integration
def test_lost_response_of_first_put_is_understood(s3: S3Server, table: str) -> None:
    """The first PUT lands but its response is dropped; the retry gets 412: still safe."""
    with _proxy(s3, fault_rate=1.0, kinds=["drop_after"], methods=["PUT"], max_faults=1) as proxy:
        location = TableLocation.of(table, s3.storage_options(AWS_ENDPOINT_URL=proxy.endpoint))
        verify_conditional_put(location, cache=ConditionalPutCache())
        assert proxy.faults["drop_after"] == 1
    assert _keys(s3, table) == []


@pytest.mark.integration
def test_skip_makes_no_conditional_put_and_warns(
    s3: S3Server, table: str, caplog: pytest.LogCaptureFixture
) -> None:
    with _proxy(s3, ignore_if_none_match=True) as proxy:
        location = TableLocation.of(table, s3.storage_options(AWS_ENDPOINT_URL=proxy.endpoint))
        with caplog.at_level(logging.WARNING, logger="committers.delta.storage._s3safety"):
            verify_conditional_put(location, skip=True, cache=ConditionalPutCache())
        assert proxy.requests.get("PUT", 0) == 0  # only the access check's listing
    assert "UNSAFE" in caplog.text
    assert proxy.endpoint in caplog.text


def test_local_location_is_a_no_op(tmp_path: object) -> None:
    cache = ConditionalPutCache()
    verify_conditional_put(TableLocation.of(str(tmp_path)), cache=cache)
    assert not cache.is_verified("file")


def test_probe_dir_is_hidden_from_delta_readers() -> None:
    assert PROBE_DIR.startswith("_")
