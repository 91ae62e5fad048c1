"""Exactly-once against a real S3 server: bounded write, replay after commit, killed driver, task
retry, concurrent app ids. Each test asserts the exact rows read back with delta-rs."""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from committers.delta import DeltaSink, StagedFileSerializer
from committers.tests._spark_helpers import (
    CrashingFirstAttemptSink,
    file_stream,
    forget_newest_commit,
    make_source,
    run_available_now,
    write_source_file,
)
from framework import TwoPhaseSink
from integration_tests._s3helpers import S3Table, assert_no_duplicates

pytestmark = [pytest.mark.integration, pytest.mark.spark]

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.smoke  # make check: the end-to-end test of its feature
@pytest.mark.usefixtures("each_staging")  # Spark's writer through s3a, and the Python writers
def test_bounded_write(spark, table: S3Table, caplog: pytest.LogCaptureFixture) -> None:
    df = spark.range(0, 3000, numPartitions=3).selectExpr("id", "cast(id % 3 as string) as day")
    sink = TwoPhaseSink(
        DeltaSink(table.uri, app_id="bounded", partition_by=["day"], **table.sink_kwargs())
    )
    with caplog.at_level(logging.DEBUG):
        metrics = sink.write(df)

    assert (metrics.status, metrics.rows) == ("committed", 3000)
    assert table.ids() == list(range(3000))
    assert table.delta().transaction_version("bounded:write") == 0
    table.assert_no_orphans()
    # nothing secret in the Delta log, the committables, the logs or the sink's repr
    secret = table.server.secret_key
    assert all(secret not in text for text in table.log_texts())
    serializer = StagedFileSerializer()
    for key in table.committed_keys():
        assert secret not in key
    assert secret not in repr(sink.sink) and secret not in repr(sink.sink.location)
    assert secret not in caplog.text
    assert secret.encode() not in pickle.dumps(sink.batches)
    assert serializer.version == 1


@pytest.mark.usefixtures("each_staging")  # Spark's writer through s3a, and the Python writers
def test_replayed_batch_after_commit_is_skipped(spark, table: S3Table, tmp_path: Path) -> None:
    src, chk = make_source(tmp_path, 3), tmp_path / "chk"
    sink = TwoPhaseSink(
        DeltaSink(table.uri, app_id="replay", partition_by=["day"], **table.sink_kwargs())
    )
    run_available_now(sink, file_stream(spark, src), chk)
    assert [b.status for b in sink.batches] == ["committed"] * 3
    version = table.delta().version()

    forget_newest_commit(chk)  # Spark runs the newest batch again after the restart
    write_source_file(src, "part-100", range(1000, 1010))
    restarted = TwoPhaseSink(
        DeltaSink(table.uri, app_id="replay", partition_by=["day"], **table.sink_kwargs())
    )
    run_available_now(restarted, file_stream(spark, src), chk)

    assert [(b.batch_id, b.status) for b in restarted.batches] == [(2, "skipped"), (3, "committed")]
    assert table.delta().version() == version + 1
    values = table.ids()
    assert_no_duplicates(values)
    assert values == [*range(30), *range(1000, 1010)]
    table.assert_no_orphans()


@pytest.mark.usefixtures("each_staging")  # Spark's writer through s3a, and the Python writers
def test_driver_killed_between_staging_and_commit(table: S3Table, tmp_path: Path) -> None:
    src, chk = make_source(tmp_path, 2), str(tmp_path / "chk")
    command = [sys.executable, "-m", "integration_tests._s3_driver", str(src), table.uri, chk]
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "SINK_TEST_STORAGE_OPTIONS": json.dumps(table.options),
    }
    run = {"cwd": REPO_ROOT, "env": env, "capture_output": True, "text": True, "timeout": 300}
    killed = subprocess.run([*command, "1"], start_new_session=True, **run)  # type: ignore[call-overload]
    assert "KILLING DRIVER BEFORE COMMIT" in killed.stdout, killed.stderr[-3000:]
    assert killed.returncode == -9
    # batch 1 is staged in S3 but not committed
    assert table.delta().transaction_version("killed-driver") == 0
    assert table.data_keys() - table.committed_keys()
    assert table.staged_leftovers()

    restarted = subprocess.run(command, start_new_session=True, **run)  # type: ignore[call-overload]
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert "BATCHES [(1, 'committed')]" in restarted.stdout
    values = table.ids()
    assert_no_duplicates(values)
    assert values == list(range(20))
    table.assert_no_orphans()


def test_failed_task_attempt_files_are_removed(spark, table: S3Table, tmp_path: Path) -> None:
    crash_record = tmp_path / "crashed-attempt-files.txt"
    df = spark.range(0, 2000, numPartitions=2).selectExpr("id", "cast(id % 3 as string) as day")
    sink = TwoPhaseSink(
        CrashingFirstAttemptSink(
            table.uri,
            app_id="retry",
            partition_by=["day"],
            crash_record=str(crash_record),
            **table.sink_kwargs(),
        )
    )
    metrics = sink.write(df)

    crashed = set(crash_record.read_text().split())
    assert crashed, "the first attempt should have staged files before crashing"
    assert not crashed & table.committed_keys()
    assert not crashed & table.data_keys()  # deleted from S3, not just left uncommitted
    assert metrics.rows == 2000
    assert table.ids() == list(range(2000))
    table.assert_no_orphans()


@pytest.mark.usefixtures("each_staging")  # Spark's writer through s3a, and the Python writers
def test_two_app_ids_write_one_table_concurrently(spark, table: S3Table, tmp_path: Path) -> None:
    queries = []
    for app, start in (("app-a", 0), ("app-b", 500)):
        src = make_source(tmp_path, 3, start=start, name=app)
        sink = TwoPhaseSink(
            DeltaSink(table.uri, app_id=app, partition_by=["day"], **table.sink_kwargs())
        )
        queries.append(
            sink.write_stream(
                file_stream(spark, src),
                checkpoint_location=str(tmp_path / f"chk-{app}"),
                trigger={"availableNow": True},
            )
        )
    for query in queries:
        query.awaitTermination()

    values = table.ids()
    assert_no_duplicates(values)
    assert values == [*range(30), *range(500, 530)]
    handle = table.delta()
    assert handle.transaction_version("app-a") == 2
    assert handle.transaction_version("app-b") == 2
    table.assert_no_orphans()


@pytest.mark.usefixtures("each_staging")  # Spark's writer through s3a, and the Python writers
def test_staging_of_a_driver_lost_before_its_background_clean_up_is_swept(
    table: S3Table, tmp_path: Path
) -> None:
    """Batches return before their staging is cleaned up (on S3 a worker does it); a driver
    lost in between leaves it, Spark runs no batch again, and the next run sweeps it."""
    src, chk = make_source(tmp_path, 2), str(tmp_path / "chk")
    command = [sys.executable, "-m", "integration_tests._s3_driver", str(src), table.uri, chk]
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "SINK_TEST_STORAGE_OPTIONS": json.dumps(table.options),
    }
    run = {"cwd": REPO_ROOT, "capture_output": True, "text": True, "timeout": 300}
    lost = subprocess.run(  # type: ignore[call-overload]
        command, env={**env, "SINK_TEST_LOSE_CLEAN_UP": "1"}, start_new_session=True, **run
    )
    assert "KILLING DRIVER BEFORE ITS CLEAN-UP" in lost.stdout, lost.stderr[-3000:]
    assert "BATCHES [(0, 'committed'), (1, 'committed')]" in lost.stdout
    assert lost.returncode == -9
    assert table.ids() == list(range(20))
    staged_epochs = {key.split("/")[3] for key in table.staged_leftovers()}
    assert staged_epochs == {"0", "1"}

    write_source_file(src, "part-100", range(1000, 1010))
    restarted = subprocess.run(command, env=env, start_new_session=True, **run)  # type: ignore[call-overload]
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert "BATCHES [(2, 'committed')]" in restarted.stdout  # nothing ran again
    values = table.ids()
    assert_no_duplicates(values)
    assert values == [*range(20), *range(1000, 1010)]
    table.assert_no_orphans()
