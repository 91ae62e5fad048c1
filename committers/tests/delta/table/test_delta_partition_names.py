"""Partition columns whose names Hadoop would call hidden (``_2``, ``.x``, ``__x``), names with
spaces and values with escaped characters are data like any other: written, committed and
read back exactly under both stagings, and their files are neither skipped nor spared by the
orphan clean-up. A partition value that is the directory name of null is refused."""

from __future__ import annotations

import datetime
import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from committers.delta import DeltaSink, UnsupportedTableFeatureError, register
from committers.tests._delta_helpers import assert_no_orphans, committed_files, read_rows, stage
from committers.tests._readers import duckdb_rows
from framework import TwoPhaseSink
from framework.errors import ConstraintViolationError
from framework.sink import Epoch

pytestmark = pytest.mark.spark

#: Partition column names Hadoop's listing hides (leading ``_`` or ``.``) and their neighbours,
#: two per table: a hidden-looking name at the top level and below it.
NAME_PAIRS = [("_2", ".x"), ("__x", "_x"), ("x_", "a b")]
#: Values whose directory names Spark and delta-rs escape, and null.
VALUES = ["plain", "a b", "x/y", "50%", "k=v", "é", None]
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def _rows(columns: tuple[str, str], first_id: int) -> list[dict]:
    top, below = columns
    return [{"id": first_id + i, top: v, below: VALUES[-1 - i]} for i, v in enumerate(VALUES)]


def _dataframe(spark, columns: tuple[str, str], first_id: int):
    ddl = "id long, " + ", ".join(f"`{c}` string" for c in columns)
    return spark.createDataFrame(_rows(columns, first_id), ddl)


def _by_id(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: r["id"])


def _assert_reads(table: str, expected: list[dict]) -> None:
    """deltalake and DuckDB both read exactly ``expected``."""
    assert _by_id(read_rows(table)) == _by_id(expected)
    assert _by_id(duckdb_rows(table)) == _by_id(expected)


def _plant_orphan(table: str, columns: tuple[str, str]) -> str:
    """An old Parquet file no commit names, in partition directories ``<top>=plain/<below>=x``
    (as a killed task attempt of the Python writers, or of delta-rs, leaves one)."""
    top, below = columns
    orphan = Path(table) / f"{top}=plain" / f"{below}=x" / "part-00000-orphan.snappy.parquet"
    orphan.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(table) / min(committed_files(table)), orphan)
    old = time.time() - 7200
    os.utime(orphan, (old, old))
    return orphan.relative_to(table).as_posix()


@pytest.mark.usefixtures("each_staging")
def test_hidden_looking_partition_names_are_appended_and_read_back_exactly(spark, tmp_path):
    for index, columns in enumerate(NAME_PAIRS):
        table = str(tmp_path / f"t{index}")
        sink = DeltaSink(table, app_id="names", partition_by=list(columns))
        first = TwoPhaseSink(sink).write(_dataframe(spark, columns, 0))
        appending = TwoPhaseSink(DeltaSink(table, app_id="names"))
        second = appending.write(_dataframe(spark, columns, 100))
        assert (first.rows, second.rows) == (len(VALUES), len(VALUES)), columns
        expected = _rows(columns, 0) + _rows(columns, 100)
        _assert_reads(table, expected)
        assert_no_orphans(table)
        # An orphan in partition directories is found, and it alone is deleted.
        orphan = _plant_orphan(table, columns)
        kept = committed_files(table)
        removed = sink.remove_orphan_files(
            retention=datetime.timedelta(0), unsafe_allow_short_retention=True
        )
        assert removed == [orphan], columns
        assert committed_files(table) == kept
        _assert_reads(table, expected)


@pytest.mark.usefixtures("each_staging")
def test_a_table_partitioned_by_underscore_2_made_by_delta_rs_takes_appends(spark, tmp_path):
    """Delta's golden table data-reader-escaped-chars is partitioned by a column named `_2`;
    delta-rs writes such a table's files into `_2=<value>/` at the root."""
    table = str(tmp_path / "golden")
    made = pa.table({"_1": ["foo1", "bar1"], "_2": ["foo1", "bar%2F%3F1"]})
    write_deltalake(table, made, partition_by=["_2"])
    appended = spark.createDataFrame(
        [("a", "1"), ("b", "x/y"), ("c", "s p"), ("d", None)], "_1 string, _2 string"
    )
    sink = DeltaSink(table, app_id="golden")
    metrics = TwoPhaseSink(sink).write(appended, epoch_id=1)
    assert metrics.rows == 4 and metrics.status == "committed"
    expected = made.to_pylist() + [r.asDict() for r in appended.collect()]
    key = lambda r: r["_1"]  # noqa: E731
    assert sorted(read_rows(table), key=key) == sorted(expected, key=key)
    assert sorted(duckdb_rows(table), key=key) == sorted(expected, key=key)
    assert DeltaTable(table).version() == 1
    # delta-rs's live files under `_2=foo1/` are kept; an orphan beside them is deleted.
    orphan = Path(table) / "_2=foo1" / "part-00001-orphan-c000.snappy.parquet"
    shutil.copyfile(next((Path(table) / "_2=foo1").glob("*.parquet")), orphan)
    os.utime(orphan, (time.time() - 7200,) * 2)
    removed = sink.remove_orphan_files(
        retention=datetime.timedelta(0), unsafe_allow_short_retention=True
    )
    assert removed == ["_2=foo1/part-00001-orphan-c000.snappy.parquet"]
    assert sorted(read_rows(table), key=key) == sorted(expected, key=key)
    assert_no_orphans(table)


@pytest.mark.usefixtures("each_staging")
def test_the_directory_name_of_null_as_a_string_value_is_refused_before_anything(spark, tmp_path):
    table = str(tmp_path / "t")
    sink = DeltaSink(table, app_id="hive", partition_by=["p"])
    TwoPhaseSink(sink).write(spark.createDataFrame([(1, None), (2, "x")], "id long, p string"))
    rows = [(3, None), (4, HIVE_NULL), (5, "y")]  # in one task: one directory for both
    bad = spark.createDataFrame(rows, "id long, p string").coalesce(1)
    with pytest.raises(ConstraintViolationError, match=f"must not hold the string '{HIVE_NULL}'"):
        TwoPhaseSink(DeltaSink(table, app_id="hive")).write(bad)
    assert DeltaTable(table).version() == 0
    assert _by_id(read_rows(table)) == [{"id": 1, "p": None}, {"id": 2, "p": "x"}]
    assert_no_orphans(table)


def _table_holding_the_literal(uri: str) -> list[dict]:
    """A table whose log holds the string ``__HIVE_DEFAULT_PARTITION__`` as a partition value
    next to a null one, as the Python writers of earlier releases wrote it (delta-rs and
    delta-spark write that string as null); its rows."""
    rows = [{"id": 1, "p": HIVE_NULL}, {"id": 2, "p": HIVE_NULL}, {"id": 3, "p": None}]
    sink = DeltaSink(uri, partition_by=["p"])
    schema = pa.schema([("id", pa.int64()), ("p", pa.string())])
    sink.prepare(schema)
    epoch = Epoch(app_id="old", epoch_id=0, writer_identity="old", run_id="old-run")
    files = stage(sink, epoch, [pa.RecordBatch.from_pylist(rows, schema)])
    committer = sink.create_global_committer()
    committer.commit([committer.combine(epoch, files)])
    return rows


def test_no_rewrite_turns_the_directory_name_of_null_into_null(spark, tmp_path):
    uri = str(tmp_path / "t")
    rows = _table_holding_the_literal(uri)
    assert _by_id(read_rows(uri)) == rows == _by_id(duckdb_rows(uri))
    changes = spark.createDataFrame([(2, "z")], "id long, p string")

    def upsert(staging: str) -> None:
        sink = DeltaSink(uri, app_id="up", mode="upsert", keys=["id"], staging=staging)
        TwoPhaseSink(sink).write(changes)

    # Spark's writer would name both directories alike and read the string back as null.
    with pytest.raises(UnsupportedTableFeatureError, match=f"holds the string '{HIVE_NULL}'"):
        upsert("spark")
    assert DeltaTable(uri).version() == 0
    upsert("auto")  # Python tasks keep the rows of the touched file with the log's values
    expected = [{"id": 1, "p": HIVE_NULL}, {"id": 2, "p": "z"}, {"id": 3, "p": None}]
    _assert_reads(uri, expected)
    # The "deltalake" format's writer refuses the string as the sink does.
    register(spark)
    bad = spark.createDataFrame([(4, HIVE_NULL)], "id long, p string")
    with pytest.raises(Exception, match=f"(?s)ConstraintViolationError.*'{HIVE_NULL}'"):
        bad.write.format("deltalake").mode("append").save(uri)
    _assert_reads(uri, expected)
