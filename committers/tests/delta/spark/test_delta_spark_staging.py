"""``staging="spark"``: Spark's own Parquet writer stages, with the same guarantees as the
Python writers (the shared scenarios run under both strategies through ``each_staging``)."""

from __future__ import annotations

import datetime
import json
import os
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, Field, QueryBuilder, Schema
from deltalake.schema import StructType

from committers.delta import DeltaSink
from committers.delta.spark._spark_staging import RUN_DIR_PREFIX, hadoop_can_write
from committers.tests._delta_helpers import (
    assert_no_duplicates,
    assert_no_orphans,
    committed_files,
    file_stats,
    ids,
    staging_leftovers,
)
from committers.tests._readers import duckdb_rows
from framework import TwoPhaseSink
from framework.errors import ConfigurationError

pytestmark = pytest.mark.spark

REPO_ROOT = Path(__file__).resolve().parents[4]


def _write(table: str, df, **kwargs):
    return TwoPhaseSink(DeltaSink(table, **kwargs)).write(df)


def _run_directories(table: str) -> list[str]:
    return sorted(p.name for p in Path(table).iterdir() if p.name.startswith(RUN_DIR_PREFIX))


def test_files_are_spark_parquet_with_int64_timestamps_and_the_session_is_untouched(
    spark, tmp_path
):
    before = spark.conf.get("spark.sql.parquet.outputTimestampType")
    tables = [str(tmp_path / f"t{n}") for n in range(2)]
    df = spark.sql(
        "SELECT id, TIMESTAMP'2026-11-21 10:00:00.123456' AS ts, CAST(id % 2 AS STRING) AS day "
        "FROM range(200)"
    )
    errors: list[BaseException] = []

    def write(table: str) -> None:
        try:
            _write(table, df, app_id="ts", partition_by=["day"], staging="spark")
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=write, args=(t,)) for t in tables]  # two at once
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert spark.conf.get("spark.sql.parquet.outputTimestampType") == before
    for table in tables:
        assert ids(table) == list(range(200))
        for path in committed_files(table):
            assert path.startswith(RUN_DIR_PREFIX)  # not a `_` or `.` name: VACUUM sees it
            footer = pq.read_metadata(Path(table) / path)
            assert footer.created_by.startswith("parquet-mr")  # Spark's writer wrote it
            ts = footer.schema.column(footer.schema.names.index("ts"))
            assert ts.physical_type == "INT64" and "MICROS" in str(ts.logical_type).upper()
        assert_no_orphans(table)
        assert not list(Path(table).rglob("*.crc")) and not list(Path(table).rglob("_SUCCESS"))


def test_a_task_failing_mid_write_leaves_only_the_retried_attempt(spark, tmp_path):
    from pyspark.sql.functions import udf

    marker = tmp_path / "failed-once"

    @udf("long")
    def fail_first_attempt(value):
        from pyspark import TaskContext

        context = TaskContext.get()
        if value == 700 and context.attemptNumber() == 0:  # after 700 rows are written
            Path(marker).write_text("failed")
            raise RuntimeError("task attempt dies mid-write")
        return value

    table = str(tmp_path / "t")
    df = spark.range(0, 2000, numPartitions=2).selectExpr("id", "id % 3 AS k")
    df = df.select(fail_first_attempt("id").alias("id"), "k")
    metrics = _write(table, df, app_id="retry", partition_by=["k"], staging="spark")
    assert marker.exists()
    assert metrics.rows == 2000
    values = ids(table)
    assert_no_duplicates(values)
    assert values == list(range(2000))
    assert_no_orphans(table)
    assert not [p for p in Path(table).rglob("*") if "_temporary" in p.as_posix()]


def test_a_failed_commit_deletes_the_run_directory_whole(spark, tmp_path, monkeypatch):
    from committers.delta import DeltaGlobalCommitter

    table = str(tmp_path / "t")
    df = spark.range(0, 100).selectExpr("id", "CAST(id % 3 AS STRING) AS day")
    _write(table, df, app_id="first", partition_by=["day"], staging="spark")
    committed = committed_files(table)

    def refuse(self, committables):
        raise RuntimeError("commit refused")

    monkeypatch.setattr(DeltaGlobalCommitter, "commit", refuse)
    with pytest.raises(RuntimeError, match="commit refused"):
        _write(table, df, app_id="second", staging="spark")
    assert len(_run_directories(table)) == 1  # the first write's; the failed run's is gone
    assert committed_files(table) == committed
    assert_no_orphans(table)


@pytest.mark.parametrize("staging", ["spark", "arrow"])
def test_a_first_write_that_died_before_its_commit_is_rerun_cleanly(
    spark, tmp_path, monkeypatch, staging
):
    """A driver that died after staging, before its commit and before any clean-up, in the
    write that would have created the table: the location holds staged files and no log. The
    next run of the batch creates the table with its own files and deletes the dead run's,
    which only the dead run's manifests name."""
    from committers.delta import DeltaGlobalCommitter

    table = str(tmp_path / "t")
    df = spark.range(0, 50).selectExpr("id")

    def die(self, committables):
        raise RuntimeError("driver dies here")

    with monkeypatch.context() as patch:
        patch.setattr(DeltaGlobalCommitter, "commit", die)
        patch.setattr(DeltaGlobalCommitter, "abort", lambda self, epoch: None)  # no clean-up
        with pytest.raises(RuntimeError, match="driver dies"):
            TwoPhaseSink(DeltaSink(table, app_id="job", staging=staging)).write(df, epoch_id=1)
    assert staging_leftovers(table) and not DeltaTable.is_deltatable(table)
    metrics = TwoPhaseSink(DeltaSink(table, app_id="job", staging=staging)).write(df, epoch_id=1)
    assert metrics.status == "committed"
    assert ids(table) == list(range(50))
    assert_no_orphans(table)
    assert len(_run_directories(table)) == (1 if staging == "spark" else 0)


def test_auto_chooses_spark_for_local_tables_and_arrow_where_spark_cannot(spark, tmp_path):
    df = spark.range(3).selectExpr("id")
    assert hadoop_can_write(df, str(tmp_path))
    assert hadoop_can_write(df, f"file://{tmp_path}")
    assert hadoop_can_write(df, "s3://bucket/table")  # as s3a://, hadoop-aws from make jars
    assert not hadoop_can_write(df, "gs://bucket/table")  # no GCS connector here

    local = DeltaSink(str(tmp_path / "local"))
    local.prepare(_schema(df))
    assert local.spark_stager(df) is not None

    mapped = str(tmp_path / "mapped")
    DeltaTable.create(
        mapped,
        schema=Schema([Field("id", "long")]),
        configuration={"delta.columnMapping.mode": "name"},
    )
    auto = DeltaSink(mapped)
    auto.prepare(_schema(df))
    assert auto.spark_stager(df) is not None  # column mapping: physical names and ids
    nested = str(tmp_path / "nested")
    DeltaTable.create(
        nested,
        schema=Schema(
            [Field("s", StructType([Field("a", "long", nullable=False)])), Field("day", "string")]
        ),
        partition_by=["day"],
        configuration={"delta.columnMapping.mode": "name"},
    )
    forced = DeltaSink(nested, staging="spark")
    forced.prepare(_schema(spark.sql("SELECT named_struct('a', 1L) AS s, 'd' AS day")))
    with pytest.raises(ConfigurationError, match="NOT NULL fields inside structs"):
        forced.spark_stager(df)
    TwoPhaseSink(auto).write(df)
    read = QueryBuilder().register("t", DeltaTable(mapped)).execute("SELECT id FROM t").read_all()
    assert sorted(pa.table(read).column("id").to_pylist()) == [0, 1, 2]


def _schema(df):
    from framework.spark._two_phase import _arrow_schema

    return _arrow_schema(df)


@pytest.mark.smoke  # make check: the end-to-end test of its feature
def test_both_strategies_write_tables_that_read_identically(spark, tmp_path):
    df = spark.sql(
        """SELECT id, CAST(id AS DOUBLE) / 7 AS f, IF(id = 3, CAST('NaN' AS DOUBLE), 1.0) AS g,
                  CAST(id AS DECIMAL(38, 10)) / 3 AS d, DATE'1969-12-31' - CAST(id AS INT) AS day,
                  TIMESTAMP'1960-01-01 00:00:00.000001' AS ts,
                  repeat('𠮷', 40 + CAST(id AS INT)) AS s,
                  CAST('bin' AS BINARY) AS b, named_struct('x', id, 'y', 'y') AS st,
                  array(id) AS arr, CAST(id % 2 AS STRING) AS part
           FROM range(20)"""
    )
    tables = {}
    for staging in ("spark", "arrow"):
        tables[staging] = str(tmp_path / staging)
        _write(tables[staging], df, app_id="same", partition_by=["part"], staging=staging)

    def rows(table: str) -> list[str]:
        dataset = DeltaTable(table).to_pyarrow_table().to_pylist()
        duck = duckdb_rows(table)
        assert len(duck) == len(dataset) == 20
        return sorted(repr(r) for r in dataset)

    assert rows(tables["spark"]) == rows(tables["arrow"])
    for staging, table in tables.items():
        for stats in file_stats(table):
            assert stats["numRecords"] > 0
            # NaN, binary, arrays: only exact bounds; pre-1970 dates and timestamps spelled
            if "minValues" in stats:
                assert stats["minValues"]["day"] < "1970"
                assert stats["minValues"]["ts"] == "1960-01-01T00:00:00.000001Z"
                assert "b" not in stats["minValues"] and "arr" not in stats["minValues"]
                assert stats["maxValues"]["s"].endswith("\U0010ffff"), staging
    # the NaN row's file has no bounds under either strategy
    assert any("minValues" not in s for s in file_stats(tables["spark"]))


def test_remove_orphan_files_spares_a_live_run_directory(spark, tmp_path):
    """A run whose Spark job is still writing (a young manifest naming its directory) keeps
    its files through remove_orphan_files, however old they are; an old run directory that no
    manifest names is removed."""
    from committers.delta.spark._spark_staging import spark_manifest_path
    from committers.delta.storage._staging import write_manifest
    from committers.tests._delta_helpers import epoch

    table = str(tmp_path / "t")
    sink = DeltaSink(table, app_id="live")
    _write(table, spark.range(5).selectExpr("id"), app_id="live", staging="spark")
    data = DeltaTable(table).to_pyarrow_table()
    two_hours_ago = datetime.datetime.now().timestamp() - 7200
    live, dead = epoch(7, app_id="live"), epoch(8, app_id="live")
    for run in (live, dead):
        path = Path(table) / f"{RUN_DIR_PREFIX}{run.epoch_id}-{run.run_id}" / "part-0.parquet"
        path.parent.mkdir(parents=True)
        pq.write_table(data, path)
        os.utime(path, (two_hours_ago, two_hours_ago))
    live_directory = f"{RUN_DIR_PREFIX}7-{live.run_id}"
    write_manifest(sink.location, spark_manifest_path(live), [], directories=[live_directory])
    removed = sink.remove_orphan_files(retention=datetime.timedelta(hours=1))
    assert removed == [f"{RUN_DIR_PREFIX}8-{dead.run_id}/part-0.parquet"]
    assert (Path(table) / live_directory / "part-0.parquet").exists()


def test_files_roll_toward_the_target_size_once_the_row_size_is_known(spark, tmp_path):
    table = str(tmp_path / "t")
    df = spark.range(0, 20000, numPartitions=2).selectExpr("id", "uuid() AS s")
    _write(table, df, app_id="roll", staging="spark")  # a new table: one file per task
    first = file_stats(table)
    assert len(first) == 2
    bytes_per_row = sum((Path(table) / p).stat().st_size for p in committed_files(table)) / sum(
        s["numRecords"] for s in first
    )
    target = 64 * 1024
    _write(table, df, app_id="roll", staging="spark", target_file_size=target)
    second = file_stats(table)[len(first) :]
    cap = int(target / bytes_per_row)
    assert len(second) > 2 and all(s["numRecords"] <= cap for s in second)
    assert sum(s["numRecords"] for s in second) == 20000


def test_a_table_created_from_structs_of_non_null_values_keeps_spark_staging(spark, tmp_path):
    """``named_struct('x', id)`` has a NOT NULL field; the table created for it has a
    nullable one (as delta-spark creates it, and as the sink planned it), so later batches
    still stage with Spark's writer."""
    table = str(tmp_path / "t")
    df = spark.sql("SELECT id, named_struct('x', id) AS s FROM range(3)")
    _write(table, df, app_id="structs", staging="spark")
    (field,) = json.loads(DeltaTable(table).schema().to_json())["fields"][1]["type"]["fields"]
    assert field["nullable"] is True
    _write(table, df, app_id="structs", staging="spark")
    assert ids(table) == [0, 0, 1, 1, 2, 2]
