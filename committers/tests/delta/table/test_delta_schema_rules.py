"""Delta's schema-enforcement rules as delta-spark users know them, on tables delta-rs made:
the table's partitioning is inherited, missing nullable columns are null, names match ignoring
case (the table's spelling kept), new tables are nullable, type errors say which cast helps,
and delta-spark's option names get an error naming ours. Read back by deltalake and DuckDB.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from committers.delta import DeltaSink
from committers.tests._delta_helpers import assert_no_orphans, read_rows
from committers.tests._readers import duckdb_rows
from framework import TwoPhaseSink
from framework.errors import ConfigurationError, NullConstraintError, SchemaMismatchError

pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("each_staging")]


def _rows_both_ways(table: str) -> list[dict]:
    """The rows as deltalake reads them (by id, nulls last), after checking DuckDB reads the
    same."""
    rows = read_rows(table)
    key = "Id" if rows and "Id" in rows[0] else "id"

    def order(row: dict) -> tuple[bool, int]:
        return (row[key] is None, row[key] or 0)

    rows.sort(key=order)
    assert sorted(duckdb_rows(table), key=order) == rows
    return rows


def test_appending_without_partition_by_uses_the_tables_partitioning(spark, tmp_path):
    table = str(tmp_path / "t")
    DeltaTable.create(
        table, schema=pa.schema([("id", pa.int64()), ("day", pa.string())]), partition_by=["day"]
    )
    df = spark.range(0, 4).selectExpr("id", "cast(id % 2 as string) as day")
    TwoPhaseSink(DeltaSink(table, app_id="a")).write(df)
    TwoPhaseSink(DeltaSink(table, app_id="b", partition_by=["DAY"])).write(
        spark.range(4, 6).selectExpr("id", "'9' as day")
    )
    adds = pa.table(DeltaTable(table).get_add_actions(flatten=True)).to_pylist()
    assert sorted({add["partition.day"] for add in adds}) == ["0", "1", "9"]
    assert [(r["id"], r["day"]) for r in _rows_both_ways(table)] == [
        (0, "0"),
        (1, "1"),
        (2, "0"),
        (3, "1"),
        (4, "9"),
        (5, "9"),
    ]
    with pytest.raises(SchemaMismatchError, match=r"partitioned by \['day'\]"):
        TwoPhaseSink(DeltaSink(table, app_id="c", partition_by=["id"])).write(df)


def test_a_missing_nullable_column_is_written_as_null(spark, tmp_path):
    table = str(tmp_path / "t")
    schema = pa.schema(
        [pa.field("id", pa.int64(), nullable=False), ("note", pa.string()), ("score", pa.float64())]
    )
    DeltaTable.create(table, schema=schema)
    TwoPhaseSink(DeltaSink(table, app_id="a")).write(
        spark.range(0, 3).selectExpr("id", "'x' as note")
    )
    assert _rows_both_ways(table) == [{"id": i, "note": "x", "score": None} for i in range(3)]


def test_names_match_ignoring_case_and_keep_the_tables_spelling(spark, tmp_path):
    table = str(tmp_path / "t")
    info = pa.struct([pa.field("Code", pa.int32()), pa.field("Label", pa.string())])
    schema = pa.schema([("Id", pa.int64()), ("Name", pa.string()), ("Info", info)])
    DeltaTable.create(table, schema=schema)
    df = spark.range(0, 3).selectExpr(
        "id AS ID",
        "concat('n', id) AS name",
        "named_struct('code', cast(id AS int), 'LABEL', 'l') AS info",
    )
    TwoPhaseSink(DeltaSink(table, app_id="a")).write(df)

    assert DeltaTable(table).schema().to_arrow().names == ["Id", "Name", "Info"]
    assert _rows_both_ways(table) == [
        {"Id": i, "Name": f"n{i}", "Info": {"Code": i, "Label": "l"}} for i in range(3)
    ]
    with pytest.raises(SchemaMismatchError, match=r"'extra'.*schema_mode='merge'"):
        TwoPhaseSink(DeltaSink(table, app_id="b")).write(df.selectExpr("*", "1 AS extra"))


def test_a_new_table_has_nullable_columns(spark, tmp_path):
    table = str(tmp_path / "t")
    df = spark.range(0, 3).selectExpr("id", "named_struct('x', id) AS s")
    assert not df.schema["id"].nullable  # spark.range ids are NOT NULL in Spark
    TwoPhaseSink(DeltaSink(table, app_id="a")).write(df)
    schema = pa.schema(DeltaTable(table).schema().to_arrow())
    assert schema.field("id").nullable and schema.field("s").type.field("x").nullable
    nulls = spark.createDataFrame([(None, None)], "id BIGINT, s STRUCT<x: BIGINT>")
    TwoPhaseSink(DeltaSink(table, app_id="b")).write(nulls)
    assert sorted(r["id"] for r in _rows_both_ways(table) if r["id"] is not None) == [0, 1, 2]


def test_a_nested_not_null_field_accepts_nullable_input_without_nulls(spark, tmp_path):
    # "auto": Spark's writer cannot write NOT NULL struct fields, so the Python writers do.
    table = str(tmp_path / "t")
    nested = pa.struct([pa.field("x", pa.int64(), nullable=False)])
    DeltaTable.create(table, schema=pa.schema([("id", pa.int64()), ("s", nested)]))
    given = spark.createDataFrame([(1, (10,)), (2, None)], "id BIGINT, s STRUCT<x: BIGINT>")
    TwoPhaseSink(DeltaSink(table, app_id="a", staging="auto")).write(given)
    assert _rows_both_ways(table) == [{"id": 1, "s": {"x": 10}}, {"id": 2, "s": None}]
    broken = spark.createDataFrame([(3, (None,))], "id BIGINT, s STRUCT<x: BIGINT>")
    with pytest.raises(NullConstraintError, match=r"'s\.x'"):
        TwoPhaseSink(DeltaSink(table, app_id="b", staging="auto")).write(broken)
    assert DeltaTable(table).version() == 1
    assert_no_orphans(table)


def test_a_type_mismatch_names_the_cast_that_fixes_it(spark, tmp_path):
    table = str(tmp_path / "t")
    DeltaTable.create(
        table, schema=pa.schema([("id", pa.int64()), ("amount", pa.decimal128(10, 2))])
    )
    df = spark.range(0, 3).selectExpr("cast(id AS string) AS id", "1.5D AS amount")
    with pytest.raises(SchemaMismatchError) as caught:
        TwoPhaseSink(DeltaSink(table, app_id="a")).write(df)
    message = str(caught.value)
    assert "df.withColumn('id', col('id').cast('BIGINT'))" in message
    assert "df.withColumn('amount', col('amount').cast('DECIMAL(10, 2)'))" in message
    assert "schema_mode" not in message  # merging cannot change a column's type
    assert DeltaTable(table).version() == 0
    assert_no_orphans(table)


@pytest.mark.parametrize(
    ("option", "advice"),
    [
        ({"mergeSchema": True}, "schema_mode='merge'"),
        ({"replaceWhere": "day = 'd1'"}, "mode='overwrite', replace_where="),
        ({"options": {"compression": "zstd"}}, "keyword argument of DeltaSink"),
        ({"partitionBy": ["day"]}, "partition_by="),
    ],
)
def test_delta_spark_spellings_are_answered_with_ours(tmp_path, option, advice):
    with pytest.raises(ConfigurationError, match="a Spark or delta-spark writer option") as caught:
        DeltaSink(str(tmp_path / "t"), **option)
    assert advice in str(caught.value)


def test_writer_spellings_and_typos_are_answered(spark, tmp_path):
    sink = TwoPhaseSink(DeltaSink(str(tmp_path / "t"), app_id="a"))
    with pytest.raises(
        ConfigurationError, match=r"one of the sink's own options .*mode='overwrite'"
    ):
        sink.write(spark.range(1), mode="overwrite")
    with pytest.raises(ConfigurationError, match="DeltaSink"):
        sink.write(spark.range(1), options={"mergeSchema": "true"})
    with pytest.raises(TypeError, match="did you mean compression"):
        DeltaSink(str(tmp_path / "t"), compresion="zstd")
    assert not (tmp_path / "t").exists()
