"""Partition columns whose names Hadoop would call hidden (``_2``, ``.x``, ``__x``), names with
spaces and values with escaped characters are data like any other: written, committed and
read back exactly under both stagings, and their files are neither skipped nor spared by the
orphan clean-up."""

from __future__ import annotations

import datetime
import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from committers.delta import DeltaSink
from committers.tests._delta_helpers import assert_no_orphans, committed_files, read_rows
from committers.tests._readers import duckdb_rows
from framework import TwoPhaseSink

pytestmark = pytest.mark.spark

#: Partition column names Hadoop's listing hides (leading ``_`` or ``.``) and their neighbours.
NAMES = ["_2", "_x", ".x", "__x", "x_", "a b"]
#: Values whose directory names Spark and delta-rs escape, and null.
VALUES = ["plain", "a b", "x/y", "50%", "k=v", "é", None]


def _rows(column: str, first_id: int) -> list[dict]:
    return [{"id": first_id + i, column: v} for i, v in enumerate(VALUES)]


def _dataframe(spark, column: str, first_id: int):
    return spark.createDataFrame(_rows(column, first_id), f"id long, `{column}` string")


def _by_id(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: r["id"])


def _assert_reads(table: str, expected: list[dict]) -> None:
    """deltalake and DuckDB both read exactly ``expected``."""
    assert _by_id(read_rows(table)) == _by_id(expected)
    assert _by_id(duckdb_rows(table)) == _by_id(expected)


def _plant_orphan(table: str, column: str) -> str:
    """An old Parquet file no commit names, in the partition directory ``<column>=plain`` (as
    a killed task attempt of the Python writers, or of delta-rs, leaves one)."""
    orphan = Path(table) / f"{column}=plain" / "part-00000-orphan.snappy.parquet"
    orphan.parent.mkdir(exist_ok=True)
    shutil.copyfile(Path(table) / min(committed_files(table)), orphan)
    old = time.time() - 7200
    os.utime(orphan, (old, old))
    return orphan.relative_to(table).as_posix()


@pytest.mark.usefixtures("each_staging")
def test_hidden_looking_partition_names_are_appended_and_read_back_exactly(spark, tmp_path):
    for index, column in enumerate(NAMES):
        table = str(tmp_path / f"t{index}")
        sink = DeltaSink(table, app_id="names", partition_by=[column])
        first = TwoPhaseSink(sink).write(_dataframe(spark, column, 0))
        second = TwoPhaseSink(DeltaSink(table, app_id="names")).write(
            _dataframe(spark, column, 100)
        )
        assert (first.rows, second.rows) == (len(VALUES), len(VALUES)), column
        expected = _rows(column, 0) + _rows(column, 100)
        _assert_reads(table, expected)
        assert_no_orphans(table)
        # An orphan in a partition directory is found, and it alone is deleted.
        orphan = _plant_orphan(table, column)
        kept = committed_files(table)
        removed = sink.remove_orphan_files(
            retention=datetime.timedelta(0), unsafe_allow_short_retention=True
        )
        assert removed == [orphan], column
        assert committed_files(table) == kept
        _assert_reads(table, expected)


@pytest.mark.usefixtures("each_staging")
def test_a_table_partitioned_by_underscore_2_made_by_delta_rs_takes_appends(spark, tmp_path):
    # Delta's golden table data-reader-escaped-chars is partitioned by a column named `_2`.
    table = str(tmp_path / "golden")
    made = pa.table({"_1": ["foo1", "bar1"], "_2": ["foo1", "bar%2F%3F1"]})
    write_deltalake(table, made, partition_by=["_2"])
    appended = spark.createDataFrame(
        [("a", "1"), ("b", "x/y"), ("c", "s p"), ("d", None)], "_1 string, _2 string"
    )
    metrics = TwoPhaseSink(DeltaSink(table, app_id="golden")).write(appended, epoch_id=1)
    assert metrics.rows == 4 and metrics.status == "committed"
    expected = made.to_pylist() + [r.asDict() for r in appended.collect()]
    key = lambda r: r["_1"]  # noqa: E731
    assert sorted(read_rows(table), key=key) == sorted(expected, key=key)
    assert sorted(duckdb_rows(table), key=key) == sorted(expected, key=key)
    assert DeltaTable(table).version() == 1
