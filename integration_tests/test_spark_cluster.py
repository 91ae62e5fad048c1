"""A stream into Delta on S3 run by a Spark standalone cluster of separate hosts (containers:
a master, two workers, a driver, the S3 server; ``_spark_cluster.py``), deployed as
docs/deploy.md's Option 1 (the packed virtualenv in ``--archives``), under the faults a real
cluster meets: a worker host lost mid-stage, a worker host frozen mid-stage that comes back
as a zombie, and the driver killed at commit steps and started again. Each ends with every
source row in the table exactly once, read back with delta-rs and DuckDB.

Skipped, and saying why, where no Docker engine answers or the ``spark`` and ``seaweedfs``
images are not built (``make images`` builds them).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from committers.tests._packaging import build_wheel, pack_executor_env
from integration_tests._containers import freeze, image
from integration_tests._s3helpers import S3Table
from integration_tests._spark_cluster import SparkCluster, finished, spark_cluster, unpack

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    # Four JVMs of its own: beside the other heavy group, not on top of it.
    pytest.mark.xdist_group("spark_cluster"),
    pytest.mark.skipif(
        image("spark") is None or image("seaweedfs") is None,
        reason="no Docker engine, or the spark and seaweedfs images are not built (make images)",
    ),
]

FILES, ROWS_PER_FILE = 6, 500  # two files a batch: three batches
NODES_PYTHON = "/usr"  # where the images' Debian Python lives


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    work = tmp_path_factory.mktemp("cluster")
    pack = pack_executor_env(build_wheel(work / "wheel"), work, python_prefix=NODES_PYTHON)
    with spark_cluster(pack, unpack(pack, work / "environment")) as started:
        yield started


@pytest.fixture
def job(cluster: SparkCluster, tmp_path: Path) -> Iterator[tuple[S3Table, list[str]]]:
    """A bucket with the source files, a table location in another, and the job's arguments
    but for the staging; the driver's disk (the checkpoint's directory) is ``tmp_path``.

    Two buckets: the job reads its source through s3a with the cluster-wide settings, and a
    bucket Spark already holds an S3A file system for with other settings than the table's
    is refused for Spark's writer (``staging="spark"``): Hadoop would reuse that one."""
    cluster.ensure_workers()
    source, bucket = cluster.s3.create_bucket(), cluster.s3.create_bucket()
    client = cluster.s3.client()
    for number in range(FILES):
        rows = range(number * ROWS_PER_FILE, (number + 1) * ROWS_PER_FILE)
        body = "\n".join(json.dumps({"id": i, "day": f"d{i % 3}"}) for i in rows)
        client.put_object(Bucket=source, Key=f"rows/{number:02d}.json", Body=body.encode())
    table = S3Table(cluster.s3, f"s3://{bucket}/table", cluster.s3.storage_options())
    yield table, [table.uri, f"s3://{source}/rows", "/state/checkpoint"]
    cluster.s3.delete_bucket(source)
    cluster.s3.delete_bucket(bucket)


def _assert_exact(table: S3Table) -> None:
    from committers.tests._readers import duckdb_rows

    expected = Counter(range(FILES * ROWS_PER_FILE))
    assert Counter(table.ids()) == expected
    assert Counter(row["id"] for row in duckdb_rows(table.uri, table.options)) == expected
    assert table.delta().transaction_version("cluster") == FILES // 2 - 1


def _note_of_the_stalled_attempt(table: S3Table, driver: Any, timeout: float = 300.0) -> str:
    """The host name the stalled first attempt wrote (see ``_cluster_job.py``).

    Raises:
        AssertionError: the driver ended first (with its output), or no note in ``timeout``.
    """
    client = table.server.client()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        driver.reload()
        if driver.status == "exited":
            output = driver.get_wrapped_container().logs().decode(errors="replace")
            raise AssertionError(f"the driver ended before an attempt stalled:\n{output[-5000:]}")
        try:
            body = client.get_object(Bucket=table.bucket, Key="stalled-attempt")["Body"]
            return str(body.read().decode())
        except client.exceptions.NoSuchKey:
            time.sleep(0.5)
    raise AssertionError(f"no attempt stalled within {timeout:.0f} s")


def test_a_worker_host_lost_mid_stage_leaves_the_table_exact(
    cluster: SparkCluster, job: tuple[S3Table, list[str]], tmp_path: Path
) -> None:
    """Python writers on the executors (arrow staging): the host of the stalled attempt is
    killed with its executor, its Python workers and its half-written staging; Spark runs the
    partition again on the other host."""
    table, arguments = job
    stall = f"s3://{table.bucket}/stalled-attempt"
    with cluster.driver([*arguments, "arrow", stall], tmp_path) as driver:
        host = _note_of_the_stalled_attempt(table, driver)
        cluster.worker(host).kill()
        run = finished(driver)
    assert run.exit_code == 0, run.output[-5000:]
    assert f"ROWS {FILES * ROWS_PER_FILE}" in run.output
    _assert_exact(table)
    table.assert_no_orphans()


def test_a_frozen_worker_host_that_returns_as_a_zombie_adds_nothing(
    cluster: SparkCluster, job: tuple[S3Table, list[str]], tmp_path: Path
) -> None:
    """Spark's writer on the executors through s3a (spark staging): the host of the stalled
    attempt is frozen (``docker pause``) until the driver has given its executor up, run the
    partition elsewhere and committed the batch; thawed while the stream goes on, the zombie
    attempt wakes up and carries on. Nothing it writes enters the table."""
    table, arguments = job
    stall = f"s3://{table.bucket}/stalled-attempt"
    with cluster.driver([*arguments, "spark", stall], tmp_path) as driver:
        host = _note_of_the_stalled_attempt(table, driver)
        frozen = cluster.worker(host)
        freeze(frozen)
        _wait_for_batch(table, driver, 0)
        frozen.unpause()
        run = finished(driver)
    assert run.exit_code == 0, run.output[-5000:]
    committed = table.committed_keys()
    time.sleep(10)  # anything the zombie still had in hand
    assert table.committed_keys() == committed
    _assert_exact(table)
    late = table.data_keys() - committed
    print(f"zombie: {len(late)} late data files outside the table: {sorted(late)[:5]}")


def _wait_for_batch(table: S3Table, driver: Any, batch: int, timeout: float = 300.0) -> None:
    """Until the table holds ``batch`` (its txn version), while the driver runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # no table yet
            version = table.delta().transaction_version("cluster")
            if version is not None and version >= batch:
                return
        driver.reload()
        assert driver.status != "exited", "the driver ended before the batch committed"
        time.sleep(1)
    raise AssertionError(f"batch {batch} was not committed within {timeout:.0f} s")


@pytest.mark.parametrize("staging", ["spark"])
def test_a_driver_killed_at_commit_steps_and_restarted_lands_each_row_once(
    cluster: SparkCluster, job: tuple[S3Table, list[str]], tmp_path: Path, staging: str
) -> None:
    """A short campaign: the driver is killed before its first commit and right after the log
    entry of the second landed (``SPARKSINK_CRASH_AT``), each time started again from its
    checkpoint on the same disk, then left to finish."""
    table, arguments = job
    for crash_at in ("before_commit@0", "commit_written@1", None):
        env = {"SPARKSINK_CRASH_AT": crash_at} if crash_at else {}
        run = cluster.run_driver([*arguments, staging], tmp_path, env)
        if crash_at is None:
            assert run.exit_code == 0, run.output[-5000:]
        else:
            assert run.exit_code != 0, f"the driver was not killed at {crash_at}"
            assert f"CRASH AT {crash_at.split('@')[0]}" in run.output, run.output[-3000:]
    _assert_exact(table)
    table.assert_no_orphans()
