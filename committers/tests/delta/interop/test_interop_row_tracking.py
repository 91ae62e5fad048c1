"""Row tracking (the ``rowTracking`` writer feature) on tables delta-spark made: every file the
sink appends gets a ``baseRowId`` above the table's high-water mark and its commit's version
as ``defaultRowCommitVersion``, and the commit advances the ``delta.rowTracking`` domain;
delta-spark's ``_metadata.row_id`` and ``_metadata.row_commit_version`` are the judge, before
and after our writes, across a checkpoint and against a delta-spark commit racing ours.
Compaction keeps every row's id and commit version (in the materialized columns), deletion
vectors and delta-spark's materialized ids included; the operations that copy rows without
them (overwrite, upsert, compaction by Spark) are refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from committers.delta import DeltaSink, UnsupportedTableFeatureError
from committers.tests._delta_helpers import log_actions
from committers.tests._delta_spark import assert_all_read, comparable
from committers.tests._log_races import race_before_write
from committers.tests.delta.interop.test_interop_delta_spark_write import (
    _create,
    _read_by_spark_and_duckdb,
)
from framework import TwoPhaseSink
from framework.errors import ConfigurationError

pytestmark = pytest.mark.spark

ROWS = "id BIGINT, v INT"
ROW_TRACKING_ON = (
    "TBLPROPERTIES ('delta.enableRowTracking' = 'true', 'delta.checkpointInterval' = '3')"
)


def _tracked(spark, uri: str) -> dict[int, tuple[int, int]]:  # type: ignore[no-untyped-def]
    """id -> (row id, row commit version), as delta-spark reads them; row ids unique."""
    rows = spark.sql(
        f"SELECT id, _metadata.row_id AS rid, _metadata.row_commit_version AS rcv "
        f"FROM delta.`{uri}`"
    ).collect()
    tracked = {r["id"]: (r["rid"], r["rcv"]) for r in rows}
    row_ids = [rid for rid, _ in tracked.values()]
    assert len(set(row_ids)) == len(row_ids) == len(rows), tracked
    return tracked


def _high_water_mark(uri: str) -> int:
    marks = [
        json.loads(domain["configuration"])["rowIdHighWaterMark"]
        for domain in log_actions(uri, "domainMetadata")
        if domain["domain"] == "delta.rowTracking"
    ]
    return marks[-1]


def test_appends_number_their_rows_above_the_high_water_mark(delta_spark, tmp_path, monkeypatch):
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(
        spark,
        uri,
        ROWS,
        "INSERT INTO {t} VALUES (1, 1), (2, 2)",
        "UPDATE {t} SET v = 20 WHERE id = 2",
        clauses=ROW_TRACKING_ON,
    )
    before = _tracked(spark, uri)
    mark = _high_water_mark(uri)

    TwoPhaseSink(DeltaSink(uri, app_id="a")).write(
        spark.createDataFrame([(3, 3), (4, 4)], ROWS), epoch_id=0
    )
    ours = DeltaTable(uri).version()
    TwoPhaseSink(DeltaSink(uri)).write(spark.createDataFrame([(5, 5)], ROWS))
    # delta-spark commits right before our next commit file is written: ours lands after it,
    # numbered above its rows
    race_before_write(monkeypatch, lambda: spark.sql(f"INSERT INTO delta.`{uri}` VALUES (6, 6)"))
    TwoPhaseSink(DeltaSink(uri, app_id="a")).write(
        spark.createDataFrame([(7, 7)], ROWS), epoch_id=1
    )
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (8, 8)")

    tracked = _tracked(spark, uri)
    assert {i: tracked[i] for i in before} == before  # rows already there keep theirs
    assert min(tracked[i][0] for i in (3, 4, 5, 6, 7, 8)) > mark
    assert tracked[3][1] == tracked[4][1] == ours
    assert tracked[5][1] == ours + 1
    assert tracked[7][1] == tracked[6][1] + 1  # after delta-spark's racing insert
    assert tracked[8][0] > tracked[7][0]  # delta-spark took up our mark
    assert _high_water_mark(uri) == max(rid for rid, _ in tracked.values())
    assert assert_all_read(spark, uri) == comparable(
        [{"id": i, "v": 20 if i == 2 else i} for i in range(1, 9)]
    )
    our_commits = [
        json.loads(line)
        for v in (ours, ours + 1)
        for line in (Path(uri) / "_delta_log" / f"{v:020d}.json").read_text().splitlines()
    ]
    infos = [a["commitInfo"] for a in our_commits if "commitInfo" in a]
    assert all(i["tags"] == {"delta.rowTracking.preserved": "true"} for i in infos)
    checkpoints = sorted((Path(uri) / "_delta_log").glob("*.checkpoint.parquet"))
    assert checkpoints and int(checkpoints[-1].name[:20]) > ours  # (delta-rs's, ours included)
    adds = [a for a in pq.read_table(checkpoints[-1], columns=["add"]).column(0).to_pylist() if a]
    assert len(adds) >= 5 and all(a["baseRowId"] is not None for a in adds)
    assert all(a["defaultRowCommitVersion"] is not None for a in adds)
    assert _tracked(spark, uri) == tracked  # read through that checkpoint: the same ids


def test_operations_that_copy_rows_are_refused(delta_spark, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(spark, uri, ROWS, "INSERT INTO {t} VALUES (1, 1)", clauses=ROW_TRACKING_ON)
    TwoPhaseSink(DeltaSink(uri, app_id="a")).write(spark.createDataFrame([(2, 2)], ROWS))
    version = DeltaTable(uri).version()
    rows = spark.createDataFrame([(1, 10, "U")], ROWS + ", op STRING")
    attempts = {
        "overwrite": lambda: TwoPhaseSink(DeltaSink(uri, mode="overwrite")).write(rows.drop("op")),
        "upsert": lambda: TwoPhaseSink(
            DeltaSink(uri, app_id="u", mode="upsert", keys=["id"], delete_when="op = 'D'")
        ).write(rows),
        "compaction by Spark": lambda: DeltaSink(uri, staging="spark").compact(spark),
    }
    for operation, attempt in attempts.items():
        with pytest.raises((UnsupportedTableFeatureError, ConfigurationError), match="row ids"):
            attempt()
        assert DeltaTable(uri).version() == version, operation
    assert assert_all_read(spark, uri) == comparable([{"id": 1, "v": 1}, {"id": 2, "v": 2}])


def test_compaction_keeps_every_rows_id_and_commit_version(delta_spark, tmp_path):
    """Small files from delta-spark (an UPDATE that materialized ids, a DELETE that left a
    deletion vector) and from the sink, compacted by the sink's Python tasks: every row keeps
    its row id and commit version as delta-spark reads them, the new files carry the
    materialized columns and fresh base ids, and delta-spark's next insert is numbered above
    everything."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(
        spark,
        uri,
        ROWS,
        "INSERT INTO {t} VALUES (1, 1), (2, 2), (3, 3)",
        "INSERT INTO {t} VALUES (4, 4)",
        "UPDATE {t} SET v = 20 WHERE id = 2",
        "DELETE FROM {t} WHERE id = 3",
        clauses="TBLPROPERTIES ('delta.enableRowTracking' = 'true', "
        "'delta.enableDeletionVectors' = 'true')",
    )
    TwoPhaseSink(DeltaSink(uri, app_id="a")).write(
        spark.createDataFrame([(5, 5), (6, 6)], ROWS), epoch_id=0
    )
    before = _tracked(spark, uri)
    version = DeltaTable(uri).version()
    result = DeltaSink(uri).compact(spark)
    assert result.version == version + 1 and result.files_added == 1
    assert _tracked(spark, uri) == before
    (add,) = log_actions(uri, "add", first=version + 1)
    assert add["dataChange"] is False and add["baseRowId"] > max(r for r, _ in before.values())
    configuration = DeltaTable(uri).metadata().configuration
    materialized = {
        configuration["delta.rowTracking.materializedRowIdColumnName"],
        configuration["delta.rowTracking.materializedRowCommitVersionColumnName"],
    }
    assert materialized <= set(pq.read_schema(Path(uri) / add["path"]).names)
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (7, 7)")
    tracked = _tracked(spark, uri)
    assert tracked[7][0] > add["baseRowId"] + 4  # above the compaction's fresh ids
    assert _read_by_spark_and_duckdb(spark, uri) == comparable(  # (deltalake: no vectors)
        [{"id": i, "v": 20 if i == 2 else i} for i in (1, 2, 4, 5, 6, 7)]
    )
