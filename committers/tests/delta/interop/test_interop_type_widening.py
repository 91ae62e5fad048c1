"""Type widening (the ``typeWidening`` reader and writer feature) on tables delta-spark widened
with ``ALTER TABLE ... CHANGE COLUMN ... TYPE``: files written before a change hold the narrower
type. ``read_table`` (Spark's scan) and the ``"deltalake"`` format (pyarrow) read them as the
current types, and every write of the sink (appends by both stagings, upserts rewriting a
narrow file with Python tasks and with Spark, ``replace_where``, compaction) writes the
current types and keeps ``delta.typeChanges``; delta-spark is the judge (DuckDB a second
reader) and goes on writing after (INSERT, MERGE, OPTIMIZE). A type
change the protocol does not allow is refused by name, for reading and writing."""

from __future__ import annotations

import decimal
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from committers.delta import DeltaSink, UnsupportedTableFeatureError, read_table, register
from committers.tests._delta_helpers import log_actions
from committers.tests._delta_spark import comparable, spark_rows
from committers.tests._readers import duckdb_rows
from committers.tests.delta.interop.test_interop_delta_spark_write import _create
from framework import TwoPhaseSink
from framework.errors import SchemaMismatchError

pytestmark = pytest.mark.spark

NARROW = "id INT, f FLOAT, m DECIMAL(5,2), s SHORT, st STRUCT<x: INT>, p INT"
WIDE = "id BIGINT, f DOUBLE, m DECIMAL(10,4), s INT, st STRUCT<x: BIGINT>, p INT"
WIDENINGS = (
    "ALTER TABLE {t} CHANGE COLUMN id TYPE BIGINT",
    "ALTER TABLE {t} CHANGE COLUMN f TYPE DOUBLE",
    "ALTER TABLE {t} CHANGE COLUMN m TYPE DECIMAL(10,4)",
    "ALTER TABLE {t} CHANGE COLUMN s TYPE INT",
    "ALTER TABLE {t} CHANGE COLUMN st.x TYPE BIGINT",
)


def _row(i: int, big: bool = False) -> dict:
    """Row ``i``: values that fit the narrow types, or (``big``) only the wide ones."""
    scale = 3_000_000_000 if big else 1
    return {
        "id": i * scale,
        "f": i + 0.25,
        "m": decimal.Decimal(f"{i * (1000 if big else 1)}.1234" if big else f"{i}.5000"),
        "s": i * (100_000 if big else 1),
        "st": {"x": i * scale},
        "p": i % 2,
    }


def _widened_table(spark, uri: str) -> None:  # type: ignore[no-untyped-def]
    """Rows 1-4 in files of the narrow types, then every column widened."""
    _create(
        spark,
        uri,
        NARROW,
        "INSERT INTO {t} VALUES (1, 1.25, 1.5, 1, named_struct('x', 1), 1), "
        "(2, 2.25, 2.5, 2, named_struct('x', 2), 0)",
        "INSERT INTO {t} VALUES (3, 3.25, 3.5, 3, named_struct('x', 3), 1), "
        "(4, 4.25, 4.5, 4, named_struct('x', 4), 0)",
        *WIDENINGS,
        clauses="PARTITIONED BY (p) TBLPROPERTIES ('delta.enableTypeWidening' = 'true')",
    )


def _schema(uri: str) -> dict:
    return json.loads(DeltaTable(uri).schema().to_json())


def _frame(spark, rows: list[dict], extra: str = ""):  # type: ignore[no-untyped-def]
    return spark.createDataFrame([tuple(r.values()) for r in rows], WIDE + extra)


def _assert_read_by_all(spark, uri: str, expected: list[dict]) -> None:  # type: ignore[no-untyped-def]
    """delta-spark, DuckDB, ``read_table`` and the ``"deltalake"`` format read ``expected``
    (deltalake's own reader refuses the feature)."""
    register(spark)
    assert spark_rows(spark, uri) == comparable(expected)
    assert comparable(duckdb_rows(uri)) == comparable(expected)
    assert comparable(read_table(spark, uri).toArrow().to_pylist()) == comparable(expected)
    by_format = spark.read.format("deltalake").load(uri).toArrow().to_pylist()
    assert comparable(by_format) == comparable(expected)


def test_widened_files_are_read_as_the_current_types(delta_spark, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    _widened_table(spark, uri)
    spark.sql(
        f"INSERT INTO delta.`{uri}` VALUES (15000000000, 5.25, 5000.1234, 500000, "
        "named_struct('x', 15000000000), 1)"
    )
    narrow_file = Path(uri) / log_actions(uri, "add")[0]["path"]
    assert str(pq.read_schema(narrow_file).field("id").type) == "int32"
    expected = [_row(i) for i in (1, 2, 3, 4)]
    expected.append({**_row(5, big=True), "m": decimal.Decimal("5000.1234")})
    _assert_read_by_all(spark, uri, expected)


def test_every_write_of_a_widened_table_writes_the_current_types(delta_spark, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    _widened_table(spark, uri)
    schema, protocol = _schema(uri), repr(DeltaTable(uri).protocol())
    expected = {i: _row(i) for i in (1, 2, 3, 4)}

    for staging, i in (("spark", 5), ("arrow", 6)):  # appends beyond the narrow ranges
        big = _row(i, big=True)
        TwoPhaseSink(DeltaSink(uri, app_id=f"a-{staging}", staging=staging)).write(
            _frame(spark, [big])
        )
        expected[i] = big
        (add,) = log_actions(uri, "add", first=DeltaTable(uri).version())
        assert str(pq.read_schema(Path(uri) / add["path"]).field("id").type) == "int64"
    for staging, i in (("auto", 1), ("spark", 3)):  # upserts copying narrow rows
        changed = {**_row(i, big=True), "p": i % 2}
        sink = DeltaSink(
            uri,
            app_id=f"u-{staging}",
            mode="upsert",
            keys=["id"],
            staging=staging,
            deletion_vectors="off",
        )
        key = _frame(spark, [{**changed, "id": i}])
        TwoPhaseSink(sink).write(key)
        expected[i] = {**changed, "id": i}
    overwrite = DeltaSink(uri, mode="overwrite", replace_where="s = 2", deletion_vectors="off")
    TwoPhaseSink(overwrite).write(_frame(spark, [{**_row(7, big=True), "s": 2}]))
    del expected[2]
    expected[7] = {**_row(7, big=True), "s": 2}
    _assert_read_by_all(spark, uri, list(expected.values()))

    assert DeltaSink(uri).compact(spark).version is not None  # narrow and wide files together
    live = [Path(uri) / a["path"] for a in log_actions(uri, "add", first=DeltaTable(uri).version())]
    assert live and all(str(pq.read_schema(f).field("s").type) == "int32" for f in live)
    _assert_read_by_all(spark, uri, list(expected.values()))
    assert _schema(uri) == schema  # delta.typeChanges kept
    # delta-spark goes on writing: a MERGE and an OPTIMIZE over the sink's files
    spark.sql(
        f"MERGE INTO delta.`{uri}` t USING (SELECT 4L AS id, 40L AS s) u ON t.id = u.id "
        "WHEN MATCHED THEN UPDATE SET t.s = u.s"
    )
    spark.sql(f"OPTIMIZE delta.`{uri}`")
    expected[4] = {**expected[4], "s": 40}
    _assert_read_by_all(spark, uri, list(expected.values()))
    assert repr(DeltaTable(uri).protocol()) == protocol


def test_a_type_change_delta_does_not_allow_is_refused(delta_spark, tmp_path):
    """A log whose schema records narrowing a long to an int (written by hand, as a broken
    writer would): reads and writes are refused naming the column, nothing is written."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _widened_table(spark, uri)
    log = Path(uri) / "_delta_log"
    latest = DeltaTable(uri).version()
    (metadata,) = log_actions(uri, "metaData", first=latest)
    schema = json.loads(metadata["schemaString"])
    schema["fields"][0]["metadata"]["delta.typeChanges"] = [
        {"fromType": "long", "toType": "integer"}
    ]
    schema["fields"][0]["type"] = "integer"
    broken = {**metadata, "schemaString": json.dumps(schema)}
    (log / f"{latest + 1:020d}.json").write_text(json.dumps({"metaData": broken}) + "\n")
    with pytest.raises(UnsupportedTableFeatureError, match="id: long to integer"):
        read_table(spark, uri)
    with pytest.raises(UnsupportedTableFeatureError, match="id: long to integer"):
        TwoPhaseSink(DeltaSink(uri, app_id="a")).write(
            spark.createDataFrame([(1, 1.0, None, 1, None, 1)], NARROW)
        )
    assert DeltaTable(uri).version() == latest + 1


def test_a_schema_merge_widens_columns_and_adds_new_ones(delta_spark, tmp_path):
    """``schema_mode="merge"`` into a table that enables type widening: input columns of a
    wider type widen the table's (the change recorded in ``delta.typeChanges``, committed by
    the sink's log writer before the data), a new column is added, the batch lands once
    (a replay changes nothing), and delta-spark reads old and new rows in the new types and
    appends after. Where the table does not enable widening, the wider input is refused and
    nothing is written."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(
        spark,
        uri,
        "id INT, v SHORT, m DECIMAL(5,2)",
        "INSERT INTO {t} VALUES (1, 1, 1.5)",
        clauses="TBLPROPERTIES ('delta.enableTypeWidening' = 'true')",
    )
    wider = spark.createDataFrame(
        [(3_000_000_000, 100_000, decimal.Decimal("12345.6789"), "new")],
        "id BIGINT, v INT, m DECIMAL(10,4), note STRING",
    )
    sink = DeltaSink(uri, app_id="merge", schema_mode="merge")
    TwoPhaseSink(sink).write(wider, epoch_id=0)
    version = DeltaTable(uri).version()
    TwoPhaseSink(sink).write(wider, epoch_id=0)  # a replay
    assert DeltaTable(uri).version() == version
    fields = {f["name"]: f for f in _schema(uri)["fields"]}
    assert {name: f["type"] for name, f in fields.items()} == {
        "id": "long",
        "v": "integer",
        "m": "decimal(10,4)",
        "note": "string",
    }
    assert fields["v"]["metadata"]["delta.typeChanges"] == [
        {"fromType": "short", "toType": "integer"}
    ]
    assert fields["id"]["metadata"]["delta.typeChanges"] == [
        {"fromType": "integer", "toType": "long"}
    ]
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (2, 2, 2.5, 'theirs')")
    expected = [
        {"id": 1, "v": 1, "m": decimal.Decimal("1.5000"), "note": None},
        {"id": 2, "v": 2, "m": decimal.Decimal("2.5000"), "note": "theirs"},
        {"id": 3_000_000_000, "v": 100_000, "m": decimal.Decimal("12345.6789"), "note": "new"},
    ]
    _assert_read_by_all(spark, uri, expected)

    fixed = str(tmp_path / "fixed")
    _create(spark, fixed, "id INT", "INSERT INTO {t} VALUES (1)")
    with pytest.raises(SchemaMismatchError, match="'id' is BIGINT in the input but INT"):
        TwoPhaseSink(DeltaSink(fixed, schema_mode="merge")).write(spark.range(1))
    assert DeltaTable(fixed).version() == 1
