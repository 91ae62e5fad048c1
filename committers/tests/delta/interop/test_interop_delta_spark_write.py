"""The sink writes into tables delta-spark made: created by ``CREATE TABLE ... USING delta``
(or delta-spark's DataFrame writer) with CHECK constraints, NOT NULL, generated columns,
column mapping with renamed and dropped columns, deletion vectors, the change data feed, type
widening and v2 checkpoints (in-commit timestamps, liquid clustering and row tracking have
their own modules). For each, the sink's append, upsert, overwrite and compaction either work (the
rows read back by delta-spark, and by deltalake and/or DuckDB, are exactly the expected ones,
and delta-spark still enforces the table's rules) or are refused before anything is written,
with an error naming the feature. Identity columns have their own module,
``test_interop_delta_spark_identity.py``."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from committers.delta import DeltaSink, UnsupportedTableFeatureError
from committers.delta.commit._log_append import LogView
from committers.delta.commit._log_store import LogStore
from committers.delta.storage._storage import TableLocation
from committers.tests._delta_spark import (
    assert_all_read,
    comparable,
    data_files,
    delta_rs_rows,
    spark_rows,
)
from committers.tests._readers import duckdb_rows
from committers.tests._spark_helpers import file_stream, make_source
from framework import TwoPhaseSink
from framework.errors import (
    ConstraintViolationError,
    NullConstraintError,
    UnsupportedTypeError,
)

pytestmark = pytest.mark.spark

UTC = datetime.timezone.utc


def _create(spark, uri: str, columns: str, *statements: str, clauses: str = "") -> None:
    """``CREATE TABLE`` at ``uri`` by delta-spark, then each statement (``{t}`` names it)."""
    table = f"delta.`{uri}`"
    spark.sql(f"CREATE TABLE {table} ({columns}) USING delta {clauses}")
    for statement in statements:
        spark.sql(statement.format(t=table))


ROWS = "id BIGINT, v INT"  # the columns of most tables here


def _id_v_table(spark, uri: str, *statements: str, properties: str) -> None:
    """A delta-spark table of ``ROWS`` with the given ``TBLPROPERTIES``, then ``statements``."""
    _create(spark, uri, ROWS, *statements, clauses=f"TBLPROPERTIES ({properties})")


def _append(uri: str, df, app_id: str = "append"):
    return TwoPhaseSink(DeltaSink(uri, app_id=app_id)).write(df)


def _upsert(uri: str, df, keys=("id",)):
    sink = DeltaSink(uri, app_id="upsert", mode="upsert", keys=list(keys), delete_when="op = 'D'")
    return TwoPhaseSink(sink).write(df)


def _overwrite(uri: str, df, replace_where: str | None = None):
    sink = DeltaSink(uri, app_id="overwrite", mode="overwrite", replace_where=replace_where)
    return TwoPhaseSink(sink).write(df)


def _protocol_and_configuration(uri: str) -> tuple[dict, dict]:
    protocol, metadata = {}, {}
    for path in sorted((Path(uri) / "_delta_log").glob("*.json")):
        for line in path.read_text().splitlines():
            action = json.loads(line)
            protocol = action.get("protocol", protocol)
            metadata = action.get("metaData", metadata)
    return protocol, metadata.get("configuration", {})


def _log_actions(uri: str, version: int, kind: str) -> list[dict]:
    path = Path(uri) / "_delta_log" / f"{version:020d}.json"
    actions = [json.loads(line) for line in path.read_text().splitlines()]
    return [action[kind] for action in actions if kind in action]


def _log_version(uri: str) -> int:
    """The newest version in the log (read without delta-rs, which refuses some of these
    tables' reader features)."""
    return max(int(p.name[:20]) for p in (Path(uri) / "_delta_log").glob("*.json"))


def _read_by_spark_and_duckdb(spark, uri: str) -> list[dict]:
    """The rows delta-spark and DuckDB read (they must agree); deltalake's pyarrow reader
    cannot read column-mapped, deletion-vector or v2-checkpoint tables."""
    by_spark = spark_rows(spark, uri)
    assert comparable(duckdb_rows(uri)) == by_spark
    return by_spark


def test_a_default_table_takes_every_operation(delta_spark, tmp_path):
    """A plain ``CREATE TABLE`` of delta-spark 4 (no feature on by default: protocol 1/2),
    partitioned by a date, with delta-spark's own files (INT96 timestamps, string bounds cut
    at 32 characters): the sink appends, upserts by a long string key, replaces a partition and
    compacts; delta-spark writes to it again afterwards."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    prefix = "k" * 40  # keys longer than the 32 characters delta-spark keeps in its stats
    _create(
        spark,
        uri,
        "id BIGINT, s STRING, ts TIMESTAMP, day DATE",
        "INSERT INTO {t} VALUES"
        f" (1, '{prefix}1', TIMESTAMP'2026-11-21 10:00:00.000001', DATE'2026-11-21'),"
        f" (2, '{prefix}2', TIMESTAMP'2026-11-21 10:00:00.000002', DATE'2026-11-22')",
        clauses="PARTITIONED BY (day)",
    )
    assert _protocol_and_configuration(uri) == ({"minReaderVersion": 1, "minWriterVersion": 2}, {})
    rows = "id BIGINT, s STRING, ts TIMESTAMP, day DATE"
    day1, day2 = datetime.date(2026, 11, 21), datetime.date(2026, 11, 22)
    stamp = datetime.datetime(2026, 11, 21, 10, 0, 0, 3, tzinfo=UTC)
    _append(uri, spark.createDataFrame([(3, f"{prefix}3", stamp, day1)], rows))
    changes = spark.createDataFrame(
        [(2, f"{prefix}2", stamp, day2, "U"), (4, f"{prefix}4", stamp, day2, "I")],
        rows + ", op STRING",
    )
    _upsert(uri, changes.withColumn("id", changes.id * 10), keys=["s"])
    _overwrite(
        uri,
        spark.createDataFrame([(5, f"{prefix}5", stamp, day1)], rows),
        replace_where="day = '2026-11-21'",
    )
    _append(uri, spark.createDataFrame([(6, f"{prefix}6", stamp, day2)], rows))
    assert DeltaSink(uri).compact(spark).files_removed >= 2
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (7, 's7', NULL, DATE'2026-11-22')")

    expected = [
        {"id": 20, "s": f"{prefix}2", "ts": stamp, "day": day2},
        {"id": 40, "s": f"{prefix}4", "ts": stamp, "day": day2},
        {"id": 5, "s": f"{prefix}5", "ts": stamp, "day": day1},
        {"id": 6, "s": f"{prefix}6", "ts": stamp, "day": day2},
        {"id": 7, "s": "s7", "ts": None, "day": day2},
    ]
    assert assert_all_read(spark, uri) == comparable(expected)


def test_check_constraints_and_not_null_are_honoured(delta_spark, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(
        spark,
        uri,
        "id BIGINT NOT NULL, v INT",
        "ALTER TABLE {t} ADD CONSTRAINT positive CHECK (v > 0)",
        "INSERT INTO {t} VALUES (1, 1), (2, 2)",
    )
    _append(uri, spark.createDataFrame([(3, 3)], ROWS))
    version = DeltaTable(uri).version()
    with pytest.raises(ConstraintViolationError, match=r"CHECK constraint positive \(v > 0\)"):
        _append(uri, spark.createDataFrame([(4, -4)], ROWS), app_id="bad")
    with pytest.raises(NullConstraintError, match="id"):
        _append(uri, spark.createDataFrame([(None, 4)], ROWS), app_id="bad")
    with pytest.raises(ConstraintViolationError, match="positive"):
        _upsert(uri, spark.createDataFrame([(1, -1, "U")], ROWS + ", op STRING"))
    assert DeltaTable(uri).version() == version
    _upsert(uri, spark.createDataFrame([(1, 10, "U"), (2, 0, "D")], ROWS + ", op STRING"))
    _append(uri, spark.createDataFrame([(5, 5)], ROWS))
    DeltaSink(uri).compact(spark)
    expected = [{"id": 1, "v": 10}, {"id": 3, "v": 3}, {"id": 5, "v": 5}]
    assert assert_all_read(spark, uri) == comparable(expected)
    with pytest.raises(Exception, match="positive"):  # delta-spark still enforces it
        spark.sql(f"INSERT INTO delta.`{uri}` VALUES (6, -6)")
    _overwrite(uri, spark.createDataFrame([(7, 7)], ROWS))
    assert assert_all_read(spark, uri) == [{"id": 7, "v": 7}]


def test_generated_columns_are_computed(delta_spark, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(
        spark,
        uri,
        "id BIGINT, v INT, doubled INT GENERATED ALWAYS AS (v * 2)",
        "INSERT INTO {t} (id, v) VALUES (1, 1), (2, 2)",
    )
    _append(uri, spark.createDataFrame([(3, 3)], ROWS))
    with pytest.raises(ConstraintViolationError, match="doubled"):
        _append(uri, spark.sql("SELECT 4L AS id, 4 AS v, 9 AS doubled"), app_id="bad")
    _upsert(uri, spark.createDataFrame([(1, 10, "U"), (4, 4, "I")], ROWS + ", op STRING"))
    DeltaSink(uri).compact(spark)
    expected = [(1, 10), (2, 2), (3, 3), (4, 4)]
    assert assert_all_read(spark, uri) == comparable(
        [{"id": i, "v": v, "doubled": 2 * v} for i, v in expected]
    )
    _overwrite(uri, spark.createDataFrame([(5, 5)], ROWS))
    assert assert_all_read(spark, uri) == [{"id": 5, "v": 5, "doubled": 10}]


def test_nested_not_null_holds_only_under_a_present_parent(delta_spark, tmp_path):
    """A NOT NULL field inside a nullable struct: a null field under a present struct is
    refused; a null struct is written. delta-spark 4.4 refuses the null struct too
    (delta-io/delta#860, an acknowledged delta-spark bug); it reads the row back."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(spark, uri, "id BIGINT, s STRUCT<a: INT NOT NULL, b: STRING>")
    with pytest.raises(NullConstraintError, match=r"'s\.a'"):
        _append(
            uri, spark.sql("SELECT 1L AS id, named_struct('a', CAST(NULL AS INT), 'b', 'x') AS s")
        )
    _append(uri, spark.sql("SELECT 2L AS id, CAST(NULL AS STRUCT<a: INT, b: STRING>) AS s"))
    expected = [{"id": 2, "s": None}]
    # Read by rows: pyspark's toArrow cannot convert a null struct whose field is NOT NULL.
    by_spark = spark.read.format("delta").load(uri).collect()
    assert [row.asDict(recursive=True) for row in by_spark] == expected
    assert delta_rs_rows(uri) == comparable(duckdb_rows(uri)) == expected


def test_char_and_varchar_lengths_are_enforced(delta_spark, tmp_path):
    """delta-spark records CHAR(n) / VARCHAR(n) as field metadata on string columns. The sink
    refuses a longer value (append and upsert, nothing committed; delta-spark refuses it too,
    trailing spaces included) and stores the others as delta-spark does: as given, a CHAR
    value unpadded (delta-spark pads it when it reads)."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(
        spark,
        uri,
        "id BIGINT, c CHAR(3), v VARCHAR(5)",
        "INSERT INTO {t} VALUES (1, 'ab', 'abcde')",
    )
    too_long = {
        r"varchar\(5\) column 'v' holds at most 5 characters": "'abcdefgh' AS v, 'a' AS c",
        r"char\(3\) column 'c' holds at most 3 characters": "'abc' AS v, 'abc ' AS c",
    }
    for message, values in too_long.items():
        with pytest.raises(ConstraintViolationError, match=message):
            _append(uri, spark.sql(f"SELECT 2L AS id, {values}"))
    with pytest.raises(ConstraintViolationError, match=r"varchar\(5\) column 'v'"):
        _upsert(uri, spark.sql("SELECT 1L AS id, 'a' AS c, 'abcdef' AS v, 'U' AS op"))
    assert _log_version(uri) == 1
    _append(uri, spark.sql("SELECT 2L AS id, 'ab' AS c, 'abcde' AS v"))
    _append(uri, spark.sql("SELECT 3L AS id, 'abc' AS c, 'ab ' AS v"))
    _upsert(uri, spark.sql("SELECT 4L AS id, 'd' AS c, 'd' AS v, 'I' AS op"))
    # delta-spark stores CHAR values as given (its own row 1 too) and pads them when it reads.
    stored = [("ab", "abcde"), ("ab", "abcde"), ("abc", "ab "), ("d", "d")]
    expected = [{"id": i, "c": c, "v": v} for i, (c, v) in enumerate(stored, start=1)]
    assert delta_rs_rows(uri) == expected
    assert comparable(duckdb_rows(uri)) == expected
    padded = [{**row, "c": row["c"].ljust(3)} for row in expected]
    assert spark_rows(spark, uri) == padded
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (5, 'e', 'e')")  # delta-spark writes on
    assert len(spark_rows(spark, uri)) == 5


def test_lengths_inside_nested_types_are_refused(delta_spark, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(spark, uri, "id BIGINT, a ARRAY<VARCHAR(3)>")
    with pytest.raises(UnsupportedTypeError, match=r"'a' is declared array<varchar\(3\)>"):
        _append(uri, spark.sql("SELECT 1L AS id, array('abcd') AS a"))
    assert _log_version(uri) == 0


def test_an_append_only_table(delta_spark, tmp_path):
    """delta.appendOnly: appends and compactions (which change no data) work, the upsert is
    refused before anything is written."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _id_v_table(
        spark, uri, "INSERT INTO {t} VALUES (1, 1)", properties="'delta.appendOnly' = 'true'"
    )
    _append(uri, spark.createDataFrame([(2, 2)], ROWS))
    version = _log_version(uri)
    with pytest.raises(UnsupportedTableFeatureError, match="append-only"):
        _upsert(uri, spark.createDataFrame([(1, 10, "U")], ROWS + ", op STRING"))
    assert _log_version(uri) == version
    assert DeltaSink(uri).compact(spark).files_removed == 2
    assert assert_all_read(spark, uri) == [{"id": 1, "v": 1}, {"id": 2, "v": 2}]


def test_a_rewrite_of_an_append_only_table_is_refused_before_anything(delta_spark, tmp_path):
    """An overwrite (whole table, replace_where on partitions or on data) and a complete-mode
    batch would remove rows, which delta.appendOnly forbids: each is refused before it stages
    anything, naming append-only (delta-rs would refuse the commit only after the work)."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(
        spark,
        uri,
        "id BIGINT, day STRING",
        "INSERT INTO {t} VALUES (1, 'd0')",
        clauses="PARTITIONED BY (day) TBLPROPERTIES ('delta.appendOnly' = 'true')",
    )
    files = data_files(uri)
    rows = spark.createDataFrame([(2, "d0")], "id BIGINT, day STRING")
    for replace_where in (None, "day = 'd0'", "id = 1"):
        with pytest.raises(UnsupportedTableFeatureError, match=r"append-only .*mode='overwrite'"):
            _overwrite(uri, rows, replace_where=replace_where)
    src = make_source(tmp_path, 1)
    sink = TwoPhaseSink(DeltaSink(uri, app_id="totals"))
    query = sink.write_stream(
        file_stream(spark, src).groupBy("day").agg(F.max("id").alias("id")),
        checkpoint_location=str(tmp_path / "chk"),
        output_mode="complete",
        trigger={"availableNow": True},
    )
    with pytest.raises(StreamingQueryException):
        query.awaitTermination()
    error = sink.failure(query)
    assert isinstance(error, UnsupportedTableFeatureError), error
    assert "append-only" in str(error) and "output_mode='complete'" in str(error)
    assert (_log_version(uri), data_files(uri)) == (1, files)
    assert assert_all_read(spark, uri) == [{"id": 1, "day": "d0"}]


@pytest.mark.parametrize(("mode", "compaction"), [("name", "arrow"), ("id", "spark")])
def test_column_mapping_with_renamed_and_dropped_columns(delta_spark, tmp_path, mode, compaction):
    """Appends (Spark's writer and Python's), compaction and overwrites write physical names
    and field ids (nested ones too, partition values keyed by physical name, the Python
    writers' files under random prefixes, Spark's under Hive directories); the compaction
    matches a renamed column by its physical name and carries no data of a dropped column
    over (upserts: ``test_interop_column_mapping_upsert.py``).
    delta-spark and delta-rs's DataFusion reader agree (DuckDB reads the partition
    column of such tables as NULL, deltalake's pyarrow dataset does not map names)."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(
        spark,
        uri,
        "id BIGINT, v INT, gone STRING, s STRUCT<a: INT, b: STRING>, day STRING",
        "INSERT INTO {t} VALUES (1, 1, 'a', named_struct('a', 1, 'b', 'x'), 'd1'), "
        "(2, 2, 'b', named_struct('a', 2, 'b', 'y'), 'd2')",
        "ALTER TABLE {t} RENAME COLUMN v TO value",
        "ALTER TABLE {t} RENAME COLUMN s.b TO bee",
        "ALTER TABLE {t} DROP COLUMN gone",
        clauses=f"PARTITIONED BY (day) TBLPROPERTIES ('delta.columnMapping.mode' = '{mode}')",
    )
    mapped = "id BIGINT, value INT, s STRUCT<a: INT, bee: STRING>, day STRING"
    for i, staging in ((3, "spark"), (4, "arrow")):
        rows = spark.createDataFrame([(i, i, (i, f"z{i}"), "d1")], mapped)
        TwoPhaseSink(DeltaSink(uri, app_id=f"a{i}", staging=staging)).write(rows)

    def row(i: int, bee: str, day: str) -> dict:
        return {"id": i, "value": i, "s": {"a": i, "bee": bee}, "day": day}

    expected = [row(1, "x", "d1"), row(2, "y", "d2"), row(3, "z3", "d1"), row(4, "z4", "d1")]

    def read() -> list[dict]:
        by_spark = spark_rows(spark, uri)
        query = QueryBuilder().register("t", DeltaTable(uri)).execute("SELECT * FROM t")
        assert comparable(pa.table(query).to_pylist()) == by_spark
        return by_spark

    assert read() == comparable(expected)
    version = _log_version(uri)
    result = DeltaSink(uri, staging=compaction).compact(spark)
    assert result.version == version + 1
    assert read() == comparable(expected)
    fields = {f["name"]: f for f in json.loads(DeltaTable(uri).schema().to_json())["fields"]}
    physical = {n: f["metadata"]["delta.columnMapping.physicalName"] for n, f in fields.items()}
    log_file = Path(uri) / "_delta_log" / f"{version + 1:020d}.json"
    commit = [json.loads(line) for line in log_file.read_text().splitlines()]
    adds = [a["add"] for a in commit if "add" in a]
    assert len(adds) == 1 and set(adds[0]["partitionValues"]) == {physical["day"]}
    data_columns = {physical[n] for n in ("id", "value", "s")}
    assert set(json.loads(adds[0]["stats"])["minValues"]) == data_columns
    written = pq.read_schema(Path(uri) / adds[0]["path"])
    assert written.names == [physical["id"], physical["value"], physical["s"]]  # no `gone`
    nested = {f["name"]: f["metadata"] for f in fields["s"]["type"]["fields"]}
    struct = written.field(physical["s"]).type
    assert [struct.field(i).name for i in range(struct.num_fields)] == [
        nested[n]["delta.columnMapping.physicalName"] for n in ("a", "bee")
    ]
    assert [written.field(n).metadata[b"PARQUET:field_id"] for n in written.names] == [
        str(fields[n]["metadata"]["delta.columnMapping.id"]).encode() for n in ("id", "value", "s")
    ]
    assert [struct.field(i).metadata[b"PARQUET:field_id"] for i in range(2)] == [
        str(nested[n]["delta.columnMapping.id"]).encode() for n in ("a", "bee")
    ]
    spark.sql(f"ALTER TABLE delta.`{uri}` ADD COLUMNS (gone STRING)")  # a new column: all null
    assert {r["gone"] for r in spark.read.format("delta").load(uri).collect()} == {None}
    _overwrite(uri, spark.createDataFrame([(5, 5, (5, "o"), "d3")], mapped))
    assert read() == comparable([{**row(5, "o", "d3"), "gone": None}])


def test_deletion_vectors(delta_spark, tmp_path):
    """After delta-spark's DELETE left a deletion vector: appends work, an upsert rewrites the
    file without the deleted row and removes it together with its vector, and so does an
    overwrite (more in test_interop_deletion_vectors_upsert.py and _rewrite.py)."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _id_v_table(
        spark,
        uri,
        "INSERT INTO {t} VALUES (1, 1), (2, 2), (3, 3)",
        "DELETE FROM {t} WHERE id = 2",
        properties="'delta.enableDeletionVectors' = 'true'",
    )
    (with_vector,) = [a for a in _log_actions(uri, 2, "add") if a.get("deletionVector")]
    _append(uri, spark.createDataFrame([(4, 4)], ROWS))
    expected = [{"id": i, "v": i} for i in (1, 3, 4)]
    assert _read_by_spark_and_duckdb(spark, uri) == comparable(expected)

    # (1 and 3 both changed: whichever the vector's file holds besides 2 is touched)
    _upsert(uri, spark.createDataFrame([(1, 10, "U"), (3, 30, "U")], ROWS + ", op STRING"))
    removed = {r["path"]: r for r in _log_actions(uri, _log_version(uri), "remove")}
    assert removed[with_vector["path"]]["deletionVector"] == with_vector["deletionVector"]
    expected = [{"id": 1, "v": 10}, {"id": 3, "v": 30}, {"id": 4, "v": 4}]
    assert _read_by_spark_and_duckdb(spark, uri) == comparable(expected)  # 2 stays deleted

    spark.sql(f"DELETE FROM delta.`{uri}` WHERE id = 3")  # a vector on a file of the upsert's
    (with_vector,) = [
        a for a in _log_actions(uri, _log_version(uri), "add") if a.get("deletionVector")
    ]
    result = _overwrite(uri, spark.createDataFrame([(5, 5)], ROWS))
    removed = {r["path"]: r for r in _log_actions(uri, result.version, "remove")}
    assert removed[with_vector["path"]]["deletionVector"] == with_vector["deletionVector"]
    assert _read_by_spark_and_duckdb(spark, uri) == [{"id": 5, "v": 5}]


def test_change_data_feed(delta_spark, tmp_path):
    """On a table with the change data feed on, delta-spark's feed shows the sink's append as
    inserts, its upsert's update as a pre- and a post-image (from its change files), its
    overwrite as deletes and inserts, and nothing of its compaction (test_interop_cdf_write.py
    covers every operation)."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _id_v_table(
        spark,
        uri,
        "INSERT INTO {t} VALUES (1, 1)",
        properties="'delta.enableChangeDataFeed' = 'true'",
    )
    appended = _append(uri, spark.createDataFrame([(2, 2)], ROWS)).version
    _append(uri, spark.createDataFrame([(3, 3)], ROWS))
    upserted = _upsert(uri, spark.createDataFrame([(1, 10, "U")], ROWS + ", op STRING")).version
    compacted = DeltaSink(uri).compact(spark).version
    overwritten = _overwrite(uri, spark.createDataFrame([(4, 4)], ROWS)).version
    assert assert_all_read(spark, uri) == [{"id": 4, "v": 4}]

    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", appended)
        .load(uri)
        .select("id", "_change_type", "_commit_version")
        .collect()
    )
    assert sorted(tuple(row) for row in feed) == sorted(
        [
            (2, "insert", appended),
            (3, "insert", appended + 1),
            (1, "update_preimage", upserted),
            (1, "update_postimage", upserted),
            *[(i, "delete", overwritten) for i in (1, 2, 3)],
            (4, "insert", overwritten),
        ]
    )
    assert compacted not in {row["_commit_version"] for row in feed}


def test_v2_checkpoints(delta_spark, tmp_path):
    """A table with v2 checkpoints (sidecar files): every operation works, and the
    checkpoints delta-rs writes at the table's interval carry the v2 checkpoint metadata."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    top_level = "spark.databricks.delta.checkpointV2.topLevelFileFormat"
    spark.conf.set(top_level, "json")
    try:
        _id_v_table(
            spark,
            uri,
            "INSERT INTO {t} VALUES (1, 1)",
            "INSERT INTO {t} VALUES (2, 2)",
            "INSERT INTO {t} VALUES (5, 5)",
            properties="'delta.checkpointPolicy' = 'v2', 'delta.checkpointInterval' = '2'",
        )
    finally:
        spark.conf.unset(top_level)
    assert list((Path(uri) / "_delta_log" / "_sidecars").glob("*.parquet"))
    assert list((Path(uri) / "_delta_log").glob("00000000000000000002.checkpoint.*.json"))
    # The sink's log view (the flat commit path) starts from the UUID-named v2 checkpoint.
    view = LogView.load(LogStore(TableLocation.of(uri)))
    assert (view.version, "v2Checkpoint" in view.writer_features) == (3, True)
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE id = 5")
    _append(uri, spark.createDataFrame([(3, 3)], ROWS))
    _upsert(uri, spark.createDataFrame([(1, 10, "U"), (2, 0, "D")], ROWS + ", op STRING"))
    DeltaSink(uri).compact(spark)
    expected = [{"id": 1, "v": 10}, {"id": 3, "v": 3}]
    assert _read_by_spark_and_duckdb(spark, uri) == comparable(expected)
    _overwrite(uri, spark.createDataFrame([(4, 4)], ROWS))
    assert _read_by_spark_and_duckdb(spark, uri) == [{"id": 4, "v": 4}]
    # delta-rs checkpoints at the table's interval, classic-named, following the v2 spec.
    ours = sorted((Path(uri) / "_delta_log").glob("*.checkpoint.parquet"))
    assert ours
    for checkpoint in ours:
        metadata = pq.read_table(checkpoint, columns=["checkpointMetadata"]).column(0)
        assert {"version": int(checkpoint.name[:20])} in metadata.to_pylist()


# Features the sink refuses: the table delta-spark makes, and the feature the error must name.
REFUSED = {
    "vacuum protocol check": (
        "id BIGINT, v INT",
        (),
        "TBLPROPERTIES ('delta.feature.vacuumProtocolCheck' = 'supported')",
        "vacuumProtocolCheck",
    ),
}


@pytest.mark.parametrize("feature", sorted(REFUSED))
def test_features_the_sink_cannot_honour_are_refused_before_anything_is_written(
    delta_spark, tmp_path, feature
):
    spark = delta_spark
    uri = str(tmp_path / "t")
    columns, statements, clauses, named = REFUSED[feature]
    _create(
        spark, uri, columns, "INSERT INTO {t} (id, v) VALUES (1, 1)", *statements, clauses=clauses
    )
    version, files = _log_version(uri), data_files(uri)
    before = spark_rows(spark, uri)
    v_type = spark.read.format("delta").load(uri).schema["v"].dataType.simpleString()
    rows = spark.sql(f"SELECT 2L AS id, CAST(2 AS {v_type}) AS v, 'U' AS op")
    attempts = {
        "append": lambda: _append(uri, rows.drop("op")),
        "upsert": lambda: _upsert(uri, rows),
        "overwrite": lambda: _overwrite(uri, rows.drop("op")),
        "compaction": lambda: DeltaSink(uri).compact(spark),
    }
    for operation, attempt in attempts.items():
        with pytest.raises(UnsupportedTableFeatureError, match=named):
            attempt()
        assert (_log_version(uri), data_files(uri)) == (version, files), operation
    assert spark_rows(spark, uri) == before
