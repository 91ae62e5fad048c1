"""Bad input on real Spark: each gets a clear error; nothing is committed, nothing staged is
left behind, and the table stays readable."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from committers.delta import DeltaSink
from committers.tests._delta_helpers import assert_no_orphans, committed_files, ids, read_rows
from framework import TwoPhaseSink
from framework.errors import (
    LocationNotWritableError,
    NotATableError,
    NullConstraintError,
    SchemaMismatchError,
    SinkError,
    UnsupportedTypeError,
)

pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("each_staging")]


@pytest.fixture
def table_with_rows(spark, tmp_path):
    """A table (id BIGINT NOT NULL, day STRING) holding ids 0..9, partitioned by day. Created
    first by delta-rs: a table the sink creates has nullable columns, as delta-spark's do."""
    table = str(tmp_path / "table")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("day", pa.string())])
    DeltaTable.create(table, schema=schema, partition_by=["day"])
    df = spark.range(0, 10).selectExpr("id", "cast(id % 2 as string) as day")
    TwoPhaseSink(DeltaSink(table, app_id="good", partition_by=["day"])).write(df)
    return table


def _assert_unchanged(table: str, version: int = 1) -> None:
    assert DeltaTable(table).version() == version
    assert ids(table) == list(range(10))
    assert_no_orphans(table)


def test_schema_mismatch_fails_before_anything_is_staged(spark, table_with_rows):
    df = spark.range(0, 5).selectExpr("cast(id as string) as id", "cast(id as string) as day")
    sink = TwoPhaseSink(DeltaSink(table_with_rows, app_id="bad", partition_by=["day"]))
    with pytest.raises(
        SchemaMismatchError, match="column 'id' is STRING in the input but BIGINT in the table"
    ):
        sink.write(df)
    _assert_unchanged(table_with_rows)


def test_new_column_is_rejected_by_default_and_merged_on_request(spark, table_with_rows):
    df = spark.range(10, 15).selectExpr("id", "cast(id % 2 as string) as day", "'x' as note")
    with pytest.raises(SchemaMismatchError, match="schema_mode='merge'"):
        TwoPhaseSink(DeltaSink(table_with_rows, app_id="new", partition_by=["day"])).write(df)
    _assert_unchanged(table_with_rows)

    merging = DeltaSink(table_with_rows, app_id="new", partition_by=["day"], schema_mode="merge")
    TwoPhaseSink(merging).write(df)
    rows = read_rows(table_with_rows)
    assert sorted(r["id"] for r in rows if r["note"] == "x") == list(range(10, 15))
    assert sorted(r["id"] for r in rows if r["note"] is None) == list(range(10))


def test_null_in_non_nullable_column_commits_nothing(spark, table_with_rows):
    df = spark.createDataFrame([(100, "0"), (None, "1")], "id BIGINT, day STRING")
    sink = TwoPhaseSink(DeltaSink(table_with_rows, app_id="nulls", partition_by=["day"]))
    with pytest.raises(NullConstraintError, match="NOT NULL column 'id' is violated by a row"):
        sink.write(df)
    _assert_unchanged(table_with_rows)


def test_missing_partition_column(spark, tmp_path):
    df = spark.range(0, 5)
    with pytest.raises(SchemaMismatchError, match="partition column 'day' is not in the input"):
        TwoPhaseSink(DeltaSink(str(tmp_path / "t"), partition_by=["day"])).write(df)
    assert not (tmp_path / "t").exists()


def test_partitioning_differs_from_existing_table(spark, table_with_rows):
    df = spark.range(0, 5).selectExpr("id", "cast(id % 2 as string) as day")
    with pytest.raises(SchemaMismatchError, match="partitioned by"):
        TwoPhaseSink(DeltaSink(table_with_rows, app_id="p", partition_by=["id"])).write(df)
    _assert_unchanged(table_with_rows)


def test_appending_without_partition_by_uses_the_tables_partitioning(spark, table_with_rows):
    df = spark.range(10, 14).selectExpr("id", "cast(id % 2 as string) as day")
    TwoPhaseSink(DeltaSink(table_with_rows, app_id="p")).write(df)
    assert ids(table_with_rows) == list(range(14))
    # under the table root ("arrow") or a run directory ("spark"): day=<value>/<file>
    assert all(path.split("/")[-2].startswith("day=") for path in committed_files(table_with_rows))


@pytest.mark.parametrize(
    "expression",
    ["interval '1' day as span", "null as nothing", "cast(1 as tinyint) as ok, parse_json('1') v"],
)
def test_unsupported_types(spark, tmp_path, expression):
    df = spark.range(0, 3).selectExpr("id", *expression.split(", "))
    with pytest.raises(UnsupportedTypeError, match="Cast"):
        TwoPhaseSink(DeltaSink(str(tmp_path / "t"))).write(df)
    assert not (tmp_path / "t").exists()


def test_directory_that_is_not_a_delta_table(spark, tmp_path):
    target = tmp_path / "not-delta"
    target.mkdir()
    (target / "data.csv").write_text("a,b\n1,2\n")
    with pytest.raises(NotATableError, match="not a Delta table"):
        TwoPhaseSink(DeltaSink(str(target))).write(spark.range(0, 3))
    assert sorted(p.name for p in target.iterdir()) == ["data.csv"]


def test_unwritable_location(spark, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(LocationNotWritableError, match="cannot create a Delta table"):
        TwoPhaseSink(DeltaSink(str(blocker / "table"))).write(spark.range(0, 3))


def test_errors_share_one_root(spark, tmp_path):
    with pytest.raises(SinkError):
        TwoPhaseSink(DeltaSink(str(tmp_path / "t"), partition_by=["nope"])).write(spark.range(1))
