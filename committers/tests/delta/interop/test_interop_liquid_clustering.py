"""Liquid clustering (the ``clustering`` and ``domainMetadata`` writer features) on tables
delta-spark made with ``CLUSTER BY``: the sink's appends, one-off writes, upserts, a
replace_where overwrite and a compaction land (through its own log writer: delta-rs refuses
these tables), every file they add has stats for the clustering columns and no
``clusteringProvider`` (unclustered, so delta-spark's ``OPTIMIZE`` reclusters it), and the
``delta.clustering`` domain stays as delta-spark wrote it, checkpoints included. delta-spark,
delta-rs and DuckDB read the same rows; delta-spark keeps clustering and writing the table."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from committers.delta import DeltaSink, UnsupportedTableFeatureError
from committers.tests._delta_helpers import log_actions
from committers.tests._delta_spark import assert_all_read, comparable
from committers.tests.delta.interop.test_interop_delta_spark_write import _create
from framework import TwoPhaseSink
from framework.errors import SchemaMismatchError

pytestmark = pytest.mark.spark

ROWS = "id BIGINT, v INT, s STRING"


def _clustering_columns(spark, uri: str) -> list[str]:  # type: ignore[no-untyped-def]
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{uri}`").collect()[0]
    return list(detail["clusteringColumns"])


def test_every_write_keeps_the_clustering_and_delta_spark_reclusters(delta_spark, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(
        spark,
        uri,
        ROWS,
        "INSERT INTO {t} VALUES (1, 1, 'a'), (2, 2, 'b')",
        clauses="CLUSTER BY (v) TBLPROPERTIES ('delta.checkpointInterval' = '2')",
    )
    ours_from = DeltaTable(uri).version() + 1
    domain = log_actions(uri, "domainMetadata")
    TwoPhaseSink(DeltaSink(uri, app_id="a")).write(
        spark.createDataFrame([(3, 3, "c")], ROWS), epoch_id=0
    )
    TwoPhaseSink(DeltaSink(uri)).write(spark.createDataFrame([(4, 4, "d")], ROWS))
    changes = spark.createDataFrame(
        [(1, 10, "u", "U"), (2, 0, "", "D"), (5, 5, "e", "U")], ROWS + ", op STRING"
    )
    upsert = DeltaSink(uri, app_id="u", mode="upsert", keys=["id"], delete_when="op = 'D'")
    TwoPhaseSink(upsert).write(changes)
    replace = DeltaSink(uri, app_id="o", mode="overwrite", replace_where="id >= 5")
    TwoPhaseSink(replace).write(spark.createDataFrame([(6, 6, "f")], ROWS))
    assert DeltaSink(uri).compact(spark).version is not None

    expected = [(1, 10, "u"), (3, 3, "c"), (4, 4, "d"), (6, 6, "f")]
    rows = comparable([{"id": i, "v": v, "s": s} for i, v, s in expected])
    assert assert_all_read(spark, uri) == rows
    assert _clustering_columns(spark, uri) == ["v"]
    assert log_actions(uri, "domainMetadata") == domain  # nobody but delta-spark wrote it
    adds = log_actions(uri, "add", first=ours_from)
    assert adds and all(a.get("clusteringProvider") is None for a in adds)
    for add in adds:
        stats = json.loads(add["stats"])
        assert {"v", "id", "s"} <= set(stats["minValues"]), add["path"]
    checkpoints = sorted((Path(uri) / "_delta_log").glob("*.checkpoint.parquet"))
    assert checkpoints  # (delta-rs's, at the table's interval)
    kept = pq.read_table(checkpoints[-1], columns=["domainMetadata"]).column(0).to_pylist()
    assert [d for d in kept if d] == domain

    spark.sql(f"OPTIMIZE delta.`{uri}`")  # delta-spark reclusters our unclustered files
    assert {a.get("clusteringProvider") for a in log_actions(uri, "add")[-1:]} == {"liquid"}
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (7, 7, 'g')")
    assert assert_all_read(spark, uri) == comparable([*rows, {"id": 7, "v": 7, "s": "g"}])


def test_new_clustering_columns_have_stats_and_schema_changes_are_refused(delta_spark, tmp_path):
    """delta-spark moves the clustering to another column: the sink's next files carry its
    stats as they carry every column's. A schema replacement and new columns are refused by
    name, with nothing written."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(spark, uri, ROWS, "INSERT INTO {t} VALUES (1, 1, 'a')", clauses="CLUSTER BY (v)")
    spark.sql(f"ALTER TABLE delta.`{uri}` CLUSTER BY (s)")
    TwoPhaseSink(DeltaSink(uri, app_id="a")).write(spark.createDataFrame([(2, 2, "b")], ROWS))
    assert _clustering_columns(spark, uri) == ["s"]
    assert json.loads(log_actions(uri, "add")[-1]["stats"])["minValues"]["s"] == "b"
    version = DeltaTable(uri).version()
    overwrite = DeltaSink(uri, mode="overwrite", schema_mode="overwrite")
    with pytest.raises(UnsupportedTableFeatureError, match="clustered"):
        TwoPhaseSink(overwrite).write(spark.createDataFrame([(3,)], "id BIGINT"))
    with pytest.raises(SchemaMismatchError, match=r"new columns \['extra'\].*clustering"):
        TwoPhaseSink(DeltaSink(uri, app_id="m", schema_mode="merge")).write(
            spark.createDataFrame([(3, 3, "c", "x")], ROWS + ", extra STRING")
        )
    assert DeltaTable(uri).version() == version
    assert assert_all_read(spark, uri) == comparable(
        [{"id": 1, "v": 1, "s": "a"}, {"id": 2, "v": 2, "s": "b"}]
    )
