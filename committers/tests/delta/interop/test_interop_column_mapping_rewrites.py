"""Upserts and ``replace_where`` overwrites into column-mapped tables delta-spark made (modes
``name`` and ``id``), with a renamed column, a renamed nested field and a dropped column: rows
are matched by the table's (logical) names while every file is read and written by physical
name with its field ids, so a renamed column keeps its data and a dropped one's never comes
back. One upsert marks replaced rows in deletion vectors, with the change data feed on, then
keeps untouched rows with Python tasks (copy-on-write); the other keeps them with Spark,
fills the columns the input lacks from the stored rows (``partial_updates``) and orders
changes by a renamed column (``sequence_by``). The overwrites replace a partition, then rows
by a renamed column (Python tasks and Spark rewriting). delta-spark and delta-rs's DataFusion
reader agree (DuckDB reads the partition column of such tables as NULL)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder

from committers.delta import DeltaSink
from committers.tests._delta_helpers import log_actions
from committers.tests._delta_spark import comparable, spark_rows
from committers.tests.delta.interop.test_interop_delta_spark_write import _create
from framework import TwoPhaseSink

pytestmark = pytest.mark.spark

MAPPED = "id BIGINT, value INT, s STRUCT<a: INT, bee: STRING>, day STRING"


def _mapped_table(spark, uri: str, mode: str, properties: str) -> None:  # type: ignore[no-untyped-def]
    _create(
        spark,
        uri,
        "id BIGINT, v INT, gone STRING, s STRUCT<a: INT, b: STRING>, day STRING",
        "INSERT INTO {t} VALUES (1, 1, 'a', named_struct('a', 1, 'b', 'x'), 'd1'), "
        "(2, 2, 'b', named_struct('a', 2, 'b', 'y'), 'd2'), "
        "(3, 3, 'c', named_struct('a', 3, 'b', 'z'), 'd1')",
        "ALTER TABLE {t} RENAME COLUMN v TO value",
        "ALTER TABLE {t} RENAME COLUMN s.b TO bee",
        "ALTER TABLE {t} DROP COLUMN gone",
        clauses=f"PARTITIONED BY (day) TBLPROPERTIES ('delta.columnMapping.mode' = '{mode}'"
        f"{properties})",
    )


def _read(spark, uri: str) -> list[dict]:  # type: ignore[no-untyped-def]
    by_spark = spark_rows(spark, uri)
    query = QueryBuilder().register("t", DeltaTable(uri)).execute("SELECT * FROM t")
    assert comparable(pa.table(query).to_pylist()) == by_spark
    return by_spark


def _row(i: int, value: int, s: tuple | None, day: str = "d1") -> dict:
    struct = None if s is None else {"a": s[0], "bee": s[1]}
    return {"id": i, "value": value, "s": struct, "day": day}


def _physical(uri: str) -> dict[str, str]:
    fields = json.loads(DeltaTable(uri).schema().to_json())["fields"]
    return {f["name"]: f["metadata"]["delta.columnMapping.physicalName"] for f in fields}


def _written_files(uri: str, version: int) -> list[Path]:
    """The files version ``version`` adds (not those it adds back with a new vector)."""
    adds = log_actions(uri, "add", first=version)
    return [Path(uri) / a["path"] for a in adds if not a.get("deletionVector")]


def test_an_upsert_with_vectors_and_change_feed_on_a_name_mapped_table(delta_spark, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    _mapped_table(
        spark,
        uri,
        "name",
        ", 'delta.enableDeletionVectors' = 'true', 'delta.enableChangeDataFeed' = 'true'",
    )
    changes = spark.createDataFrame(
        [(1, 10, (1, "u"), "d1", "U"), (2, 0, (0, ""), "d2", "D"), (4, 4, (4, "n"), "d1", "U")],
        MAPPED + ", op STRING",
    )
    sink = DeltaSink(uri, app_id="u", mode="upsert", keys=["id"], delete_when="op = 'D'")
    TwoPhaseSink(sink).write(changes, epoch_id=0)
    version = DeltaTable(uri).version()
    TwoPhaseSink(sink).write(changes, epoch_id=0)  # a replay commits nothing
    assert DeltaTable(uri).version() == version

    expected = [_row(1, 10, (1, "u")), _row(3, 3, (3, "z")), _row(4, 4, (4, "n"))]
    assert _read(spark, uri) == comparable(expected)
    assert any(a.get("deletionVector") for a in log_actions(uri, "add", first=version))
    physical = _physical(uri)
    for path in _written_files(uri, version):  # the new rows: by physical name
        assert set(pq.read_schema(path).names) == {physical[c] for c in ("id", "value", "s")}
    feed = spark.read.format("delta").option("readChangeFeed", "true")
    changed = feed.option("startingVersion", version).load(uri).drop("_commit_timestamp")
    assert sorted((r["id"], r["value"], r["_change_type"]) for r in changed.collect()) == [
        (1, 1, "update_preimage"),
        (1, 10, "update_postimage"),
        (2, 2, "delete"),
        (4, 4, "insert"),
    ]

    # Copy-on-write: Python tasks rewrite the file holding 4 (and 1) without it, read and
    # written by physical name, its partition value logged under the physical name.
    rewrite = DeltaSink(uri, app_id="u", mode="upsert", keys=["id"], deletion_vectors="off")
    changes = spark.createDataFrame([(4, 40, (4, "m"), "d1")], MAPPED)
    TwoPhaseSink(rewrite).write(changes, epoch_id=1)
    assert len(log_actions(uri, "add", first=version + 1)) == 2  # the new row, the kept one
    expected = [_row(1, 10, (1, "u")), _row(3, 3, (3, "z")), _row(4, 40, (4, "m"))]
    assert _read(spark, uri) == comparable(expected)
    for path in _written_files(uri, version + 1):
        assert set(pq.read_schema(path).names) == {physical[c] for c in ("id", "value", "s")}


def test_a_partial_sequenced_upsert_kept_by_spark_on_an_id_mapped_table(delta_spark, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    _mapped_table(spark, uri, "id", "")
    changes = spark.createDataFrame(
        [(1, 10, "d1", "U"), (2, 5, "d2", "D"), (3, 0, "d1", "U"), (4, 4, "d1", "U")],
        "id BIGINT, value INT, day STRING, op STRING",
    )
    sink = DeltaSink(
        uri,
        app_id="u",
        mode="upsert",
        keys=["id"],
        sequence_by="value",
        partial_updates=True,
        delete_when="op = 'D'",
        staging="spark",
    )
    TwoPhaseSink(sink).write(changes, epoch_id=0)
    # 3's change is older than its stored value (stale); 1 keeps its stored struct.
    expected = [_row(1, 10, (1, "x")), _row(3, 3, (3, "z")), _row(4, 4, None)]
    assert _read(spark, uri) == comparable(expected)
    version = DeltaTable(uri).version()
    physical = _physical(uri)
    for path in _written_files(uri, version):
        written = pq.read_schema(path)
        assert set(written.names) == {physical[c] for c in ("id", "value", "s")}
        assert all(written.field(n).metadata[b"PARQUET:field_id"] for n in written.names)


def test_replace_where_on_partition_and_renamed_columns_of_an_id_mapped_table(
    delta_spark, tmp_path
):
    """``replace_where`` on the partition column (files removed whole), then on a renamed
    data column with Python tasks and with Spark rewriting the files that keep rows; the
    change data feed reports exactly the rows replaced and written."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _mapped_table(spark, uri, "id", ", 'delta.enableChangeDataFeed' = 'true'")

    def overwrite(rows: list[tuple], where: str, staging: str = "auto") -> None:
        sink = DeltaSink(uri, mode="overwrite", replace_where=where, staging=staging)
        TwoPhaseSink(sink).write(spark.createDataFrame(rows, MAPPED))

    overwrite([(5, 5, (5, "f"), "d2")], "day = 'd2'")
    expected = [_row(1, 1, (1, "x")), _row(3, 3, (3, "z")), _row(5, 5, (5, "f"), "d2")]
    assert _read(spark, uri) == comparable(expected)
    overwrite([(6, 6, (6, "g"), "d1")], "value >= 3 AND day = 'd1'")  # 3 replaced, 1 kept
    version = DeltaTable(uri).version()
    overwrite([(7, 0, (7, "h"), "d1")], "value < 2", staging="spark")  # 1 replaced, 6 kept
    expected = [_row(5, 5, (5, "f"), "d2"), _row(6, 6, (6, "g")), _row(7, 0, (7, "h"))]
    assert _read(spark, uri) == comparable(expected)
    physical = _physical(uri)
    for path in _written_files(uri, version):
        assert set(pq.read_schema(path).names) == {physical[c] for c in ("id", "value", "s")}
    feed = spark.read.format("delta").option("readChangeFeed", "true")
    changed = feed.option("startingVersion", version).load(uri)
    assert sorted((r["id"], r["_change_type"]) for r in changed.collect()) == [
        (1, "delete"),
        (3, "delete"),
        (6, "insert"),
        (7, "insert"),
    ]
