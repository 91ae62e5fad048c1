"""Row tracking (the ``rowTracking`` writer feature) on tables delta-spark made: every file the
sink appends gets a ``baseRowId`` above the table's high-water mark and its commit's version
as ``defaultRowCommitVersion``, and the commit advances the ``delta.rowTracking`` domain;
delta-spark's ``_metadata.row_id`` and ``_metadata.row_commit_version`` are the judge, before
and after our writes, across a checkpoint and against a delta-spark commit racing ours.
Compaction and overwrites keep every copied row's id and commit version (in the materialized
columns; a file added back with a new deletion vector keeps its base id), deletion vectors and
delta-spark's materialized ids included, and every remove carries its file's ids. Upserts keep
the ids of the rows they copy and of the rows they update (whose commit version becomes the
upsert's), as delta-spark's MERGE does."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from committers.delta import DeltaSink
from committers.tests._delta_helpers import log_actions
from committers.tests._delta_spark import assert_all_read, comparable, live_files
from committers.tests._log_races import race_before_write
from committers.tests.delta.interop.test_interop_delta_spark_write import (
    _create,
    _read_by_spark_and_duckdb,
)
from framework import TwoPhaseSink

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


@pytest.mark.parametrize("staging", ["arrow", "spark"])
def test_compaction_keeps_every_rows_id_and_commit_version(delta_spark, tmp_path, staging):
    """Small files from delta-spark (an UPDATE that materialized ids, a DELETE that left a
    deletion vector) and from the sink, compacted by the sink's Python tasks or by Spark (whose
    scan computes each row's stable id from the materialized column or the file's base id and
    ``_metadata.row_index``): every row keeps
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
    result = DeltaSink(uri, staging=staging).compact(spark)
    assert result.version == version + 1 and result.files_added == 1
    assert _tracked(spark, uri) == before
    (add,) = log_actions(uri, "add", first=version + 1)
    assert add["dataChange"] is False and add["baseRowId"] > max(r for r, _ in before.values())
    _removes_carry_their_files_ids(uri, version + 1)
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


def _removes_carry_their_files_ids(uri: str, version: int) -> None:
    """Every remove of commit ``version`` logs the ids of the add it removes."""
    adds = {a["path"]: a for a in log_actions(uri, "add")}
    removes = log_actions(uri, "remove", first=version)
    assert removes
    for remove in removes:
        add = adds[remove["path"]]
        assert remove["baseRowId"] == add["baseRowId"], remove
        assert remove["defaultRowCommitVersion"] == add["defaultRowCommitVersion"], remove


@pytest.mark.parametrize(
    ("staging", "vectors"),
    [("arrow", "off"), ("spark", "off"), ("auto", "auto")],
    ids=["python-rewrite", "spark-staging", "deletion-vectors"],
)
def test_overwrites_keep_the_ids_of_the_rows_they_keep(delta_spark, tmp_path, staging, vectors):
    """``replace_where`` on a data column keeps the kept rows' ids and commit versions
    (rewritten by Python tasks whatever the staging, or marked in a new deletion vector: the
    file added back keeps its base id); replaced partitions and whole-table overwrites add
    fresh ids only; removes log their files' ids; delta-spark numbers its next rows above."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(
        spark,
        uri,
        ROWS + ", p INT",
        "INSERT INTO {t} VALUES (1, 1, 1), (2, 2, 1), (3, 3, 2), (4, 4, 2)",
        "INSERT INTO {t} VALUES (5, 5, 1), (6, 6, 2)",
        "UPDATE {t} SET v = 20 WHERE id = 2",  # (materializes the id of row 2)
        clauses="PARTITIONED BY (p) TBLPROPERTIES ('delta.enableRowTracking' = 'true', "
        "'delta.enableDeletionVectors' = 'true')",
    )
    before = _tracked(spark, uri)

    def overwrite(rows, replace_where=None):  # type: ignore[no-untyped-def]
        sink = DeltaSink(
            uri,
            mode="overwrite",
            replace_where=replace_where,
            staging=staging,
            deletion_vectors=vectors,
        )
        TwoPhaseSink(sink).write(spark.createDataFrame(rows, ROWS + ", p INT"))
        return DeltaTable(uri).version()

    replaced = overwrite([(7, 7, 1), (8, 8, 2)], "v >= 4 AND v < 10")  # rows 4, 5 and 6
    tracked = _tracked(spark, uri)
    assert set(tracked) == {1, 2, 3, 7, 8}
    assert {i: tracked[i] for i in (1, 2, 3)} == {i: before[i] for i in (1, 2, 3)}
    mark = max(r for r, _ in before.values())
    assert all(tracked[i][0] > mark and tracked[i][1] == replaced for i in (7, 8))
    if vectors == "auto":  # rows were marked, no row copied
        assert any(a.get("deletionVector") for a in log_actions(uri, "add", first=replaced))
    else:
        assert not any(a.get("deletionVector") for a in log_actions(uri, "add", first=replaced))
    _removes_carry_their_files_ids(uri, replaced)

    whole_partition = overwrite([(9, 9, 1)], "p = 1")
    tracked_after_partition = _tracked(spark, uri)
    assert set(tracked_after_partition) == {3, 8, 9}
    assert tracked_after_partition[3] == before[3] and tracked_after_partition[8] == tracked[8]
    assert tracked_after_partition[9][1] == whole_partition
    assert tracked_after_partition[9][0] > max(r for r, _ in tracked.values())
    _removes_carry_their_files_ids(uri, whole_partition)

    everything = overwrite([(10, 10, 3), (11, 11, 3)])
    latest = _tracked(spark, uri)
    assert set(latest) == {10, 11} and all(v == everything for _, v in latest.values())
    assert min(r for r, _ in latest.values()) > max(r for r, _ in tracked_after_partition.values())
    _removes_carry_their_files_ids(uri, everything)
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (12, 12, 3)")
    assert _tracked(spark, uri)[12][0] > max(r for r, _ in latest.values())
    assert _read_by_spark_and_duckdb(spark, uri) == comparable(
        [{"id": i, "v": i, "p": 3} for i in (10, 11, 12)]
    )


@pytest.mark.parametrize(
    ("staging", "vectors"),
    [("auto", "off"), ("spark", "off"), ("auto", "auto")],
    ids=["python-rewrite", "spark-rewrite", "deletion-vectors"],
)
def test_upserts_keep_the_ids_of_the_rows_they_copy_and_update(
    delta_spark, tmp_path, staging, vectors
):
    """An upsert's updated rows keep their ids with the upsert's commit version; the rows it
    copies keep both (rewritten by Python tasks or by Spark, or left in place under a new
    deletion vector); deleted rows go, inserted rows get fresh ids; a replay changes nothing;
    delta-spark numbers its next rows above."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(
        spark,
        uri,
        ROWS,
        "INSERT INTO {t} VALUES (1, 1), (2, 2), (3, 3)",
        "INSERT INTO {t} VALUES (4, 4), (5, 5), (6, 6)",
        "UPDATE {t} SET v = 20 WHERE id = 2",  # (materializes the id of row 2)
        clauses="TBLPROPERTIES ('delta.enableRowTracking' = 'true', "
        "'delta.enableDeletionVectors' = 'true', 'delta.enableChangeDataFeed' = 'true')",
    )
    before = _tracked(spark, uri)
    changes = spark.createDataFrame(
        [(2, 200, "U"), (4, 400, "U"), (5, 0, "D"), (7, 7, "I")], ROWS + ", op STRING"
    )
    sink = DeltaSink(
        uri,
        app_id="u",
        mode="upsert",
        keys=["id"],
        delete_when="op = 'D'",
        staging=staging,
        deletion_vectors=vectors,
    )
    TwoPhaseSink(sink).write(changes, epoch_id=0)
    upserted = DeltaTable(uri).version()
    TwoPhaseSink(sink).write(changes, epoch_id=0)  # a replay: already committed
    assert DeltaTable(uri).version() == upserted

    tracked = _tracked(spark, uri)
    assert set(tracked) == {1, 2, 3, 4, 6, 7}
    assert {i: tracked[i] for i in (1, 3, 6)} == {i: before[i] for i in (1, 3, 6)}
    assert tracked[2] == (before[2][0], upserted) and tracked[4] == (before[4][0], upserted)
    assert tracked[7][0] > max(r for r, _ in before.values()) and tracked[7][1] == upserted
    _removes_carry_their_files_ids(uri, upserted)
    feed = spark.read.format("delta").option("readChangeFeed", "true")
    feed = feed.option("startingVersion", upserted).load(uri)
    assert sorted(feed.select("id", "v", "_change_type").collect()) == sorted(
        [
            (2, 20, "update_preimage"),
            (2, 200, "update_postimage"),
            (4, 4, "update_preimage"),
            (4, 400, "update_postimage"),
            (5, 5, "delete"),
            (7, 7, "insert"),
        ]
    )
    marked = any(a.get("deletionVector") for a in log_actions(uri, "add", first=upserted))
    assert marked == (vectors == "auto")
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (8, 8)")
    assert _tracked(spark, uri)[8][0] > max(r for r, _ in tracked.values())
    # delta-spark goes on writing: its MERGE keeps the id of a row the sink updated, and its
    # OPTIMIZE keeps every id
    spark.sql(
        f"MERGE INTO delta.`{uri}` t USING (SELECT 2L AS id, 2000 AS v) s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET t.v = s.v"
    )
    spark.sql(f"OPTIMIZE delta.`{uri}`")
    merged = _tracked(spark, uri)
    assert merged[2][0] == before[2][0] and merged[7] == tracked[7]
    assert _read_by_spark_and_duckdb(spark, uri) == comparable(
        [{"id": i, "v": {2: 2000, 4: 400}.get(i, i)} for i in (1, 2, 3, 4, 6, 7, 8)]
    )


def test_rows_of_a_table_that_supports_but_does_not_enable_row_tracking_get_fresh_ids(
    delta_spark, tmp_path
):
    """Row tracking supported (``delta.feature.rowTracking``) but not enabled: files added
    before hold no ``baseRowId`` and no ids can be kept (PROTOCOL.md), so an upsert and a
    compaction rewrite them with fresh ids only, every add numbered above the mark."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(
        spark,
        uri,
        ROWS,
        "INSERT INTO {t} VALUES (1, 1), (2, 2), (3, 3)",
        "ALTER TABLE {t} SET TBLPROPERTIES ('delta.feature.rowTracking' = 'supported')",
    )
    assert all(a.get("baseRowId") is None for a in log_actions(uri, "add"))
    changes = spark.createDataFrame([(2, 20, "U"), (4, 4, "I")], ROWS + ", op STRING")
    TwoPhaseSink(
        DeltaSink(
            uri,
            app_id="u",
            mode="upsert",
            keys=["id"],
            delete_when="op = 'D'",
            deletion_vectors="off",
        )
    ).write(changes, epoch_id=0)
    upserted = DeltaTable(uri).version()
    TwoPhaseSink(DeltaSink(uri, app_id="a")).write(spark.createDataFrame([(5, 5)], ROWS))
    assert DeltaSink(uri).compact(spark).version is not None
    live = live_files(uri)
    adds = {a["path"]: a for a in log_actions(uri, "add", first=upserted)}
    assert live and live <= set(adds)  # every live file was added since, by the sink
    assert all(adds[path]["baseRowId"] is not None for path in live)
    assert _high_water_mark(uri) >= max(adds[path]["baseRowId"] for path in live)
    assert assert_all_read(spark, uri) == comparable(
        [{"id": i, "v": 20 if i == 2 else i} for i in (1, 2, 3, 4, 5)]
    )
