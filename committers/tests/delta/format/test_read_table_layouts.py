"""``read_table`` on every table shape the sink and delta-rs write: partition values come from
the log, whatever directories the files lie in.

Delta promises no directory layout: a file's partition values are in its add action. The sink's
Spark staging puts each batch under ``batch-<n>-<run>/day=.../``, delta-rs writes
``day=.../`` directly under the root, an upsert or a compaction adds more run directories, and
other writers put files anywhere (random prefixes, the root). Every test reads the table with
``read_table`` and compares it, row for row and with the table's column types, with delta-rs
(and, for the sink's own tables, DuckDB's delta extension), and checks that Spark's native
Parquet reader ran.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import AddAction

from committers.delta import DeltaSink, read_table
from committers.delta.format._format import spark_schema
from committers.delta.format._read_table import _file_path_spelling, _java_uri_path
from committers.delta.storage._storage import TableLocation
from committers.delta.table._snapshot import SnapshotSpec, open_snapshot
from committers.tests._readers import duckdb_rows
from committers.tests._spark_helpers import file_stream, make_source, run_available_now
from framework import TwoPhaseSink

pytestmark = [pytest.mark.spark]

UTC = dt.timezone.utc
# Partition values that need escaping in directory names, and nulls.
ODD_VALUES = ["a b/c%=é", " lead", "x+y#z?", None, "plain"]


def _comparable(value):
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return value


def _sorted_rows(rows: list[dict], columns: list[str]) -> list[tuple]:
    return sorted((tuple(_comparable(r[c]) for c in columns) for r in rows), key=repr)


def _plan(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()


def _assert_reads_like_delta_rs(spark, uri: str, *, duckdb: bool = True):
    """read_table(uri) holds exactly delta-rs's rows (and DuckDB's), with the table's types,
    through Spark's native Parquet scan. Returns the DataFrame."""
    df = read_table(spark, uri)
    plan = _plan(df)
    assert "FileScan parquet" in plan and "BatchScan" not in plan, plan
    columns = df.columns
    expected = _sorted_rows(DeltaTable(uri).to_pyarrow_table().to_pylist(), columns)
    assert _sorted_rows(df.toArrow().to_pylist(), columns) == expected
    if duckdb:
        assert _sorted_rows(duckdb_rows(uri), columns) == expected
    snapshot = open_snapshot(TableLocation.of(uri), SnapshotSpec())[1]
    table_types = [(f.name, f.dataType) for f in spark_schema(snapshot).fields]
    assert [(f.name, f.dataType) for f in df.schema.fields] == table_types
    return df


def _ids(df, condition: str) -> list[int]:
    return sorted(r.id for r in df.where(condition).select("id").collect())


def _odd_table(ids) -> pa.Table:
    ids = list(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "p": pa.array([ODD_VALUES[i % len(ODD_VALUES)] for i in ids], pa.string()),
            "n": pa.array([None if i % 4 == 3 else i % 3 for i in ids], pa.int32()),
        }
    )


def _spark_df(spark, table: pa.Table):
    from pyspark.sql.pandas.types import from_arrow_schema

    return spark.createDataFrame(table.to_pylist(), schema=from_arrow_schema(table.schema))


# -- the sink's tables --------------------------------------------------------------------------


@pytest.mark.parametrize("staging", ["spark", "arrow"])
def test_a_partitioned_stream_of_several_micro_batches_reads_back(spark, tmp_path, staging):
    """The README tour: a stream partitioned by day, three micro-batches, read back."""
    uri = str(tmp_path / "orders")
    source = make_source(tmp_path, files=3)
    sink = TwoPhaseSink(DeltaSink(uri, app_id="tour", partition_by=["day"], staging=staging))
    run_available_now(sink, file_stream(spark, source), tmp_path / "checkpoint")
    assert DeltaTable(uri).version() == 2  # one commit per micro-batch
    df = _assert_reads_like_delta_rs(spark, uri)
    assert _ids(df, "day = 'd1'") == [i for i in range(30) if i % 3 == 1]


def test_one_sink_append_to_a_partitioned_table_delta_rs_made(spark, tmp_path):
    """delta-rs's day=.../ files under the root, the sink's under batch-1-<run>/day=.../."""
    uri = str(tmp_path / "orders")
    days = pa.table({"id": pa.array(range(6), pa.int64()), "day": [f"d{i % 3}" for i in range(6)]})
    write_deltalake(uri, days, partition_by=["day"])
    more = days.set_column(0, "id", pa.array(range(6, 12), pa.int64()))
    TwoPhaseSink(DeltaSink(uri, app_id="orders")).write(_spark_df(spark, more), epoch_id=1)
    df = _assert_reads_like_delta_rs(spark, uri)
    assert _ids(df, "day = 'd2'") == [2, 5, 8, 11]


@pytest.mark.parametrize("staging", ["spark", "arrow"])
def test_sink_appends_to_a_table_delta_rs_made_with_escaped_values(spark, tmp_path, staging):
    """Values delta-rs and Spark spell differently in directory names (delta-rs escapes "é" as
    UTF-8 bytes, which Spark would read back as two characters)."""
    uri = str(tmp_path / "mixed")
    write_deltalake(uri, _odd_table(range(0, 10)), partition_by=["p", "n"])
    sink = TwoPhaseSink(DeltaSink(uri, app_id="append", staging=staging))
    sink.write(_spark_df(spark, _odd_table(range(10, 20))), epoch_id=1)
    df = _assert_reads_like_delta_rs(spark, uri)
    escaped = [i for i in range(20) if i % 5 == 0 and i % 4 != 3 and i % 3 == 0]
    assert escaped and _ids(df, "p = 'a b/c%=é' AND n = 0") == escaped
    nulls = [i for i in range(20) if i % 5 == 3 and i % 4 == 3]
    assert nulls and _ids(df, "p IS NULL AND n IS NULL") == nulls


@pytest.mark.smoke  # make check: the end-to-end test of its feature
def test_upserts_overwrites_and_compaction_keep_every_partition_value(spark, tmp_path):
    """One table through every kind of write the sink makes, read back after each."""
    uri = str(tmp_path / "lifecycle")

    def sink(**options) -> TwoPhaseSink:
        return TwoPhaseSink(DeltaSink(uri, partition_by=["p", "n"], **options))

    sink(staging="spark").write(_spark_df(spark, _odd_table(range(0, 10))))
    sink(staging="arrow").write(_spark_df(spark, _odd_table(range(10, 20))))
    _assert_reads_like_delta_rs(spark, uri)

    for staging, changed in (("spark", range(5, 25)), ("auto", range(15, 30))):
        upsert = sink(mode="upsert", keys=["id"], staging=staging)
        upsert.write(_spark_df(spark, _odd_table(changed)))
        _assert_reads_like_delta_rs(spark, uri)

    replace = sink(mode="overwrite", replace_where="p = 'plain'", staging="spark")
    replace.write(_spark_df(spark, _odd_table([4, 9, 14, 104])))
    df = _assert_reads_like_delta_rs(spark, uri)
    assert _ids(df, "p = 'plain'") == [4, 9, 14, 104]

    for staging, more in (("auto", range(30, 40)), ("spark", range(40, 50))):
        sink(staging="spark").write(_spark_df(spark, _odd_table(more)))
        assert DeltaSink(uri, staging=staging).compact(spark).files_removed > 0
        _assert_reads_like_delta_rs(spark, uri)

    sink(mode="overwrite", staging="spark").write(_spark_df(spark, _odd_table(range(50, 55))))
    df = _assert_reads_like_delta_rs(spark, uri)
    assert _ids(df, "id >= 0") == list(range(50, 55))


# -- other writers' layouts ---------------------------------------------------------------------


def _add_file(uri: str, relative: str, ids: list[int], partition: str | None) -> AddAction:
    """Write ``ids`` (the data columns of a table partitioned by ``p``) to ``relative`` under
    the table root; the add action giving it the partition value ``p = partition``."""
    path = Path(uri, relative)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), path)
    stats = f'{{"numRecords": {len(ids)}}}'
    return AddAction(relative, path.stat().st_size, {"p": partition}, 0, True, stats)


def test_partition_values_come_from_the_log_whatever_the_directories(spark, tmp_path):
    """Files in directories that name other values (a file under p=1/ whose value is 2),
    under random prefixes, at the root, next to Hive-style files and a sink's run directory."""
    uri = str(tmp_path / "layouts")
    schema = pa.schema([("id", pa.int64()), ("p", pa.int32())])
    write_deltalake(uri, pa.table({"id": [1, 2], "p": [1, 1]}, schema=schema), partition_by=["p"])
    actions = [
        _add_file(uri, "p=1/moved-to-two.parquet", [20, 21], "2"),
        _add_file(uri, "Ab/random-prefix.parquet", [30], "3"),
        _add_file(uri, "at-the-root.parquet", [40], None),
        _add_file(uri, "p=5/null-in-a-value-directory.parquet", [50], None),
        _add_file(uri, "p=__HIVE_DEFAULT_PARTITION__/six.parquet", [60], "6"),
    ]
    DeltaTable(uri).create_write_transaction(actions, mode="append", schema=schema)
    sink = TwoPhaseSink(DeltaSink(uri, staging="spark"))
    sink.write(_spark_df(spark, pa.table({"id": [7, 8], "p": [1, 2]}, schema=schema)))
    df = _assert_reads_like_delta_rs(spark, uri)
    assert _ids(df, "p = 1") == [1, 2, 7]
    assert _ids(df, "p = 2") == [8, 20, 21]
    assert _ids(df, "p IS NULL") == [40, 50]
    assert _ids(df, "p = 6") == [60]
    assert _ids(df, "p = 3") == [30]


def test_a_string_value_spelled_like_the_hive_null_stays_a_string(spark, tmp_path):
    """delta-rs writes the string '__HIVE_DEFAULT_PARTITION__' into the directory of that name,
    the one Spark reads as NULL (and a later null next to it)."""
    uri = str(tmp_path / "hive-null")
    for ids, values in (([0, 1], ["__HIVE_DEFAULT_PARTITION__", "x"]), ([2], [None])):
        table = pa.table({"id": pa.array(ids, pa.int64()), "p": pa.array(values, pa.string())})
        write_deltalake(uri, table, partition_by=["p"], mode="append")
    df = _assert_reads_like_delta_rs(spark, uri)
    assert _ids(df, "p = '__HIVE_DEFAULT_PARTITION__'") == [0]
    assert _ids(df, "p IS NULL") == [2]


def test_partition_columns_whose_names_start_with_an_underscore(spark, tmp_path):
    """Directories ``_2=.../_x=...``: Spark's listing hides ``_`` names, but not those of
    directories above files it is given."""
    uri = str(tmp_path / "underscore")
    table = pa.table(
        {
            "id": pa.array([0, 1, 2], pa.int64()),
            "_2": pa.array(["a b", None, "c"], pa.string()),
            "_x": pa.array([1, 2, None], pa.int32()),
        }
    )
    write_deltalake(uri, table, partition_by=["_2", "_x"])
    more = table.set_column(0, "id", pa.array([10, 11, 12], pa.int64()))
    TwoPhaseSink(DeltaSink(uri, staging="arrow")).write(_spark_df(spark, more))
    df = _assert_reads_like_delta_rs(spark, uri)
    assert _ids(df, "`_2` = 'a b' AND `_x` = 1") == [0, 10]


def test_every_partition_type_keeps_its_type_and_value(spark, tmp_path):
    """Types Spark parses from directory names and types it does not (timestamps, decimals,
    floats), with nulls and NaN, in one table."""
    uri = str(tmp_path / "types")
    stamp = dt.datetime(2026, 1, 1, 12, 30, 0, 250, tzinfo=UTC)
    table = pa.table(
        {
            "id": pa.array([0, 1, 2], pa.int64()),
            "b": pa.array([1, None, -1], pa.int8()),
            "sh": pa.array([300, -300, None], pa.int16()),
            "i": pa.array([None, 7, -7], pa.int32()),
            "l": pa.array([2**40, None, -(2**40)], pa.int64()),
            "bo": pa.array([True, False, None]),
            "d": pa.array([dt.date(2026, 11, 21), None, dt.date(1969, 12, 31)]),
            "t": pa.array(
                [stamp, None, stamp - dt.timedelta(days=30000)], pa.timestamp("us", "UTC")
            ),
            "ntz": pa.array(
                [None, stamp.replace(tzinfo=None), dt.datetime(1900, 1, 1)], pa.timestamp("us")
            ),
            "dec": pa.array(
                [decimal.Decimal("1.50"), decimal.Decimal("0.05"), None], pa.decimal128(5, 2)
            ),
            "f": pa.array([0.5, math.nan, None], pa.float64()),
            "s": pa.array(["2026-11-21", "007", None]),
        }
    )
    columns = [c for c in table.column_names if c != "id"]
    write_deltalake(uri, table, partition_by=columns)
    df = _assert_reads_like_delta_rs(spark, uri, duckdb=False)
    assert _ids(df, "t = timestamp'2026-01-01 12:30:00.000250Z' AND dec = 1.5") == [0]
    assert _ids(df, "ntz = timestamp_ntz'1900-01-01 00:00:00' AND s IS NULL") == [2]
    assert _ids(df, "isnan(f) AND l IS NULL AND s = '007'") == [1]


def test_hundreds_of_partitions_are_read_natively(spark, tmp_path):
    """A timestamp-partitioned table (no Hive directories Spark parses back) with 300
    partitions: still one native scan."""
    uri = str(tmp_path / "hourly")
    hours = [dt.datetime(2026, 1, 1, tzinfo=UTC) + dt.timedelta(hours=h) for h in range(300)]
    table = pa.table(
        {"id": pa.array(range(300), pa.int64()), "hour": pa.array(hours, pa.timestamp("us", "UTC"))}
    )
    write_deltalake(uri, table, partition_by=["hour"])
    df = _assert_reads_like_delta_rs(spark, uri, duckdb=False)
    assert _plan(read_table(spark, uri)).count("FileScan parquet") == 1
    assert _ids(df, "hour = timestamp'2026-01-05 03:00:00Z'") == [99]


def test_a_file_copied_out_of_place_is_still_read_with_its_own_values(spark, tmp_path):
    """Two files of the same name in different directories, the second a copy of the first
    placed under another partition's directory: each keeps its own value. And an empty string,
    which delta-rs writes to p=/ and the protocol reads as null."""
    uri = str(tmp_path / "copies")
    schema = pa.schema([("id", pa.int64()), ("p", pa.string())])
    write_deltalake(uri, pa.table({"id": [1], "p": ["a"]}, schema=schema), partition_by=["p"])
    (original,) = Path(uri).glob("p=a/*.parquet")
    copy = Path(uri, "p=b", original.name)
    copy.parent.mkdir()
    shutil.copy2(original, copy)
    action = AddAction(
        f"p=b/{original.name}", os.path.getsize(copy), {"p": "a"}, 0, True, '{"numRecords": 1}'
    )
    DeltaTable(uri).create_write_transaction([action], mode="append", schema=schema)
    write_deltalake(uri, pa.table({"id": [2], "p": [""]}, schema=schema), mode="append")
    df = _assert_reads_like_delta_rs(spark, uri)
    assert _ids(df, "p = 'a'") == [1, 1]
    assert _ids(df, "p = 'b'") == []
    assert _ids(df, "p IS NULL") == [2]


def test_file_paths_are_spelled_as_spark_spells_them(spark):
    """The join key of a file: the table root's spelling (asked of Hadoop) and the relative
    path quoted as java.net.URI quotes it, for characters it quotes and characters it keeps."""
    characters = " %#?[]{}^`|\\\"<>é中😀\u00a0\u2028\u0085\u0007+=:@;,$&'!~*()_-."
    root = "/tmp/a root%"
    for ch in characters:
        relative = f"p=a{ch}b/part{ch}.parquet"
        spelled = _file_path_spelling(spark, root) + "/" + _java_uri_path(relative)
        assert spelled == _file_path_spelling(spark, f"{root}/{relative}"), repr(ch)


def test_a_kept_plan_is_used_only_for_the_same_table_and_version(spark, tmp_path, monkeypatch):
    """read_table keeps the last versions' file plans (_file_plan): a second read of a version
    does not read its log again; a new version, or a table made anew at the same place with the
    same version number, is planned from its log."""
    from committers.delta.format import _file_plan

    listed: list[int] = []
    real = _file_plan.list_data_files
    monkeypatch.setattr(
        _file_plan,
        "list_data_files",
        lambda table, snapshot: listed.append(snapshot.version) or real(table, snapshot),
    )
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"id": pa.array([1, 2], pa.int64())}))

    def ids() -> list[int]:
        return sorted(r.id for r in read_table(spark, uri).collect())

    assert ids() == [1, 2] and ids() == [1, 2]
    assert listed == [0]  # planned once
    write_deltalake(uri, pa.table({"id": pa.array([3], pa.int64())}), mode="append")
    assert ids() == [1, 2, 3]
    assert listed == [0, 1]
    shutil.rmtree(uri)
    write_deltalake(uri, pa.table({"id": pa.array([7], pa.int64())}))  # version 0 again
    assert ids() == [7]
    assert listed == [0, 1, 0]
