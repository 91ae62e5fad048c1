"""Liquid clustering (the ``clustering`` and ``domainMetadata`` writer features) on tables
delta-spark made with ``CLUSTER BY``: the sink's appends, one-off writes, upserts, a
replace_where overwrite and a compaction land (through its own log writer: delta-rs refuses
these tables), every file they add has stats for the clustering columns and no
``clusteringProvider`` (unclustered, so delta-spark's ``OPTIMIZE`` reclusters it), and the
``delta.clustering`` domain stays as delta-spark wrote it, checkpoints included. delta-spark,
delta-rs and DuckDB read the same rows; delta-spark keeps clustering and writing the table."""

from __future__ import annotations

import itertools
import json
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from committers.delta import DeltaSink, UnsupportedTableFeatureError
from committers.tests._delta_helpers import log_actions
from committers.tests._delta_spark import assert_all_read, comparable
from committers.tests.delta.interop.test_interop_delta_spark_write import _create
from framework import TwoPhaseSink
from framework.errors import ConfigurationError, SchemaMismatchError

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


def test_new_clustering_columns_have_stats_and_schema_changes_keep_the_clustering(
    delta_spark, tmp_path
):
    """delta-spark moves the clustering to another column: the sink's next files carry its
    stats as they carry every column's. A new column is added (by the sink's log writer) and a
    schema replacement keeping the clustering column replaces the rows, the clustering kept
    (delta-spark's OPTIMIZE and INSERT go on); one dropping it, or partitioning the table, is
    refused by name with nothing written."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(spark, uri, ROWS, "INSERT INTO {t} VALUES (1, 1, 'a')", clauses="CLUSTER BY (v)")
    spark.sql(f"ALTER TABLE delta.`{uri}` CLUSTER BY (s)")
    TwoPhaseSink(DeltaSink(uri, app_id="a")).write(spark.createDataFrame([(2, 2, "b")], ROWS))
    assert _clustering_columns(spark, uri) == ["s"]
    assert json.loads(log_actions(uri, "add")[-1]["stats"])["minValues"]["s"] == "b"
    version = DeltaTable(uri).version()
    replace = DeltaSink(uri, app_id="r", mode="overwrite", schema_mode="overwrite")
    with pytest.raises(SchemaMismatchError, match=r"clustered by \['s'\].*'s'"):
        TwoPhaseSink(replace).write(spark.createDataFrame([(3,)], "id BIGINT"))
    partitioned = DeltaSink(
        uri, app_id="p", mode="overwrite", schema_mode="overwrite", partition_by=["s"]
    )
    with pytest.raises(UnsupportedTableFeatureError, match="cannot also be partitioned"):
        TwoPhaseSink(partitioned).write(spark.createDataFrame([("c", 1)], "s STRING, n INT"))
    assert DeltaTable(uri).version() == version
    TwoPhaseSink(DeltaSink(uri, app_id="m", schema_mode="merge")).write(
        spark.createDataFrame([(3, 3, "c", "x")], ROWS + ", extra STRING")
    )  # (a new column: the sink's log writer adds it, the clustering kept)
    assert _clustering_columns(spark, uri) == ["s"]
    assert assert_all_read(spark, uri) == comparable(
        [
            {"id": 1, "v": 1, "s": "a", "extra": None},
            {"id": 2, "v": 2, "s": "b", "extra": None},
            {"id": 3, "v": 3, "s": "c", "extra": "x"},
        ]
    )
    TwoPhaseSink(replace).write(spark.createDataFrame([("z", 1.5)], "s STRING, w DOUBLE"))
    assert _clustering_columns(spark, uri) == ["s"]
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES ('y', 2.5)")
    spark.sql(f"OPTIMIZE delta.`{uri}`")
    assert assert_all_read(spark, uri) == comparable([{"s": "z", "w": 1.5}, {"s": "y", "w": 2.5}])


def _protocol_and_domain(uri: str) -> tuple[dict, list[dict]]:
    return log_actions(uri, "protocol")[-1], log_actions(uri, "domainMetadata")


def test_the_sink_creates_and_compacts_a_clustered_table_as_delta_spark_does(delta_spark, tmp_path):
    """``DeltaSink(cluster_by=[...])`` creates the table with its first batch: the protocol and
    the ``delta.clustering`` domain equal those of delta-spark's ``CREATE TABLE ... CLUSTER
    BY`` of the same schema; a replayed batch commits nothing; ``compact()`` clusters (each
    file it writes holds one range of the clustering columns, sorted); delta-spark reads,
    clusters (``OPTIMIZE``) and writes the table, and three readers agree."""
    spark = delta_spark
    uri, reference = str(tmp_path / "t"), str(tmp_path / "ref")
    _create(spark, reference, ROWS, clauses="CLUSTER BY (s, id)")
    sink = DeltaSink(uri, app_id="a", cluster_by=["S", "id"])  # spelled as the input's
    assert "cluster_by=['S', 'id']" in repr(sink)
    TwoPhaseSink(sink).write(spark.createDataFrame([(1, 1, "a"), (2, 2, "b")], ROWS), epoch_id=0)
    assert _clustering_columns(spark, uri) == ["s", "id"]
    ours, theirs = _protocol_and_domain(uri), _protocol_and_domain(reference)
    assert ours[1] == theirs[1]
    assert (ours[0]["minReaderVersion"], ours[0]["minWriterVersion"]) == (1, 7)
    assert set(ours[0]["writerFeatures"]) == set(theirs[0]["writerFeatures"])

    again = DeltaSink(uri, app_id="a", cluster_by=["s", "id"])  # the table's own clustering
    TwoPhaseSink(again).write(spark.createDataFrame([(1, 1, "a")], ROWS), epoch_id=0)  # replay
    rows = [(1, 1, "a"), (2, 2, "b")]
    for epoch in range(1, 5):  # four files over the whole range of s, ~400 KB each
        batch = [(epoch * 100_000 + i, i, uuid.uuid4().hex) for i in range(10_000)]
        TwoPhaseSink(DeltaSink(uri, app_id="a")).write(
            spark.createDataFrame(batch, ROWS), epoch_id=epoch
        )
        rows += batch
    before = DeltaTable(uri).version()
    result = DeltaSink(uri).compact(spark, target_file_size=1 << 20)
    assert result.files_removed > result.files_added >= 2
    added = [json.loads(a["stats"]) for a in log_actions(uri, "add", first=before + 1)]
    ranges = sorted((st["minValues"]["s"], st["maxValues"]["s"]) for st in added)
    assert all(low[1] < high[0] for low, high in itertools.pairwise(ranges)), ranges

    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (3, 3, 'c')")
    spark.sql(f"OPTIMIZE delta.`{uri}`")
    assert {a.get("clusteringProvider") for a in log_actions(uri, "add")[-1:]} == {"liquid"}
    expected = [{"id": i, "v": v, "s": s} for i, v, s in [*rows, (3, 3, "c")]]
    assert assert_all_read(spark, uri) == comparable(expected)


def test_bad_clustering_is_refused_before_anything_is_written(delta_spark, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    df = spark.createDataFrame([(1, 1, "a")], ROWS)
    with pytest.raises(ConfigurationError, match="exclude each other"):
        DeltaSink(uri, cluster_by=["v"], partition_by=["s"])
    with pytest.raises(ConfigurationError, match="at most 4"):
        DeltaSink(uri, cluster_by=["a", "b", "c", "d", "e"])
    with pytest.raises(SchemaMismatchError, match="no such top-level column"):
        TwoPhaseSink(DeltaSink(uri, cluster_by=["nope"])).write(df)
    tagged = spark.createDataFrame([(1, ["x"])], "id BIGINT, tags ARRAY<STRING>")
    with pytest.raises(SchemaMismatchError, match="no min/max statistics"):
        TwoPhaseSink(DeltaSink(uri, cluster_by=["tags"])).write(tagged)
    narrow = DeltaSink(
        uri, cluster_by=["s"], table_configuration={"delta.dataSkippingNumIndexedCols": "2"}
    )
    with pytest.raises(SchemaMismatchError, match="statistics for"):
        TwoPhaseSink(narrow).write(df)
    assert not (tmp_path / "t").exists()
    TwoPhaseSink(DeltaSink(uri)).write(df)  # an unclustered table
    with pytest.raises(SchemaMismatchError, match=r"is not clustered.*CLUSTER BY \(v\)"):
        TwoPhaseSink(DeltaSink(uri, cluster_by=["v"])).write(df)
    assert DeltaTable(uri).version() == 0
