"""Exactly-once on real Spark (local mode): replays, killed drivers, failed tasks, concurrent
writers. Every test asserts the exact set of rows read back with delta-rs."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from deltalake import DeltaTable

from committers.delta import DeltaSink
from committers.tests._delta_helpers import (
    assert_no_duplicates,
    assert_no_orphans,
    committed_files,
    data_files_on_disk,
    ids,
    staging_leftovers,
)
from committers.tests._spark_helpers import (
    CrashingFirstAttemptSink,
    file_stream,
    forget_newest_commit,
    make_source,
    run_available_now,
    write_source_file,
)
from framework import TwoPhaseSink
from framework.errors import CheckpointResetError

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.usefixtures("each_staging")]

REPO_ROOT = Path(__file__).resolve().parents[4]


def test_replayed_batch_after_commit_is_skipped(spark, tmp_path):
    src, table, chk = make_source(tmp_path, 3), str(tmp_path / "table"), tmp_path / "chk"
    sink = TwoPhaseSink(DeltaSink(table, app_id="replay", partition_by=["day"]))
    run_available_now(sink, file_stream(spark, src), chk)
    assert [b.status for b in sink.batches] == ["committed"] * 3
    version = DeltaTable(table).version()

    # Spark forgets that it finished the newest batch: it runs it again after the restart.
    forget_newest_commit(chk)
    write_source_file(src, "part-100", range(1000, 1010))
    restarted = TwoPhaseSink(DeltaSink(table, app_id="replay", partition_by=["day"]))
    run_available_now(restarted, file_stream(spark, src), chk)

    assert [(b.batch_id, b.status) for b in restarted.batches] == [
        (2, "skipped"),
        (3, "committed"),
    ]
    assert DeltaTable(table).version() == version + 1  # only the new batch was committed
    values = ids(table)
    assert_no_duplicates(values)
    assert values == [*range(30), *range(1000, 1010)]
    assert_no_orphans(table)


def _run_driver(command: list[str]) -> subprocess.CompletedProcess[str]:
    """Run the streaming driver in its own process group, so it can kill all of it."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        command,
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )


@pytest.mark.smoke  # make check: the end-to-end test of its feature
def test_driver_killed_between_staging_and_commit(tmp_path):
    src, table, chk = make_source(tmp_path, 3), str(tmp_path / "table"), str(tmp_path / "chk")
    command = [sys.executable, "-m", "committers.tests._streaming_driver", str(src), table, chk]
    killed = _run_driver([*command, "1"])
    assert "KILLING DRIVER BEFORE COMMIT" in killed.stdout, killed.stderr[-2000:]
    assert killed.returncode == -9
    # The crash left batch 1 staged but uncommitted: files on disk the table does not know.
    assert DeltaTable(table).transaction_version("killed-driver") == 0
    assert data_files_on_disk(table) - committed_files(table)
    assert staging_leftovers(table)

    restarted = _run_driver(command)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert "(1, 'committed')" in restarted.stdout
    values = ids(table)
    assert_no_duplicates(values)
    assert values == list(range(30))
    assert_no_orphans(table)


def test_failed_task_attempt_files_are_removed(spark, tmp_path):
    crash_record = tmp_path / "crashed-attempt-files.txt"
    table = str(tmp_path / "table")
    df = spark.range(0, 2000, numPartitions=2).selectExpr("id", "cast(id % 3 as string) as day")
    sink = TwoPhaseSink(
        CrashingFirstAttemptSink(
            table, app_id="retry", partition_by=["day"], crash_record=str(crash_record)
        )
    )
    metrics = sink.write(df)

    crashed = crash_record.read_text().split()
    assert crashed, "the first attempt should have staged files before crashing"
    committed = committed_files(table)
    assert not set(crashed) & committed
    assert not set(crashed) & data_files_on_disk(table)  # deleted, not just uncommitted
    assert metrics.rows == 2000
    assert ids(table) == list(range(2000))
    assert_no_orphans(table)


def _start(sink, df, chk):
    return sink.write_stream(df, checkpoint_location=str(chk), trigger={"availableNow": True})


def test_two_app_ids_write_one_table_concurrently(spark, tmp_path):
    table = str(tmp_path / "table")
    src_a = make_source(tmp_path, 4, start=0, name="a")
    src_b = make_source(tmp_path, 4, start=500, name="b")
    sink_a = TwoPhaseSink(DeltaSink(table, app_id="app-a", partition_by=["day"]))
    query_a = _start(sink_a, file_stream(spark, src_a), tmp_path / "chk-a")
    sink_b = TwoPhaseSink(DeltaSink(table, app_id="app-b", partition_by=["day"]))
    query_b = _start(sink_b, file_stream(spark, src_b), tmp_path / "chk-b")
    query_a.awaitTermination()
    query_b.awaitTermination()

    values = ids(table)
    assert_no_duplicates(values)
    assert values == [*range(40), *range(500, 540)]
    table_handle = DeltaTable(table)
    assert table_handle.transaction_version("app-a") == 3
    assert table_handle.transaction_version("app-b") == 3
    assert_no_orphans(table)


def test_two_instances_of_one_app_id_one_fails_clearly(spark, tmp_path):
    table = str(tmp_path / "table")
    sources = {
        "a": (make_source(tmp_path, 3, start=0, name="a"), list(range(30))),
        "b": (make_source(tmp_path, 3, start=700, name="b"), list(range(700, 730))),
    }
    queries = {}
    for name, (src, _) in sources.items():
        sink = TwoPhaseSink(DeltaSink(table, app_id="shared", partition_by=["day"]))
        queries[name] = _start(sink, file_stream(spark, src), tmp_path / f"chk-{name}")
    failures = {}
    for name, query in queries.items():
        try:
            query.awaitTermination()
        except Exception as err:
            failures[name] = str(err)
    assert len(failures) == 1, failures
    ((loser, message),) = failures.items()
    assert "ConcurrentWriterError" in message and "two writers" in message
    winner = "a" if loser == "b" else "b"
    values = ids(table)
    assert_no_duplicates(values)
    assert values == sources[winner][1]


def test_fresh_checkpoint_with_known_app_id_is_refused_unless_continued(spark, tmp_path):
    table = str(tmp_path / "table")
    src = make_source(tmp_path, 2)
    run_available_now(
        TwoPhaseSink(DeltaSink(table, app_id="reset")), file_stream(spark, src), tmp_path / "c1"
    )
    with pytest.raises(CheckpointResetError, match="batches up to 1 from app id 'reset'"):
        TwoPhaseSink(DeltaSink(table, app_id="reset")).write_stream(
            file_stream(spark, src), checkpoint_location=str(tmp_path / "c2")
        )
    assert not (tmp_path / "c2" / "commits").exists()  # the query never started

    new_src = make_source(tmp_path, 2, start=100, name="src2")
    for attempt in range(2):  # the second run restarts from c3 and must keep the offset
        continued = TwoPhaseSink(DeltaSink(table, app_id="reset"), on_checkpoint_reset="continue")
        if attempt:
            write_source_file(new_src, "late", range(200, 205))
        run_available_now(continued, file_stream(spark, new_src), tmp_path / "c3")
    assert DeltaTable(table).transaction_version("reset") == 4  # epochs 2, 3, 4
    values = ids(table)
    assert_no_duplicates(values)
    assert values == [*range(20), *range(100, 120), *range(200, 205)]


def test_derived_app_id_is_stable_across_restarts(spark, tmp_path):
    src, table, chk = make_source(tmp_path, 2), str(tmp_path / "table"), tmp_path / "chk"
    first = TwoPhaseSink(DeltaSink(table))
    run_available_now(first, file_stream(spark, src), chk)
    app_id = first.last_batch.app_id
    assert app_id.startswith("query-")
    forget_newest_commit(chk)
    second = TwoPhaseSink(DeltaSink(table))
    run_available_now(second, file_stream(spark, src), chk)
    assert [(b.app_id, b.status) for b in second.batches] == [(app_id, "skipped")]
    assert ids(table) == list(range(20))


def test_bounded_write_with_epoch_id_is_idempotent(spark, tmp_path):
    table = str(tmp_path / "table")
    df = spark.range(0, 100).selectExpr("id", "cast(id % 3 as string) as day")
    sink = TwoPhaseSink(DeltaSink(table, app_id="backfill", partition_by=["day"]))
    assert sink.write(df, epoch_id=20261121).status == "committed"
    assert sink.write(df, epoch_id=20261121).status == "skipped"
    assert sink.write(df).epoch_id == 20261122  # numbering continues after the recorded epoch
    values = ids(table)
    assert values == sorted([*range(100), *range(100)])
    assert_no_orphans(table)


def test_a_new_checkpoint_with_a_derived_app_id_is_warned_about(spark, tmp_path, caplog):
    """Without app_id a replaced checkpoint is a new writer: the sink cannot stop the source
    being written again, but it says so, naming the derived app ids already in the table."""
    src, table = make_source(tmp_path, 2), str(tmp_path / "table")
    run_available_now(TwoPhaseSink(DeltaSink(table)), file_stream(spark, src), tmp_path / "c1")
    first_app_id = DeltaTable(table).history(limit=1)[0]["sink.appId"]
    assert first_app_id.startswith("query-")
    with caplog.at_level(logging.WARNING, logger="framework.spark"):
        run_available_now(TwoPhaseSink(DeltaSink(table)), file_stream(spark, src), tmp_path / "c2")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(first_app_id in w and "Set app_id" in w for w in warnings), warnings
    assert sorted(ids(table)) == sorted([*range(20), *range(20)])  # documented: written twice


def test_per_batch_log_line_and_metrics(spark, tmp_path, caplog):
    table = str(tmp_path / "table")
    df = spark.range(0, 1000, numPartitions=2).selectExpr("id", "cast(id % 2 as string) as day")
    sink = TwoPhaseSink(DeltaSink(table, app_id="metrics", partition_by=["day"]))
    with caplog.at_level(logging.INFO, logger="framework.spark"):
        metrics = sink.write(df)
    assert (metrics.status, metrics.rows, metrics.files) == ("committed", 1000, 4)
    assert metrics.bytes == sum(
        os.path.getsize(os.path.join(table, f)) for f in committed_files(table)
    )
    assert metrics.commit_ms > 0 and metrics.stage_ms > 0 and metrics.upkeep_ms > 0
    assert sink.last_batch == metrics
    lines = [r.getMessage() for r in caplog.records if r.name == "framework.spark"]
    assert any(
        f"status=committed destination={table} version=0 files=4 rows=1000" in line
        and "commit_ms=" in line
        and "upkeep_ms=" in line
        for line in lines
    ), lines


def test_concurrent_bounded_writes_of_different_apps(spark, tmp_path):
    table = str(tmp_path / "table")
    errors: list[BaseException] = []

    def run(app: str, start: int) -> None:
        try:
            df = spark.range(start, start + 300).selectExpr("id", "cast(id % 3 as string) as day")
            TwoPhaseSink(DeltaSink(table, app_id=app, partition_by=["day"])).write(df)
        except BaseException as err:  # surfaced below
            errors.append(err)

    TwoPhaseSink(DeltaSink(table, app_id="init", partition_by=["day"])).write(
        spark.range(0, 0).selectExpr("id", "cast(id as string) as day")
    )
    threads = [threading.Thread(target=run, args=(f"app-{i}", i * 1000)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert ids(table) == sorted(i * 1000 + j for i in range(3) for j in range(300))
