"""Operating the Delta sink as delta-spark users expect: output modes, commit metadata in the
table history, per-batch metrics (callback, lastProgress) and empty micro-batches.

Every test reads the table back with delta-rs and, where the table's contents matter, DuckDB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from committers.delta import DeltaSink
from committers.http import HttpSink
from committers.tests._delta_helpers import data_files_on_disk, ids, staging_leftovers
from committers.tests._readers import duckdb_rows
from committers.tests._spark_helpers import (
    file_stream,
    forget_newest_commit,
    make_source,
    run_available_now,
    write_source_file,
)
from framework import TwoPhaseSink
from framework.errors import ConfigurationError

pytestmark = [pytest.mark.spark]

REPO_ROOT = Path(__file__).resolve().parents[4]


def commit_infos(table: str) -> list[dict]:
    """The commitInfo of every version, oldest first, as written in the log."""
    log_dir = Path(table) / "_delta_log"
    infos = []
    for path in sorted(log_dir.glob("*.json")):
        for line in path.read_text().splitlines():
            if line.startswith('{"commitInfo"'):
                infos.append(json.loads(line)["commitInfo"])
    return infos


def actions_of(table: str, version: int, kind: str) -> list[dict]:
    path = Path(table) / "_delta_log" / f"{version:020d}.json"
    return [
        json.loads(line)[kind]
        for line in path.read_text().splitlines()
        if line.startswith(f'{{"{kind}"')
    ]


def day_counts(rows: list[dict]) -> dict[str, int]:
    return {row["day"]: row["count"] for row in rows}


# -- output modes -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("each_staging")
def test_complete_mode_replaces_the_table_each_batch_and_skips_a_replay(spark, tmp_path):
    """An aggregation in complete mode: the table always holds the current result, once."""
    src, table, checkpoint = make_source(tmp_path, 3), str(tmp_path / "t"), tmp_path / "chk"
    counts = file_stream(spark, src).groupBy("day").count()
    sink = TwoPhaseSink(DeltaSink(table, app_id="totals"))

    def run() -> None:
        query = sink.write_stream(
            counts,
            checkpoint_location=str(checkpoint),
            output_mode="complete",
            trigger={"availableNow": True},
        )
        query.awaitTermination()

    run()
    assert day_counts(DeltaTable(table).to_pyarrow_table().to_pylist()) == {
        "d0": 10,
        "d1": 10,
        "d2": 10,
    }
    versions = DeltaTable(table).version()
    assert versions == 2  # one commit per batch
    for version in (1, 2):  # each batch removed all the files of the one before
        removed = {a["path"] for a in actions_of(table, version, "remove")}
        added_before = {a["path"] for a in actions_of(table, version - 1, "add")}
        assert removed == added_before and removed

    replayed = forget_newest_commit(checkpoint)
    run()  # Spark runs the last batch again: the table already holds it
    assert (sink.last_batch.status, sink.last_batch.batch_id) == ("skipped", replayed)
    assert sink.last_batch.version == 2
    assert DeltaTable(table).version() == 2

    write_source_file(src, "part-003", range(30, 45))  # 15 more ids: d0 5, d1 5, d2 5
    run()
    expected = {"d0": 15, "d1": 15, "d2": 15}
    assert day_counts(DeltaTable(table).to_pyarrow_table().to_pylist()) == expected
    assert day_counts(duckdb_rows(table)) == expected
    info = commit_infos(table)[-1]
    assert info["isBlindAppend"] is False
    assert info["operationParameters"]["outputMode"] == "Complete"
    assert info["operationMetrics"]["numRemovedFiles"] == str(len(actions_of(table, 2, "add")))
    # Replaced files stay for time travel until VACUUM; nothing else is left behind.
    ever_added = {a["path"] for v in range(4) for a in actions_of(table, v, "add")}
    assert data_files_on_disk(table) == ever_added
    assert staging_leftovers(table) == []


def test_update_mode_is_refused_before_the_query_starts(spark, tmp_path):
    stream = spark.readStream.format("rate").load()
    sink = TwoPhaseSink(DeltaSink(str(tmp_path / "t")))
    with pytest.raises(ConfigurationError, match="output_mode='update' is not supported") as err:
        sink.write_stream(stream, checkpoint_location=str(tmp_path / "c"), output_mode="update")
    assert "'complete'" in str(err.value) and "watermark" in str(err.value)
    with pytest.raises(ConfigurationError, match="'append' or 'complete', got 'Complete'"):
        sink.write_stream(stream, checkpoint_location=str(tmp_path / "c"), output_mode="Complete")
    assert not spark.streams.active
    assert not (tmp_path / "t").exists()


def test_complete_mode_is_refused_by_a_sink_that_cannot_replace(spark, tmp_path):
    stream = spark.readStream.format("rate").load()
    sink = TwoPhaseSink(HttpSink("http://127.0.0.1:9/ingest"))
    with pytest.raises(ConfigurationError, match="HttpSink supports output modes"):
        sink.write_stream(stream, checkpoint_location=str(tmp_path / "c"), output_mode="complete")
    assert not spark.streams.active


def test_output_modes_of_a_bounded_write_and_delta_spark_spellings_are_answered(spark, tmp_path):
    df = spark.range(3)
    sink = TwoPhaseSink(DeltaSink(str(tmp_path / "t")))
    with pytest.raises(ConfigurationError, match="output_mode is an option of write_stream"):
        sink.write(df, output_mode="complete")
    with pytest.raises(ConfigurationError, match="use output_mode="):
        sink.write_stream(df, checkpoint_location="c", outputMode="complete")
    with pytest.raises(ConfigurationError, match="use user_metadata="):
        DeltaSink(str(tmp_path / "t"), userMetadata="x")
    assert not (tmp_path / "t").exists()


# -- commit metadata ----------------------------------------------------------------------


@pytest.mark.usefixtures("each_staging")
def test_streaming_commits_carry_delta_spark_metadata(spark, tmp_path):
    src, table = make_source(tmp_path, 2, per_file=7), str(tmp_path / "t")
    sink = TwoPhaseSink(DeltaSink(table, app_id="ingest", user_metadata="nightly load"))
    query = run_available_now(sink, file_stream(spark, src), tmp_path / "chk")
    infos = commit_infos(table)
    assert len(infos) == 2
    for version, info in enumerate(infos):
        adds = actions_of(table, version, "add")
        rows = sum(json.loads(a["stats"])["numRecords"] for a in adds)
        assert info["operationParameters"]["outputMode"] == "Append"
        assert info["operationParameters"]["queryId"] == str(query.id)
        assert info["operationParameters"]["epochId"] == str(version)
        assert info["isBlindAppend"] is True
        assert info["userMetadata"] == "nightly load"
        assert (info["sink.appId"], info["sink.epochId"]) == ("ingest", str(version))
        assert info["operationMetrics"] == {
            "numFiles": str(len(adds)),
            "numAddedFiles": str(len(adds)),
            "numRemovedFiles": "0",
            "numOutputRows": str(rows),
            "numOutputBytes": str(sum(a["size"] for a in adds)),
        }
        assert rows == 7
    history = DeltaTable(table).history()  # what history tools show
    assert [h["operationMetrics"]["numOutputRows"] for h in history] == ["7", "7"]
    assert {h["userMetadata"] for h in history} == {"nightly load"}


def test_user_metadata_of_a_bounded_write_overrides_the_sinks(spark, tmp_path):
    table = str(tmp_path / "t")
    sink = TwoPhaseSink(DeltaSink(table, app_id="backfill", user_metadata="default"))
    sink.write(spark.range(5), epoch_id=1, user_metadata="ticket OPS-12: reload day 3")
    sink.write(spark.range(5, 8), epoch_id=2)
    first, second = commit_infos(table)
    assert first["userMetadata"] == "ticket OPS-12: reload day 3"
    assert second["userMetadata"] == "default"
    assert second["operationParameters"]["epochId"] == "2"
    assert "outputMode" not in second["operationParameters"]
    assert second["operationMetrics"]["numOutputRows"] == "3"
    with pytest.raises(ConfigurationError, match="user_metadata must be a string"):
        sink.write(spark.range(1), epoch_id=3, user_metadata={"k": "v"})
    assert sorted(ids(table)) == list(range(8))


# -- metrics ------------------------------------------------------------------------------


@pytest.mark.usefixtures("each_staging")
def test_batch_metrics_reach_the_callback_and_last_progress(spark, tmp_path):
    src, table, checkpoint = make_source(tmp_path, 3, per_file=4), str(tmp_path / "t"), None
    checkpoint = tmp_path / "chk"
    seen, lock = [], threading.Lock()  # an exporter's state need not pickle (classic Spark)

    def export(metrics) -> None:
        with lock:
            seen.append(metrics)

    sink = TwoPhaseSink(DeltaSink(table, app_id="m"), on_batch=export)
    query = run_available_now(sink, file_stream(spark, src), checkpoint)
    assert query.lastProgress["observedMetrics"]["sparksink"]["rows"] == 4
    observed = [p["observedMetrics"]["sparksink"]["rows"] for p in query.recentProgress]
    assert observed == [4, 4, 4]
    assert [(m.batch_id, m.status, m.rows, m.version) for m in seen] == [
        (0, "committed", 4, 0),
        (1, "committed", 4, 1),
        (2, "committed", 4, 2),
    ]
    assert all(m.destination == table and m.files >= 1 and m.bytes > 0 for m in seen)
    for m in seen:
        info = commit_infos(table)[m.version]
        assert info["operationMetrics"]["numOutputBytes"] == str(m.bytes)

    forget_newest_commit(checkpoint)
    run_available_now(sink, file_stream(spark, src), checkpoint)
    assert (seen[-1].status, seen[-1].batch_id, seen[-1].version) == ("skipped", 2, 2)
    assert seen[-1].as_dict()["status"] == "skipped"


def test_a_failing_callback_is_logged_and_does_not_fail_the_batch(spark, tmp_path, caplog):
    def broken(metrics):
        raise RuntimeError("exporter down")

    table = str(tmp_path / "t")
    with caplog.at_level("WARNING", logger="framework.spark"):
        metrics = TwoPhaseSink(DeltaSink(table), on_batch=broken).write(spark.range(3))
    assert metrics.status == "committed" and sorted(ids(table)) == [0, 1, 2]
    assert any("on_batch callback failed" in r.getMessage() for r in caplog.records)
    with pytest.raises(ConfigurationError, match="on_batch must be callable"):
        TwoPhaseSink(DeltaSink(table), on_batch="print")


# -- empty micro-batches ------------------------------------------------------------------


@pytest.mark.usefixtures("each_staging")
def test_an_empty_micro_batch_records_its_txn_only_and_its_replay_is_skipped(spark, tmp_path):
    """As delta-spark's sink: a batch without rows still commits, with the txn and no file,
    so the batch is known to the table and a replay of it is skipped."""
    src, table, checkpoint = tmp_path / "src", str(tmp_path / "t"), tmp_path / "chk"
    write_source_file(src, "part-000", range(5))
    sink = TwoPhaseSink(DeltaSink(table, app_id="sparse"))
    run_available_now(sink, file_stream(spark, src), checkpoint)
    write_source_file(src, "part-001", [])  # an empty file is a micro-batch without rows
    run_available_now(sink, file_stream(spark, src), checkpoint)
    assert [(m.batch_id, m.status, m.rows) for m in sink.batches] == [
        (0, "committed", 5),
        (1, "committed", 0),
    ]
    assert sink.last_batch.files == 0
    dt = DeltaTable(table)
    assert dt.version() == 1 and dt.transaction_version("sparse") == 1
    assert actions_of(table, 1, "add") == []
    assert commit_infos(table)[1]["operationMetrics"]["numOutputRows"] == "0"

    forget_newest_commit(checkpoint)
    run_available_now(sink, file_stream(spark, src), checkpoint)
    assert (sink.last_batch.batch_id, sink.last_batch.status) == (1, "skipped")
    assert DeltaTable(table).version() == 1
    assert sorted(ids(table)) == list(range(5))
    assert Counter(r["id"] for r in duckdb_rows(table)) == Counter(range(5))


def test_an_empty_first_batch_creates_the_table_with_its_schema(spark, tmp_path):
    table = str(tmp_path / "t")
    empty = spark.createDataFrame([], "id LONG, name STRING")
    metrics = TwoPhaseSink(DeltaSink(table, app_id="first")).write(empty, epoch_id=0)
    assert (metrics.status, metrics.rows, metrics.files, metrics.version) == (
        "committed",
        0,
        0,
        0,
    )
    dt = DeltaTable(table)
    assert pa.schema(dt.schema().to_arrow()).names == ["id", "name"]
    assert dt.transaction_version("first:write") == 0
    assert dt.to_pyarrow_table().num_rows == 0


# -- log lines ----------------------------------------------------------------------------


@pytest.mark.slow
def test_log_lines_with_the_default_logging_configuration(tmp_path):
    """Warnings show without any set-up; one setLevel shows one INFO line per batch naming
    the table and version; once the application configures logging, lines go only there."""
    table = str(tmp_path / "t")
    driver = Path(__file__).resolve().parents[2] / "_logging_driver.py"
    done = subprocess.run(
        [sys.executable, str(driver), table],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ours = [line for line in done.stderr.splitlines() if " framework.spark: " in line]
    assert len(ours) == 2, ours
    assert "WARNING framework.spark: on_batch callback failed for batch 1" in ours[0]
    assert "INFO framework.spark: batch=2 epoch=2 app_id=logs:write status=committed" in ours[1]
    assert f"destination={table} version=1 " in ours[1]
    printed = [line for line in done.stdout.splitlines() if line.startswith("ROOT ")]
    assert len(printed) == 1, done.stdout
    assert "status=skipped" in printed[0] and f"destination={table} version=1 " in printed[0]
