"""Credentials over time on a real S3 server: short-lived keys that expire under a running query,
and keys the driver got after Spark started, which its executors never see."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from committers.delta import DeltaSink
from committers.tests._spark_helpers import make_source
from committers.tests._streaming_driver import STAGING_VARIABLE
from framework import TwoPhaseSink
from framework.errors import ConfigurationError
from integration_tests._fault_proxy import FaultProxy
from integration_tests._rotating_credentials import RotatingCredentials
from integration_tests._s3helpers import S3Table, assert_no_duplicates

pytestmark = [pytest.mark.integration, pytest.mark.spark]

REPO_ROOT = Path(__file__).resolve().parents[1]
#: Seconds a key is handed out (it lives one to two periods), per staging. The JVM's AWS SDK
#: (Spark's writer through s3a) renews process credentials 15 s before they expire, and a
#: 15 s stale margin is what an STS session of minutes or hours leaves too: its keys must live
#: longer than that. botocore (the Python writers) renews them too, with its own margins.
KEY_PERIODS = {"arrow": 3.0, "spark": 20.0}
BATCHES = 5


def _put_with(proxy: FaultProxy, table: S3Table, key: tuple[str, str]) -> None:
    client = boto3.client(
        "s3",
        endpoint_url=proxy.endpoint,
        aws_access_key_id=key[0],
        aws_secret_access_key=key[1],
        region_name=table.server.region,
        config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
    )
    client.put_object(Bucket=table.bucket, Key=f"probe-{key[0]}", Body=b"x")


@pytest.mark.parametrize("staging", sorted(KEY_PERIODS))
def test_expiring_keys_are_renewed_under_a_running_query(
    table: S3Table, tmp_path: Path, staging: str
) -> None:
    """A streaming query outlives several short-lived keys: the driver's long-lived committer
    handle and the executors' uploads (the Python writers through botocore, or Spark's writer
    through s3a and the JVM's AWS SDK) renew them, and every row lands exactly once."""
    if not table.server.temporary_keys:
        pytest.skip("this S3 server has no temporary keys (only the SeaweedFS started here has)")
    key_period = KEY_PERIODS[staging]
    rotating = RotatingCredentials(table.server.temporary_keys, key_period, tmp_path)
    with FaultProxy(table.server.endpoint, key_expiry=rotating.key_expiry) as proxy:
        options = {
            "AWS_ENDPOINT_URL": proxy.endpoint,
            "AWS_REGION": table.server.region,
            "AWS_ALLOW_HTTP": "true",
        }
        src, checkpoint = make_source(tmp_path, BATCHES), tmp_path / "chk"
        env = {
            **rotating.environment(dict(os.environ), tmp_path),
            STAGING_VARIABLE: staging,
            "PYTHONPATH": str(REPO_ROOT),
            "SINK_TEST_STORAGE_OPTIONS": json.dumps(options),
            "SINK_TEST_BATCH_PAUSE": str(key_period / 2),
        }
        started = time.time()
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "integration_tests._s3_driver",
                str(src),
                table.uri,
                str(checkpoint),
            ],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        elapsed = time.time() - started
        expired_refusals = proxy.faults["expired"]
        # The server really refuses an expired key, and accepts the current one.
        with pytest.raises(ClientError, match="ExpiredToken"):
            _put_with(proxy, table, rotating.keys[0])
        _put_with(proxy, table, rotating.keys[int((time.time() - rotating.start) // key_period)])
    assert run.returncode == 0, run.stderr[-4000:]
    assert f"BATCHES {[(b, 'committed') for b in range(BATCHES)]}" in run.stdout, run.stdout
    assert elapsed > 3 * key_period  # the query outlived at least three keys
    ids = table.ids()
    assert_no_duplicates(ids)
    assert ids == list(range(BATCHES * 10))
    table.assert_no_orphans()
    print(f"{elapsed:.1f} s, {expired_refusals} requests refused with an expired key")


def test_keys_set_after_spark_started_fail_clearly(
    spark, table: S3Table, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Keys put into the driver's environment after the SparkSession started never reach its
    executors (their Python workers inherit the JVM's environment): the write fails with what
    to do, and leaves nothing in the table location."""
    df = spark.range(0, 100, numPartitions=2).selectExpr("id", "cast(id % 3 as string) as day")
    df.count()  # executors are up before the keys appear
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", table.server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", table.server.secret_key)
    options = {k: v for k, v in table.options.items() if not k.startswith("AWS_SECRET")}
    del options["AWS_ACCESS_KEY_ID"]
    # The Python writers (Spark's writer in the driver's JVM is handed the driver's keys).
    sink = TwoPhaseSink(
        DeltaSink(table.uri, app_id="late-keys", storage_options=options, staging="arrow")
    )
    with pytest.raises(ConfigurationError) as caught:
        sink.write(df)
    message = str(caught.value)
    assert "find no credentials" in message and "after the SparkSession started" in message
    assert "from env" in message and table.server.secret_key not in message
    table.assert_nothing_written()
