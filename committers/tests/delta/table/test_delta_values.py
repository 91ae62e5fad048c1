"""Every value and name Spark can hold is written exactly or refused clearly, before anything
(the table included) is created; a failed first write leaves no table behind."""

from __future__ import annotations

import datetime
import decimal
import math
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from committers.delta import DeltaSink
from committers.tests._delta_helpers import assert_no_orphans, file_stats, ids
from committers.tests._readers import duckdb_rows
from framework import TwoPhaseSink
from framework.errors import ConstraintViolationError, InvalidSchemaError, SinkError

pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("each_staging")]

UTC = datetime.timezone.utc


def _write(table: Path, df, **kwargs):
    return TwoPhaseSink(DeltaSink(str(table), app_id="values", **kwargs)).write(df)


def _read(uri: str) -> list[dict]:
    """The rows, sorted by id, as deltalake's pyarrow dataset, its SQL engine and DuckDB read
    them (all three must agree)."""
    table = DeltaTable(uri)
    by_sql = pa.table(QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all())
    readers = [table.to_pyarrow_table().to_pylist(), by_sql.to_pylist(), duckdb_rows(uri)]
    first, *others = [sorted(map(_utc, rows), key=lambda r: r["id"]) for rows in readers]
    for other in others:
        assert repr(other) == repr(first)  # repr: NaN compares unequal to itself
    return first


def _utc(row: dict) -> dict:
    """Readers name UTC differently (UTC, Etc/UTC): one spelling for comparing."""

    def one(value):
        if isinstance(value, datetime.datetime) and value.tzinfo is not None:
            assert value.utcoffset() == datetime.timedelta(0)
            return value.replace(tzinfo=UTC)
        return value

    return {k: one(v) for k, v in row.items()}


def test_a_failed_first_write_leaves_no_table(spark, tmp_path):
    table = tmp_path / "t"
    failing = spark.range(0, 100, numPartitions=2).selectExpr(
        "id", "CASE WHEN id = 77 THEN raise_error('boom') ELSE 'x' END AS note"
    )
    with pytest.raises(Exception, match="boom"):
        _write(table, failing)
    assert not DeltaTable.is_deltatable(str(table))
    assert not list(table.rglob("*.parquet"))
    # The fixed job, with another schema, is not blocked by a table the failed one created.
    _write(table, spark.range(0, 5).selectExpr("id", "id * 2 AS doubled"))
    assert DeltaTable(str(table)).version() == 0
    assert ids(str(table)) == list(range(5))
    assert_no_orphans(str(table))


def test_an_empty_first_write_creates_the_table(spark, tmp_path):
    table = tmp_path / "t"
    _write(table, spark.range(0, 0).selectExpr("id", "cast(id as string) AS name"))
    created = DeltaTable(str(table))
    assert created.version() == 0
    assert [f.name for f in created.schema().fields] == ["id", "name"]
    assert created.transaction_version("values:write") == 0
    assert ids(str(table)) == []


@pytest.mark.parametrize(
    ("names", "problem"),
    [
        (["x", "x"], "the column 'x' twice"),
        (["a", "A"], "the columns 'a' and 'A'"),
    ],
)
def test_duplicate_names_are_refused_before_anything(spark, tmp_path, names, problem):
    df = spark.range(0, 3).selectExpr("id", "id + 1").toDF(*names)
    with pytest.raises(InvalidSchemaError, match=problem):
        _write(tmp_path / "t", df)
    assert not (tmp_path / "t").exists()


def test_nested_duplicate_names_are_refused(spark, tmp_path):
    df = spark.sql("SELECT named_struct('v', 1, 'V', 2) AS s")
    with pytest.raises(InvalidSchemaError, match="struct 's' has the columns 'v' and 'V'"):
        _write(tmp_path / "t", df)
    assert not (tmp_path / "t").exists()


def test_a_partitioning_without_data_columns_is_refused(spark, tmp_path):
    df = spark.range(0, 3).selectExpr("id", "cast(id as string) AS value")
    with pytest.raises(InvalidSchemaError, match="names every column"):
        _write(tmp_path / "t", df, partition_by=["id", "value"])
    assert not (tmp_path / "t").exists()


def test_an_empty_string_partition_value_is_refused(spark, tmp_path):
    df = spark.createDataFrame([(1, "a"), (2, "")], "id BIGINT, day STRING")
    with pytest.raises(ConstraintViolationError, match="must not hold an empty string"):
        _write(tmp_path / "t", df, partition_by=["day"])
    assert not DeltaTable.is_deltatable(str(tmp_path / "t"))


def test_odd_column_names_round_trip(spark, tmp_path):
    names = ["id", "a.b", "with space", "ünï", "x,y;z", "tick`name", "1starts_with_digit"]
    df = spark.range(0, 3).selectExpr(*["id", *[f"id * {i}" for i in range(1, len(names))]])
    df = df.toDF(*names)
    _write(tmp_path / "t", df, partition_by=["with space"])
    expected = [{n: i * max(k, 1) for k, n in enumerate(names)} for i in range(3)]
    assert _read(str(tmp_path / "t")) == expected


def test_values_at_the_edges_round_trip(spark, tmp_path):
    end_of_time = datetime.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    start_of_time = datetime.datetime(1, 1, 1, tzinfo=UTC)
    rows = [
        (
            1,
            end_of_time,
            datetime.date(9999, 12, 31),
            float("nan"),
            "𠮷野家",
            "",
            decimal.Decimal("9" * 38),
        ),
        (
            2,
            start_of_time,
            datetime.date(1, 1, 1),
            float("inf"),
            "🇩🇪" * 40,
            "a",
            decimal.Decimal(0),
        ),
        (3, None, None, -0.0, None, None, None),
    ]
    ddl = "id BIGINT, ts TIMESTAMP, d DATE, x DOUBLE, s STRING, e STRING, big DECIMAL(38,0)"
    df = spark.createDataFrame(rows, ddl)
    table = tmp_path / "t"
    _write(table, df, partition_by=["ts"])
    read = _read(str(table))
    assert [r["ts"] for r in read] == [end_of_time, start_of_time, None]
    assert [r["d"] for r in read] == [datetime.date(9999, 12, 31), datetime.date(1, 1, 1), None]
    assert math.isnan(read[0]["x"]) and read[1]["x"] == math.inf and read[2]["x"] == 0.0
    assert [r["s"] for r in read] == ["𠮷野家", "🇩🇪" * 40, None]
    assert [r["e"] for r in read] == ["", "a", None]
    assert read[0]["big"] == decimal.Decimal("9" * 38)
    # Filters through the stats find every row.
    found = DeltaTable(str(table)).to_pyarrow_table(filters=[("s", "=", "𠮷野家")]).to_pylist()
    assert [r["id"] for r in found] == [1]
    assert_no_orphans(str(table))


@pytest.mark.parametrize(
    "value",
    [
        "date_add(DATE'9999-12-31', 1)",
        "date_add(DATE'0001-01-01', -1)",
        "timestamp_micros(253402300800000000)",  # 10000-01-01T00:00:00Z
    ],
)
def test_a_partition_year_outside_1_to_9999_is_refused(spark, tmp_path, value):
    # Spark holds such values (only turning them into Python objects fails), Delta cannot.
    df = spark.sql(f"SELECT 1 AS id, {value} AS d")
    with pytest.raises(SinkError, match="year between 1 and 9999"):
        _write(tmp_path / "t", df, partition_by=["d"])
    assert not DeltaTable.is_deltatable(str(tmp_path / "t"))


def test_dates_and_timestamps_beyond_year_9999_are_written_without_bounds(spark, tmp_path):
    # Parquet holds them; Delta's stats cannot spell them, so those files carry no bounds.
    df = spark.sql(
        "SELECT 1 AS id, date_add(DATE'9999-12-31', 1) AS d,"
        " timestamp_micros(-62135596800000001) AS t"
    )
    _write(tmp_path / "t", df)
    table = DeltaTable(str(tmp_path / "t")).to_pyarrow_table()
    assert table.column("d").cast(pa.int32()).to_pylist() == [2932897]
    assert table.column("t").cast(pa.int64()).to_pylist() == [-62135596800000001]
    (stats,) = file_stats(str(tmp_path / "t"))
    assert "minValues" not in stats and stats["nullCount"] == {"id": 0, "d": 0, "t": 0}


def test_a_bounded_write_leaves_the_threads_job_group_as_it_was(spark, tmp_path):
    """The staging jobs run in a job group of their own (so a failed batch can wait for its
    tasks before cleaning up); the caller's thread gets its own group back."""
    context = spark.sparkContext
    _write(tmp_path / "t", spark.range(3).selectExpr("id"))
    assert context.getLocalProperty("spark.jobGroup.id") is None
    context.setJobGroup("caller", "the caller's group")
    try:
        _write(tmp_path / "u", spark.range(3).selectExpr("id"))
        assert context.getLocalProperty("spark.jobGroup.id") == "caller"
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
